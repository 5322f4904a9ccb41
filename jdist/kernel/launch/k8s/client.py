"""The calls jdist makes to the Kubernetes API, on the official ``kubernetes`` client (``jdist[k8s]``).

:class:`Jobs` creates a job (:func:`jdist.kernel.launch.k8s.manifests.job`: an MPIJob or a TrainJob), waits
until its worker pods are ready (:meth:`Jobs.wait_ready`: a watch of their changes, one progress line per
change, one error line for a pod that cannot run, with its last log lines), reads the job's ssh key, and
deletes the job. The API's refusals become one line that names the fix: the MPI Operator or Kubeflow
Trainer not installed (404 on the kind), the service account without the rights of
:func:`~.manifests.role` (403).

Configuration: inside a pod (``KUBERNETES_SERVICE_HOST`` and a service-account token), the pod's own
service account and namespace; elsewhere the kubeconfig's ``context`` (None: its current one).
"""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from jdist.errors import ClusterError

from .manifests import (CLUSTER_LABEL, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION, ROLE_LABEL, TRAINER_GROUP,
                        TRAINER_VERSION, TRAINJOB_PLURAL, Owner)
from .pods import PodState, pod_index, pod_state, summary

#: Per ``--k8s-runtime``: the job's API group, version, plural, kind, and the engine that makes its pods.
KINDS = {
    "mpijob": (MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL, "MPIJob", "the MPI Operator"),
    "trainjob": (TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL, "TrainJob", "Kubeflow Trainer"),
}

#: Where a pod finds its service account (in-cluster configuration).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The longest a watch of the pods stays open (then a new one from where it was), and how many log lines a
#: failed pod's error shows.
WATCH_S = 30
LOG_LINES = 20
#: One API call's timeout (seconds): connect, read.
REQUEST_TIMEOUT = (10, 30)


