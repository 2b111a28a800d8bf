"""What a real kube-apiserver does to a request body, for the API stand-in (``kube_standin.py``).

Pure functions, no I/O. Each follows the upstream apiserver; ``test_standin_differential.py``
sends the same requests to the real v1.20 apiserver and to the stand-in and checks they agree.

* **unknown fields** (``prune_unknown``): dropped, by the OpenAPI schema of the kind
  (kubernetes-validate's bundled schemas, Kubernetes 1.33); the paths are returned so
  ``fieldValidation=Strict`` can refuse them (400) and ``Warn`` (the default since 1.27) can
  put them in ``Warning`` headers. 1.20 ignores ``fieldValidation`` (drops silently);
* **patches**: JSON merge patch (RFC 7386), strategic merge patch (merge keys and strategies
  from the schema's ``x-kubernetes-patch-*``; ``$patch: delete|replace``,
  ``$deleteFromPrimitiveList``, ``$setElementOrder`` and ``$retainKeys`` understood), JSON
  patch (RFC 6902; a failed operation is 422 as in the apiserver);
* **defaulting** (``apply_defaults``) and the admission plugins that write fields
  (ServiceAccount, DefaultTolerationSeconds, Priority, StorageObjectInUseProtection,
  TaintNodesByCondition): Pod, Job (with its pod template), Service, PVC, PV, Secret,
  Namespace, Node;
* **validation** (``validate``): names, the pod and Job rules trainhub's manifests can break,
  the fields that cannot change on update; a ``Status`` 422 body shaped like the apiserver's;
* **field selectors**: only the fields the apiserver indexes for each resource (others: 400
  ``field label not supported``).
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import random
import re
from typing import Any

SCHEMA_VERSION = "1.33.0"

# ---------------------------------------------------------------------------------------------
# errors


class ApiError(Exception):
    """An error the apiserver answers with a Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def body(self) -> dict:
        out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            out["details"] = self.details
        return out


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid with ``causes`` as (field, reason, message), formatted as the apiserver does."""
    parts = [f"{field}: {message}" for field, _, message in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    details = {"name": name, **({"group": group} if group else {}), "kind": kind,
               "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes]}
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {joined}', details)


# ---------------------------------------------------------------------------------------------
# schemas


@functools.cache
def _defs() -> dict:
    import kubernetes_validate

    path = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                        f"v{SCHEMA_VERSION}-local-strict", "_definitions.json")
    with open(path) as f:
        return json.load(f)["$defs"]


@functools.cache
def _gvk_index() -> dict:
    out = {}
    for name, d in _defs().items():
        for gvk in d.get("x-kubernetes-group-version-kind") or []:
            out[(gvk.get("group", ""), gvk["version"], gvk["kind"])] = name
    return out


def schema_for(api_version: str, kind: str) -> dict | None:
    group, _, version = api_version.rpartition("/")
    name = _gvk_index().get((group, version, kind))
    return _defs()[name] if name else None


def _resolve(schema: dict | None) -> dict:
    while schema and "$ref" in schema:
        schema = _defs()[schema["$ref"].rsplit("/", 1)[-1]]
    return schema or {}


def _child(schema: dict, key: str) -> dict | None:
    schema = _resolve(schema)
    props = schema.get("properties")
    if props is not None and key in props:
        return props[key]
    addl = schema.get("additionalProperties")
    return addl if isinstance(addl, dict) else None


def _items(schema: dict | None) -> dict | None:
    schema = _resolve(schema)
    return schema.get("items")


def prune_unknown(obj: Any, schema: dict | None, path: str = "") -> list[str]:
    """Remove the fields ``schema`` does not know from ``obj`` (in place); their paths."""
    unknown: list[str] = []
    schema = _resolve(schema)
    if not schema:
        return unknown
    if isinstance(obj, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        for key in list(obj):
            if props is not None and key in props:
                unknown += prune_unknown(obj[key], props[key], f"{path}.{key}" if path else key)
            elif isinstance(addl, dict):
                unknown += prune_unknown(obj[key], addl, f"{path}.{key}" if path else key)
            elif props is not None and addl is not True:
                unknown.append(f"{path}.{key}" if path else key)
                del obj[key]
    elif isinstance(obj, list) and schema.get("items"):
        for i, item in enumerate(obj):
            unknown += prune_unknown(item, schema["items"], f"{path}[{i}]")
    return unknown


# ---------------------------------------------------------------------------------------------
# patches


class PatchError(Exception):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge_patch(target: Any, patch: Any, schema: dict | None) -> Any:
    """Strategic merge patch with the schema's merge keys and strategies."""
    schema = _resolve(schema)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            if isinstance(out.get(field), list):
                out[field] = [x for x in out[field] if x not in v]
            continue
        if k.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys: order and retention only
        sub = _child(schema, k)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list):
            out[k] = _merge_list(out.get(k), v, sub)
        elif isinstance(v, dict):
            merged = strategic_merge_patch(out.get(k), v, sub)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = copy.deepcopy(v)
    if retain is not None:
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(current: Any, patch: list, schema: dict | None) -> list:
    schema = schema or {}
    strategy = schema.get("x-kubernetes-patch-strategy", "")
    key = schema.get("x-kubernetes-patch-merge-key")
    if "merge" not in strategy.split(","):
        return [x for x in copy.deepcopy(patch) if not (isinstance(x, dict) and x.get("$patch"))]
    current = copy.deepcopy(current) if isinstance(current, list) else []
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
        return [x for x in copy.deepcopy(patch) if not (isinstance(x, dict) and "$patch" in x)]
    if not key:  # a list of primitives: the union, the patch's values first (as the apiserver orders it)
        head = []
        for x in patch:
            if x not in head:
                head.append(copy.deepcopy(x))
        return head + [x for x in current if x not in head]
    items = _items(schema)
    merged, used = [], set()
    for elem in patch:
        if not isinstance(elem, dict) or key not in elem:
            raise PatchError(f"map: {elem} does not contain declared merge key: {key}")
        match = next((i for i, c in enumerate(current) if isinstance(c, dict) and c.get(key) == elem[key]), None)
        if match is not None:
            used.add(match)
        if elem.get("$patch") == "delete":
            continue
        if match is None:
            merged.append({k: copy.deepcopy(v) for k, v in elem.items() if k != "$patch"})
        else:
            merged.append(strategic_merge_patch(current[match], elem, items))
    # as the apiserver orders them (no $setElementOrder): the patch's elements, then the others
    return merged + [c for i, c in enumerate(current) if i not in used]


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]):
    cur = doc
    for p in parts:
        if isinstance(cur, list):
            if not p.isdigit() or int(p) >= len(cur):
                raise PatchError(f"index {p} out of range")
            cur = cur[int(p)]
        elif isinstance(cur, dict):
            if p not in cur:
                raise PatchError(f"missing key {p}")
            cur = cur[p]
        else:
            raise PatchError("path through a scalar")
    return cur


