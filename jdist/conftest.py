"""The package's docstring examples (``pytest jdist``): a module that needs an extra that is not
installed is left out (``jdist.ray.bridge``: Ray, ``pip install 'jdist[ray]'``), and so is
``jdist.rank.integrations.keras``, which has no examples to run and whose import is TensorFlow's
(3 s on 2 cores)."""

import importlib.util

collect_ignore = ["rank/integrations/keras.py"]
if importlib.util.find_spec("ray") is None:
    collect_ignore.append("ray/bridge.py")
