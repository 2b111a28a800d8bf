"""A small synchronous client for the JupyterHub REST API, used by the CLI.

It authenticates as the ``trainhub-cli`` service, whose token `trainhub up` keeps in the
data dir (0600): whoever can read the data dir administers the platform.
"""

from __future__ import annotations

import json
from pathlib import Path

import requests

from trainhub.settings import DataDir, Runtime


class HubError(RuntimeError):
    pass


class HubClient:
    def __init__(self, data_dir: Path | str, timeout: float = 30):
        self.dd = DataDir(Path(data_dir))
        self.runtime = Runtime.load(self.dd.root)
        if not self.dd.cli_token_file.exists():
            raise HubError(f"no CLI credentials in {self.dd.root}: start the platform with `trainhub up --data-dir {self.dd.root}`")
        self.token = self.dd.cli_token_file.read_text().strip()
        self.url = self.runtime.hub_api_url
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {self.token}"

    def request(self, method: str, path: str, body=None, ok=(200, 201, 204)):
        try:
            r = self.session.request(method, self.url + path, json=body, timeout=self.timeout)
        except requests.ConnectionError:
            raise HubError(
                f"cannot reach JupyterHub at {self.url}: is `trainhub up --data-dir {self.dd.root}` running?"
            ) from None
        if r.status_code not in ok:
            try:
                msg = r.json().get("message", r.text)
            except ValueError:
                msg = r.text
            raise HubError(f"{method} {path}: {r.status_code} {msg}")
        return r.json() if r.content else None

    def get_user(self, name: str) -> dict | None:
        try:
            return self.request("GET", f"/users/{name}")
        except HubError as e:
            if " 404 " in str(e):
                return None
            raise

    def ensure_user(self, name: str, admin: bool = False) -> dict:
        user = self.get_user(name)
        if user is None:
            user = self.request("POST", f"/users/{name}", {"admin": admin})
        elif admin and not user.get("admin"):
            user = self.request("PATCH", f"/users/{name}", {"admin": True})
        return user

    def new_token(self, name: str, note: str = "trainhub token", expires_in: int | None = None) -> str:
        body = {"note": note}
        if expires_in:
            body["expires_in"] = expires_in
        return self.request("POST", f"/users/{name}/tokens", body)["token"]

    def add_to_group(self, name: str, group: str) -> None:
        try:
            self.request("GET", f"/groups/{group}")
        except HubError:
            self.request("POST", f"/groups/{group}")
        self.request("POST", f"/groups/{group}/users", {"users": [name]})


def set_native_password(data_dir: Path | str, name: str, password: str) -> None:
    """Create or reset a NativeAuthenticator login (authorized) in the hub database."""
    import bcrypt
    from nativeauthenticator.orm import UserInfo
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    dd = DataDir(Path(data_dir))
    engine = create_engine(dd.hub_db_url)
    UserInfo.__table__.create(engine, checkfirst=True)
    with Session(engine) as s:
        info = s.query(UserInfo).filter(UserInfo.username == name).first()
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt())
        if info is None:
            s.add(UserInfo(username=name, password=hashed, is_authorized=True))
        else:
            info.password, info.is_authorized = hashed, True
        s.commit()
    engine.dispose()


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=str)
