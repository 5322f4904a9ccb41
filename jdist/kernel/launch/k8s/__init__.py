"""Ranks as pods on Kubernetes, through the MPI Operator's ``MPIJob`` (docs/kubernetes.md).

:mod:`.manifests` turns a :class:`~.manifests.JobSpec` into the objects jdist creates, as a pure
function: the ``MPIJob`` whose worker pods run sshd (the ranks start in them over ssh, as with
``--hosts``) and whose launcher pod ends the job once the kernel is gone; and the RBAC ``Role`` a
notebook's service account needs to do so.
"""
