"""A worker pod's state in one line: ready, still coming (and why), or failed (and why).

:func:`pod_state` reads a pod as the Kubernetes API returns it (a dict, JSON field names) and says
what a user must know: ``waiting`` while it is not ready yet (shown on the progress line: the
scheduler's ``Unschedulable`` message, ``ContainerCreating``...), ``failed`` when waiting will not
help (the image cannot be pulled, the container cannot be created, the pod ended: ``OOMKilled``, an
exit status, evicted, preempted, its node lost). Pure: the launcher polls or watches the pods and
calls it.

Example:
    >>> pod = {"metadata": {"name": "jdist-c1-worker-1"}, "status": {"phase": "Pending", "containerStatuses": [
    ...     {"name": "rank", "state": {"waiting": {"reason": "ImagePullBackOff",
    ...      "message": 'Back-off pulling image "registry.example/jdist:2"'}}}]}}
    >>> pod_state(pod).failed
    'pod jdist-c1-worker-1 cannot pull its image: ImagePullBackOff: Back-off pulling image "registry.example/jdist:2"'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Container waiting reasons that waiting does not cure: the image or the container's configuration is wrong.
IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")
#: ``DisruptionTarget`` condition reasons: the pod is being ended by the cluster, not by jdist.
DISRUPTIONS = {
    "PreemptionByScheduler": "preempted by a pod of higher priority",
    "DeletionByTaintManager": "its node was tainted (NoExecute) or lost",
    "EvictionByEvictionAPI": "evicted (a node drain or the eviction API)",
    "DeletionByPodGC": "its node is gone",
    "TerminationByKubelet": "ended by the kubelet (node pressure or shutdown)",
}


@dataclass(frozen=True)
class PodState:
    """``ready``: running and Ready; ``waiting``: why not yet (None when ready or failed); ``failed``:
    one line, why it cannot run or has ended (None while it may still become ready)."""

    name: str
    ready: bool = False
    waiting: str | None = None
    failed: str | None = None


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def _said(reason: str | None, message: str | None) -> str:
    return ": ".join(part for part in (reason, (message or "").strip().replace("\n", " ")) if part)


def pod_state(pod: dict[str, Any]) -> PodState:
    """The :class:`PodState` of ``pod`` (see the module doc)."""
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    disruption = _condition(status, "DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        why = DISRUPTIONS.get(disruption.get("reason") or "", disruption.get("reason") or "disrupted")
        return PodState(name, failed=f"pod {name} is being ended by the cluster: {why}"
                                     + (f" ({disruption['message']})" if disruption.get("message") else ""))
    if phase == "Unknown":
        return PodState(name, failed=f"pod {name}: its node stopped reporting (node lost or unreachable)")
    if phase == "Failed":
        if status.get("reason") == "Evicted":
            return PodState(name, failed=f"pod {name} was evicted: {_said(None, status.get('message'))}")
        return PodState(name, failed=f"pod {name} ended: {_terminated(status) or _said(status.get('reason'), status.get('message')) or 'failed'}")
    if phase == "Succeeded":
        return PodState(name, failed=f"pod {name} ended: its sshd exited (0)")
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            reason = waiting.get("reason") or ""
            if reason in IMAGE_REASONS:
                return PodState(name, failed=f"pod {name} cannot pull its image: {_said(reason, waiting.get('message'))}")
            if reason in CONFIG_REASONS:
                return PodState(name, failed=f"pod {name} cannot start its container: "
                                             f"{_said(reason, waiting.get('message'))}")
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and phase == "Running":  # restartPolicy Never: a container that ended stays ended
            return PodState(name, failed=f"pod {name} ended: {_said_terminated(cs['name'], terminated)}")
    if status.get("deletionTimestamp") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return PodState(name, failed=f"pod {name} is being deleted")
    ready = _condition(status, "Ready")
    if phase == "Running" and ready is not None and ready.get("status") == "True":
        return PodState(name, ready=True)
    scheduled = _condition(status, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        return PodState(name, waiting=f"not scheduled: {_said(scheduled.get('reason'), scheduled.get('message'))}")
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return PodState(name, waiting=_said(waiting.get("reason"), waiting.get("message")))
    return PodState(name, waiting="starting" if phase == "Pending" else "sshd not ready yet")


def _said_terminated(container: str, terminated: dict[str, Any]) -> str:
    reason = terminated.get("reason") or ""
    code = terminated.get("exitCode")
    if reason == "OOMKilled":
        return f"container {container} was OOMKilled (over its memory limit; give the pods more with --pod-memory)"
    return f"container {container} exited with code {code}" + (f" ({_said(reason, terminated.get('message'))})"
                                                              if reason or terminated.get("message") else "")


def _terminated(status: dict[str, Any]) -> str | None:
    for cs in status.get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated:
            return _said_terminated(cs.get("name", "?"), terminated)
    return None


#: The label a Job's indexed pods carry (JobSet's, so a TrainJob's workers): the pod's index in its job.
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def pod_index(pod: dict[str, Any]) -> int:
    """A worker pod's index: its :data:`INDEX_LABEL`, else the number its name ends with (the MPI
    Operator's ``<job>-worker-<i>``), else 0.

    >>> pod_index({"metadata": {"name": "j-worker-3"}})
    3
    >>> pod_index({"metadata": {"name": "j-node-0-1-x7b2q", "labels": {INDEX_LABEL: "1"}}})
    1
    """
    meta = pod.get("metadata") or {}
    label = (meta.get("labels") or {}).get(INDEX_LABEL, "")
    if label.isdigit():
        return int(label)
    tail = str(meta.get("name", "")).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def summary(states: list[PodState], expected: int | None = None) -> str:
    """The progress line's part for the pods: how many of the ``expected`` (default: those seen) are ready,
    and the first reason the others wait.

    >>> summary([PodState("a", ready=True), PodState("b", waiting="ContainerCreating")], expected=3)
    '1/3 pods ready; b: ContainerCreating'
    """
    ready = sum(s.ready for s in states)
    waiting = next((s for s in states if s.waiting), None)
    return (f"{ready}/{len(states) if expected is None else expected} pods ready"
            + (f"; {waiting.name}: {waiting.waiting}" if waiting else ""))


__all__ = ["INDEX_LABEL", "PodState", "pod_index", "pod_state", "summary"]
