#!/usr/bin/env python
"""``make check-extras``: each extra of the wheel installs cleanly on its own and brings what it
promises.

For every extra the wheel declares (``Provides-Extra`` in its metadata; ``test`` is the union of
the others and is left out), a clean venv gets torch (the build ``TORCH_SPEC`` names, see
``cleanvenv.py``) and ``jdist[EXTRA]`` from the wheel alone, then must pass ``uv pip check`` (no
broken or conflicting requirement) and import the modules listed for it in :data:`PROMISES`:
the libraries the extra is for and jdist's own module that uses them. An extra that the wheel
declares but :data:`PROMISES` does not list fails, so a new extra cannot go unchecked.

Usage::

    .venv/bin/python tools/check_extras.py [--wheel dist/jdist-*.whl] [EXTRA ...]

Without ``--wheel`` it uses the wheel ``make check-wheel`` left in ``build/check-wheel/dist`` (if it is
newer than ``pyproject.toml``), or builds one. Prints one line per extra with its install and import times, then
``check-extras: N passed, M failed``.
"""

from __future__ import annotations

import argparse
import email.parser
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cleanvenv import REPO, CheckFailed, CleanVenv, clean_env, run, say, torch_wheel

#: extra -> modules that must import once it is installed (third-party first, then jdist's user).
PROMISES: dict[str, tuple[str, ...]] = {
    "examples": ("sklearn",),
    "hf": ("transformers", "accelerate", "jdist.rank.integrations.hf", "jdist.rank.integrations.accelerate"),
    "lightning": ("lightning", "jdist.rank.integrations.lightning"),
    "deepspeed": ("deepspeed", "jdist.rank.backends.deepspeed"),
    "tracking": ("tensorboard", "mlflow", "sqlalchemy", "alembic", "jdist.metrics.export"),
    "tune": ("optuna", "jdist.kernel.tune"),
    "k8s": ("kubernetes", "jdist.kernel.launch.k8s.client", "jdist.kernel.launch.k8s.launcher"),
    "ray": ("ray.train", "ray.train.torch", "jdist.ray"),
    "tf": ("tensorflow", "jdist.rank.backends.tf"),
    "lab": ("jupyterlab",),
    "docs": ("sphinx", "pydata_sphinx_theme", "myst_parser", "myst_nb", "jdist.rank.integrations.hf",
             "jdist.rank.integrations.lightning", "jdist.rank.integrations.accelerate"),
}
#: Extras that only gather the others (checked through them).
UNIONS = ("test",)


def wheel_extras(wheel: Path) -> list[str]:
    """The extras the wheel's metadata declares, in order."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(zf.read(meta).decode())
    return [e for e in msg.get_all("Provides-Extra") or [] if e not in UNIONS]


def find_wheel() -> Path:
    wheels = sorted((REPO / "build" / "check-wheel" / "dist").glob("jdist-*.whl"))
    if wheels and wheels[-1].stat().st_mtime > (REPO / "pyproject.toml").stat().st_mtime:
        return wheels[-1]  # make check-wheel's, newer than the extras' definitions
    out = Path(tempfile.mkdtemp(prefix="jdist-wheel-"))
    env = clean_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    run([sys.executable, "-m", "build", "--wheel", "--installer", "uv", "-o", str(out), str(REPO)], env=env, cwd=out,
        what="python -m build --wheel", timeout=600)
    return next(out.glob("jdist-*.whl"))


def check_extra(extra: str, wheel: Path, work: Path) -> str:
    modules = PROMISES.get(extra)
    if not modules:
        raise CheckFailed(f"jdist[{extra}] is declared but tools/check_extras.py PROMISES has no modules for it: "
                          "add what it brings")
    venv = CleanVenv(work / f"venv-{extra}")
    try:
        installed = venv.install(str(torch_wheel()), f"{wheel}[{extra}]", what=f"jdist[{extra}]")
        cwd = work  # not the checkout
        env = clean_env(venv.path)
        from cleanvenv import uv_bin

        run([uv_bin(), "pip", "check", "--python", venv.python], env=env, cwd=cwd, what=f"uv pip check (jdist[{extra}])")
        t0 = time.monotonic()
        code = ("import importlib, sys\n"
                f"for m in {list(modules)!r}:\n"
                "    importlib.import_module(m)\n"
                "import jdist\n"
                f"assert jdist.__file__.startswith({str(venv.path)!r}), jdist.__file__\n")
        run([venv.python, "-c", code], env=env, cwd=cwd, what=f"import {', '.join(modules)}", timeout=300)
        return f"install {installed:.1f} s, import {time.monotonic() - t0:.1f} s: {', '.join(modules)}"
    finally:
        shutil.rmtree(venv.path, ignore_errors=True)  # the next extra starts clean; uv's cache keeps the files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=REPO / "build" / "check-extras")
    ap.add_argument("extras", nargs="*", help="Only these extras (default: every one the wheel declares).")
    args = ap.parse_args(argv)
    total0 = time.monotonic()
    try:
        wheel = (args.wheel or find_wheel()).resolve()
        declared = wheel_extras(wheel)
    except (CheckFailed, subprocess.SubprocessError, StopIteration) as exc:
        say(f"FAILED no wheel: {exc}")
        return 1
    unknown = [e for e in args.extras if e not in declared]
    if unknown:
        say(f"FAILED {wheel.name} declares no extra {unknown}: it has {declared}")
        return 1
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    passed = failed = 0
    for extra in args.extras or declared:
        t0 = time.monotonic()
        try:
            detail = check_extra(extra, wheel, work)
        except CheckFailed as exc:
            failed += 1
            say(f"FAILED jdist[{extra}]: {exc} [{time.monotonic() - t0:.1f} s]")
            continue
        passed += 1
        say(f"ok jdist[{extra}]: {detail} [{time.monotonic() - t0:.1f} s]")
    say(f"check-extras: {passed} passed, {failed} failed [{time.monotonic() - total0:.1f} s]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
