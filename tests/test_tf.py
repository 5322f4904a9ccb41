"""--framework tf: TensorFlow's MultiWorkerMirroredStrategy on 2 real CPU ranks of a real kernel
(jdist/rank/backends/tf.py, jdist/rank/integrations/keras.py): set-up without torch, tf-keras
model.fit with jdist.keras.Callback, a custom training loop, and bad input as one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import KernelSession

from jdist.plugins import backend_spec

TF = backend_spec("tf")

# TensorFlow's import costs this process 3 s: only the ranks need it, so it is looked for, not imported
pytestmark = [pytest.mark.cluster, pytest.mark.skipif(TF.unavailable() is not None, reason=str(TF.unavailable()))]

# every rank's weights, gathered over MPI: the largest difference from rank 0's (0.0: equal)
WEIGHTS_EQUAL = """
import numpy as np
from mpi4py import MPI
mine = np.concatenate([w.numpy().ravel() for w in {model}.weights])
every = MPI.COMM_WORLD.allgather(mine)
print("weights differ by", max(float(np.abs(w - every[0]).max()) for w in every), "over", mine.size, "values")
"""


@pytest.fixture(scope="module")
def kernel_env(kernel_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The kernel's, with a temporary folder of its own: the ranks' TensorFlow writes its autograph
    files there (test_a_timed_out_collective...: gone once the ranks ended)."""
    return {**kernel_env, "TMPDIR": str(tmp_path_factory.mktemp("tf-tmp"))}


def autograph_files(folder: str | Path) -> set[Path]:
    return set(Path(folder).glob("__autograph_generated_file*.py"))


def work_dir(kernel: KernelSession) -> Path:
    """The cluster's own folder, where its ranks' TensorFlow writes its autograph files."""
    return Path(kernel.value("str(jdist.kernel.cluster.current().work_dir)"))


@pytest.fixture(scope="module")
def tf_ranks(kernel: KernelSession) -> KernelSession:
    """A 2-rank --framework tf cluster shared by this module's tests."""
    out = kernel.run("%%distributed -n 2 --framework tf --timeout 30 --output all\n"
                     "import sys\n"
                     "print(f'rank {rank}: replicas {strategy.num_replicas_in_sync}, torch loaded: {\"torch\" in sys.modules}')")
    assert out.stdout.count("replicas 2, torch loaded: False") == 2, out.stdout + out.shown
    return kernel


def test_model_fit_under_the_strategy_streams_each_ranks_batches_and_ends_with_equal_weights(tf_ranks):
    out = tf_ranks.run("%%distributed\n"
                       "import numpy as np\n"
                       "rng = np.random.default_rng(0)\n"
                       "x = rng.normal(size=(512, 8)).astype('float32'); y = x @ np.linspace(-1, 1, 8).astype('float32')\n"
                       "ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)\n"
                       "with strategy.scope():\n"
                       "    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation='relu'),\n"
                       "                                 tf.keras.layers.Dense(1)])\n"
                       "    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss='mse')\n"
                       "history = model.fit(ds, epochs=3, verbose=0, callbacks=[jdist.keras.Callback()])\n"
                       "print('epoch loss', repr(history.history['loss'][-1]))\n"
                       + WEIGHTS_EQUAL.format(model="model"))
    assert "weights differ by 0.0 over 161 values" in out.stdout, out.stdout + out.shown
    # tf-keras sums the 2 replicas' batch logs; the callback's last record of an epoch is Keras's epoch value
    epoch_loss = float(out.stdout.split("epoch loss ")[1].split()[0])
    last = tf_ranks.value("jdist.last_run().history.query('step == 23').loss.tolist()")
    assert last == pytest.approx([epoch_loss, epoch_loss], rel=1e-5), (last, epoch_loss)
    h = tf_ranks.value("jdist.last_run().history.groupby('rank').step.agg(['count', 'max']).to_dict('list')")
    assert h == {"count": [24, 24], "max": [23, 23]}  # 512 samples in batches of 64: 8 steps per epoch, 3 epochs
    run = tf_ranks.value("(lambda r: (r.backend, r.status, r.has('loss'), r.has('comm_time_s'), r.has('step_time_s')))"
                         "(jdist.last_run())")
    assert run == ("tf", "finished", True, False, True)  # step time, no communication split: nothing times TF's
    losses = tf_ranks.value("[round(v, 4) for v in jdist.last_run().history.query('rank == 0').loss.iloc[[0, -1]]]")
    assert losses[1] < losses[0] / 2


