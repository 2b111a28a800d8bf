"""GPUKubeSpawner end to end over HTTP: the real KubeSpawner and kubernetes-asyncio client
against the API stand-in (or a real cluster with TRAINHUB_TEST_KUBECONFIG)."""

from __future__ import annotations

import asyncio
import json

import pytest
from k8s_test_config import MIG, NAMESPACE, MintingHook, secret_text, spawner_config
from tornado.web import HTTPError

from trainhub.spawner import k8s_manifests as m

standin_only = pytest.mark.skipif(
    __import__("os").environ.get("TRAINHUB_TEST_KUBECONFIG", "") != "",
    reason="needs the stand-in's fake nodes or storage mounts that a bare cluster lacks",
)

PLATFORM_S3 = {  # S3 storage with the platform's key, and nothing that makes users' own credentials
    "StorageConfig__url": "s3://trainhub-bucket/prod",
    "StorageConfig__key": "AKIAEXAMPLEKEY",
    "StorageConfig__secret": "s3cr3t-do-not-leak",
    "StorageConfig__endpoint_url": "https://rgw.example.org",
}

S3 = {**PLATFORM_S3, "StorageConfig__user_credentials_hook": MintingHook()}


def assert_own_credentials(pod: dict, container: dict, secret: dict, user: str, secret_name: str) -> dict:
    """The pod has its user's own credentials and nothing else: the Secret mounted read-only (a volume, no subPath),
    the variables pointing at its config, no AWS key in the spec or the environment, the platform's key nowhere.
    Returns the credentials the Secret holds."""
    env = _env(container)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
    assert env["AWS_CONFIG_FILE"]["value"] == "/run/trainhub/credentials/config"
    assert env["AWS_SDK_LOAD_CONFIG"]["value"] == "1" and env["AWS_EC2_METADATA_DISABLED"]["value"] == "true"
    assert json.loads(env["TRAINHUB_STORAGE_OPTIONS"]["value"]) == {"endpoint_url": "https://rgw.example.org"}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["trainhub-credentials"]["secret"]["secretName"] == secret_name
    mount = next(v for v in container["volumeMounts"] if v["name"] == "trainhub-credentials")
    assert mount["mountPath"] == "/run/trainhub/credentials" and mount["readOnly"] is True and not mount.get("subPath")
    data = secret_text(secret)
    assert set(data) == {"credentials.json", "config"}
    assert "credential_process = /bin/cat /run/trainhub/credentials/credentials.json" in data["config"]
    assert "endpoint_url = https://rgw.example.org" in data["config"]
    creds = json.loads(data["credentials.json"])
    assert creds["AccessKeyId"].startswith(f"ASIA{user.upper().replace('-', '')}") and creds["Version"] == 1
    for where in (json.dumps(pod), json.dumps(secret), json.dumps(data)):
        assert "s3cr3t-do-not-leak" not in where and "AKIAEXAMPLEKEY" not in where
    assert creds["SecretAccessKey"] not in json.dumps(pod)
    # and no way around it: the pod holds no API token with which to read another user's Secret
    assert pod["spec"].get("automountServiceAccountToken") is False
    return creds


def _main_container(pod: dict) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "notebook")


