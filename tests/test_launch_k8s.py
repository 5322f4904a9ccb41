"""The Kubernetes launcher's pure parts (jdist.kernel.launch.k8s): the manifests against golden files and
against the schemas the API server would apply, and the heartbeat that ends a job whose kernel is gone.

No Kubernetes API server can run on these machines, so nothing here talks to one: the ``MPIJob`` is
checked against the MPI Operator's own CRD schema, the ``TrainJob`` and the ``ClusterTrainingRuntime``
against Kubeflow Trainer's (tests/data/k8s, sources in its README), made strict (an unknown field
fails, where the API server would silently drop it), their pod templates and the RBAC objects against
Kubernetes' published schemas (``kubernetes-validate``, strict). The launcher's tests run against a
fake API over HTTP (tests/k8sapi.py), which also plays the MPI Operator and Trainer.

Golden files: ``JDIST_UPDATE_GOLDEN=1 pytest tests/test_launch_k8s.py`` rewrites them; review the diff.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from jdist.kernel.launch.k8s import heartbeat
from jdist.kernel.launch.k8s.manifests import (
    JobSpec,
    Owner,
    job_name,
    mpijob,
    parse_node_selector,
    parse_tolerations,
    role,
    role_binding,
    ssh_secret,
    training_runtime,
    trainjob,
    worker_hosts,
)
from jdist.kernel.launch.k8s.pods import pod_index

DATA = Path(__file__).parent / "data" / "k8s"
K8S_VERSION = kubernetes_validate.latest_version()


def strict(schema: dict) -> dict:
    """The CRD's structural schema with ``additionalProperties: false`` wherever it lists properties and
    allows nothing else (the API server prunes unknown fields; here they fail)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schema(name: str) -> dict:
    return strict(json.loads(gzip.decompress((DATA / name).read_bytes())))


MPIJOB_SCHEMA = crd_schema("mpijob-v2beta1.schema.json.gz")
TRAINJOB_SCHEMA = crd_schema("trainjob-v1alpha1.schema.json.gz")
RUNTIME_SCHEMA = crd_schema("clustertrainingruntime-v1alpha1.schema.json.gz")


def check_pod_template(template: dict) -> None:
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                  "template": template}, K8S_VERSION, strict=True)


def check_trainjob(job: dict) -> None:
    """A TrainJob as the API server would check it: Trainer's CRD schema, and each patch's pod template."""
    jsonschema.validate(job, TRAINJOB_SCHEMA)
    for patch in job["spec"]["runtimePatches"]:
        for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            check_pod_template(rjob["template"]["spec"]["template"])


def check_runtime(runtime: dict) -> None:
    """A ClusterTrainingRuntime: Trainer's CRD schema, and each of its JobSet's jobs as a batch/v1 Job."""
    jsonschema.validate(runtime, RUNTIME_SCHEMA)
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"},
                                      "spec": rjob["template"]["spec"]}, K8S_VERSION, strict=True)


def check_mpijob(job: dict) -> None:
    """The job as the API server would check it: the operator's CRD schema, and each pod template."""
    jsonschema.validate(job, MPIJOB_SCHEMA)
    for replica in job["spec"]["mpiReplicaSpecs"].values():
        check_pod_template(replica["template"])


