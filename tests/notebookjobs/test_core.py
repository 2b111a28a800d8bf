"""trainhub.notebookjobs, the pure parts: a notebook's parameters (papermill's convention), paths, cron schedules."""

from __future__ import annotations

from datetime import datetime, timezone

import nbformat
import pytest

from trainhub.notebookjobs import (ENV, NotebookJobError, check_input_path, check_schedule, coerce_parameters,
                                   declared_parameters, due_times, job_spec, load_notebook, notebook_info, output_path)


def nb(source="lr = 0.1\nepochs = 3\nname = 'run'\nuse_amp = False\nsizes = [1, 2]", tagged=True):
    book = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    if tagged:
        cell.metadata["tags"] = ["parameters"]
    book.cells = [nbformat.v4.new_code_cell("import os"), cell]
    return book


def test_declared_parameters_read_the_tagged_cell():
    assert declared_parameters(nb()) == {"lr": "float", "epochs": "int", "name": "str", "use_amp": "bool", "sizes": "list"}
    assert declared_parameters(nb(tagged=False)) == {}


@pytest.mark.parametrize("given, want", [
    ({"lr": "0.5"}, {"lr": 0.5}),
    ({"lr": "1"}, {"lr": 1.0}),
    ({"epochs": " 7 "}, {"epochs": 7}),
    ({"name": "0.5"}, {"name": "0.5"}),  # a text default keeps the text
    ({"use_amp": "True"}, {"use_amp": True}),
    ({"sizes": "[3, 4]"}, {"sizes": [3, 4]}),
    ({"lr": 0.25}, {"lr": 0.25}),
    ({}, {}),
])
def test_values_take_the_type_of_their_default(given, want):
    assert coerce_parameters(nb(), given) == want


@pytest.mark.parametrize("given, says", [
    ({"batch": "4"}, "does not declare the parameter(s) batch"),
    ({"lr": "fast"}, "parameter lr must be a float"),
    ({"epochs": "2.5"}, "parameter epochs must be a int"),
    ({"use_amp": "yes"}, "parameter use_amp must be a bool"),
])
def test_parameters_the_notebook_does_not_take_are_refused(given, says):
    with pytest.raises(NotebookJobError, match=r".*") as e:
        coerce_parameters(nb(), given)
    assert says in e.value.message


def test_a_notebook_without_a_parameters_cell_takes_none():
    with pytest.raises(NotebookJobError) as e:
        coerce_parameters(nb(tagged=False), {"lr": "1"})
    assert "no cell tagged 'parameters'" in e.value.message


@pytest.mark.parametrize("text", ["", "{", '{"cells": 3}', "[1, 2]", '{"nbformat": 99, "cells": []}'])
def test_what_is_not_a_notebook_is_refused(text):
    with pytest.raises(NotebookJobError) as e:
        load_notebook(text, "x.ipynb")
    assert "x.ipynb is not a notebook Jupyter can read" in e.value.message


@pytest.mark.parametrize("path, ok", [
    ("a.ipynb", "a.ipynb"), ("proj/./b.ipynb", "proj/b.ipynb"), ("/etc/a.ipynb", None), ("../a.ipynb", None),
    ("proj/../../a.ipynb", None), ("a.py", None), ("", None),
])
def test_input_paths_stay_in_the_home(path, ok):
    if ok:
        assert check_input_path(path) == ok
    else:
        with pytest.raises(NotebookJobError):
            check_input_path(path)


def test_outputs_go_next_to_the_input():
    assert output_path("proj/train.ipynb", "j-000004") == "proj/train-j-000004.ipynb"
    assert output_path("train.ipynb", "j-000004", "html") == "train-j-000004.html"


