"""optuna-dashboard under a path prefix: ``python -m trainhub.extensions.optunadash.serve --port P --prefix /user/alice/proxy/absolute/P/ STORAGE``.

optuna-dashboard's page and bundle use absolute paths (``/static/bundle.js``, ``/api/...``, ``/dashboard``); behind
jupyter-server-proxy's ``proxy/absolute/<port>/`` the paths keep the server's prefix. This wraps its WSGI app: the
prefix is taken off each request's path and put in front of the absolute paths of the page and the bundle, so the
dashboard works at ``{prefix}dashboard`` (run by the user's own server, as the user, on its loopback).
"""

from __future__ import annotations

import argparse
import gzip
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

# (in the page or the bundle, what optuna-dashboard writes) -> what it becomes under the prefix ("{p}" ends with "/")
REWRITES = {
    "index.html": [('src="/static/', 'src="{p}static/')],
    "bundle.js": [('(null!=e?e:"")', '(null!=e?e:"{p0}")'), ('url_prefix:"/dashboard"', 'url_prefix:"{p}dashboard"'),
                  ("`/csv/", "`{p}csv/"), ("`/artifacts", "`{p}artifacts")],
}


def rewrite(kind: str, text: str, prefix: str) -> str:
    for old, new in REWRITES[kind]:
        text = text.replace(old, new.format(p=prefix, p0=prefix.rstrip("/")))
    return text


def prefixed(app, prefix: str):
    """``app`` (optuna-dashboard's WSGI app) answering under ``prefix``."""
    cache: dict[str, bytes] = {}

    def wrapped(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not path.startswith(prefix.rstrip("/")):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not under " + prefix.encode()]
        environ["PATH_INFO"] = "/" + path[len(prefix.rstrip("/")):].lstrip("/")
        kind = "index.html" if environ["PATH_INFO"].startswith("/dashboard") else (
            "bundle.js" if environ["PATH_INFO"] == "/static/bundle.js" else None)
        if kind is None:
            return app(environ, _relocating(start_response, prefix))
        environ["HTTP_ACCEPT_ENCODING"] = "identity"  # the bundle is rewritten: never its .gz
        seen = {}

        def capture(status, headers, exc_info=None):
            seen["status"], seen["headers"] = status, headers
            return lambda data: None

        body = b"".join(app(environ, capture))
        if seen["status"].startswith("200"):
            if kind not in cache or kind == "index.html":
                if dict((k.lower(), v) for k, v in seen["headers"]).get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                cache[kind] = rewrite(kind, body.decode(), prefix).encode()
            body = cache[kind]
            headers = [(k, v) for k, v in seen["headers"] if k.lower() not in ("content-length", "content-encoding", "etag", "last-modified")]
            headers.append(("Content-Length", str(len(body))))
        else:
            headers = seen["headers"]
        start_response(seen["status"], headers)
        return [body]

    return wrapped


def _relocating(start_response, prefix: str):
    """Redirects to absolute paths (``/`` -> ``/dashboard``) stay under the prefix."""
    from urllib.parse import urlsplit

    def moved(v: str) -> str:
        path = urlsplit(v)._replace(scheme="", netloc="").geturl()
        return prefix.rstrip("/") + path if path.startswith("/") and not path.startswith(prefix) else v

    def start(status, headers, exc_info=None):
        headers = [(k, moved(v) if k.lower() == "location" else v) for k, v in headers]
        return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)
    return start


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # the server's log is the user's server log: one line per request is noise
        pass


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storage")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefix", required=True)
    args = parser.parse_args(argv)
    import optuna
    from optuna_dashboard import wsgi

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    app = prefixed(wsgi(args.storage), args.prefix if args.prefix.endswith("/") else args.prefix + "/")
    with make_server("127.0.0.1", args.port, app, server_class=_Server, handler_class=_Quiet) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
