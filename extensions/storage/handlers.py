"""Handlers of the storage browser extension (see the package docstring for the routes)."""

from __future__ import annotations

import asyncio
import errno
import json
import mimetypes
import os
from datetime import datetime, timezone
from urllib.parse import urlencode

import fsspec
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import httpclient, web
from traitlets import Dict, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from trainhub.data.listing import list_page
from trainhub.exceptions import Conflict, Forbidden, InsufficientStorage, InvalidRequest, NotFound, TooLarge
from trainhub.fmt import as_utc
from trainhub.httpapi import JSONErrors
from trainhub.storage import resolve_in_area

from .move import MoveHandler
from .snapshot import SnapshotHandler

HOME, DATASETS = "home", "datasets"
CHUNK = 1 << 20
PROXIED = ("", "datasets", "models", "jobs", "sweeps", "usage", "profiles", "openapi.json")


class StorageBrowser(LoggingConfigurable):
    """Where the user's areas are (from the spawner's environment) and the browser's limits."""

    home_url = Unicode(help="fsspec URL of the user's own area. Default: $TRAINHUB_STORAGE_URL.").tag(config=True)
    datasets_url = Unicode(help="fsspec URL of the shared, read-only datasets area. Default: $TRAINHUB_DATASETS_URL.").tag(config=True)
    storage_options = Dict(help="fsspec options (credentials, endpoint). Default: $TRAINHUB_STORAGE_OPTIONS (JSON).").tag(config=True)
    api_url = Unicode(help="trainhub service API the panel's calls are forwarded to. Default: $TRAINHUB_API_URL.").tag(config=True)
    api_token = Unicode(help="Token for the forwarded calls. Default: $JUPYTERHUB_API_TOKEN (the server's own).").tag(config=True)
    page_size = Integer(500, help="Entries per listing page when the request gives no limit (max 5000).").tag(config=True)
    preview_bytes = Integer(64 * 1024, help="Bytes of a file shown in a preview.").tag(config=True)
    api_timeout = Integer(120, help="Seconds a forwarded API call may take.").tag(config=True)
    culler_url = Unicode(help="The idle-GPU culler service (warnings, keep). Default: $TRAINHUB_CULLER_URL; "
                              "empty = no culler, no warnings.").tag(config=True)
    server_name = Unicode(help="This server's name for the culler (\"\" = default server). "
                               "Default: $JUPYTERHUB_SERVER_NAME.").tag(config=True)
    culler_timeout = Integer(30, help="Seconds a forwarded culler call may take.").tag(config=True)
    max_upload_bytes = Integer(512 << 20, help="Largest file one upload may write (the request is held in this "
                               "server's memory while it is written). Larger files: `trainhub data` or the "
                               "storage's own tools.").tag(config=True)

    @default("home_url")
    def _home(self):
        return os.environ.get("TRAINHUB_STORAGE_URL", "")

    @default("datasets_url")
    def _datasets(self):
        return os.environ.get("TRAINHUB_DATASETS_URL", "")

    @default("storage_options")
    def _opts(self):
        try:
            return json.loads(os.environ.get("TRAINHUB_STORAGE_OPTIONS") or "{}")
        except ValueError:
            self.log.warning("TRAINHUB_STORAGE_OPTIONS is not JSON; using no storage options")
            return {}

    @default("api_url")
    def _api_url(self):
        return os.environ.get("TRAINHUB_API_URL", "")

    @default("api_token")
    def _api_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("culler_url")
    def _culler_url(self):
        return os.environ.get("TRAINHUB_CULLER_URL", "")

    @default("server_name")
    def _server_name(self):
        return os.environ.get("JUPYTERHUB_SERVER_NAME", "")

    _fs = None

    def protocol(self) -> str:
        url = self.home_url or self.datasets_url
        p = fsspec.utils.get_protocol(url) if url else "file"
        return "file" if p in ("file", "local") else p

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            opts = dict(self.storage_options)
            if self.protocol() == "s3":
                opts.setdefault("use_listings_cache", False)
            self._fs = fsspec.filesystem(self.protocol(), **opts)
        return self._fs

    def areas(self) -> dict[str, dict]:
        out = {}
        if self.home_url:
            out[HOME] = {"name": HOME, "label": "My storage", "url": self.home_url, "writable": True}
        if self.datasets_url:
            out[DATASETS] = {"name": DATASETS, "label": "Shared datasets", "url": self.datasets_url, "writable": False}
        return out

    def area_root(self, area: str) -> tuple[str, dict]:
        a = self.areas().get(area)
        if a is None:
            raise InvalidRequest(f"unknown storage area {area!r}; use one of: {', '.join(self.areas()) or '(none configured)'}")
        root = self.fs._strip_protocol(a["url"]).rstrip("/")
        if self.protocol() == "file":
            root = os.path.abspath(root)
        return root, a

    def resolve(self, area: str, path: str, write: bool = False) -> tuple[str, str, dict]:
        """(area root path, full path) for a relative ``path``; escapes and writes to read-only areas refused."""
        root, a = self.area_root(area)
        if write and not a["writable"]:
            raise Forbidden(f"the {a['label'].lower()} area ({area}/) is read-only; "
                            "copy what you need into your own area, or ask an admin to add data there")
        full = resolve_in_area(root, path or "")
        return root, full, a

    def url_of(self, full: str) -> str:
        if self.protocol() == "file":
            return full
        return f"{self.protocol()}://{full}"


