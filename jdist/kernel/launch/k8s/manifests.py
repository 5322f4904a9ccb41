"""What jdist creates on Kubernetes, built from a :class:`JobSpec` by pure functions (no API calls).

Two engines run the same pods (``JobSpec.runtime``, ``--k8s-runtime``): the MPI Operator's ``MPIJob``
(:func:`mpijob`, the default) and Kubeflow Trainer v2's ``TrainJob`` on a jdist ``ClusterTrainingRuntime``
(:func:`trainjob`, :func:`training_runtime`; see the end of this doc). :func:`job` builds the one asked for.

:func:`mpijob` is a ``kubeflow.org/v2beta1`` ``MPIJob`` of the MPI Operator (``mpiImplementation:
MPICH``, the MPI jdist's ranks use):

* **workers**: ``pods`` pods, each for ``ranks_per_pod`` ranks (``slotsPerWorker``), running sshd
  (the operator's default command, ``/usr/sbin/sshd -De``; ``ssh_port`` other than 22 adds ``-p``),
  with the operator's ssh key mounted at ``sshAuthMountPath``. The kernel starts the ranks in them
  over ssh with MPICH's hydra, as ``--hosts`` does; the operator names them
  ``<job>-worker-<i>.<job>.<namespace>.svc`` (:func:`worker_hosts`). Each gets the GPUs of its ranks
  (``nvidia.com/gpu`` limits), the CPU and memory asked for, and a memory-backed ``/dev/shm`` (MPICH's
  shared memory and torch's DataLoader workers outgrow a container's default 64 MiB).
* **launcher**: one small pod (anywhere: no node selector) running :mod:`jdist.kernel.launch.k8s.heartbeat`: it connects to the
  kernel's heartbeat port every few seconds and exits once the kernel has been unreachable for
  ``heartbeat_grace_s``. The job then has succeeded: the operator deletes every pod
  (``cleanPodPolicy: All``) and, ``ttl_after_finished_s`` later, the job with its Service, Secret and
  ConfigMap. So a kernel killed without ``%dist stop`` leaves nothing running.
* **owner**: when the kernel runs in a pod of the same namespace (a JupyterHub/KubeSpawner notebook),
  the job names that pod as its owner: deleting the notebook deletes the job.

Names follow DNS-1123 labels (:func:`job_name`). The :func:`role` is what the notebook's service
account needs for all this (docs/kubernetes.md).

:func:`trainjob` is a ``trainer.kubeflow.org/v1alpha1`` ``TrainJob`` (Trainer v2.3) on the
``ClusterTrainingRuntime`` an administrator installs once per image (:func:`training_runtime`; jdist
cannot create it: it is cluster-scoped). Trainer makes a JobSet of it: ``numNodes`` pods of the
``node`` job (the workers, sshd as above; the TrainJob's ``trainer`` sets their image, command and
resources) and one of the ``launcher`` job (the heartbeat; its address comes from the TrainJob, as an
environment variable, through a ``runtimePatches`` entry that also places the workers and labels the
pods as jdist's). Trainer's MPI plugin accepts ``OpenMPI`` only; the runtime says so, and that changes
nothing for jdist: the plugin applies it (OpenMPI's variables, the hostfile) to the launcher job's
containers named ``node``, and jdist's is named ``launcher``. The kernel starts the ranks with its own
MPICH over ssh, with the key Trainer mounts in the workers (Secret ``<job>-mpi-ssh-auth``). The workers are
``<job>-node-0-<i>.<job>.<namespace>.svc`` (JobSet's pod hostnames and headless Service). When the
heartbeat ends, the launcher job succeeds, so does the JobSet, and JobSet deletes the workers.

Example:
    >>> spec = JobSpec(name="jdist-c1", namespace="ml", image="registry.example/jdist:1", pods=2,
    ...                ranks_per_pod=4, gpus=True, heartbeat="10.0.3.7:41000")
    >>> job = mpijob(spec)
    >>> job["kind"], job["spec"]["slotsPerWorker"], job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    ('MPIJob', 4, 2)
    >>> job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    {'nvidia.com/gpu': 4}
    >>> worker_hosts(spec)
    ['jdist-c1-worker-0.jdist-c1.ml.svc', 'jdist-c1-worker-1.jdist-c1.ml.svc']
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

#: The API group and version of the MPI Operator's job, and its kind's plural (the REST path).
MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
#: Kubeflow Trainer v2's job and runtime (the same group and version).
TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
#: ``--k8s-runtime``: which engine makes the pods.
RUNTIMES = ("mpijob", "trainjob")
#: The ClusterTrainingRuntime a TrainJob uses unless ``--training-runtime`` names another.
DEFAULT_TRAINING_RUNTIME = "jdist"
#: The TrainJob's environment variables for the heartbeat (``python -m jdist.kernel.launch.k8s.heartbeat``).
HEARTBEAT_ENV, GRACE_ENV = "JDIST_HEARTBEAT", "JDIST_HEARTBEAT_GRACE"
#: Labels on everything jdist creates (``kubectl get mpijobs -l app.kubernetes.io/managed-by=jdist``).
MANAGED_BY = {"app.kubernetes.io/managed-by": "jdist"}
CLUSTER_LABEL = "jdist.dev/cluster"
#: On the pods: ``worker`` (ranks) or ``heartbeat`` (the launcher pod).
ROLE_LABEL = "jdist.dev/role"
#: The container names (the operator uses each pod's first container).
WORKER_CONTAINER, LAUNCHER_CONTAINER = "rank", "heartbeat"
#: The heartbeat pod's resources: a Python process that sleeps between TCP connects.
HEARTBEAT_RESOURCES = {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}}
#: Kubernetes' limits on names: a DNS-1123 label (Services, pod hostnames) is at most 63 characters; the
#: operator's worker pods are named ``<job>-worker-<index>``, JobSet's ``<job>-launcher-0-<index>``.
MAX_JOB_NAME = 63 - len("-launcher-0-") - 5

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^([+]?[0-9.]+)([eE][-+]?[0-9]+|[numkMGTPE]i?|Ki)?$")
_TOLERATION = re.compile(r"^(?P<key>[^=:\s]+)(?:=(?P<value>[^:\s]*))?(?::(?P<effect>[A-Za-z]+))?$")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class Owner:
    """The pod the kernel runs in (an ownerReference makes the job go with it)."""

    name: str
    uid: str
    namespace: str


@dataclass(frozen=True)
class JobSpec:
    """One cluster's job: ``pods`` worker pods of ``ranks_per_pod`` ranks each, from ``image``.

    ``gpus``: each rank has a GPU (``gpu_resource`` limits of ``ranks_per_pod`` per pod); ``cpu`` and
    ``memory``: each worker pod's requests, as Kubernetes quantities ("4", "500m", "16Gi"), also its
    memory limit; ``node_selector`` and ``tolerations`` (:func:`parse_node_selector`,
    :func:`parse_tolerations`) place the workers; ``ssh_user``'s home holds the operator's key
    (``/root/.ssh`` for root); ``heartbeat``: ``host:port`` of the kernel's heartbeat listener;
    ``owner``: the kernel's pod, if any.
    """

    name: str
    namespace: str
    image: str
    pods: int
    ranks_per_pod: int
    heartbeat: str
    gpus: bool = False
    gpu_resource: str = "nvidia.com/gpu"
    cpu: str | None = None
    memory: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, str], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    ssh_user: str = "root"
    ssh_port: int = 22
    python: str = "python3"
    heartbeat_grace_s: int = 60
    ttl_after_finished_s: int = 60
    owner: Owner | None = None
    labels: dict[str, str] = field(default_factory=dict)
    runtime: str = "mpijob"
    training_runtime: str = DEFAULT_TRAINING_RUNTIME

    def __post_init__(self) -> None:
        check_runtime(self.runtime, self.training_runtime)
        check_name(self.name, "the job name")
        check_name(self.namespace, "--namespace")
        if not self.image:
            raise ValueError("--image: give the ranks' container image (jdist, sshd and your libraries; "
                             "docs/kubernetes.md has a Dockerfile).")
        if self.pods < 1 or self.ranks_per_pod < 1:
            raise ValueError(f"{self.pods} pod(s) of {self.ranks_per_pod} rank(s): both must be at least 1.")
        for what, value in (("--pod-cpu", self.cpu), ("--pod-memory", self.memory)):
            if value is not None and not _QUANTITY.match(str(value)):
                raise ValueError(f"{what} {value!r} is not a Kubernetes quantity; e.g. 4, 500m, 16Gi.")
        if not 1 <= self.ssh_port <= 65535:
            raise ValueError(f"--ssh-port {self.ssh_port}: give a TCP port (1-65535).")
        host, _, port = self.heartbeat.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"heartbeat {self.heartbeat!r} is not host:port.")

    @property
    def ssh_dir(self) -> str:
        """Where the operator mounts the job's ssh key: the user's ``~/.ssh``."""
        return "/root/.ssh" if self.ssh_user == "root" else f"/home/{self.ssh_user}/.ssh"


def check_name(name: str, what: str) -> None:
    """ValueError naming the fix unless ``name`` is a DNS-1123 label (what a namespace or job name must be).

    >>> check_name("jdist-a1", "--namespace")
    >>> check_name("My_NS", "--namespace")
    Traceback (most recent call last):
    ...
    ValueError: --namespace 'My_NS' is not a valid Kubernetes name: lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters.
    """
    if len(name) > 63 or not _LABEL.match(name):
        raise ValueError(f"{what} {name!r} is not a valid Kubernetes name: lower-case letters, digits and '-', "
                         "starting and ending with a letter or digit, at most 63 characters.")


def check_runtime(runtime: str, training_runtime: str) -> None:
    """ValueError naming the fix unless ``runtime`` (``--k8s-runtime``) is known and ``training_runtime``
    (``--training-runtime``) a valid name, given only for a TrainJob.

    >>> check_runtime("mpijob", "h100")
    Traceback (most recent call last):
    ...
    ValueError: --training-runtime h100: a TrainJob's runtime; add --k8s-runtime trainjob (or leave --training-runtime out for an MPIJob).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"--k8s-runtime {runtime!r}: use {' or '.join(RUNTIMES)}.")
    check_name(training_runtime, "--training-runtime")
    if runtime != "trainjob" and training_runtime != DEFAULT_TRAINING_RUNTIME:
        raise ValueError(f"--training-runtime {training_runtime}: a TrainJob's runtime; add --k8s-runtime trainjob "
                         "(or leave --training-runtime out for an MPIJob).")