def json_patch(doc: Any, ops: list) -> Any:
    """RFC 6902."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"bad operation {op!r}")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "test":
            if _walk(doc, parts) != op.get("value"):
                raise PatchError("test failed")
            continue
        if kind in ("move", "copy"):
            value = copy.deepcopy(_walk(doc, _pointer(op["from"])))
            if kind == "move":
                doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
            doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
            continue
        if not parts:
            if kind in ("add", "replace"):
                doc = copy.deepcopy(op.get("value"))
                continue
            raise PatchError("cannot remove the document")
        parent, last = _walk(doc, parts[:-1]), parts[-1]
        if isinstance(parent, list):
            if kind == "add":
                idx = len(parent) if last == "-" else int(last) if last.isdigit() else -1
                if not 0 <= idx <= len(parent):
                    raise PatchError(f"index {last} out of range")
                parent.insert(idx, copy.deepcopy(op.get("value")))
            else:
                if not last.isdigit() or int(last) >= len(parent):
                    raise PatchError(f"index {last} out of range")
                if kind == "remove":
                    parent.pop(int(last))
                elif kind == "replace":
                    parent[int(last)] = copy.deepcopy(op.get("value"))
                else:
                    raise PatchError(f"unknown op {kind}")
        elif isinstance(parent, dict):
            if kind == "add":
                parent[last] = copy.deepcopy(op.get("value"))
            elif kind in ("remove", "replace"):
                if last not in parent:
                    raise PatchError(f"missing key {last}")
                if kind == "remove":
                    del parent[last]
                else:
                    parent[last] = copy.deepcopy(op.get("value"))
            else:
                raise PatchError(f"unknown op {kind}")
        else:
            raise PatchError("path through a scalar")
    return doc


# ---------------------------------------------------------------------------------------------
# defaulting and admission


def _image_pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    tail = image.rsplit("/", 1)[-1]
    tag = tail.split(":", 1)[1] if ":" in tail else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default_container(c: dict) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if c.get("image"):
        c.setdefault("imagePullPolicy", _image_pull_policy(c["image"]))
    res = c.setdefault("resources", {})
    limits = res.get("limits") or {}
    if limits:
        requests = res.setdefault("requests", {})
        for k, v in limits.items():
            requests.setdefault(k, v)
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")
    for e in c.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        if ref is not None:
            ref.setdefault("apiVersion", "v1")


def _default_pod_spec(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        _default_container(c)
    for v in spec.get("volumes") or []:
        for kind in ("secret", "configMap", "projected", "downwardAPI"):
            if kind in v and isinstance(v[kind], dict):
                v[kind].setdefault("defaultMode", 420)
        if "emptyDir" in v and v["emptyDir"] is None:
            v["emptyDir"] = {}
        if "hostPath" in v and isinstance(v["hostPath"], dict):
            v["hostPath"].setdefault("type", "")


def qos_class(spec: dict) -> str:
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    requests, limits = {}, {}
    for c in containers:
        res = c.get("resources") or {}
        for k in ("cpu", "memory"):
            if k in (res.get("requests") or {}):
                requests.setdefault(k, 0)
                requests[k] += 1
            if k in (res.get("limits") or {}):
                limits.setdefault(k, 0)
                limits[k] += 1
    if not requests and not limits:
        return "BestEffort"
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        lim, req = res.get("limits") or {}, res.get("requests") or {}
        for k in ("cpu", "memory"):
            if k not in lim or parse_quantity(req.get(k, lim[k])) != parse_quantity(lim[k]):
                guaranteed = False
    return "Guaranteed" if guaranteed else "Burstable"


_DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]


def _default_service(spec: dict) -> None:
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for p in spec.get("ports") or []:
        p.setdefault("protocol", "TCP")
        p.setdefault("targetPort", p.get("port"))
    if spec.get("sessionAffinity") == "ClientIP":
        spec.setdefault("sessionAffinityConfig", {"clientIP": {"timeoutSeconds": 10800}})


def _default_pv(spec: dict) -> None:
    spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
    spec.setdefault("volumeMode", "Filesystem")
    if isinstance(spec.get("hostPath"), dict):
        spec["hostPath"].setdefault("type", "")


def _default_tolerations(spec: dict) -> None:
    """The DefaultTolerationSeconds admission plugin (on create and on update)."""
    tolerations = spec.setdefault("tolerations", [])
    for default in _DEFAULT_TOLERATIONS:
        if not any(t.get("operator") == "Exists" and not t.get("key") and t.get("effect") in (None, "", "NoExecute")
                   or t.get("key") == default["key"] and t.get("effect") in (None, "", "NoExecute")
                   for t in tolerations):
            tolerations.append(dict(default))


def _allocate_cluster_ip(taken: set[str]) -> str:
    while True:
        ip = f"10.96.{random.randint(0, 255)}.{random.randint(2, 254)}"
        if ip not in taken:
            return ip


def apply_defaults(obj: dict, kind: str, *, uid: str = "", cluster_ips: set[str] | None = None) -> None:
    """Defaults and admission mutations for a new object of ``kind`` (in place)."""
    meta = obj.setdefault("metadata", {})
    if kind == "Pod":
        spec = obj.setdefault("spec", {})
        _default_pod_spec(spec)
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
        spec["serviceAccount"] = spec["serviceAccountName"]
        spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        _default_tolerations(spec)
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}
    elif kind == "Job":
        spec = obj.setdefault("spec", {})
        if spec.get("completions") is None and spec.get("parallelism") is None:
            spec["completions"] = 1
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
        for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
            for cond in rule.get("onPodConditions") or []:
                cond.setdefault("status", "True")
        template = spec.setdefault("template", {})
        tmeta = template.setdefault("metadata", {})
        if not spec.get("manualSelector"):
            labels = tmeta.setdefault("labels", {})
            labels.update({"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": meta["name"],
                           "controller-uid": uid, "job-name": meta["name"]})
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            if not meta.get("labels"):
                meta["labels"] = {k: v for k, v in labels.items()
                                  if k in ("batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name",
                                           "controller-uid", "job-name")}
        tmeta.setdefault("creationTimestamp", None)
        _default_pod_spec(template.setdefault("spec", {}))
        obj.setdefault("status", {})
    elif kind == "Service":
        spec = obj.setdefault("spec", {})
        _default_service(spec)
        if spec.get("type") != "ExternalName":
            if not spec.get("clusterIP"):
                spec["clusterIP"] = _allocate_cluster_ip(cluster_ips or set())
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
        obj["status"] = {"loadBalancer": {}}
    elif kind == "PersistentVolumeClaim":
        spec = obj.setdefault("spec", {})
        spec.setdefault("volumeMode", "Filesystem")
        fins = meta.setdefault("finalizers", [])
        if "kubernetes.io/pvc-protection" not in fins:
            fins.append("kubernetes.io/pvc-protection")
        obj["status"] = {"phase": "Pending"}
    elif kind == "PersistentVolume":
        spec = obj.setdefault("spec", {})
        _default_pv(spec)
        fins = meta.setdefault("finalizers", [])
        if "kubernetes.io/pv-protection" not in fins:
            fins.append("kubernetes.io/pv-protection")
        obj["status"] = {"phase": "Pending"}
    elif kind == "Secret":
        obj.setdefault("type", "Opaque")
        string_data = obj.pop("stringData", None) or {}
        if string_data:
            data = obj.setdefault("data", {})
            for k, v in string_data.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
    elif kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        obj["status"] = {"phase": "Active"}
    elif kind == "Node":
        spec = obj.setdefault("spec", {})
        taints = spec.setdefault("taints", [])
        if not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints):
            taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})


def normalize_update(obj: dict, kind: str) -> None:
    """What the apiserver does to every update body too (stringData, container defaults)."""
    if kind == "Secret" and obj.get("stringData"):
        data = obj.setdefault("data", {})
        for k, v in obj.pop("stringData").items():
            data[k] = base64.b64encode(str(v).encode()).decode()
    if kind == "Pod":
        _default_pod_spec(obj.setdefault("spec", {}))
        _default_tolerations(obj["spec"])
    if kind == "Job" and (obj.get("spec") or {}).get("template"):
        _default_pod_spec(obj["spec"]["template"].setdefault("spec", {}))
    if kind == "Service":
        _default_service(obj.setdefault("spec", {}))
    if kind == "PersistentVolume":
        _default_pv(obj.setdefault("spec", {}))


# ---------------------------------------------------------------------------------------------
# validation

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                  "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                  "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
              "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
              "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
_DNS1035_MSG = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
                "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
_NAME_RULES = {"Service": (_DNS1035_LABEL, _DNS1035_MSG, 63), "Namespace": (_DNS1123_LABEL, _LABEL_MSG, 63)}


def _q(v) -> str:
    return json.dumps(v) if isinstance(v, str) else str(v)


def _check_name(name: str, kind: str, causes: list) -> None:
    rx, msg, limit = _NAME_RULES.get(kind, (_DNS1123_SUBDOMAIN, _SUBDOMAIN_MSG, 253))
    if len(name) > limit:
        causes.append(("metadata.name", "FieldValueInvalid",
                       f"Invalid value: {_q(name)}: must be no more than {limit} characters"))
    elif not rx.match(name):
        causes.append(("metadata.name", "FieldValueInvalid", f"Invalid value: {_q(name)}: {msg}"))


def _check_pod_spec(spec: dict, path: str, causes: list, *, job: bool = False) -> None:
    containers = spec.get("containers") or []
    if not containers:
        causes.append((f"{path}.containers", "FieldValueRequired", "Required value"))
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    seen: set = set()
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            cpath = f"{path}.{group}[{i}]"
            name = c.get("name") or ""
            if not name:
                causes.append((f"{cpath}.name", "FieldValueRequired", "Required value"))
            elif not _DNS1123_LABEL.match(name) or len(name) > 63:
                causes.append((f"{cpath}.name", "FieldValueInvalid", f"Invalid value: {_q(name)}: {_LABEL_MSG}"))
            elif name in seen:
                causes.append((f"{cpath}.name", "FieldValueDuplicate", f"Duplicate value: {_q(name)}"))
            seen.add(name)
            if not c.get("image"):
                causes.append((f"{cpath}.image", "FieldValueRequired", "Required value"))
            if group == "initContainers" and c.get("restartPolicy") != "Always":
                for field in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe"):
                    if c.get(field):
                        causes.append((f"{cpath}.{field}", "FieldValueInvalid",
                                       f"Invalid value: {json.dumps(c[field])}: must not be set for init containers"))
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            for k, v in requests.items():
                if k in limits and parse_quantity(v) > parse_quantity(limits[k]):
                    causes.append((f"{cpath}.resources.requests", "FieldValueInvalid",
                                   f"Invalid value: {_q(str(v))}: must be less than or equal to {k} limit"))
                elif "/" in k and not k.startswith("kubernetes.io/") and k in limits \
                        and parse_quantity(v) != parse_quantity(limits[k]):
                    causes.append((f"{cpath}.resources.requests", "FieldValueInvalid",
                                   f"Invalid value: {_q(str(v))}: must be equal to {k} limit"))
            for j, m in enumerate(c.get("volumeMounts") or []):
                if m.get("name") not in volumes:
                    causes.append((f"{cpath}.volumeMounts[{j}].name", "FieldValueNotFound", f"Not found: {_q(m.get('name'))}"))
    policy = spec.get("restartPolicy")
    if job:
        if policy not in ("OnFailure", "Never"):
            causes.append((f"{path}.restartPolicy", "FieldValueRequired",
                           'Required value: valid values: "OnFailure", "Never"'))
    elif policy not in (None, "Always", "OnFailure", "Never"):
        causes.append((f"{path}.restartPolicy", "FieldValueNotSupported",
                       f'Unsupported value: {_q(policy)}: supported values: "Always", "OnFailure", "Never"'))
    names = [v.get("name") for v in spec.get("volumes") or []]
    for i, v in enumerate(names):
        if v in names[:i]:
            causes.append((f"{path}.volumes[{i}].name", "FieldValueDuplicate", f"Duplicate value: {_q(v)}"))


def _match_selector(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        present, value = expr["key"] in labels, labels.get(expr["key"])
        op, values = expr["operator"], expr.get("values") or []
        if op == "In" and value not in values or op == "NotIn" and present and value in values \
                or op == "Exists" and not present or op == "DoesNotExist" and present:
            return False
    return True


def validate(obj: dict, kind: str, group: str, old: dict | None = None) -> None:
    """Raise a 422 ApiError when ``obj`` (new, or replacing ``old``) breaks the apiserver's rules."""
    causes: list = []
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    if not name:
        causes.append(("metadata.name", "FieldValueRequired", "Required value: name or generateName is required"))
    elif old is None:
        _check_name(name, kind, causes)
    for k, v in (meta.get("labels") or {}).items():
        if not isinstance(v, str) or len(v) > 63 or v and not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", v):
            causes.append(("metadata.labels", "FieldValueInvalid",
                           f"Invalid value: {_q(v)}: a valid label must be an empty string or consist of alphanumeric "
                           "characters, '-', '_' or '.', and must start and end with an alphanumeric character "
                           "(e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is "
                           "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"))
    spec = obj.get("spec") or {}
    if kind == "Pod":
        _check_pod_spec(spec, "spec", causes)
    elif kind == "Job":
        for field in ("parallelism", "completions", "backoffLimit"):
            v = spec.get(field)
            if isinstance(v, int) and v < 0:
                causes.append((f"spec.{field}", "FieldValueInvalid",
                               f"Invalid value: {v}: must be greater than or equal to 0"))
        v = spec.get("activeDeadlineSeconds")
        if isinstance(v, int) and v <= 0:
            causes.append(("spec.activeDeadlineSeconds", "FieldValueInvalid",
                           f"Invalid value: {v}: must be greater than or equal to 0" if v < 0 else
                           f"Invalid value: {v}: must be greater than 0"))
        template = spec.get("template") or {}
        selector = spec.get("selector")
        if selector and not _match_selector(selector, (template.get("metadata") or {}).get("labels") or {}):
            causes.append(("spec.template.metadata.labels", "FieldValueInvalid",
                           f"Invalid value: {json.dumps((template.get('metadata') or {}).get('labels') or {})}: "
                           "`selector` does not match template `labels`"))
        _check_pod_spec(template.get("spec") or {}, "spec.template.spec", causes, job=True)
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
            causes.append(("spec.completions", "FieldValueRequired",
                           "Required value: when completion mode is Indexed"))
    if old is not None:
        _check_update(obj, old, kind, causes)
    if causes:
        raise invalid(kind, group, name, causes)