def test_a_custom_training_loop_with_strategy_run(tf_ranks):
    out = tf_ranks.run("%%distributed\n"
                       "with strategy.scope():\n"
                       "    loop_model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])\n"
                       "    opt = tf.keras.optimizers.SGD(0.05)\n"
                       "dist_ds = strategy.experimental_distribute_dataset(ds)\n"
                       "@tf.function\n"
                       "def train_step(batch):\n"
                       "    def step(xb, yb):\n"
                       "        with tf.GradientTape() as tape:\n"
                       "            per_example = tf.keras.losses.mean_squared_error(yb[:, None], loop_model(xb))\n"
                       "            loss = tf.nn.compute_average_loss(per_example, global_batch_size=64)\n"
                       "        grads = tape.gradient(loss, loop_model.trainable_variables)\n"
                       "        opt.apply_gradients(zip(grads, loop_model.trainable_variables))\n"
                       "        return loss\n"
                       "    return strategy.reduce('SUM', strategy.run(step, args=batch), axis=None)\n"
                       "for i, batch in enumerate(dist_ds):\n"
                       "    jdist.log(step=i, loss=float(train_step(batch)))\n"
                       + WEIGHTS_EQUAL.format(model="loop_model"))
    assert "weights differ by 0.0 over 9 values" in out.stdout, out.stdout + out.shown
    assert tf_ranks.value("jdist.last_run().history.groupby('rank').size().tolist()") == [8, 8]


def test_only_tensorflows_grpc_servers_listen_beyond_loopback(tf_ranks):
    """TF's worker servers bind 0.0.0.0 on their TF_CONFIG port (hard-coded in TF's gRPC server: no
    option binds one address); every other listener of the ranks stays on loopback."""
    out = tf_ranks.run("%%distributed --output all\n"
                       "import json, os, psutil\n"
                       "mine = json.loads(os.environ['TF_CONFIG'])['cluster']['worker'][rank].rsplit(':', 1)\n"
                       "wide = sorted({c.laddr.port for c in psutil.Process().net_connections('inet')\n"
                       "               if c.status == 'LISTEN' and not c.laddr.ip.startswith('127.')})\n"
                       "print(f'rank {rank}: TF_CONFIG {mine[0]}, beyond loopback: {wide == [int(mine[1])]}')")
    assert out.stdout.count("TF_CONFIG 127.0.0.1, beyond loopback: True") == 2, out.stdout + out.shown


def test_torch_calls_and_torch_only_options_are_one_line(tf_ranks):
    out = tf_ranks.run("%%distributed\nimport torch\njdist.prepare(torch.nn.Linear(2, 1))", allow_error=True)
    assert "--framework tf ranks run TensorFlow, not torch" in out.shown, out.shown
    out = tf_ranks.run("%%distributed --precision bf16\nprint(rank)", allow_error=True)
    assert "--precision bf16 is torch's autocast" in out.shown and "Traceback" not in out.shown, out.shown
    out = tf_ranks.run("%%distributed --framework tf --backend ddp --restart\nprint(rank)", allow_error=True)
    assert "--framework selects --backend tf; drop --backend ddp." in out.shown, out.shown
    out = tf_ranks.run("%%distributed --threads 2\nprint(rank)", allow_error=True)
    assert "use %%distributed --threads 2 --restart" in out.shown, out.shown


