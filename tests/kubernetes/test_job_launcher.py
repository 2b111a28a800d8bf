"""The Kubernetes job launcher against the API stand-in, through the real kubernetes-asyncio client.

A stand-in of its own (``standin_server(jobs=True)``: kmock with fixes, the fake
scheduler/kubelet and a small Indexed-Job controller, see ``kube_standin.py``) on loopback;
the tests play the workers' containers (``kube.finish_pod``, ``kube.add_log_line``) and Kueue
(unsuspending a Job). Every manifest the launcher builds is validated with
``kubernetes_validate`` (strict) for Kubernetes 1.29.0 and 1.37.0. The in-pod wrapper script
is run for real with ``sh``. Skipped against a real cluster (the tests drive pod phases).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile

import pytest
from waiting import await_for
import pytest_asyncio

from k8s_test_config import GPU_TYPE_LABEL, MIG, PROFILES, REAL_KUBECONFIG, TEST_IMAGE, MintingHook, secret_text
from kube_standin import JOBS, PODS, standin_server, write_kubeconfig
from traitlets.config import Config

from trainhub.exceptions import TrainhubError
from trainhub.services.jobs import k8s_job_manifests as jm
from trainhub.services.jobs.kubernetes import GPUTarget, KubernetesLauncher
from trainhub.services.jobs.launcher import JobView, WorkerStatus

pytestmark = pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="drives pod phases through the stand-in")

NS = "trainhub-jobs-test"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[(\d+)\] (.*)$")


@pytest_asyncio.fixture(scope="module")
async def kube(tmp_path_factory):
    async with standin_server(jobs=True, namespaces=(NS,)) as kube:
        taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        kube.add_node("gpu-a", allocatable={"nvidia.com/gpu": "8"}, labels={GPU_TYPE_LABEL: "a100"}, taints=taint)
        kube.add_node("mig-a", allocatable={MIG: "2"})
        kube.add_node("cpu-a", allocatable={})
        yield kube


@pytest.fixture(scope="module")
def job_kubeconfig(kube, tmp_path_factory):
    return write_kubeconfig(tmp_path_factory.mktemp("jobkube") / "config", str(kube.url).rstrip("/"), NS)


@pytest_asyncio.fixture
async def make_launcher(kube, job_kubeconfig, tmp_path):
    made = []

    def factory(**traits):
        c = Config()
        c.ProfileCatalog.profiles = PROFILES
        c.ProfileCatalog.default_profile = "cpu"
        settings = dict(kubeconfig=job_kubeconfig, namespace=NS, image=TEST_IMAGE, jobs_dir=str(tmp_path / "jobs"),
                        log_interval=0.05, request_timeout=5, retry_timeout=5)
        settings.update(traits)
        launcher = KubernetesLauncher(config=c, **settings)
        made.append(launcher)
        return launcher

    yield factory
    for launcher in made:
        await launcher.close()
    for (ns, name) in list(kube.store(JOBS)):
        await kube.remove(JOBS, ns, name)


_ids = iter(range(100, 10_000))


def make_view(workers=2, gpus=1, profile="gpu-1", script=None, command="python train.py", time_limit=3600.0, attempt=1, **kw):
    n = next(_ids)
    return JobView(id=n, key=f"j-{n:06d}", user="alice", name="train", command=None if script else command, script=script,
                   workers=workers, gpus=gpus, env={"EPOCHS": "3"}, attempt=attempt, time_limit=time_limit,
                   params={}, profile=profile, **kw)


def devices_for(view):
    return [[view.gpus * r + i for i in range(view.gpus)] for r in range(view.workers)]


BASE_ENV = {"PATH": "/srv/venv/bin:/usr/bin", "TRAINHUB_JOB_ID": "x", "TRAINHUB_USER": "alice",
            "TRAINHUB_STORAGE_URL": "s3://bucket/users/alice", "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "very-secret", "TRAINHUB_STORAGE_OPTIONS": json.dumps({"key": "AKIAEXAMPLE", "secret": "very-secret", "endpoint_url": "http://s3"})}


async def until(predicate, timeout=10.0, what="condition"):
    return await await_for(predicate, what=what, timeout=timeout, interval=0.02)


def job_pods(kube, name):
    return {jm.pod_index(p): p for (ns, _), p in kube.store(PODS).items()
            if ns == NS and p["metadata"].get("labels", {}).get(jm.JOB_NAME_LABEL) == name}


async def running_pods(kube, name, n):
    return await until(lambda: (lambda pods: pods if len(pods) == n and all(p["status"].get("phase") == "Running" for p in pods.values()) else None)(job_pods(kube, name)),
                       what=f"{n} running pods of {name}")


async def poll_until(launcher, view, state, predicate, what="statuses"):
    async def check():
        statuses = await launcher.poll(view, state)
        return statuses if predicate(statuses) else None
    return await until(check, what=what)


def validate(obj):
    import kubernetes_validate

    for version in ("1.29.0", "1.37.0"):
        kubernetes_validate.validate(obj, version, strict=True)


# ---------------------------------------------------------------------------------------------
# launch


async def test_launch_creates_indexed_job_and_headless_service(kube, make_launcher):
    launcher = make_launcher()
    view = make_view(workers=2, gpus=1, profile="gpu-1", time_limit=600)
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    name = state["name"]
    assert name == f"trainhub-{view.key}-a1" and state["namespace"] == NS and state["uid"]
    job = kube.get(JOBS, NS, name)
    svc = kube.get(kmock_services(), NS, name)
    validate({k: v for k, v in job.items() if k != "status"})
    validate({k: v for k, v in svc.items() if k != "status"})

    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["suspend"] is False and spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 660
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [0]}},
    ]
    assert job["metadata"]["labels"][jm.JOB_ID_LABEL] == str(view.id)
    assert jm.KUEUE_QUEUE_LABEL not in job["metadata"]["labels"]
    tmpl = spec["template"]
    assert tmpl["metadata"]["annotations"] == {"trainhub.io/username": "alice"}  # counts against quotas
    pod = tmpl["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == name and pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {GPU_TYPE_LABEL: "a100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (c,) = pod["containers"]
    # as stored: the apiserver defaults requests from limits and fieldRef.apiVersion to v1
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16G"},
                              "requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16G"}}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["RANK"] == {"fieldRef": {"apiVersion": "v1",
                                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert (env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("2", f"{name}-0.{name}", "29500")
    assert env["EPOCHS"] == "3" and env["TRAINHUB_JOB_COMMAND"] == "python train.py"
    assert "PATH" not in env  # the service's PATH means nothing in the image
    assert env["TRAINHUB_OUTPUTS_URL"] == f"s3://bucket/users/alice/jobs/{view.key}"  # where the engine syncs the job
    # the attempt's own credentials Secret, in the job namespace, owned by the Job, read by required refs
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": f"{name}-credentials", "key": "AWS_SECRET_ACCESS_KEY", "optional": False}}
    assert "AWS_SESSION_TOKEN" not in env  # only the keys it has
    secret = kube.get(kmock_secrets(), NS, f"{name}-credentials")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    stored = secret_text(secret)
    assert stored == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "very-secret"}
    assert "very-secret" not in json.dumps(job) and "AKIAEXAMPLE" not in json.dumps(job)
    assert json.loads(env["TRAINHUB_STORAGE_OPTIONS"]) == {"endpoint_url": "http://s3"}

    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {jm.JOB_NAME_LABEL: name}
    assert svc["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]

    # the Job controller made one pod per index, named for the headless Service, and they run
    pods = await running_pods(kube, name, 2)
    assert {i: p["spec"]["hostname"] for i, p in pods.items()} == {0: f"{name}-0", 1: f"{name}-1"}
    assert all(p["metadata"]["annotations"]["trainhub.io/username"] == "alice" for p in pods.values())
    assert all(p["spec"]["nodeName"] == "gpu-a" for p in pods.values())
    assert await launcher.poll(view, state) == [WorkerStatus(0, True), WorkerStatus(1, True)]
    # the launcher knows which pod holds which ledger device (for the DCGM metrics source)
    assert launcher.gpu_targets([0, 1, 7]) == {0: GPUTarget(NS, pods[0]["metadata"]["name"], 0),
                                                1: GPUTarget(NS, pods[1]["metadata"]["name"], 0)}


async def test_a_job_sent_with_a_working_directory_gets_it_in_every_pod(kube, make_launcher, tmp_path):
    """The archive goes to the job's storage area; each pod's wrapper (run here for real with sh, with the env the API
    server stored) unpacks it with trainhub.workdir's own source and runs the command in it: its modules import,
    its arguments arrive. A refused archive stops the pod before the command runs."""
    from trainhub import workdir as wd
    from trainhub.services.jobs.workdirs import WorkdirStore
    from trainhub.storage import StorageConfig

    src = tmp_path / "proj"
    src.mkdir()
    (src / "datautils.py").write_text("def load(n):\n    return list(range(n))\n")
    (src / "train.py").write_text("import os, sys\nfrom datautils import load\n"
                                  "print('args', sys.argv[1:], 'data', load(3), 'cwd', os.getcwd())\n")
    snap = wd.snapshot(src)
    store = WorkdirStore(tmp_path / "workdirs")
    upload = store.receive("alice", snap.sha256)
    upload.write(snap.archive.read())
    upload.finish()
    storage = StorageConfig(url=str(tmp_path / "storage"))
    storage.ensure_layout(["alice"])
    launcher = make_launcher(storage=storage, workdir_store=store)
    view = make_view(workers=2, gpus=0, profile="cpu", command="python train.py --epochs 3", workdir=snap.sha256)
    state = await launcher.launch(view, devices_for(view), {"TRAINHUB_STORAGE_URL": storage.user_url("alice")})
    job = kube.get(JOBS, NS, state["name"])
    validate({k: v for k, v in job.items() if k != "status"})
    (c,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    staged = f"{storage.user_url('alice')}/jobs/{view.key}/{jm.WORKDIR_ARCHIVE}"
    assert env["TRAINHUB_WORKDIR_URL"] == staged and open(staged, "rb").read() == (snap.archive.seek(0) or snap.archive.read())
    assert env["TRAINHUB_WORKDIR_LIMITS"] == f"{wd.DEFAULT_MAX_BYTES} {wd.DEFAULT_MAX_FILES}"

    def play_pod(pod: str, archive_url: str):
        (tmp_path / pod).mkdir()
        penv = dict(env, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], RANK="0",
                    TRAINHUB_PYTHON=sys.executable, TRAINHUB_JOB_DIR=str(tmp_path / pod), TRAINHUB_WORKDIR_URL=archive_url,
                    TRAINHUB_OUTPUTS_DIR=str(tmp_path / pod / "outputs"), TRAINHUB_METRICS_FILE=str(tmp_path / pod / "m.jsonl"))
        penv.pop("TRAINHUB_OUTPUTS_URL", None)
        return subprocess.run(c["command"], env=penv, capture_output=True, text=True, timeout=60)

    out = play_pod("pod", staged)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"args ['--epochs', '3'] data [0, 1, 2] cwd {tmp_path / 'pod' / 'workdir'}" in out.stdout

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "evil.tar.gz").write_bytes(gzip.compress(raw.getvalue()))
    bad = play_pod("pod2", f"file://{tmp_path / 'evil.tar.gz'}")
    assert bad.returncode == 1 and "leaves the folder" in bad.stderr and "args" not in bad.stdout
    assert not (tmp_path / "escaped.py").exists()


def kmock_services():
    import kmock

    return kmock.resource(group="", version="v1", plural="services")


def kmock_secrets():
    import kmock

    return kmock.resource(group="", version="v1", plural="secrets")


async def test_a_job_that_cannot_get_its_credentials_is_not_left_running(kube, make_launcher, monkeypatch):
    """No right to create the Secret (an old Role): the launch fails with the reason and the Job is deleted,
    never a job running without the credentials it was given."""
    from kubernetes_asyncio.client.rest import ApiException

    launcher = make_launcher()
    await launcher._connect()

    async def forbidden(*args, **kwargs):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(launcher._core, "create_namespaced_secret", forbidden)
    view = make_view(workers=1, gpus=0, profile="cpu")
    with pytest.raises(TrainhubError, match="storage credentials.*may not create Secrets"):
        await launcher.launch(view, devices_for(view), BASE_ENV)
    name = jm.job_name(view.key, view.attempt)
    await until(lambda: kube.get(JOBS, NS, name) is None or kube.get(JOBS, NS, name)["metadata"].get("deletionTimestamp"),
                what="the Job deleted")
    # "existing": the named Secret, required; "none": plain values
    job, _ = make_launcher(credentials="existing").build_manifests(view, devices_for(view), BASE_ENV)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "trainhub-storage-alice", "key": "AWS_ACCESS_KEY_ID", "optional": False}}


def own_storage(hook=None):
    from trainhub.storage import StorageConfig

    return StorageConfig(url="s3://bucket", endpoint_url="http://s3.example:9000", user_credentials_hook=hook)


def secret_files(kube, name) -> dict:
    return secret_text(kube.get(kmock_secrets(), NS, name))


async def test_job_pods_get_their_users_own_credentials_as_files_never_a_key(kube, make_launcher):
    """With S3 storage the attempt's Secret holds its user's own minted credentials as files (credentials.json and a
    config whose credential_process prints it), mounted read-only at /run/trainhub/credentials: the pods' variables
    point there, and no AWS key (not the platform's, not one the service was handed) is in the Job or its env."""
    hook = MintingHook()
    launcher = make_launcher(storage=own_storage(hook))
    view = make_view(workers=2, gpus=0, profile="cpu")
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    name = state["name"]
    job = kube.get(JOBS, NS, name)
    validate({k: v for k, v in job.items() if k != "status"})
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
    assert env["AWS_CONFIG_FILE"] == "/run/trainhub/credentials/config" and env["AWS_SDK_LOAD_CONFIG"] == "1"
    assert env["TRAINHUB_STORAGE_URL"] == "s3://bucket/users/alice"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["trainhub-credentials"]["secret"]["secretName"] == f"{name}-credentials"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "trainhub-credentials")
    assert (mount["mountPath"], mount["readOnly"], mount.get("subPath")) == ("/run/trainhub/credentials", True, None)
    files = secret_files(kube, f"{name}-credentials")
    assert set(files) == {"credentials.json", "config"}
    assert json.loads(files["credentials.json"])["AccessKeyId"] == "ASIAALICE1" and hook.calls == ["alice"]
    assert "credential_process = /bin/cat /run/trainhub/credentials/credentials.json" in files["config"]
    assert "endpoint_url = http://s3.example:9000" in files["config"]
    assert kube.get(kmock_secrets(), NS, f"{name}-credentials")["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    for secret in ("very-secret", "AKIAEXAMPLE", "minted-alice-1"):
        assert secret not in json.dumps(job)
    await launcher.terminate(view, state, 0)


async def test_a_running_attempts_credentials_are_minted_again_before_they_expire(kube, make_launcher):
    """The engine's poll of a running attempt replaces its Secret's credentials once less than refresh_margin of them
    remains (its owner kept: the Secret still goes with the Job); fresh ones are left alone."""
    hook = MintingHook(valid=600)  # under CredentialMinter.refresh_margin (30 min)
    launcher = make_launcher(storage=own_storage(hook))
    view = make_view(workers=1, gpus=0, profile="cpu")
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    name, secret = state["name"], f"{state['name']}-credentials"
    await running_pods(kube, name, 1)
    assert await launcher.poll(view, state) == [WorkerStatus(0, True)]
    assert json.loads(secret_files(kube, secret)["credentials.json"])["AccessKeyId"] == "ASIAALICE2"
    assert kube.get(kmock_secrets(), NS, secret)["metadata"]["ownerReferences"][0]["name"] == name
    hook.valid = 4 * 3600
    await launcher.poll(view, state)  # due again: minted for 4 h now
    await launcher.poll(view, state)  # not due
    assert len(hook.calls) == 3
    assert json.loads(secret_files(kube, secret)["credentials.json"])["AccessKeyId"] == "ASIAALICE3"
    await launcher.terminate(view, state, 0)


async def test_a_failed_refresh_is_tried_again_a_minute_later_not_at_every_poll(kube, make_launcher):
    """STS (here the admin's hook) failing: one try per minute and attempt, never a call at every poll; the next
    success puts fresh credentials in the Secret."""
    hook = MintingHook(valid=600)
    launcher = make_launcher(storage=own_storage(hook))
    view = make_view(workers=1, gpus=0, profile="cpu")
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    name = state["name"]
    await running_pods(kube, name, 1)
    failing = {"on": True}
    real = hook.__call__

    def flaky(username):
        hook.calls.append(username)
        if failing["on"]:
            raise RuntimeError("STS is down")
        hook.calls.pop()
        return real(username)

    launcher._pod_credentials().storage.user_credentials_hook = flaky
    for _ in range(3):
        await launcher.poll(view, state)
    assert len(hook.calls) == 2  # the launch's mint, then one failed try
    failing["on"] = False
    launcher._runs[name].credentials_retry_at = 0  # a minute later
    await launcher.poll(view, state)
    assert json.loads(secret_files(kube, f"{name}-credentials")["credentials.json"])["AccessKeyId"] == "ASIAALICE3"
    await launcher.terminate(view, state, 0)


async def test_a_job_whose_credentials_cannot_be_minted_never_starts(kube, make_launcher):
    """S3 storage with nothing to mint users' credentials (no CredentialMinter role, no hook): the launch is refused
    with what to set, before any Job exists; the platform's key is never the fallback."""
    launcher = make_launcher(storage=own_storage())
    view = make_view(workers=1, gpus=0, profile="cpu")
    with pytest.raises(TrainhubError, match="c.CredentialMinter.role_arn"):
        await launcher.launch(view, devices_for(view), BASE_ENV)
    assert kube.get(JOBS, NS, jm.job_name(view.key, view.attempt)) is None


@pytest.mark.parametrize("profile,gpus,script,queue,resource", [
    ("cpu", 0, None, "", None),
    ("mig-small", 1, "print('hi')", "", MIG),
    ("gpu-2", 2, None, "trainhub", "nvidia.com/gpu"),
    (None, 1, "import torch", "trainhub", "nvidia.com/gpu"),
])
def test_manifests_validate_for_each_profile(profile, gpus, script, queue, resource, tmp_path):
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    launcher = KubernetesLauncher(config=c, namespace=NS, image="pytorch/pytorch:2.5.1", kueue_queue=queue,
                                  credentials="none", jobs_dir=str(tmp_path))
    view = make_view(workers=3, gpus=gpus, profile=profile, script=script, time_limit=None)
    job, svc = launcher.build_manifests(view, devices_for(view), BASE_ENV)
    validate(job)
    validate(svc)
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    assert limits.get(resource) == (str(gpus) if resource else None)
    assert job["spec"]["suspend"] is bool(queue)
    assert (job["metadata"]["labels"].get(jm.KUEUE_QUEUE_LABEL) or "") == queue
    assert "activeDeadlineSeconds" not in job["spec"]
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env.get("TRAINHUB_JOB_SCRIPT") == script
    assert (env.get("NVIDIA_VISIBLE_DEVICES") == "void") is (gpus == 0)
    assert env["AWS_SECRET_ACCESS_KEY"] == "very-secret"  # no Secret configured: plain values


def test_job_pods_meet_the_restricted_pod_security_standard_and_take_class_hooks(tmp_path):
    """A namespace enforcing the "restricted" Pod Security level admits job pods of every profile (non-root,
    no privilege escalation, all capabilities dropped, RuntimeDefault seccomp); runtimeClassName and
    priorityClassName are there when configured; {} contexts bring back the image's user (and the refusal)."""
    from pod_security import restricted_violations

    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    for profile, gpus, script in (("cpu", 0, None), ("gpu-2", 2, "print(1)"), ("mig-small", 1, None)):
        launcher = KubernetesLauncher(config=c, namespace=NS, image="pytorch/pytorch:2.5.1", jobs_dir=str(tmp_path))
        view = make_view(workers=2, gpus=gpus, profile=profile, script=script, time_limit=None)
        job, _ = launcher.build_manifests(view, devices_for(view), BASE_ENV)
        validate(job)
        pod = job["spec"]["template"]["spec"]
        assert restricted_violations(pod) == [], (profile, restricted_violations(pod))
        assert "runtimeClassName" not in pod and "priorityClassName" not in pod
    hooked = KubernetesLauncher(config=c, namespace=NS, image="img", jobs_dir=str(tmp_path), runtime_class_name="nvidia",
                                priority_class_name="training-low")
    view = make_view(workers=1, gpus=1, profile="gpu-1")
    job = hooked.build_manifests(view, devices_for(view), BASE_ENV)[0]
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert (pod["runtimeClassName"], pod["priorityClassName"]) == ("nvidia", "training-low")
    root = KubernetesLauncher(config=c, namespace=NS, image="img", jobs_dir=str(tmp_path), pod_security_context={},
                              container_security_context={})
    pod = root.build_manifests(view, devices_for(view), BASE_ENV)[0]["spec"]["template"]["spec"]
    assert "securityContext" not in pod and len(restricted_violations(pod)) == 4


# ---------------------------------------------------------------------------------------------
# statuses and logs


async def test_success_logs_and_metrics_land_in_the_job_dir(kube, make_launcher):
    launcher = make_launcher()
    view = make_view(workers=2)
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    pods = await running_pods(kube, state["name"], 2)
    names = {i: p["metadata"]["name"] for i, p in pods.items()}
    kube.add_log_line(NS, names[0], "epoch 1 loss 0.9")
    kube.add_log_line(NS, names[1], "rank 1 ready")
    kube.add_log_line(NS, names[0], jm.METRICS_MARK + json.dumps({"step": 1, "loss": 0.9}))
    log0 = os.path.join(state["dir"], "worker-0.log")
    await poll_until(launcher, view, state, lambda s: os.path.exists(log0) and "loss 0.9" in open(log0).read())
    await launcher.poll(view, state)  # more reads must not repeat lines
    await launcher.poll(view, state)
    kube.add_log_line(NS, names[0], "epoch 2 loss 0.5")
    await kube.finish_pod(NS, names[0], 0)
    await kube.finish_pod(NS, names[1], 0)
    statuses = await poll_until(launcher, view, state, lambda s: not any(x.running for x in s))
    assert statuses == [WorkerStatus(0, False, 0), WorkerStatus(1, False, 0)]
    await until(lambda: kube.get(JOBS, NS, state["name"])["status"].get("conditions"), what="Job complete")
    assert jm.job_finished(kube.get(JOBS, NS, state["name"])) == "Complete"

    lines = open(log0).read().splitlines()
    assert [LOG_LINE.match(line).groups() for line in lines] == [("0", "epoch 1 loss 0.9"), ("0", "epoch 2 loss 0.5")]
    assert [LOG_LINE.match(line).groups() for line in open(os.path.join(state["dir"], "worker-1.log"))] == [("1", "rank 1 ready")]
    assert [json.loads(x) for x in open(os.path.join(state["dir"], "metrics-0.jsonl"))] == [{"step": 1, "loss": 0.9}]

    await launcher.cleanup(view, state)
    assert kube.get(JOBS, NS, state["name"]) is None and kube.get(kmock_services(), NS, state["name"]) is None


# A defect for the Kubernetes defects wave, found by the stand-in's upstream Job semantics: after FailJob the
# Job controller deletes the other workers' pods gracefully, so they end Failed with exit 143 (SIGTERM) before
# they are removed and before the Job's Failed condition; worker_statuses() expects them removed (-15, or
# running until the engine stops the gang) and reports 143 when it polls in between: a race, so not strict.
GANG_TERMINATION_RACE = pytest.mark.xfail(strict=False, reason=(
    "defect: a worker the Job controller stopped after FailJob reads as exit 143, not -15 (see the comment)"))


@GANG_TERMINATION_RACE
async def test_a_failing_index_fails_the_whole_job(kube, make_launcher):
    launcher = make_launcher()
    view = make_view(workers=3)
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    pods = await running_pods(kube, state["name"], 3)
    await kube.finish_pod(NS, pods[0]["metadata"]["name"], 0)
    await kube.finish_pod(NS, pods[1]["metadata"]["name"], 3)
    # index 1 exited 3; podFailurePolicy FailJob made the controller stop index 2, which reads as
    # running until the engine terminates the gang (so the engine names index 1 as the cause)
    statuses = await poll_until(launcher, view, state, lambda s: not s[1].running)
    assert statuses == [WorkerStatus(0, False, 0), WorkerStatus(1, False, 3), WorkerStatus(2, True)]
    await until(lambda: not job_pods(kube, state["name"]).get(2), what="index 2 removed")
    job = kube.get(JOBS, NS, state["name"])
    assert jm.job_finished(job) == "Failed"
    assert {c["reason"] for c in job["status"]["conditions"]} == {"PodFailurePolicy"}
    await launcher.terminate(view, state, grace=1)
    assert await launcher.poll(view, state) == [WorkerStatus(0, False, 0), WorkerStatus(1, False, 3), WorkerStatus(2, False, -15)]


async def test_a_disrupted_pod_is_replaced_not_failed(kube, make_launcher):
    launcher = make_launcher()
    view = make_view(workers=2)
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    pods = await running_pods(kube, state["name"], 2)
    await kube.finish_pod(NS, pods[1]["metadata"]["name"], 137, reason="Evicted", disruption=True)
    assert [s.running for s in await launcher.poll(view, state)] == [True, True]
    await until(lambda: job_pods(kube, state["name"])[1]["metadata"]["uid"] != pods[1]["metadata"]["uid"]
                and job_pods(kube, state["name"])[1]["status"]["phase"] == "Running", what="a replacement pod")
    assert [s.running for s in await launcher.poll(view, state)] == [True, True]
    assert jm.job_finished(kube.get(JOBS, NS, state["name"])) is None


async def test_terminate_deletes_the_job_with_foreground_propagation(kube, make_launcher):
    launcher = make_launcher()
    view = make_view(workers=2)
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    await running_pods(kube, state["name"], 2)
    assert all(s.running for s in await launcher.poll(view, state))
    await asyncio.wait_for(launcher.terminate(view, state, grace=3), 10)
    deletes = [r for r in kube.recorded_requests()
               if str(r.method).upper().endswith("DELETE") and str(r.url.path).endswith(f"/jobs/{state['name']}")]
    assert deletes and deletes[-1].data["propagationPolicy"] == "Foreground" and deletes[-1].data["gracePeriodSeconds"] == 3
    assert kube.get(JOBS, NS, state["name"]) is None and not job_pods(kube, state["name"])
    assert kube.get(kmock_services(), NS, state["name"]) is None  # owned by the Job
    assert await launcher.poll(view, state) == [WorkerStatus(0, False, -15), WorkerStatus(1, False, -15)]
    await launcher.cleanup(view, state)  # the Job is gone already: 404 is fine


async def test_adopt_after_a_restart_finds_the_job_and_keeps_the_log_whole(kube, make_launcher):
    first = make_launcher()
    view = make_view(workers=1)
    state = await first.launch(view, devices_for(view), BASE_ENV)
    pods = await running_pods(kube, state["name"], 1)
    pod = pods[0]["metadata"]["name"]
    kube.add_log_line(NS, pod, "before the restart")
    log0 = os.path.join(state["dir"], "worker-0.log")
    await poll_until(first, view, state, lambda s: os.path.exists(log0) and "before" in open(log0).read())
    await first.close()

    second = make_launcher()  # the service restarted: a new process knows nothing but the launch state
    assert await second.adopt(view, state) is True
    assert await second.poll(view, state) == [WorkerStatus(0, True)]
    await asyncio.sleep(0.01)  # pacing, no verdict: the new line gets a later timestamp than the last one read
    kube.add_log_line(NS, pod, "after the restart")
    await poll_until(second, view, state, lambda s: "after" in open(log0).read())
    assert [LOG_LINE.match(x).group(2) for x in open(log0).read().splitlines()] == ["before the restart", "after the restart"]
    assert second.gpu_targets([0]) == {0: GPUTarget(NS, pod, 0)}

    other = make_view(workers=1)
    assert await second.adopt(other, {"name": jm.job_name(other.key, 1), "dir": None}) is False
    assert await second.poll(other, {"name": jm.job_name(other.key, 1)}) == [WorkerStatus(0, False, -9, lost=True)]


async def test_kueue_mode_creates_a_suspended_job_until_admitted(kube, make_launcher):
    launcher = make_launcher(kueue_queue="trainhub")
    view = make_view(workers=2)
    state = await launcher.launch(view, devices_for(view), BASE_ENV)
    job = kube.get(JOBS, NS, state["name"])
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][jm.KUEUE_QUEUE_LABEL] == "trainhub"
    validate({k: v for k, v in job.items() if k != "status"})
    # the Job controller has seen the Job and held it (condition Suspended): it would have made pods by then
    await until(lambda: any(c["type"] == "Suspended" and c["status"] == "True"
                            for c in kube.get(JOBS, NS, state["name"])["status"].get("conditions") or []),
                what="the Job controller to mark the Job Suspended")
    assert job_pods(kube, state["name"]) == {}  # nothing runs before admission
    assert await launcher.poll(view, state) == [WorkerStatus(0, True), WorkerStatus(1, True)]  # waiting, not ended
    await kube.mutate(JOBS, NS, state["name"], {"spec": {"suspend": False}})  # Kueue admits the gang
    pods = await running_pods(kube, state["name"], 2)
    assert len(pods) == 2