def _check_update(new: dict, old: dict, kind: str, causes: list) -> None:
    ospec, nspec = old.get("spec") or {}, new.get("spec") or {}
    if kind == "Pod":
        allowed = copy.deepcopy(nspec)
        for group in ("containers", "initContainers"):
            for c_new, c_old in zip(allowed.get(group) or [], ospec.get(group) or []):
                c_new["image"] = c_old.get("image")
        allowed["activeDeadlineSeconds"] = ospec.get("activeDeadlineSeconds")
        old_tol = ospec.get("tolerations") or []
        if all(t in (nspec.get("tolerations") or []) for t in old_tol):
            allowed["tolerations"] = old_tol
        if "schedulingGates" in ospec and not nspec.get("schedulingGates"):
            allowed["schedulingGates"] = ospec["schedulingGates"]
        allowed = {k: v for k, v in allowed.items() if v is not None}
        before = {k: v for k, v in ospec.items() if v is not None}
        if nspec.get("nodeName") is None and ospec.get("nodeName"):
            allowed["nodeName"] = ospec["nodeName"]
        if allowed != before:
            causes.append(("spec", "FieldValueForbidden",
                           "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                           "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only "
                           "additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be "
                           "set to 1 if it was previously negative)"))
    elif kind == "Job":
        for field in ("template", "selector", "completionMode", "podFailurePolicy", "backoffLimitPerIndex",
                      "manualSelector"):
            if nspec.get(field) != ospec.get(field) and not (
                    field == "template" and ospec.get("suspend") and _only_scheduling_changed(ospec, nspec)):
                causes.append((f"spec.{field}", "FieldValueInvalid",
                               f"Invalid value: {json.dumps(nspec.get(field))}: field is immutable"))
        if nspec.get("completions") != ospec.get("completions") and not (
                ospec.get("completionMode") == "Indexed" and nspec.get("completions") == nspec.get("parallelism")):
            causes.append(("spec.completions", "FieldValueInvalid",
                           f"Invalid value: {nspec.get('completions')}: field is immutable"))
    elif kind == "Service":
        if ospec.get("clusterIP") and nspec.get("clusterIP") not in (None, ospec.get("clusterIP")):
            causes.append(("spec.clusterIPs[0]", "FieldValueInvalid",
                           f"Invalid value: {json.dumps([nspec.get('clusterIP')])}: may not change once set"))


