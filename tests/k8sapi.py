"""A fake of the Kubernetes API for the tests, over real HTTP: no API server can run on these machines.

It keeps objects by (resource, namespace, name) and serves the paths jdist's client calls (MPIJobs
create/get/delete, pods list with equality label selectors, get, log, secrets get), with the API's
status codes and ``Status`` bodies; the official ``kubernetes`` client talks to it as to a real server.
It also stands in for the MPI Operator (:meth:`FakeKubernetes.operator`) and Kubeflow Trainer with JobSet
(:meth:`FakeKubernetes.trainer`): a created MPIJob or TrainJob gets its pods (named and labelled as
they name them, Pending) and its ssh Secret; the test then moves the pods' states
(:meth:`FakeKubernetes.set_status`). Deleting a job deletes what it owns.

Watches (``?watch=true``) stream the changes after a ``resourceVersion`` (one counter for everything),
one JSON event per line, until ``timeoutSeconds``. Not checked here (a real API server's work):
admission, RBAC (a test forbids paths itself), a watch's expiry (410 Gone), bookmarks.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import re
import subprocess
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

#: The jobs' resources (what the engines act on).
JOBS = ("mpijobs", "trainjobs")
NAMESPACED = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))/namespaces/(?P<ns>[^/]+)/"
                        r"(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


class FakeKubernetes:
    """The fake API (see the module doc); ``url`` once started (a context manager)."""

    def __init__(self, netns_pid: int | None = None) -> None:
        self.netns_pid = netns_pid  # serve inside the network namespace of this process (a node of the bed)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.forbidden: set[str] = set()  # "verb resource" the caller's service account may not do (403)
        self.missing: set[str] = set()  # resources whose kind is not installed (404), e.g. "mpijobs"
        self.requests: list[tuple[str, str]] = []  # (method, path with its query)
        self.on_create: Callable[[dict[str, Any]], None] | None = self.engine
        self.on_delete: Callable[[dict[str, Any]], None] | None = None  # a job deleted (before its pods)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.version = 0  # the last resourceVersion given
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # (version, resource, type, object)
        self.server: ThreadingHTTPServer | None = None

    # -- the test's side ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def api_client(self) -> Any:
        from kubernetes import client

        return client.ApiClient(client.Configuration(host=self.url))

    def kubeconfig(self, path: Any, namespace: str = "default") -> None:
        """A kubeconfig file whose current context is this server (for subprocesses)."""
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        }))

    def requests_of(self, method: str, part: str) -> list[str]:
        """The paths of the requests with ``method`` whose path contains ``part``."""
        return [path for m, path in self.requests if m == method and part in path]

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get((resource, namespace, name))

    def list(self, resource: str, namespace: str) -> list[dict[str, Any]]:
        with self.lock:
            return [o for (r, ns, _), o in self.objects.items() if r == resource and ns == namespace]

    def _changed(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        """Note a change (under the lock): a new resourceVersion, an event for the watches."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.events.append((self.version, resource, kind, json.loads(json.dumps(obj))))
        self.changed.notify_all()

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        with self.lock:
            key = (resource, meta["namespace"], meta["name"])
            kind = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = obj
            self._changed(resource, kind, obj)
        return obj

    def set_status(self, pod: str, namespace: str, **status: Any) -> None:
        """Replace a pod's status (what the kubelet reports)."""
        with self.lock:
            obj = self.objects[("pods", namespace, pod)]
            obj["status"] = status
            self._changed("pods", "MODIFIED", obj)

    def ready(self, pod: str, namespace: str) -> None:
        self.set_status(pod, namespace, phase="Running", conditions=[{"type": "Ready", "status": "True"}])

    def engine(self, job: dict[str, Any]) -> None:
        """What the cluster's engine does for a new job: :meth:`operator` (MPIJob) or :meth:`trainer` (TrainJob)."""
        (self.operator if job["kind"] == "MPIJob" else self.trainer)(job)

    def _ssh_secret(self, job: dict[str, Any], secret: str) -> list[dict[str, Any]]:
        """The job's ssh Secret ``secret``, as its engine makes it (a fake key); the ownerReferences to the job."""
        meta = job["metadata"]
        owner = [{"apiVersion": job["apiVersion"], "kind": job["kind"], "name": meta["name"], "uid": meta["uid"],
                  "controller": True}]
        key = base64.b64encode(f"fake private key of {meta['name']}\n".encode()).decode()
        self.put("secrets", {"metadata": {"name": secret, "namespace": meta["namespace"], "ownerReferences": owner},
                             "type": "kubernetes.io/ssh-auth",
                             "data": {"ssh-privatekey": key, "ssh-publickey": base64.b64encode(b"ssh-ed25519 x").decode()}})
        return owner

    def operator(self, job: dict[str, Any]) -> None:
        """What the MPI Operator does for a new MPIJob: its ssh Secret and its pods, Pending."""
        meta, spec = job["metadata"], job["spec"]
        ns, name = meta["namespace"], meta["name"]
        owner = self._ssh_secret(job, f"{name}-ssh")
        for role, replica in spec["mpiReplicaSpecs"].items():
            for i in range(replica.get("replicas", 1)):
                pod_name = f"{name}-{role.lower()}" + (f"-{i}" if role == "Worker" else "")
                template = json.loads(json.dumps(replica["template"]))
                labels = {**template.get("metadata", {}).get("labels", {}),
                          "training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": role.lower()}
                self.put("pods", {"metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                                               "ownerReferences": owner},
                                  "spec": {**template["spec"], "hostname": pod_name, "subdomain": name},
                                  "status": {"phase": "Pending"}})

    def trainer(self, job: dict[str, Any]) -> None:
        """What Kubeflow Trainer (and JobSet) do for a new TrainJob on jdist's runtime: its ssh Secret, and the
        pods of its ``node`` and ``launcher`` jobs, Pending, labelled as the job's ``runtimePatches`` say."""
        meta, spec = job["metadata"], job["spec"]
        ns, name = meta["namespace"], meta["name"]
        owner = self._ssh_secret(job, f"{name}-mpi-ssh-auth")
        patched = {rj["name"]: rj["template"]["spec"]["template"]
                   for patch in spec.get("runtimePatches", [])
                   for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]}
        for rjob, count in (("node", spec["trainer"]["numNodes"]), ("launcher", 1)):
            for i in range(count):
                hostname = f"{name}-{rjob}-0-{i}"
                labels = {**patched.get(rjob, {}).get("metadata", {}).get("labels", {}),
                          "jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                          "batch.kubernetes.io/job-completion-index": str(i)}
                self.put("pods", {"metadata": {"name": f"{hostname}-x{i}q7z", "namespace": ns, "labels": labels,
                                               "ownerReferences": owner},
                                  "spec": {"hostname": hostname, "subdomain": name,
                                           "containers": [{"name": rjob, "image": spec["trainer"]["image"]}]},
                                  "status": {"phase": "Pending"}})

    # -- the server ----------------------------------------------------------------------------
    def __enter__(self) -> FakeKubernetes:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch streams as the API server sends them

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._serve(self, "GET")

            def do_POST(self) -> None:
                fake._serve(self, "POST")

            def do_DELETE(self) -> None:
                fake._serve(self, "DELETE")

        if self.netns_pid is None:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        else:  # bound in the node's namespace (by a thread that joined it); served from here
            made: list[Any] = []

            def bind() -> None:
                fd = os.open(f"/proc/{self.netns_pid}/ns/net", os.O_RDONLY)
                try:
                    if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)
                made.append(ThreadingHTTPServer(("127.0.0.1", 0), Handler))

            t = threading.Thread(target=bind)
            t.start()
            t.join()
            self.server = made[0]
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-kubernetes").start()
        return self

    def __exit__(self, *exc: Any) -> None:
        server, self.server = self.server, None
        assert server is not None
        with self.lock:
            self.changed.notify_all()  # open watches end
        server.shutdown()
        server.server_close()

    def _reply(self, h: BaseHTTPRequestHandler, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _status(self, h: BaseHTTPRequestHandler, code: int, reason: str, message: str) -> None:
        self._reply(h, code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                              "message": message, "code": code})

    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(h.path)
        self.requests.append((method, h.path))
        m = NAMESPACED.match(url.path)
        if m is None:
            return self._status(h, 404, "NotFound", f"the server could not find the requested resource ({url.path})")
        ns, resource, name, sub = m["ns"], m["resource"], m["name"], m["sub"]
        verb = {"GET": "get" if name else "list", "POST": "create", "DELETE": "delete"}[method]
        if resource in self.missing:
            return self._status(h, 404, "NotFound", "the server could not find the requested resource")
        if f"{verb} {resource}" in self.forbidden:
            return self._status(h, 403, "Forbidden", f'{resource} is forbidden: User "system:serviceaccount:{ns}:default" '
                                                     f'cannot {verb} resource "{resource}" in namespace "{ns}"')
        query = parse_qs(url.query)
        selector = (query.get("labelSelector") or [""])[0]
        if method == "GET" and name is None and (query.get("watch") or [""])[0] in ("true", "1"):
            since = int((query.get("resourceVersion") or ["0"])[0] or 0)
            return self._watch(h, resource, ns, selector, since, float((query.get("timeoutSeconds") or ["30"])[0]))
        with self.lock:
            if method == "POST":
                body = json.loads(h.rfile.read(int(h.headers.get("Content-Length") or 0)))
                body.setdefault("metadata", {}).setdefault("namespace", ns)
                if (resource, ns, body["metadata"]["name"]) in self.objects:
                    return self._status(h, 409, "AlreadyExists", f'{resource} "{body["metadata"]["name"]}" already exists')
                obj = self.put(resource, body)
                if resource in JOBS and self.on_create is not None:
                    self.on_create(obj)
                return self._reply(h, 201, obj)
            if name is None:
                items = [o for o in self.list(resource, ns) if _matches(o["metadata"].get("labels", {}), selector)]
                return self._reply(h, 200, {"kind": "List", "apiVersion": "v1",
                                            "metadata": {"resourceVersion": str(self.version)}, "items": items})
            obj = self.objects.get((resource, ns, name))
            if obj is None:
                return self._status(h, 404, "NotFound", f'{resource} "{name}" not found')
            if method == "DELETE":
                self._delete(resource, ns, name)
                return self._reply(h, 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
            if sub == "log":
                lines = self.logs.get((ns, name), "").splitlines(keepends=True)
                tail = int((query.get("tailLines") or ["0"])[0])
                return self._reply(h, 200, "".join(lines[-tail:] if tail else lines), "text/plain")
            return self._reply(h, 200, obj)

    def _watch(self, h: BaseHTTPRequestHandler, resource: str, ns: str, selector: str, since: int,
               timeout: float) -> None:
        """A watch: the changes after resourceVersion ``since``, one JSON event per line, as they happen,
        until ``timeout`` (the client then watches again from the last version it saw)."""
        import time

        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(data: bytes) -> None:
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        deadline = time.monotonic() + timeout
        sent = since
        try:
            while True:
                with self.lock:
                    while True:
                        batch = [e for e in self.events if e[0] > sent]
                        left = deadline - time.monotonic()
                        if batch or left <= 0 or self.server is None:
                            break
                        self.changed.wait(min(left, 0.5))
                for version, res, kind, obj in batch:
                    sent = version
                    meta = obj["metadata"]
                    if res == resource and meta["namespace"] == ns and _matches(meta.get("labels", {}), selector):
                        chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                if not batch:
                    chunk(b"")  # the last chunk: the watch's window ended
                    return
        except (BrokenPipeError, ConnectionResetError):
            return

    def _delete(self, resource: str, ns: str, name: str) -> None:
        """Delete an object and (garbage collection) what it owns."""
        obj = self.objects[(resource, ns, name)]
        if resource in JOBS and self.on_delete is not None:
            self.on_delete(obj)
        obj = self.objects.pop((resource, ns, name))
        self._changed(resource, "DELETED", obj)
        uid = obj["metadata"]["uid"]
        for key, other in list(self.objects.items()):
            if key in self.objects and any(ref.get("uid") == uid for ref in other["metadata"].get("ownerReferences", [])):
                self._delete(*key)


class PodEmulator:
    """The job's engine (MPI Operator or Trainer) and the kubelet on the two-node bed (tools/testbed.py), for
    end-to-end runs.

    A created job's worker pod ``i`` "runs" on node ``nodes[i % 2]``: its DNS name is added to the
    nodes' ``/etc/hosts``, the job's ssh Secret holds the bed's key (the bed's sshd lets it in, as a
    pod's sshd lets the engine's key in), and the pod is Ready at once. Ending a pod (the job
    deleted, or :meth:`kill_pod`) kills what runs in it: the processes hydra started there over ssh.
    """

    def __init__(self, fake: FakeKubernetes, bed: Any, nodes: tuple[str, ...] = ("node1", "node2")) -> None:
        self.fake, self.bed, self.nodes = fake, bed, nodes
        self.node_of: dict[str, str] = {}  # pod -> node
        self.job_of: dict[str, str] = {}  # pod -> its job
        fake.on_create = self.created
        fake.on_delete = self.deleted

    def created(self, job: dict[str, Any]) -> None:
        from jdist.kernel.launch.k8s.manifests import CLUSTER_LABEL, ROLE_LABEL
        from jdist.kernel.launch.k8s.pods import pod_index

        fake, meta = self.fake, job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        fake.engine(job)
        key = (self.bed.state / "ssh" / "id_ed25519").read_bytes()
        secret = f"{name}-ssh" if job["kind"] == "MPIJob" else f"{name}-mpi-ssh-auth"
        fake.objects[("secrets", ns, secret)]["data"]["ssh-privatekey"] = base64.b64encode(key).decode()
        workers = [p for p in fake.list("pods", ns) if p["metadata"]["labels"].get(CLUSTER_LABEL) == name
                   and p["metadata"]["labels"].get(ROLE_LABEL) == "worker"]
        for i, pod in enumerate(sorted(workers, key=pod_index)):
            pod_name = pod["metadata"]["name"]
            node = self.nodes[i % len(self.nodes)]
            self.node_of[pod_name], self.job_of[pod_name] = node, name
            line = f"{self.bed.nodes[node]} {pod['spec']['hostname']}.{name}.{ns}.svc\n"
            for n in self.bed.nodes:
                with open(self.bed.state / f"hosts-{n}", "a") as f:
                    f.write(line)
            fake.ready(pod_name, ns)

    def deleted(self, job: dict[str, Any]) -> None:
        for pod in [p for p, j in self.job_of.items() if j == job["metadata"]["name"]]:
            self.end_pod(pod)

    def kill_pod(self, pod: str, namespace: str, **status: Any) -> None:
        """The pod ends with ``status`` (as the kubelet reports it), and everything in it dies."""
        self.fake.set_status(pod, namespace, **status)
        self.end_pod(pod)

    def end_pod(self, pod: str) -> None:
        node = self.node_of.pop(pod, None)
        if node is None:
            return
        script = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
                  "grep -qE '^([^ ]*hydra_pmi_proxy|/bin/sh -c .*jdist-rank|[^ ]*python[^ ]* -c .*ipyparallel.engine)' && "
                  "kill -9 ${p#/proc/}; done; true")
        subprocess.run(self.bed.command(node, ["sh", "-c", script]), capture_output=True, timeout=30)
