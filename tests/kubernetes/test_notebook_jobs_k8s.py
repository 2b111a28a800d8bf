"""Notebook jobs (JupyterLab's "Create Notebook Job", ``trainhub.notebookjobs``) on the Kubernetes back end.

A job pod never sees the notebook server's home, so a notebook job on Kubernetes is one whose notebook lies in the
user's storage area (the server's ``~/storage`` link to its storage mount): the pod runs papermill in a scratch
folder and puts the executed notebook and the files it wrote into the input's folder of the area. Here:

* the launcher's Job for a notebook job, on the stand-in and on the real v1.20 control plane (``--kube=real``; its
  real Job controller makes the pod), then that pod's container played for real: its own command and environment
  as the API server stored them, run with ``sh`` (papermill, a real kernel), the outputs landing in the storage area;
* a notebook job whose notebook is in the server's home, or on a platform without storage, refused at submission
  with what to do (``KubernetesLauncher.check``), as a schedule of one is;
* a schedule (the jobs service's) firing as its owner: the real jobs service object with the Kubernetes launcher,
  its run's Job made in the cluster with the owner's annotation.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta

import nbformat
import pytest
from k8s_test_config import NAMESPACE, PROFILES, TEST_IMAGE
from kube_standin import JOBS, PODS
from traitlets.config import Config
from waiting import await_for

from trainhub.exceptions import InvalidRequest
from trainhub.notebookjobs import ENV, job_spec
from trainhub.services.jobs import k8s_job_manifests as jm
from trainhub.services.jobs.kubernetes import KubernetesLauncher
from trainhub.services.jobs.launcher import JobView, WorkerStatus
from trainhub.services.jobs.spec import validate_spec
from trainhub.storage import StorageConfig

USER = "alice"


def notebook():
    """A notebook whose parameter shows in its output and in a file it writes next to itself."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("lr = 0.1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import os\nprint(f'lr is {lr}')\nopen('result.txt', 'w').write(f'{lr * 2}')\nprint('cwd', os.getcwd())")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def launcher_for(kubeconfig, tmp_path, storage, **traits):
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    return KubernetesLauncher(config=c, kubeconfig=kubeconfig, namespace=NAMESPACE, image=TEST_IMAGE, storage=storage,
                              jobs_dir=str(tmp_path / "jobs"), request_timeout=5, retry_timeout=5, log_interval=0.05,
                              **traits)


def pod_of(kube, name):
    for (ns, _), p in kube.store(PODS).items():
        labels = p["metadata"].get("labels") or {}
        if ns == NAMESPACE and labels.get(jm.JOB_NAME_LABEL) == name and (p.get("status") or {}).get("phase") == "Running":
            return p
    return None


def play_container(pod, tmp_path):
    """Run the pod's worker container as the kubelet would: its command, its plain env values (the downward API's
    RANK given as the pod's index), with this machine's Python and a scratch folder for /trainhub."""
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == jm.CONTAINER]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    root = tmp_path / "pod"
    root.mkdir()
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], HOME=str(tmp_path / "pod-home"),
               RANK=str(jm.pod_index(pod)), TRAINHUB_PYTHON=sys.executable, TRAINHUB_JOB_DIR=str(root),
               TRAINHUB_OUTPUTS_DIR=str(root / "outputs"), TRAINHUB_METRICS_FILE=str(root / "metrics.jsonl"))
    (tmp_path / "pod-home").mkdir()
    return subprocess.run(c["command"], env=env, capture_output=True, text=True, timeout=240)


async def test_a_notebook_job_runs_papermill_in_its_pod_and_the_outputs_land_next_to_the_input(kube_backend, tmp_path):
    storage = StorageConfig(url=str(tmp_path / "storage"))
    storage.ensure_layout([USER])
    area = storage.user_url(USER)
    os.makedirs(os.path.join(area, "exp"))
    spec = job_spec(notebook(), "storage/exp/train.ipynb", parameters={"lr": "0.75"}, storage_path="exp/train.ipynb",
                    output_formats=["ipynb", "html"])
    async with kube_backend(nodes=("cpu-a",), jobs=True, namespaces=(NAMESPACE,)) as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE)
        launcher = launcher_for(kubeconfig, tmp_path, storage)
        launcher.check(validate_spec(dict(spec, profile="cpu")))  # in the storage area: accepted
        view = JobView(id=41, key="j-000041", user=USER, name=spec["name"], command=None, script=spec["script"],
                       workers=1, gpus=0, env=spec["env"], attempt=1, time_limit=600.0, params={}, profile="cpu")
        try:
            state = await launcher.launch(view, [[]], {"PATH": "/usr/bin", "TRAINHUB_JOB_ID": view.key,
                                                       "TRAINHUB_USER": USER, "TRAINHUB_STORAGE_URL": area})
            name = state["name"]
            pod = await await_for(lambda: pod_of(kube, name), what="the notebook job's pod running", timeout=60)
            assert pod["metadata"]["annotations"]["trainhub.io/username"] == USER
            ran = await asyncio.to_thread(play_container, pod, tmp_path)
            assert ran.returncode == 0, ran.stdout + ran.stderr
            executed = nbformat.read(os.path.join(area, "exp", f"train-{view.key}.ipynb"), as_version=4)
            texts = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
            assert "lr is 0.75" in texts and "injected-parameters" in executed.cells[1].metadata.tags
            # the side file the notebook wrote with a relative path, and the HTML, next to the input in the area
            assert open(os.path.join(area, "exp", "result.txt")).read() == "1.5"
            assert "lr is 0.75" in open(os.path.join(area, "exp", f"train-{view.key}.html")).read()
            # it ran in the pod's scratch folder, not in a folder of this machine's storage
            assert f"cwd {tmp_path / 'pod' / 'notebook' / 'storage' / 'exp'}" in texts
            await kube.finish_pod(NAMESPACE, pod["metadata"]["name"], ran.returncode)

            async def ended():
                return await launcher.poll(view, state)

            assert await await_for(ended, lambda s: not s[0].running, what="the worker's end", timeout=60) == \
                [WorkerStatus(0, False, 0)]
            await launcher.cleanup(view, state)
        finally:
            await launcher.close()