def job_name(cluster_id: str) -> str:
    """The job's name for a jdist cluster id: ``jdist-`` and the id, lower-cased, other characters as
    ``-``, short enough for the operator's worker pod names.

    >>> job_name("20261127-143012-Ab_9f")
    'jdist-20261127-143012-ab-9f'
    """
    text = re.sub(r"[^a-z0-9-]+", "-", f"jdist-{cluster_id}".lower())
    return text[:MAX_JOB_NAME].strip("-")


def parse_node_selector(text: str | None) -> dict[str, str]:
    """``--node-selector`` as a mapping: ``key=value`` pairs separated by commas.

    >>> parse_node_selector("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3, pool=train")
    {'nvidia.com/gpu.product': 'NVIDIA-H100-80GB-HBM3', 'pool': 'train'}
    >>> parse_node_selector("pool")
    Traceback (most recent call last):
    ...
    ValueError: --node-selector: 'pool' is not key=value; e.g. --node-selector pool=train,zone=a.
    """
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--node-selector: {item!r} is not key=value; e.g. --node-selector pool=train,zone=a.")
        out[key.strip()] = value.strip()
    return out


def parse_tolerations(text: str | None) -> tuple[dict[str, str], ...]:
    """``--tolerations`` as pod tolerations, in ``kubectl taint``'s notation: ``key[=value][:Effect]``
    separated by commas (no value: any value of the key; no effect: every effect).

    >>> parse_tolerations("nvidia.com/gpu:NoSchedule,pool=train")
    ({'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}, {'key': 'pool', 'operator': 'Equal', 'value': 'train'})
    >>> parse_tolerations("pool=train:Never")
    Traceback (most recent call last):
    ...
    ValueError: --tolerations: 'pool=train:Never' has effect 'Never'; use NoSchedule, PreferNoSchedule or NoExecute.
    """
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        m = _TOLERATION.match(item)
        if m is None:
            raise ValueError(f"--tolerations: {item!r} is not key[=value][:Effect]; e.g. --tolerations "
                             "nvidia.com/gpu:NoSchedule.")
        effect = m.group("effect")
        if effect is not None and effect not in EFFECTS:
            raise ValueError(f"--tolerations: {item!r} has effect {effect!r}; use {', '.join(EFFECTS[:-1])} or "
                             f"{EFFECTS[-1]}.")
        tol = {"key": m.group("key")}
        if m.group("value") is None:
            tol["operator"] = "Exists"
        else:
            tol.update(operator="Equal", value=m.group("value"))
        if effect:
            tol["effect"] = effect
        out.append(tol)
    return tuple(out)


