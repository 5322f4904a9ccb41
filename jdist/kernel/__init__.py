"""What runs in the notebook kernel: the magics, the cluster and its launchers, the cell
supervisor, recovery, the record sinks and the notebook dashboard. The ranks never import
this package (a test checks it).

- :mod:`~jdist.kernel.magics`: ``%%distributed`` and ``%dist`` (parse, present);
- :mod:`~jdist.kernel.cluster`: :class:`ClusterSession`, the kernel's cluster;
- :mod:`~jdist.kernel.launch`: :class:`RankLauncher`, what MPI launchers share, the local, ssh and Slurm launchers;
- :mod:`~jdist.kernel.supervise`: one cell: detectors, outcome, report;
- :mod:`~jdist.kernel.sinks`: where records go (memory, run log, dashboard, trackers);
- :mod:`~jdist.kernel.dashboard`: the live widget and its static SVG summary;
- :mod:`~jdist.kernel.recovery`: restart, replay, restore;
- :mod:`~jdist.kernel.statefile`, :mod:`~jdist.kernel.actions`: the Jupyter server's view into the kernel.
"""
