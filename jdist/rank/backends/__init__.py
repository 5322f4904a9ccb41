"""Training backends (on the ranks), behind one interface: :class:`Backend`.

The kernel finds them by name through their :class:`jdist.plugins.BackendSpec` (entry point
group ``jdist.backends``); a rank imports the class its spec names (``spec.load()``). A backend
over torch.distributed's default group derives from :class:`TorchBackend` (jdist's own do).
"""

from .base import Backend, CommTimer, Preparation, RankContext
from .torch_group import TorchBackend

__all__ = ["Backend", "CommTimer", "Preparation", "RankContext", "TorchBackend"]