def golden(name: str, objects: list[dict]) -> None:
    text = yaml.safe_dump_all(objects, sort_keys=False)
    path = DATA / name
    if os.environ.get("JDIST_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with JDIST_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{name} differs from the manifests built now (JDIST_UPDATE_GOLDEN=1 rewrites it)"


GPU = JobSpec(name="jdist-c1", namespace="ml", image="registry.example/jdist:1", pods=2, ranks_per_pod=4, gpus=True,
              heartbeat="10.0.3.7:41000", cpu="16", memory="64Gi",
              node_selector=parse_node_selector("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"),
              tolerations=parse_tolerations("nvidia.com/gpu:NoSchedule"), image_pull_secrets=("regcred",),
              owner=Owner(name="jupyter-ada", uid="5f1c2a9e-0000-4000-8000-000000000001", namespace="ml"))
CPU = JobSpec(name="jdist-c2", namespace="team-a", image="jdist-cpu:latest", pods=2, ranks_per_pod=1,
              heartbeat="10.0.3.7:41001", ssh_user="mpiuser", ssh_port=2222, python="/opt/venv/bin/python")


def test_a_gpu_job_is_its_golden_file_and_valid():
    job = mpijob(GPU)
    check_mpijob(job)
    golden("mpijob-gpu.yaml", [job])
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"] == {"requests": {"cpu": "16", "memory": "64Gi"},
                                                    "limits": {"memory": "64Gi", "nvidia.com/gpu": 4}}
    assert job["metadata"]["ownerReferences"][0]["name"] == "jupyter-ada"


def test_a_cpu_job_with_its_own_ssh_user_and_port_is_its_golden_file_and_valid():
    job = mpijob(CPU)
    check_mpijob(job)
    golden("mpijob-cpu.yaml", [job])
    assert job["spec"]["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["/usr/sbin/sshd", "-De", "-p", "2222"]
    assert "resources" not in worker and "ownerReferences" not in job["metadata"]
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][:3] == ["/opt/venv/bin/python", "-m", "jdist.kernel.launch.k8s.heartbeat"]


