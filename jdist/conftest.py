"""The package's docstring examples (``pytest jdist``): a module that needs an extra that is not
installed is left out (``jdist.raybridge``: Ray, ``pip install 'jdist[ray]'``;
``jdist.rank.integrations.keras``: TensorFlow, ``pip install 'jdist[tf]'``)."""

import importlib.util

collect_ignore = [path for path, module in (("raybridge.py", "ray"), ("rank/integrations/keras.py", "tensorflow"))
                  if importlib.util.find_spec(module) is None]