def _iso(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, timezone.utc)
    if isinstance(value, datetime):
        return as_utc(value).isoformat().replace("+00:00", "Z")
    return str(value)


def entry_json(browser: StorageBrowser, root: str, e: dict) -> dict:
    name = e["name"].rstrip("/")
    rel = name[len(root):].lstrip("/") if name.startswith(root) else name.rsplit("/", 1)[-1]
    kind = "directory" if e.get("type") == "directory" else "file"
    return {
        "name": rel.rsplit("/", 1)[-1], "path": rel, "type": kind, "size": int(e.get("size") or 0),
        "modified": _iso(e.get("LastModified") or e.get("mtime") or e.get("last_modified")),
        "url": browser.url_of(name),
    }


class StorageHandler(JSONErrors, APIHandler):
    """jupyter-server's APIHandler (its authentication and ``@authorized``) with trainhub's JSON errors."""

    auth_resource = "contents"
    internal_error_message = "internal error in the storage browser; details are in the server log"

    @property
    def browser(self) -> StorageBrowser:
        return self.settings["trainhub_storage"]

    async def blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args))

    def args(self, write: bool = False):
        area = self.get_argument("area", HOME)
        path = self.get_argument("path", "")
        return (area, path, *self.browser.resolve(area, path, write))

    def _handle_request_exception(self, e):
        # the storage's own errors as domain errors; JSONErrors maps those to HTTP
        if isinstance(e, FileNotFoundError):
            e = NotFound("no such file or folder")
        elif isinstance(e, PermissionError):
            e = Forbidden(f"permission denied by the storage: {e}")
        elif isinstance(e, (FileExistsError, NotADirectoryError)):
            e = Conflict("a file is in the way: a folder cannot be made where a file is, nor a file inside a file "
                         f"({self.get_argument('path', '')!r})")
        elif isinstance(e, IsADirectoryError):
            e = Conflict(f"{self.get_argument('path', '')!r} is a folder")
        elif isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG:
            e = InvalidRequest("a file or folder name in the path is too long for the storage")
        elif isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            e = InsufficientStorage(f"the storage is full: {e.strerror}")
        return super()._handle_request_exception(e)


class AreasHandler(StorageHandler):
    @web.authenticated
    @authorized
    async def get(self):
        self.finish(json.dumps({"areas": list(self.browser.areas().values())}))


class ListHandler(StorageHandler):
    @web.authenticated
    @authorized
    async def get(self):
        area, path, root, full, a = self.args()
        try:
            limit = int(self.get_argument("limit", str(self.browser.page_size)))
        except ValueError:
            raise InvalidRequest("limit must be an integer") from None
        limit = max(1, min(limit, 5000))
        after = self.get_argument("after", None)
        if after:
            after_full = resolve_in_area(root, after.rstrip("/")) + ("/" if after.endswith("/") else "")
        else:
            after_full = None
        page = await self.blocking(list_page, self.browser.fs, full, limit, after_full)
        if not len(page) and path and not after:
            exists = await self.blocking(self.browser.fs.exists, full)
            if not exists:
                raise NotFound(f"no folder {path!r} in {area}/")
        entries = [entry_json(self.browser, root, e) for e in page.entries
                   if e["name"].rstrip("/") != full and not e["name"].endswith("/.keep")]
        next_after = None
        if page.next_after:
            na = page.next_after
            next_after = na[len(root):].lstrip("/") if na.startswith(root) else na
        self.finish(json.dumps({"area": area, "path": path.strip("/"), "url": self.browser.url_of(full),
                                "writable": a["writable"], "entries": entries, "next_after": next_after}))


