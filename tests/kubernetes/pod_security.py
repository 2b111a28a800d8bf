"""The Pod Security Standards' "restricted" profile as a check on a pod spec.

The v1.20 control plane the tests run has no PodSecurity admission (alpha in 1.22, GA in 1.25), so this
follows the rules of https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline and
restricted, current policy version) for the fields trainhub's pods can carry. A namespace labelled
``pod-security.kubernetes.io/enforce: restricted`` refuses a pod for any line this returns.
"""

from __future__ import annotations

RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}


def restricted_violations(pod_spec: dict) -> list[str]:
    """Every rule of the restricted profile that ``pod_spec`` breaks (empty: admitted)."""
    out = []
    psc = pod_spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(host):
            out.append(f"{host} is set")
    for v in pod_spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            out.append(f"volume {v['name']} of type {sorted(kinds - RESTRICTED_VOLUME_TYPES)}")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("pod seccompProfile is Unconfined")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser is 0")
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or []),
                  *(pod_spec.get("ephemeralContainers") or [])]
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c.get("name", "?")
        if sc.get("privileged"):
            out.append(f"container {name} is privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"container {name} does not set allowPrivilegeEscalation: false")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            out.append(f"container {name} (or the pod) does not set runAsNonRoot: true")
        if sc.get("runAsUser") == 0:
            out.append(f"container {name} runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"container {name} (or the pod) has no RuntimeDefault/Localhost seccompProfile")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"container {name} does not drop ALL capabilities")
        added = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            out.append(f"container {name} adds capabilities {sorted(added)}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"container {name} uses a hostPort")
    return out
