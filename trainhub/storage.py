"""Storage areas on one fsspec URL: a private area per user and a shared, read-only `datasets/`.

Layout under the root URL (a local folder or ``s3://bucket/prefix``)::

    users/<name>/...   one user's private area
    datasets/...       shared datasets, read-only to users

The platform's own credentials come from configuration or the usual AWS environment variables and stay
in the platform's processes. Spawned servers and jobs get an fsspec URL, options without any credential,
and (S3) the variables that make s3fs/boto3 read their own short-lived, prefix-scoped credentials from a
file the platform keeps fresh (:mod:`trainhub.boundary.credentials`).
"""

from __future__ import annotations

import json
import os
import re

import fsspec
from traitlets import Bool, Dict, Unicode, default
from traitlets import Callable as CallableTrait
from traitlets.config import LoggingConfigurable

from trainhub.exceptions import Forbidden, InvalidRequest

SAFE_NAME = re.compile(r"^[A-Za-z0-9._@-]+$")

#: fsspec/s3fs option names that carry a credential: never handed to a user's process
CREDENTIAL_OPTIONS = frozenset({"key", "secret", "token", "password", "username", "profile", "session"})
CREDENTIAL_CLIENT_KWARGS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token"})
#: the variables that carry an AWS key (never in a user's environment unless share_platform_credentials)
AWS_SECRET_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def safe_username(name: str) -> str:
    if not SAFE_NAME.match(name) or name in (".", ".."):
        raise InvalidRequest(f"user name {name!r} cannot name a storage area")
    return name


class StorageConfig(LoggingConfigurable):
    url = Unicode(
        "",
        help="Root fsspec URL: a local folder (default <data-dir>/storage) or s3://bucket/prefix.",
    ).tag(config=True)

    endpoint_url = Unicode(
        "",
        help="S3 endpoint for S3-compatible services (Ceph RGW, MinIO). Default: $AWS_ENDPOINT_URL or $S3_ENDPOINT_URL; empty = AWS.",
    ).tag(config=True)

    key = Unicode("", help="S3 access key. Default: $AWS_ACCESS_KEY_ID.").tag(config=True)
    secret = Unicode("", help="S3 secret key. Default: $AWS_SECRET_ACCESS_KEY.").tag(config=True)

    extra_options = Dict({}, help="Extra fsspec storage options passed to the filesystem (e.g. {'anon': False}).").tag(config=True)

    user_credentials_hook = CallableTrait(
        None,
        allow_none=True,
        help="""Optional callable (username) -> {"key": ..., "secret": ..., "token": ..., "expiration": ...}
        returning credentials scoped to that user's prefix (for example a per-user Ceph RGW key, or an admin's own
        STS set-up); "token" and "expiration" (a datetime or ISO 8601 string) are optional. When set, its result is
        used instead of trainhub's own minting (trainhub.boundary.credentials.CredentialMinter) and delivered the
        same way (the per-user credentials file). None: the platform mints them (c.CredentialMinter).""",
    ).tag(config=True)

    share_platform_credentials = Bool(
        False,
        help="""The old, unsafe behaviour, "one S3 key for everyone": every user's server and job gets the
        platform's own key (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, and in TRAINHUB_STORAGE_OPTIONS), so code in
        any kernel can write datasets/ and read or delete every other user's area. Only for a one-person
        development set-up. False (default): users' processes never hold the platform's key; they get short-lived
        credentials limited to their own prefix and datasets/ (docs/storage.md, "Per-user credentials").""",
    ).tag(config=True)

    @default("endpoint_url")
    def _endpoint_default(self):
        return os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL") or ""

    @default("key")
    def _key_default(self):
        return os.environ.get("AWS_ACCESS_KEY_ID", "")

    @default("secret")
    def _secret_default(self):
        return os.environ.get("AWS_SECRET_ACCESS_KEY", "")

    @property
    def protocol(self) -> str:
        p = fsspec.utils.get_protocol(self.url)
        return "file" if p in ("file", "local") else p

    @property
    def is_local(self) -> bool:
        return self.protocol == "file"

    def storage_options(self, username: str | None = None) -> dict:
        opts = dict(self.extra_options)
        if self.protocol == "s3":
            if self.endpoint_url:
                opts["endpoint_url"] = self.endpoint_url
            creds = None
            if username and self.user_credentials_hook:
                creds = self.user_credentials_hook(username)
            if creds:
                opts.update(creds)
            else:
                if self.key:
                    opts["key"] = self.key
                if self.secret:
                    opts["secret"] = self.secret
        return opts

    def user_storage_options(self) -> dict:
        """The fsspec options a user's process may hold: the endpoint and ``extra_options`` without any credential
        (credentials reach it through the AWS variables of :meth:`env_for`)."""
        opts = {k: v for k, v in self.extra_options.items() if k not in CREDENTIAL_OPTIONS}
        client_kwargs = opts.get("client_kwargs")
        if isinstance(client_kwargs, dict):
            opts["client_kwargs"] = {k: v for k, v in client_kwargs.items() if k not in CREDENTIAL_CLIENT_KWARGS}
        if self.protocol == "s3" and self.endpoint_url:
            opts["endpoint_url"] = self.endpoint_url
        return opts

    def root(self) -> str:
        return self.url.rstrip("/")

    def user_url(self, username: str) -> str:
        return f"{self.root()}/users/{safe_username(username)}"

    def datasets_url(self) -> str:
        return f"{self.root()}/datasets"

    def filesystem(self, username: str | None = None) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem(self.protocol, **self.storage_options(username))

    def strip(self, url: str) -> str:
        """Path form of a URL for fsspec calls (no protocol)."""
        return fsspec.core.strip_protocol(url) if self.protocol != "file" else os.path.abspath(fsspec.core.strip_protocol(url))

    def ensure_layout(self, usernames=()) -> None:
        fs = self.filesystem()
        for url in [self.datasets_url()] + [self.user_url(u) for u in usernames]:
            path = self.strip(url)
            if self.is_local:
                fs.makedirs(path, exist_ok=True)
            else:
                # object stores have no directories; a marker keeps the prefix listable
                try:
                    if not fs.exists(path + "/.keep"):
                        fs.pipe(path + "/.keep", b"")
                except Exception as e:  # storage unreachable: say so clearly, once
                    raise RuntimeError(f"cannot reach storage {self.url}: {e}") from e

    def env_for(self, username: str, *, credentials_env: dict[str, str] | None = None,
                platform_credentials: bool | None = None) -> dict[str, str]:
        """Environment for a user's server or job: where its storage is and how to reach it.

        With S3 it never holds the platform's key (unless ``platform_credentials``, default
        ``share_platform_credentials``: the old "one S3 key for everyone"). The user's own credentials come from
        ``credentials_env``, the variables of the user's credentials file
        (:meth:`trainhub.boundary.credentials.UserCredentialFiles.env`: ``AWS_CONFIG_FILE`` whose
        ``credential_process`` prints short-lived, prefix-scoped credentials the platform keeps fresh). Without it,
        ``user_credentials_hook``'s result goes in as ``AWS_*`` values (static: never refreshed); with neither the
        process gets no credentials at all and storage refuses it.
        """
        env = {
            "TRAINHUB_STORAGE_ROOT": self.root(),
            "TRAINHUB_STORAGE_URL": self.user_url(username),
            "TRAINHUB_DATASETS_URL": self.datasets_url(),
        }
        if self.protocol != "s3":
            env["TRAINHUB_STORAGE_OPTIONS"] = json.dumps(self.storage_options(username))
            return env
        if platform_credentials is None:
            platform_credentials = self.share_platform_credentials
        opts = self.user_storage_options()
        creds: dict = {}
        if credentials_env:
            env.update({k: v for k, v in credentials_env.items() if k not in AWS_SECRET_VARS})
        elif self.user_credentials_hook:
            creds = self.user_credentials_hook(username) or {}
        elif platform_credentials:
            # the old behaviour: the platform's own key, in the variables and in the options
            creds = {"key": self.key, "secret": self.secret}
            opts.update({k: v for k, v in creds.items() if v})
        for var, name in zip(AWS_SECRET_VARS, ("key", "secret", "token")):
            if creds.get(name):
                env[var] = creds[name]
        env["TRAINHUB_STORAGE_OPTIONS"] = json.dumps(opts)
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
            env["FSSPEC_S3_ENDPOINT_URL"] = self.endpoint_url
        return env


