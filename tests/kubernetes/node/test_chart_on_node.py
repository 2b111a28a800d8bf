"""The Helm chart on a real node: its default values (plus the bare node's own overrides) start, and notebook and
job pods really run (containerd + runc, kubelet v1.20.2, the real control plane; see conftest.py).

One installation for the module; the tests run in order and build on each other's state (a stateful end-to-end
walk, as an admin and two users would): alice's notebook is up before her %%train job; bob's GPU server is up
before the upgrade that turns the culler on, which then releases it.

Each day-one defect of the chart's defaults is proven fixed here, on the real node:

* the hub starts with the defaults (roles named services that were off; pycurl and jupyterhub-idle-culler were not
  in the hub image) — ``test_the_chart_starts_with_its_default_values``;
* the default CPU profile fits a 2-CPU node (it requested 4 CPUs) and a profile no node can hold is refused with the
  reason on the spawn page, never left Pending — ``test_a_user_spawns_a_notebook_reached_through_the_proxy``,
  ``test_a_profile_no_node_can_hold_is_refused_with_the_reason``;
* the jobs service listens where its Service points, reads its config without `trainhub up`, and notebook servers'
  tokens may call it — ``test_train_runs_a_job_pod_through_the_launcher_and_values_come_back``.
"""

from __future__ import annotations

import ipaddress
import json
import re
import textwrap

import pytest
import yaml
from chart import CHART, NAMESPACE
from node import NODE_NAME
from waiting import wait_for

pytestmark = pytest.mark.timeout(900)

CHART_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
# the chart's default CPU profile before the fix: limits only, so Kubernetes requested its 4 CPUs
OLD_CPU_PROFILE = {"slug": "cpu-4", "display_name": "4 CPUs", "gpus": 0, "cpu_limit": 4, "mem_limit": "16G"}


def _labels(pod):
    return pod["metadata"].get("labels") or {}


def _running(site, name):
    pod = site.pod(name)
    return pod if pod and (pod.get("status") or {}).get("phase") == "Running" else None


def _s3_text(site, key):
    try:
        return site.s3.client.get_object(Bucket="trainhub", Key=key)["Body"].read().decode()
    except site.s3.client.exceptions.NoSuchKey:
        return None


