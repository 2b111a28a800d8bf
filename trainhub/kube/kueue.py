"""Reading Kueue's verdict on a pod from API objects (its pod integration), without any client.

Kueue's pod integration creates a pod with the ``kueue.x-k8s.io/admission`` scheduling gate and a
Workload owned by it; while the gate is there the scheduler leaves the pod alone, and the Workload's
conditions say why (``QuotaReserved`` False: "couldn't assign flavors to pod set main: insufficient
unused quota ..."). Kueue removes the gate when it admits the Workload.
"""

from __future__ import annotations

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta1"
WORKLOADS = "workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# the label Kueue puts on a Workload naming the uid of the object it stands for (here the Pod)
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
NO_REASON = "waiting for Kueue to admit it"
POLL_SECONDS = 1.0  # how often the spawner looks at its pod while it starts
LOOKUP_SECONDS = 5.0  # how often it reads the Workloads again while the pod stays gated


def gated(pod: dict) -> bool:
    """Whether ``pod`` still carries Kueue's admission gate (Kueue has not admitted it)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any((g or {}).get("name") == ADMISSION_GATE for g in gates)


def workload_of(pod: dict, workloads: list[dict]) -> dict | None:
    """The Workload standing for ``pod``: owned by it (ownerReferences) or labelled with its uid."""
    uid = (pod.get("metadata") or {}).get("uid")
    if not uid:
        return None
    for wl in workloads:
        meta = wl.get("metadata") or {}
        if any(ref.get("uid") == uid and ref.get("kind") == "Pod" for ref in meta.get("ownerReferences") or []):
            return wl
    for wl in workloads:
        if ((wl.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL) == uid:
            return wl
    return None


def reason(workload: dict | None) -> str:
    """Why Kueue holds the Workload: the message of its failed QuotaReserved (else Admitted) condition."""
    if workload is None:
        return NO_REASON
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind in ("QuotaReserved", "Admitted"):
        cond = conditions.get(kind)
        if cond and cond.get("status") != "True" and (cond.get("message") or cond.get("reason")):
            return cond.get("message") or cond.get("reason")
    admitted = conditions.get("Admitted")
    if admitted and admitted.get("status") == "True":
        return "admitted by Kueue, waiting for it to remove the scheduling gate"
    return NO_REASON


def duration(seconds: float) -> str:
    """A short human duration: "6 h", "90 min", "45 s"."""
    seconds = int(seconds)
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds >= 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds} s"
