"""jupyter-server extension: optuna-dashboard on the user's own sweeps, served through their own server.

The dashboard runs in the user's server (as the user, on its loopback, in their network namespace) on the copy of
their own studies the platform keeps in their home (``trainhub.optuna_storage()``, docs/sweeps.md), and is reached
through jupyter-server-proxy at ``{base_url}proxy/absolute/<port>/dashboard``: the server's own authentication
(its owner only; the hub refuses anyone else on this server's URL). One process per server, started on first use,
stopped with the server.

Routes (under the server's base URL):

- ``GET trainhub/optuna``        ``{"available": true, "storage"}`` or ``{"available": false, "reason"}``
- ``GET trainhub/optuna/open``   starts the dashboard if needed, then a redirect to it (the sweep panel's link);
  ``?sweep=s-000003`` opens that sweep's study when the copy has it
"""

from __future__ import annotations

from .handlers import default_handlers
from .manager import Dashboard


def _jupyter_server_extension_points():
    return [{"module": "trainhub.extensions.optunadash"}]


def _load_jupyter_server_extension(serverapp):
    dash = Dashboard(parent=serverapp, base_url=serverapp.web_app.settings["base_url"])
    serverapp.web_app.settings["trainhub_optuna_dashboard"] = dash
    serverapp.web_app.add_handlers(".*$", default_handlers(serverapp.web_app.settings["base_url"]))
    serverapp.log.info("trainhub optuna-dashboard hand-off: %s", dash.unavailable() or "available")


load_jupyter_server_extension = _load_jupyter_server_extension