def test_the_chart_starts_with_its_default_values(site):
    hub = site.deployment_pod("hub", "component=hub")
    assert hub["spec"]["nodeName"] == NODE_NAME
    # the images the chart's defaults name, imported on the node, never pulled
    images = {c["image"] for p in site.pods() for c in p["spec"]["containers"]}
    assert {"ghcr.io/trainhub/trainhub-hub:0.1.0", "ghcr.io/trainhub/trainhub:0.1.0"} <= images
    for pod in site.pods():
        for cs in pod["status"].get("containerStatuses") or []:
            assert cs["ready"] and cs["restartCount"] == 0, (pod["metadata"]["name"], cs)
    events = site.get(f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    assert any(e["reason"] == "Pulled" and "already present on machine" in e["message"] for e in events)
    assert not [e["message"] for e in events if e["reason"] in ("Pulling", "ErrImagePull", "ErrImageNeverPull")]
    # JupyterHub loaded the roles (none names a service that is off) and started the JupyterHub chart's idle culler,
    # which made its first pass (the hub image has jupyterhub-idle-culler and pycurl, which the chart's config needs)
    log = wait_for(lambda: site.pod_logs(hub["metadata"]["name"]),
                   lambda text: "(jupyterhub-idle-culler@" in text, what="the idle culler's first request to the hub")
    assert "Found undefined service" not in log and "Traceback" not in log
    assert "Role trainhub-jobs-service added to database" in log
    assert "trainhub-culler-service" not in log  # the trainhub culler is off by default: no role for it
    # what 1.20 cannot serve is named, not silently dropped: only the placeholders' PodDisruptionBudget (policy/v1)
    assert [s.split(" ")[0] for s in site.install.skipped] == ["PodDisruptionBudget/user-placeholder"]


def test_a_user_spawns_a_notebook_reached_through_the_proxy(site):
    alice = site.user("alice")
    page = alice.spawn_page()
    assert re.search(r'value="cpu"[^>]*checked', page) and "cannot start" not in page
    alice.spawn("cpu")
    status = alice.notebook("api/status")
    assert status.status_code == 200 and "last_activity" in status.json()
    pod = _running(site, "jupyter-alice")
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(site.node.subnet)
    # the default CPU profile's guarantees are the requests: 0.5 CPU fits the 2-CPU node (its old 4 CPUs did not)
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    assert requests["cpu"] in ("500m", "0.5") and site.node.allocatable()["cpu"] == "2"
    out = json.loads(alice.run(textwrap.dedent("""
        import json, os, subprocess, fsspec
        shm = subprocess.run(["df", "--output=fstype", "/dev/shm"], capture_output=True, text=True).stdout.split()[-1]
        fs, root = fsspec.core.url_to_fs(os.environ["TRAINHUB_STORAGE_URL"], **json.loads(os.environ["TRAINHUB_STORAGE_OPTIONS"]))
        fs.pipe(root + "/hello.txt", b"from alice's notebook pod")
        creds = json.load(open("/run/trainhub/credentials/credentials.json"))
        print(json.dumps({"api": os.environ.get("TRAINHUB_API_URL"), "shm": shm,
                          "train": "train" in get_ipython().magics_manager.magics["cell"],
                          "storage": os.environ.get("TRAINHUB_STORAGE_URL"), "listed": fs.ls(root, detail=False),
                          "config": os.environ.get("AWS_CONFIG_FILE"), "key": creds["AccessKeyId"],
                          "env": json.dumps(dict(os.environ)), "token": bool(creds.get("SessionToken")),
                          "api_token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")}))
        """)).strip().splitlines()[-1])
    # the pod's own credentials, minted for alice through moto's STS and read through the mounted Secret's config:
    # the platform's key is nowhere in the notebook's environment
    assert out["config"] == "/run/trainhub/credentials/config" and out["token"] and out["key"] != site.s3.key
    assert site.s3.key not in out["env"] and site.s3.secret not in out["env"] and "AWS_SECRET_ACCESS_KEY" not in out["env"]
    assert out["api_token"] is False  # nothing to ask the API for another user's credentials Secret with
    assert out["api"] == f"http://trainhub-jobs.{NAMESPACE}.svc:8080/services/trainhub/api"
    assert out["shm"] == "tmpfs" and out["train"] is True
    assert out["storage"] == "s3://trainhub/platform/users/alice"
    assert any(p.endswith("users/alice/hello.txt") for p in out["listed"])
    body = site.s3.client.get_object(Bucket="trainhub", Key="platform/users/alice/hello.txt")["Body"].read()
    assert body == b"from alice's notebook pod"
    # the storage mounted in the pod (rclone sidecars; 1.20 has no native sidecars, so they run beside the notebook
    # and the mount appears in it once they have started)
    containers = [c["name"] for c in pod["spec"]["containers"]]
    assert containers == ["notebook", "trainhub-storage-home", "trainhub-storage-datasets"]
    home = "/mnt/trainhub/home"
    wait_for(lambda: alice.run("print(open('/proc/mounts').read())"), lambda mounts: f" {home} fuse" in mounts,
             what=f"the storage mounted at {home} in alice's notebook", timeout=120, interval=1)
    seen = alice.run(textwrap.dedent(f"""
        print(open("{home}/hello.txt").read())
        with open("{home}/through-the-mount.txt", "w") as f:
            f.write("written in the mount")
        """))
    assert seen.strip() == "from alice's notebook pod"
    body = wait_for(lambda: _s3_text(site, "platform/users/alice/through-the-mount.txt"),
                    what="the file written in the mount to reach S3", timeout=60)
    assert body == "written in the mount"


def test_train_runs_a_job_pod_through_the_launcher_and_values_come_back(site):
    alice = site.user("alice")
    out = alice.run(textwrap.dedent('''
        import json, os
        get_ipython().run_cell_magic("train", "--return answer,where --as job --wait", """
        import os, socket
        answer = 6 * 7
        where = {"hostname": socket.gethostname(), "rank": os.environ.get("RANK"), "job": os.environ.get("TRAINHUB_JOB_ID"),
                 "pod_cgroup": "kubepods" in open("/proc/self/cgroup").read()}
        print("hello from the job", where["hostname"])
        """)
        print("RESULT " + json.dumps({"answer": answer, "where": where, "state": job.status,
                                      "logs": job.logs()}))
        '''), timeout=600)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["answer"] == 42 and result["state"] == "succeeded"
    where = result["where"]
    # a pod of trainhub's launcher (its hostname: <job>-<rank>, the per-worker form on 1.20), in the kubelet's cgroups
    assert re.fullmatch(r"trainhub-j-\d+-a1-0", where["hostname"]) and where["rank"] == "0" and where["pod_cgroup"]
    assert "hello from the job" in result["logs"]
    # the launcher's Job ran on the node: the kubelet of trainhub-node reported its pod (the API server's audit log)
    worker_job = f"{where['hostname'][:-2]}-w0"
    audit = [json.loads(line) for line in open(site.plane.audit_log)]
    assert any(e.get("verb") == "create" and (e.get("objectRef") or {}).get("resource") == "jobs"
               and e["objectRef"].get("name") == worker_job
               and e["user"]["username"] == f"system:serviceaccount:{NAMESPACE}:trainhub-jobs" for e in audit)
    assert any(e["user"]["username"] == f"system:node:{NODE_NAME}" and (e.get("objectRef") or {}).get("resource") == "pods"
               and (e["objectRef"].get("name") or "").startswith(worker_job) and e.get("verb") == "patch" for e in audit)


def _notebook_with_a_parameter() -> dict:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("lr = 0.1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import socket\nopen('side.txt', 'w').write(str(lr * 2))\nprint('LR IS', lr, 'ON', socket.gethostname())")]
    return json.loads(nbformat.writes(nb))


