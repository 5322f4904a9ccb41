"""``--k8s``: the ranks in pods of an ``MPIJob`` (the MPI Operator) or, with ``--k8s-runtime trainjob``, a
``TrainJob`` (Kubeflow Trainer v2), started over ssh as ``--hosts`` does.

What happens at the start of a cluster (:meth:`KubernetesLauncher.probe`, then the engines):

1. the kernel opens its heartbeat listener (:mod:`.heartbeat`) on the address the pods reach it at;
2. it creates the job (:func:`.manifests.job`): ``-N`` worker pods of ``n / N`` ranks each, running
   sshd from ``--image``, and the heartbeat pod; owned by the kernel's pod when it runs in one;
3. it waits, with a progress line per change, until the workers are ready (``--start-timeout``); a pod
   that cannot run (image pull, unschedulable at the timeout, OOMKilled, evicted...) is one error line
   with its last log lines, and the job is deleted;
4. it reads the job's ssh key (the engine's Secret) into the cluster's private folder, copies the
   controller's connection file to each pod over ssh (the session key never travels in clear), and
   MPICH's hydra starts the engines over ssh (``-launcher-exec``: jdist's ssh configuration).

Then everything works as with ``--hosts`` (deaths from the engines' exit lines, stacks and samples
through the controller), except that a rank that went away without an exit line is explained by its
pod's state (OOMKilled, evicted, node lost). ``%dist stop`` deletes the job; a kernel that dies leaves
it to the reaper (which deletes it) and, failing that, to the heartbeat pod (which ends it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from jdist.common.network import is_loopback, resolve, route_source
from jdist.common.waiting import poll_until
from jdist.errors import ClusterError
from jdist.options import ClusterConfig, Option, Scope

from ..api import RankDeath
from ..mpi import engine_set_launcher, mpiexec_path
from ..remote import IFACE, IP, NODES, PROBE_TIMEOUT_S, RemoteMPILauncher
from . import heartbeat, manifests
from .client import Jobs, in_cluster
from .pods import pod_index, pod_state

K8S = Option("k8s", ("--k8s",), "Run the ranks in pods on Kubernetes, through the MPI Operator (an MPIJob) or "
             "Kubeflow Trainer (--k8s-runtime trainjob): in the cluster the kernel's pod runs in, or in the "
             "kubeconfig's context given (docs/kubernetes.md).",
             Scope.RESTART, type=str, metavar="CONTEXT", const="", implies=True)
NAMESPACE = Option("namespace", ("--namespace",), "With --k8s: the job's namespace (default: the kernel's pod's, or "
                   "the kubeconfig context's).", Scope.RESTART, type=str, metavar="NS")
IMAGE = Option("image", ("--image",), "With --k8s: the ranks' container image, with jdist and your libraries, sshd, "
               "and MPICH at the same Python path as the kernel's or at --pod-python (docs/kubernetes.md).",
               Scope.RESTART, type=str, metavar="IMAGE")
POD_PYTHON = Option("pod_python", ("--pod-python",), "With --k8s: the Python of the image that runs the ranks "
                    "(default: python3 on the image's PATH).", Scope.RESTART, type=str, metavar="PATH",
                    default="python3")
POD_CPU = Option("pod_cpu", ("--pod-cpu",), "With --k8s: each pod's CPU request (a Kubernetes quantity: 8, 500m).",
                 Scope.RESTART, type=str, metavar="CPU")
POD_MEMORY = Option("pod_memory", ("--pod-memory",), "With --k8s: each pod's memory request and limit (16Gi).",
                    Scope.RESTART, type=str, metavar="MEM")
NODE_SELECTOR = Option("node_selector", ("--node-selector",), "With --k8s: the nodes the pods may run on, as "
                       "key=value,... labels.", Scope.RESTART, type=str, metavar="K=V,...")
TOLERATIONS = Option("tolerations", ("--tolerations",), "With --k8s: taints the pods tolerate, as "
                     "key[=value][:Effect],... (nvidia.com/gpu:NoSchedule).", Scope.RESTART, type=str,
                     metavar="TAINTS")
PULL_SECRET = Option("pull_secret", ("--pull-secret",), "With --k8s: the Secret(s) to pull the image with "
                     "(name,...).", Scope.RESTART, type=str, metavar="NAME")
SSH_USER = Option("ssh_user", ("--ssh-user",), "With --k8s: the user sshd lets in (default root; its ~/.ssh gets "
                  "the job's key).", Scope.RESTART, type=str, metavar="USER", default="root")
SSH_PORT = Option("ssh_port", ("--ssh-port",), "With --k8s: the port the pods' sshd listens on (default 22).",
                  Scope.RESTART, type=int, metavar="PORT", default=22)
K8S_RUNTIME = Option("k8s_runtime", ("--k8s-runtime",), "With --k8s: what makes the pods: mpijob (the MPI Operator, "
                     "the default) or trainjob (Kubeflow Trainer v2, on --training-runtime).", Scope.RESTART, type=str,
                     choices=manifests.RUNTIMES, metavar="KIND", default="mpijob")
TRAINING_RUNTIME = Option("training_runtime", ("--training-runtime",), "With --k8s-runtime trainjob: the "
                          "ClusterTrainingRuntime to run on (default jdist; docs/kubernetes.md says how to install it).",
                          Scope.RESTART, type=str, metavar="NAME", default=manifests.DEFAULT_TRAINING_RUNTIME)
#: Seconds to wait for the controller's connection file before copying it to the pods.
CONNECTION_FILE_WAIT_S = 30.0
#: Seconds the heartbeat pod waits, without an answer from the kernel, before it ends the job.
HEARTBEAT_GRACE_S = 60


class KubernetesLauncher(RemoteMPILauncher):
    """``--k8s [CONTEXT]`` (see the module doc)."""

    name = "k8s"
    program = "mpiexec (hydra over ssh, in Kubernetes pods)"
    options = (K8S, NAMESPACE, IMAGE, NODES, POD_PYTHON, POD_CPU, POD_MEMORY, NODE_SELECTOR, TOLERATIONS, PULL_SECRET,
               SSH_USER, SSH_PORT, K8S_RUNTIME, TRAINING_RUNTIME, IP, IFACE)

    @classmethod
    def check(cls, config: ClusterConfig) -> None:
        pods = config.get("nodes") or 1
        if pods < 1 or config.n % pods:
            raise ValueError(f"{config.ranks_flag} on -N {pods} pods: give a rank count that -N divides "
                             f"(e.g. {config.ranks_flag.split()[0]} {pods * max(1, config.n // pods)} -N {pods}).")
        if not config.get("image"):
            raise ValueError("--k8s needs the ranks' image: give --image IMAGE (jdist, sshd and your libraries; "
                             "docs/kubernetes.md has a Dockerfile), or set it in a --cluster profile.")
        if config.get("namespace"):
            manifests.check_name(config.get("namespace"), "--namespace")
        manifests.check_runtime(config.get("k8s_runtime") or "mpijob",
                                config.get("training_runtime") or manifests.DEFAULT_TRAINING_RUNTIME)
        manifests.parse_node_selector(config.get("node_selector"))
        manifests.parse_tolerations(config.get("tolerations"))
        super().check(config)

    def __init__(self, config: ClusterConfig, work_dir: Path, api_client: Any = None):
        super().__init__(config, work_dir)
        self.api_client = api_client  # tests: a client of a mock API server
        self.jobs: Jobs | None = None
        self.spec: manifests.JobSpec | None = None
        self.listener: heartbeat.Listener | None = None
        self.created = False

    # -- starting ---------------------------------------------------------------------------
    def where(self) -> str:
        spec = self.spec
        return (f" in {spec.pods} pod(s) of {self.jobs.kind if self.jobs else 'job'} {spec.name} "
                f"(namespace {spec.namespace})") if spec else " in pods"

    def choose_address(self) -> str:
        """``--ip``/``--iface``; else the address of the route to the API server (in a pod: its own address)."""
        if self.option("ip") or self.option("iface"):
            return super().choose_address()
        assert self.jobs is not None
        host = os.environ.get("KUBERNETES_SERVICE_HOST") if in_cluster() else None
        if not host:
            from urllib.parse import urlparse

            host = urlparse(self.jobs.api.configuration.host).hostname or "127.0.0.1"
        try:
            addr = route_source(resolve(host))
        except OSError as exc:
            raise ClusterError(f"Could not tell which address the pods reach this kernel at ({exc}); give --ip ADDR "
                               "or --iface NAME.") from None
        if is_loopback(addr):
            raise ClusterError(f"This kernel reaches the Kubernetes API over loopback ({host}: kubectl proxy?), so "
                               "that address says nothing of how the pods reach it: give --ip ADDR (or --iface NAME), "
                               "an address of this machine that the pods can connect to.")
        return addr

    def probe(self) -> None:
        if not os.path.exists(Path(mpiexec_path()).with_name("mpiexec.hydra")):
            raise ClusterError(f"No mpiexec.hydra next to {mpiexec_path()}: install MPICH into this environment "
                               f"({sys.executable} -m pip install mpich mpi4py).")
        if shutil.which("ssh") is None:
            raise ClusterError("--k8s starts the ranks in the pods over ssh, and no ssh client is installed here "
                               "(Debian: apt-get install openssh-client).")
        runtime = self.option("k8s_runtime") or "mpijob"
        self.jobs = Jobs(self.option("namespace"), self.option("k8s") or None, api_client=self.api_client,
                         runtime=runtime)
        self._address = self.choose_address()
        self.listener = heartbeat.Listener(self._address)
        pods = self.option("nodes") or 1
        self.spec = manifests.JobSpec(
            name=manifests.job_name(uuid.uuid4().hex[:10]), namespace=self.jobs.namespace, image=self.option("image"),
            pods=pods, ranks_per_pod=self.config.n // pods, heartbeat=self.listener.address, gpus=self.config.gpus,
            cpu=self.option("pod_cpu"), memory=self.option("pod_memory"),
            node_selector=manifests.parse_node_selector(self.option("node_selector")),
            tolerations=manifests.parse_tolerations(self.option("tolerations")),
            image_pull_secrets=tuple(s.strip() for s in (self.option("pull_secret") or "").split(",") if s.strip()),
            ssh_user=self.option("ssh_user"), ssh_port=self.option("ssh_port"), python=self.option("pod_python"),
            heartbeat_grace_s=HEARTBEAT_GRACE_S, owner=self.jobs.own_pod(), runtime=runtime,
            training_runtime=self.option("training_runtime") or manifests.DEFAULT_TRAINING_RUNTIME)
        on = f" on {self.spec.training_runtime}" if runtime == "trainjob" else ""
        self.say(f"Creating {self.jobs.kind} {self.spec.name}{on} in namespace {self.spec.namespace}: {pods} pod(s) "
                 f"of {self.spec.ranks_per_pod} rank(s), image {self.spec.image}...")
        self.jobs.create(manifests.job(self.spec))
        self.created = True
        self.jobs.wait_ready(self.spec.name, pods, self.config.start_timeout, self.say)
        self._write_ssh(self.jobs.ssh_key(manifests.ssh_secret(self.spec)))

    @property
    def ssh_dir(self) -> Path:
        return self.work_dir / "ssh"

    def _write_ssh(self, key: bytes) -> None:
        """The job's key, an ssh configuration for its pods, and the ssh program hydra runs (``-launcher-exec``)."""
        assert self.spec is not None
        d = self.ssh_dir
        d.mkdir(mode=0o700, exist_ok=True)
        (d / "id").touch(mode=0o600)
        (d / "id").write_bytes(key)
        (d / "config").write_text(
            f"Host *\n  User {self.spec.ssh_user}\n  Port {self.spec.ssh_port}\n  IdentityFile {d / 'id'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking accept-new\n"
            f"  BatchMode yes\n  ConnectTimeout {int(PROBE_TIMEOUT_S)}\n  LogLevel ERROR\n")
        program = d / "ssh"
        program.write_text(f"#!/bin/sh\nexec ssh -F {shlex.quote(str(d / 'config'))} \"$@\"\n")
        program.chmod(0o700)

    def hosts(self) -> list[str]:
        assert self.spec is not None
        return manifests.worker_hosts(self.spec)

    def mpi_cmd(self) -> list[str]:
        assert self.spec is not None
        hydra = str(Path(mpiexec_path()).with_name("mpiexec.hydra"))
        spec = ",".join(f"{h}:{self.spec.ranks_per_pod}" for h in self.hosts())
        cmd = [hydra, "-launcher", "ssh", "-launcher-exec", str(self.ssh_dir / "ssh"), "-hosts", spec]
        if self.option("iface"):
            cmd += ["-iface", self.option("iface")]
        return cmd

    def python(self) -> str:
        return self.option("pod_python")

    def engine_launcher_class(self) -> type:
        """ipyparallel's MPI engine launcher, copying the controller's connection file to every pod first
        (the pods share no filesystem with the kernel)."""
        launcher = self

        class PodEngineSetLauncher(engine_set_launcher()):  # type: ignore[misc]
            def start(self, n: int) -> Any:
                launcher.copy_connection_file(Path(self.connection_files["engine"]))
                return super().start(n)

        return PodEngineSetLauncher

    def copy_connection_file(self, path: Path) -> None:
        """Write the controller's engine connection file (0600) at the same path in every pod, over ssh
        (once the controller has written it: it does so a moment after it started)."""
        if not poll_until(path.exists, CONNECTION_FILE_WAIT_S, interval=0.05):
            raise ClusterError(f"The controller wrote no connection file within {CONNECTION_FILE_WAIT_S:g} s ({path}).")
        data = path.read_bytes()
        target = shlex.quote(str(path))
        script = (f"umask 077 && mkdir -p {shlex.quote(str(path.parent))} && cat > {target}.tmp && "
                  f"mv {target}.tmp {target}")

        def copy(host: str) -> str | None:
            try:
                out = subprocess.run([str(self.ssh_dir / "ssh"), host, script], input=data, capture_output=True,
                                     timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return f"{host}: ssh did not finish within {PROBE_TIMEOUT_S:.0f} s"
            if out.returncode:
                said = out.stderr.decode(errors="replace").strip().splitlines()
                return f"{host}: {said[-1] if said else f'exit status {out.returncode}'}"
            return None

        with ThreadPoolExecutor(max_workers=min(16, len(self.hosts()))) as pool:
            problems = [p for p in pool.map(copy, self.hosts()) if p]
        if problems:
            raise ClusterError("Could not reach the pods over ssh to start the ranks: " + "; ".join(problems)
                               + ". Does the image run sshd for --ssh-user on --ssh-port (docs/kubernetes.md)?")

    # -- while the ranks run ----------------------------------------------------------------
    def death(self, dead: Sequence[int], wait: float = 2.0) -> RankDeath:
        """As for ``--hosts``; a rank that left no exit status is explained by its pod's state."""
        out = super().death(dead, wait)
        if out.exit_code is not None or self.jobs is None or self.spec is None:
            return out
        try:
            failed = next(((state, pod_index(p)) for p in self.jobs.workers(self.spec.name)
                           if (state := pod_state(p)).failed), None)
        except ClusterError:
            return out
        if failed is None:
            return out
        state, index = failed
        tail = self.jobs.log_tail(state.name)
        # hydra places ranks in the order of -hosts: pod i holds ranks i*k .. i*k+k-1 (k ranks per pod)
        return RankDeath(index * self.spec.ranks_per_pod, state.failed or out.cause,
                         (tail + "\n" + out.detail).strip()[-2000:], None, crash=out.crash + "\n" + tail)

    def cleanup_commands(self) -> list[list[str]]:
        """What the reaper runs if the kernel dies: delete the job (the heartbeat pod would, a minute later)."""
        if self.spec is None:
            return []
        return [[sys.executable, "-m", "jdist.kernel.launch.k8s.client", "delete", self.spec.namespace, self.spec.name,
                 *([f"--context={self.option('k8s')}"] if self.option("k8s") else []),
                 *(["--runtime", self.spec.runtime] if self.spec.runtime != "mpijob" else [])]]

    def stop(self) -> None:
        """Delete the job (its pods go with it) and close the heartbeat listener."""
        try:
            if self.created and self.jobs is not None and self.spec is not None:
                self.jobs.delete(self.spec.name)
                self.created = False
        finally:
            if self.listener is not None:
                self.listener.close()
                self.listener = None
