"""Custom scopes and roles shared by the local hub config and the Helm chart.

Users get the trainhub scopes filtered to themselves (``!user``); admins get them
unfiltered. Services declare the least they need.
"""

from __future__ import annotations

CUSTOM_SCOPES = {
    "custom:trainhub:jobs:read": {"description": "See trainhub jobs and sweeps, their logs, metrics and outputs."},
    "custom:trainhub:jobs:write": {
        "description": "Submit, cancel and change trainhub jobs and sweeps.",
        "subscopes": ["custom:trainhub:jobs:read"],
    },
    "custom:trainhub:registry:read": {"description": "See the dataset and model registries."},
    "custom:trainhub:registry:write": {
        "description": "Register datasets and models, promote model stages.",
        "subscopes": ["custom:trainhub:registry:read"],
    },
    "custom:trainhub:usage:read": {"description": "See GPU usage accounting."},
    "custom:trainhub:culler:keep": {"description": "Reset the idle-GPU clock of one's own server (\"keep my GPU\")."},
}

USER_SCOPES = [
    "self",
    "access:services!service=trainhub",
    "access:services!service=trainhub-culler",
    "custom:trainhub:jobs:write!user",
    "custom:trainhub:registry:write!user",
    "custom:trainhub:registry:read",
    "custom:trainhub:usage:read!user",
    "custom:trainhub:culler:keep!user",
]

# $JUPYTERHUB_API_TOKEN of a notebook server: what JupyterHub's `server` role gives, plus what
# %%train, the side panel and the culler notification need, always for the server's owner only.
SERVER_TOKEN_SCOPES = [
    "users:activity!user",
    "access:servers!server",
    "read:users:name!user",
    "access:services!service=trainhub",
    "access:services!service=trainhub-culler",
    "custom:trainhub:jobs:write!user",
    "custom:trainhub:jobs:read!user",
    "custom:trainhub:registry:write!user",
    "custom:trainhub:registry:read",
    "custom:trainhub:usage:read!user",
    "custom:trainhub:culler:keep!user",
    # only an admin's server gets it (server token scopes are intersected with the owner's): tells the
    # services an admin's server or browser login from a token narrowed to !user=<self>
    # (services.api.Caller.may_all); it grants nothing else
    "admin-ui",
]

ADMIN_EXTRA_SCOPES = [
    "access:services",
    "custom:trainhub:jobs:write",
    "custom:trainhub:registry:write",
    "custom:trainhub:usage:read",
    "custom:trainhub:culler:keep",
]


# The jobs service: resolve who a token belongs to and their groups.
JOBS_SERVICE_SCOPES = ["read:users", "list:users", "read:groups", "list:groups"]

# Role names of the services' own roles (the Helm chart's hub config defines them with the services).
SERVICE_ROLE_NAMES = {"trainhub": "trainhub-jobs-service", "trainhub-culler": "trainhub-culler-service"}
_SERVICE_ROLE_DESCRIPTIONS = {
    "trainhub": "The jobs service resolves who a token belongs to and their groups.",
    "trainhub-culler": "The culler reads activity and stops or restarts idle GPU servers.",
}


def service_role(name: str) -> dict | None:
    """The least-privilege role of trainhub's hub service ``name``, or None for a service that needs no hub scopes.

    Defined only together with the service: JupyterHub refuses to start when a role names a service it does not
    have ("Found undefined service ... in role ..."), so a service that is off must not have its role loaded.
    """
    if name == "trainhub":
        role_scopes = list(JOBS_SERVICE_SCOPES)
    elif name == "trainhub-culler":
        from trainhub.services.culler import HUB_SCOPES

        role_scopes = list(HUB_SCOPES)
    else:
        return None
    return {"name": SERVICE_ROLE_NAMES[name], "description": _SERVICE_ROLE_DESCRIPTIONS[name], "services": [name],
            "scopes": role_scopes}


def roles(admin_users=()) -> list[dict]:
    return [
        {"name": "user", "description": "Every trainhub user.", "scopes": USER_SCOPES},
        {
            "name": "trainhub-admin",
            "description": "Sees and manages every user's trainhub jobs, registries and usage.",
            "scopes": ADMIN_EXTRA_SCOPES,
            "users": sorted(admin_users),
            "groups": ["trainhub-admins"],
        },
    ]

# What the platform's services may ask for in a browser OAuth login (intersected with the user's own).
OAUTH_SCOPES = [
    "custom:trainhub:jobs:write",
    "custom:trainhub:jobs:read",
    "custom:trainhub:registry:write",
    "custom:trainhub:registry:read",
    "custom:trainhub:usage:read",
    "custom:trainhub:culler:keep",
    "admin-ui",  # admins only, intersected with the user's own (see SERVER_TOKEN_SCOPES)
]