class PreviewHandler(StorageHandler):
    @web.authenticated
    @authorized
    async def get(self):
        area, path, root, full, a = self.args()
        fs = self.browser.fs
        info = await self.blocking(fs.info, full)
        out = {"area": area, "path": path, "url": self.browser.url_of(full), "size": int(info.get("size") or 0),
               "type": "directory" if info.get("type") == "directory" else "file"}
        if out["type"] == "file":
            mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
            out["mime"] = mime
            n = self.browser.preview_bytes

            def head():
                with fs.open(full, "rb") as f:
                    return f.read(n)

            data = await self.blocking(head)
            if mime.startswith("image/"):
                out["kind"] = "image"
            else:
                try:
                    out["text"] = data.decode("utf-8")
                    out["kind"] = "text"
                except UnicodeDecodeError:
                    # a multi-byte character cut at the end is still text
                    try:
                        out["text"] = data[:-3].decode("utf-8") if len(data) == n else None
                    except UnicodeDecodeError:
                        out["text"] = None
                    out["kind"] = "text" if out["text"] is not None else "binary"
                out["truncated"] = out["size"] > n
        self.finish(json.dumps(out))


class FilesHandler(StorageHandler):
    @web.authenticated
    @authorized
    async def get(self):
        area, path, root, full, a = self.args()
        fs = self.browser.fs
        info = await self.blocking(fs.info, full)
        if info.get("type") == "directory":
            raise InvalidRequest(f"{path!r} is a folder; download files one by one")
        name = path.rsplit("/", 1)[-1] or "download"
        self.set_header("Content-Type", mimetypes.guess_type(name)[0] or "application/octet-stream")
        if self.get_argument("download", "1") not in ("0", "false"):
            self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        if info.get("size") is not None:
            self.set_header("Content-Length", str(int(info["size"])))
        f = await self.blocking(fs.open, full, "rb")
        try:
            while True:
                chunk = await self.blocking(f.read, CHUNK)
                if not chunk:
                    break
                self.write(chunk)
                await self.flush()
        finally:
            await self.blocking(f.close)
        self.finish()

    @web.authenticated
    @authorized
    async def put(self):
        area, path, root, full, a = self.args(write=True)
        if not path.strip("/"):
            raise InvalidRequest("give the file's path in your area, e.g. ?path=data/train.csv")
        fs = self.browser.fs
        body = self.request.body
        if len(body) > self.browser.max_upload_bytes:
            raise TooLarge(f"the file is {len(body):,} bytes; one upload may be at most {self.browser.max_upload_bytes:,} "
                           "(use `trainhub data` or the storage's own tools for larger files)")

        def write():
            if self.browser.protocol() == "file":
                fs.makedirs(os.path.dirname(full), exist_ok=True)
                if os.path.isdir(full):
                    raise Conflict(f"{path!r} is a folder")
            fs.pipe(full, body)
            return fs.info(full)

        info = await self.blocking(write)
        self.log.info("storage upload: %s/%s (%d bytes)", area, path, len(body))
        self.set_status(201)
        self.finish(json.dumps(entry_json(self.browser, root, dict(info, name=full))))

    @web.authenticated
    @authorized
    async def delete(self):
        area, path, root, full, a = self.args(write=True)
        if full.rstrip("/") == root.rstrip("/"):  # "", "/", ".", "./." ...: the area itself
            raise Forbidden("the area itself cannot be deleted; delete the files and folders in it")
        fs = self.browser.fs
        recursive = self.get_argument("recursive", "0") in ("1", "true")

        def rm():
            info = fs.info(full)
            if info.get("type") == "directory":
                if not recursive:
                    raise InvalidRequest(f"{path!r} is a folder; pass recursive=1 to delete it and everything in it")
                fs.rm(full, recursive=True)
            else:
                fs.rm_file(full)

        await self.blocking(rm)
        self.log.info("storage delete: %s/%s", area, path)
        self.set_status(204)
        self.finish()


class FoldersHandler(StorageHandler):
    @web.authenticated
    @authorized
    async def post(self):
        area, path, root, full, a = self.args(write=True)
        if not path.strip("/"):
            raise InvalidRequest("give the new folder's path")
        fs = self.browser.fs

        def mk():
            if self.browser.protocol() == "file":
                fs.makedirs(full, exist_ok=True)
            else:  # object stores: a marker object makes the prefix visible
                fs.pipe(full.rstrip("/") + "/.keep", b"")

        await self.blocking(mk)
        self.set_status(201)
        self.finish(json.dumps({"area": area, "path": path.strip("/"), "type": "directory"}))