# ---------------------------------------------------------------------------------------------
# pure functions


def _pod(idx, phase, code=None, created="2026-11-21T10:00:00Z", disruption=False, rv=1):
    cs = {"name": "worker", "state": {"terminated": {"exitCode": code}} if code is not None else {"running": {}}}
    conds = [{"type": "DisruptionTarget", "status": "True"}] if disruption else []
    return {"metadata": {"annotations": {jm.INDEX_ANNOTATION: str(idx)}, "creationTimestamp": created, "resourceVersion": str(rv)},
            "status": {"phase": phase, "containerStatuses": [cs], "conditions": conds}}


_ACTIVE = {"status": {}}
_FAILED = {"status": {"conditions": [{"type": "Failed", "status": "True"}], "completedIndexes": "0"}}


@pytest.mark.parametrize("job,pods,expected", [
    (_ACTIVE, [], [WorkerStatus(0, True), WorkerStatus(1, True)]),
    (_ACTIVE, [_pod(0, "Running"), _pod(1, "Pending")], [WorkerStatus(0, True), WorkerStatus(1, True)]),
    (_ACTIVE, [_pod(0, "Succeeded", 0), _pod(1, "Failed", 2)], [WorkerStatus(0, False, 0), WorkerStatus(1, False, 2)]),
    (_ACTIVE, [_pod(0, "Running"), _pod(1, "Failed", 137, disruption=True)], [WorkerStatus(0, True), WorkerStatus(1, True)]),
    (_ACTIVE, [_pod(0, "Running"), _pod(1, "Failed", 1), _pod(1, "Running", created="2026-11-21T10:01:00Z")],
     [WorkerStatus(0, True), WorkerStatus(1, True)]),
    (_FAILED, [_pod(1, "Failed", 1)], [WorkerStatus(0, False, 0), WorkerStatus(1, False, 1)]),
    (_FAILED, [], [WorkerStatus(0, False, 0), WorkerStatus(1, False, -15)]),
    ({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}, [_pod(1, "Failed", 4)],
     [WorkerStatus(0, True), WorkerStatus(1, False, 4)]),  # index 0 removed: running until the gang is stopped
    (None, [], [WorkerStatus(0, False, -9, lost=True), WorkerStatus(1, False, -9, lost=True)]),
    (_ACTIVE, [_pod(0, "Failed"), _pod(1, "Running")], [WorkerStatus(0, False, -9, lost=True), WorkerStatus(1, True)]),
])
def test_worker_statuses(job, pods, expected):
    if pods and pods[0]["status"]["phase"] == "Failed" and pods[0]["status"]["containerStatuses"][0]["state"] == {"running": {}}:
        pods[0]["status"]["containerStatuses"] = []  # a pod that failed before its container ran
    assert jm.worker_statuses(job, pods, 2) == expected


