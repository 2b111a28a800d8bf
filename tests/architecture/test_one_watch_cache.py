"""One Kubernetes watch cache: kubespawner's reflector (trainhub.kube.reflector), for every kind trainhub watches."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("trainhub", "services", "spawner", "extensions", "kernels", "hub_config")


def _watch_users():
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "Watch":
                    yield path.relative_to(ROOT).as_posix()
                elif isinstance(node, ast.ImportFrom) and node.module == "kubernetes_asyncio" and any(
                        a.name == "watch" for a in node.names):
                    yield path.relative_to(ROOT).as_posix()


def test_only_the_reflector_module_runs_watches():
    assert set(_watch_users()) == {"trainhub/kube/reflector.py"}


def test_launcher_and_ledger_caches_are_reflectors():
    from kubespawner.reflector import ResourceReflector

    from trainhub.kube import reflector

    for cls in (reflector.JobReflector, reflector.PodReflector, reflector.NodeReflector, reflector.GPUPodReflector):
        assert issubclass(cls, ResourceReflector)
    launcher = (ROOT / "services/jobs/kubernetes.py").read_text(encoding="utf-8")
    assert "JobReflector(" in launcher and "PodReflector(" in launcher
