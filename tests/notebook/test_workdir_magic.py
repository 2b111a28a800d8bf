"""``%%train`` sends the notebook's folder (issue 34), against the jobs-API contract stand-in (jobs run for real as
subprocesses in the unpacked copy, as the contract says).

The notebook's folder is the kernel's working directory (the ``magics`` fixture gives each test a fresh one). The
job runs in a copy of it: its modules import first (``sys.path[0]``), relative paths work; ignore files and
``--exclude`` leave things out; a folder too big is refused by name before anything is submitted; ``--no-workdir``
sends nothing; an unchanged folder is not sent twice.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from IPython.core.error import UsageError


def run(shell, source: str):
    r = shell.run_cell(source, store_history=True)
    if r.error_before_exec or r.error_in_exec:
        raise r.error_before_exec or r.error_in_exec
    return r.result


@pytest.fixture
def notebook_folder():
    folder = Path(os.getcwd())  # the magics fixture's fresh notebook folder
    (folder / "datautils.py").write_text("class MyTrainDataset:\n    def __init__(self, n):\n        self.n = n\n")
    (folder / "config.txt").write_text("epochs=3\n")
    return folder


def test_the_job_runs_in_a_copy_of_the_notebooks_folder(shell, api_magics, jobs_api, notebook_folder, capsys):
    (notebook_folder / "checkpoints").mkdir()
    (notebook_folder / "checkpoints" / "big.pt").write_bytes(b"x" * 1000)
    (notebook_folder / ".trainhubignore").write_text("checkpoints/\n")
    (notebook_folder / "scratch.log").write_text("noise\n")
    cell = ("import os, sys\nfrom datautils import MyTrainDataset\n"
            "print('dataset', MyTrainDataset(4).n, 'config', open('config.txt').read().strip())\n"
            "print('path0', sys.path[0] == os.getcwd(), 'sent', sorted(os.listdir('.')))\n")
    job = api_magics.train("--wait --exclude *.log", cell)
    out = capsys.readouterr().out
    assert job.job["state"] == "succeeded", job.logs()
    logs = job.logs()
    assert "dataset 4 config epochs=3" in logs and "path0 True" in logs
    assert "sent ['.trainhubignore', 'config.txt', 'datautils.py']" in logs  # checkpoints/ and *.log left out
    assert f"sent the working directory {notebook_folder}: 3 files" in out
    # the same folder again: not sent twice (the service has it by its hash)
    api_magics.train("--wait", "print('again')\n")
    assert jobs_api.service.workdir_puts == 2  # the --exclude above made a different archive; this one once more
    api_magics.train("--wait", "print('and again')\n")
    assert jobs_api.service.workdir_puts == 2


def test_a_folder_too_big_is_refused_by_name_and_nothing_is_submitted(shell, api_magics, jobs_api, notebook_folder):
    (notebook_folder / "data").mkdir()
    with open(notebook_folder / "data" / "train.csv", "wb") as f:
        f.truncate(60 << 20)  # sparse: 60 MB as far as the walk can tell, over the 50 MB limit, nothing on disk
    with pytest.raises(UsageError) as e:
        api_magics.train("", "print(1)\n")
    text = str(e.value)
    assert "the job was not submitted" in text and "is too big" in text and "data/" in text and "60.0 MB" in text
    assert ".trainhubignore" in text and "--exclude data/" in text and "--no-workdir" in text
    assert jobs_api.service.posts == 0 and jobs_api.service.workdir_puts == 0
    # what the message says works
    api_magics.train("--wait --exclude data/", "print(1)\n")
    assert jobs_api.service.posts == 1


def test_no_workdir_sends_nothing_and_another_folder_can_be_sent(shell, api_magics, jobs_api, notebook_folder, tmp_path):
    from trainhub.handle import JobFailedError

    with pytest.raises(JobFailedError, match="No module named 'datautils'"):
        api_magics.train("--wait --no-workdir", "import datautils\n")
    assert jobs_api.service.workdir_puts == 0
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "helpers.py").write_text("X = 7\n")
    job = api_magics.train(f"--wait --workdir {other}", "from helpers import X\nprint('X', X)\n")
    assert "X 7" in job.logs()


def test_dry_run_says_what_would_be_sent(shell, magics, notebook_folder, capsys):
    magics.train("--dry-run", "print(1)\n")
    out = capsys.readouterr().out
    assert f"would send the working directory {notebook_folder}: 2 files" in out
    assert "sys.path.insert(0, _th_os.getcwd())" in out


def test_the_upstream_notebook_carries_the_annotation_import_and_imports_from_its_folder(shell, api_magics, jobs_api,
                                                                                        notebook_folder, capsys):
    """pytorch/examples' ``prepare_dataloader(dataset: Dataset, ...)`` defined in a cell and called from a %%train cell,
    with ``from datautils import ...`` run in the kernel: both reach the job."""
    pytest.importorskip("torch")
    import sys

    sys.path.insert(0, str(notebook_folder))  # a real kernel has its folder on sys.path ('' first); this shell not
    try:
        (notebook_folder / "datautils.py").write_text(
            "import torch\nfrom torch.utils.data import Dataset\nclass MyTrainDataset(Dataset):\n"
            "    def __init__(self, size):\n        self.data = [torch.rand(2) for _ in range(size)]\n"
            "    def __len__(self):\n        return len(self.data)\n    def __getitem__(self, i):\n        return self.data[i]\n")
        run(shell, "import torch\nfrom torch.utils.data import Dataset, DataLoader\nfrom datautils import MyTrainDataset\n")
        run(shell, "def prepare_dataloader(dataset: Dataset, batch_size: int):\n"
                   "    return DataLoader(dataset, batch_size=batch_size, shuffle=False)\n")
        job = api_magics.train("--wait", "print('batches', len(prepare_dataloader(MyTrainDataset(8), 4)))\n")
        assert job.job["state"] == "succeeded", job.logs()
        assert "batches 2" in job.logs()
    finally:
        sys.path.remove(str(notebook_folder))
        sys.modules.pop("datautils", None)
