"""Real code runs unmodified (issue 34): pytorch/examples' DDP tutorial (``multigpu_torchrun.py`` with its
``datautils.py``, tests/jobs/ddp_tutorial/: only its CUDA calls switched to the CPU) through a real `trainhub up`
(as root: each user's account, a sandbox, a network namespace), three ways, each compared with the same files under
the real ``torchrun --standalone --nproc_per_node=2`` on this machine (the baseline):

(a) from ``%%train --workers 2`` in a real kernel whose notebook's folder holds datautils.py: the imports and
    definitions of earlier cells (``prepare_dataloader(dataset: Dataset, ...)``: an import used only in an
    annotation) and the notebook's folder reach the job;
(b) ``trainhub jobs submit --workdir <folder> --workers 2 -- python multigpu_torchrun.py 2 1``;
(c) ``trainhub jobs submit --workdir <folder> -- torchrun --standalone --nproc_per_node=2 multigpu_torchrun.py 2 1``
    (one worker whose command is torchrun); with ``--workers 2`` that command is refused, naming both ways that work.

The lines that matter must be the baseline's, each as often: every rank's ``[GPU<local rank>] Epoch e`` line (local
ranks 0 and 1: one node of 2 processes, never 2 nodes of 1) and ``Epoch e | Training snapshot saved`` once per
epoch (local rank 0 alone saves). The copy each job ran in is its user's (unpacked as the account) and holds the
snapshot.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import requests

from trainhub.cli import main

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="`trainhub up` isolates users as root (CI does)")]

USER = "ddp-ann"
FIXTURE = Path(__file__).parent / "ddp_tutorial"
# each message is one write (print's text, then its newline: two processes sharing a pipe, as torchrun's do, may put
# two messages on one line), so they are found wherever they are, not line by line
MATTERS = re.compile(r"\[GPU\d+\] Epoch \d+ \| Batchsize: \d+ \| Steps: \d+|Epoch \d+ \| Training snapshot saved at "
                     r"snapshot\.pt|Loading snapshot|Resuming training from snapshot at Epoch \d+")
LOG_PREFIX = re.compile(r"^\S+Z \[\d+\] ", re.MULTILINE)


def lines_that_matter(text: str, way: str = "") -> Counter:
    got = Counter(MATTERS.findall(LOG_PREFIX.sub("", text)))
    if way:  # shown with -s, and in CI's log
        print(f"\n{way}:", *(f"{n} x {line}" for line, n in sorted(got.items())), sep="\n    ")
    return got


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Counter:
    pytest.importorskip("torch", reason="the tutorial needs torch (pip install torch==2.13.0, the CPU build)")
    folder = tmp_path_factory.mktemp("baseline") / "ddp"
    shutil.copytree(FIXTURE, folder)
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    out = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "multigpu_torchrun.py", "2", "1"], cwd=folder,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    got = lines_that_matter(out.stdout, "baseline: torchrun --standalone --nproc_per_node=2 on the machine")
    assert got == Counter({f"[GPU{r}] Epoch {e} | Batchsize: 32 | Steps: 32": 1 for r in (0, 1) for e in (0, 1)}
                          | {f"Epoch {e} | Training snapshot saved at snapshot.pt": 1 for e in (0, 1)}), out.stdout
    return got


@pytest.fixture(scope="module")
def server(platform):
    platform.spawn(USER, "cpu", timeout=180)
    yield platform
    platform.stop_server(USER)


def api(platform) -> tuple[str, str]:
    return platform.url + "/services/trainhub/api", platform.token(USER)


def job_logs(platform, job_id: str) -> str:
    url, token = api(platform)
    r = requests.get(f"{url}/jobs/{job_id}/logs", headers={"Authorization": f"token {token}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.text


def submit(platform, capsys, *argv) -> tuple[int, str, str]:
    url, token = api(platform)
    code = main(["jobs", "submit", "--url", url, "--token", token, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def unpacked_copy(platform, job_id: str, names=("multigpu_torchrun.py", "datautils.py", "snapshot.pt")) -> Path:
    """The copy a job ran in: the user's part of its folder (isolated: work/), written as the user's account."""
    copy = platform.data_dir / "jobs" / job_id / "work" / "workdir"
    account = pwd.getpwnam(f"th-{USER}")
    assert set(names) <= set(os.listdir(copy)) <= set(names) | {"__pycache__"}  # what was sent, what the job wrote
    for name in names:
        assert (copy / name).stat().st_uid == account.pw_uid, name
    return copy


def test_a_from_train_in_a_real_kernel_whose_notebook_folder_holds_datautils(server, baseline):
    url = f"{server.url}/user/{USER}/api/contents"
    headers = {"Authorization": f"token {server.token(USER)}"}
    # the notebook's folder, written through the user's own server (as the user)
    assert requests.put(f"{url}/ddp", json={"type": "directory"}, headers=headers, timeout=60).status_code in (200, 201)
    r = requests.put(f"{url}/ddp/datautils.py", headers=headers, timeout=60,
                     json={"type": "file", "format": "text", "content": (FIXTURE / "datautils.py").read_text()})
    assert r.status_code in (200, 201), r.text
    source = (FIXTURE / "multigpu_torchrun.py").read_text()
    imports = source[:source.index("def ddp_setup")]
    definitions = source[source.index("def ddp_setup"):source.index('if __name__ == "__main__":')]
    code = (f"ip = get_ipython()\n"
            f"ip.run_cell({imports!r}, store_history=True)\n"  # the notebook's first cell: the file's imports
            f"ip.run_cell({definitions!r}, store_history=True)\n"  # its second: the definitions
            "try:\n"
            "    ip.run_cell_magic('train', '--workers 2 --wait --as job --name ddp-notebook',\n"
            "                      'main(save_every=1, total_epochs=2, batch_size=32)\\n')\n"
            "except Exception as e:\n"  # the job failed: its logs below say why
            "    print('RAISED', type(e).__name__)\n"
            "print('JOB', job.id, job.job['state'])\n")
    out = server.kernel_exec(USER, code, timeout=600, path="ddp/tutorial.ipynb")
    job_id, state = out.split("JOB ", 1)[1].split()[:2]
    logs = job_logs(server, job_id)
    assert state == "succeeded", out + logs[-3000:]
    assert "sent the working directory" in out and "/ddp: 1 file" in out, out
    assert lines_that_matter(logs, f"(a) %%train --workers 2, {job_id}") == baseline, logs[-3000:]
    unpacked_copy(server, job_id, ("datautils.py", "snapshot.pt"))


def test_b_submit_a_folder_and_a_command_with_arguments(server, baseline, capsys, tmp_path):
    folder = tmp_path / "ddp"
    shutil.copytree(FIXTURE, folder)
    code, out, err = submit(server, capsys, "--workdir", str(folder), "--workers", "2", "--wait", "--", "python",
                            "multigpu_torchrun.py", "2", "1")
    job_id = re.search(r"submitted (j-\d+)", out).group(1)
    logs = job_logs(server, job_id)
    assert code == 0, err + logs[-3000:]
    assert f"working directory {folder}: 3 files" in err
    assert lines_that_matter(logs, f"(b) --workdir --workers 2 -- python multigpu_torchrun.py 2 1, {job_id}") == baseline, \
        logs[-3000:]
    unpacked_copy(server, job_id, ("README.md", "multigpu_torchrun.py", "datautils.py", "snapshot.pt"))


def test_c_torchrun_with_two_processes_inside_a_one_worker_job(server, baseline, capsys, tmp_path):
    folder = tmp_path / "ddp"
    shutil.copytree(FIXTURE, folder)
    command = ["torchrun", "--standalone", "--nproc_per_node=2", "multigpu_torchrun.py", "2", "1"]
    code, _, err = submit(server, capsys, "--workdir", str(folder), "--workers", "2", "--", *command)
    assert code == 1 and "--workers 1 -- torchrun --nproc_per_node=2" in err and "LOCAL_RANK 0..1" in err
    code, out, err = submit(server, capsys, "--workdir", str(folder), "--wait", "--", *command)
    job_id = re.search(r"submitted (j-\d+)", out).group(1)
    logs = job_logs(server, job_id)
    assert code == 0, err + logs[-3000:]
    assert lines_that_matter(logs, f"(c) --workdir -- torchrun --standalone --nproc_per_node=2 ..., {job_id}") == baseline, \
        logs[-3000:]
    unpacked_copy(server, job_id, ("README.md", "multigpu_torchrun.py", "datautils.py", "snapshot.pt"))