@pytest.mark.parametrize("term,code", [
    ({"exitCode": 0}, 0), ({"exitCode": 3}, 3), ({"exitCode": 137, "reason": "OOMKilled"}, -9), ({"exitCode": 143, "signal": 15}, -15),
])
def test_container_exit(term, code):
    assert jm.container_exit({"status": {"containerStatuses": [{"name": "worker", "state": {"terminated": term}}]}}) == code


def test_completed_indexes():
    assert jm.completed_indexes("0,2-4,7") == {0, 2, 3, 4, 7} and jm.completed_indexes(None) == set()


def test_split_pod_log_formats_dedups_and_separates_metrics():
    text = ("2026-11-21T20:15:15.123456789Z hello\n"
            "2026-11-21T20:15:15.123456789Z again\n"
            f"2026-11-21T20:15:16.5Z {jm.METRICS_MARK}{{\"step\": 1}}\n"
            "2026-11-21T21:15:17+01:00 zoned\n")
    log, metrics, last, n = jm.split_pod_log(text, 3)
    assert log == ["2026-11-21T20:15:15.123Z [3] hello\n", "2026-11-21T20:15:15.123Z [3] again\n", "2026-11-21T20:15:17.000Z [3] zoned\n"]
    assert metrics == ['{"step": 1}\n'] and n == 1
    # a second read overlapping the first returns only what is new
    more = text + "2026-11-21T20:15:18.000000001Z new\n"
    log2, metrics2, last2, _ = jm.split_pod_log(more, 3, last, n)
    assert log2 == ["2026-11-21T20:15:18.000Z [3] new\n"] and metrics2 == []
    # of two lines with the same timestamp, only the one not yet taken
    log3, *_ = jm.split_pod_log(text, 3, jm.ts_key("2026-11-21T20:15:15.123456789Z"), 1)
    assert log3[0] == "2026-11-21T20:15:15.123Z [3] again\n"


