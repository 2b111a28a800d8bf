"""A user's own Python environment (trainhub.boundary.userenv): in a JupyterLab terminal `python`, `pip` and
`trainhub` are found, `pip install --user` persists in the home, and the user's notebook kernels and jobs import what
was installed.

Found as a new user would: in a terminal of a platform server `trainhub` and `python` were "command not found" (the
terminal's login shell set PATH afresh), and nothing could be installed (the platform's virtualenv is read-only).
Nothing here needs the internet: the package is a wheel made by the test, installed with `--no-index`.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from trainhub.boundary import userenv
from waiting import wait_for

WHEEL = "tinypkg_th-0.1-py3-none-any.whl"


def tiny_wheel(value: int = 7) -> bytes:
    """A pure-Python wheel: package ``tinypkg_th`` (``VALUE``) and a console script ``tinytool``."""
    dist = "tinypkg_th-0.1.dist-info"
    files = {
        "tinypkg_th/__init__.py": f"VALUE = {value}\n\ndef main():\n    print('tinytool says', VALUE)\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: tinypkg-th\nVersion: 0.1\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: trainhub-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": "[console_scripts]\ntinytool = tinypkg_th:main\n",
        f"{dist}/top_level.txt": "tinypkg_th\n",
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{dist}/RECORD", "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n")
    return buf.getvalue()


# -- the environment itself, made by the spawner in a home (no platform) -------------------------------------------

def test_the_users_environment_is_layered_on_the_platforms(tmp_path, monkeypatch):
    """The spawner makes ~/.trainhub/venv at each start: its python sees the platform's packages (trainhub, Jupyter)
    after the user's; `pip install --user` works in it; the kernel spec runs it; a job's platform interpreter sees the
    same packages through job_env; a second start changes nothing the user installed."""
    from traitlets.config import Config

    from trainhub.hub_config.embedded import configure
    from trainhub.settings import DataDir, Runtime
    from trainhub.spawner.local import LocalGPUSpawner

    monkeypatch.delenv("TRAINHUB_CONFIG", raising=False)
    DataDir(tmp_path).ensure()
    Runtime(data_dir=str(tmp_path)).save()
    c = Config()
    configure(c, str(tmp_path))
    from jupyterhub.objects import Hub

    s = LocalGPUSpawner(config=c, user=SimpleNamespace(name="uenv", groups=[], admin=False, url="/user/uenv/"), hub=Hub())
    s._prepare_home()
    home = os.path.realpath(s.home_dir)
    venv = Path(userenv.venv_dir(home))
    py = venv / "bin" / "python"
    env = dict(os.environ, HOME=home)
    env.pop("PYTHONPATH", None)
    env.update(s.get_env())
    assert env["PATH"].split(os.pathsep)[:3] == [str(venv / "bin"), f"{home}/.local/bin", os.path.dirname(sys.executable)]
    assert env[userenv.VAR] == str(venv) and env["JUPYTER_PATH"].split(os.pathsep)[0] == str(venv / "share" / "jupyter")
    kernel = json.loads((venv / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").read_text())
    assert kernel["argv"][:3] == [str(py), "-m", "ipykernel_launcher"]

    def run(*cmd, environ=env):
        r = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=300, cwd=home)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    out = run(str(py), "-c", "import sys, trainhub, jupyter_server, ipykernel; print(sys.prefix)")
    assert out.strip() == str(venv)
    wheel = Path(home) / WHEEL
    wheel.write_bytes(tiny_wheel())
    run("pip", "install", "--user", "--no-index", str(wheel))  # `pip` from PATH: the environment's
    assert run(str(py), "-c", "import tinypkg_th; print(tinypkg_th.__file__, tinypkg_th.VALUE)").split() == [
        f"{home}/.local/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages/tinypkg_th/__init__.py",
        "7"]
    assert run("tinytool").strip() == "tinytool says 7"  # ~/.local/bin on PATH
    # what a job's worker gets: the platform's interpreter (a %%train script) and `python` from PATH (a command)
    job = dict(os.environ, HOME=home)
    job.pop("PYTHONPATH", None)
    job.update(userenv.job_env(home, {"PATH": os.environ.get("PATH", "")}))
    assert run(sys.executable, "-c", "import tinypkg_th; print(tinypkg_th.VALUE)", environ=job).strip() == "7"
    assert run("python", "-c", "import tinypkg_th, sys; print(tinypkg_th.VALUE, sys.prefix)", environ=job).split() == [
        "7", str(venv)]
    # a later start brings the platform's part up to date and leaves the user's packages alone
    (venv / "lib").joinpath(f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages",
                            userenv.PTH_NAME).write_text("# changed\n")
    s._prepare_home()
    assert "addsitedir" in (Path(userenv.site_packages(home)) / userenv.PTH_NAME).read_text()
    assert run(str(py), "-c", "import tinypkg_th, trainhub; print(tinypkg_th.VALUE)").strip() == "7"


# -- through a real `trainhub up`: the user's own account, sandbox and network namespace -----------------------------

def _terminal(platform, user: str, commands: str, marker: str, timeout: float = 300) -> str:
    """Run ``commands`` in a new JupyterLab terminal of the user's server (terminado's websocket, as the browser does);
    the output up to ``marker``."""
    import websocket

    h = {"Authorization": f"token {platform.token(user)}"}
    base = f"{platform.url}/user/{user}"
    r = requests.post(f"{base}/api/terminals", headers=h, timeout=60)
    assert r.status_code == 200, r.text
    name = r.json()["name"]
    ws = websocket.create_connection(f"{base.replace('http://', 'ws://', 1)}/terminals/websocket/{name}",
                                     header=[f"Authorization: token {platform.token(user)}"], timeout=timeout)
    out = []
    try:
        ws.send(json.dumps(["stdin", commands + "\r"]))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg[0] == "stdout":
                out.append(msg[1])
                if marker in "".join(out).replace("\r", ""):
                    return "".join(out).replace("\r", "")
        raise AssertionError(f"no {marker!r} from the terminal within {timeout} s:\n{''.join(out)}")
    finally:
        ws.close()
        requests.delete(f"{base}/api/terminals/{name}", headers=h, timeout=30)


def test_a_terminal_has_python_pip_and_trainhub_and_kernels_and_jobs_see_what_pip_installs(platform):
    from test_isolation import User

    user = "ue-alice"
    platform.spawn(user, "cpu", timeout=180)
    try:
        h = {"Authorization": f"token {platform.token(user)}"}
        r = requests.put(f"{platform.url}/user/{user}/api/contents/{WHEEL}", headers=h, timeout=60, json={
            "type": "file", "format": "base64", "content": base64.b64encode(tiny_wheel(11)).decode()})
        assert r.status_code in (200, 201), r.text
        marker = f"DONE-{uuid.uuid4().hex[:8]}"
        out = _terminal(platform, user, "; ".join([
            "type python pip trainhub", "python -c 'import sys; print(\"prefix\", sys.prefix)'",
            f"pip install --user --no-index ./{WHEEL}", "tinytool", "trainhub --help | head -n 3",
            "trainhub jobs list", f"echo {marker[:5]}''{marker[5:]}"]), marker)
        assert "not found" not in out, out
        home = os.path.realpath(platform.data_dir / "homes" / user)
        assert f"python is {home}/.trainhub/venv/bin/python" in out, out
        assert f"pip is {home}/.trainhub/venv/bin/pip" in out, out
        assert f"trainhub is {os.path.dirname(sys.executable)}/trainhub" in out, out
        assert f"prefix {home}/.trainhub/venv" in out, out
        assert "Successfully installed tinypkg-th-0.1" in out and "tinytool says 11" in out, out
        assert "usage: trainhub" in out, out
        # it persists in the home (the user's own account owns it), outside the read-only platform environment
        site = Path(home, ".local", "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")
        assert (site / "tinypkg_th" / "__init__.py").exists()
        assert os.stat(site).st_uid == os.stat(home).st_uid

        r = requests.post(f"{platform.url}/user/{user}/api/sessions", headers=h, timeout=120, json={
            "path": "env.ipynb", "name": "env.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
        assert r.status_code == 201, r.text
        kid = r.json()["kernel"]["id"]  # the notebook kernel JupyterLab would start (the "python3" spec)
        out = platform.kernel_exec(user, "import sys, tinypkg_th; print('kernel', tinypkg_th.VALUE, sys.prefix)",
                                   kernel_id=kid, timeout=120)
        assert f"kernel 11 {home}/.trainhub/venv" in out, out

        alice = User(platform, user)
        script = alice.submit(script="import tinypkg_th\nprint('script job', tinypkg_th.VALUE)\n", name="env-script")
        command = alice.submit(command="python -c 'import tinypkg_th; print(\"command job\", tinypkg_th.VALUE)' && tinytool",
                               name="env-command")
        for job, line in ((script, "script job 11"), (command, "command job 11")):
            done = alice.wait(job["id"], timeout=180)
            logs = alice.logs(job["id"])
            assert done["state"] == "succeeded", (done, logs)
            assert line in logs, logs
        assert "tinytool says 11" in alice.logs(command["id"])
    finally:
        platform.stop_server(user)
