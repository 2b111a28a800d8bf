"""The Helm chart, with the real helm (v4.1.4, ``tools/get-helm.sh``) and the vendored Zero to
JupyterHub chart 4.4.0 (``helm/trainhub/charts/``, as ``helm dependency update`` leaves it).

Checked: ``helm lint --strict`` and ``helm template`` of values.yaml and every example for the
lowest and the highest Kubernetes the chart supports (1.29: Chart.yaml's kubeVersion; 1.37: the
newest schemas kubernetes-validate carries, the chart has no upper bound), every rendered object
strict-valid for that version (the Kueue LocalQueue is a CRD without a bundled schema: checked
by shape); a Kubernetes below the floor is refused; the vendored dependency matches Chart.lock.
Without helm: Chart.yaml and its dependency; values.schema.json is valid draft-07; values.yaml
and every example (merged over values.yaml as helm merges) pass it and bad values fail it; the
hub extraConfig snippet, run against the JSON the ConfigMap carries, sets known traits to
allowed values and yields valid profiles; scopes and roles match trainhub.hub_config.scopes;
templates only reference values that exist; the launcher Role's rules are least privilege
(from the template text and from the rendered objects).

The chart's RBAC applied to a real API server and exercised as the chart's ServiceAccounts:
``test_chart_rbac_controlplane.py``. Installing the chart (pods running the images) is left to
``.github/workflows/k3s-e2e.yml``.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from kube_tools import CHART, CRD_KINDS, EXAMPLES, KUBE_HIGHEST, KUBE_LOWEST, helm, render_chart
from traitlets.config import Config


def load_yaml(path: Path):
    with open(path) as f:
        return yaml.safe_load(f)


def helm_merge(base, override):
    """Helm's values merge: maps merge recursively, anything else (lists too) is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = helm_merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(override)


@pytest.fixture(scope="module")
def schema():
    return json.loads((CHART / "values.schema.json").read_text())


@pytest.fixture(scope="module")
def values():
    return load_yaml(CHART / "values.yaml")


def config_json(values: dict) -> dict:
    """What templates/_helpers.tpl's trainhub.configJson puts in the ConfigMap."""
    t = values["trainhub"]
    drop = {"jobs": ("resources", "nodeSelector", "tolerations", "persistence"), "culler": ("resources",)}
    out = {k: t.get(k) for k in ("profiles", "defaultProfile", "cpuProfile", "quotas", "spawner", "storage", "kueue", "metrics", "publicUrl")}
    for k, omit in drop.items():
        out[k] = {kk: vv for kk, vv in t[k].items() if kk not in omit}
    out["jobNamespace"] = t["jobs"].get("jobNamespace") or "trainhub"
    return json.loads(json.dumps(out))  # as JSON would carry it


def services_config_py() -> str:
    """configmap.yaml's services_config.py: the --config file of the jobs service and the culler."""
    text = (CHART / "templates" / "configmap.yaml").read_text()
    block = text.split("services_config.py: |\n", 1)[1]
    lines = [ln[4:] if ln.startswith("    ") else ln for ln in block.splitlines()]
    assert "{{" not in block  # plain Python, no template expressions
    return "\n".join(lines) + "\n"


def test_chart_yaml_depends_on_zero_to_jupyterhub_4():
    chart = load_yaml(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2" and chart["name"] == "trainhub"
    assert re.match(r"^\d+\.\d+\.\d+$", chart["version"])
    (dep,) = chart["dependencies"]
    assert dep["name"] == "jupyterhub"
    assert dep["repository"] == "https://hub.jupyter.org/helm-chart/"
    low, high = re.match(r"^>=(\S+) <(\S+)$", dep["version"]).groups()
    assert low.startswith("4.") and high.startswith("5.")


def test_schema_is_draft7(schema):
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)


