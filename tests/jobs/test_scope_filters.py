"""Filtered scopes are honoured: a token narrowed to ``!user=NAME`` reads NAME's items only, whoever owns it.

The same class of checks serves the jobs, sweeps, registry, usage and culler APIs (services.api.Caller).
"""

import pytest

from trainhub.services.api import Caller

READ = "custom:trainhub:jobs:read"


def caller(scopes, admin=False, name="admin"):
    return Caller({"name": name, "kind": "user", "admin": admin, "scopes": scopes})


def test_an_admins_full_token_reads_everyones_items():
    # what an admin made after start-up holds: the !user form of the custom scopes, and the admin role's
    full = caller([f"{READ}!user=admin", "admin:users", "admin:servers", "admin-ui"], admin=True)
    assert full.may_all(READ) and full.may(READ, "bob") and full.may(READ, "admin")
    # an admin's browser login to the service: the OAuth scopes the services ask for, admin-ui among them
    full = caller([f"{READ}!user=admin", "admin-ui", "access:services!service=trainhub"], admin=True)
    assert full.may_all(READ) and full.may(READ, "bob") and full.may(READ, "admin")


def test_a_narrowed_admin_token_is_held_to_its_filter():
    narrowed = caller([f"{READ}!user=admin"], admin=True)
    assert not narrowed.may_all(READ)
    assert not narrowed.may(READ, "bob")
    assert narrowed.may(READ, "admin")
    other = caller([f"{READ}!user=bob"], admin=True)  # narrowed to someone else's items
    assert other.may(READ, "bob") and not other.may(READ, "carol") and not other.may_all(READ)


def test_users_read_only_what_their_scopes_name():
    ann = caller([f"{READ}!user=ann"], name="ann")
    assert ann.may(READ, "ann") and not ann.may(READ, "bob") and not ann.may_all(READ)
    reader = caller([READ], name="auditor")
    assert reader.may_all(READ) and reader.may(READ, "bob")


def test_through_a_real_hub_a_narrowed_admin_token_sees_only_its_own_jobs(platform):
    import requests

    api = platform.url + "/services/trainhub/api"
    bob = {"Authorization": f"token {platform.token('scope-bob')}"}
    job = requests.post(api + "/jobs", json={"command": "true", "gpus": 0}, headers=bob, timeout=30).json()
    admin = platform.admin_token
    full = {"Authorization": f"token {admin}"}
    assert requests.get(f"{api}/jobs/{job['id']}", headers=full, timeout=30).status_code == 200  # the admin's own token
    r = platform.api("POST", f"/users/{platform.admin_user}/tokens", admin,
                     json={"scopes": [f"{READ}!user={platform.admin_user}", "access:services"], "note": "narrowed"})
    if r.status_code == 403:
        pytest.skip(f"the hub refused the narrowed token: {r.text}")
    assert r.status_code in (200, 201), r.text
    narrowed = {"Authorization": f"token {r.json()['token']}"}
    assert requests.get(f"{api}/jobs/{job['id']}", headers=narrowed, timeout=30).status_code in (403, 404)
    listed = requests.get(f"{api}/jobs", params={"user": "scope-bob"}, headers=narrowed, timeout=30)
    assert listed.status_code == 403 or all(j["user"] == platform.admin_user for j in listed.json()["items"]), listed.text
    everyone = requests.get(f"{api}/jobs", params={"all": "1"}, headers=narrowed, timeout=30)
    assert everyone.status_code == 403 or all(j["user"] == platform.admin_user for j in everyone.json()["items"])
