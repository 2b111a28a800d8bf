"""Pure builders of the Kubernetes back end: whole outputs compared, manifests schema-validated."""

from __future__ import annotations

import pytest
from kube_standin import match_field_selector, match_label_selector

from trainhub.profiles import Profile
from trainhub.spawner import k8s_manifests as m

TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def node(name, gpus=None, labels=None, taints=None, ready=True, unschedulable=False, resource="nvidia.com/gpu"):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
        "status": {"allocatable": {resource: str(gpus)} if gpus is not None else {},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(name, gpus, node_name=None, phase="Running", user=None, job=False, resource="nvidia.com/gpu", ns="ns"):
    ann = {}
    if user:
        ann[m.JOB_USER_ANNOTATION if job else m.NOTEBOOK_USER_ANNOTATION] = user
    return {
        "metadata": {"name": name, "namespace": ns, "annotations": ann},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: str(gpus)}}}],
                 **({"nodeName": node_name} if node_name else {})},
        "status": {"phase": phase},
    }


def test_profile_overrides_gpu():
    p = Profile.from_dict({"slug": "gpu-1", "display_name": "1 GPU", "gpus": 1, "cpu_limit": 8, "mem_limit": "32G",
                           "image": "img:1", "node_selector": {"gpu": "a100"}, "tolerations": [TOL]})
    assert m.profile_overrides(p) == {
        "extra_resource_limits": {"nvidia.com/gpu": "1"},
        "extra_resource_guarantees": {"nvidia.com/gpu": "1"},
        "node_selector": {"gpu": "a100"},
        "tolerations": [TOL],
        "environment": {"TRAINHUB_PROFILE": "gpu-1", "TRAINHUB_GPUS": "1"},
        "extra_labels": {m.PROFILE_LABEL: "gpu-1"},
        "extra_annotations": {m.PROFILE_ANNOTATION: "gpu-1"},
        "image": "img:1",
        "cpu_limit": 8.0,
        "mem_limit": "32G",
    }


