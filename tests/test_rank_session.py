"""The rank runtime without a cluster: one process's session (jdist.rank.session.local_session),
its record stream, metric sources and input checks. The runtime on real ranks: test_runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import jdist
from jdist.metrics import AUTO_METRICS, RECORD_KEYS
from jdist.rank import api
from jdist.rank.channel import ListChannel
from jdist.rank.session import local_session
from jdist.rank.sources import Memory, default_sources


def test_log_outside_a_cluster_says_where_to_call_it():
    with pytest.raises(RuntimeError, match=r"%%distributed"):
        jdist.log(loss=1.0)


def test_prepare_outside_a_cluster_says_where_to_call_it():
    with pytest.raises(RuntimeError, match=r"%%distributed"):
        jdist.prepare(torch.nn.Linear(2, 1))


@pytest.mark.parametrize("value,expected", [(1, 1), (2.5, 2.5), (torch.tensor(3.0), 3.0), (np.float32(0.5), 0.5)])
def test_number_accepts_scalars_and_one_element_tensors(value, expected):
    assert api._number("loss", value) == expected


def test_number_rejects_vectors_with_the_fix():
    with pytest.raises(TypeError, match=r"loss=loss.mean\(\).item\(\)"):
        api._number("loss", torch.ones(3))


@pytest.mark.parametrize("value", ["high", [1.0], True, None])
def test_number_rejects_non_numbers(value):
    with pytest.raises(TypeError, match="must be a number"):
        api._number("loss", value)


def test_memory_on_cpu_reports_rss_and_peak():
    with local_session() as s:
        mem, peak = Memory().read(s)
    assert 10 * 2**20 < mem <= peak


def test_sources_produce_exactly_the_automatic_metrics():
    names = [n for source in default_sources() for n in source.names]
    assert names == list(AUTO_METRICS)  # one source per metric, in the documented order
    ch = ListChannel()
    with local_session(ch) as s:
        jdist.log(step=3, loss=0.5)
        s.end_cell()
    (rec,) = ch.messages[-1]["records"]
    assert set(rec) == set(RECORD_KEYS) | set(AUTO_METRICS) | {"loss"}
    assert rec["step"] == 3 and rec["compute_time_s"] == pytest.approx(rec["step_time_s"] - rec["comm_time_s"])
    assert rec["samples_per_s"] is None and rec["state_bytes"] is None  # no batch size, nothing prepared


def test_records_are_numbered_batched_and_counted_at_the_cell_end():
    ch = ListChannel()
    with local_session(ch) as s:  # no publisher thread: nothing is published before the cell ends
        for step in range(5):
            jdist.log(step=step, x=float(step))
        assert ch.messages == []
        end = s.end_cell()
        assert [r["seq"] for r in end["records"]] == list(range(5)) and end["count"] == 5
        assert [r["seq"] for r in s.stream.records(s.stream.cell, [1, 3])] == [1, 3]  # what repair fetches
        assert s.stream.records(s.stream.cell - 1, [1]) == []  # an earlier cell's are gone


def test_the_hot_path_only_records_memory_is_read_once_per_batch(monkeypatch):
    reads = []
    real = Memory.read
    monkeypatch.setattr(Memory, "read", lambda self, s: reads.append(1) or real(self, s))
    ch = ListChannel()
    with local_session(ch) as s:
        for step in range(100):
            jdist.log(step=step, loss=0.5)
        assert reads == [] and len(s.stream.pending) == 100  # no /proc read, no CUDA query in jdist.log
        end = s.end_cell()
    assert len(reads) == 1
    assert len({(r["mem_bytes"], r["mem_peak_bytes"]) for r in end["records"]}) == 1 and end["records"][0]["mem_bytes"] > 0


class FakeCudaEvent:
    """Stands in for ``torch.cuda.Event(enable_timing=True)``: CUDA cannot exist on this CPU-only machine."""

    def __init__(self, t: float, done: bool = True):
        self.t, self.done, self.waited = t, done, 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True

    def elapsed_time(self, end: "FakeCudaEvent") -> float:
        return (end.t - self.t) * 1e3


def test_cuda_comm_events_are_read_once_complete_and_never_waited_for_during_a_cell():
    import time

    ch = ListChannel()
    with local_session(ch) as s:
        sent = lambda: [(r["step"], r["comm_time_s"]) for m in ch.messages for r in m["records"]]  # noqa: E731
        s.timer.record_cuda(FakeCudaEvent(0.0), FakeCudaEvent(0.002))
        time.sleep(0.01)
        jdist.log(step=0)
        s.publish_due()
        assert sent() == [(0, pytest.approx(0.002))]
        late = FakeCudaEvent(0.004, done=False)  # the GPU has not reached the end of this all-reduce
        s.timer.record_cuda(FakeCudaEvent(0.0), late)
        time.sleep(0.01)
        jdist.log(step=1)
        jdist.log(step=2)  # no communication, but it comes after step 1
        assert s.publish_due() == 0 and [step for step, _ in sent()] == [0]  # both wait; nothing waited for the GPU
        late.done = True
        jdist.log(step=3)
        assert s.publish_due() == 3
        assert [step for step, _ in sent()] == [0, 1, 2, 3] and sent()[1][1] == pytest.approx(0.004)
        assert late.waited == 0
        pending = FakeCudaEvent(0.001, done=False)
        s.timer.record_cuda(FakeCudaEvent(0.0), pending)
        jdist.log(step=4)
        end = s.end_cell()  # the cell's end waits for what is still running
    assert pending.waited == 1 and [r["step"] for r in end["records"]] == [4]
    assert end["records"][0]["compute_time_s"] == pytest.approx(end["records"][0]["step_time_s"] - end["records"][0]["comm_time_s"])


def test_reserved_names_and_batch_size_give_samples_per_s():
    with local_session() as s:
        with pytest.raises(ValueError, match="reserved metric name"):
            jdist.log(step_time_s=1.0)
        jdist.progress(total_steps=10, batch_size=32)
        jdist.log(loss=1.0)
        (rec,) = s.end_cell()["records"]
        assert rec["samples_per_s"] == pytest.approx(32 / rec["step_time_s"])
        assert s.stream.total_steps == 10


def test_log_hooks_see_every_record():
    seen = []
    with local_session() as s:
        s.log_hooks["test"] = lambda rec: seen.append(rec["step"])
        for step in (5, 6):
            jdist.log(step=step)
    assert seen == [5, 6]


def test_log_takes_no_lock_and_the_publisher_thread_sends_batches():
    import threading
    import time

    ch = ListChannel()
    with local_session(ch) as s:
        with s._lock:  # as while the publisher thread completes a batch
            done = threading.Event()
            threading.Thread(target=lambda: (jdist.log(step=0, loss=1.0), done.set()), daemon=True).start()
            assert done.wait(5), "jdist.log waited for the publisher's lock"
        s.stream.flush_interval = 0.01
        s.start_publisher()
        try:
            for step in range(1, 50):
                jdist.log(step=step, loss=1.0)
            deadline = time.monotonic() + 10
            while sum(len(m["records"]) for m in ch.messages if m["kind"] == "records") < 50 \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            batches = [m for m in ch.messages if m["kind"] == "records"]  # (and the host's load, once a second)
            assert [r["step"] for m in batches for r in m["records"]] == list(range(50))  # in order, once each
            assert all(r["step_time_s"] is not None for m in batches for r in m["records"])
            end = s.end_cell()
        finally:
            s.stop_publisher()
    assert end["records"] == [] and end["count"] == 50


class FakeDeviceTensor:
    """Stands in for a one-element CUDA tensor (this machine has no CUDA; tests/test_gpu.py logs real ones)."""

    device = type("Device", (), {"type": "cuda"})()

    def __init__(self, value: float):
        self.value = value

    def numel(self) -> int:
        return 1

    def item(self) -> float:
        raise AssertionError("jdist.log synchronised with the GPU (.item() on a CUDA tensor)")


class FakeHostCopy:
    def __init__(self, value: float):
        self.value = value

    def item(self) -> float:
        return self.value


def test_cuda_tensor_values_are_copied_without_a_sync_and_sent_once_arrived(monkeypatch):
    events = []

    def defer(value):
        events.append(FakeCudaEvent(0.0, done=False))
        return FakeHostCopy(value.value), events[-1]

    monkeypatch.setattr(api, "defer_device_value", defer)
    ch = ListChannel()
    with local_session(ch) as s:
        jdist.log(step=0, loss=FakeDeviceTensor(0.25), lr=0.1)
        assert s.publish_due() == 0 and ch.messages == []  # the copy has not arrived: wait, do not block
        events[0].done = True
        assert s.publish_due() == 1
        (rec,) = ch.messages[0]["records"]
        assert rec["loss"] == 0.25 and rec["lr"] == 0.1
        jdist.log(step=1, loss=FakeDeviceTensor(0.5))
        end = s.end_cell()  # the cell's end waits for the copy
    assert events[1].waited == 1 and end["records"][0]["loss"] == 0.5


def test_values_kept_on_the_device_are_copied_a_batch_at_a_time_by_the_publisher(monkeypatch, capfd):
    # A CUDA value on the default stream stays a tensor on the training thread (ON_DEVICE); the publisher
    # starts one copy per device and dtype for the batch (sources._start_copy: CUDA cannot exist here, so
    # it is replaced by a CPU copy and a fake event) and reads the values once that copy's event completed.
    from jdist.rank import auto_metrics, sources

    copies = []

    class Kept(FakeDeviceTensor):  # a CUDA tensor the publisher copies (not read on the training thread)
        def __init__(self, value, dtype=torch.float32):
            super().__init__(value)
            self.dtype = dtype

        def reshape(self, *shape):
            return torch.tensor([self.value], dtype=self.dtype).reshape(*shape)

    def start_copy(device, tensors):
        flat = torch.cat([t.reshape(1) for t in tensors])
        copies.append(flat.tolist())
        return flat, FakeCudaEvent(0.0, done=False)

    monkeypatch.setattr(sources, "_start_copy", start_copy)
    monkeypatch.setattr(api, "defer_device_value", lambda value: (value, sources.ON_DEVICE))
    ch = ListChannel()
    with local_session(ch) as s:
        jdist.log(step=0, loss=Kept(0.25), n=Kept(3, torch.int64))
        roots = [(Kept(2.0), 0.5), (Kept(4.0, torch.float64), 0.5)]  # two backwards (accumulation), mixed dtypes
        s.add_entry({"rank": 0, "cell": s.stream.cell, "seq": 0, "step": 1, "time": 0.0}, 0.0, None, None, 0,
                    [("loss", roots, sources.ON_DEVICE)])
        assert s.publish_due() == 0 and ch.messages == []  # copies started, not arrived: nothing waits
        assert copies == [[0.25], [3], [2.0, 4.0]]  # one copy per dtype (an int stays exact); a step's parts together
        assert s.publish_due() == 0 and len(copies) == 3  # started once
        for entry in s.stream.pending:
            for _, _, event in entry[5]:
                event.done = True
        assert s.publish_due() == 2
        recs = ch.messages[0]["records"]
        assert (recs[0]["loss"], recs[0]["n"], recs[1]["loss"]) == (0.25, 3, 3.0)
        jdist.log(step=2, loss=Kept(0.5))
        end = s.end_cell()  # the cell's end starts the copy and waits for it
    assert end["records"][0]["loss"] == 0.5 and copies[-1] == [0.5]
    assert auto_metrics.ON_DEVICE is sources.ON_DEVICE

    def broken(device, tensors):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(sources, "_start_copy", broken)
    with local_session(ListChannel()) as s:
        jdist.log(step=0, loss=Kept(0.25), lr=0.1)
        end = s.end_cell()  # the cell still ends: the record without its value, and one line
    assert (end["records"][0]["loss"], end["records"][0]["lr"]) == (None, 0.1)
    assert "copying 1 logged CUDA value(s) to the host failed" in capfd.readouterr().err


def test_a_hosts_lowest_rank_sends_its_load_about_once_a_second_while_a_cell_runs():
    import socket
    import time

    from jdist.rank import hostload

    channel = ListChannel()
    with local_session(channel) as s:
        s.start_publisher()
        try:
            time.sleep(hostload.EVERY_S + 0.6)  # the first sample at once, the next a second later
            s.end_cell()
            sent_while_open = [m for m in channel.messages if m["kind"] == "host"]
            time.sleep(0.6)  # no cell runs: nothing more
            assert [m for m in channel.messages if m["kind"] == "host"] == sent_while_open
        finally:
            s.stop_publisher()
    first, second = sent_while_open[:2]
    assert len(sent_while_open) == 2 and first["host"] == second["host"] == socket.gethostname()
    assert first["cpu"] is None and 0.0 <= second["cpu"] <= 1.0  # busy since the previous sample
    assert 0 < second["mem_used"] < second["mem_total"] and second["net_bytes_s"] >= 0
    assert second["time"] - first["time"] == pytest.approx(hostload.EVERY_S, abs=0.3)
    assert second["gpus"] == []  # no NVML here (tests/test_gpu.py checks a GPU host)