def test_a_trainjob_and_its_runtime_are_their_golden_files_and_valid():
    spec = dataclasses.replace(GPU, runtime="trainjob")
    job, runtime = trainjob(spec), training_runtime("registry.example/jdist:1", ssh_user="mpiuser", ssh_port=2222,
                                                    python="/opt/venv/bin/python")
    check_trainjob(job)
    check_runtime(runtime)
    golden("trainjob-gpu.yaml", [job])
    golden("training-runtime.yaml", [runtime])
    assert job["spec"]["trainer"]["resourcesPerNode"] == {"requests": {"cpu": "16", "memory": "64Gi"},
                                                          "limits": {"memory": "64Gi", "nvidia.com/gpu": 4}}
    assert job["spec"]["trainer"]["numNodes"] == 2 and job["spec"]["trainer"]["numProcPerNode"] == 4
    assert job["metadata"]["ownerReferences"][0]["name"] == "jupyter-ada"
    # JobSet's pod hostnames under its headless Service; Trainer's Secret
    assert worker_hosts(spec) == ["jdist-c1-node-0-0.jdist-c1.ml.svc", "jdist-c1-node-0-1.jdist-c1.ml.svc"]
    assert ssh_secret(spec) == "jdist-c1-mpi-ssh-auth" and ssh_secret(GPU) == "jdist-c1-ssh"
    assert runtime["spec"]["mlPolicy"]["mpi"]["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    # what an administrator installs, printed by jdist as kubectl reads it
    out = subprocess.run([sys.executable, "-m", "jdist.kernel.launch.k8s.manifests", "runtime", "--image",
                          "registry.example/jdist:1", "--ssh-user", "mpiuser", "--ssh-port", "2222", "--pod-python",
                          "/opt/venv/bin/python"], capture_output=True, text=True, timeout=60, check=True)
    assert list(yaml.safe_load_all(out.stdout)) == [runtime]


def test_the_rbac_objects_are_their_golden_file_and_valid():
    objects = [role("ml"), role_binding("ml", "default")]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    golden("rbac.yaml", objects)


def test_the_strict_checks_catch_a_misspelt_field():
    """The checks can fail: a field the schema does not have (the API server would drop it silently)."""
    job = mpijob(CPU)
    job["spec"]["slotsPerWorkers"] = 2
    with pytest.raises(jsonschema.ValidationError, match="slotsPerWorkers"):
        check_mpijob(job)
    job = mpijob(CPU)
    template = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    template["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(jsonschema.ValidationError, match="readinesProbe"):
        check_mpijob(job)
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": template}, K8S_VERSION, strict=True)


def test_an_owner_in_another_namespace_is_left_out():
    spec = JobSpec(name="jdist-c3", namespace="ml", image="i", pods=1, ranks_per_pod=1, heartbeat="h:1",
                   owner=Owner(name="jupyter-ada", uid="u", namespace="hub"))
    assert "ownerReferences" not in mpijob(spec)["metadata"]


@pytest.mark.parametrize("changes, message", [
    ({"namespace": "ML"}, "--namespace 'ML' is not a valid Kubernetes name"),
    ({"image": ""}, "--image: give the ranks' container image"),
    ({"pods": 0}, "both must be at least 1"),
    ({"cpu": "four"}, "--pod-cpu 'four' is not a Kubernetes quantity"),
    ({"memory": "16GB"}, "--pod-memory '16GB' is not a Kubernetes quantity"),
    ({"ssh_port": 70000}, "--ssh-port 70000"),
    ({"runtime": "jobset"}, "--k8s-runtime 'jobset': use mpijob or trainjob"),
    ({"training_runtime": "h100"}, "--training-runtime h100: a TrainJob's runtime; add --k8s-runtime trainjob"),
])
def test_bad_settings_get_one_line_with_the_fix(changes, message):
    values = dict(name="jdist-c4", namespace="ml", image="i", pods=1, ranks_per_pod=1, heartbeat="h:1") | changes
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        JobSpec(**values)
    assert "\n" not in str(info.value)


def test_names_fit_the_operators_pods_and_dns():
    name = job_name("x" * 80)
    hosts = worker_hosts(JobSpec(name=name, namespace="ml", image="i", pods=12, ranks_per_pod=1, heartbeat="h:1"))
    assert all(len(h.split(".")[0]) <= 63 for h in hosts), hosts[-1]


def test_the_heartbeat_program_ends_the_job_once_the_kernel_is_gone():
    """The launcher pod's command, as a process: it keeps running while the listener answers and exits 0
    within the grace once it is closed (the kernel's process ended)."""
    listener = heartbeat.Listener("127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "jdist.kernel.launch.k8s.heartbeat", listener.address,
                             "--grace", "1", "--interval", "0.1"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # longer than the grace: the connections succeed
        assert proc.poll() is None
        closed = time.monotonic()
        listener.close()
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0
        assert time.monotonic() - closed < 5
        assert f"the kernel at {listener.address} has not answered for 1 s; ending the job." in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def pod(phase="Pending", conditions=(), containers=(), **status):
    return {"metadata": {"name": "jdist-c1-worker-0"},
            "status": {"phase": phase, "conditions": list(conditions), "containerStatuses": list(containers), **status}}


def waiting(reason, message=""):
    return {"name": "rank", "state": {"waiting": {"reason": reason, "message": message}}}


def terminated(reason, code, message=""):
    return {"name": "rank", "state": {"terminated": {"reason": reason, "exitCode": code, "message": message}}}


READY = {"type": "Ready", "status": "True"}
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}


@pytest.mark.parametrize("state, ready, waits, fails", [
    (pod(), False, "starting", None),
    (pod(conditions=[UNSCHEDULABLE]), False,
     "not scheduled: Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu.", None),
    (pod(containers=[waiting("ContainerCreating")]), False, "ContainerCreating", None),
    (pod("Running", [READY]), True, None, None),
    (pod("Running", [{"type": "Ready", "status": "False"}]), False, "sshd not ready yet", None),
    (pod(containers=[waiting("ErrImagePull", 'failed to pull "jdist:2": not found')]), False, None,
     'pod jdist-c1-worker-0 cannot pull its image: ErrImagePull: failed to pull "jdist:2": not found'),
    (pod(containers=[waiting("CreateContainerConfigError", 'secret "x" not found')]), False, None,
     'pod jdist-c1-worker-0 cannot start its container: CreateContainerConfigError: secret "x" not found'),
    (pod("Failed", containers=[terminated("OOMKilled", 137)]), False, None,
     "pod jdist-c1-worker-0 ended: container rank was OOMKilled (over its memory limit; give the pods more with "
     "--pod-memory)"),
    (pod("Failed", containers=[terminated("Error", 255)]), False, None,
     "pod jdist-c1-worker-0 ended: container rank exited with code 255 (Error)"),
    (pod("Failed", reason="Evicted", message="The node was low on resource: memory."), False, None,
     "pod jdist-c1-worker-0 was evicted: The node was low on resource: memory."),
    (pod("Running", [READY, {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
     False, None, "pod jdist-c1-worker-0 is being ended by the cluster: preempted by a pod of higher priority"),
    (pod("Unknown"), False, None,
     "pod jdist-c1-worker-0: its node stopped reporting (node lost or unreachable)"),
])
def test_a_pods_state_is_one_line(state, ready, waits, fails):
    from jdist.kernel.launch.k8s.pods import pod_state

    s = pod_state(state)
    assert (s.ready, s.waiting, s.failed) == (ready, waits, fails)


# -- the launcher against a fake API server (tests/k8sapi.py: no Kubernetes API server can run here) -------

from k8sapi import FakeKubernetes  # noqa: E402

from jdist.errors import ClusterError  # noqa: E402
from jdist.kernel.launch.k8s import client as k8s_client  # noqa: E402
from jdist.kernel.launch.k8s.launcher import KubernetesLauncher  # noqa: E402
from jdist.plugins import option_table  # noqa: E402


@pytest.fixture
def fake():
    with FakeKubernetes() as api:
        yield api


def launcher(fake, tmp_path, **options) -> tuple[KubernetesLauncher, list[str]]:
    values = dict(n=4, launcher="k8s", k8s="", image="registry.example/jdist:1", namespace="ml", nodes=2,
                  start_timeout=20.0, ip="127.0.0.1") | options
    config = option_table().config(values)
    option_table().check(config)
    out = KubernetesLauncher(config, tmp_path, api_client=fake.api_client())
    lines: list[str] = []
    out.say = lines.append
    return out, lines


def as_sent(job: dict) -> dict:
    """A job read back from the fake API without the fields the server adds (uid, creation time, status)."""
    meta = {k: v for k, v in job["metadata"].items() if k not in ("uid", "creationTimestamp")}
    return {k: v for k, v in job.items() if k != "status"} | {"metadata": meta}


def pods_become(fake, job_of, after, change):
    """In a thread: once the job exists, wait ``after`` s, then ``change(fake, ns, pod)`` each worker pod."""
    import threading

    def run():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            jobs = fake.list("mpijobs", "ml") + fake.list("trainjobs", "ml")
            if jobs:
                time.sleep(after)
                for p in sorted(fake.list("pods", "ml"), key=pod_index):
                    if p["metadata"].get("labels", {}).get("jdist.dev/role") == "worker":
                        change(fake, "ml", p["metadata"]["name"])
                job_of.append(jobs[0])
                return
            time.sleep(0.02)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_the_launcher_creates_the_job_waits_for_its_pods_and_deletes_it_on_stop(fake, tmp_path):
    k8s, lines = launcher(fake, tmp_path)
    created = []
    t = pods_become(fake, created, 0.5, lambda f, ns, name: f.ready(name, ns))
    try:
        k8s.probe()
        t.join()
        job = fake.get("mpijobs", "ml", k8s.spec.name)
        check_mpijob(as_sent(job))
        assert job["spec"]["slotsPerWorker"] == 2 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
        assert lines[0].startswith(f"Creating MPIJob {k8s.spec.name} in namespace ml: 2 pod(s) of 2 rank(s)")
        assert any("0/2 pods ready; " in line and "starting" in line for line in lines), lines
        # one list of the pods, then a watch of their changes (no polling)
        pod_calls = [path for method, path in fake.requests if method == "GET" and "/pods?" in path]
        assert len(pod_calls) == 2 and "watch=true" in pod_calls[1] and "resourceVersion=" in pod_calls[1], pod_calls
        # hydra starts the ranks over ssh with the job's key, in the pods the operator named
        assert k8s.mpi_cmd()[-1] == (f"{k8s.spec.name}-worker-0.{k8s.spec.name}.ml.svc:2,"
                                     f"{k8s.spec.name}-worker-1.{k8s.spec.name}.ml.svc:2")
        key = tmp_path / "ssh" / "id"
        assert key.read_bytes() == f"fake private key of {k8s.spec.name}\n".encode()
        assert oct(key.stat().st_mode & 0o777) == "0o600" and oct((tmp_path / "ssh").stat().st_mode & 0o777) == "0o700"
        # the heartbeat pod's command names the kernel's listener, which answers while the cluster runs
        command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
        assert command[3] == k8s.listener.address and heartbeat.reachable(command[3], 2.0)
    finally:
        address = k8s.listener.address if k8s.listener else None
        k8s.stop()
    assert fake.list("mpijobs", "ml") == [] and fake.list("pods", "ml") == [] and fake.list("secrets", "ml") == []
    assert address is not None and not heartbeat.reachable(address, 1.0)


def test_on_trainjob_the_launcher_creates_it_waits_for_its_jobset_pods_and_deletes_it_on_stop(fake, tmp_path):
    k8s, lines = launcher(fake, tmp_path, k8s_runtime="trainjob", training_runtime="jdist-h100")
    t = pods_become(fake, [], 0.3, lambda f, ns, name: f.ready(name, ns))
    try:
        k8s.probe()
        t.join()
        job = fake.get("trainjobs", "ml", k8s.spec.name)
        check_trainjob(as_sent(job))
        assert job["spec"]["runtimeRef"]["name"] == "jdist-h100"
        assert lines[0].startswith(f"Creating TrainJob {k8s.spec.name} on jdist-h100 in namespace ml: 2 pod(s) of "
                                   "2 rank(s)")
        assert k8s.where() == f" in 2 pod(s) of TrainJob {k8s.spec.name} (namespace ml)"
        # hydra reaches JobSet's pods by their hostnames, with the key of Trainer's Secret
        assert k8s.mpi_cmd()[-1] == (f"{k8s.spec.name}-node-0-0.{k8s.spec.name}.ml.svc:2,"
                                     f"{k8s.spec.name}-node-0-1.{k8s.spec.name}.ml.svc:2")
        assert (tmp_path / "ssh" / "id").read_bytes() == f"fake private key of {k8s.spec.name}\n".encode()
        # the heartbeat's address reaches the launcher job's container as an environment variable
        [patch] = job["spec"]["runtimePatches"]
        launcher_pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]
        env = {e["name"]: e["value"] for e in launcher_pod["template"]["spec"]["containers"][0]["env"]}
        assert env["JDIST_HEARTBEAT"] == k8s.listener.address and heartbeat.reachable(env["JDIST_HEARTBEAT"], 2.0)
        assert k8s.cleanup_commands()[0][-2:] == ["--runtime", "trainjob"]
    finally:
        k8s.stop()
    assert fake.list("trainjobs", "ml") == [] and fake.list("pods", "ml") == [] and fake.list("secrets", "ml") == []


def test_a_pod_that_cannot_pull_its_image_is_one_error_with_its_output(fake, tmp_path):
    k8s, lines = launcher(fake, tmp_path, image="registry.example/jdist:nope")

    def cannot_pull(f, ns, name):
        f.logs[(ns, name)] = "first line\nlast line\n"
        f.set_status(name, ns, phase="Pending", containerStatuses=[{
            "name": "rank", "image": "registry.example/jdist:nope", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/jdist:nope"'}}}])

    pods_become(fake, [], 0.2, cannot_pull)
    try:
        with pytest.raises(ClusterError) as err:
            k8s.probe()
    finally:
        k8s.stop()
    assert err.value.lines[0] == (f'pod {k8s.spec.name}-worker-0 cannot pull its image: ImagePullBackOff: Back-off '
                                  'pulling image "registry.example/jdist:nope"')
    assert err.value.lines[-2:] == ["first line", "last line"]
    assert fake.list("mpijobs", "ml") == []


def test_pods_that_are_never_scheduled_give_one_line_at_the_start_timeout(fake, tmp_path):
    k8s, lines = launcher(fake, tmp_path, start_timeout=2.0)
    reason = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
              "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}
    pods_become(fake, [], 0.1, lambda f, ns, name: f.set_status(name, ns, phase="Pending", conditions=[reason]))
    t0 = time.monotonic()
    try:
        with pytest.raises(ClusterError) as err:
            k8s.probe()
    finally:
        k8s.stop()
    assert time.monotonic() - t0 < 6
    assert err.value.lines[0].startswith("The job's pods were not ready within 2 s:  0/2 pods ready; ")
    assert "not scheduled: Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in err.value.lines[0]
    assert "--start-timeout" in err.value.lines[1]
    assert fake.list("mpijobs", "ml") == []


@pytest.mark.parametrize("setup, says", [
    (lambda f: f.missing.add("mpijobs"), "Kubernetes has no MPIJob kind (kubeflow.org/v2beta1): --k8s runs the ranks "
                                         "through the MPI Operator here, which must be installed"),
    (lambda f: f.forbidden.add("create mpijobs"), "Kubernetes refused to create mpijobs in namespace ml (403 Forbidden): "
                                                  "the kernel's service account needs the Role in docs/kubernetes.md"),
    (lambda f: f.missing.add("trainjobs"), "Kubernetes has no TrainJob kind (trainer.kubeflow.org/v1alpha1): --k8s runs "
                                           "the ranks through Kubeflow Trainer here, which must be installed"),
])
def test_what_the_api_refuses_is_one_line_with_the_fix(fake, tmp_path, setup, says):
    setup(fake)
    k8s, _ = launcher(fake, tmp_path, k8s_runtime="trainjob" if "TrainJob" in says else "mpijob")
    try:
        with pytest.raises(ClusterError) as err:
            k8s.probe()
    finally:
        k8s.stop()
    assert err.value.lines[0].startswith(says) and len(err.value.lines) == 1


def test_an_api_reached_over_loopback_asks_for_the_address_the_pods_reach(fake, tmp_path):
    k8s, _ = launcher(fake, tmp_path, ip=None)
    try:
        with pytest.raises(ClusterError, match=r"This kernel reaches the Kubernetes API over loopback \(127.0.0.1: "
                                               r"kubectl proxy\?\).*give --ip ADDR \(or --iface NAME\)"):
            k8s.probe()
    finally:
        k8s.stop()
    assert fake.list("mpijobs", "ml") == []  # nothing was created


def test_a_kernel_in_a_pod_makes_its_pod_the_jobs_owner(fake, tmp_path, monkeypatch):
    """In a pod (service account token, KUBERNETES_SERVICE_HOST; faked here), the job is owned by the kernel's
    pod, found by its hostname: deleting the notebook deletes the job."""
    fake.put("pods", {"metadata": {"name": "jupyter-ada", "namespace": "ml", "uid": "u-ada"}, "status": {}})
    monkeypatch.setattr(k8s_client, "in_cluster", lambda: True)
    monkeypatch.setenv("HOSTNAME", "jupyter-ada")
    k8s, _ = launcher(fake, tmp_path)
    pods_become(fake, [], 0.1, lambda f, ns, name: f.ready(name, ns))
    try:
        k8s.probe()
        job = fake.get("mpijobs", "ml", k8s.spec.name)
        assert job["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "jupyter-ada",
                                                       "uid": "u-ada", "blockOwnerDeletion": False}]
    finally:
        k8s.stop()
