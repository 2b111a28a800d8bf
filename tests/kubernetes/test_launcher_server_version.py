"""The jobs launcher refuses, saying why, an API server older than the Job features it relies on.

On the real v1.20.2 control plane (``--kube=real``) the refusal is the real server's answer; on
the stand-in its ``/version`` is set to an old and a new release. Jobs are created with
``fieldValidation=Strict``: a field the server does not know is an error, never dropped.
"""

from __future__ import annotations

import pytest
from k8s_test_config import NAMESPACE, PROFILES, TEST_IMAGE
from kube_standin import JOBS
from traitlets.config import Config

from trainhub.exceptions import TrainhubError
from trainhub.services.jobs.kubernetes import MIN_SERVER_VERSION, KubernetesLauncher
from trainhub.services.jobs.launcher import JobView


def _launcher(kubeconfig, tmp_path):
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    return KubernetesLauncher(config=c, kubeconfig=kubeconfig, namespace=NAMESPACE, image=TEST_IMAGE,
                              jobs_dir=str(tmp_path / "jobs"), request_timeout=5, retry_timeout=5)


def _view():
    return JobView(id=7, key="j-000007", user="alice", name="train", command="true", script=None, workers=1, gpus=0,
                   env={}, attempt=1, time_limit=60.0, params={}, profile="cpu")


async def test_an_old_api_server_is_refused_with_the_reason(cluster, kubeconfig, tmp_path):
    launcher = _launcher(kubeconfig, tmp_path)
    if cluster.mode == "standin":
        cluster.kube.version = (1, 20)
    elif cluster.mode != "real":
        pytest.skip("an external cluster's version is what it is")
    try:
        with pytest.raises(TrainhubError) as refused:
            await launcher.launch(_view(), [[]], {"PATH": "/usr/bin"})
        message = str(refused.value)
        assert "v1.20" in message and "1.26 or newer" in message and "local launcher" in message
        if cluster.mode == "standin":  # refused before anything was created
            assert not [key for key in cluster.kube.store(JOBS) if key[1] == "j-000007-1" or "j-000007" in key[1]]
    finally:
        await launcher.close()
        if cluster.mode == "standin":
            cluster.kube.version = (1, 30)


async def test_a_current_api_server_is_accepted(cluster, kubeconfig, tmp_path):
    if cluster.mode != "standin":
        pytest.skip("the real control plane here is 1.20")
    assert cluster.kube.version >= MIN_SERVER_VERSION
    launcher = _launcher(kubeconfig, tmp_path)
    try:
        await launcher._connect()  # the version check passes; the caches start
        assert launcher._jobs_cache is not None
    finally:
        await launcher.close()
