"""What runs on the ranks (ipyparallel engines under MPI): the rank session and everything that
works on it. The notebook kernel never imports this package (a test checks it); it calls the
functions of :mod:`jdist.rank.rpc` by name (:class:`jdist.protocol.RankCall`).

- :mod:`~jdist.rank.session`: :class:`RankSession`, this rank's runtime in one object;
- :mod:`~jdist.rank.api`: the public rank API (``jdist.prepare``, ``jdist.log``...);
- :mod:`~jdist.rank.training`, :mod:`~jdist.rank.checkpoint`, :mod:`~jdist.rank.data`: training helpers;
- :mod:`~jdist.rank.stream`, :mod:`~jdist.rank.sources`, :mod:`~jdist.rank.channel`: the records to the kernel;
- :mod:`~jdist.rank.guard`: stack dumps and releasing blocked collectives;
- :mod:`~jdist.rank.backends`: ddp, fsdp, horovod, deepspeed, tf (each behind its spec's entry point);
- :mod:`~jdist.rank.rpc`: what the kernel calls.
"""

from .session import RankSession, current, session

__all__ = ["RankSession", "current", "session"]
