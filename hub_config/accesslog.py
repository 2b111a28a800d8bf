"""The hub's access log, with the platform's own polling at debug level.

JupyterHub logs every successful request at INFO, so the platform's services polling the hub filled the log: the
jobs service reads ``GET /hub/api/groups`` every 30 s, the culler lists the users on every pass, the services check
users' tokens. Successful GET/HEAD requests made by the platform's own services (``platform_services``, the names
in ``hub_config.embedded``) are logged at DEBUG instead; everything else is JupyterHub's own log line
(``jupyterhub.log.log_request``): users' requests, the services' actions (a culler stopping or starting a
server: POST, DELETE), any request slower than 1 s, and every error. The hub's request metrics count every request
alike.
"""

from __future__ import annotations

import logging

from jupyterhub import orm
from jupyterhub.log import _scrub_uri, log_request as hub_log_request
from jupyterhub.metrics import prometheus_log_method
from tornado.log import access_log
from tornado.web import HTTPError

#: requests slower than this (seconds) keep JupyterHub's INFO line, as in JupyterHub's own rule
SLOW = 1.0


def _caller(handler):
    try:
        return handler.current_user
    except (HTTPError, RuntimeError):
        return None


def is_platform_poll(handler, platform_services) -> bool:
    """A successful read by one of the platform's own services, answered in under ``SLOW`` seconds."""
    if handler.request.method not in ("GET", "HEAD") or not 200 <= handler.get_status() < 300:
        return False
    if handler.request.request_time() >= SLOW:
        return False
    caller = _caller(handler)
    return isinstance(caller, orm.Service) and caller.name in platform_services


def make_log_function(platform_services):
    """JupyterHub's ``tornado_settings["log_function"]`` (see the module docstring)."""
    names = frozenset(platform_services)

    def log_request(handler) -> None:
        if not is_platform_poll(handler, names):
            hub_log_request(handler)
            return
        prometheus_log_method(handler)
        if access_log.isEnabledFor(logging.DEBUG):
            access_log.debug("%d %s %s (%s@%s) %.2fms", handler.get_status(), handler.request.method,
                             _scrub_uri(handler.request.uri), _caller(handler).name, handler.request.remote_ip,
                             1000.0 * handler.request.request_time())

    return log_request