class APIProxyHandler(StorageHandler):
    """Forward the panel's registry/jobs calls to the trainhub service with the server's token.

    The server's token holds only its owner's trainhub scopes, so the service decides what is
    allowed exactly as for the owner's own API calls.
    """

    auth_resource = "trainhub"

    async def _forward(self, subpath: str | None):
        subpath = subpath or ""
        b = self.browser
        if not b.api_url or not b.api_token:
            raise web.HTTPError(503, "this server has no trainhub API configured ($TRAINHUB_API_URL)")
        first = subpath.strip("/").split("/", 1)[0]
        if first not in PROXIED or ".." in subpath.split("/"):
            raise NotFound(f"no trainhub API route {subpath!r} here")
        url = b.api_url.rstrip("/") + "/" + subpath.lstrip("/")
        query = {k: [v.decode() for v in vs] for k, vs in self.request.query_arguments.items()}
        if query:
            url += "?" + urlencode(query, doseq=True)
        method = self.request.method
        body = self.request.body if method in ("POST", "PATCH", "PUT") else None
        headers = {"Authorization": f"token {b.api_token}", "Accept": self.request.headers.get("Accept", "application/json")}
        if body is not None:
            headers["Content-Type"] = self.request.headers.get("Content-Type", "application/json")
        req = httpclient.HTTPRequest(url, method=method, body=body, headers=headers, request_timeout=b.api_timeout,
                                     allow_nonstandard_methods=True, follow_redirects=False)
        try:
            resp = await httpclient.AsyncHTTPClient(max_body_size=4 * 1024**3).fetch(req, raise_error=False)
        except OSError as e:
            raise web.HTTPError(502, f"cannot reach the trainhub API at {b.api_url}: {e}")
        if resp.code == 599:
            raise web.HTTPError(502, f"cannot reach the trainhub API at {b.api_url}: {resp.error}")
        self.set_status(resp.code)
        for h in ("Content-Type", "Content-Disposition"):
            if h in resp.headers:
                self.set_header(h, resp.headers[h])
        if resp.code != 204 and resp.body:
            self.write(resp.body)
        self.finish()

    @web.authenticated
    @authorized
    async def get(self, subpath):
        await self._forward(subpath)

    @web.authenticated
    @authorized
    async def post(self, subpath):
        await self._forward(subpath)

    @web.authenticated
    @authorized
    async def patch(self, subpath):
        await self._forward(subpath)

    @web.authenticated
    @authorized
    async def delete(self, subpath):
        await self._forward(subpath)


class CullerProxyHandler(StorageHandler):
    """The JupyterLab idle-GPU notification's calls, forwarded to the culler service.

    ``GET trainhub/culler/warnings`` -> ``GET $TRAINHUB_CULLER_URL/api/warnings`` (``{"items": []}``
    when no culler is configured); ``POST trainhub/culler/keep`` -> ``POST $TRAINHUB_CULLER_URL/api/keep``
    with ``{"server": "$JUPYTERHUB_SERVER_NAME"}``. Both carry the server's own token, so the culler
    answers for the server's owner only.
    """

    auth_resource = "trainhub"

    async def _call(self, method: str, path: str, body: dict | None = None):
        b = self.browser
        if not b.culler_url:
            raise web.HTTPError(503, "this server has no idle-GPU culler configured ($TRAINHUB_CULLER_URL)")
        if not b.api_token:
            raise web.HTTPError(503, "this server has no hub token to call the culler with ($JUPYTERHUB_API_TOKEN)")
        url = b.culler_url.rstrip("/") + "/" + path
        headers = {"Authorization": f"token {b.api_token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        req = httpclient.HTTPRequest(url, method=method, body=data, headers=headers, request_timeout=b.culler_timeout,
                                     follow_redirects=False)
        try:
            resp = await httpclient.AsyncHTTPClient().fetch(req, raise_error=False)
        except OSError as e:
            raise web.HTTPError(502, f"cannot reach the culler at {b.culler_url}: {e}")
        if resp.code == 599:
            raise web.HTTPError(502, f"cannot reach the culler at {b.culler_url}: {resp.error}")
        text = resp.body or b""
        try:
            payload = json.loads(text) if text else {}
        except ValueError:
            payload = None
        if resp.code in (301, 302, 303, 307, 308):
            # the culler redirects to the hub's OAuth flow when it does not accept the token
            raise web.HTTPError(502, f"the culler did not accept this server's token (redirect to "
                                     f"{resp.headers.get('Location', '?')})")
        if not isinstance(payload, dict):
            raise web.HTTPError(502, f"the culler answered {resp.code} with no JSON")
        if resp.code >= 400:
            message = payload.get("message") or resp.reason or "culler error"
            self.set_status(resp.code)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"status": resp.code, "message": message}))
            return
        self.set_status(resp.code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))