def _only_scheduling_changed(ospec: dict, nspec: dict) -> bool:
    """A suspended Job's template may change node selector, tolerations, affinity, labels (Kueue)."""
    a, b = copy.deepcopy(ospec.get("template") or {}), copy.deepcopy(nspec.get("template") or {})
    for t in (a, b):
        s = t.setdefault("spec", {})
        for k in ("nodeSelector", "tolerations", "affinity", "schedulingGates"):
            s.pop(k, None)
        m = t.setdefault("metadata", {})
        m.pop("labels", None)
        m.pop("annotations", None)
    return a == b


# ---------------------------------------------------------------------------------------------
# selectors

_REQ_RE = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[^\s=!,()]+)"
    r"|(?P<key>[^\s=!,()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<val>[^\s,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\))?)\s*$"
)


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_label_selector(selector: str | None) -> list:
    """Parsed requirements; ApiError 400 for what the apiserver cannot parse."""
    out = []
    for req in _split_selector(selector or ""):
        m = _REQ_RE.match(req)
        if not m:
            words = req.split()
            hint = (f"unable to parse requirement: found '{words[-1]}', expected: '('" if len(words) >= 3
                    and words[1] in ("in", "notin") else f"unable to parse requirement: {req.strip()!r}")
            raise ApiError(400, "BadRequest", hint)
        out.append(m)
    return out