def _outputs_text(nb: dict) -> str:
    return "".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o.get("text", []))
                   for c in nb["cells"] for o in c.get("outputs", []))


def test_a_notebook_job_runs_papermill_in_a_job_pod_and_the_executed_notebook_comes_back(site):
    """JupyterLab's Create Notebook Job through jupyter-scheduler's REST API in alice's server: a notebook in her
    storage area (~/storage, the link to the rclone mount) with a parameter runs as a trainhub job pod (papermill in
    the trainhub image); the executed notebook and the file it wrote appear next to the input, in S3 and in her
    JupyterLab through the mount. A notebook in the server's own home is refused with what to do."""
    import requests

    alice = site.user("alice")
    base = f"{site.url}/user/alice"

    def call(method, path, **kw):
        return requests.request(method, f"{base}/{path}", headers=alice.headers, timeout=120, **kw)

    # the storage area is in JupyterLab's file browser (the spawner's postStart link to the mount)
    link = wait_for(lambda: call("GET", "api/contents/storage", params={"content": "1"}),
                    lambda r: r.status_code == 200, what="~/storage in alice's JupyterLab", timeout=60)
    assert link.json()["type"] == "directory"
    assert call("PUT", "api/contents/storage/nbjobs", json={"type": "directory"}).status_code in (200, 201)
    put = call("PUT", "api/contents/storage/nbjobs/train.ipynb",
               json={"type": "notebook", "format": "json", "content": _notebook_with_a_parameter()})
    assert put.status_code in (200, 201), put.text
    # a notebook in the server's own home: a job pod cannot see it, so it is refused, saying what to do
    assert call("PUT", "api/contents/home.ipynb",
                json={"type": "notebook", "format": "json", "content": _notebook_with_a_parameter()}).status_code in (200, 201)
    refused = call("POST", "scheduler/jobs", json={"input_uri": "home.ipynb", "runtime_environment_name": "cpu",
                                                   "name": "at-home", "output_formats": ["ipynb"]})
    assert refused.status_code == 400 and "Move the notebook into your storage area" in refused.json()["message"], refused.text
    made = call("POST", "scheduler/jobs", json={
        "input_uri": "storage/nbjobs/train.ipynb", "runtime_environment_name": "cpu", "name": "nb-on-k8s",
        "parameters": {"lr": "0.75"}, "output_formats": ["ipynb"], "compute_type": "cpu"})
    assert made.status_code == 200, made.text
    job_id = made.json()["job_id"]
    done = wait_for(lambda: call("GET", f"scheduler/jobs/{job_id}").json(),
                    lambda j: j["status"] in ("COMPLETED", "FAILED", "STOPPED"), what=f"notebook job {job_id} ending",
                    timeout=480, interval=2)
    if done["status"] != "COMPLETED":
        pods = [p["metadata"]["name"] for p in site.pods() if p["metadata"]["name"].startswith("trainhub-j-")]
        pytest.fail(f"the notebook job ended {done['status']}: {done.get('status_message')}\n"
                    + "\n".join(site.pod_logs(p)[-3000:] for p in pods))
    # papermill ran in a job pod of trainhub's launcher (its hostname), and what it made went to alice's area in S3
    executed = json.loads(wait_for(lambda: _s3_text(site, f"platform/users/alice/nbjobs/train-{job_id}.ipynb"),
                                   what="the executed notebook in S3", timeout=60))
    text = _outputs_text(executed)
    assert re.search(r"LR IS 0\.75 ON trainhub-j-\d+-a1-0", text), text
    assert _s3_text(site, "platform/users/alice/nbjobs/side.txt") == "1.5"
    # ... and it is next to the input in her JupyterLab (the mount lists S3 again within its 30 s directory cache)
    seen = wait_for(lambda: call("GET", f"api/contents/storage/nbjobs/train-{job_id}.ipynb", params={"content": "1"}),
                    lambda r: r.status_code == 200, what="the executed notebook in alice's JupyterLab", timeout=120,
                    interval=2)
    assert "LR IS 0.75" in _outputs_text(seen.json()["content"])
    files = {f["file_format"]: f["file_path"] for f in call("GET", f"scheduler/jobs/{job_id}").json()["job_files"]}
    assert files["ipynb"] == f"storage/nbjobs/train-{job_id}.ipynb", files


