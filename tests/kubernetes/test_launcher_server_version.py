"""The jobs launcher and the API server's version: an Indexed Job where the server carries one (1.26+), one plain
Job per worker where it does not (``KubernetesLauncher.job_form = "auto"``), and a refusal with the reason when the
Indexed form is asked of an old server.

On the real v1.20.2 control plane (``--kube=real``) the answers are the real server's and the real Job controller
runs the per-worker Jobs (the kubelet stand-in plays the containers); on the stand-in its ``/version`` is set to
1.20. Jobs are created with ``fieldValidation=Strict``: a field the server does not know is an error, never dropped
(1.27+; 1.20 ignores it, which is why the form is chosen from the version).
"""

from __future__ import annotations

import kmock
import pytest
from k8s_test_config import NAMESPACE, PROFILES, TEST_IMAGE
from kube_standin import JOBS, PODS
from traitlets.config import Config
from waiting import await_for

from trainhub.exceptions import TrainhubError
from trainhub.services.jobs import k8s_job_manifests as jm
from trainhub.services.jobs.kubernetes import MIN_SERVER_VERSION, KubernetesLauncher
from trainhub.services.jobs.launcher import JobView, WorkerStatus


def _launcher(kubeconfig, tmp_path, **traits):
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    return KubernetesLauncher(config=c, kubeconfig=kubeconfig, namespace=NAMESPACE, image=TEST_IMAGE,
                              jobs_dir=str(tmp_path / "jobs"), request_timeout=5, retry_timeout=5, **traits)


def _view(key="j-000007", workers=1):
    return JobView(id=int(key[2:]), key=key, user="alice", name="train", command="true", script=None, workers=workers,
                   gpus=0, env={}, attempt=1, time_limit=60.0, params={}, profile="cpu")


async def test_an_old_api_server_is_refused_for_indexed_jobs_with_the_reason(cluster, kubeconfig, tmp_path):
    launcher = _launcher(kubeconfig, tmp_path, job_form="indexed")
    if cluster.mode == "standin":
        cluster.kube.version = (1, 20)
    elif cluster.mode != "real":
        pytest.skip("an external cluster's version is what it is")
    try:
        with pytest.raises(TrainhubError) as refused:
            await launcher.launch(_view(), [[]], {"PATH": "/usr/bin"})
        message = str(refused.value)
        assert "v1.20" in message and "1.26 or newer" in message and 'job_form = "auto"' in message
        assert "local launcher" in message
        if cluster.mode == "standin":  # refused before anything was created
            assert not [key for key in cluster.kube.store(JOBS) if "j-000007" in key[1]]
    finally:
        await launcher.close()
        if cluster.mode == "standin":
            cluster.kube.version = (1, 30)


async def test_kueue_is_refused_on_an_old_api_server(cluster, kubeconfig, tmp_path):
    if cluster.mode == "standin":
        cluster.kube.version = (1, 20)
    elif cluster.mode != "real":
        pytest.skip("an external cluster's version is what it is")
    launcher = _launcher(kubeconfig, tmp_path, kueue_queue="trainhub")
    try:
        with pytest.raises(TrainhubError, match="Kueue admits a gang as one suspended Indexed Job"):
            await launcher.launch(_view(), [[]], {"PATH": "/usr/bin"})
    finally:
        await launcher.close()
        if cluster.mode == "standin":
            cluster.kube.version = (1, 30)


async def test_a_current_api_server_gets_indexed_jobs(cluster, kubeconfig, tmp_path):
    if cluster.mode != "standin":
        pytest.skip("the real control plane here is 1.20")
    assert cluster.kube.version >= MIN_SERVER_VERSION
    launcher = _launcher(kubeconfig, tmp_path)
    try:
        await launcher._connect()  # the version check passes; the caches start
        assert launcher._jobs_cache is not None and launcher.form == "indexed"
    finally:
        await launcher.close()


