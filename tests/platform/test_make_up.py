"""`make up` installs trainhub once, not on every start (only when pyproject.toml or setup.py change)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dry_run(venv: Path) -> str:
    # -n: print what would run; the proxy check is a recipe line that only reports
    return subprocess.run(["make", "-n", "-C", str(REPO), "up", f"VENV={venv}"], capture_output=True, text=True,
                          timeout=60, check=True).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_up_reinstalls_only_when_the_package_metadata_changes(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert "pip install -q -e ." in dry_run(venv)  # first start: installs
    stamp = venv / ".installed"
    stamp.touch()
    newer = max(os.stat(REPO / f).st_mtime for f in ("pyproject.toml", "setup.py")) + 10
    os.utime(stamp, (newer, newer))
    out = dry_run(venv)
    assert "pip install" not in out and "trainhub up" in out  # later starts: straight to `trainhub up`
    os.utime(stamp, (newer - 3600 * 24 * 365 * 30, newer - 3600 * 24 * 365 * 30))
    assert "pip install -q -e ." in dry_run(venv)  # metadata newer than the stamp: installs again