def test_keras_3s_fit_failing_upstream_is_explained_in_one_line(tf_ranks):
    out = tf_ranks.run("%%distributed\nimport keras  # Keras 3, not tf.keras\n"
                       "with strategy.scope():\n"
                       "    k3 = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])\n"
                       "    k3.compile(optimizer='sgd', loss='mse')\n"
                       "k3.fit(ds, epochs=1, verbose=0)", allow_error=True)
    assert "PerReplica" in out.shown, out.shown  # keras-team/keras#20585
    assert out.shown.count("Keras 3's model.fit does not run under MultiWorkerMirroredStrategy") == 1, out.shown
    assert "instead of `import keras`" in out.shown


def test_a_timed_out_collective_restarts_the_ranks_which_restore_the_checkpoint_every_rank_wrote(
        tf_ranks, kernel_env, tmp_path):
    """A collective that times out (--timeout 5) makes TF's collectives unusable: the ranks restart in the
    same cell, replay the set-up cell and restore the newest checkpoint, which every rank wrote. The
    ended ranks' autograph files are gone (TensorFlow removes them at exit, which ranks skip)."""
    ckdir = tmp_path / "ckpt"
    tf_ranks.run("%%distributed -n 2 --framework tf --timeout 5 --restart\n"  # a set-up cell (it logs nothing)
                 "import numpy as np, sys\n"
                 "xs = np.random.default_rng(1).normal(size=(256, 8)).astype('float32'); ys = xs.sum(axis=1)\n"
                 "ck_ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(32)\n"
                 "with strategy.scope():\n"
                 "    ck_model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4, activation='relu'),\n"
                 "                                    tf.keras.layers.Dense(1)])\n"
                 "    ck_opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)\n"
                 "    ck_model.compile(optimizer=ck_opt, loss='mse')")
    tf_ranks.run(f"%%distributed\n"
                 f"jdist.checkpoint_every(8, {str(ckdir)!r}, model=ck_model, optimizer=ck_opt)\n"
                 "ck_model.fit(ck_ds, epochs=2, verbose=0, callbacks=[jdist.keras.Callback()])\n"
                 f"jdist.save_checkpoint({str(ckdir / 'step-00000016')!r}, model=ck_model, optimizer=ck_opt, step=16)\n"
                 f"np.save({str(tmp_path / 'weights')!r}, np.concatenate([w.numpy().ravel() for w in ck_model.weights]))")
    assert sorted(p.name for p in ckdir.iterdir()) == ["step-00000008", "step-00000016"]  # no rank's copy left
    assert sorted(p.name for p in (ckdir / "step-00000016").iterdir()) == ["jdist.pkl", "tf.data-00000-of-00001", "tf.index"]
    old_ranks_files = autograph_files(work_dir(tf_ranks))
    assert old_ranks_files  # model.fit converted functions, in the cluster's folder
    out = tf_ranks.run("%%distributed\n"
                       "if rank == 0:  # rank 1 never joins: TF's timeout (--timeout) ends the wait\n"
                       "    strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None)",
                       allow_error=True, timeout=120)
    shown = out.shown + out.stdout
    assert "1 of 2 rank(s) failed (rank 0)" in shown and "DeadlineExceededError" in shown, shown
    assert ("Rank 0: the collectives cannot be used again in these processes (DeadlineExceededError: Collective has "
            "timed out" in shown), shown  # "waiting for other workers" or "during execution", by where it waited
    assert "Restarted 2 rank(s)" in shown and "replayed 1 set-up cell(s)" in shown, shown
    assert "step-00000016 (step 16) into ck_model, ck_opt" in shown, shown
    assert not any(path.exists() for path in old_ranks_files)
    assert not autograph_files(kernel_env["TMPDIR"])
    out = tf_ranks.run("%%distributed --output all\n"
                       "w = np.concatenate([w.numpy().ravel() for w in ck_model.weights])\n"
                       f"same = bool((w == np.load({str(tmp_path / 'weights.npy')!r})).all())\n"
                       "total = float(strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None))\n"
                       "print(f'rank {rank}: equal {same}, step {jdist.restored_step()}, sum {total}, '\n"
                       "      f'torch {\"torch\" in sys.modules}')\n"
                       "ck_model.fit(ck_ds, epochs=1, verbose=0)\n"  # the optimizer's momentum comes back when it is made
                       "print('iterations', int(ck_opt.iterations.numpy()))")
    assert out.stdout.count("equal True, step 16, sum 2.0, torch False") == 2, out.stdout + out.shown
    assert "iterations 24" in out.stdout, out.stdout


