"""The package's docstring examples (``pytest jdist``): a module that needs an extra that is not
installed is left out (``jdist.raybridge``: Ray, ``pip install 'jdist[ray]'``)."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("ray") else ["raybridge.py"]
