"""jdist.ray: a real local Ray cluster (2 CPUs) driven from this process as the notebook kernel
drives it: TorchTrainer runs with 2 gloo workers, their records on the run's sinks while they
train, a failing worker, an interrupt."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'jdist[ray]'")

pytestmark = pytest.mark.cluster


def train_func(config):
    import os
    import tempfile
    import time

    import ray.train
    import torch
    from ray.train import Checkpoint

    import jdist

    rank = ray.train.get_context().get_world_rank()
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(config["steps"]):
        loss = (model(torch.randn(16, 4)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        jdist.log(step=step, loss=loss.item())
        time.sleep(config["sleep"])
        if config.get("fail_at") == step and rank == 1:
            raise ValueError("bad batch on rank 1")
        if step % 10 == 9:
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                ray.train.report({"reported": float(step), "step": step},
                                 checkpoint=Checkpoint.from_directory(d) if rank == 0 else None)


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as a notebook's functions (__main__) travel
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield tmp_path_factory.mktemp("ray-storage")
    ray.shutdown()


def trainer(storage, **config):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(train_func, train_loop_config={"steps": 30, "sleep": 0.05, **config},
                        scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path=str(storage)))


class Probe:
    """A record sink noting when records of each rank reached the kernel's sinks."""

    def __init__(self):
        self.seen: list[tuple[float, int]] = []

    def start(self, run):
        pass

    def add(self, records):
        self.seen += [(time.time(), r["rank"]) for r in records]

    def tick(self):
        pass

    def finish(self, run):
        pass


def probed(monkeypatch) -> Probe:
    import jdist.kernel.raytrain as raytrain

    probe, default = Probe(), raytrain.default_sinks
    monkeypatch.setattr(raytrain, "default_sinks", lambda run, opts: [*default(run, opts), probe])
    return probe


def test_a_run_streams_both_workers_records_and_reports_and_returns_the_checkpoint(local_ray, monkeypatch):
    import jdist
    import jdist.ray
    from jdist.metrics import read_run

    probe = probed(monkeypatch)
    result = jdist.ray.fit(trainer(local_ray))
    returned = time.time()
    assert os.path.exists(os.path.join(result.checkpoint.path, "model.pt"))
    assert result.metrics["reported"] == 29.0
    run = jdist.last_run()
    assert run.status == "finished" and run.backend == "ray" and run.world_size == 2
    h = run.history
    assert h.groupby("rank").size().to_dict() == {0: 30, 1: 30}  # jdist.log: every step of both workers
    assert h[h.step == 19].reported.tolist() == [19.0, 19.0]  # ray.train.report: at its step, per worker
    assert h.step_time_s.notna().sum() >= 50 and h.mem_bytes.notna().all()  # the automatic metrics came too
    # live: both workers' records reached the sinks while they trained (30 steps of 50 ms or more)
    early = {rank for t, rank in probe.seen if t < returned - 1.0}
    assert early == {0, 1}, probe.seen[:5]
    assert read_run(run.path).count() == run.count()  # the run log, as the sidebar reads it


def test_a_failing_worker_is_a_rank_error_and_the_run_failed(local_ray):
    import jdist
    import jdist.ray
    from jdist.errors import RankError

    with pytest.raises(RankError) as info:
        jdist.ray.fit(trainer(local_ray, fail_at=5))
    err = info.value
    assert err.first == 1 and set(err.failed) == {1}
    assert err.headline.endswith("first failure on rank 1: ValueError: bad batch on rank 1"), err.headline
    assert any("bad batch on rank 1" in line for line in err.failed[1].traceback)
    run = jdist.last_run()
    assert run.status == "failed" and "bad batch" in run.error
    assert set(run.history["rank"]) == {0, 1}


def test_an_interrupt_aborts_the_run(local_ray):
    import jdist
    import jdist.ray

    def interrupt_once_training():
        deadline = time.time() + 120
        while time.time() < deadline:
            last = jdist.last_run()
            if last is not None and last.status == "running" and last.count() >= 4:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    before = jdist.last_run()
    threading.Thread(target=interrupt_once_training, daemon=True).start()
    started = time.time()
    with pytest.raises(KeyboardInterrupt):
        jdist.ray.fit(trainer(local_ray, steps=100_000, sleep=0.01))
    run = jdist.last_run()
    assert run is not before and run.status == "interrupted"
    assert time.time() - started < 120
    assert not [t for t in threading.enumerate() if t.name == "jdist-ray-fit"]  # the fit ended