def test_a_gpu_profile_gets_simulated_devices_the_ledger_counts(site):
    from trainhub.spawner.k8s_allocator import KubernetesGPUAllocator

    bob = site.user("bob")
    assert "1 × nvidia.com/gpu · 2 of 2 free" in bob.spawn_page()
    bob.spawn("gpu-1")
    pod = _running(site, "jupyter-bob")
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = json.loads(bob.run('import json, os; print(json.dumps({k: os.environ.get(k) for k in '
                             '("NVIDIA_VISIBLE_DEVICES", "TRAINHUB_SIMULATED_GPUS", "TRAINHUB_GPUS")}))').strip())
    # the device plugin's Allocate answer: the simulated device the kubelet gave this container
    assert re.fullmatch(r"sim-gpu-[01]", env["NVIDIA_VISIBLE_DEVICES"]) and env["TRAINHUB_GPUS"] == "1"
    assert env["TRAINHUB_SIMULATED_GPUS"] == env["NVIDIA_VISIBLE_DEVICES"]
    allocator = KubernetesGPUAllocator(kubeconfig=site.kubeconfig, namespace=NAMESPACE)
    try:
        devices = allocator.devices()
        assert [d.name for d in devices] == ["Simulated-GPU on trainhub-node"] * 2
        held = wait_for(allocator.holdings, lambda h: any(x.holder == "server:bob/" for x in h),
                        what="bob's server in the ledger's holdings")
        assert [(x.holder, x.user) for x in held] == [("server:bob/", "bob")]
    finally:
        allocator.close()
    carol = site.user("carol")
    assert "1 × nvidia.com/gpu · 1 of 2 free" in carol.spawn_page()


def test_stopping_a_server_deletes_its_pod(site):
    alice = site.user("alice")
    assert site.pod("jupyter-alice")
    alice.stop()
    wait_for(lambda: site.pod("jupyter-alice"), lambda p: p is None, what="jupyter-alice to be deleted", timeout=120)


