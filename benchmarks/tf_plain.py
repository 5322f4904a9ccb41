"""The training of ``benchmarks/bench_tf.py``, shared by jdist's ``--framework tf`` ranks and plain ``mpiexec``.

Plain (what a user without jdist writes; the same TF_CONFIG, threads and strategy options as jdist's ranks)::

    mpiexec -n 2 python benchmarks/tf_plain.py --out times.json [--width 256] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from typing import Any

SAMPLES, FEATURES, BATCH = 4096, 32, 64


def build(tf: Any, strategy: Any, width: int) -> tuple[Any, Any]:
    """The model (under ``strategy``) and the data set: the same on every rank."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)).astype("float32")).ravel()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    tf.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(width, activation="relu"),
                                     tf.keras.layers.Dense(width, activation="relu"), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    return model, ds


def train(tf: Any, model: Any, ds: Any, epochs: int, callbacks: list[Any]) -> list[float]:
    """``model.fit``; every batch's wall time (seconds, ``perf_counter`` between batch ends)."""
    times: list[float] = []

    class Timing(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            self.last = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            now = time.perf_counter()
            times.append(now - self.last)
            self.last = now

    model.fit(ds, epochs=epochs, verbose=0, callbacks=[Timing(), *callbacks])
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import tensorflow as tf

    threads = max(1, (os.cpu_count() or 1) // comm.Get_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workers = comm.allgather(f"127.0.0.1:{port}")
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                          "task": {"type": "worker", "index": comm.Get_rank()}})
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=60, implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    ready_at = comm.allreduce(time.time(), op=MPI.MAX)  # every rank has its strategy
    model, ds = build(tf, strategy, args.width)
    times = train(tf, model, ds, args.epochs, [])
    every = comm.gather(times, root=0)
    if comm.Get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"times": every, "ready_at": ready_at}, f)


if __name__ == "__main__":
    main()