def test_profile_overrides_mig_and_cpu():
    mig = Profile.from_dict({"slug": "mig", "gpus": 2, "gpu_resource": "nvidia.com/mig-1g.10gb"})
    assert m.profile_overrides(mig)["extra_resource_limits"] == {"nvidia.com/mig-1g.10gb": "2"}
    cpu = m.profile_overrides(Profile.from_dict({"slug": "cpu", "gpus": 0}))
    assert cpu["extra_resource_limits"] == {} and cpu["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "image" not in cpu and "cpu_limit" not in cpu


@pytest.mark.parametrize("base,over,expected", [
    ({"node_selector": {"pool": "gpu"}}, {"node_selector": {"gpu": "a100"}}, {"node_selector": {"pool": "gpu", "gpu": "a100"}}),
    ({"tolerations": [TOL]}, {"tolerations": [TOL, {"key": "x", "operator": "Exists"}]},
     {"tolerations": [TOL, {"key": "x", "operator": "Exists"}]}),
    ({"tolerations": {"b": {"key": "b"}, "a": {"key": "a"}}}, {"tolerations": [{"key": "c"}]},
     {"tolerations": [{"key": "a"}, {"key": "b"}, {"key": "c"}]}),
    ({"image": "base"}, {"image": "profile"}, {"image": "profile"}),
])
def test_merge_overrides(base, over, expected):
    assert m.merge_overrides(base, over) == expected


@pytest.mark.parametrize("spec,expected", [
    ({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}, 2),
    ({"containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
                     {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, 2),
    ({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
      "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}]}, 3),
    ({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
      "initContainers": [{"restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, 2),
    ({"containers": [{"name": "c"}]}, 0),
])
def test_pod_request(spec, expected):
    assert m.pod_request({"spec": spec}, "nvidia.com/gpu") == expected


@pytest.mark.parametrize("tolerations,taint,ok", [
    ([], {"key": "nvidia.com/gpu", "effect": "NoSchedule"}, False),
    ([TOL], {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, True),
    ([{"key": "nvidia.com/gpu", "value": "present"}], {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, True),
    ([{"key": "nvidia.com/gpu", "value": "other"}], {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, False),
    ([{"operator": "Exists"}], {"key": "anything", "effect": "NoExecute"}, True),
    ([], {"key": "soft", "effect": "PreferNoSchedule"}, True),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], {"key": "nvidia.com/gpu", "effect": "NoSchedule"}, False),
])
def test_tolerates(tolerations, taint, ok):
    assert m.tolerates(tolerations, taint) is ok


def test_gpu_availability_whole_result():
    taint = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    nodes = [
        node("a", 4, {"gpu": "a100"}, taint),
        node("b", 2, {"gpu": "a100"}, taint),
        node("c", 8, {"gpu": "h100"}, taint),  # other model
        node("d", 8, {"gpu": "a100"}, taint, ready=False),
        node("e", 8, {"gpu": "a100"}, taint, unschedulable=True),
        node("f", None, {"gpu": "a100"}),  # no GPUs
    ]
    pods = [
        pod("p1", 3, "a"), pod("p2", 1, "b"), pod("done", 4, "b", phase="Succeeded"),
        pod("pending", 1), pod("elsewhere", 2, "c"),
    ]
    avail = m.gpu_availability(nodes, pods, "nvidia.com/gpu", {"gpu": "a100"}, [TOL])
    assert avail == {
        "resource": "nvidia.com/gpu", "nodes": 2, "total": 6, "requested": 4, "free": 2, "pending": 1,
        "largest_free": 1,
        "per_node": {"a": {"allocatable": 4, "requested": 3, "free": 1}, "b": {"allocatable": 2, "requested": 1, "free": 1}},
    }
    assert m.can_place(avail, 1) and not m.can_place(avail, 2) and m.can_place(avail, 0)
    # without the toleration no tainted node is usable
    assert m.gpu_availability(nodes, pods, "nvidia.com/gpu", {"gpu": "a100"}, [])["nodes"] == 0


@pytest.mark.parametrize("value,expected", [
    ("2", 2), ("500m", 0.5), ("16Gi", 16 * 2**30), ("24730684Ki", 24730684 * 1024), ("1G", 1e9), ("128974848", 128974848),
    ("1.5", 1.5), (None, 0), ("", 0), (3, 3),
])
def test_parse_quantity(value, expected):
    assert m.parse_quantity(value) == expected


@pytest.mark.parametrize("value", ["2x", "Ki", "1.2.3", "-1"])
def test_parse_quantity_refuses(value):
    with pytest.raises(ValueError):
        m.parse_quantity(value)


@pytest.mark.parametrize("traits,expected", [
    # the guarantees are the requests
    ({"cpu_guarantee": 0.5, "cpu_limit": 4, "mem_guarantee": "1G", "mem_limit": "16G"}, {"cpu": 0.5, "memory": 2**30}),
    # limits only: Kubernetes requests the limits (the chart's old default CPU profile: 4 CPUs)
    ({"cpu_limit": 4, "mem_limit": "16G"}, {"cpu": 4.0, "memory": 16 * 2**30}),
    # KubeSpawner keeps byte specifications as numbers once configured
    ({"mem_guarantee": 1073741824}, {"memory": 2**30}),
    ({"extra_resource_limits": {"nvidia.com/gpu": "2"}, "extra_resource_guarantees": {"nvidia.com/gpu": "2"}},
     {"nvidia.com/gpu": 2}),
    ({}, {}),
])
def test_server_requests(traits, expected):
    assert m.server_requests(traits) == expected


def _sized(name, cpu, memory, gpus=None, **kw):
    n = node(name, gpus, **kw)
    n["status"]["allocatable"].update({"cpu": cpu, "memory": memory})
    return n


def test_largest_fit_judges_allocatable_not_what_is_free():
    taint = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    nodes = [_sized("small", "2", "24730684Ki"), _sized("gpu", "8", "64Gi", 4, taints=taint),
             _sized("big-but-cordoned", "64", "512Gi", unschedulable=True), _sized("big-not-ready", "64", "512Gi", ready=False)]
    cpu4 = {"cpu": 4.0, "memory": 2**30}
    assert m.largest_fit(nodes, cpu4) == {"fits": False, "nodes": 1, "largest": {"cpu": 2, "memory": 24730684 * 1024}}
    assert m.largest_fit(nodes, cpu4, tolerations=[TOL])["fits"] is True  # the GPU node may take it
    assert m.largest_fit(nodes, {"cpu": 0.5, "memory": 2**30})["fits"] is True
    assert m.largest_fit(nodes, {"nvidia.com/gpu": 8}, tolerations=[TOL]) == {
        "fits": False, "nodes": 2, "largest": {"nvidia.com/gpu": 4}}
    assert m.largest_fit([], {"cpu": 1}) == {"fits": False, "nodes": 0, "largest": {"cpu": 0.0}}


def test_describe_resources():
    assert m.describe_resources({"cpu": 4.0, "memory": 2**30}) == "4 CPUs and 1 GiB of memory"
    assert m.describe_resources({"cpu": 1, "memory": 24730684 * 1024, "nvidia.com/gpu": 2}) == \
        "1 CPU, 23.6 GiB of memory and 2 nvidia.com/gpu"


def test_gpu_availability_mig_resource():
    nodes = [node("m", 7, resource="nvidia.com/mig-1g.10gb"), node("g", 4)]
    pods = [pod("x", 2, "m", resource="nvidia.com/mig-1g.10gb")]
    avail = m.gpu_availability(nodes, pods, "nvidia.com/mig-1g.10gb")
    assert (avail["total"], avail["free"], avail["largest_free"]) == (7, 5, 5)


def test_gpu_holdings():
    pods = [
        pod("nb", 1, "a", user="alice"),
        pod("job", 2, "a", user="alice", job=True),
        pod("mig", 1, "m", user="alice", resource="nvidia.com/mig-1g.10gb"),
        pod("old", 4, "a", user="alice", phase="Failed"),
        pod("bob", 1, None, user="bob", phase="Pending"),
        pod("anon", 1, "a"),
        pod("self", 1, "a", user="carol"),
    ]
    held = m.gpu_holdings(pods, ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"], exclude=["ns/self"])
    assert dict(held) == {"alice": 4, "bob": 1}


def test_secret_env_split_and_refs():
    env = {"TRAINHUB_STORAGE_URL": "s3://b/u", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ENDPOINT_URL": "e"}
    plain, secret = m.split_secret_env(env)
    assert plain == {"TRAINHUB_STORAGE_URL": "s3://b/u", "AWS_ENDPOINT_URL": "e"}
    assert secret == {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    assert m.secret_env_refs("sec", ["AWS_ACCESS_KEY_ID"]) == {
        "AWS_ACCESS_KEY_ID": {"valueFrom": {"secretKeyRef": {"name": "sec", "key": "AWS_ACCESS_KEY_ID", "optional": False}}}}


@pytest.mark.parametrize("url,expected", [
    ("s3://bucket/prod/users/alice/", ("bucket", "prod/users/alice/")),
    ("s3://bucket", ("bucket", "")),
    ("s3://bucket/", ("bucket", "")),
])
def test_s3_bucket_prefix(url, expected):
    assert m.s3_bucket_prefix(url) == expected


def test_s3_bucket_prefix_refuses_local():
    with pytest.raises(ValueError, match="not an s3:// URL"):
        m.s3_bucket_prefix("/srv/storage")


def test_mountpoint_options():
    assert m.mountpoint_mount_options("p/u/", False, 1000, 100) == ["allow-other", "allow-delete", "prefix p/u/", "uid=1000", "gid=100"]
    assert m.mountpoint_mount_options("p/d/", True, None, None, endpoint_url="https://x") == [
        "allow-other", "read-only", "prefix p/d/", "endpoint-url https://x"]


@pytest.mark.parametrize("parts,expected", [
    (("trainhub", "ns", "alice", "home"), "trainhub-ns-alice-home"),
])
def test_k8s_name_plain(parts, expected):
    assert m.k8s_name(*parts) == expected


def test_k8s_name_keeps_distinct_inputs_distinct():
    a, b = m.k8s_name("trainhub", "alice@x.org"), m.k8s_name("trainhub", "alice-x-org")
    assert a != b and a.startswith("trainhub-alice-x-org-")
    long = m.k8s_name("trainhub", "x" * 100)
    assert len(long) <= 63


def test_storage_manifests_validate(validate_k8s):
    pv = m.make_csi_pv("trainhub-ns-alice-home", driver="s3.csi.aws.com", volume_handle="h", claim_namespace="ns",
                       claim_name="trainhub-home-alice", volume_attributes={"bucketName": "b"},
                       mount_options=m.mountpoint_mount_options("u/", False, 1000, 100),
                       node_publish_secret=("ns", "sec"))
    pvc = m.make_bound_pvc("trainhub-home-alice", "ns", "trainhub-ns-alice-home")
    ro_pv = m.make_csi_pv("ds", driver="s3.csi.aws.com", volume_handle="ds", claim_namespace="ns",
                          claim_name="trainhub-datasets", read_only=True)
    secret = m.make_storage_secret("sec", "ns", {"AWS_ACCESS_KEY_ID": "k"})
    for obj in (pv, pvc, ro_pv, secret):
        validate_k8s(obj)
    assert ro_pv["spec"]["accessModes"] == ["ReadOnlyMany"] and ro_pv["spec"]["csi"]["readOnly"] is True


def test_fuse_sidecar_pod_validates(validate_k8s):
    frag = m.fuse_sidecar_pod_storage(image="rclone/rclone:1.68", home_url="s3://b/p/users/alice",
                                      datasets_url="s3://b/p/datasets", mount_root="/mnt/trainhub", secret_name="sec",
                                      endpoint_url="https://rgw")
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {
            "initContainers": frag["init_containers"],
            "containers": [{"name": "notebook", "image": "img", "volumeMounts": frag["volume_mounts"]}],
            "volumes": frag["volumes"],
        },
    }
    validate_k8s(pod)
    home = frag["init_containers"][0]
    assert home["command"][:2] == ["sh", "-c"]
    assert "rclone mount :s3:b/p/users/alice /mnt/trainhub/home" in home["command"][2]
    assert "--s3-endpoint https://rgw" in home["command"][2]


@pytest.mark.parametrize("labels,selector,ok", [
    ({"a": "1"}, "a=1", True),
    ({"a": "1"}, "a==1,b", False),
    ({"a": "1", "b": "x"}, "a in (1, 2),b", True),
    ({"a": "3"}, "a notin (1,2)", True),
    ({"a": "1"}, "!a", False),
    ({}, "a!=1", True),
    ({"a": "1"}, "", True),
])
def test_standin_label_selector(labels, selector, ok):
    assert match_label_selector(labels, selector) is ok


def test_standin_field_selector():
    obj = {"metadata": {"name": "x"}, "status": {"phase": "Running"}}
    assert match_field_selector(obj, "metadata.name=x,status.phase!=Succeeded")
    assert not match_field_selector(obj, "status.phase=Pending")