def match_label_selector(labels: dict | None, selector: str | None) -> bool:
    """Kubernetes label-selector semantics for one object's labels."""
    labels = labels or {}
    for m in parse_label_selector(selector):
        if m["nkey"]:
            if m["nkey"] in labels:
                return False
        elif m["op"]:
            has = m["key"] in labels and labels[m["key"]] == m["val"]
            if (m["op"] == "!=") == has:
                return False
        elif m["setop"]:
            vals = {v.strip() for v in m["vals"].split(",")}
            inside = m["key"] in labels and labels[m["key"]] in vals
            if m["setop"] == "in" and not inside:
                return False
            if m["setop"] == "notin" and inside:
                return False
        elif m["key"] not in labels:
            return False
    return True


# the fields the apiserver can select on, per resource plural (metadata.name/namespace: all)
FIELD_SELECTORS = {
    "pods": {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
             "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName"},
    "nodes": {"spec.unschedulable"},
    "secrets": {"type"},
    "namespaces": {"status.phase"},
    "events": {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
               "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
               "reason", "reportingComponent", "source", "type"},
    "replicasets": {"status.replicas"},
    "replicationcontrollers": {"status.replicas"},
    "jobs": {"status.successful"},
    "persistentvolumeclaims": set(),
    "services": {"spec.clusterIP", "spec.type"},
}


