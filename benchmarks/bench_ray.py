"""What does ``jdist.ray.fit`` add to a Ray Train run, against ``trainer.fit()`` alone?

Measured side by side in one run, on a local Ray (``ray.init`` once, before the first fit, as a kernel
that already started Ray), with the same ``TorchTrainer`` of 2 CPU workers training a small linear
model under DDP (``prepare_model``), ``--steps`` steps of ``--sleep`` s each, a ``ray.train.report``
every 50 steps:

1. **time to first step**: from the call (``trainer.fit()``, or ``jdist.ray.fit(trainer)``) to the
   first training step on the later of the two workers (the workers' wall clocks, same host);
2. **time to return**: from the call until it returned the result;
3. **the training loop** on the workers (first step to last): the cost of ``jdist.log`` on every step
   (jdist variant only; its session's publisher thread included), per step;
4. **metric latency, worker -> kernel**: for each record, from ``jdist.log`` on the worker to its arrival
   at the run's sinks in this process (the dashboard's input: the run log, the widget), and for each
   ``ray.train.report``, from the worker's ``report`` call to the arrival of its record. Goal: p90 <= 0.5 s.

Both variants run with ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2`` (``jdist.ray.fit`` sets it when it is not
set; at Ray's default of 2 s each report blocked its worker about 1 s), so that the comparison shows what
jdist adds, not that setting. ``--repeats`` runs of each, interleaved; medians.

Usage::

    .venv/bin/python benchmarks/bench_ray.py [--repeats 3] [--steps 1000] [--sleep 0.005] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import quantile  # noqa: E402

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # both variants alike (see above)


def train_func(config: dict[str, Any]) -> None:
    import json
    import os
    import time

    import ray.train
    import torch

    with_jdist = config["jdist"]
    if with_jdist:
        import jdist
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    first = None
    for step in range(config["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if first is None:
            first = time.time()
        if with_jdist:
            jdist.log(step=step, loss=loss.item())
        time.sleep(config["sleep"])
        if step % 50 == 49:
            ray.train.report({"step": step, "t_report": time.time(), "loss": loss.item()})
    last = time.time()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump({"first": first, "last": last}, f)


class Arrivals:
    """A record sink that notes when each record reached the run's sinks in this process."""

    def __init__(self) -> None:
        self.log_lat: list[float] = []
        self.report_lat: list[float] = []

    def start(self, run: Any) -> None:
        pass

    def add(self, records: list[dict[str, Any]]) -> None:
        now = time.time()
        for r in records:
            if "t_report" in r:
                self.report_lat.append(now - r["t_report"])
            elif "loss" in r:
                self.log_lat.append(now - r["time"])

    def tick(self) -> None:
        pass

    def finish(self, run: Any) -> None:
        pass


def one_fit(with_jdist: bool, steps: int, sleep: float, storage: str) -> dict[str, Any]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import jdist.kernel.raytrain as raytrain
    import jdist.ray

    out = tempfile.mkdtemp(prefix="bench-ray-")
    trainer = TorchTrainer(train_func, train_loop_config={"jdist": with_jdist, "steps": steps, "sleep": sleep, "out": out},
                           scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path=storage))
    probe = Arrivals()
    default = raytrain.default_sinks
    raytrain.default_sinks = lambda run, opts: [*default(run, opts), probe]
    try:
        t0 = time.time()
        jdist.ray.fit(trainer, run_dir=out) if with_jdist else trainer.fit()  # a failed fit raises
        returned = time.time()
    finally:
        raytrain.default_sinks = default
    ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(2)]
    first = max(r["first"] for r in ranks)
    loop = max(r["last"] - r["first"] for r in ranks)
    return {"first_step_s": first - t0, "return_s": returned - t0, "loop_s": loop,
            "log_latency_s": probe.log_lat, "report_latency_s": probe.report_lat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--sleep", type=float, default=0.005)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    try:
        import ray
        from ray import cloudpickle
    except ImportError:
        sys.exit("bench_ray needs Ray: pip install 'jdist[ray]' (make test installs it)")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # train_func travels as a notebook's would
    t = time.time()
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    print(f"ray.init: {time.time() - t:.1f} s ({int(ray.cluster_resources().get('CPU', 0))} CPUs)", flush=True)
    storage = tempfile.mkdtemp(prefix="bench-ray-storage-")
    res: dict[str, list[dict[str, Any]]] = {"plain": [], "jdist": []}
    for i in range(args.repeats):
        for name in ("plain", "jdist"):
            print(f"[{i + 1}/{args.repeats}] {name}...", flush=True)
            res[name].append(one_fit(name == "jdist", args.steps, args.sleep, storage))
    ray.shutdown()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in res[name])

    print(f"\nRay Train, 2 CPU workers, {args.steps} steps of {args.sleep * 1e3:g} ms sleep + a DDP step, a report "
          f"every 50 steps; {args.repeats} runs each, medians")
    print(f"   {'':<44}{'trainer.fit()':>15}{'jdist.ray.fit':>15}{'ratio':>8}  target")
    for key, label, target in (("first_step_s", "time to first step (s)", "-"),
                               ("return_s", "call to result (s)", "-"),
                               ("loop_s", "training loop on the workers (s)", "<= 1.03x")):
        a, b = med("plain", key), med("jdist", key)
        print(f"   {label:<44}{a:15.2f}{b:15.2f}{b / a:7.2f}x  {target}")
    per_step = (med("jdist", "loop_s") - med("plain", "loop_s")) / args.steps
    print(f"   {'jdist.log per step, loop difference (ms)':<44}{'':>15}{per_step * 1e3:15.3f}")
    logs = sorted(v for r in res["jdist"] for v in r["log_latency_s"])
    reps = sorted(v for r in res["jdist"] for v in r["report_latency_s"])
    for label, vals in (("jdist.log -> kernel sinks (s)", logs), ("ray.train.report -> kernel sinks (s)", reps)):
        p50, p90 = quantile(vals, 0.5), quantile(vals, 0.9)
        ok = "met" if p90 <= 0.5 else "MISSED"
        print(f"   {label:<44}p50 {p50:.3f}  p90 {p90:.3f}  max {vals[-1]:.3f}  ({len(vals)} records)  "
              f"target p90 <= 0.5: {ok}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