def test_values_yaml_validates(schema, values):
    jsonschema.validate(values, schema, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(schema, values, example):
    merged = helm_merge(values, load_yaml(example))
    jsonschema.validate(merged, schema, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("path,value,fragment", [
    (("profiles", 0, "slug"), "GPU_1", "does not match"),
    (("profiles", 0, "gpus"), -1, "less than the minimum"),
    (("profiles", 0, "colour"), "red", "Additional properties"),
    (("storage", "mount"), "nfs", "is not one of"),
    (("storage", "mount"), "csi", "is too short"),  # csi needs storage.url
    (("quotas", "userGpuLimit"), "four", "is not of type"),
    (("jobs", "replicas"), 2, "greater than the maximum"),
])
def test_bad_values_fail(schema, values, path, value, fragment):
    bad = copy.deepcopy(values)
    cur = bad["trainhub"]
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=fragment):
        jsonschema.validate(bad, schema, cls=jsonschema.Draft7Validator)


def run_extra_config(values: dict, tmp_path, monkeypatch) -> Config:
    path = tmp_path / "trainhub.json"
    path.write_text(json.dumps(config_json(values)))
    monkeypatch.setenv("TRAINHUB_K8S_CONFIG", str(path))
    monkeypatch.setenv("TRAINHUB_JOBS_API_TOKEN", "jobs-token")
    monkeypatch.setenv("TRAINHUB_CULLER_API_TOKEN", "culler-token")
    c = Config()
    for name, snippet in values["jupyterhub"]["hub"]["extraConfig"].items():
        exec(compile(snippet, f"extraConfig.{name}", "exec"), {"c": c})
    return c


@pytest.mark.parametrize("example", [None] + EXAMPLES, ids=lambda p: p.name if p else "values.yaml")
def test_hub_extra_config_sets_known_traits(values, example, tmp_path, monkeypatch):
    from traitlets import Enum

    from trainhub.profiles import ProfileCatalog
    from trainhub.quotas import QuotaPolicy
    from trainhub.spawner.kubernetes import GPUKubeSpawner
    from trainhub.storage import StorageConfig

    merged = helm_merge(values, load_yaml(example)) if example else values
    c = run_extra_config(merged, tmp_path, monkeypatch)
    assert c.JupyterHub.spawner_class == "trainhub.spawner.kubernetes.GPUKubeSpawner"
    catalog = ProfileCatalog(config=c)  # validates every profile (Profile.from_dict)
    assert [p.slug for p in catalog.all()] == [p["slug"] for p in merged["trainhub"]["profiles"]]
    QuotaPolicy(config=c)
    StorageConfig(config=c)
    traits = GPUKubeSpawner.class_traits(config=True)
    for name, value in c.GPUKubeSpawner.items():
        assert name in traits, f"c.GPUKubeSpawner.{name} is not a configurable trait"
        if isinstance(traits[name], Enum):
            assert value in traits[name].values
    services = {s["name"]: s for s in c.JupyterHub.services.to_dict().get("extend", [])} if hasattr(
        c.JupyterHub.services, "to_dict") else {s["name"]: s for s in c.JupyterHub.services}
    if merged["trainhub"]["jobs"]["enabled"]:
        assert services["trainhub"]["url"] == "http://trainhub-jobs:8080"
        assert services["trainhub"]["api_token"] == "jobs-token"
        # notebook pods reach the jobs API (in the hub's namespace) and the notebook NetworkPolicy lets them
        assert re.fullmatch(r"http://trainhub-jobs\.[a-z0-9-]+\.svc:8080/services/trainhub/api", c.GPUKubeSpawner.api_url)
        egress = merged["jupyterhub"]["singleuser"]["networkPolicy"]["egress"]
        assert any(rule["to"][0]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "jobs"
                   and rule["ports"][0]["port"] == merged["trainhub"]["jobs"]["port"] for rule in egress)
    assert c.GPUKubeSpawner.kernel_config_map == "trainhub-kernel-config"
    assert ("trainhub-culler" in services) == merged["trainhub"]["culler"]["enabled"]
    storage = merged["trainhub"]["storage"]
    if storage["url"]:
        # the hub mints users' credentials as the jobs service does (one mapping: chart_config.storage_config)
        from trainhub.app.chart_config import config_from_chart
        from trainhub.boundary.credentials import CredentialMinter

        services_config = config_from_chart(config_json(merged))
        for config in (c, services_config):
            minter, store = CredentialMinter(config=config), StorageConfig(config=config)
            assert minter.per_user_roles == bool(storage["credentials"]["perUserRoles"])
            assert minter.role_arn == storage["credentials"]["roleArn"]
            assert store.share_platform_credentials == bool(storage["credentials"]["sharePlatformKey"])
            assert minter.configured or store.share_platform_credentials or storage["secret"] != "managed", \
                f"{example}: S3 storage with managed Secrets and nothing to mint users' credentials: every start is refused"
    if merged["trainhub"]["kueue"]["enabled"] and merged["trainhub"]["kueue"]["manageNotebooks"]:
        assert c.GPUKubeSpawner.check_gpu_availability is False


def _lazy_list(value) -> list:
    return value.to_dict().get("extend", []) if hasattr(value, "to_dict") else list(value)


@pytest.mark.parametrize("example", [None] + EXAMPLES, ids=lambda p: p.name if p else "values.yaml")
@pytest.mark.parametrize("culler", [False, True])
def test_roles_name_only_services_that_are_on(values, example, culler, tmp_path, monkeypatch):
    """JupyterHub refuses to start ("Found undefined service trainhub-culler in role trainhub-culler-service") when a
    role names a service it does not have: the services' roles come with the services, from extraConfig."""
    from trainhub.hub_config import scopes
    from trainhub.services.culler import HUB_SCOPES

    merged = helm_merge(values, load_yaml(example)) if example else copy.deepcopy(values)
    merged["trainhub"]["culler"]["enabled"] = culler
    c = run_extra_config(merged, tmp_path, monkeypatch)
    services = {s["name"] for s in _lazy_list(c.JupyterHub.services)}
    roles = {r["name"]: r for r in _lazy_list(c.JupyterHub.load_roles)}
    roles.update({name: {"name": name, **r} for name, r in merged["jupyterhub"]["hub"]["loadRoles"].items()})
    for role in roles.values():
        assert set(role.get("services") or []) <= services, f"role {role['name']} names a service that is off"
    assert ("trainhub-culler" in services) == culler
    if culler:
        assert roles["trainhub-culler-service"]["services"] == ["trainhub-culler"]
        assert sorted(roles["trainhub-culler-service"]["scopes"]) == sorted(HUB_SCOPES)
    if merged["trainhub"]["jobs"]["enabled"]:
        assert roles["trainhub-jobs-service"] == scopes.service_role("trainhub")
        assert roles["trainhub-jobs-service"]["scopes"] == scopes.JOBS_SERVICE_SCOPES
    # a notebook server's token can reach the jobs API (%%train) for its owner only
    assert list(c.Spawner.server_token_scopes) == scopes.SERVER_TOKEN_SCOPES


def test_scopes_and_roles_match_hub_config(values):
    from trainhub.hub_config import scopes

    hub = values["jupyterhub"]["hub"]
    assert hub["config"]["JupyterHub"]["custom_scopes"] == scopes.CUSTOM_SCOPES
    roles = hub["loadRoles"]
    assert roles["user"]["scopes"] == scopes.USER_SCOPES
    assert roles["trainhub-admin"]["scopes"] == scopes.ADMIN_EXTRA_SCOPES
    # the services' own roles are not in the values: extraConfig adds them with the services
    assert not [name for name, role in roles.items() if role.get("services")]
    for role in roles.values():
        for scope in role["scopes"]:
            base = scope.split("!")[0]
            if base.startswith("custom:"):
                assert base in scopes.CUSTOM_SCOPES, f"{scope} is not defined in custom_scopes"


def _values_paths(text: str) -> set[tuple[str, ...]]:
    aliases = {m[1]: m[2] for m in re.finditer(r"\$(\w+) := \.Values\.([\w.]+)", text)}
    paths = {tuple(m.split(".")) for m in re.findall(r"\.Values\.([\w.]+)", text)}
    for name, target in aliases.items():
        for m in re.findall(rf"\${name}\.([\w.]+)", text):
            paths.add(tuple(target.split(".")) + tuple(m.split(".")))
    return paths


@pytest.mark.parametrize("template", sorted((CHART / "templates").glob("*")), ids=lambda p: p.name)
def test_templates_reference_existing_values(values, template):
    for path in _values_paths(template.read_text()):
        cur = values
        for part in path:
            assert isinstance(cur, dict) and part in cur, f"{template.name}: .Values.{'.'.join(path)} is not in values.yaml"
            cur = cur[part]


def _static_rules(template: Path, drop_blocks: str) -> list[dict]:
    """The rules of the first Role in a template, with `{{ if ... <drop_blocks> }}` blocks cut out."""
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", template.read_text(), flags=re.S)
    text = re.sub(r"\{\{-? if [^}]*" + drop_blocks + r"[^}]*\}\}.*?\{\{-? end \}\}", "", text, flags=re.S)
    doc = text.split("\n---")[0]
    lines = [ln for ln in doc.splitlines() if "{{" not in ln]
    return yaml.safe_load("\n".join(lines))["rules"]


def test_launcher_role_is_least_privilege():
    rules = _static_rules(CHART / "templates" / "launcher-rbac.yaml", "kueue")
    granted = {(g, r): sorted(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {
        ("batch", "jobs"): ["create", "delete", "get", "list", "watch"],
        ("", "pods"): ["get", "list", "watch"],
        ("", "pods/log"): ["get"],
        ("", "services"): ["create", "delete", "get", "list"],
        ("", "secrets"): ["create", "patch"],  # each attempt's credentials, minted again: never read
    }
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", (CHART / "templates" / "launcher-rbac.yaml").read_text(), flags=re.S)
    assert "kind: Role\n" in text and "ClusterRole" not in text
    assert '"*"' not in text and "pods/exec" not in text
    # with Kueue on, the only addition is reading Workloads
    kueue = re.search(r"\{\{- if [^}]*kueue[^}]*\}\}(.*?)\{\{- end \}\}", text, flags=re.S)[1]
    assert yaml.safe_load(kueue) == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]}]


