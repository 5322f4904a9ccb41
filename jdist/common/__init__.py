"""Small helpers both runtimes share (pure, or standard library and psutil only; no torch, no IPython):

- :mod:`~jdist.common.stacks`: reading a rank's Python stack (waiting in a collective? on which cell line?);
- :mod:`~jdist.common.procs`: process identity (PID + start time) and liveness;
- :mod:`~jdist.common.network`: the route's source address and interface (choosing between hosts);
- :mod:`~jdist.common.controller`: engine states from an ipyparallel controller (kernel and server);
- :mod:`~jdist.common.paths`: where the cluster state files are (kernel and server);
- :mod:`~jdist.common.waiting`: ``poll_until``, every wait for a condition;
- :mod:`~jdist.common.meshspec`: ``--mesh NAME=SIZE,...`` read and checked against the world size.
"""
