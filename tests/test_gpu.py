"""The --gpus path: NCCL, one CUDA device per rank, CUDA memory metrics.

Needs CUDA GPUs; skipped (not failed) on machines without them, such as CI.
"""

from __future__ import annotations

import pytest

from jdist.kernel.probes import visible_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(visible_gpus() < 1, reason="needs a CUDA GPU")]


def test_gpu_ddp_training_with_cuda_metrics(kernel):
    n = min(visible_gpus(), 2)
    out = kernel.run(f"%%distributed --gpus {n}\nimport torch, torch.nn as nn, torch.distributed as dist\n"
                     "print(device, dist.get_backend())")
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
    )
    h = "jdist.last_run().history"
    assert kernel.value(f"len({h})") == 30 * n
    assert kernel.value(f"int({h}.mem_bytes.min())") > 0
    assert kernel.value(f"bool(({h}.mem_peak_bytes >= {h}.mem_bytes).all())")
    if n > 1:
        assert kernel.value(f"float({h}.comm_time_s.min())") > 0
    kernel.run("%dist stop")


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_backends_train_in_mixed_precision(kernel, backend, precision):
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
    assert out.stdout.strip().endswith(f"['{want}'] True cuda:0")
    h = "jdist.last_run().history"
    if n > 1:
        assert kernel.value(f"float({h}.comm_time_s.min())") > 0
    assert kernel.value(f"int({h}.state_bytes.min())") > 0
    kernel.run("%dist stop")