def test_a_notebook_in_the_servers_home_or_without_storage_is_refused_with_what_to_do(tmp_path):
    storage = StorageConfig(url=str(tmp_path / "storage"))
    launcher = launcher_for("", tmp_path, storage)
    at_home = validate_spec(job_spec(notebook(), "exp/train.ipynb"))
    with pytest.raises(InvalidRequest) as refused:
        launcher.check(at_home)
    assert "exp/train.ipynb is in your notebook server's own home folder" in refused.value.message
    assert "Move the notebook into your storage area" in refused.value.message
    launcher.check(validate_spec({"command": "python train.py"}))  # other jobs: nothing to say
    launcher.check(validate_spec(job_spec(notebook(), "storage/exp/train.ipynb", storage_path="exp/train.ipynb")))
    bare = launcher_for("", tmp_path, StorageConfig(url=""))
    with pytest.raises(InvalidRequest, match="this platform has no storage configured"):
        bare.check(validate_spec(job_spec(notebook(), "storage/exp/train.ipynb", storage_path="exp/train.ipynb")))


@pytest.fixture
def jobs_service(tmp_path, monkeypatch):
    """A real jobs service object (its database, submit path, engine) with the Kubernetes launcher: ``make(kubeconfig)``."""
    from trainhub.gpus import simulated_devices
    from trainhub.settings import Runtime

    for var in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "TRAINHUB_K8S_CONFIG", "TRAINHUB_CONFIG",
                "JUPYTERHUB_SERVICE_PREFIX", "TRAINHUB_JOB_NAMESPACE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "data").mkdir()
    Runtime(data_dir=str(tmp_path / "data"), devices=[d.to_dict() for d in simulated_devices(1)], simulated=True).save()
    made = []

    def make(kubeconfig):
        from trainhub.services.jobs.app import JobsService
        from trainhub.services.notebooks.schedules import NotebookSchedules

        JobsService.clear_instance()
        app = JobsService()
        app.initialize(["--data-dir", str(tmp_path / "data"),
                        "--JobsService.launcher_class=trainhub.services.jobs.kubernetes.KubernetesLauncher",
                        f"--KubernetesLauncher.kubeconfig={kubeconfig}", f"--KubernetesLauncher.namespace={NAMESPACE}",
                        f"--KubernetesLauncher.image={TEST_IMAGE}", f"--StorageConfig.url={tmp_path / 'storage'}",
                        f"--ProfileCatalog.profiles={json.dumps(PROFILES)}", "--ProfileCatalog.default_profile=cpu"])
        app.notebook_schedules = NotebookSchedules(service=app, parent=app, interval=0)
        made.append(app)
        return app

    yield make
    from trainhub.services.jobs.app import JobsService

    JobsService.clear_instance()


async def test_a_schedule_fires_as_its_owner_and_its_run_is_a_job_of_theirs_in_the_cluster(kube_backend, jobs_service,
                                                                                            tmp_path):
    from trainhub.exceptions import TrainhubError
    from trainhub.services.notebooks.schedules import Owner

    async with kube_backend(nodes=("cpu-a",), jobs=True, namespaces=(NAMESPACE,)) as kube:
        app = jobs_service(kube.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE))
        s = app.notebook_schedules
        try:
            at_home = job_spec(notebook(), "exp/train.ipynb", parameters={"lr": "0.5"}, profile="cpu")
            with pytest.raises(TrainhubError, match="a job's pod on Kubernetes cannot see"):
                await s.create(Owner(USER), {"name": "nightly", "schedule": "0 3 * * *", "job": at_home})
            assert s.store.list(None) == []  # nothing stored
            spec = job_spec(notebook(), "storage/exp/train.ipynb", parameters={"lr": "0.5"}, profile="cpu",
                            storage_path="exp/train.ipynb")
            made = await s.create(Owner(USER), {"name": "nightly", "schedule": "0 3 * * *", "job": spec,
                                                "notebook": json.loads(spec["env"][ENV])})
            await s.move_clock(s.now() + timedelta(days=1, minutes=1))
            report = await s.run_pass()
            assert len(report) == 1 and report[0]["job"], report
            items, _ = app.store.list(USER, None, 10, 0)
            (job,) = items
            assert job.user == USER and json.loads(job.env[ENV])["schedule"] == made["id"]

            async def launched():
                await app.engine.run_once()
                row = await app.store.read(app.store.get, job.id)
                return row if row.state == "running" else None

            row = await await_for(launched, what="the scheduled run launched", timeout=60)
            name = row.launch_state["name"]
            pod = await await_for(lambda: pod_of(kube, name), what="the scheduled run's pod", timeout=60)
            assert pod["metadata"]["annotations"]["trainhub.io/username"] == USER
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert env["TRAINHUB_USER"] == USER and env["TRAINHUB_STORAGE_URL"].endswith(f"/users/{USER}")
            assert json.loads(env[ENV])["storage"] == "exp/train.ipynb" and env["TRAINHUB_JOB_ID"] == row.key
        finally:
            await app.launcher.close()