def test_an_interrupt_while_a_rank_waits_in_a_collective_restarts_the_ranks(tf_ranks):
    """The interrupted collective stays pending in TF: without a restart, rank 1's next reduce paired
    with rank 0's stale one and rank 0's new one timed out (measured), so the ranks restart."""
    msg_id = tf_ranks.start("%%distributed --output all\nimport time\n"
                            "if rank == 0:\n    strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None)\n"
                            "else:\n    print('rank 1 is elsewhere', flush=True)\n    time.sleep(60)")
    tf_ranks.wait_for_stdout(msg_id, "rank 1 is elsewhere")
    tf_ranks.km.interrupt_kernel()
    out = tf_ranks.collect(msg_id, timeout=120)
    shown = out.stdout + out.stderr + str(out.error)
    assert out.error["ename"] == "KeyboardInterrupt", shown
    assert "the collectives cannot be used again in these processes" in shown and "Restarted 2 rank(s)" in shown, shown
    out = tf_ranks.run("%%distributed --output all\n"
                       "print('sum', float(strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None)))")
    assert out.stdout.count("sum 2.0") == 2, out.stdout + out.shown


def test_an_error_while_the_other_rank_waits_in_a_compiled_collective_is_reported_and_the_ranks_restart(
        tf_ranks, kernel_env):
    """Rank 1 raises while rank 0 waits in a tf.function's collective, which no signal releases: the error is
    rank 1's (it was lost when rank 0 did not stop), rank 0 is named with where it is, and the ranks restart in
    the same cell (TF cannot release the collective); the failed cell is no set-up cell for the restart. Rank 0's
    process is killed, so no clean-up of its own runs: the function's autograph file goes with the cluster's folder
    (it stayed in the temporary folder)."""
    folder = work_dir(tf_ranks)
    out = tf_ranks.run("%%distributed --interrupt-grace 1\n"
                       "@tf.function\n"
                       "def total():\n"
                       "    return strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None)\n"
                       "if rank == 1:\n"
                       "    raise ValueError('rank 1 gave up before the collective')\n"
                       "total()", allow_error=True, timeout=120)
    shown = out.shown + out.stdout
    assert "first failure on rank 1: ValueError: rank 1 gave up before the collective" in shown, shown
    assert "rank(s) 0 did not stop within 1 s:" in shown, shown
    assert "Rank 0: the collectives cannot be used again in these processes (still waiting in a collective, which tf " \
           "cannot release)" in shown, shown
    assert "rank 0: released because rank 1 failed (still running: below)." in shown, shown
    # the failed cell is not replayed as a set-up cell (it would fail again, and block rank 0 again)
    assert re.search(r"Restarted 2 rank\(s\) in [\d.]+ s; replayed \d+ set-up cell\(s\); restored", shown), shown
    assert "Run %dist restart" not in shown, shown
    assert not folder.exists() and not autograph_files(kernel_env["TMPDIR"])
    out = tf_ranks.run("%%distributed --output all --interrupt-grace 10\n"
                       "print('sum', float(strategy.reduce('SUM', strategy.run(lambda: tf.constant(1.0)), axis=None)))")
    assert out.stdout.count("sum 2.0") == 2, out.stdout + out.shown
