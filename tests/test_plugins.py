"""Plugins found through entry points (jdist.plugins): the specs, and one end-to-end test: a backend
installed by a package of its own (a dist-info on PYTHONPATH, as ``pip install`` would leave it) is
found by a real kernel and by the real ranks it starts, and jdist calls its hooks (backward,
optimizer step, checkpoint save/load). Every other kind of plugin, end to end: tests/test_extending.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import KernelSession

from jdist.plugins import BackendSpec, available_backends, available_launchers, backend_spec, launcher_class


def test_builtin_backends_and_launchers_come_from_entry_points():
    assert available_backends() == ["ddp", "deepspeed", "fsdp", "horovod", "tf"]
    for name in available_backends():
        assert backend_spec(name).load().name == name  # the class the ranks import
    assert available_launchers() == ["k8s", "local-mpi", "slurm", "ssh"]
    assert launcher_class("local-mpi").name == "local-mpi"
    with pytest.raises(ValueError, match=r"Unknown backend 'nope'.*--backend.*ddp, deepspeed, fsdp, horovod"):
        backend_spec("nope")
    with pytest.raises(ValueError, match=r"Unknown launcher 'srun'.*--launcher.*local-mpi"):
        launcher_class("srun")


def test_a_missing_requirement_names_the_fix_before_any_rank_starts():
    spec = BackendSpec("x", "m:C", requires=("no_such_module_anywhere",), install_hint="pip install no-such")
    assert spec.unavailable() == "pip install no-such"
    horovod = backend_spec("horovod")  # jdist's own, registered by its entry point as any other package's
    assert "make horovod" in horovod.install_hint and "tools/build_horovod.sh" in horovod.install_hint
    generic = BackendSpec("y", "m:C", requires=("no_such_module_anywhere",)).unavailable()
    assert generic == "--backend y needs no_such_module_anywhere; install it in this environment."


def test_missing_horovod_is_named_in_a_fresh_interpreter():
    # Horovod is built here (make test builds it): its absence is simulated in a separate
    # interpreter with sys.modules['horovod'] = None, which makes find_spec('horovod') fail as
    # for a package that is not installed.
    code = ("import sys; sys.modules['horovod'] = None\n"
            "from jdist.plugins import backend_spec\n"
            "print(backend_spec('horovod').unavailable())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("Horovod is not installed in this environment.") and "--backend ddp" in out.stdout


def test_missing_tensorflow_names_both_install_commands():
    # make test installs TensorFlow: its absence is simulated in a fresh interpreter, as for Horovod
    code = ("import sys; sys.modules['tf_keras'] = None\n"
            "from jdist.plugins import backend_spec\n"
            "print(backend_spec('tf').unavailable())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("--framework tf needs TensorFlow and tf-keras: pip install 'jdist[tf]'")
    assert "pip install --no-deps tf-keras==2.21.0" in out.stdout


def test_a_checkout_on_the_path_that_is_not_installed_says_how_to_install_it():
    # Seen on the GPU machine: the checkout on sys.path through a .pth file, without jdist's dist-info,
    # said "Use --backend with one of: ." No entry points are found then (simulated in a fresh interpreter).
    code = ("import jdist.plugins as p\n"
            "from importlib.metadata import EntryPoints\np.entry_points = lambda **kw: EntryPoints(())\n"
            "for f in (p.backend_spec, p.launcher_class):\n"
            "    try: f('ddp')\n"
            "    except ValueError as e: print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all("not installed" in l and "pip install -e ." in l for l in lines), out.stdout


BACKEND_PACKAGE = textwrap.dedent('''
    """A backend of one's own: DDP, counting the hooks jdist calls (a DeepSpeed-like engine
    would run its own backward, step and checkpoints there)."""
    from jdist.plugins import BackendSpec
    from jdist.rank.backends.ddp import DDPBackend

    COUNTING = BackendSpec("counting", "jdist_counting:CountingBackend", help="DDP that counts its hooks",
                           backward_waits=True)
    CALLS = {"backward": 0, "optimizer_step": 0, "save_state": 0, "load_state": 0}

    class CountingBackend(DDPBackend):
        name = "counting"

        def backward(self, loss, **kwargs):
            CALLS["backward"] += 1
            super().backward(loss, **kwargs)

        def optimizer_step(self, optimizer, closure=None):
            CALLS["optimizer_step"] += 1
            return super().optimizer_step(optimizer, closure)

        def save_state(self, path, model, optimizer, meta):
            CALLS["save_state"] += 1
            super().save_state(path, model, optimizer, {**meta, "extra": {**meta["extra"], "by": "counting"}})

        def load_state(self, path, model, optimizer):
            CALLS["load_state"] += 1
            return super().load_state(path, model, optimizer)
''')


@pytest.fixture
def plugin_path(tmp_path):
    """A package with a ``jdist.backends`` entry point, installed as pip would (a .dist-info)."""
    (tmp_path / "jdist_counting.py").write_text(BACKEND_PACKAGE)
    info = tmp_path / "jdist_counting-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jdist-counting\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[jdist.backends]\ncounting = jdist_counting:COUNTING\n")
    return tmp_path


def test_a_backend_from_another_package_runs_on_the_ranks_and_its_hooks_are_called(kernel_env, plugin_path, tmp_path):
    env = {**kernel_env, "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_path), kernel_env.get("PYTHONPATH")]))}
    k = KernelSession(env)
    try:
        k.run("%load_ext jdist")
        out = k.run("%%distributed -n 2 --backend counting --timeout 30\nimport torch, torch.nn as nn\n"
                    "print(jdist.info()['backend'], type(jdist.rank.session().backend).__name__)")
        assert out.stdout.strip().endswith("counting CountingBackend")
        ckpt = tmp_path / "ckpt.pt"
        k.run("%%distributed\nimport json, jdist_counting\n"
              "model = nn.Linear(4, 1)\nmodel, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
              "for _ in range(3):\n"
              "    jdist.backward(model(torch.ones(2, 4)).pow(2).mean()); opt.step(); opt.zero_grad()\n"
              f"jdist.save_checkpoint({str(ckpt)!r}, model=model, optimizer=opt, step=3)\n"
              f"state = jdist.load_checkpoint({str(ckpt)!r}, model=model, optimizer=opt)\n"
              "calls = json.dumps(jdist_counting.CALLS)")
        k.run("%dist pull calls")
        calls = [json.loads(c) for c in k.value("calls")]
        assert calls == [{"backward": 3, "optimizer_step": 3, "save_state": 1, "load_state": 1}] * 2
        k.run("%dist pull state --rank 0")
        assert k.value("state") == {"step": 3, "by": "counting"}
        # the kernel saw the backend's spec (its stacks wait in backward, like DDP's)
        assert "waiting in" not in k.run("%dist stacks").stdout
    finally:
        k.run("%dist stop", allow_error=True)
        k.shutdown()
