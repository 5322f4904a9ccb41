"""The Kubernetes launcher's pure parts (jdist.kernel.launch.k8s): the manifests against golden files and
against the schemas the API server would apply, and the heartbeat that ends a job whose kernel is gone.

No Kubernetes API server can run on these machines, so nothing here talks to one: the ``MPIJob`` is
checked against the MPI Operator's own CRD schema (tests/data/k8s, source in its README) made strict
(an unknown field fails, where the API server would silently drop it), its pod templates and the RBAC
objects against Kubernetes' published schemas (``kubernetes-validate``, strict).

Golden files: ``JDIST_UPDATE_GOLDEN=1 pytest tests/test_launch_k8s.py`` rewrites them; review the diff.
"""

from __future__ import annotations

import copy
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
    worker_hosts,
)

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


MPIJOB_SCHEMA = strict(json.loads(gzip.decompress((DATA / "mpijob-v2beta1.schema.json.gz").read_bytes())))


def check_mpijob(job: dict) -> None:
    """The job as the API server would check it: the operator's CRD schema, and each pod template."""
    jsonschema.validate(job, MPIJOB_SCHEMA)
    for replica in job["spec"]["mpiReplicaSpecs"].values():
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": replica["template"]}
        kubernetes_validate.validate(template, K8S_VERSION, strict=True)


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