async def test_an_old_api_server_runs_one_job_per_worker(kube_backend, tmp_path):
    """The per-worker form end to end on a 1.20 server: two plain Jobs with the Indexed pod template and the index
    written in, the Service owned by both, each worker's exit read back by rank, the gang's Jobs deleted."""
    async with kube_backend(nodes=("cpu-a",), jobs=True, namespaces=(NAMESPACE,)) as kube:
        if not hasattr(kube, "plane"):
            kube.version = (1, 20)
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE)
        launcher = _launcher(kubeconfig, tmp_path)
        view = _view("j-000011", workers=2)
        try:
            state = await launcher.launch(view, [[], []], {"PATH": "/usr/bin"})
            assert launcher.form == "per-worker" and state["form"] == "per-worker"
            name = state["name"]
            jobs = {r: kube.get(JOBS, NAMESPACE, jm.worker_job_name(name, r)) for r in range(2)}
            for rank, job in jobs.items():
                spec = job["spec"]
                assert spec["completions"] == spec["parallelism"] == 1
                assert spec.get("completionMode", "NonIndexed") == "NonIndexed"  # 1.21+ writes the default
                template = spec["template"]
                assert template["metadata"]["annotations"][jm.INDEX_ANNOTATION] == str(rank)
                assert template["spec"]["hostname"] == f"{name}-{rank}" and template["spec"]["subdomain"] == name
            service = kube.get(kmock.resource(group="", version="v1", plural="services"), NAMESPACE, name)
            assert sorted(o["name"] for o in service["metadata"]["ownerReferences"]) == \
                sorted(jm.worker_job_name(name, r) for r in range(2))

            def pods():
                return {jm.pod_index(p): p for (ns, _), p in kube.store(PODS).items()
                        if ns == NAMESPACE and (p["metadata"].get("labels") or {}).get(jm.JOB_NAME_LABEL) == name
                        and (p.get("status") or {}).get("phase") == "Running"}

            running = await await_for(pods, lambda p: len(p) == 2, what="both workers' pods running", timeout=60)
            assert await launcher.poll(view, state) == [WorkerStatus(0, True), WorkerStatus(1, True)]
            await kube.finish_pod(NAMESPACE, running[0]["metadata"]["name"], 0)
            await kube.finish_pod(NAMESPACE, running[1]["metadata"]["name"], 3)

            async def ended():
                return await launcher.poll(view, state)

            statuses = await await_for(ended, lambda s: not any(x.running for x in s), what="both workers to end",
                                       timeout=60)
            assert statuses == [WorkerStatus(0, False, 0), WorkerStatus(1, False, 3)]
            await launcher.cleanup(view, state)
            await await_for(lambda: [kube.get(JOBS, NAMESPACE, jm.worker_job_name(name, r)) for r in range(2)],
                            lambda jobs: jobs == [None, None], what="the worker Jobs deleted", timeout=60)
        finally:
            await launcher.close()
            if not hasattr(kube, "plane"):
                kube.version = (1, 30)


def _job(name, condition=None):
    conds = [{"type": condition, "status": "True", "reason": "BackoffLimitExceeded"}] if condition else []
    return {"metadata": {"name": name}, "status": {"conditions": conds}}


@pytest.mark.parametrize("jobs,finished,done", [
    ({0: None, 1: None}, None, None),  # none made yet, or all gone
    ({0: _job("w0"), 1: _job("w1")}, None, ""),
    ({0: _job("w0", "Complete"), 1: _job("w1")}, None, "0"),
    ({0: _job("w0", "Complete"), 1: _job("w1", "Complete")}, "Complete", "0,1"),
    ({0: _job("w0", "Complete"), 1: _job("w1", "Failed")}, "Failed", "0"),
    ({0: None, 1: _job("w1", "Failed")}, "Failed", ""),
])
def test_worker_jobs_fold_into_the_one_job_statuses_read(jobs, finished, done):
    combined = jm.combine_worker_jobs(jobs, 2)
    if done is None:
        assert combined is None
        return
    assert jm.job_finished(combined) == finished
    assert combined["status"]["completedIndexes"] == done


def test_per_worker_jobs_keep_the_indexed_pod_template():
    indexed = jm.make_job(name="trainhub-j-1-a1", namespace="ns", labels={jm.JOB_NAME_LABEL: "trainhub-j-1-a1"},
                          user="alice", workers=3, image="img", env={"A": "1"}, queue_name="")
    jobs = jm.per_worker_jobs(indexed)
    assert [j["metadata"]["name"] for j in jobs] == [jm.worker_job_name("trainhub-j-1-a1", r) for r in range(3)]
    for rank, job in enumerate(jobs):
        assert {k for k in ("completionMode", "podFailurePolicy", "suspend") if k in job["spec"]} == set()
        template = job["spec"]["template"]
        assert template["metadata"]["annotations"][jm.INDEX_ANNOTATION] == str(rank)
        assert template["metadata"]["labels"][jm.JOB_NAME_LABEL] == "trainhub-j-1-a1"  # the Service selects them all
        # the rest of the pod is the Indexed Job's
        strip = {**template["spec"]}
        strip.pop("hostname")
        assert strip == indexed["spec"]["template"]["spec"]
    assert "hostname" not in indexed["spec"]["template"]["spec"]  # the original is left alone
