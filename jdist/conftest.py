"""The package's docstring examples (``pytest jdist``). Left out: a module that needs an extra that is not
installed (``jdist.ray.bridge``: Ray, ``pip install 'jdist[ray]'``), and modules whose examples are all
``+SKIP`` (they need ranks) and whose import is a large library's: ``jdist.rank.integrations.keras``
(TensorFlow, 3 s on 2 cores), ``lightning``, ``hf`` and ``accelerate`` (together about 4 s of CPU in each
pytest worker). ``jdist/__init__.py`` has no examples; collecting it resolved every lazy name of the
package (pytest looks for fixtures in ``dir(jdist)``), which imported those libraries too."""

import importlib.util

collect_ignore = ["__init__.py", "rank/integrations/keras.py", "rank/integrations/lightning.py",
                  "rank/integrations/hf.py", "rank/integrations/accelerate.py"]
if importlib.util.find_spec("ray") is None:
    collect_ignore.append("ray/bridge.py")