def in_cluster() -> bool:
    """Whether this process runs in a pod with a service account (so the in-cluster configuration applies)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT / "token").exists()


class Jobs:
    """One namespace's jdist jobs (see the module doc). ``api_client``: a configured
    ``kubernetes.client.ApiClient`` (tests point one at a mock API server); None: in-cluster or kubeconfig."""

    def __init__(self, namespace: str | None = None, context: str | None = None, api_client: Any = None,
                 runtime: str = "mpijob") -> None:
        self.group, self.version, self.plural, self.kind, self.engine = KINDS[runtime]
        try:
            from kubernetes import client, config
        except ImportError:
            raise ClusterError("--k8s needs the Kubernetes client in the kernel's environment: "
                               "pip install 'jdist[k8s]'.") from None
        if api_client is None:
            try:
                if context is None and in_cluster():
                    config.load_incluster_config()
                    api_client = client.ApiClient()
                else:
                    api_client = config.new_client_from_config(context=context or None)
            except config.ConfigException as exc:
                raise ClusterError(f"--k8s: no Kubernetes configuration ({exc}); run the kernel in a pod with a "
                                   "service account, or give a kubeconfig (KUBECONFIG, ~/.kube/config).") from None
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace or default_namespace(context)

    # -- errors -----------------------------------------------------------------------------
    def _refused(self, exc: Any, doing: str) -> ClusterError:
        status = getattr(exc, "status", None)
        body = getattr(exc, "body", None) or getattr(exc, "reason", "") or str(exc)
        if status == 403:
            return ClusterError(f"Kubernetes refused to {doing} in namespace {self.namespace} (403 Forbidden): the "
                                "kernel's service account needs the Role in docs/kubernetes.md "
                                "(jdist.kernel.launch.k8s.manifests.role).")
        if status == 404 and self.plural in doing:
            return ClusterError(f"Kubernetes has no {self.kind} kind ({self.group}/{self.version}): --k8s runs the ranks "
                                f"through {self.engine} here, which must be installed in the cluster "
                                "(docs/kubernetes.md; --k8s-runtime chooses between the MPI Operator and Kubeflow "
                                "Trainer).")
        if self.kind == "TrainJob" and "TrainingRuntime" in _message(body):
            return ClusterError(f"Kubernetes could not {doing} in namespace {self.namespace}: {_message(body)}. Install "
                                "jdist's runtime for your image: python -m jdist.kernel.launch.k8s.manifests runtime "
                                "--image IMAGE | kubectl apply -f - (docs/kubernetes.md), or name yours with "
                                "--training-runtime.")
        return ClusterError(f"Kubernetes could not {doing} in namespace {self.namespace}: {status} {_message(body)}")

    def _call(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            raise self._refused(exc, doing) from None
        except OSError as exc:  # urllib3's connection errors are OSErrors
            raise ClusterError(f"The Kubernetes API at {self.api.configuration.host} did not answer "
                               f"({type(exc).__name__}: {exc}) while trying to {doing}.") from None

    # -- the job ----------------------------------------------------------------------------
    def own_pod(self) -> Owner | None:
        """The pod this kernel runs in (in-cluster, in this namespace), for the job's ownerReference."""
        name = os.environ.get("HOSTNAME")
        if not name or not in_cluster():
            return None
        pod = self._call("read this kernel's own pod", self.core.read_namespaced_pod, name, self.namespace)
        return Owner(name=pod.metadata.name, uid=pod.metadata.uid, namespace=self.namespace)

    def create(self, job: dict[str, Any]) -> None:
        """Create ``job`` (of this runtime's kind)."""
        self._call(f"create {self.plural}", self.custom.create_namespaced_custom_object, self.group, self.version,
                   self.namespace, self.plural, job)

    def delete(self, name: str) -> bool:
        """Delete the job ``name`` and, through it, its pods (background propagation); False if it was gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(self.group, self.version, self.namespace, self.plural,
                                                        name, propagation_policy="Background",
                                                        _request_timeout=REQUEST_TIMEOUT)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise self._refused(exc, f"delete {self.plural} {name}") from None

    # -- its pods ---------------------------------------------------------------------------
    def _selector(self, name: str) -> str:
        return f"{CLUSTER_LABEL}={name},{ROLE_LABEL}=worker"

    def _list_workers(self, name: str) -> tuple[list[dict[str, Any]], str]:
        """The job's worker pods as the API says them (JSON field names; the client's models are stricter
        than what a fake or an older server sends), by index, and the list's resourceVersion."""
        import json

        raw = self._call("list pods", self.core.list_namespaced_pod, self.namespace, label_selector=self._selector(name),
                         _preload_content=False)
        body = json.loads(raw.data)
        pods = sorted(body.get("items") or [], key=pod_index)
        return pods, (body.get("metadata") or {}).get("resourceVersion") or ""

    def workers(self, name: str) -> list[dict[str, Any]]:
        """The job's worker pods (JSON field names), by index."""
        return self._list_workers(name)[0]

    def log_tail(self, pod: str, lines: int = LOG_LINES) -> str:
        """The last ``lines`` lines a pod's container printed ("" if none can be read)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod_log(pod, self.namespace, tail_lines=lines,
                                                     _request_timeout=REQUEST_TIMEOUT) or ""
        except (ApiException, OSError):
            return ""

    def failure(self, state: PodState) -> ClusterError:
        """The error for a pod that cannot run: its line, then its last log lines."""
        tail = self.log_tail(state.name).strip()
        return ClusterError(state.failed or f"pod {state.name} failed",
                            *([f"Its last output (kubectl logs -n {self.namespace} {state.name}):", tail] if tail else []))

    def wait_ready(self, name: str, pods: int, timeout: float,
                   say: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
        """Wait until the ``pods`` worker pods of job ``name`` are ready (a list, then a watch of their
        changes); they are returned, by index. A pod that cannot run raises its :meth:`failure` at once; at
        ``timeout`` the error says what they still wait for. ``say``: a progress line per change."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        t0 = time.monotonic()
        said = [""]

        def ordered(found: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
            return sorted(found.values(), key=pod_index)

        def done(found: dict[str, dict[str, Any]]) -> bool:
            states = [pod_state(p) for p in ordered(found)]
            failed = next((s for s in states if s.failed), None)
            if failed is not None:
                raise self.failure(failed)
            if len(states) >= pods and all(s.ready for s in states):
                return True
            line = f"  {summary(states, pods) if states else f'waiting for {self.engine} to create the pods'}"
            if line != said[0]:
                say(f"{line} ({time.monotonic() - t0:.0f} s)")
                said[0] = line
            if time.monotonic() - t0 >= timeout:
                raise ClusterError(f"The job's pods were not ready within {timeout:g} s:{line}.",
                                   "Give them longer with --start-timeout S (a large image's first pull takes "
                                   f"minutes), or see kubectl describe pods -n {self.namespace} -l {CLUSTER_LABEL}={name}.")
            return False

        while True:  # a list, then its changes; again from a list when the watch expired (410 Gone)
            listed, version = self._list_workers(name)
            found = {p["metadata"]["name"]: p for p in listed}
            if done(found):
                return ordered(found)
            w = watch.Watch(return_type="object")  # events as dicts, as listed
            try:
                while True:
                    left = timeout - (time.monotonic() - t0)
                    window = max(1, int(min(left, WATCH_S)))
                    for event in w.stream(self.core.list_namespaced_pod, self.namespace,
                                          label_selector=self._selector(name), resource_version=version,
                                          timeout_seconds=window, _request_timeout=(REQUEST_TIMEOUT[0], window + 10)):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise _Expired()
                        version = obj["metadata"].get("resourceVersion") or version
                        if event["type"] == "DELETED":
                            found.pop(obj["metadata"]["name"], None)
                        else:
                            found[obj["metadata"]["name"]] = obj
                        if done(found):
                            return ordered(found)
                    if done(found):  # the window ended: the timeout is checked
                        return ordered(found)
            except _Expired:
                continue
            except ApiException as exc:
                if exc.status == 410:
                    continue
                raise self._refused(exc, "watch pods") from None
            except OSError as exc:
                raise ClusterError(f"The Kubernetes API at {self.api.configuration.host} did not answer "
                                   f"({type(exc).__name__}: {exc}) while watching the job's pods.") from None
            finally:
                w.stop()

    def ssh_key(self, secret_name: str) -> bytes:
        """The private key the engine made for a job, from its Secret (:func:`~.manifests.ssh_secret`)."""
        secret = self._call(f"read secrets {secret_name}", self.core.read_namespaced_secret, secret_name, self.namespace)
        data = secret.data or {}
        if "ssh-privatekey" not in data:
            raise ClusterError(f"Secret {secret_name} has no ssh-privatekey: is {self.engine} running?")
        return base64.b64decode(data["ssh-privatekey"])


class _Expired(Exception):
    """The watch's resourceVersion expired (an ERROR event): list again."""


def default_namespace(context: str | None = None) -> str:
    """The namespace to use without ``--namespace``: the pod's own (in-cluster), else the kubeconfig
    context's, else ``default``."""
    if context is None and in_cluster():
        try:
            return (SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
        except OSError:
            return "default"
    try:
        from kubernetes import config

        contexts, current = config.list_kube_config_contexts()
        chosen = next((c for c in contexts if c["name"] == context), None) if context else current
        return ((chosen or {}).get("context") or {}).get("namespace") or "default"
    except Exception:  # no kubeconfig: the client's own error comes when it is used
        return "default"


def _message(body: Any) -> str:
    """The ``message`` of an API error's Status body (JSON), else the body as it is, on one line."""
    import json

    try:
        return str(json.loads(body).get("message") or body).replace("\n", " ")
    except (TypeError, ValueError, AttributeError):
        return str(body).replace("\n", " ")[:300]


def main(argv: list[str] | None = None) -> int:
    """``python -m jdist.kernel.launch.k8s.client delete NAMESPACE JOB [--context C] [--runtime trainjob]``: what
    the reaper runs when the kernel died (:meth:`jdist.kernel.launch.k8s.launcher.KubernetesLauncher.cleanup_commands`)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m jdist.kernel.launch.k8s.client")
    ap.add_argument("action", choices=["delete"])
    ap.add_argument("namespace")
    ap.add_argument("job")
    ap.add_argument("--context", default=None)
    ap.add_argument("--runtime", choices=sorted(KINDS), default="mpijob")
    args = ap.parse_args(argv)
    try:
        gone = not Jobs(args.namespace, args.context, runtime=args.runtime).delete(args.job)
    except ClusterError as exc:
        print(f"jdist: {exc}", file=sys.stderr)
        return 1
    print(f"jdist: job {args.job} in namespace {args.namespace} {'was already gone' if gone else 'deleted'}.")
    return 0


__all__ = ["Jobs", "default_namespace", "in_cluster", "main"]

if __name__ == "__main__":
    sys.exit(main())
