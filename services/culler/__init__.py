"""The idle-GPU culler: returns GPUs of idle notebook servers to the pool, never kills running work.

- :mod:`.policy` — pure, time-seamed decision logic (also replayed by benchmarks/culler_bench.py)
- :mod:`.service` — the JupyterHub-managed service process (``python -m trainhub.services.culler``)
- :mod:`.handlers` — its small HTTP API (metrics, decisions, keep, release, regain, warnings, gpus)
- :mod:`.models` — the ``culler_events`` audit-trail table

See docs/culler.md.
"""

#: The hub scopes the culler service's role needs (least privilege; see docs/culler.md).
#: Imported by the hub config, so this module must stay import-light.
HUB_SCOPES = (
    "list:users",  # GET /hub/api/users?state=active
    "read:servers",  # the server models in that list (url, ready, pending, started)
    "read:users:groups",  # "get a GPU again": the profiles and group shares the user's groups allow
    "delete:servers",  # stop: DELETE /hub/api/users/<name>/server(s/<server>)
    "start:servers",  # release: POST /hub/api/users/<name>/server(s/<server>) {"profile": <cpu>}
    "access:servers",  # GET /user/<name>/<server>/api/kernels through the proxy
    "access:services!service=trainhub",  # reach the jobs service at all (its HubOAuth hub_scopes)
    "custom:trainhub:jobs:read",  # GET {TRAINHUB_API_URL}/jobs?state=running&user=<name>
)

#: Scope a user needs (filtered to themselves: ``!user``) to press "keep my GPU".
KEEP_SCOPE = "custom:trainhub:culler:keep"
#: Scope to read the decision log: unfiltered = everyone's, ``!user=<name>`` = one's own.
DECISIONS_SCOPE = "custom:trainhub:usage:read"
