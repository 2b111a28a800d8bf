"""Embedded user management: NativeAuthenticator plus a bootstrap admin.

Users sign up at /hub/signup and an admin authorizes them at /hub/authorize, or the
admin adds them with ``trainhub users add``. Any other JupyterHub authenticator (OAuth,
LDAP) can replace this one through configuration.
"""

from __future__ import annotations

from pathlib import Path

import bcrypt
from jupyterhub.handlers.login import LoginHandler as HubLoginHandler
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator import handlers as native_handlers
from nativeauthenticator.orm import UserInfo
from traitlets import Unicode


class _NoStatsd:
    """Stands in for the statsd client JupyterHub 6 no longer gives handlers."""

    def timer(self, *args, **kwargs):
        return self

    def start(self):
        return self

    def stop(self, *args, **kwargs):
        pass

    def incr(self, *args, **kwargs):
        pass


class LoginHandler(native_handlers.LoginHandler):
    """NativeAuthenticator 1.3's login page, fixed for JupyterHub 6.

    Its POST times the login with ``self.statsd`` (gone in JupyterHub 6: every login was a
    500), and JupyterHub's error path calls ``_render(..., sync=True)``, which its
    ``_render`` does not accept.
    """

    statsd = _NoStatsd()

    def _render(self, login_error=None, username=None, **kwargs):
        if kwargs:
            return HubLoginHandler._render(self, login_error=login_error, username=username, **kwargs)
        return super()._render(login_error=login_error, username=username)


class TrainhubAuthenticator(NativeAuthenticator):
    bootstrap_admin = Unicode(
        "admin",
        help="Name of the admin account created on first start; empty = none.",
    ).tag(config=True)

    bootstrap_password_file = Unicode(
        "",
        help="File (0600) holding the bootstrap admin's password, written by `trainhub up`.",
    ).tag(config=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ensure_bootstrap_admin()

    def get_handlers(self, app):
        return [(route, LoginHandler if route == r"/login" else handler) for route, handler in super().get_handlers(app)]

    def _ensure_bootstrap_admin(self) -> None:
        if not (self.bootstrap_admin and self.bootstrap_password_file):
            return
        path = Path(self.bootstrap_password_file)
        if not path.exists():
            return
        password = path.read_text().strip()
        info = UserInfo.find(self.db, self.bootstrap_admin)
        if info is None:
            info = UserInfo(
                username=self.bootstrap_admin,
                password=bcrypt.hashpw(password.encode(), bcrypt.gensalt()),
                is_authorized=True,
            )
            self.db.add(info)
            self.db.commit()
            self.log.info("Created bootstrap admin %r", self.bootstrap_admin)
        elif not info.is_authorized:
            info.is_authorized = True
            self.db.commit()
