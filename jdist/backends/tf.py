"""``--framework tf``: TensorFlow's MultiWorkerMirroredStrategy on jdist's ranks
(:class:`jdist.rank.backends.tf.TFBackend`), with its option ``--framework``."""

from __future__ import annotations

from jdist.options import ClusterConfig, Option, Scope
from jdist.plugins import BackendSpec

INSTALL_HINT = (
    "--framework tf needs TensorFlow and tf-keras: pip install 'jdist[tf]' and then "
    "pip install --no-deps tf-keras==2.21.0 (`make test` does both; tf-keras's own requirement would pull "
    "the full tensorflow wheel beside tensorflow-cpu)."
)
FRAMEWORK = Option("framework", ("--framework",), "tf: TensorFlow ranks (MultiWorkerMirroredStrategy as `strategy`, "
                   "tf-keras as tf.keras, no torch imported); leave it out for PyTorch ranks.", Scope.RESTART,
                   choices=("tf",), implies=True)


def check(config: ClusterConfig) -> None:
    """What ``--framework tf`` cannot run, as one line with the fix."""
    if config.gpus:
        raise ValueError("--framework tf runs CPU ranks in this version (its GPU path is untested): use -n "
                         f"{config.n} --framework tf.")
    if config.precision != "fp32":
        raise ValueError(f"--precision {config.precision} is torch's autocast; on --framework tf ranks set a Keras "
                         "policy in a cell instead (tf.keras.mixed_precision.set_global_policy('mixed_bfloat16')) "
                         "and leave --precision at fp32.")


KERAS3_FIT = ("Keras 3's model.fit does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585): "
              "build the model with tf.keras (tf-keras on these ranks) instead of `import keras`, or train it "
              "in a custom loop with strategy.run.")
SPEC = BackendSpec("tf", "jdist.rank.backends.tf:TFBackend", requires=("tensorflow", "tf_keras"),
                   install_hint=INSTALL_HINT, collective_paths=(), options=(FRAMEWORK,), check=check,
                   framework="tf", preimport=(), releases=False,
                   hints=(("with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>)",
                           KERAS3_FIT),),
                   help="TensorFlow MultiWorkerMirroredStrategy (--framework tf): tf-keras model.fit or custom loops")
