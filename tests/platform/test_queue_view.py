"""The pending page's text while a server waits in line (trainhub.serverqueue.QueueView), as tables: the place in
line, the reason and the way out, each free profile a button that starts the server on it (issue 34)."""

from __future__ import annotations

import html
import re

from trainhub.serverqueue import WAITING, QueuedServer, QueueView


def row(**kw) -> QueuedServer:
    base = dict(holder="server:ann", user="ann", groups=(), gpus=1, profile="gpu-1", gpu_model=None, created=0.0, seen=0.0,
                state=WAITING, reason="not enough free GPUs: asked for 1, 0 of 4 free", position=2, waiting=3, eta=None,
                devices=())
    base.update(kw)
    return QueuedServer(**base)


def test_the_free_profiles_are_buttons_with_their_slug():
    view = QueueView("1 GPU", 1)
    view.update(row(), [("cpu", "CPU only"), ("small", "Small <GPU>")])
    plain, rich = view.text()
    assert plain.startswith("1 GPU: in line for 1 GPU, number 2 of 3 waiting for GPUs. Not enough free GPUs: asked for 1, "
                            "0 of 4 free. Free now: CPU only, Small <GPU> (stop waiting")
    buttons = re.findall(r'<button type="button" class="btn btn-sm btn-primary trainhub-start-free" data-profile="([^"]+)" '
                         r'onclick="([^"]+)">([^<]+)</button>', rich)
    assert [(slug, label) for slug, _, label in buttons] == [("cpu", "Start CPU only now"), ("small", "Start Small &lt;GPU&gt; now")]
    script = html.unescape(buttons[0][1])
    # stops this pending spawn through the hub's API, then starts again through the hub's spawn URL with the profile
    assert "method: 'DELETE'" in script and "'api/users/' + user" in script and "_xsrf=" in script
    assert "'spawn/' + user" in script and "'?profile=' + encodeURIComponent(b.getAttribute('data-profile'))" in script


def test_without_free_profiles_or_a_row_there_is_no_button():
    view = QueueView("2 GPUs", 2)
    assert view.text() == ("2 GPUs: in line for 2 GPUs...", "2 GPUs: in line for 2 GPUs...")
    view.update(row(gpus=2, position=None), [])
    plain, rich = view.text()
    assert "Free now" not in plain and "<button" not in rich