def test_an_upgrade_restarts_the_hub_and_keeps_the_servers(site, prometheus):
    bob = site.pod("jupyter-bob")
    hub = site.deployment_pod("hub", "component=hub")["metadata"]["name"]
    install = site.upgrade({"trainhub": {
        "profiles": CHART_VALUES["trainhub"]["profiles"] + [OLD_CPU_PROFILE],
        # the culler, with DCGM utilisation from the test's Prometheus stand-in and clocks short enough for a test:
        # one fixed release clock for all (bob is a new user: the learned clock would start him at 15 min) and no
        # first-minutes grace (the walk starts when bob's server took its GPU)
        "culler": {"enabled": True, "idleTimeout": 120, "awayTimeout": 0, "checkInterval": 3, "warningPeriod": 3,
                   "releaseTimeout": 12, "releaseWarningPeriod": 3, "learnReleaseClock": False, "startGracePeriod": 0},
        "metrics": {"prometheusUrl": prometheus.url}}})
    assert "trainhub-culler" in {o["metadata"]["name"] for o in install.applied if o["kind"] == "Deployment"}
    wait_for(lambda: site.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/trainhub-culler"),
             lambda d: (d.get("status") or {}).get("readyReplicas") == 1, what="the culler to be ready", timeout=180)
    assert site.deployment_pod("hub", "component=hub")["metadata"]["name"] != hub
    # the notebook pod lived through the hub's restart, and the new hub reaches it
    assert site.pod("jupyter-bob")["metadata"]["uid"] == bob["metadata"]["uid"]
    assert site.user("bob").notebook("api/status").status_code == 200


def test_the_culler_releases_an_idle_gpu_server_to_the_cpu_profile(site, prometheus):
    gpu_pod = site.pod("jupyter-bob")
    assert _labels(gpu_pod)["trainhub.io/profile"] == "gpu-1"
    prometheus.idle(NAMESPACE, "jupyter-bob", 1)  # DCGM: its GPU at 0 %

    def released():
        pod = _running(site, "jupyter-bob")
        return pod if pod and pod["metadata"]["uid"] != gpu_pod["metadata"]["uid"] else None

    pod = wait_for(released, what="the culler to release bob's GPUs (a new pod on the CPU profile)", timeout=300,
                   interval=1)
    assert _labels(pod)["trainhub.io/profile"] == "cpu"
    assert "nvidia.com/gpu" not in (pod["spec"]["containers"][0]["resources"].get("limits") or {})
    assert any("jupyter-bob" in q for q in prometheus.queries)
    culler = site.deployment_pod("culler", "app.kubernetes.io/component=culler")["metadata"]["name"]
    assert re.search(r"releas\w* .*bob", site.pod_logs(culler))
    bob = site.user("bob")
    wait_for(lambda: bob.notebook("api/status").status_code, lambda s: s == 200, what="bob's server back on the CPU")


def test_a_profile_no_node_can_hold_is_refused_with_the_reason(site):
    carol = site.user("carol")
    page = carol.spawn_page()
    row = re.search(r'<label[^>]*>(?:(?!</label>).)*value="cpu-4"(?:(?!</label>).)*</label>', page, re.S)[0]
    assert "disabled" in row
    # its memory request is the JupyterHub chart's singleuser.memory.guarantee (1G): that fits; 4 CPUs do not
    assert "needs 4 CPUs and 1 GiB of memory for each server, and no node can hold that" in row
    assert "the most any node it may use offers is 2 CPUs" in row
    # the JupyterHub chart answers every spawn at once (slow_spawn_timeout 0): the refusal ends the spawn's progress
    # (the pending page shows it), the hub refused it before any pod was made: nothing is left Pending
    resp = carol.start("cpu-4")
    assert resp.status_code in (202, 400), resp.text
    if resp.status_code == 400:
        message = resp.json()["message"]
    else:
        last = carol.progress()[-1]
        assert last.get("failed"), last
        message = last["message"]
    assert "needs 4 CPUs" in message and "no node can hold that" in message
    assert site.pod("jupyter-carol") is None
    assert carol.server() is None