def test_hub_extra_rbac_rules():
    rules = _static_rules(CHART / "templates" / "hub-rbac.yaml", r"(gpuWatchAllNamespaces|csi|manageNotebooks)")
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    # with Kueue managing notebooks, the hub reads Workloads for Kueue's reason (spawn progress)
    text = (CHART / "templates" / "hub-rbac.yaml").read_text()
    kueue = re.search(r"\{\{- if [^}]*manageNotebooks[^}]*\}\}(.*?)\{\{- end \}\}", text, flags=re.S)[1]
    assert yaml.safe_load(kueue) == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list"]}]


# ---------------------------------------------------------------------------------------------
# with the real helm

VALUES_CASES = [None] + EXAMPLES
KUBE_VERSIONS = [KUBE_LOWEST, KUBE_HIGHEST]


def _case_id(p):
    return p.name if p else "values.yaml"


def test_vendored_dependency_matches_chart_lock():
    import hashlib
    import tarfile

    lock = load_yaml(CHART / "Chart.lock")
    (dep,) = lock["dependencies"]
    assert (dep["name"], dep["repository"]) == ("jupyterhub", "https://hub.jupyter.org/helm-chart/")
    package = CHART / "charts" / f"jupyterhub-{dep['version']}.tgz"
    assert sorted(p.name for p in (CHART / "charts").iterdir()) == [package.name]
    with tarfile.open(package) as tar:
        inner = yaml.safe_load(tar.extractfile("jupyterhub/Chart.yaml"))
    assert inner["version"] == dep["version"] == "4.4.0" and inner["appVersion"] == "5.5.0"
    assert inner["kubeVersion"] == ">=1.28.0-0"
    assert hashlib.sha256(package.read_bytes()).hexdigest() == \
        "f4fd87eb723ef6d8a33feaefd926de3a06e5d2a9530b8e6ddfae96b5e0667bea"
    listing = helm("dependency", "list", str(CHART)).stdout
    assert re.search(r"^jupyterhub\s.*\sok\s*$", listing, flags=re.M), listing


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("example", VALUES_CASES, ids=_case_id)
def test_helm_lint_strict(example, kube_version):
    args = ["lint", "--strict", str(CHART), "--kube-version", kube_version]
    if example:
        args += ["-f", str(example)]
    out = helm(*args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[ERROR]" not in out and "[WARNING]" not in out, out


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("example", VALUES_CASES, ids=_case_id)
def test_every_rendered_object_is_strict_valid(example, kube_version):
    import kubernetes_validate

    objects = render_chart(example, kube_version)
    kinds = {(o["apiVersion"], o["kind"]) for o in objects}
    # the chart's own pieces and Z2JH's hub, proxy and scheduler are there
    assert {("apps/v1", "Deployment"), ("v1", "ConfigMap"), ("rbac.authorization.k8s.io/v1", "Role"),
            ("v1", "ServiceAccount")} <= kinds
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("Deployment", "hub"), ("Deployment", "proxy"), ("ConfigMap", "trainhub-config")} <= names
    errors = []
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            assert set(obj) == {"apiVersion", "kind", "metadata", "spec"} and obj["spec"]["clusterQueue"]
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")
    assert not errors, "\n".join(errors)
    assert len(objects) >= 29


