"""jdist's own backends as the kernel sees them: one :class:`~jdist.plugins.BackendSpec` per module (its options,
checks, requirements, install hint and capabilities), registered by entry points (``jdist.backends`` in
pyproject.toml) as any other package's backend is. Nothing here imports torch: each spec's ``factory``
names the implementation the ranks load, in :mod:`jdist.rank.backends`.

- :mod:`~jdist.backends.ddp`, :mod:`~jdist.backends.fsdp`, :mod:`~jdist.backends.horovod`,
  :mod:`~jdist.backends.deepspeed`, :mod:`~jdist.backends.tf`.
"""
