"""``--framework tf``: TensorFlow's ``MultiWorkerMirroredStrategy`` on jdist's ranks, without torch.

Set-up on every rank, before any TensorFlow op runs in the process (TF configures its collectives
once, when its eager context starts): the rank takes a free port on its address (loopback when all
ranks share a host), the ranks exchange ``address:port`` over MPI, ``TF_CONFIG`` names the workers
in rank order with this rank as its ``task``, TF's threads are set (``--threads``, default cores /
local ranks), and one ``MultiWorkerMirroredStrategy`` is made with
``CommunicationOptions(timeout_seconds=--timeout)``: a collective that waits longer raises
instead of hanging. It is the cells' ``strategy`` for the ranks' lifetime (TensorFlow cannot make
another in the same process: a new one needs ``%dist restart``). ``tf.keras`` is tf-keras
(``TF_USE_LEGACY_KERAS=1``): Keras 3's ``model.fit`` fails under this strategy (keras-team/keras#20585).

What TensorFlow does not offer jdist, and what that means (docs/frameworks.md#tensorflow):
no hook into its collectives, so records carry step time only (no communication split); and a
collective cannot be released: one that timed out (``--timeout``) makes TF fail every later one in
the process, and one interrupted in TF's code stays pending so that the ranks' next collectives pair
up wrongly (both measured). :meth:`TFBackend.unusable` says so after such a cell, and the kernel
restarts the ranks (set-up cells replayed, newest checkpoint restored).

On a rank (``strategy`` and ``tf`` are in the cell namespace)::

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)]); model.compile("sgd", "mse")
    model.fit(ds, epochs=3, callbacks=[jdist.keras.Callback()])
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil
import socket
import sys
import types
from pathlib import Path
from typing import Any

from .base import Backend, CommTimer, RankContext

#: Set before TensorFlow is imported on the ranks (unless the user's environment sets them).
TF_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}
#: What a torch-only call says on these ranks.
NOT_TORCH = ("--framework tf ranks run TensorFlow, not torch: build the Keras model under `with strategy.scope():` "
             "and train it with model.fit(..., callbacks=[jdist.keras.Callback()]) or a custom loop with "
             "strategy.run; for torch models start torch ranks (%%distributed -n N --backend ddp --restart).")


def worker_address(ctx: RankContext) -> str:
    """The address other ranks reach this rank's TF server at: loopback on one host, else the
    address this host's route to rank 0 leaves from."""
    if ctx.single_host:
        return "127.0.0.1"
    from jdist.common.network import route_source

    return ctx.master_addr if ctx.rank == 0 else route_source(ctx.master_addr)


def tf_config(workers: list[str], rank: int) -> dict[str, Any]:
    """``TF_CONFIG`` for worker ``rank`` of ``workers`` (``address:port``, in rank order).

    >>> tf_config(["127.0.0.1:5000", "127.0.0.1:5001"], 1)
    {'cluster': {'worker': ['127.0.0.1:5000', '127.0.0.1:5001']}, 'task': {'type': 'worker', 'index': 1}}
    """
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": rank}}


def collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a TensorFlow collective that failed (timed out, a peer gone): TF then fails
    every later collective of the process at once ("Restart your program to reset"; measured). An
    interrupt that was pending when it failed turns TF's error into pybind11's RuntimeError naming it.

    >>> collective_failure(RuntimeError("MISMATCH ... ORIGINAL DeadlineExceededError REPLACED BY KeyboardInterrupt"))
    True
    >>> collective_failure(ValueError("bad shape"))
    False
    """
    errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    if errors is not None and isinstance(error, errors.OpError):
        return "Collective" in str(error)
    return isinstance(error, RuntimeError) and "ORIGINAL DeadlineExceededError" in str(error)


def _tensorflow_frame(error: BaseException) -> str | None:
    """``file:line`` of the innermost frame of TensorFlow's own Python in ``error``'s traceback, or None."""
    where = None
    tb = error.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if "/tensorflow/python/" in path:
            where = f"{path.rsplit('/tensorflow/', 1)[1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _first_line(error: BaseException) -> str:
    """The error's first line without TF's ``{{function_node ...}}`` prefix.

    >>> _first_line(RuntimeError("{{function_node __wrapped__X}} Collective has timed out. [Op:X] name:\\nmore"))
    'Collective has timed out. [Op:X] name:'
    """
    text = re.sub(r"\{\{.*?\}\}\s*", "", str(error)).strip()
    return text.splitlines()[0][:300] if text else ""


def _trackables(model: Any, optimizer: Any) -> dict[str, Any]:
    objects = {k: v for k, v in (("model", model), ("optimizer", optimizer)) if v is not None}
    if not objects:
        raise ValueError("save_checkpoint/load_checkpoint on --framework tf ranks need model= (a Keras model) "
                         "and/or optimizer=.")
    return objects


class KeptAtexit:
    """``atexit`` as one module sees it: what the module registers is also kept in ``kept``, to run
    before the process ends without its interpreter's exit.

    >>> import atexit
    >>> kept = []; shim = KeptAtexit(atexit, kept)
    >>> _ = shim.register(print, "bye"); len(kept), shim.unregister is atexit.unregister
    (1, True)
    >>> atexit.unregister(print)
    """

    def __init__(self, real: Any, kept: list[Any]):
        self._real, self._kept = real, kept

    def register(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        self._kept.append(functools.partial(func, *args, **kwargs))
        return self._real.register(func, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class TempfileIn:
    """``tempfile`` as one module sees it: its named temporary files are made in ``folder``.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp(); shim = TempfileIn(tempfile, folder)
    >>> with shim.NamedTemporaryFile(delete=False) as f:
    ...     os.path.dirname(f.name) == folder
    True
    >>> shim.gettempdir() == tempfile.gettempdir()
    True
    >>> os.remove(f.name); os.rmdir(folder)
    """

    def __init__(self, real: Any, folder: str):
        self._real, self._folder = real, folder

    def NamedTemporaryFile(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - tempfile's name
        kwargs.setdefault("dir", self._folder)
        return self._real.NamedTemporaryFile(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def keep_autograph_files(kept: list[Any], folder: str | None = None) -> None:
    """TensorFlow's autograph writes every function it converts to a temporary file and removes the
    file at interpreter exit (``atexit``). Ranks end without that exit (``exit_process``, by design:
    it takes a second), which left those files in the temporary folder: their removals go to ``kept``
    too, and :meth:`TFBackend.teardown` runs them. A rank that is killed (a restart after a compiled
    collective failed, a death) runs no teardown: with ``folder`` (the cluster's own, on the kernel's host,
    removed when the cluster stops, whatever ended its ranks) the files are made there instead."""
    try:
        from tensorflow.python.autograph.pyct import loader
    except ImportError:  # moved in another TensorFlow: its files stay, as they would without jdist's exit
        return
    if isinstance(getattr(loader, "atexit", None), types.ModuleType):
        loader.atexit = KeptAtexit(loader.atexit, kept)
    if folder and isinstance(getattr(loader, "tempfile", None), types.ModuleType):
        loader.tempfile = TempfileIn(loader.tempfile, folder)


class TFBackend(Backend):
    """``--framework tf`` (``--backend tf``): one ``MultiWorkerMirroredStrategy`` per rank process."""

    name = "tf"
    checkpoint_layout = "dir"
    #: jdist's rank-side options this backend applies itself (not torch's ``--threads``).
    own_rank_options = ("threads", "precision")
    #: Nothing times TensorFlow's collectives: records carry step time only.
    times_comm = False

    def __init__(self) -> None:
        self.strategy: Any = None
        self.threads: int | None = None
        self.failed: str | None = None  # a collective that failed: TF's collectives are unusable from then on
        self.at_exit: list[Any] = []  # TensorFlow's own clean-up, run at teardown (keep_autograph_files)

    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        self.ctx = ctx
        for key, value in TF_ENV.items():
            os.environ.setdefault(key, value)
        import tensorflow as tf

        if tf.get_logger().level in (0, 20):  # not set, or INFO: one INFO line per collective it builds, in every cell
            tf.get_logger().setLevel("WARNING")
        keep_autograph_files(self.at_exit, ctx.work_dir)
        threads = ctx.options.get("threads") or max(1, (os.cpu_count() or 1) // ctx.local_world_size)
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        self.threads = threads
        address = worker_address(ctx)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
            port = probe.getsockname()[1]
        workers = ctx.comm.allgather(f"{address}:{port}")
        os.environ["TF_CONFIG"] = json.dumps(tf_config(workers, ctx.rank))
        comm = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=ctx.timeout_s, implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)

    def namespace(self) -> dict[str, Any]:
        import tensorflow as tf

        return {"strategy": self.strategy, "tf": tf}

    def apply_option(self, name: str, value: Any) -> None:
        assert self.ctx is not None
        if name == "threads" and value is not None and int(value) != self.threads:
            raise ValueError(f"--threads {value}: TensorFlow sets its threads once, when its ranks start; "
                             f"use %%distributed --threads {value} --restart.")
        self.ctx.options[name] = value

    def prepare_model(self, model: Any, **options: Any) -> Any:
        raise TypeError(NOT_TORCH)

    def collectives_started(self) -> str | None:
        return None  # no hook into TensorFlow's collectives

    def cell_ended(self, error: BaseException | None) -> None:
        if self.failed is not None or error is None:
            return
        if collective_failure(error):
            self.failed = f"{type(error).__name__}: {_first_line(error)}"
        elif isinstance(error, KeyboardInterrupt) and (where := _tensorflow_frame(error)):
            self.failed = (f"interrupted in TensorFlow at {where}: a collective it had started stays pending, "
                           "and the ranks' next collectives would pair up wrongly")

    def unusable(self) -> str | None:
        return self.failed

    def recreate_group(self) -> Any:
        raise RuntimeError("TensorFlow's collectives cannot be made again in a rank process; run %dist restart")

    def save_state(self, path: Path, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
        """Every rank writes a ``tf.train.Checkpoint`` of ``model`` and ``optimizer`` (the strategy's
        variables are saved collectively: rank 0 alone would wait for the others, measured as a hang);
        rank 0's goes to ``path`` with ``jdist.pkl`` (``meta``), the others' to a copy deleted at once."""
        import tensorflow as tf

        assert self.ctx is not None
        target = path if self.ctx.rank == 0 else path.with_name(f"{path.name}.rank-{self.ctx.rank}")
        target.mkdir(parents=True, exist_ok=True)
        tf.train.Checkpoint(**_trackables(model, optimizer)).write(str(target / "tf"))
        if self.ctx.rank == 0:
            (path / "jdist.pkl").write_bytes(pickle.dumps(meta))
        else:
            shutil.rmtree(target)

    def load_state(self, path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
        """Restore ``model`` and ``optimizer`` from rank 0's ``tf.train.Checkpoint`` in ``path`` (variables
        not created yet, such as an optimizer's slots before its first step, are restored when they are)."""
        import tensorflow as tf

        tf.train.Checkpoint(**_trackables(model, optimizer)).read(str(path / "tf")).assert_existing_objects_matched()
        return pickle.loads((path / "jdist.pkl").read_bytes())

    def teardown(self) -> None:
        self.strategy = None
        for func in self.at_exit:
            try:
                func()
            except Exception:  # noqa: BLE001 - a file already gone
                pass
        self.at_exit.clear()
