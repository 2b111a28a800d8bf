"""jupyter-server extension: the user's storage area (browse, preview, upload, download, delete)
and a same-origin proxy to the trainhub service API for the side panel.

Enable in a spawned server with
``--ServerApp.jpserver_extensions={"trainhub.extensions.storage": true}`` (or the
``jupyter_server_config.d`` file written by :func:`trainhub.extensions.install_labextension`).

Routes (under the server's base URL; JSON errors ``{"status", "message"}``):

- ``GET  trainhub/storage/areas``                             the areas and whether they are writable
- ``GET  trainhub/storage/list?area=home&path=&limit=&after=`` one page of a folder
- ``GET  trainhub/storage/preview?area=&path=``                the start of a file (text) or its kind
- ``GET  trainhub/storage/files?area=&path=``                  download (streamed)
- ``PUT  trainhub/storage/files?area=home&path=``              upload (request body = file content)
- ``DELETE trainhub/storage/files?area=home&path=[&recursive=1]`` delete a file or folder
- ``POST trainhub/storage/folders?area=home&path=``            make a folder
- ``*    trainhub/api/<datasets|models|jobs|sweeps>...``       forwarded to ``$TRAINHUB_API_URL``
- ``GET  trainhub/culler/warnings``, ``POST trainhub/culler/keep`` forwarded to ``$TRAINHUB_CULLER_URL``
- ``GET  trainhub/gpu/status``                               this server's GPUs and idle clock (the culler's api/gpus)
- ``POST trainhub/culler/release``                           "give my GPU back" (the culler's api/release)
- ``GET|POST|DELETE trainhub/culler/regain``                 "get a GPU again" (the culler's api/regain)
- ``POST trainhub/snapshot``                                 every kernel saves its variables before a release
  (:mod:`.snapshot`; the culler calls it)
- ``POST|GET trainhub/move``                                 a move of this server is starting: the open pages are told
  (:mod:`.move`; the culler calls it first)
"""

from __future__ import annotations

import os
import shutil

from trainhub.boundary.userenv import VAR as USER_ENV_VAR

from .handlers import StorageBrowser, default_handlers
from .move import register as register_move_event
from .snapshot import configure_kernels


def _jupyter_server_extension_points():
    return [{"module": "trainhub.extensions.storage"}]


def _link_jupyter_server_extension(serverapp):
    """Before any extension loads: in a platform server (the user's own environment is set, see
    trainhub.boundary.userenv), terminals run an interactive shell that keeps the server's ``PATH``, so ``python``,
    ``pip`` and ``trainhub`` are found. jupyter-server's default is a login shell (the server has no terminal), and a
    login shell's /etc/profile sets ``PATH`` afresh: "command not found". An admin's own
    ``ServerApp.terminado_settings`` shell is kept."""
    if not os.environ.get(USER_ENV_VAR):
        return
    settings = dict(serverapp.terminado_settings or {})
    if settings.get("shell_command"):
        return
    shell = os.environ.get("SHELL") or shutil.which("bash") or shutil.which("sh") or "sh"
    settings["shell_command"] = [shell]
    serverapp.terminado_settings = settings


def _load_jupyter_server_extension(serverapp):
    browser = StorageBrowser(parent=serverapp)
    web_app = serverapp.web_app
    base_url = web_app.settings["base_url"]
    web_app.settings["trainhub_storage"] = browser
    snapshot_dir = configure_kernels(serverapp.root_dir)
    register_move_event(serverapp)
    web_app.add_handlers(".*$", default_handlers(base_url, browser))
    serverapp.log.info("trainhub storage browser: home=%s datasets=%s; kernel snapshots in %s", browser.home_url or "(none)",
                       browser.datasets_url or "(none)", snapshot_dir)


# the older name some jupyter-server versions look for
load_jupyter_server_extension = _load_jupyter_server_extension
