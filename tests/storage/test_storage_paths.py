"""Storage configuration and the path checks that keep users inside their area."""

from __future__ import annotations

import json
import os

import pytest

from trainhub.exceptions import Forbidden, InvalidRequest
from trainhub.storage import StorageConfig, resolve_in_area, safe_username


@pytest.mark.parametrize("name", ["alice", "a.b", "a_b-c", "x@y.org"])
def test_safe_usernames(name):
    assert safe_username(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a b", "../x", "a\x00"])
def test_unsafe_usernames(name):
    with pytest.raises(InvalidRequest):
        safe_username(name)


@pytest.mark.parametrize(
    "rel, expect",
    [("", "/area"), (".", "/area"), ("a/b.txt", "/area/a/b.txt"), ("a//b/./c", "/area/a/b/c"), ("a\\b", "/area/a/b")],
)
def test_resolve_in_area_joins(rel, expect):
    assert resolve_in_area("/area", rel) == expect


@pytest.mark.parametrize(
    "rel, exc",
    [("/etc/passwd", Forbidden), ("../bob", Forbidden), ("a/../../b", Forbidden), ("s3://other/x", Forbidden),
     ("a\x00b", InvalidRequest)],
)
def test_resolve_in_area_refuses_escapes(rel, exc):
    with pytest.raises(exc):
        resolve_in_area("/area", rel)


def test_resolve_in_area_refuses_symlinks_out(tmp_path):
    area = tmp_path / "area"
    (area / "ok").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (area / "out").symlink_to(tmp_path / "secret")
    (area / "in").symlink_to(area / "ok")
    assert resolve_in_area(str(area), "in/x").endswith("in/x")
    with pytest.raises(Forbidden, match="symbolic link"):
        resolve_in_area(str(area), "out/x")


def test_s3_reads_aws_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SK")
    s = StorageConfig(url="s3://bucket/prefix/")
    assert s.protocol == "s3" and not s.is_local
    assert s.storage_options() == {"endpoint_url": "http://127.0.0.1:9", "key": "AK", "secret": "SK"}
    env = s.env_for("alice")
    assert env["TRAINHUB_STORAGE_URL"] == "s3://bucket/prefix/users/alice"
    assert env["TRAINHUB_DATASETS_URL"] == "s3://bucket/prefix/datasets"
    assert json.loads(env["TRAINHUB_STORAGE_OPTIONS"]) == {"endpoint_url": "http://127.0.0.1:9"}
    assert env["AWS_ENDPOINT_URL"] == env["FSSPEC_S3_ENDPOINT_URL"] == "http://127.0.0.1:9"


def test_users_never_get_the_platform_key_by_default(monkeypatch):
    """One S3 key for everyone is gone: a user's environment holds no key of the platform's (not in the
    variables, not in the options, not even one put into extra_options) unless the old behaviour is named."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SK")
    s = StorageConfig(url="s3://bucket/prefix", extra_options={"key": "AK2", "secret": "SK2", "use_ssl": False,
                                                               "client_kwargs": {"aws_secret_access_key": "SK3", "verify": False}})
    env = s.env_for("alice")
    blob = json.dumps(env)
    assert not any(secret in blob for secret in ("AK", "SK", "AK2", "SK2", "SK3"))
    assert json.loads(env["TRAINHUB_STORAGE_OPTIONS"]) == {"use_ssl": False, "client_kwargs": {"verify": False}}
    delivered = s.env_for("alice", credentials_env={"AWS_CONFIG_FILE": "/run/trainhub/credentials/config",
                                                    "AWS_ACCESS_KEY_ID": "never"})
    assert delivered["AWS_CONFIG_FILE"] == "/run/trainhub/credentials/config" and "AWS_ACCESS_KEY_ID" not in delivered
    old = StorageConfig(url="s3://bucket/prefix", share_platform_credentials=True).env_for("alice")
    assert old["AWS_ACCESS_KEY_ID"] == "AK" and old["AWS_SECRET_ACCESS_KEY"] == "SK"
    assert json.loads(old["TRAINHUB_STORAGE_OPTIONS"])["key"] == "AK"
    assert s.storage_options()["key"] == "AK"  # the platform's own processes keep theirs


def test_user_credentials_hook_replaces_platform_keys(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "platform")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "platform-secret")
    s = StorageConfig(url="s3://b", user_credentials_hook=lambda u: {"key": f"k-{u}", "secret": "s", "token": "t"})
    env = s.env_for("bob")
    assert env["AWS_ACCESS_KEY_ID"] == "k-bob" and env["AWS_SESSION_TOKEN"] == "t"
    assert s.storage_options()["key"] == "platform"  # the platform itself keeps its own


def test_local_layout(tmp_path):
    s = StorageConfig(url=str(tmp_path / "st"))
    assert s.is_local and s.storage_options() == {}
    s.ensure_layout(["alice"])
    assert (tmp_path / "st" / "datasets").is_dir() and (tmp_path / "st" / "users" / "alice").is_dir()
    assert s.env_for("alice")["TRAINHUB_STORAGE_URL"] == os.path.join(str(tmp_path / "st"), "users", "alice")
    assert "AWS_ACCESS_KEY_ID" not in s.env_for("alice")