# ---------------------------------------------------------------------------------------------
# the in-pod wrapper, run for real with sh


def _wrapper_env(tmp_path, **over):
    env = jm.worker_env(name="j", workers=1, master_port=29500, base_env={}, user_env={}, command=over.pop("command", None),
                        script=over.pop("script", None), outputs_url=f"file://{tmp_path}/store", python=sys.executable)
    env = {k: v for k, v in env.items() if isinstance(v, str)}
    env.update(PATH=os.environ["PATH"], TRAINHUB_JOB_DIR=str(tmp_path / "pod"), TRAINHUB_OUTPUTS_DIR=str(tmp_path / "pod/outputs"),
               TRAINHUB_METRICS_FILE=str(tmp_path / "pod/metrics.jsonl"), RANK="0", **over)
    (tmp_path / "pod").mkdir()
    return env


def test_wrapper_runs_the_command_forwards_metrics_copies_outputs(tmp_path):
    cmd = ('echo hello; echo \'{"step": 1, "loss": 0.5}\' >> "$TRAINHUB_METRICS_FILE"; '
           'echo result > "$TRAINHUB_OUTPUTS_DIR/model.txt"; exit 3')
    out = subprocess.run(["sh", "-c", jm.WORKER_SH, "trainhub-worker"], env=_wrapper_env(tmp_path, command=cmd),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 3, out.stderr
    lines = out.stdout.splitlines()
    assert "hello" in lines and jm.METRICS_MARK + '{"step": 1, "loss": 0.5}' in lines
    assert (tmp_path / "store/outputs/model.txt").read_text() == "result\n"


def test_wrapper_runs_a_script_and_passes_sigterm_on(tmp_path):
    script = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(7)))\nprint('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen(["sh", "-c", jm.WORKER_SH, "trainhub-worker"], env=_wrapper_env(tmp_path, script=script),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 7
    assert "got SIGTERM" in proc.stdout.read()
    assert (tmp_path / "pod/script.py").read_text() == script


# ---------------------------------------------------------------------------------------------
# the Helm chart's trainhub.json → launcher and metrics settings


@pytest.mark.parametrize("example", ["values.yaml", "kueue.yaml", "mig-cluster.yaml"])
def test_config_from_chart(example, tmp_path):
    from test_helm_chart import CHART, config_json, helm_merge, load_yaml
    from traitlets.utils.importstring import import_item

    from trainhub.app.chart_config import config_from_chart
    from trainhub.metrics.prometheus import PrometheusDCGMSource

    values = load_yaml(CHART / "values.yaml")
    if example != "values.yaml":
        values = helm_merge(values, load_yaml(CHART / "examples" / example))
    values["trainhub"]["metrics"]["prometheusUrl"] = "http://prometheus:9090"
    data = config_json(values)
    c = config_from_chart(data)
    assert import_item(c.JobsService.launcher_class) is KubernetesLauncher
    launcher = KubernetesLauncher(config=c, jobs_dir=str(tmp_path))
    kueue = values["trainhub"]["kueue"]
    assert launcher.kueue_queue == (kueue["localQueue"] if kueue["enabled"] else "")
    assert launcher.namespace == data["jobNamespace"] and launcher.master_port == 29500 and launcher.backoff_limit == 0
    assert [p.slug for p in launcher.catalog.all()] == [p["slug"] for p in values["trainhub"]["profiles"]]
    pod = values["trainhub"]["jobs"]["pod"]
    assert launcher.pod_security_context == pod["securityContext"] and launcher.pod_security_context["runAsNonRoot"] is True
    assert launcher.container_security_context == pod["containerSecurityContext"]
    assert (launcher.runtime_class_name, launcher.priority_class_name) == (pod["runtimeClassName"], pod["priorityClassName"])
    assert import_item(c.JobsService.metrics_source_class) is PrometheusDCGMSource
    assert PrometheusDCGMSource(config=c).url == "http://prometheus:9090"
    # without a Prometheus URL the sources stay the service's defaults
    values["trainhub"]["metrics"]["prometheusUrl"] = ""
    assert "metrics_source_class" not in config_from_chart(config_json(values)).JobsService


def test_config_from_chart_gives_the_services_the_storage_and_the_cullers_clocks():
    """Jobs' areas (outputs, values back, checkpoints) are on the platform's storage, so the jobs service needs it
    (it had none: a `%%train --return` value landed in the service pod's folder); the culler's warning and release
    clocks come from the values."""
    from test_helm_chart import CHART, config_json, load_yaml

    from trainhub.app.chart_config import config_from_chart
    from trainhub.services.culler.policy import CullPolicy
    from trainhub.storage import StorageConfig

    values = load_yaml(CHART / "values.yaml")
    assert StorageConfig(config=config_from_chart(config_json(values))).url == ""
    values["trainhub"]["storage"].update({"url": "s3://bucket/platform", "endpointUrl": "http://10.244.0.1:9000"})
    # the chart's own defaults are the policy's (one meaning: the values file says what the service would choose)
    defaults = CullPolicy(config=config_from_chart(config_json(values)))
    assert (defaults.learn_release_clock, defaults.reversal_price, defaults.new_user_release_timeout,
            defaults.start_grace_period) == (CullPolicy.learn_release_clock.default_value,
                                             CullPolicy.reversal_price.default_value,
                                             CullPolicy.new_user_release_timeout.default_value,
                                             CullPolicy.start_grace_period.default_value)
    values["trainhub"]["culler"].update({"warningPeriod": 7, "releaseTimeout": 11, "releaseWarningPeriod": 5,
                                         "learnReleaseClock": False, "reversalPrice": 600, "newUserReleaseTimeout": 13,
                                         "startGracePeriod": 0})
    c = config_from_chart(config_json(values))
    storage = StorageConfig(config=c)
    assert (storage.url, storage.endpoint_url) == ("s3://bucket/platform", "http://10.244.0.1:9000")
    policy = CullPolicy(config=c)
    assert (policy.warning_period, policy.release_timeout, policy.release_warning_period) == (7, 11, 5)
    assert (policy.learn_release_clock, policy.reversal_price, policy.new_user_release_timeout,
            policy.start_grace_period) == (False, 600, 13, 0)


def test_chart_services_config_configures_the_jobs_service(tmp_path, monkeypatch):
    """The chart runs the jobs service with --config services_config.py (configmap.yaml): the
    composition root's config_from_chart over trainhub.json, as the culler gets it."""
    from test_helm_chart import CHART, config_json, load_yaml, services_config_py

    from trainhub.metrics.prometheus import PrometheusDCGMSource
    from trainhub.services.jobs.app import JobsService
    from trainhub.settings import Runtime
    from trainhub.spawner.k8s_allocator import KubernetesGPUAllocator

    values = load_yaml(CHART / "values.yaml")
    values["trainhub"]["metrics"]["prometheusUrl"] = "http://prometheus:9090"
    values["trainhub"]["quotas"]["userGpuLimit"] = 3
    (tmp_path / "trainhub.json").write_text(json.dumps(config_json(values)))
    (tmp_path / "services_config.py").write_text(services_config_py())
    monkeypatch.setenv("TRAINHUB_K8S_CONFIG", str(tmp_path / "trainhub.json"))
    monkeypatch.delenv("TRAINHUB_CONFIG", raising=False)
    (tmp_path / "data").mkdir()
    Runtime(data_dir=str(tmp_path / "data")).save()
    service = JobsService()
    service.initialize(["--data-dir", str(tmp_path / "data"), "--config", str(tmp_path / "services_config.py")])
    try:
        assert isinstance(service.launcher, KubernetesLauncher) and service.launcher.namespace == "trainhub"
        assert isinstance(service.allocator, KubernetesGPUAllocator)
        assert service.quota.user_gpu_limit == 3
        assert [p.slug for p in service.catalog.all()] == [p["slug"] for p in values["trainhub"]["profiles"]]
        assert service.metrics_source_class is PrometheusDCGMSource
    finally:
        service.allocator.close()
    with pytest.raises(SystemExit, match="is not a file"):
        JobsService().initialize(["--data-dir", str(tmp_path / "data"), "--config", str(tmp_path / "missing.py")])


# ---------------------------------------------------------------------------------------------
# the real job engine driving the launcher


@pytest_asyncio.fixture
async def engine_with(make_launcher, tmp_path):
    from trainhub.ledger import LocalGPUAllocator
    from trainhub.quotas import QuotaPolicy
    from trainhub.services.jobs.engine import JobEngine
    from trainhub.services.jobs.outputs import OutputSyncer
    from trainhub.services.jobs.store import JobStore
    from trainhub.storage import StorageConfig

    db = f"sqlite:///{tmp_path}/platform.db"
    store = JobStore(db)
    devices = [{"index": i, "name": "A100", "uuid": f"GPU-{i}", "memory_total_mb": 40960, "simulated": True} for i in range(4)]
    allocator = LocalGPUAllocator(db_url=db, device_list=devices)
    launcher = make_launcher()
    storage = StorageConfig()
    engine = JobEngine(store, allocator, launcher, QuotaPolicy(), storage, OutputSyncer(storage), catalog=launcher.catalog,
                       grace_period=2)
    return engine


async def _run_until(engine, job_id, states, timeout=10):
    async def check():
        await engine.run_once()
        job = await engine.store.read(engine.store.get, job_id)
        return job if job.state in states else None
    return await until(check, timeout=timeout, what=f"job in {states}")


async def test_engine_runs_a_gang_to_success_with_logs_and_metrics(kube, engine_with):
    engine = engine_with
    job = await engine.store.write(engine.store.create, user="alice", name="train", command="python train.py",
                                   workers=2, gpus=1, profile="gpu-1")
    running = await _run_until(engine, job.id, {"running"})
    name = running.launch_state["name"]
    assert running.launch_state["workers"] == [{"rank": 0, "devices": [0]}, {"rank": 1, "devices": [1]}]
    pods = await running_pods(kube, name, 2)
    for rank, pod in pods.items():
        kube.add_log_line(NS, pod["metadata"]["name"], f"hello from {rank}")
        kube.add_log_line(NS, pod["metadata"]["name"], jm.METRICS_MARK + json.dumps({"time": 1.5, "step": 1, "values": {"loss": 1.0 / (rank + 1)}}))
        await kube.finish_pod(NS, pod["metadata"]["name"], 0)
    done = await _run_until(engine, job.id, {"succeeded"})
    assert done.exit_codes == [0, 0] and done.reason == "all 2 workers exited with code 0"
    log1 = open(os.path.join(done.launch_state["dir"], "worker-1.log")).read()
    assert LOG_LINE.match(log1.splitlines()[0]).groups() == ("1", "hello from 1")
    metrics = (await engine.store.read(engine.store.metrics, job.id))["metrics"]
    assert sorted((m["worker"], m["step"], m["values"]["loss"]) for m in metrics) == [(0, 1, 1.0), (1, 1, 0.5)]
    assert kube.get(JOBS, NS, name) is None  # cleaned up
    assert await asyncio.to_thread(engine.allocator.holdings) == []


async def test_engine_cancel_terminates_the_job(kube, engine_with):
    engine = engine_with
    job = await engine.store.write(engine.store.create, user="alice", name="train", command="sleep 1000", workers=1, gpus=1,
                                   profile="gpu-1")
    running = await _run_until(engine, job.id, {"running"})
    await running_pods(kube, running.launch_state["name"], 1)
    await engine.store.write(engine.store.request_cancel, job.id, "alice")
    done = await _run_until(engine, job.id, {"cancelled"})
    assert done.exit_codes == [-15] and kube.get(JOBS, NS, running.launch_state["name"]) is None


@GANG_TERMINATION_RACE
async def test_engine_fails_the_gang_when_one_worker_fails(kube, engine_with):
    engine = engine_with
    job = await engine.store.write(engine.store.create, user="alice", name="train", command="python train.py",
                                   workers=2, gpus=1, profile="gpu-1")
    running = await _run_until(engine, job.id, {"running"})
    pods = await running_pods(kube, running.launch_state["name"], 2)
    await kube.finish_pod(NS, pods[1]["metadata"]["name"], 3)
    done = await _run_until(engine, job.id, {"failed"})
    assert done.exit_codes[1] == 3 and done.exit_codes[0] in (-15, -9)
    assert done.reason.startswith("worker 1 exited with code 3")


async def test_engine_requeues_a_gang_the_cluster_places_only_partly(kube, engine_with):
    """Without Kueue nothing places a gang whole: with other pods holding most of the node's GPUs, rank 0 runs and
    rank 1 stays unschedulable. After gang_timeout the attempt is stopped (its Job deleted, rank 0's GPUs back) and
    the job requeued with the scheduler's message, no retry spent; once the cluster has room an attempt runs whole.
    (The engine's ledger here is a local one that cannot see the other pods, so it relaunches at once; on a cluster
    the KubernetesGPUAllocator counts them and the job waits in the queue.)"""
    engine = engine_with
    engine.launcher.gang_timeout = 1.0
    await engine.launcher._connect()
    blocker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-elses-training", "namespace": NS},
               "spec": {"containers": [{"name": "c", "image": TEST_IMAGE,
                                        "resources": {"limits": {"nvidia.com/gpu": "5"}, "requests": {"nvidia.com/gpu": "5"}}}],
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
    await engine.launcher._core.create_namespaced_pod(NS, blocker)
    job = await engine.store.write(engine.store.create, user="alice", name="gang", command="python train.py",
                                   workers=2, gpus=2, profile="gpu-2")
    try:
        first = (await _run_until(engine, job.id, {"running"})).launch_state["name"]

        async def stalled_event():
            await engine.run_once()
            return [e for e in await engine.store.read(engine.store.events, job.id) if e["kind"] == "stalled"]
        (event, *_) = await until(stalled_event, timeout=30, what="the partly placed gang to be stopped")
        assert re.fullmatch(r"only 1 of 2 workers could be placed on the cluster for 1s \(worker 1: 0/\d+ nodes are "
                            r"available: .*Insufficient nvidia\.com/gpu.*\): requeueing", event["message"]), event
        await until(lambda: kube.get(JOBS, NS, first) is None, what="the partial attempt's Job deleted")
        current = await engine.store.read(engine.store.get, job.id)
        assert current.state in ("queued", "running") and "failed" not in [e["kind"] for e in
                                                                            await engine.store.read(engine.store.events, job.id)]
    finally:
        await engine.launcher._core.delete_namespaced_pod("someone-elses-training", NS, grace_period_seconds=0)

    async def whole():
        await engine.run_once()
        job_now = await engine.store.read(engine.store.get, job.id)
        name = (job_now.launch_state or {}).get("name")
        pods = job_pods(kube, name) if name and job_now.state == "running" else {}
        return job_now if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods.values()) else None
    again = await until(whole, timeout=30, what="an attempt placed whole once the cluster has room")
    assert again.retries == 0 and again.state == "running"
    await engine.store.write(engine.store.request_cancel, job.id, "alice")
    await _run_until(engine, job.id, {"cancelled"}, timeout=30)
