"""Validating a job spec: every mistake named with the field and what would be accepted."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from trainhub.exceptions import InvalidRequest
from trainhub.jobspec import ENV_KEY, parse_duration
from trainhub.workdir import SHA256

FIELDS = {"name", "command", "script", "gpus", "workers", "env", "time_limit", "retries", "profile",
          "priority", "preemptible", "submit_key", "sweep_id", "params", "workdir"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$")
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "TRAINHUB_JOB_ID", "TRAINHUB_OUTPUTS_DIR", "TRAINHUB_METRICS_FILE"}


# Linux refuses to exec a command whose single argument or NAME=VALUE string passes MAX_ARG_STRLEN
# (32 pages) or whose arguments and environment together pass ARG_MAX: such a job could never start.
MAX_ARG_STRLEN = 32 * 4096
MAX_EXEC_BYTES = 1 << 20  # of the spec's command and env together, leaving room for the platform's own variables


def _check_exec_limits(name: str, command: str | None, script: str | None, env: dict) -> None:
    """Refuse now what the kernel would refuse at start: NUL bytes and strings past the exec limits."""
    texts = [("name", name), ("command", command or ""), ("script", script or "")]
    texts += [(f"env {k}", f"{k}={v}") for k, v in env.items()]
    for what, text in texts:
        if "\x00" in text:
            raise InvalidRequest(f"{what} contains a NUL byte, which no program can receive")
    if command and len(command.encode()) >= MAX_ARG_STRLEN:
        raise InvalidRequest(f"command is longer than the {MAX_ARG_STRLEN // 1024} KiB a program argument may be: "
                             "put it in a script (script) or a file in storage")
    for k, v in env.items():
        if len(f"{k}={v}".encode()) >= MAX_ARG_STRLEN:
            raise InvalidRequest(f"env {k} is longer than the {MAX_ARG_STRLEN // 1024} KiB an environment "
                                 "variable may be: pass large values through storage")
    total = len((command or "").encode()) + sum(len(f"{k}={v}".encode()) + 1 for k, v in env.items())
    if total > MAX_EXEC_BYTES:
        raise InvalidRequest(f"command and env together are {total // 1024} KiB, past the "
                             f"{MAX_EXEC_BYTES // 1024} KiB a job can be started with")


MAX_COMMAND_CHARS = 32_000  # always under MAX_ARG_STRLEN, whatever the characters' UTF-8 length
MAX_ENV_VARS, MAX_ENV_VALUE_CHARS = 100, 2048  # together with a command, always under MAX_EXEC_BYTES
MAX_GPUS = 4096  # per worker; far above any node, so a too-large request hears about the pool instead
MAX_WORKERS = 64  # per job


def whole_number(spec: dict, name: str, default, minimum: int, maximum: int | None = None):
    """``spec[name]`` as an int within bounds (None or absent: ``default``); the sweeps spec shares it."""
    value = spec.get(name, default)
    if value is None:
        value = default
    if isinstance(value, float) and value.is_integer():  # JSON has one number type: 2.0 is the integer 2
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be a whole number, not {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise InvalidRequest(f"{name} must be {bound}, not {value}")
    return value


@dataclass
class JobSpec:
    name: str
    command: str | None
    script: str | None
    gpus: int | None  # None = the profile's
    workers: int
    env: dict = field(default_factory=dict)
    time_limit: float | None = None
    retries: int = 0
    profile: str | None = None
    priority: int | None = None
    preemptible: bool = False
    submit_key: str | None = None
    sweep_id: int | None = None
    params: dict = field(default_factory=dict)
    workdir: str | None = None  # the SHA-256 of an uploaded working directory (PUT /workdirs/{sha256})


def validate_spec(spec) -> JobSpec:
    if not isinstance(spec, dict):
        raise InvalidRequest("the request body must be a JSON object describing the job (see GET /openapi.json)")
    unknown = set(spec) - FIELDS
    if unknown:
        raise InvalidRequest(f"unknown field(s) {sorted(unknown)}; a job spec takes {sorted(FIELDS - {'sweep_id', 'params', 'submit_key'})}")
    if spec.get("sweep_id") is not None:
        # a trial's sweep is the sweeps service's to set: a job naming another user's sweep would join it
        raise InvalidRequest("sweep_id is set by the sweeps service for its trials and cannot be given; "
                             "start a sweep with POST /sweeps (or %%sweep)")
    command, script = spec.get("command"), spec.get("script")
    if bool(command) == bool(script):
        raise InvalidRequest("give exactly one of 'command' (a shell command) or 'script' (Python source)")
    for fname, value in (("command", command), ("script", script)):
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"{fname} must be a string")
    if command is not None and len(command) > MAX_COMMAND_CHARS:
        raise InvalidRequest(f"command is longer than {MAX_COMMAND_CHARS:,} characters: put it in a script (script) "
                             "or a file in storage")
    if script is not None and len(script) > 5_000_000:
        raise InvalidRequest("script is larger than 5 MB: put data in storage and pass its path instead")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest(f"name must be a string, not {name!r}")
    if not name:  # derive one from the command's program, keeping only name-safe characters
        first = (command.split() or ["job"])[0].rsplit("/", 1)[-1] if command else "script"
        name = re.sub(r"[^A-Za-z0-9._-]", "", first).lstrip("._-")[:128] or "job"
    if not NAME_RE.match(name):
        raise InvalidRequest(f"name {name!r} may use letters, digits, '.', '_', '-' and spaces (max 128)")
    env = spec.get("env") or {}
    if not isinstance(env, dict):
        raise InvalidRequest('env must be an object like {"KEY": "value"}')
    if len(env) > MAX_ENV_VARS:
        raise InvalidRequest(f"env has {len(env)} variables; at most {MAX_ENV_VARS} (pass the rest through storage)")
    clean_env = {}
    for k, v in env.items():
        if not ENV_KEY.match(str(k)):
            raise InvalidRequest(f"env name {k!r} is not a valid environment variable name")
        if k in RESERVED_ENV:
            raise InvalidRequest(f"env {k} is set by trainhub for each worker and cannot be overridden")
        if isinstance(v, (dict, list, bool)) or v is None:
            raise InvalidRequest(f"env {k} must be a string or number")
        if isinstance(v, str) and len(v) > MAX_ENV_VALUE_CHARS:
            raise InvalidRequest(f"env {k} is longer than {MAX_ENV_VALUE_CHARS} characters: pass large values through storage")
        clean_env[str(k)] = str(v)
    _check_exec_limits(name, command, script, clean_env)
    gpus = spec.get("gpus")
    # only a bound on the number: the pool check (JobsService.check) names the real limit, the pool's size
    gpus = None if gpus is None else whole_number(spec, "gpus", 0, 0, MAX_GPUS)
    profile = spec.get("profile")
    if profile is not None and (not isinstance(profile, str) or len(profile) > 64):
        raise InvalidRequest("profile must be a profile slug such as 'gpu-1'")
    priority = spec.get("priority")
    if priority is not None:
        priority = whole_number(spec, "priority", 0, -1000, 1000)
    preemptible = spec.get("preemptible", False)
    if not isinstance(preemptible, bool):
        raise InvalidRequest("preemptible must be true or false")
    params = spec.get("params") or {}
    if not isinstance(params, dict):
        raise InvalidRequest("params must be an object")
    # params reach each worker as $TRAINHUB_PARAMS: one environment variable, so its exec limit
    if len(json.dumps(params).encode()) + len("TRAINHUB_PARAMS=") >= MAX_ARG_STRLEN:
        raise InvalidRequest(f"params are longer than the {MAX_ARG_STRLEN // 1024} KiB an environment variable "
                             "may be ($TRAINHUB_PARAMS): pass large values through storage")
    workdir = spec.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not SHA256.match(workdir)):
        raise InvalidRequest("workdir must be the SHA-256 (64 lowercase hex digits) of a working directory uploaded "
                             "with PUT /workdirs/{sha256}")
    return JobSpec(
        workdir=workdir or None,
        name=name, command=command, script=script, gpus=gpus,
        workers=whole_number(spec, "workers", 1, 1, MAX_WORKERS), env=clean_env,
        time_limit=parse_duration(spec.get("time_limit")), retries=whole_number(spec, "retries", 0, 0, 20),
        profile=profile or None, priority=priority, preemptible=preemptible,
        submit_key=(str(spec["submit_key"])[:255] if spec.get("submit_key") else None),
        sweep_id=spec.get("sweep_id"), params=params,
    )