MAX_NAME_BYTES = 255  # one file or folder name (what Linux file systems and S3 tools accept)
MAX_PATH_BYTES = 1024  # a whole path inside an area (S3 keys are at most 1024 bytes)


def resolve_in_area(area_root: str, relpath: str) -> str:
    """Join a user-supplied relative path under an area root, refusing escapes.

    Refuses absolute paths, ``..`` segments and (for local folders) symlinks that leave the
    area. Returns the joined path (without protocol for remote stores).
    """
    if relpath is None:
        relpath = ""
    if "\x00" in relpath:
        raise InvalidRequest("path contains a NUL byte")
    if relpath.startswith("/") or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", relpath):
        raise Forbidden(f"absolute paths are not allowed here: {relpath!r}; give a path relative to your area")
    if len(relpath.encode()) > MAX_PATH_BYTES:
        raise InvalidRequest(f"the path is {len(relpath.encode())} bytes long; at most {MAX_PATH_BYTES} are allowed")
    parts = [p for p in relpath.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise Forbidden(f"'..' is not allowed in storage paths: {relpath!r}")
    for p in parts:
        if len(p.encode()) > MAX_NAME_BYTES:
            raise InvalidRequest(f"the name {p[:40]!r}... is {len(p.encode())} bytes long; file and folder names "
                                 f"are at most {MAX_NAME_BYTES} bytes")
    joined = area_root.rstrip("/") + ("/" + "/".join(parts) if parts else "")
    if os.path.isabs(area_root) and os.path.exists(area_root):
        real_root = os.path.realpath(area_root)
        real = os.path.realpath(joined)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise Forbidden(f"{relpath!r} leaves your storage area (symbolic link)")
    return joined