def test_rendered_kernel_config_map_is_the_file_a_kernel_loads():
    objects = render_chart(None, KUBE_LOWEST)
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "trainhub-kernel-config"]
    assert cm["data"]["ipython_kernel_config.py"] == (CHART / "files" / "ipython_kernel_config.py").read_text()


def test_render_counts_and_the_kubernetes_floor():
    total = sum(len(render_chart(e, v)) for e in VALUES_CASES for v in KUBE_VERSIONS)
    assert total == 2 * sum(len(render_chart(e, KUBE_LOWEST)) for e in VALUES_CASES)
    refused = helm("template", "trainhub", str(CHART), "--kube-version", "1.28.15", check=False)
    assert refused.returncode != 0
    assert "incompatible with Kubernetes v1.28.15" in refused.stderr


def test_rendered_launcher_role_is_least_privilege():
    objects = render_chart(None, KUBE_HIGHEST)
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("launcher")]
    assert len(roles) == 1, [o["metadata"]["name"] for o in objects if o["kind"] == "Role"]
    granted = {(g, r): sorted(rule["verbs"]) for rule in roles[0]["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {
        ("batch", "jobs"): ["create", "delete", "get", "list", "watch"],
        ("", "pods"): ["get", "list", "watch"],
        ("", "pods/log"): ["get"],
        ("", "services"): ["create", "delete", "get", "list"],
        ("", "secrets"): ["create", "patch"],  # each attempt's credentials, minted again: never read
    }
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")
                and "launcher" in o["metadata"]["name"]]