def worker_hosts(spec: JobSpec) -> list[str]:
    """The workers' DNS names, as the operator or JobSet names them (pod hostname, the job's headless Service)."""
    prefix = f"{spec.name}-worker-" if spec.runtime == "mpijob" else f"{spec.name}-node-0-"
    return [f"{prefix}{i}.{spec.name}.{spec.namespace}.svc" for i in range(spec.pods)]


def ssh_secret(spec: JobSpec) -> str:
    """The Secret with the job's ssh key, as the operator or Trainer names it."""
    return f"{spec.name}-ssh" if spec.runtime == "mpijob" else f"{spec.name}-mpi-ssh-auth"


def job(spec: JobSpec) -> dict[str, Any]:
    """The job for ``spec``: :func:`mpijob` or :func:`trainjob`."""
    return mpijob(spec) if spec.runtime == "mpijob" else trainjob(spec)


def _metadata(spec: JobSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace,
                            "labels": {**MANAGED_BY, CLUSTER_LABEL: spec.name, **spec.labels}}
    if spec.owner is not None and spec.owner.namespace == spec.namespace:  # owners never cross namespaces
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": spec.owner.name,
                                    "uid": spec.owner.uid, "blockOwnerDeletion": False}]
    return meta


def _labels(spec: JobSpec, role: str) -> dict[str, str]:
    return {**MANAGED_BY, CLUSTER_LABEL: spec.name, ROLE_LABEL: role}