def test_the_job_spec_carries_the_notebook_and_says_what_it_is():
    spec = job_spec(nb(), "proj/train.ipynb", parameters={"lr": "0.5"}, profile="gpu-1", workers=2, time_limit="1h",
                    output_formats=["ipynb", "html"])
    assert spec["profile"] == "gpu-1" and spec["workers"] == 2 and spec["time_limit"] == "1h" and spec["name"] == "train"
    assert "papermill.execute_notebook" in spec["script"] and "NOTEBOOK = " in spec["script"]
    info = notebook_info({"env": spec["env"]})
    assert info == {"input": "proj/train.ipynb", "parameters": {"lr": 0.5}, "output_formats": ["ipynb", "html"]}
    assert notebook_info({"env": {}}) is None and ENV in spec["env"]
    with pytest.raises(NotebookJobError):
        job_spec(nb(), "proj/train.ipynb", output_formats=["pdf"])


def test_a_notebook_in_the_storage_area_says_where_there():
    """Its job puts the outputs into the storage area (where a Kubernetes job pod reaches them): the spec says the
    input's path there, checked like the home path."""
    spec = job_spec(nb(), "storage/proj/train.ipynb", storage_path="proj/train.ipynb")
    assert notebook_info({"env": spec["env"]})["storage"] == "proj/train.ipynb"
    assert "storage" not in notebook_info({"env": job_spec(nb(), "proj/train.ipynb")["env"]})
    for bad in ("../other/train.ipynb", "/etc/train.ipynb", "proj/data.csv"):
        with pytest.raises(NotebookJobError):
            job_spec(nb(), "storage/proj/train.ipynb", storage_path=bad)


@pytest.mark.parametrize("expr", ["0 3 * * *", "*/15 * * * *", "0 9 * * mon-fri", "  0  0 1 1 * "])
def test_cron_expressions(expr):
    assert check_schedule(expr) == " ".join(expr.split())


@pytest.mark.parametrize("expr", ["", "61 * * * *", "every day", "* * * *", "0 0 * * * *", "0 25 * * *"])
def test_bad_cron_expressions(expr):
    with pytest.raises(NotebookJobError) as e:
        check_schedule(expr)
    assert "is not a cron expression" in e.value.message


def test_due_times_in_a_window_and_a_time_zone():
    t = lambda *a: datetime(*a, tzinfo=timezone.utc)
    assert due_times("0 3 * * *", "UTC", t(2026, 1, 1), t(2026, 1, 3, 3)) == [t(2026, 1, 1, 3), t(2026, 1, 2, 3), t(2026, 1, 3, 3)]
    # 03:00 in Berlin (winter) is 02:00 UTC
    assert due_times("0 3 * * *", "Europe/Berlin", t(2026, 1, 1), t(2026, 1, 1, 12)) == [t(2026, 1, 1, 2)]
    assert due_times("0 3 * * *", None, t(2026, 1, 1, 3), t(2026, 1, 1, 4)) == []  # the window's start is excluded
    many = due_times("* * * * *", None, t(2026, 1, 1), t(2026, 1, 2), cap=10)
    assert len(many) == 10 and many[:9] == [t(2026, 1, 1, 0, m) for m in range(1, 10)] and many[-1] == t(2026, 1, 2)
    # a clock moved thousands of years costs at most `cap` steps
    assert due_times("* * * * *", None, t(2026, 1, 1), t(9000, 1, 1), cap=5)[-1] == t(9000, 1, 1)


@pytest.mark.parametrize("status, want", [(400, 400), (403, 403), (404, 404), (409, 409), (429, 429), (0, 503), (502, 502)])
def test_a_jobs_api_refusal_keeps_its_status_and_words_in_jupyter_schedulers_terms(status, want):
    from jupyter_scheduler.exceptions import SchedulerError

    from trainhub.client import TrainhubAPIError
    from trainhub.extensions.notebookjobs import Refused, _call

    def refuse():
        raise TrainhubAPIError(status, "Too many queued jobs: cancel some")

    with pytest.raises(Refused) as e:
        _call(refuse)
    assert isinstance(e.value, SchedulerError)  # what jupyter-scheduler's handlers catch, as a 500 raised from it
    assert (e.value.status, str(e.value)) == (want, "Too many queued jobs: cancel some")