def _env(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env") or []}


async def test_gpu_profile_spawn_creates_pod_with_limits_selector_storage(make_spawner, cluster, validate_k8s):
    config = spawner_config(**S3, GPUKubeSpawner__storage_mount="csi" if not cluster.real else "none")
    spawner = make_spawner("alice", options={"profile": "gpu-1"}, config=config)

    url = await spawner.start()
    assert url.startswith("http://")
    pods = await cluster.pods()
    pod = pods[spawner.pod_name]
    manifest = validate_k8s(await spawner.get_pod_manifest())
    container = _main_container(pod)

    assert container["resources"]["limits"]["nvidia.com/gpu"] in ("1", 1)
    assert container["resources"]["requests"]["nvidia.com/gpu"] in ("1", 1)
    assert container["resources"]["limits"]["cpu"] in ("4", 4, "4.0")
    assert pod["spec"]["nodeSelector"] == {"trainhub.io/gpu-type": "a100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert pod["metadata"]["annotations"][m.PROFILE_ANNOTATION] == "gpu-1"

    env = _env(container)
    assert env["TRAINHUB_STORAGE_URL"]["value"] == "s3://trainhub-bucket/prod/users/alice"
    assert env["TRAINHUB_DATASETS_URL"]["value"] == "s3://trainhub-bucket/prod/datasets"
    assert env["TRAINHUB_PROFILE"]["value"] == "gpu-1"
    secret_name = spawner.storage_secret_name()
    secret = await cluster.read("secret", secret_name)
    assert secret is not None
    assert_own_credentials(pod, container, secret, "alice", secret_name)
    if not cluster.real:
        assert pod["spec"]["nodeName"] in ("gpu-a", "gpu-b")
        assert pod["status"]["phase"] == "Running"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        home_claim = volumes["trainhub-home"]["persistentVolumeClaim"]["claimName"]
        assert volumes["trainhub-datasets"]["persistentVolumeClaim"] == {"claimName": "trainhub-datasets", "readOnly": True}
        mounts = {v["name"]: v for v in container["volumeMounts"]}
        assert mounts["trainhub-datasets"] == {"name": "trainhub-datasets", "mountPath": "/mnt/trainhub/datasets", "readOnly": True}
        assert env["TRAINHUB_STORAGE_PATH"]["value"] == "/mnt/trainhub/home"
        pvc = await cluster.read("pvc", home_claim)
        pv = await cluster.read("pv", pvc["spec"]["volumeName"])
        assert pv["spec"]["csi"]["driver"] == "s3.csi.aws.com"
        assert pv["spec"]["csi"]["volumeAttributes"] == {"bucketName": "trainhub-bucket"}
        assert "prefix prod/users/alice/" in pv["spec"]["mountOptions"]
        # pre-bound to the claim; the PV controller completes the binding (claim's uid, Bound)
        claim_ref = pv["spec"]["claimRef"]
        assert {k: claim_ref[k] for k in ("namespace", "name")} == {"namespace": NAMESPACE, "name": home_claim}
        assert claim_ref["uid"] == pvc["metadata"]["uid"] and pvc["status"]["phase"] == "Bound"
        ds_pv = await cluster.read("pv", (await cluster.read("pvc", "trainhub-datasets"))["spec"]["volumeName"])
        assert "read-only" in ds_pv["spec"]["mountOptions"] and ds_pv["spec"]["csi"]["readOnly"] is True
        for obj in spawner.storage_manifests():
            validate_k8s(obj)
    assert manifest["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

    await spawner.stop()
    await cluster.wait_for_cache(lambda pods: f"{NAMESPACE}/{spawner.pod_name}" not in pods)


async def test_notebook_pods_get_a_memory_backed_dev_shm(make_spawner, cluster, validate_k8s):
    """PyTorch DataLoader workers outgrow the runtime's 64 MiB /dev/shm ("bus error"): 1Gi by default, with
    the storage mounts (CSI here) and on the real apiserver too; empty turns it off."""
    config = spawner_config(**S3, GPUKubeSpawner__storage_mount="csi" if not cluster.real else "none")
    spawner = make_spawner("shm-ann", options={"profile": "gpu-1"}, config=config)
    await spawner.start()
    pod = (await cluster.pods())[spawner.pod_name]
    validate_k8s(await spawner.get_pod_manifest())
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and volumes["dshm"]["emptyDir"]["sizeLimit"] == "1Gi"
    mounts = {v["mountPath"]: v["name"] for v in _main_container(pod)["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"
    if not cluster.real:
        assert "trainhub-home" in volumes  # next to the storage mounts, not instead of them
    await spawner.stop()
    off = make_spawner("shm-bo", config=spawner_config(GPUKubeSpawner__shm_size=""))
    off.apply_profile(off.resolve_profile({}))
    manifest = validate_k8s(await off.get_pod_manifest())
    assert "/dev/shm" not in json.dumps(manifest)


@pytest.mark.parametrize("mount", ["fuse-sidecar", "none"])
async def test_the_storage_area_is_linked_into_the_home_by_a_post_start_hook(make_spawner, cluster, validate_k8s, mount,
                                                                               tmp_path):
    """JupyterLab shows the storage mount (where notebook jobs put their outputs) as ~/storage: the notebook
    container's postStart hook, run here for real with sh, links it unless the user keeps something by that name, and
    exits 0 either way (a failed postStart hook kills the container). No mount, no hook; an admin's own hook wins."""
    import subprocess

    spawner = make_spawner(f"link-{mount[:4]}", options={"profile": "cpu"},
                           config=spawner_config(**S3, GPUKubeSpawner__storage_mount=mount))
    await spawner.start()
    container = _main_container((await cluster.pods())[spawner.pod_name])
    validate_k8s(await spawner.get_pod_manifest())
    await spawner.stop()
    if mount == "none":
        assert "postStart" not in (container.get("lifecycle") or {})
        return
    command = container["lifecycle"]["postStart"]["exec"]["command"]
    home = tmp_path / "home"
    home.mkdir()
    for _ in range(2):  # again at the next start: the link is there already
        assert subprocess.run(command, env={"HOME": str(home), "PATH": "/usr/bin:/bin"}).returncode == 0
        assert (home / "storage").is_symlink() and str((home / "storage").readlink()) == "/mnt/trainhub/home"
    (home / "storage").unlink()
    (home / "storage").mkdir()  # the user's own folder by that name is kept
    assert subprocess.run(command, env={"HOME": str(home), "PATH": "/usr/bin:/bin"}).returncode == 0
    assert (home / "storage").is_dir() and not (home / "storage").is_symlink()
    own = {"postStart": {"exec": {"command": ["true"]}}}
    admin = make_spawner("link-admin", config=spawner_config(**S3, GPUKubeSpawner__storage_mount=mount,
                                                             KubeSpawner__lifecycle_hooks=own))
    admin.apply_profile(admin.resolve_profile({}))
    manifest = validate_k8s(await admin.get_pod_manifest())
    assert manifest["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]["command"] == ["true"]


async def test_notebook_pods_know_the_jobs_api_and_load_train(make_spawner, cluster, validate_k8s):
    """%%train in a notebook pod needs $TRAINHUB_API_URL and the kernel config that loads the magics (the chart's
    trainhub-kernel-config ConfigMap at IPython's system path); without them neither appears."""
    url = "http://trainhub-jobs.trainhub.svc:8080/services/trainhub/api"
    spawner = make_spawner("api-ann", options={"profile": "gpu-1"}, config=spawner_config(
        GPUKubeSpawner__api_url=url, GPUKubeSpawner__kernel_config_map="trainhub-kernel-config"))
    await spawner.start()
    pod = (await cluster.pods())[spawner.pod_name]
    validate_k8s(await spawner.get_pod_manifest())
    container = _main_container(pod)
    assert _env(container)["TRAINHUB_API_URL"]["value"] == url
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["trainhub-kernel-config"]["configMap"]["name"] == "trainhub-kernel-config"
    mount = next(v for v in container["volumeMounts"] if v["name"] == "trainhub-kernel-config")
    assert (mount["mountPath"], mount["subPath"], mount["readOnly"]) == (m.KERNEL_CONFIG_PATH, "ipython_kernel_config.py", True)
    await spawner.stop()
    bare = make_spawner("api-bo")
    bare.apply_profile(bare.resolve_profile({}))
    manifest = json.dumps(validate_k8s(await bare.get_pod_manifest()))
    assert "TRAINHUB_API_URL" not in manifest and "ipython_kernel_config" not in manifest


async def until_absent(cluster, owned, timeout=30.0):
    """Deleted objects gone for good (a claim's finalizer is removed by the controller-manager), so they can be made again."""
    deadline = asyncio.get_running_loop().time() + timeout
    while any([await cluster.read(kind, name) is not None for kind, name in owned]):
        assert asyncio.get_running_loop().time() < deadline, "objects still there"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("policy", ["user-deleted", "server-stopped", "never"])
async def test_per_user_storage_objects_follow_the_cleanup_policy(make_spawner, cluster, policy):
    """The home PV (Retain: only the pointer goes, never the files) and claim and the managed Secret go when the user
    is deleted (delete_forever), or at each stop with "server-stopped"; "never" keeps them; the shared datasets
    volume stays in every case. On the real apiserver too (objects made without a pod)."""
    user = f"vol-{policy.split('-')[0]}"
    spawner = make_spawner(user, options={"profile": "cpu"}, config=spawner_config(
        **S3, GPUKubeSpawner__storage_mount="csi", GPUKubeSpawner__storage_volume_cleanup=policy))
    spawner.apply_profile(spawner.resolve_profile({"profile": "cpu"}))
    await spawner.ensure_storage_objects()
    names = spawner._storage_names()
    owned = [("pvc", names["home_pvc"]), ("pv", names["home_pv"]), ("secret", spawner.storage_secret_name())]

    async def present() -> list[bool]:  # (a claim being deleted waits for the pvc-protection finalizer)
        objs = [await cluster.read(kind, name) for kind, name in owned]
        return [o is not None and not o["metadata"].get("deletionTimestamp") for o in objs]

    assert await present() == [True] * 3
    await spawner.stop()  # (no pod: KubeSpawner's stop is a no-op delete)
    assert await present() == [policy != "server-stopped"] * 3
    if policy == "server-stopped":
        await until_absent(cluster, owned)
    await spawner.ensure_storage_objects()
    assert await present() == [True] * 3
    await spawner.delete_forever()
    assert await present() == [policy == "never"] * 3
    assert await cluster.read("pvc", names["datasets_pvc"]) is not None  # shared: never removed
    if policy == "never":
        await spawner.remove_user_storage_objects()


async def test_mig_profile_uses_its_resource_name(make_spawner, cluster, validate_k8s):
    spawner = make_spawner("bob", options={"profile": "mig-small"})
    await spawner.start()
    pod = (await cluster.pods())[spawner.pod_name]
    limits = _main_container(pod)["resources"]["limits"]
    assert limits[MIG] in ("1", 1)
    assert "nvidia.com/gpu" not in limits
    validate_k8s(await spawner.get_pod_manifest())


async def test_cpu_profile_hides_gpus(make_spawner, cluster, validate_k8s):
    spawner = make_spawner("carol")  # no profile: the default ("cpu")
    await spawner.start()
    pod = (await cluster.pods())[spawner.pod_name]
    container = _main_container(pod)
    assert not any("nvidia.com" in k for k in (container["resources"].get("limits") or {}))
    assert _env(container)["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    validate_k8s(await spawner.get_pod_manifest())


@pytest.mark.parametrize(
    "user,groups,options,status,fragment",
    [
        ("dave", (), {"profile": "no-such"}, 400, "Unknown profile 'no-such'"),
        ("dave", (), {"profile": 3}, 400, "must be a string"),
        ("dave", ("students",), {"profile": "staff-gpu"}, 403, "limited to the groups staff"),
        # 8 GPUs on one node: none has more than 4, so it could never start (not "busy now")
        ("dave", (), {"profile": "gpu-8"}, 400, "needs 8 nvidia.com/gpu for each server, and no node can hold that"),
        ("dave", (), {"profile": "huge-cpu"}, 400, "needs 64 CPUs for each server, and no node can hold that: the most "
                                                   "any node it may use offers is 32 CPUs"),
    ],
)
async def test_refused_before_any_pod(make_spawner, cluster, user, groups, options, status, fragment):
    before = set(await cluster.pods())
    spawner = make_spawner(user, groups=groups, options=options)
    with pytest.raises(HTTPError) as err:
        await spawner.start()
    assert err.value.status_code == status
    assert fragment in (err.value.log_message % err.value.args)
    assert set(await cluster.pods()) == before


@pytest.mark.parametrize(
    "user,groups,options,config,status,reason,kind",
    [
        ("dave", (), {"profile": "no-such"}, {}, 400, "profile", "UnknownProfile"),
        ("dave", (), {"profile": 3}, {}, 400, "invalid", "InvalidRequest"),
        ("dave", ("students",), {"profile": "staff-gpu"}, {}, 403, "profile", "ProfileNotAllowed"),
        ("dave", (), {"profile": "gpu-1"}, {"QuotaPolicy__user_gpu_limit": 0}, 403, "quota", "QuotaExceeded"),
        ("dave", (), {"profile": "gpu-8"}, {}, 400, "capacity", "ProfileDoesNotFit"),
        # without the fit check (an autoscaler may add nodes) the GPU availability check refuses it for now
        ("dave", (), {"profile": "gpu-8"}, {"GPUKubeSpawner__check_node_fit": False}, 409, "capacity", "NoFreeGPUs"),
    ],
)
async def test_refusals_are_spawn_exceptions(make_spawner, cluster, user, groups, options, config, status, reason, kind):
    """JupyterHub's SpawnException: the user's message apart from the log's, a reason for the metrics."""
    from jupyterhub.spawner import SpawnException

    spawner = make_spawner(user, groups=groups, options=options, config=spawner_config(**config))
    with pytest.raises(SpawnException) as err:
        await spawner.start()
    e = err.value
    assert (e.status_code, e.reason) == (status, reason)
    assert e.jupyterhub_message == e.message and e.log_message.startswith(f"{kind}(") and e.log_message.endswith(e.message)


async def test_staff_may_use_restricted_profile(make_spawner, cluster):
    spawner = make_spawner("erin", groups=("staff",), options={"profile": "staff-gpu"})
    await spawner.start()
    assert spawner.pod_name in await cluster.pods()


async def test_quota_counts_running_jobs_and_servers(make_spawner, cluster):
    config = spawner_config(QuotaPolicy__user_gpu_limit=2)
    await cluster.add_user_pod("job-frank-1", "frank", {"nvidia.com/gpu": "1"})
    try:
        first = make_spawner("frank", options={"profile": "gpu-1"}, config=config)
        await first.start()  # 1 (job) + 1 = 2: allowed
        await cluster.wait_for_cache(lambda pods: f"{NAMESPACE}/{first.pod_name}" in pods)
        second = make_spawner("frank", options={"profile": "gpu-1"}, config=config)
        second.pod_name = first.pod_name + "-second"  # a second named server of the same user
        before = set(await cluster.pods())
        with pytest.raises(HTTPError) as err:
            await second.start()
        assert err.value.status_code == 403
        message = err.value.log_message % err.value.args
        assert "holds 2 of 2 GPUs" in message
        assert set(await cluster.pods()) == before
    finally:
        await cluster.delete_pod("job-frank-1")


async def test_group_quota(make_spawner, cluster):
    config = spawner_config(QuotaPolicy__group_gpu_limits={"students": 1})
    await cluster.add_user_pod("job-gina-1", "gina", {MIG: "1"}, node=None if cluster.real else "mig-a")
    try:
        spawner = make_spawner("hank", groups=("students",), group_members={"students": ["gina", "hank"]},
                               options={"profile": "gpu-1"}, config=config)
        with pytest.raises(HTTPError) as err:
            await spawner.start()
        assert err.value.status_code == 403
        assert "group 'students' holds 1 of 1" in err.value.log_message % err.value.args
    finally:
        await cluster.delete_pod("job-gina-1")


@standin_only
async def test_availability_from_watch_cache_not_lists(make_spawner, cluster):
    spawner = make_spawner("ivy", options={"profile": "gpu-2"})
    profile = spawner.catalog.get("gpu-2")
    avail = await spawner.gpu_availability(profile)
    # gpu-a (4) + gpu-b (2); the cordoned node and the MIG/CPU nodes do not count
    assert (avail["nodes"], avail["total"]) == (2, 6)
    assert avail["per_node"]["gpu-a"]["allocatable"] == 4

    await cluster.add_user_pod("other-tenant", "someone", {"nvidia.com/gpu": "3"}, node="gpu-a")
    try:
        await cluster.wait_for_cache(lambda pods: f"{NAMESPACE}/other-tenant" in pods)
        avail = await spawner.gpu_availability(profile)
        assert avail["per_node"]["gpu-a"] == {"allocatable": 4, "requested": 3, "free": 1}
        assert (avail["free"], avail["largest_free"]) == (3, 2)

        lists_before = cluster.count_requests("/nodes")
        assert lists_before >= 1  # the cache's initial list
        form1 = await spawner.get_options_form()
        form2 = await spawner.get_options_form()
        assert cluster.count_requests("/nodes") == lists_before, "the form must read the cache, not list nodes"
        assert form1 == form2
        assert "3 of 6 free" in form1
        assert 'value="staff-gpu"' not in form1  # ivy is not in staff
        assert 'value="gpu-8"' in form1 and "disabled" in form1.split('value="gpu-8"')[1].split(">")[0]
    finally:
        await cluster.delete_pod("other-tenant")


async def test_options_from_form(make_spawner, cluster):
    spawner = make_spawner("jack")
    assert spawner.options_from_form({"profile": ["gpu-1"]}) == {"profile": "gpu-1"}
    assert spawner.options_from_form({}) == {"profile": "cpu"}
    with pytest.raises(HTTPError) as err:
        spawner.options_from_form({"profile": ["staff-gpu"]})
    assert err.value.status_code == 403


@standin_only
@pytest.mark.kube_api("1.28", "native sidecars (initContainers[].restartPolicy: Always); 1.20 drops the field "
                               "and then refuses the sidecars' lifecycle and startupProbe with 422")
async def test_fuse_sidecar_mount_manifest(make_spawner, cluster, validate_k8s):
    config = spawner_config(**S3, GPUKubeSpawner__storage_mount="fuse-sidecar")
    spawner = make_spawner("kate", options={"profile": "gpu-1"}, config=config)
    await spawner.start()
    pod = (await cluster.pods())[spawner.pod_name]
    validate_k8s(await spawner.get_pod_manifest())
    sidecars = {c["name"]: c for c in pod["spec"]["initContainers"]}
    home, datasets = sidecars["trainhub-storage-home"], sidecars["trainhub-storage-datasets"]
    for c in (home, datasets):
        assert c["restartPolicy"] == "Always"
        assert c["securityContext"]["privileged"] is True
        assert c["volumeMounts"][0]["mountPropagation"] == "Bidirectional"
        # rclone reads the user's own credentials through the mounted Secret's config, as the notebook does
        assert "envFrom" not in c
        assert {e["name"]: e["value"] for e in c["env"]}["AWS_CONFIG_FILE"] == "/run/trainhub/credentials/config"
        assert {"name": "trainhub-credentials", "mountPath": "/run/trainhub/credentials", "readOnly": True} in c["volumeMounts"]
    assert ":s3:trainhub-bucket/prod/users/kate" in home["command"][-1]
    assert "--read-only" in datasets["command"][-1] and "--read-only" not in home["command"][-1]
    mount = next(v for v in _main_container(pod)["volumeMounts"] if v["name"] == "trainhub-storage")
    assert mount["mountPropagation"] == "HostToContainer"
    assert "s3cr3t-do-not-leak" not in json.dumps(pod)


async def test_fuse_sidecars_are_containers_before_native_sidecars(make_spawner, cluster, validate_k8s):
    """Before native sidecars (1.28) the rclone containers run beside the notebook: "auto" picks that on the real
    1.20 control plane (and runs it there); on the stand-in (1.30) the form is asked for."""
    if cluster.mode == "cluster":
        pytest.skip("an external cluster's version decides the form")
    form = "auto" if cluster.mode == "real" else "containers"
    config = spawner_config(**S3, GPUKubeSpawner__storage_mount="fuse-sidecar", GPUKubeSpawner__storage_sidecars=form)
    spawner = make_spawner("lena", options={"profile": "cpu"}, config=config)
    await spawner.start()
    pod = (await cluster.pods())[spawner.pod_name]
    validate_k8s(await spawner.get_pod_manifest())
    assert not pod["spec"].get("initContainers")
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(containers) == {_main_container(pod)["name"], "trainhub-storage-home", "trainhub-storage-datasets"}
    for name in ("trainhub-storage-home", "trainhub-storage-datasets"):
        c = containers[name]
        assert "restartPolicy" not in c and c["securityContext"]["privileged"] is True
        assert c["volumeMounts"][0]["mountPropagation"] == "Bidirectional"
    assert ":s3:trainhub-bucket/prod/users/lena" in containers["trainhub-storage-home"]["command"][-1]
    mount = next(v for v in _main_container(pod)["volumeMounts"] if v["name"] == "trainhub-storage")
    assert mount["mountPropagation"] == "HostToContainer"


async def test_storage_secret_none_puts_plain_env(make_spawner, cluster):
    config = spawner_config(**PLATFORM_S3, GPUKubeSpawner__storage_secret="none")
    spawner = make_spawner("liam", config=config)
    env = spawner.storage_env()
    assert env["AWS_SECRET_ACCESS_KEY"] == "s3cr3t-do-not-leak"
    assert spawner.storage_manifests() == []


async def test_concurrent_spawns_cannot_both_pass_the_quota(make_spawner, cluster):

    config = spawner_config(QuotaPolicy__user_gpu_limit=2)
    first = make_spawner("mona", options={"profile": "gpu-2"}, config=config)
    second = make_spawner("mona", options={"profile": "gpu-2"}, config=config)
    second.pod_name = first.pod_name + "-b"
    results = await asyncio.gather(first.start(), second.start(), return_exceptions=True)
    refused = [r for r in results if isinstance(r, HTTPError)]
    assert len(refused) == 1 and refused[0].status_code == 403, results
    assert sum(isinstance(r, str) for r in results) == 1


async def test_storage_secret_existing_is_referenced_not_written(make_spawner, cluster):
    config = spawner_config(**PLATFORM_S3, GPUKubeSpawner__storage_secret="existing")
    spawner = make_spawner("nina", config=config)
    env = spawner.storage_env()
    ref = env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "trainhub-storage-nina", "key": "AWS_SECRET_ACCESS_KEY", "optional": True}
    assert "s3cr3t-do-not-leak" not in json.dumps(env)
    assert spawner.storage_manifests() == []


async def test_the_platform_key_reaches_pods_only_when_shared_by_name(make_spawner, cluster):
    """StorageConfig.share_platform_credentials (one-person set-ups) brings back the old delivery by name: the managed
    Secret holds the platform's key as AWS_* keys, read by secretKeyRef (never a value in the pod spec)."""
    config = spawner_config(**PLATFORM_S3, StorageConfig__share_platform_credentials=True)
    spawner = make_spawner("paula", options={"profile": "cpu"}, config=config)
    await spawner.start()
    pod = (await cluster.pods())[spawner.pod_name]
    env = _env(_main_container(pod))
    secret_name = spawner.storage_secret_name()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": secret_name, "key": key, "optional": False}
    assert "s3cr3t-do-not-leak" not in json.dumps(pod) and "trainhub-credentials" not in json.dumps(pod)
    assert secret_text(await cluster.read("secret", secret_name)) == {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY", "AWS_SECRET_ACCESS_KEY": "s3cr3t-do-not-leak"}
    await spawner.stop()


async def test_a_start_with_nothing_to_mint_users_credentials_is_refused_not_given_the_platform_key(make_spawner, cluster):
    """S3 storage with only the platform's key: the start stops before any pod or Secret, with what to set (503)."""
    spawner = make_spawner("quinn", options={"profile": "cpu"}, config=spawner_config(**PLATFORM_S3))
    with pytest.raises(HTTPError) as err:
        await spawner.start()
    assert err.value.status_code == 503
    assert "c.CredentialMinter.role_arn" in err.value.log_message or "c.CredentialMinter.role_arn" in str(err.value)
    assert spawner.pod_name not in await cluster.pods()
    assert await cluster.read("secret", spawner.storage_secret_name()) is None


async def test_a_running_servers_credentials_are_minted_again_before_they_expire(make_spawner, cluster):
    """The hub's poll of a running server replaces the Secret's credentials once less than refresh_margin of them
    remains (kubelet then swaps the mounted files; botocore reads them again in its last 15 minutes); fresh ones stay."""
    hook = MintingHook(valid=600)  # under CredentialMinter.refresh_margin (30 min): due at every poll
    config = spawner_config(**{**S3, "StorageConfig__user_credentials_hook": hook})
    spawner = make_spawner("rhea", options={"profile": "cpu"}, config=config)
    await spawner.start()
    name = spawner.storage_secret_name()
    first = json.loads(secret_text(await cluster.read("secret", name))["credentials.json"])
    assert first["AccessKeyId"] == "ASIARHEA1" and hook.calls == ["rhea"]
    assert await spawner.poll() is None
    second = json.loads(secret_text(await cluster.read("secret", name))["credentials.json"])
    assert second["AccessKeyId"] == "ASIARHEA2" and second["Expiration"] >= first["Expiration"]
    hook.valid = 4 * 3600
    assert await spawner.poll() is None  # due again (600 s): minted for 4 h now
    assert await spawner.poll() is None  # not due: nothing minted
    assert len(hook.calls) == 3
    assert json.loads(secret_text(await cluster.read("secret", name))["credentials.json"])["AccessKeyId"] == "ASIARHEA3"
    await spawner.stop()


async def test_no_storage_configured_adds_nothing(make_spawner, cluster):
    spawner = make_spawner("olga")
    assert spawner.storage_env() == {} and spawner.storage_manifests() == [] and spawner.storage_pod_fragments() == {}
