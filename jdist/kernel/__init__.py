"""What runs in the notebook kernel: the magics, the cluster and its launchers, the cell
supervisor, the drivers built on it, recovery, the record sinks and the notebook dashboard. The ranks
never import this package (a test checks it).

- :mod:`~jdist.kernel.magics`: ``%%distributed`` and ``%dist`` (parse, present);
- :mod:`~jdist.kernel.cluster`: :class:`ClusterSession`, the kernel's cluster;
- :mod:`~jdist.kernel.launch`: :class:`RankLauncher`, what MPI launchers share, the local, ssh and Slurm launchers;
- :mod:`~jdist.kernel.supervise`: one cell: detectors, hooks, outcome, report;
- :mod:`~jdist.kernel.tune`, :mod:`~jdist.kernel.raytrain`: the sweep and Ray Train drivers;
- :mod:`~jdist.kernel.debug`: the debuggers (pdb and the Debugger panel as cell hooks, ``%dist debug``);
- :mod:`~jdist.kernel.attach`: ``%dist attach`` of a ``jdist run --keep``;
- :mod:`~jdist.kernel.sinks`: where records go (memory, run log, dashboard, trackers);
- :mod:`~jdist.kernel.dashboard`: the live widget and its static SVG summary;
- :mod:`~jdist.kernel.recoverylog`, :mod:`~jdist.kernel.recovery`: what a restart brings back, and the restart;
- :mod:`~jdist.kernel.statefile`, :mod:`~jdist.kernel.actions`: the Jupyter server's view into the kernel;
- :mod:`~jdist.kernel.reaper`, :mod:`~jdist.kernel.probes`, :mod:`~jdist.kernel.journal`: the reaper of a
  SIGKILLed kernel's remote ranks, start-time checks, a sweep's Optuna journal.
"""