class CullerWarningsHandler(CullerProxyHandler):
    @web.authenticated
    @authorized
    async def get(self):
        if not self.browser.culler_url:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"items": []}))
            return
        await self._call("GET", "api/warnings")


class GPUStatusHandler(CullerProxyHandler):
    """The status bar's GPU line: ``GET $TRAINHUB_CULLER_URL/api/gpus?server=$JUPYTERHUB_SERVER_NAME``.

    Always this server (what the browser asks for is ignored). With no culler configured:
    ``{"devices": [], "clock": null, "culler": false}`` (the status bar then shows nothing).
    """

    @web.authenticated
    @authorized
    async def get(self):
        if not self.browser.culler_url:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"devices": [], "clock": None, "can_keep": False, "culler": False}))
            return
        await self._call("GET", "api/gpus?" + urlencode({"server": self.browser.server_name}))


class CullerKeepHandler(CullerProxyHandler):
    @web.authenticated
    @authorized
    async def post(self):
        await self._call("POST", "api/keep", {"server": self.browser.server_name})


class CullerReleaseHandler(CullerProxyHandler):
    """"Give my GPU back": ``POST $TRAINHUB_CULLER_URL/api/release`` for this server (the culler snapshots
    the kernels, then restarts the server on the CPU profile; it answers before that starts)."""

    @web.authenticated
    @authorized
    async def post(self):
        await self._call("POST", "api/release", {"server": self.browser.server_name})


class CullerRegainHandler(CullerProxyHandler):
    """"Get a GPU again" for this server: ``POST $TRAINHUB_CULLER_URL/api/regain`` with ``{"server":
    $JUPYTERHUB_SERVER_NAME, "profile": <the body's profile>}`` (the request waits in line while this server
    runs on; once the GPUs are granted the culler snapshots the kernels and restarts it on them), ``GET`` the
    request's state and the GPU profiles one may ask for, ``DELETE`` to withdraw it while it waits."""

    def _query(self) -> str:
        return "api/regain?" + urlencode({"server": self.browser.server_name})

    @web.authenticated
    @authorized
    async def get(self):
        if not self.browser.culler_url:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"request": None, "profiles": [], "culler": False}))
            return
        await self._call("GET", self._query())

    @web.authenticated
    @authorized
    async def post(self):
        body = self.request.body.strip()
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("profile", ""), (str, type(None))):
            raise InvalidRequest('the body must be {"profile": "<GPU profile slug>"} or empty')
        forward = {"server": self.browser.server_name}
        if data.get("profile"):
            forward["profile"] = data["profile"]
        await self._call("POST", "api/regain", forward)

    @web.authenticated
    @authorized
    async def delete(self):
        await self._call("DELETE", self._query())


class NoRouteHandler(StorageHandler):
    """Any other path under ``trainhub/``: a JSON 404 like every other error here (not jupyter-server's page)."""

    def prepare(self):
        raise NotFound(f"nothing is served at {self.request.path}")


def default_handlers(base_url: str, browser: StorageBrowser) -> list:
    s = url_path_join(base_url, "trainhub", "storage")
    return [
        (f"{s}/areas", AreasHandler),
        (f"{s}/list", ListHandler),
        (f"{s}/preview", PreviewHandler),
        (f"{s}/files", FilesHandler),
        (f"{s}/folders", FoldersHandler),
        (url_path_join(base_url, "trainhub", "api") + r"(/.*)?", APIProxyHandler),
        (url_path_join(base_url, "trainhub", "culler", "warnings"), CullerWarningsHandler),
        (url_path_join(base_url, "trainhub", "culler", "keep"), CullerKeepHandler),
        (url_path_join(base_url, "trainhub", "gpu", "status"), GPUStatusHandler),
        (url_path_join(base_url, "trainhub", "culler", "release"), CullerReleaseHandler),
        (url_path_join(base_url, "trainhub", "culler", "regain"), CullerRegainHandler),
        (url_path_join(base_url, "trainhub", "snapshot"), SnapshotHandler),
        (url_path_join(base_url, "trainhub", "move"), MoveHandler),
        # the rest of trainhub/ is a JSON 404, except what the sibling tensorboard extension serves
        (url_path_join(base_url, "trainhub") + r"(?:/(?!tensorboard(?:/|$)).*)?", NoRouteHandler),
    ]
