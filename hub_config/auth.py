"""Embedded user management: NativeAuthenticator plus a bootstrap admin.

Users sign up at /hub/signup and an admin authorizes them at /hub/authorize, or the
admin adds them with ``trainhub users add``. Any other JupyterHub authenticator (OAuth,
LDAP) can replace this one through configuration.
"""

from __future__ import annotations

from pathlib import Path

import bcrypt
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.orm import UserInfo
from traitlets import Unicode


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
