"""``GET /jobs?kind=notebook`` (the Notebook Jobs list of JupyterLab): a user's notebook jobs, newest first, from the
``job_kinds`` index, paged by a cursor (``before`` / ``next_before``), so a page costs a page however many other
jobs the user has. Checked in the store (both read paths, with a thousand other jobs present, and the query plan
SQLite picks) and through the real jobs service's HTTP API (filters, cursor, bad input, another user's jobs)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from sqlalchemy import text

from trainhub.notebookjobs import ENV
from trainhub.services.jobs.store import JobStore, _listing
from trainhub.states import QUEUED, SUCCEEDED

NOTEBOOK_ENV = {ENV: json.dumps({"input": "proj/a.ipynb", "parameters": {}, "output_formats": ["ipynb"]})}


@pytest.fixture(params=["sqlite3", "sqlalchemy"])
def store(tmp_path, request):
    store = JobStore(f"sqlite:///{tmp_path}/platform.db")
    if request.param == "sqlalchemy":
        store.fast_reads = None
    return store


def add(store, user, notebook=False, **kw):
    fields = dict(user=user, name=f"{user}-job", command="true", gpus=0, workers=1, env=NOTEBOOK_ENV if notebook else {})
    fields.update(kw)
    return store.create(**fields)


def test_a_page_of_notebook_jobs_among_many_others_by_cursor(store):
    notebook_ids = []
    for i in range(1000):
        add(store, "ann")
        if i % 150 == 0:
            notebook_ids.append(add(store, "ann", notebook=True).id)
            add(store, "bob", notebook=True)  # another user's are never listed for ann
    add(store, "ann", env={ENV: "not json"})  # a job that only looks like one
    newest_first = sorted(notebook_ids, reverse=True)
    seen, before = [], None
    while True:
        items, total = store.list("ann", None, 3, 0, kind="notebook", before=before)
        assert total == len(notebook_ids) and len(items) <= 3
        seen += [j.id for j in items]
        if len(items) < 3:
            break
        before = items[-1].id
    assert seen == newest_first
    assert {j.user for j in store.list(None, None, 100, 0, kind="notebook")[0]} == {"ann", "bob"}  # an admin's view
    store.update(newest_first[1], state=SUCCEEDED)
    items, total = store.list("ann", [SUCCEEDED], 10, 0, kind="notebook")
    assert total == 1 and [j.id for j in items] == [newest_first[1]]
    items, total = store.list("ann", [QUEUED], 10, 0, kind="notebook", before=newest_first[2])
    assert total == len(notebook_ids) - 1 and [j.id for j in items] == newest_first[3:]
    # the plain listing is unchanged: every job of ann's, the notebook ones among them
    assert store.list("ann", None, 1, 0)[1] == 1000 + len(notebook_ids) + 1


def test_the_page_reads_the_kind_index_not_the_users_jobs(tmp_path):
    """The statement SQLite runs for a page of a user's notebook jobs: the (kind, user, job_id) index in order, each
    job by its primary key; no scan of the jobs table and no sort, whatever else the user ran."""
    store = JobStore(f"sqlite:///{tmp_path}/platform.db")
    for i in range(50):
        add(store, "ann", notebook=i % 10 == 0)
    with store.engine.connect() as c:
        c.execute(text("ANALYZE"))
        c.commit()
    _count, page = _listing(True, 0, False, kind=True, before=True)
    compiled = page.compile(store.engine)
    values = {"kind": "notebook", "user": "ann", "before": 10**9, "limit": 3, "offset": 0}
    con = sqlite3.connect(f"{tmp_path}/platform.db")
    plan = " | ".join(row[-1] for row in con.execute("EXPLAIN QUERY PLAN " + str(compiled),
                                                     [values[n] for n in compiled.positiontup]))
    assert "ix_job_kinds_kind_user_job" in plan and "SCAN jobs" not in plan and "TEMP B-TREE" not in plan, plan


def test_a_database_from_before_kinds_gets_its_notebook_jobs_kinds(tmp_path):
    url = f"sqlite:///{tmp_path}/platform.db"
    store = JobStore(url)
    ids = [add(store, "ann", notebook=True).id, add(store, "ann").id, add(store, "ann", notebook=True).id]
    with store.engine.begin() as c:
        c.execute(text("DROP TABLE job_kinds"))
    again = JobStore(url)
    items, total = again.list("ann", None, 10, 0, kind="notebook")
    assert total == 2 and [j.id for j in items] == [ids[2], ids[0]]
    assert JobStore(url).list("ann", None, 10, 0, kind="notebook")[1] == 2  # filled once, not again


@pytest.fixture
def service(tmp_path, monkeypatch, serve_jobs_api):
    """The real jobs service in process (no engine loop: nothing starts), its API on a tornado server; the hub's
    authentication replaced by ``Authorization: token <user name>`` (serve_jobs_api). Returns ``start()``, which serves it and returns
    ``call(user, method, path, body=None) -> (status, body)``."""
    from traitlets.config import Config

    from trainhub.gpus import simulated_devices
    from trainhub.services.jobs.app import JobsService
    from trainhub.settings import Runtime

    for var in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "TRAINHUB_K8S_CONFIG", "TRAINHUB_CONFIG",
                "JUPYTERHUB_SERVICE_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(1)], simulated=True).save()
    c = Config()
    c.Isolation.allow_shared_account = True
    app = JobsService(config=c)
    app.initialize(["--data-dir", str(tmp_path)])

    return lambda: serve_jobs_api(app)


async def test_get_jobs_of_kind_notebook_pages_by_cursor_over_http(service):
    service = service()
    made = []
    for i in range(30):
        status, job = await service("ann", "POST", "jobs", {"command": "true"})
        assert status == 201, job
        if i % 10 == 0:
            status, job = await service("ann", "POST", "jobs", {"script": "print(1)", "env": NOTEBOOK_ENV})
            assert status == 201, job
            made.append(job["id"])
    await service("bob", "POST", "jobs", {"script": "print(1)", "env": NOTEBOOK_ENV})
    status, page = await service("ann", "GET", "jobs?kind=notebook&limit=2")
    assert status == 200 and page["total"] == 3, page
    assert [j["id"] for j in page["items"]] == made[::-1][:2] and page["next_before"] == made[1], page
    status, page = await service("ann", "GET", f"jobs?kind=notebook&limit=2&before={page['next_before']}")
    assert [j["id"] for j in page["items"]] == [made[0]] and page["next_before"] is None, page
    status, page = await service("ann", "GET", "jobs?limit=5")
    assert page["total"] == 33 and page["next_before"] == page["items"][-1]["id"]  # the plain listing has the cursor too
    for query, says in (("kind=sweep", "unknown kind 'sweep'"), ("kind=notebook&before=yesterday", "before must be a job id")):
        status, body = await service("ann", "GET", f"jobs?{query}")
        assert status == 400 and says in body["message"], body
    status, body = await service("ann", "GET", "jobs?kind=notebook&user=bob")
    assert status == 403, body
