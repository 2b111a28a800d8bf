"""Storage areas on one fsspec URL: a private area per user and a shared, read-only `datasets/`.

Layout under the root URL (a local folder or ``s3://bucket/prefix``)::

    users/<name>/...   one user's private area
    datasets/...       shared datasets, read-only to users

Credentials come from configuration or the usual AWS environment variables; spawned
servers and jobs get an fsspec URL plus options through environment variables.
"""

from __future__ import annotations

import json
import os
import re

import fsspec
from traitlets import Callable as CallableTrait
from traitlets import Dict, Unicode, default
from traitlets.config import LoggingConfigurable

from trainhub.exceptions import Forbidden, InvalidRequest

SAFE_NAME = re.compile(r"^[A-Za-z0-9._@-]+$")


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
        help="""Optional callable (username) -> {"key": ..., "secret": ..., "token": ...} returning
        credentials scoped to that user's prefix (for example from an STS AssumeRole with a
        prefix policy, or a per-user Ceph RGW key). None: servers get the platform's credentials.""",
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

    def env_for(self, username: str) -> dict[str, str]:
        """Environment for a user's server or job: where its storage is and how to reach it."""
        opts = self.storage_options(username)
        env = {
            "TRAINHUB_STORAGE_ROOT": self.root(),
            "TRAINHUB_STORAGE_URL": self.user_url(username),
            "TRAINHUB_DATASETS_URL": self.datasets_url(),
            "TRAINHUB_STORAGE_OPTIONS": json.dumps(opts),
        }
        if self.protocol == "s3":
            if opts.get("key"):
                env["AWS_ACCESS_KEY_ID"] = opts["key"]
            if opts.get("secret"):
                env["AWS_SECRET_ACCESS_KEY"] = opts["secret"]
            if opts.get("token"):
                env["AWS_SESSION_TOKEN"] = opts["token"]
            if opts.get("endpoint_url"):
                env["AWS_ENDPOINT_URL"] = opts["endpoint_url"]
                env["FSSPEC_S3_ENDPOINT_URL"] = opts["endpoint_url"]
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
