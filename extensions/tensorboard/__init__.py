"""jupyter-server extension: TensorBoard for the user's jobs, served through their own server.

The side panel, the ``%%train`` widget and the CLI ask for a TensorBoard showing some jobs side
by side; this extension gathers those jobs' event files (:mod:`trainhub.tensorboard`), runs one
TensorBoard process per set of jobs on loopback and hands back its address under
``{base_url}proxy/absolute/<port>/`` (jupyter-server-proxy, authenticated as the server itself).
Which jobs the caller may open is the jobs API's decision: each job is read with the server's own
token, which holds only its owner's scopes.

Routes (under the server's base URL; JSON errors ``{"status", "message"}``):

- ``GET  trainhub/tensorboard``                 ``{"available": true}`` or ``{"available": false, "reason"}``
- ``POST trainhub/tensorboard`` ``{"jobs": [..]}`` ``{"url", "jobs", "empty"}``: TensorBoard for exactly these jobs
- ``GET  trainhub/tensorboard/open?jobs=a,b``   the same, then a redirect to it (links in notebook output)
"""

from __future__ import annotations

from .handlers import default_handlers
from .manager import TensorBoards


def _jupyter_server_extension_points():
    return [{"module": "trainhub.extensions.tensorboard"}]


def _load_jupyter_server_extension(serverapp):
    boards = TensorBoards(parent=serverapp, base_url=serverapp.web_app.settings["base_url"])
    serverapp.web_app.settings["trainhub_tensorboards"] = boards
    serverapp.web_app.add_handlers(".*$", default_handlers(serverapp.web_app.settings["base_url"]))
    serverapp.log.info("trainhub TensorBoard hand-off: %s", boards.unavailable() or "available")


load_jupyter_server_extension = _load_jupyter_server_extension
