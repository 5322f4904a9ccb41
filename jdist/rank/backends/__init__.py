"""Training backends (on the ranks), behind one interface: :class:`Backend`.

The kernel finds them by name through their :class:`jdist.plugins.BackendSpec` (entry point
group ``jdist.backends``); a rank imports the class its spec names (``spec.load()``).
"""

from .base import Backend, CommTimer, RankContext

__all__ = ["Backend", "CommTimer", "RankContext"]
