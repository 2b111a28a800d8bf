"""Turning URLs into fsspec filesystems.

``url_to_fs(url, storage_options)`` is the one place that decides which options a
filesystem gets: explicit ``storage_options`` win; otherwise, for remote protocols, the JSON
object in ``$TRAINHUB_STORAGE_OPTIONS`` is used (for example
``{"endpoint_url": "http://127.0.0.1:9000", "key": "...", "secret": "..."}`` for an
S3-compatible server).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import fsspec

from .exceptions import InvalidURLError

ENV_STORAGE_OPTIONS = "TRAINHUB_STORAGE_OPTIONS"
LOCAL_PROTOCOLS = frozenset({"file", "local"})


def storage_options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Storage options from ``$TRAINHUB_STORAGE_OPTIONS`` (a JSON object), or ``{}``."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_STORAGE_OPTIONS, "").strip()
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except ValueError as e:
        raise InvalidURLError(f"${ENV_STORAGE_OPTIONS} is not valid JSON: {e}") from None
    if not isinstance(options, dict):
        raise InvalidURLError(
            f"${ENV_STORAGE_OPTIONS} must be a JSON object such as "
            '{"endpoint_url": "http://host:9000"}, got ' + type(options).__name__
        )
    return options


def protocol_of(url: str) -> str:
    """The outermost protocol of ``url`` (``"file"`` for plain paths)."""
    head = url.split("::", 1)[0]
    if "://" in head:
        return head.split("://", 1)[0].lower()
    return "file"


def url_to_fs(url: str, storage_options: Mapping[str, Any] | None = None):
    """Return ``(fs, path)`` for ``url``; raise :class:`InvalidURLError` with the reason."""
    if not isinstance(url, (str, os.PathLike)):
        raise InvalidURLError(f"expected a URL or path string, got {type(url).__name__}: {url!r}")
    url = os.fspath(url)
    if not url.strip():
        raise InvalidURLError("empty URL: pass a local folder or a URL such as s3://bucket/prefix")
    protocol = protocol_of(url)
    if storage_options is None:
        options = {} if protocol in LOCAL_PROTOCOLS else storage_options_from_env()
    else:
        options = dict(storage_options)
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ValueError as e:  # "Protocol not known: xyz"
        raise InvalidURLError(f"cannot open {url!r}: {e}") from None
    except ImportError as e:
        raise InvalidURLError(f"cannot open {url!r}: the filesystem for {protocol!r} is not installed ({e})") from None
    except TypeError as e:  # unexpected storage option
        raise InvalidURLError(f"cannot open {url!r} with storage options {sorted(options)}: {e}") from None
    return fs, path.rstrip("/") or path


def join(fs, base: str, name: str) -> str:
    """Join a relative name onto a filesystem path (works for local and object stores)."""
    sep = getattr(fs, "sep", "/")
    return base.rstrip(sep) + sep + name.lstrip(sep) if base else name


def full_url(fs, path: str) -> str:
    """A URL for ``path`` that ``url_to_fs`` accepts again (``s3://...`` or a local path)."""
    if protocol_name(fs) in LOCAL_PROTOCOLS:
        return path
    return fs.unstrip_protocol(path)


def protocol_name(fs) -> str:
    proto = fs.protocol
    return (proto[0] if isinstance(proto, (tuple, list)) else proto).lower()


def is_async(fs) -> bool:
    return bool(getattr(fs, "async_impl", False))
