"""Model parallelism on the ranks: device meshes and the process groups of their dimensions.

- :mod:`~jdist.rank.mesh.dims`: which process group is which mesh dimension (every mesh the code builds);
- :mod:`~jdist.rank.mesh.api`: ``--mesh`` as ``mesh`` in every cell;
- :mod:`~jdist.rank.mesh.timing`: DTensor's functional collectives (tensor and sequence parallel) timed per
  dimension;
- :mod:`~jdist.rank.mesh.pipeline`: pipelining's schedules timed on each stage (records, timeline);
- :mod:`~jdist.rank.mesh.sharding`: ``jdist.sharding(model)``, the parameters' layout over the mesh;
- :mod:`~jdist.rank.mesh.groups`: the groups beyond the default one, made again under their names after a
  release, and every reference to the old objects replaced (the fault promise on 2-D and 3-D meshes).
"""
