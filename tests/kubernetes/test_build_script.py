"""controlplane/build.sh: each unit (the control plane, the kubelet, the device plugin, pause) is cached under its own
recipe key and checksums, so changing one rebuilds that one only; and apt waits for a busy dpkg lock instead of
failing the build (it used to fail when apt was busy)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BUILD = HERE / "controlplane" / "build.sh"
FAKEGPU = HERE / "node" / "fakegpu" / "main.go"


def test_every_apt_call_waits_for_the_dpkg_lock():
    text = BUILD.read_text()
    assert "APT=(apt-get -o DPkg::Lock::Timeout=600)" in text
    code = "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith("#") and not re.match(r"\s*log ", line))
    # update and install go through APT; `apt-get source` takes no dpkg lock
    assert re.findall(r'"\$\{APT\[@\]\}" (\w+)', code) == ["update", "install"]
    assert set(re.findall(r"apt-get (\w+)", code)) == {"source"}


def _recipe_lines() -> dict[str, str]:
    text = BUILD.read_text()
    src = hashlib.sha256(FAKEGPU.read_bytes()).hexdigest()[:16]
    get = lambda name: re.search(rf'^{name}="([^"$]*)', text, re.M)[1]  # noqa: E731
    return {"control-plane": get("CONTROL_PLANE_RECIPE"), "kubelet": get("KUBELET_RECIPE"),
            "trainhub-fake-gpu": get("FAKEGPU_RECIPE") + src, "pause": get("PAUSE_RECIPE")}


def _fake_cache(root: Path) -> Path:
    """A cache whose stamps match the current recipes, with stand-in binaries that say the right version."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "trainhub-fake-gpu", "pause"):
        (bin_dir / name).write_text("#!/bin/sh\necho Kubernetes v1.20.2\n")
        (bin_dir / name).chmod(0o755)
    recipes = _recipe_lines()

    def stamp(unit, names):
        sums = "".join(f"sha256 {hashlib.sha256((bin_dir / n).read_bytes()).hexdigest()}  {n}\n" for n in names)
        path = bin_dir / ("BUILD-INFO" if unit == "control-plane" else f"{unit}.BUILD-INFO")
        path.write_text(f"recipe {recipes[unit]}\nbuilt 2026-11-27T00:00:00Z in 1s\n{sums}")

    stamp("control-plane", ["kube-apiserver", "kube-controller-manager", "kube-scheduler"])
    for unit in ("kubelet", "trainhub-fake-gpu", "pause"):
        stamp(unit, [unit])
    return bin_dir


def _check(cache: Path, *args) -> tuple[int, str]:
    proc = subprocess.run(["bash", str(BUILD), "--check", *args], capture_output=True, text=True,
                          env={**os.environ, "TRAINHUB_KUBE_CACHE": str(cache)}, timeout=60)
    return proc.returncode, proc.stdout.strip()


@pytest.mark.skipif(not shutil.which("sha256sum"), reason="coreutils' sha256sum is needed")
def test_each_unit_is_rebuilt_alone_when_its_recipe_or_binary_changes(tmp_path):
    bin_dir = _fake_cache(tmp_path)
    assert _check(tmp_path) == (0, "stale:")
    # another device plugin source (its key holds the source's hash): only the plugin is stale
    stamp = bin_dir / "trainhub-fake-gpu.BUILD-INFO"
    stamp.write_text(re.sub(r"^recipe .*$", "recipe 1 0000000000000000", stamp.read_text(), flags=re.M))
    assert _check(tmp_path) == (1, "stale: trainhub-fake-gpu")
    assert _check(tmp_path, "control-plane") == (0, "stale:")
    # a truncated kubelet fails its checksum: the kubelet alone
    (bin_dir / "kubelet").write_text("#!/bin/sh\n")
    assert _check(tmp_path, "node") == (1, "stale: kubelet trainhub-fake-gpu")
    # no binaries at all: everything
    shutil.rmtree(bin_dir)
    assert _check(tmp_path) == (1, "stale: control-plane kubelet trainhub-fake-gpu pause")
