"""The --gpus path: NCCL, one CUDA device per rank, CUDA memory metrics.

Needs CUDA GPUs; skipped (not failed) on machines without them, such as CI.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jdist.kernel.probes import visible_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(visible_gpus() < 1, reason="needs a CUDA GPU")]


def test_counting_gpus_does_not_import_torch_in_the_kernel():
    # The kernel checks --gpus N against the machine before starting ranks; importing torch there
    # for it cost 4.4 s of a 13 s cold start on the H100 machine.
    code = "import sys; from jdist.kernel.probes import visible_gpus; print(visible_gpus(), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(visible_gpus()), "False"]


def test_gpu_ddp_training_with_cuda_metrics(kernel):
    n = min(visible_gpus(), 2)
    kernel.run(f"%%distributed --gpus {n}\nimport torch, torch.nn as nn, torch.distributed as dist")
    out = kernel.run("%%distributed\nprint(device, dist.get_backend())")  # a cell of its own: no start-up lines
    assert out.stdout.strip() == "cuda:0 nccl"
    kernel.run(
        "%%distributed\n"
        "model = jdist.prepare(nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "jdist.progress(total_steps=30, batch_size=256)\n"
        "for step in range(30):\n"
        "    x = torch.randn(256, 512, device=device)\n"
        "    loss = model(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step()\n"
        "    jdist.log(step=step, loss=loss.item())\n"
        "peak = torch.cuda.max_memory_allocated()\n"
    )
    h = "jdist.last_run().history"
    assert kernel.value(f"len({h})") == 30 * n
    assert kernel.value(f"int({h}.mem_bytes.min())") > 0
    assert kernel.value(f"bool(({h}.mem_peak_bytes >= {h}.mem_bytes).all())")
    # the peak reported is the rank's own CUDA peak
    kernel.run("%dist pull peak")
    assert kernel.value(f"int({h}[{h}['rank'] == 0].mem_peak_bytes.max())") == kernel.value("peak")[0]
    if n > 1:
        assert kernel.value(f"float({h}.comm_time_s.min())") > 0
    kernel.run("%dist stop")


@pytest.mark.parametrize("backend", ["ddp", "fsdp", "deepspeed"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_backends_train_in_mixed_precision(kernel, backend, precision):
    if backend == "deepspeed":
        _deepspeed_or_skip()
    n = min(visible_gpus(), 2)
    kernel.run(f"%%distributed --gpus {n} --backend {backend} --precision {precision} --restart\n"
               "import torch, torch.nn as nn")
    out = kernel.run(
        "%%distributed\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))\n"
        "model, opt = jdist.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))\n"
        "seen = set()\n"
        "next(m for m in model.modules() if isinstance(m, nn.Linear)).register_forward_hook("
        "lambda m, a, o: seen.add(str(o.dtype)))\n"
        "w = torch.randn(512, 10, device=device)\n"
        "losses = []\n"
        "for step in range(40):\n"
        "    x = torch.randn(256, 512, device=device)\n"
        "    loss = nn.functional.mse_loss(model(x), x @ w)\n"
        "    jdist.backward(loss); jdist.clip_grad_norm_(model, 1.0); opt.step(); opt.zero_grad()\n"
        "    losses.append(loss.item()); jdist.log(step=step, loss=loss.item())\n"
        "print(sorted(seen), losses[-1] < losses[0], str(next(model.parameters()).device))\n"
    )
    want = "torch.bfloat16" if precision == "bf16" else "torch.float16"
    assert f"['{want}'] True cuda:0" in out.stdout.splitlines()  # the run's summary follows it
    h = "jdist.last_run().history"
    if n > 1:
        assert kernel.value(f"float({h}.comm_time_s.min())") > 0
    assert kernel.value(f"int({h}.state_bytes.min())") > 0
    kernel.run("%dist stop")


def test_gpu_watchdog_never_stops_healthy_training(kernel):
    # 10 s of GPU training without output under a 1 s watchdog (the false hang seen on an H100)
    kernel.run("%%distributed --gpus 1 --backend ddp --restart --watchdog 1\nimport time, torch, torch.nn as nn")
    out = kernel.run(
        "%%distributed\n"
        "model = jdist.prepare(nn.Sequential(nn.Linear(2048, 8192), nn.ReLU(), nn.Linear(8192, 2048)))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "t0 = time.perf_counter()\n"
        "while time.perf_counter() - t0 < 10:\n"  # one rank: no step count to agree on
        "    loss = model(torch.randn(512, 2048, device=device)).square().mean()\n"
        "    jdist.backward(loss); opt.step(); opt.zero_grad()\n"
        "torch.cuda.synchronize(); print('trained', round(time.perf_counter() - t0))\n"
    )
    assert out.error is None and "trained 10" in out.stdout
    kernel.run("%dist stop")


def test_cpu_fsdp_ranks_on_a_gpu_machine(kernel):
    # fully_shard's default mesh is a CUDA one wherever CUDA exists: CPU ranks must shard on a CPU mesh
    kernel.run("%%distributed -n 2 --backend fsdp --restart --watchdog 30\nimport torch, torch.nn as nn")
    out = kernel.run(
        "%%distributed\n"
        "model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))\n"
        "model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "for step in range(5):\n"
        "    jdist.backward(model(torch.randn(16, 64)).square().mean()); opt.step(); opt.zero_grad()\n"
        "w = next(model.parameters())\n"
        "print(torch.cuda.is_available(), w.device_mesh.device_type, w.device)\n"
    )
    assert out.stdout.splitlines()[0] == "True cpu cpu"  # the run's summary follows it
    kernel.run("%dist stop")


def _deepspeed_or_skip() -> None:
    from jdist.backends.deepspeed import SPEC as DEEPSPEED

    if DEEPSPEED.unavailable():
        pytest.skip(DEEPSPEED.unavailable())


def test_gpu_deepspeed_zero_3_fp16_scales_the_loss_and_offload_leaves_gpu_memory(kernel):
    _deepspeed_or_skip()
    n = min(visible_gpus(), 2)
    kernel.run(f"%%distributed --gpus {n} --backend deepspeed --zero 3 --precision fp16 --restart\n"
               "import gc, os, torch, torch.nn as nn, deepspeed")
    # The GPU memory one engine adds, from before the model is built to after training: without offload
    # its fp16 parameters, fp32 master copy and Adam state (~16 B per parameter over the ranks), with
    # --offload all only DeepSpeed's buffers. (On the H100, 2026-11-25: comparing memory_allocated()
    # after training alone showed no drop: DeepSpeed's 1.2 GB of buffers and the first engine, which
    # lingers after `model` is rebound, hide the state that left.)
    code = (
        "%%distributed\n"
        "gc.collect(); torch.cuda.synchronize(); m0 = torch.cuda.memory_allocated()\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2048))\n"
        "model, opt = jdist.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))\n"
        "for step in range(10):\n"
        "    x = torch.randn(64, 2048, device=device)\n"
        "    loss = nn.functional.mse_loss(model(x), x); jdist.backward(loss); opt.step()\n"
        "torch.cuda.synchronize()\n"
        "seen = (os.environ['DS_ACCELERATOR'], model.zero_optimization_stage(), float(model.optimizer.loss_scale),"
        " loss.dtype == torch.float32, model.zero_offload_param() is not None,"
        " torch.cuda.memory_allocated() - m0)\n"
        "del model, opt, loss\n"
    )
    kernel.run(code)
    kernel.run("%dist pull seen")
    plain = kernel.value("seen")
    for accel, stage, scale, fp32_loss, offloaded, _ in plain:
        assert (accel, stage, fp32_loss, offloaded) == ("cuda", 3, True, False) and scale > 1  # dynamic loss scaling
    kernel.run("%%distributed --offload all\npass")
    kernel.run(code)
    kernel.run("%dist pull seen")
    state = 16 * (2048 * 4096 * 2 + 4096 + 2048) // n  # fp16 param + fp32 master + 2 Adam moments, this rank's part
    for before, after in zip(plain, kernel.value("seen")):
        assert after[4], after  # the engine was built with offload_param
        assert after[-1] < before[-1] - state // 2, (before, after, state)  # parameters and optimizer state left the GPU
    kernel.run("%dist stop")


def test_cpu_deepspeed_ranks_on_a_gpu_machine(kernel):
    _deepspeed_or_skip()
    # --precision fp32: options stay from the cell before (the previous test's --precision fp16)
    kernel.run("%%distributed -n 2 --backend deepspeed --precision fp32 --restart\nimport os, torch, torch.nn as nn")
    out = kernel.run(
        "%%distributed\n"
        "model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))\n"
        "model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "for step in range(5):\n"
        "    jdist.backward(model(torch.randn(16, 64)).square().mean()); opt.step()\n"
        "print(torch.cuda.is_available(), os.environ['DS_ACCELERATOR'], next(model.parameters()).device)\n"
    )
    assert out.stdout.splitlines()[0] == "True cpu cpu"  # the run's summary follows it
    kernel.run("%dist stop")


def test_gpu_log_of_cuda_tensors_never_synchronises(kernel):
    # jdist.log(loss=<CUDA tensor>) copies it to the host asynchronously; with CUDA's sync debug
    # mode at "error", any synchronising call (such as .item()) in the step raises
    kernel.run("%%distributed --gpus 1 --backend ddp --restart\nimport torch, torch.nn as nn")
    out = kernel.run(
        "%%distributed\n"
        "model = jdist.prepare(nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "x = torch.randn(64, 512, device=device)\n"
        "expected = []\n"
        "for step in range(20):\n"
        "    loss = model(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step()\n"
        "    torch.cuda.set_sync_debug_mode('error')\n"
        "    jdist.log(step=step, loss=loss, acc=loss.detach() * 0 + 0.5)\n"
        "    torch.cuda.set_sync_debug_mode('default')\n"
        "    expected.append(loss.item())\n"
    )
    assert out.error is None, out.traceback
    kernel.run("%dist pull expected")
    losses = kernel.value("jdist.last_run().history.sort_values('step').loss.tolist()")
    assert losses == pytest.approx(kernel.value("expected")[0], rel=1e-6)
    assert kernel.value("set(jdist.last_run().history.acc)") == {0.5}
    # values on the default stream are copied by the publisher a batch at a time; one made on another stream
    # is copied at the log, on that stream
    out = kernel.run("%%distributed\n"
                     "side = torch.cuda.Stream()\n"
                     "with torch.cuda.stream(side):\n"
                     "    jdist.log(step=0, on_side=torch.full((), 7.0, device=device) * 2)\n"
                     "jdist.log(step=1, on_default=torch.full((), 3.0, device=device))\n")
    assert out.error is None, out.traceback
    h = "jdist.last_run().history.sort_values('step')"
    assert kernel.value(f"{h}.on_side.tolist()[0]") == 14.0
    assert kernel.value(f"{h}.on_default.tolist()[1]") == 3.0
    kernel.run("%dist stop")


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_gpu_sweep_slots_use_nccl_and_the_world_group_comes_back(kernel, backend):
    # The same steps ran as a script on one H200 on 2026-11-25 (docs/tune.md); one GPU: one slot of one rank.
    pytest.importorskip("optuna")
    kernel.run(f"%%distributed --gpus 1 --backend {backend} --restart\n"
               "import torch, torch.nn as nn, torch.distributed as dist\n"
               "def objective(trial):\n"
               "    lr = trial.suggest_float('lr', 1e-3, 1e-1, log=True)\n"
               "    model = jdist.prepare(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))\n"
               "    opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
               "    x = torch.randn(32, 64, device=device)\n"
               "    for step in range(20):\n"
               "        loss = model(x).square().mean(); jdist.backward(loss); opt.step(); opt.zero_grad()\n"
               "        jdist.log(step=step, loss=loss)\n"
               "        if step % 5 == 4 and jdist.should_prune(): break\n"
               "    return float(loss)")
    out = kernel.run("study = jdist.tune('objective', trials=4, per_trial=1, metric='loss', pruner='median', show=False)")
    assert "Sweep done" in out.stdout and "fail" not in out.stdout, out.stdout
    out = kernel.run("%%distributed\nt = torch.ones(1, device=device); dist.all_reduce(t)\n"
                     "print(dist.get_backend(), dist.get_world_size(), float(t))")
    assert out.stdout.strip() == "nccl 1 1.0"
    kernel.run("%dist stop")


# -- automatic metrics (jdist.rank.auto_metrics) on CUDA ranks ------------------------------------------------

def test_gpu_unchanged_scripts_under_jdist_run_have_a_record_per_step(tmp_path):
    # tests/test_auto_metrics.py's scripts, on NCCL with GradScaler and fp16 autocast (JDIST_TEST_GPU=1)
    from test_auto_metrics import EXAMPLES, NANOGPT, assert_step_records, printed

    from jdist.metrics import list_runs, read_run

    env = {**os.environ, "JDIST_TEST_GPU": "1", "JDIST_RUN_DIR": str(tmp_path / "runs")}
    for name, text, args in (("nanogpt.py", NANOGPT, []), ("examples.py", EXAMPLES, ["--steps", "5"])):
        (tmp_path / name).write_text(text)
        out = subprocess.run([sys.executable, "-m", "jdist", "run", "--gpus", "1", "--output", "all",
                              str(tmp_path / name), *args], capture_output=True, text=True, timeout=240,
                             cwd=tmp_path, env=env, check=False)
        assert out.returncode == 0, out.stderr
        runs = sorted(list_runs(tmp_path / "runs"), key=lambda p: p.stat().st_mtime)
        losses = printed(out.stdout)
        assert len(losses) == (6 if name == "nanogpt.py" else 5), out.stdout
        assert_step_records(read_run(runs[-1]).records, losses)  # comm time > 0: DDP's all-reduce at world size 1


def test_gpu_automatic_loss_adds_no_synchronisation_to_the_step(kernel):
    # The loss of each step is copied to the host without a sync. Shown with torch.profiler: the CUDA
    # synchronisations (cuda*Synchronize, aten::_local_scalar_dense: .item()) of 10 steps of a script-built
    # DDP are the same with --auto-metrics on as with it off. GradScaler steps sync by themselves (torch
    # reads found_inf with .item()): they check the unscaled loss only.
    kernel.run("%%distributed --gpus 1 --backend ddp --restart\nimport torch, torch.nn as nn\n"
               "from torch.nn.parallel import DistributedDataParallel as DDP\n"
               "from torch.profiler import profile, ProfilerActivity")
    cell = (
        "%%distributed --auto-metrics {mode}\n"
        "torch.manual_seed(0)\n"
        "model = DDP(nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(device),"
        " device_ids=[device.index])\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "scaler = torch.amp.GradScaler('cuda')\n"
        "x = torch.randn(64, 512, device=device)\n"
        "def step(scaled):\n"
        "    with torch.autocast('cuda', dtype=torch.float16, enabled=scaled):\n"
        "        loss = model(x).square().mean()\n"
        "    opt.zero_grad()\n"
        "    if scaled:\n"
        "        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()\n"
        "    else:\n"
        "        loss.backward(); opt.step()\n"
        "    return loss\n"
        "losses = [step(False) for _ in range(5)]\n"  # warm-up: DDP rebuilds its buckets after the first
        "torch.cuda.synchronize()\n"
        "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:\n"
        "    losses += [step(False) for _ in range(10)]\n"
        "    torch.cuda.synchronize()\n"
        "syncs = sorted(e.name for e in prof.events() if 'Synchronize' in e.name or e.name == 'aten::_local_scalar_dense')\n"
        "syncs.remove('cudaDeviceSynchronize') if 'cudaDeviceSynchronize' in syncs else None\n"  # the profiled block's own
        "losses += [step(True) for _ in range(5)]\n"
        "losses = [float(l) for l in losses]\n"
    )
    kernel.run(cell.format(mode="off"))
    kernel.run("%dist pull syncs")
    off = kernel.value("syncs")[0]
    before = kernel.value("jdist.last_run().run_id if jdist.last_run() else None")
    kernel.run(cell.format(mode="on"))
    kernel.run("%dist pull syncs")
    on = kernel.value("syncs")[0]
    assert (on, off) == (off, off)
    # On an H200 (2026-11-27) both were one cudaDeviceSynchronize and 48 cudaEventSynchronize, not jdist's
    # (the same with its hooks off): the profiler sees syncs, and jdist adds none; no .item() ran.
    assert "aten::_local_scalar_dense" not in on, on
    kernel.run("%dist pull losses")
    assert kernel.value("jdist.last_run().run_id") != before
    records = kernel.value("[dict(r) for r in jdist.last_run().records]")
    assert [r["step"] for r in records] == list(range(20))
    assert [r["loss"] for r in records] == pytest.approx(kernel.value("losses")[0], rel=1e-6)  # unscaled
    assert all(r["comm_time_s"] > 0 and r["mem_bytes"] > 0 for r in records[1:]), records
    kernel.run("%dist stop")