def _dotted(obj: dict, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def parse_field_selector(selector: str | None, plural: str | None = None) -> list[tuple[str, str, str]]:
    out = []
    for req in _split_selector(selector or ""):
        m = re.match(r"^\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*$", req)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid selector: '{selector}'; can't understand '{req}'")
        field = m[1]
        if plural is not None and field not in ("metadata.name", "metadata.namespace") \
                and field not in FIELD_SELECTORS.get(plural, set()):
            raise ApiError(400, "BadRequest", f"field label not supported: {field}")
        out.append((field, m[2], m[3]))
    return out


def match_field_selector(obj: dict, selector: str | None, plural: str | None = None) -> bool:
    for field, op, want in parse_field_selector(selector, plural):
        value = _dotted(obj, field)
        if field == "spec.unschedulable" or field == "spec.hostNetwork":
            value = "true" if value else "false"
        value = "" if value is None else str(value)
        if (op == "!=") == (value == want):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# quantities

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_quantity(q: Any) -> float:
    if q is None:
        return 0
    if isinstance(q, (int, float)):
        return q
    m = re.match(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([A-Za-z]*)$", str(q).strip())
    if not m or m[2] not in _SUFFIX:
        raise ValueError(f"bad quantity {q!r}")
    return float(m[1]) * _SUFFIX[m[2]]
