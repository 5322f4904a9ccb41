"""The packaging checks' own rules, fast (no venv, no install, no build): one version source, every
extra promised, the binder's plan rules and notebook list, the memory cap, the wheel contents check.

The slow halves run as make targets after pytest (``make packaging``: check-wheel, check-extras,
check-binder, docs), each with its own pass/fail line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import check_binder
import check_extras
import check_wheel
from cleanvenv import CheckFailed

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


# -- one version -------------------------------------------------------------------------------
def test_version_has_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    import jdist
    from jdist.cli import main

    assert PYPROJECT["tool"]["hatch"]["version"]["source"] == "vcs"
    assert not re.search(r'^__version__\s*=\s*["\']', (REPO / "jdist" / "__init__.py").read_text(), re.MULTILINE), \
        "jdist/__init__.py must read the version written by the build (jdist/_version.py), not hard-code one"
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"jdist {jdist.__version__}"
    # (that it equals the installed metadata is make check-wheel's check, in a clean venv: in a checkout, each
    # build of the sdist or wheel rewrites jdist/_version.py, while the editable install keeps its metadata)
    assert jdist.__version__ != "0.0.0+unknown", "jdist/_version.py is missing: reinstall (pip install -e .)"


# -- extras ------------------------------------------------------------------------------------
def test_every_extra_has_its_promises() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"]) - set(check_extras.UNIONS)
    assert extras == set(check_extras.PROMISES), "tools/check_extras.py PROMISES must list exactly the extras"
    test_extra = " ".join(PYPROJECT["project"]["optional-dependencies"]["test"])
    bundled = set(re.search(r"jdist\[([^\]]*)\]", test_extra).group(1).split(","))
    assert extras - bundled <= {"lab"}, "jdist[test] should bring every extra (lab: jupyterlab is listed itself)"


def test_promised_jdist_modules_exist() -> None:
    for extra, modules in check_extras.PROMISES.items():
        for module in modules:
            if module.startswith("jdist."):
                path = REPO / Path(*module.split("."))
                assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), (extra, module)


def test_wheel_extras_read_from_metadata(tmp_path: Path) -> None:
    wheel = tmp_path / "jdist-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("jdist-1.0.dist-info/METADATA", "Metadata-Version: 2.4\nName: jdist\nVersion: 1.0\n"
                    "Provides-Extra: tune\nProvides-Extra: test\nProvides-Extra: new\n")
    assert check_extras.wheel_extras(wheel) == ["tune", "new"]
    with pytest.raises(CheckFailed, match=r"jdist\[new\] is declared but .*PROMISES"):
        check_extras.check_extra("new", wheel, tmp_path)


# -- the wheel ---------------------------------------------------------------------------------
def test_wheel_contents_check_names_what_is_missing(tmp_path: Path) -> None:
    wheel = tmp_path / "jdist-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("jdist/_version.py", "")
        zf.writestr("jdist/server/__init__.py", "")
        zf.writestr("jdist-1.0.data/data/share/jupyter/labextensions/jdist/package.json", "{}")
    with pytest.raises(CheckFailed, match="static/style.js.*jupyter_server_config.d/jdist.json"):
        check_wheel.check_wheel_contents(wheel)


def test_saved_output_comparison_reads_streams_and_results() -> None:
    outputs = [{"output_type": "stream", "name": "stdout", "text": ["a\n", "b\n"]},
               {"output_type": "execute_result", "data": {"text/plain": "[2, 2]"}, "metadata": {}}]
    assert check_wheel._text(outputs) == "a\nb\n[2, 2]"


# -- the binder --------------------------------------------------------------------------------
def _dockerfile(python: str = "3.11") -> str:
    return "\n".join([
        "Building conda environment for python=" + python,
        "FROM docker.io/library/buildpack-deps:24.04",
        "RUN ${KERNEL_PYTHON_PREFIX}/bin/pip install --no-cache-dir -r \"binder/requirements.txt\"",
        "RUN chmod +x binder/postBuild",
        "RUN ./binder/postBuild",
    ])


def test_binder_plan_accepted_as_repo2docker_renders_it() -> None:
    steps = check_binder.check_plan({"pack": "PythonBuildPack", "python": "3.11", "dockerfile": _dockerfile()})
    assert steps[-1] == "./binder/postBuild"


@pytest.mark.parametrize("plan, message", [
    ({"pack": "CondaBuildPack", "python": "3.11"}, "remove binder/environment.yml"),
    ({"pack": "PythonBuildPack", "python": "3.10"}, "binder/runtime.txt asks for 3.11"),
])
def test_binder_plan_refused(plan: dict, message: str) -> None:
    with pytest.raises(CheckFailed, match=re.escape(message)):
        check_binder.check_plan({**plan, "dockerfile": _dockerfile(plan["python"])})


@pytest.mark.parametrize("lines, message", [
    (["--extra-index-url https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu", ".[examples,ray]"], "brings ['ray']"),
    (["--extra-index-url https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu", "tensorflow-cpu"], "tensorflow"),
    (["torch==2.13.0+cpu", ".[examples]"], "does not name PyTorch's CPU index"),
    (["--extra-index-url https://download.pytorch.org/whl/cpu", "torch", ".[examples]"], "torch==X.Y.Z+cpu"),
])
def test_binder_requirements_refused(monkeypatch: pytest.MonkeyPatch, lines: list[str], message: str) -> None:
    monkeypatch.setattr(check_binder, "requirements", lambda: lines)
    with pytest.raises(CheckFailed, match=re.escape(message)):
        check_binder.check_plan({"pack": "PythonBuildPack", "python": "3.11", "dockerfile": _dockerfile()})


def test_binder_files_as_repo2docker_reads_them() -> None:
    binder = REPO / "binder"
    assert not (binder / "environment.yml").exists(), "environment.yml would win over requirements.txt (conda)"
    assert not (binder / "Dockerfile").exists()
    assert (binder / "runtime.txt").read_text().strip() == "python-3.11"
    torch_pin = next(r for r in check_binder.requirements() if r.startswith("torch=="))
    make_spec = re.search(r"^TORCH_SPEC \?= (\S+)", (REPO / "Makefile").read_text(), re.MULTILINE).group(1)
    assert torch_pin.removesuffix("+cpu") == make_spec, "binder's torch and the Makefile's TORCH_SPEC must agree"
    assert (binder / "postBuild").stat().st_mode & 0o111


def _imports(notebook: Path) -> set[str]:
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    found = set(re.findall(r"^\s*(?:from|import)\s+(\w+)", code, re.MULTILINE))
    for backend, framework in re.findall(r"--backend\s+(\w+)|--framework\s+(\w+)", code):
        found.add(backend or framework)  # --backend deepspeed needs deepspeed, --framework tf tensorflow
    if "jdist.ray" in code:
        found.add("ray")
    return found


def test_binder_notebooks_need_nothing_the_image_leaves_out() -> None:
    listed = check_binder.binder_notebooks()
    left_out = {"horovod", "deepspeed", "tensorflow", "tf", "ray", "tf_keras"}
    for nb in listed:
        assert not _imports(nb) & left_out, f"{nb.name} needs {_imports(nb) & left_out}: not in the binder image"
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        if nb in listed:
            continue
        first = "".join(json.loads(nb.read_text())["cells"][0]["source"])
        assert "Runs locally, not on mybinder" in first, f"{nb.name} is not in binder/notebooks.txt: say so at its top"


def test_binder_badge_is_the_same_everywhere() -> None:
    badge = re.compile(r"https://mybinder\.org/v2/gh/[^)\s]+")
    urls = set(badge.findall((REPO / "README.md").read_text())) | set(badge.findall((REPO / "docs" / "install.md").read_text()))
    assert len(urls) == 1, urls


# -- the memory cap ----------------------------------------------------------------------------
def _cap_or_skip(name: str, limit: int) -> check_binder.MemoryCap:
    try:
        return check_binder.MemoryCap(name, limit)
    except CheckFailed as exc:
        pytest.skip(str(exc))


def test_memory_cap_measures_a_child_peak() -> None:
    cap = _cap_or_skip("probe", 512 * 2**20)
    try:
        done = subprocess.run([sys.executable, "-c", "b = bytearray(96 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                              preexec_fn=cap.enter, check=False)
        assert done.returncode == 0
        assert cap.peak() >= 96 * 2**20
        assert cap.oom_kills() == 0
    finally:
        cap.close()


def test_memory_cap_kills_past_the_limit() -> None:
    cap = _cap_or_skip("oom", 64 * 2**20)
    try:
        done = subprocess.run([sys.executable, "-c", "b = bytearray(256 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                              preexec_fn=cap.enter, check=False, capture_output=True)
        assert done.returncode != 0
        assert cap.oom_kills() >= 1
    finally:
        cap.close()