def _placement(spec: JobSpec, workers: bool) -> dict[str, Any]:
    """Where a pod may run: the workers where ``--node-selector`` and ``--tolerations`` say (the heartbeat
    pod anywhere); both may pull the image with the pull secrets."""
    out: dict[str, Any] = {}
    if spec.node_selector and workers:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations and workers:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    return out


def _worker_resources(spec: JobSpec) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if spec.cpu is not None:
        requests["cpu"] = str(spec.cpu)
    if spec.memory is not None:
        requests["memory"] = limits["memory"] = str(spec.memory)
    if spec.gpus:
        limits[spec.gpu_resource] = spec.ranks_per_pod
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _sshd(port: int) -> list[str]:
    return ["/usr/sbin/sshd", "-De", "-p", str(port)]


def _shm(spec: JobSpec) -> dict[str, Any]:
    """A memory-backed ``/dev/shm`` as large as the pod's memory limit."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.memory is not None:
        shm["sizeLimit"] = str(spec.memory)
    return {"name": "dshm", "emptyDir": shm}


SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def _worker(spec: JobSpec) -> dict[str, Any]:
    container: dict[str, Any] = {"name": WORKER_CONTAINER, "image": spec.image, "volumeMounts": [dict(SHM_MOUNT)]}
    if spec.ssh_port != 22:  # otherwise the operator's default command: /usr/sbin/sshd -De
        container["command"] = _sshd(spec.ssh_port)
    container["readinessProbe"] = {"tcpSocket": {"port": spec.ssh_port}, "periodSeconds": 2}
    resources = _worker_resources(spec)
    if resources:
        container["resources"] = resources
    pod = {"containers": [container], "volumes": [_shm(spec)], **_placement(spec, True)}
    return {"replicas": spec.pods, "restartPolicy": "Never",
            "template": {"metadata": {"labels": _labels(spec, "worker")},
                         "spec": pod}}


def _launcher(spec: JobSpec) -> dict[str, Any]:
    container = {"name": LAUNCHER_CONTAINER, "image": spec.image,
                 "command": [spec.python, "-m", "jdist.kernel.launch.k8s.heartbeat", spec.heartbeat,
                             "--grace", str(spec.heartbeat_grace_s)],
                 "resources": {k: dict(v) for k, v in HEARTBEAT_RESOURCES.items()}}
    pod = {"containers": [container], **_placement(spec, False)}
    return {"replicas": 1, "restartPolicy": "Never",
            "template": {"metadata": {"labels": _labels(spec, "heartbeat")},
                         "spec": pod}}


def mpijob(spec: JobSpec) -> dict[str, Any]:
    """The ``MPIJob`` for ``spec`` (see the module doc)."""
    return {
        "apiVersion": f"{MPIJOB_GROUP}/{MPIJOB_VERSION}",
        "kind": "MPIJob",
        "metadata": _metadata(spec),
        "spec": {
            "slotsPerWorker": spec.ranks_per_pod,
            "mpiImplementation": "MPICH",
            "sshAuthMountPath": spec.ssh_dir,
            "runPolicy": {"cleanPodPolicy": "All", "ttlSecondsAfterFinished": spec.ttl_after_finished_s,
                          "backoffLimit": 0},
            "mpiReplicaSpecs": {"Launcher": _launcher(spec), "Worker": _worker(spec)},
        },
    }


def trainjob(spec: JobSpec) -> dict[str, Any]:
    """The ``TrainJob`` for ``spec`` on its ``training_runtime`` (see the module doc)."""
    trainer: dict[str, Any] = {"image": spec.image, "command": _sshd(spec.ssh_port), "numNodes": spec.pods,
                               "numProcPerNode": spec.ranks_per_pod}
    resources = _worker_resources(spec)
    if resources:
        trainer["resourcesPerNode"] = resources
    node = {"metadata": {"labels": _labels(spec, "worker")},
            "spec": {"containers": [{"name": "node", "volumeMounts": [dict(SHM_MOUNT)]}], "volumes": [_shm(spec)],
                     **_placement(spec, True)}}
    launcher = {"metadata": {"labels": _labels(spec, "heartbeat")},
                "spec": {"containers": [{"name": "launcher", "env": [
                    {"name": HEARTBEAT_ENV, "value": spec.heartbeat},
                    {"name": GRACE_ENV, "value": str(spec.heartbeat_grace_s)}]}], **_placement(spec, False)}}
    patch = {"manager": "jdist.dev/launcher", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": node}}},
        {"name": "launcher", "template": {"spec": {"template": launcher}}}]}}}}
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": _metadata(spec),
        "spec": {"runtimeRef": {"name": spec.training_runtime, "apiGroup": TRAINER_GROUP,
                                "kind": "ClusterTrainingRuntime"},
                 "trainer": trainer, "runtimePatches": [patch]},
    }


def training_runtime(image: str, name: str = DEFAULT_TRAINING_RUNTIME, ssh_user: str = "root", ssh_port: int = 22,
                     python: str = "python3") -> dict[str, Any]:
    """The ``ClusterTrainingRuntime`` :func:`trainjob` runs on: install it once per image
    (``python -m jdist.kernel.launch.k8s.manifests runtime --image IMAGE | kubectl apply -f -``). The
    workers' image, command and resources come from each TrainJob; the launcher runs the heartbeat from
    ``image`` (a small pod). ``ssh_user`` and ``ssh_port`` must be the ones the notebooks give with
    ``--ssh-user`` and ``--ssh-port`` (the runtime mounts the key and probes sshd there)."""
    check_name(name, "--training-runtime")
    ssh_dir = "/root/.ssh" if ssh_user == "root" else f"/home/{ssh_user}/.ssh"
    node = {"containers": [{"name": "node", "image": image, "command": _sshd(ssh_port),
                            "readinessProbe": {"tcpSocket": {"port": ssh_port}, "periodSeconds": 2}}]}
    launcher = {"containers": [{"name": "launcher", "image": image,
                                "command": [python, "-m", "jdist.kernel.launch.k8s.heartbeat"],
                                "resources": {k: dict(v) for k, v in HEARTBEAT_RESOURCES.items()}}]}
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {**MANAGED_BY, "trainer.kubeflow.org/framework": "mpi"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                                                "sshAuthMountPath": ssh_dir, "runLauncherAsNode": False}},
            "template": {"spec": {
                "network": {"publishNotReadyAddresses": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                "replicatedJobs": [
                    {"name": "launcher", "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", **launcher}}}}},
                    {"name": "node", "template": {
                        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", **node}}}}},
                ]}},
        },
    }


#: What the kernel's service account does, by resource: (API group, resource, verbs).
RBAC_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (MPIJOB_GROUP, MPIJOB_PLURAL, ("create", "get", "list", "watch", "delete")),
    (TRAINER_GROUP, TRAINJOB_PLURAL, ("create", "get", "list", "watch", "delete")),  # --k8s-runtime trainjob
    ("", "pods", ("get", "list", "watch")),  # the workers' phases and conditions; the kernel's own pod (owner)
    ("", "pods/log", ("get",)),  # a failed pod's last lines in the error
    ("", "events", ("list", "watch")),  # why a pod does not start (Unschedulable, image pull)
    ("", "secrets", ("get",)),  # the job's ssh key (<job>-ssh, <job>-mpi-ssh-auth), to start the ranks over ssh
)


def role(namespace: str, name: str = "jdist") -> dict[str, Any]:
    """The ``Role`` a notebook's service account needs in ``namespace`` to run jdist's jobs there."""
    check_name(namespace, "--namespace")
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "rules": [{"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
                  for group, resource, verbs in RBAC_RULES],
    }


def role_binding(namespace: str, service_account: str, name: str = "jdist") -> dict[str, Any]:
    """Binds :func:`role` to ``service_account`` (KubeSpawner's default for notebooks: ``default``)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m jdist.kernel.launch.k8s.manifests runtime --image IMAGE [--name N] ...``: print the
    :func:`training_runtime` (YAML) for ``kubectl apply -f -``, or ``role --namespace NS`` the Role and
    RoleBinding a notebook's service account needs."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m jdist.kernel.launch.k8s.manifests")
    sub = ap.add_subparsers(dest="what", required=True)
    rt = sub.add_parser("runtime", help="the ClusterTrainingRuntime for --k8s-runtime trainjob")
    rt.add_argument("--image", required=True)
    rt.add_argument("--name", default=DEFAULT_TRAINING_RUNTIME)
    rt.add_argument("--ssh-user", default="root")
    rt.add_argument("--ssh-port", type=int, default=22)
    rt.add_argument("--pod-python", default="python3")
    rb = sub.add_parser("role", help="the Role and RoleBinding of a notebook's service account")
    rb.add_argument("--namespace", required=True)
    rb.add_argument("--service-account", default="default")
    args = ap.parse_args(argv)
    try:
        if args.what == "runtime":
            docs = [training_runtime(args.image, args.name, args.ssh_user, args.ssh_port, args.pod_python)]
        else:
            docs = [role(args.namespace), role_binding(args.namespace, args.service_account)]
    except ValueError as exc:
        print(f"jdist: {exc}", file=sys.stderr)
        return 2
    try:
        import yaml  # the kubernetes client's dependency
    except ImportError:  # JSON is YAML too: kubectl apply -f - reads either
        print("\n---\n".join(json.dumps(d, indent=2) for d in docs))
    else:
        print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


__all__ = ["CLUSTER_LABEL", "DEFAULT_TRAINING_RUNTIME", "MPIJOB_GROUP", "MPIJOB_PLURAL", "MPIJOB_VERSION", "ROLE_LABEL",
           "RUNTIMES", "TRAINER_GROUP", "TRAINER_VERSION", "TRAINJOB_PLURAL", "JobSpec", "Owner", "check_name",
           "check_runtime", "job", "job_name", "mpijob", "parse_node_selector", "parse_tolerations", "role",
           "role_binding", "ssh_secret", "training_runtime", "trainjob", "worker_hosts"]

if __name__ == "__main__":
    sys.exit(main())
