"""Per-user, short-lived S3 credentials: what a user's kernels and jobs hold instead of the platform's key.

The pattern this replaces is "one S3 key for everyone": every server and job got the platform's own key, so
plain ``fsspec`` in any kernel could write ``datasets/`` and read or delete another user's area. Now:

- **Minting** (:class:`CredentialMinter`): the platform, with its own key, asks STS for credentials of one user,
  valid ``duration`` seconds and limited by ``policy_template`` to ``<root>/users/<name>/`` (read, write, list)
  and ``<root>/datasets/`` (read, list). Either one role for everyone (``role_arn``) narrowed per user by a
  *session policy* (the ``Policy`` parameter of ``AssumeRole``), or one IAM role per user (``per_user_roles``)
  whose *own* policy is that document, created and kept up to date by the platform. An admin's
  ``StorageConfig.user_credentials_hook``, when set, is used instead of STS.
- **Delivery** (:class:`CredentialBroker`, :class:`UserCredentialFiles`): the credentials go into
  ``<directory>/<user>/credentials.json`` (the JSON a ``credential_process`` prints: ``Version``, keys, token,
  ``Expiration``), next to an AWS config file whose ``credential_process`` prints that file. The user's
  process gets ``AWS_CONFIG_FILE`` (and the endpoint and region: nothing secret), so plain ``fsspec``/``s3fs``/
  ``boto3`` find the credentials with no options, and botocore/aiobotocore run the process again when the
  credentials they hold come within 15 minutes of their ``Expiration`` -- by then the platform has written new
  ones (``refresh_margin`` is longer than that). The folder is the platform's (root), group the user's account,
  0750; the files 0640: readable by that account and the platform only. Files are replaced by a rename inside
  the folder, so a sandbox that binds the *folder* (read-only, at :data:`MOUNT_POINT`) sees each new file.
- **Refresh**: :meth:`CredentialBroker.ensure` before a user's server or job starts (mints when missing or
  within ``refresh_margin`` of expiry, or when the policy changed), :meth:`CredentialBroker.refresh_all`
  periodically (:meth:`CredentialBroker.start_refresher`) for every user ensured and not released.

The platform's own storage work (registry, output sync, culler) keeps the platform's key
(``StorageConfig.storage_options()``); it never leaves the platform's processes. docs/storage.md, "Per-user
credentials", says what is minted, the policy, and what the S3 stand-in of the tests (moto) does and does not
enforce.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import string
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from traitlets import Bool, Float, Integer, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from trainhub.backoff import Backoff, WaitTimeout
from trainhub.boundary.accounts import Account
from trainhub.exceptions import TrainhubError
from trainhub.fmt import as_utc
from trainhub.storage import StorageConfig, safe_username

#: where a sandbox (or a pod) binds a user's credentials folder, read-only
MOUNT_POINT = "/run/trainhub/credentials"
CREDENTIALS_FILE = "credentials.json"
#: the AWS config for a process that sees the folder at MOUNT_POINT (a sandbox, a pod)
CONFIG_FILE = "config"
#: the AWS config for a process that sees the folder at its host path (no sandbox)
DIRECT_CONFIG_FILE = "config.direct"

#: botocore and aiobotocore run credential_process again when this little remains (their advisory refresh)
CLIENT_REFRESH_WINDOW = 15 * 60

DEFAULT_POLICY = """{
  "Version": "2012-10-17",
  "Statement": [
    {"Sid": "OwnAreaReadWrite", "Effect": "Allow",
     "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts"],
     "Resource": ["arn:${partition}:s3:::${bucket}/${user_prefix}/*"]},
    {"Sid": "DatasetsRead", "Effect": "Allow", "Action": ["s3:GetObject"],
     "Resource": ["arn:${partition}:s3:::${bucket}/${datasets_prefix}/*"]},
    {"Sid": "AreaRootsHead", "Effect": "Allow", "Action": ["s3:GetObject"],
     "Resource": ["arn:${partition}:s3:::${bucket}/${user_prefix}", "arn:${partition}:s3:::${bucket}/${datasets_prefix}"]},
    {"Sid": "ListOwnAreaAndDatasets", "Effect": "Allow", "Action": ["s3:ListBucket"],
     "Resource": ["arn:${partition}:s3:::${bucket}"],
     "Condition": {"StringLike": {"s3:prefix": ["${user_prefix}", "${user_prefix}/*",
                                                "${datasets_prefix}", "${datasets_prefix}/*"]}}},
    {"Sid": "BucketRegion", "Effect": "Allow", "Action": ["s3:GetBucketLocation"],
     "Resource": ["arn:${partition}:s3:::${bucket}"]}
  ]
}"""


class CredentialsError(TrainhubError):
    """A user's storage credentials could not be minted or written (the platform's configuration or the store)."""

    status_code = 503
    reason = "storage-credentials"


def _utc(value) -> datetime:
    if isinstance(value, datetime):
        return as_utc(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(timezone.utc)


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _aws_name(template: str, username: str, limit: int) -> str:
    """An IAM role or STS session name from ``template`` ([\\w+=,.@-], at most ``limit`` characters)."""
    name = template.format(username=username)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(username.encode()).hexdigest()[:10]
    return f"{name[:limit - 11]}-{digest}"


@dataclass(frozen=True)
class MintedCredentials:
    """One user's credentials: ``source`` is "sts" or "hook"; ``policy`` the digest of what limits them."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None
    expiration: datetime
    source: str = "sts"
    policy: str = ""

    def process_output(self) -> dict:
        """What a ``credential_process`` prints (and what the credentials file holds)."""
        out = {"Version": 1, "AccessKeyId": self.access_key_id, "SecretAccessKey": self.secret_access_key,
               "Expiration": _iso(self.expiration), "TrainhubSource": self.source, "TrainhubPolicy": self.policy}
        if self.session_token:
            out["SessionToken"] = self.session_token
        return out


class CredentialMinter(LoggingConfigurable):
    """Mints one user's S3 credentials with the platform's key: STS ``AssumeRole`` limited to the user's prefix."""

    role_arn = Unicode(
        "",
        help="""The role the platform assumes for every user, each time narrowed by a session policy (the inline
        Policy parameter of AssumeRole: policy_template rendered for that user). The role's own policy must allow
        at least what the template allows (e.g. s3:* on the bucket); its trust policy must let the platform's
        identity assume it. Empty: per_user_roles, or nothing (then users get no storage credentials unless
        StorageConfig.user_credentials_hook is set). Example: arn:aws:iam::123456789012:role/trainhub-users""",
    ).tag(config=True)

    per_user_roles = Bool(
        False,
        help="""Instead of one role and session policies: one IAM role per user (role_name_template, under
        role_path), created by the platform on the user's first start, whose own inline policy is policy_template
        rendered for that user (rewritten when the template changes), trusted only by the platform's identity, and
        assumed with the platform's key. Needs iam:GetRole, iam:CreateRole, iam:UpdateRole and iam:PutRolePolicy on
        arn:aws:iam::<account>:role<role_path>* and sts:AssumeRole on the same. Use it where session policies are
        not enforced (the moto stand-in of the tests; some S3-compatible stores).""",
    ).tag(config=True)

    role_name_template = Unicode(
        "trainhub-{username}",
        help="IAM role name of a user with per_user_roles ({username}; names over 64 characters get a digest).",
    ).tag(config=True)
    role_path = Unicode("/trainhub/", help="IAM path of the per-user roles (the platform's IAM rights can be limited to it).").tag(config=True)
    session_name_template = Unicode(
        "trainhub-{username}",
        help="RoleSessionName of the AssumeRole calls ({username}); it appears in CloudTrail as who acted.",
    ).tag(config=True)
    trust_principal_arn = Unicode(
        "",
        help="""Principal trusted by the per-user roles. Empty: the platform's identity as STS GetCallerIdentity
        reports it (an assumed role's session becomes its role ARN; set this for a role with a path).""",
    ).tag(config=True)

    duration = Integer(
        4 * 3600,
        help="""Seconds minted credentials are valid (STS allows 900 to 43200, and at most the role's
        MaxSessionDuration: per-user roles are made with enough; for role_arn raise the role's own, else the platform
        falls back to 3600 with a warning).""",
    ).tag(config=True)

    refresh_margin = Integer(
        30 * 60,
        help="""A user's credentials are minted again when less than this many seconds of them remain. Keep it above
        15 minutes plus CredentialBroker.refresh_interval: botocore and aiobotocore re-read the file when 15 minutes
        remain, and should then find fresh credentials (else they run credential_process on every request until they
        do).""",
    ).tag(config=True)

    policy_template = Unicode(
        DEFAULT_POLICY,
        help="""The IAM policy (JSON) that limits a user's credentials. ${bucket}, ${user_prefix} (key prefix of the
        user's area, no trailing slash, e.g. team/users/alice), ${datasets_prefix} (e.g. team/datasets), ${root_prefix}
        (e.g. team; empty at the bucket's root), ${username} and ${partition} are filled in; $$ is a literal $. Default:
        read, write and delete in the user's area, read in datasets/, listing of those two prefixes only.""",
    ).tag(config=True)

    partition = Unicode("aws", help='ARN partition of the policy ("aws", "aws-cn", "aws-us-gov").').tag(config=True)
    region = Unicode(help="Region of the STS/IAM clients and of the users' AWS config. Default: $AWS_REGION, $AWS_DEFAULT_REGION, us-east-1.").tag(config=True)
    sts_endpoint_url = Unicode("", help="STS endpoint. Empty: StorageConfig.endpoint_url (S3-compatible stores answer STS on the same endpoint), else AWS's.").tag(config=True)
    iam_endpoint_url = Unicode("", help="IAM endpoint for per_user_roles. Empty: StorageConfig.endpoint_url, else AWS's.").tag(config=True)
    role_ready_timeout = Float(30.0, help="Seconds AssumeRole on a role just created is retried while IAM propagates it (AccessDenied).").tag(config=True)

    @default("region")
    def _region_default(self):
        return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    @validate("duration")
    def _check_duration(self, proposal):
        if proposal["value"] < 60:
            raise ValueError("CredentialMinter.duration must be at least 60 seconds (STS itself needs 900)")
        return proposal["value"]

    @validate("policy_template")
    def _check_template(self, proposal):
        try:
            sample = string.Template(proposal["value"]).substitute(
                bucket="b", user_prefix="r/users/u", datasets_prefix="r/datasets", root_prefix="r", username="u",
                partition="aws")
        except (KeyError, ValueError) as e:
            raise ValueError(f"CredentialMinter.policy_template has an unknown or malformed placeholder ({e!r}); write "
                             "$$ for a literal $ (IAM policy variables: $${aws:userid})") from None
        try:
            json.loads(sample)
        except ValueError as e:
            raise ValueError(f"CredentialMinter.policy_template is not JSON once filled in: {e}") from None
        return proposal["value"]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._clients: dict = {}
        self._roles: dict[str, tuple[str, str]] = {}  # username -> (role ARN, policy digest) made or checked here
        self._principal: str | None = None
        self._lock = threading.Lock()
        self._duration_fallback = False

    @property
    def configured(self) -> bool:
        """Whether STS minting is set up (a role ARN or per-user roles)."""
        return bool(self.role_arn or self.per_user_roles)

    # -- the policy ------------------------------------------------------------------------------
    def render_policy(self, storage: StorageConfig, username: str) -> str:
        """``policy_template`` for ``username`` on ``storage``, as compact JSON (session policies count packed size)."""
        if storage.protocol != "s3":
            raise CredentialsError("per-user credentials need S3 storage (StorageConfig.url = s3://bucket/prefix)")
        bucket, _, root_prefix = fsspec_strip(storage.root()).partition("/")
        root_prefix = root_prefix.strip("/")
        join = (lambda rel: f"{root_prefix}/{rel}") if root_prefix else (lambda rel: rel)
        text = string.Template(self.policy_template).substitute(
            bucket=bucket, root_prefix=root_prefix, user_prefix=join(f"users/{safe_username(username)}"),
            datasets_prefix=join("datasets"), username=username, partition=self.partition)
        return json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)

    # -- minting ---------------------------------------------------------------------------------
    def mint(self, storage: StorageConfig, username: str, now: datetime | None = None) -> MintedCredentials:
        """New credentials for ``username``: the admin's hook when set, else STS. Raises :class:`CredentialsError`."""
        safe_username(username)
        now = now or datetime.now(timezone.utc)
        if storage.user_credentials_hook is not None:
            return self._from_hook(storage, username, now)
        if not self.configured:
            raise CredentialsError(
                "no way to give users their own storage credentials: set c.CredentialMinter.role_arn (one role, narrowed "
                "per user by a session policy) or c.CredentialMinter.per_user_roles = True, or "
                "c.StorageConfig.user_credentials_hook (docs/storage.md, 'Per-user credentials')")
        policy = self.render_policy(storage, username)
        digest = self.policy_digest(policy)
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            created = False
            if self.per_user_roles:
                role_arn, created = self._ensure_role(storage, username, policy)
            else:
                role_arn = self.role_arn
            answer = self._assume(storage, username, role_arn, policy, created)
        except ClientError as e:
            err = e.response.get("Error", {})
            raise CredentialsError(f"could not mint storage credentials for {username}: {err.get('Code')}: "
                                   f"{err.get('Message')}") from e
        except BotoCoreError as e:
            raise CredentialsError(f"could not mint storage credentials for {username}: {e}") from e
        c = answer["Credentials"]
        return MintedCredentials(c["AccessKeyId"], c["SecretAccessKey"], c.get("SessionToken"), _utc(c["Expiration"]),
                                 "sts", digest)

    def policy_digest(self, policy: str) -> str:
        what = json.dumps([self.role_arn, self.per_user_roles, self.role_name_template, self.role_path, policy])
        return hashlib.sha256(what.encode()).hexdigest()[:16]

    def expected_digest(self, storage: StorageConfig, username: str) -> str:
        """The ``policy`` digest credentials minted now would carry ("hook" with the admin's hook)."""
        if storage.user_credentials_hook is not None:
            return "hook"
        if not self.configured:
            return ""
        return self.policy_digest(self.render_policy(storage, username))

    def _from_hook(self, storage: StorageConfig, username: str, now: datetime) -> MintedCredentials:
        try:
            creds = storage.user_credentials_hook(username) or {}
        except Exception as e:
            raise CredentialsError(f"StorageConfig.user_credentials_hook failed for {username}: {e}") from e
        if not creds.get("key") or not creds.get("secret"):
            raise CredentialsError(f"StorageConfig.user_credentials_hook gave no key and secret for {username}")
        expiration = _utc(creds["expiration"]) if creds.get("expiration") else now + timedelta(seconds=self.duration)
        return MintedCredentials(creds["key"], creds["secret"], creds.get("token"), expiration, "hook", "hook")

    def _client(self, storage: StorageConfig, service: str):
        endpoint = (self.sts_endpoint_url if service == "sts" else self.iam_endpoint_url) or storage.endpoint_url
        key = (service, endpoint, storage.key, storage.secret, self.region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                import botocore.session
                from botocore.config import Config

                kwargs = {"region_name": self.region}
                if endpoint:
                    kwargs["endpoint_url"] = endpoint
                if storage.key and storage.secret:  # else the platform's own credential chain (an instance role...)
                    kwargs.update(aws_access_key_id=storage.key, aws_secret_access_key=storage.secret)
                config = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 4, "mode": "standard"})
                client = self._clients[key] = botocore.session.Session().create_client(service, config=config, **kwargs)
            return client

    def _trust_principal(self, storage: StorageConfig) -> str:
        if self.trust_principal_arn:
            return self.trust_principal_arn
        if self._principal is None:
            arn = self._client(storage, "sts").get_caller_identity()["Arn"]
            head, _, rest = arn.partition(":assumed-role/")
            if rest:  # arn:aws:sts::123:assumed-role/R/session -> arn:aws:iam::123:role/R
                arn = head.replace(":sts:", ":iam:") + ":role/" + rest.split("/")[0]
            self._principal = arn
        return self._principal

    def _ensure_role(self, storage: StorageConfig, username: str, policy: str) -> tuple[str, bool]:
        """The ARN of ``username``'s role with ``policy`` as its inline policy; True when it was just created."""
        from botocore.exceptions import ClientError

        digest = self.policy_digest(policy)
        known = self._roles.get(username)
        if known and known[1] == digest:
            return known[0], False
        iam = self._client(storage, "iam")
        name = _aws_name(self.role_name_template, username, 64)
        max_session = max(3600, min(43200, self.duration))
        created = False
        try:
            role = iam.get_role(RoleName=name)["Role"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
            trust = {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"AWS": self._trust_principal(storage)}, "Action": "sts:AssumeRole"}]}
            role = iam.create_role(RoleName=name, Path=self.role_path, AssumeRolePolicyDocument=json.dumps(trust),
                                   MaxSessionDuration=max_session, Description=f"trainhub storage of {username}"[:1000],
                                   Tags=[{"Key": "trainhub-user", "Value": username[:256]}])["Role"]
            created = True
            self.log.info("Created IAM role %s for the storage credentials of %s", role["Arn"], username)
        if role.get("Path", "/") != self.role_path:
            raise CredentialsError(f"IAM role {name} exists outside {self.role_path} ({role.get('Arn')}): not trainhub's; "
                                   "refusing to change it (rename CredentialMinter.role_name_template or remove it)")
        if int(role.get("MaxSessionDuration") or 3600) < self.duration:
            iam.update_role(RoleName=name, MaxSessionDuration=max_session)
        iam.put_role_policy(RoleName=name, PolicyName="trainhub-storage", PolicyDocument=policy)
        self._roles[username] = (role["Arn"], digest)
        return role["Arn"], created

    def _assume(self, storage: StorageConfig, username: str, role_arn: str, policy: str, created: bool) -> dict:
        from botocore.exceptions import ClientError

        sts = self._client(storage, "sts")
        duration = 3600 if self._duration_fallback else self.duration
        pause = Backoff(f"IAM role {role_arn} to become assumable", start=0.5, factor=2, cap=5,
                        timeout=self.role_ready_timeout if created else 0)
        while True:
            try:
                return sts.assume_role(RoleArn=role_arn, RoleSessionName=_aws_name(self.session_name_template, username, 64),
                                       DurationSeconds=duration, Policy=policy)
            except ClientError as e:
                err = e.response.get("Error", {})
                message = str(err.get("Message", ""))
                if (err.get("Code") == "ValidationError" and "DurationSeconds" in message and duration > 3600
                        and not self.per_user_roles):
                    self.log.warning("Role %s allows no %ds sessions (%s): minting %ds credentials; raise the role's "
                                     "MaxSessionDuration or lower CredentialMinter.duration", role_arn, duration,
                                     message, 3600)
                    self._duration_fallback, duration = True, 3600
                    continue
                if err.get("Code") != "AccessDenied" or not created:
                    raise
                try:
                    pause.sleep()
                except WaitTimeout:
                    raise e from None


def fsspec_strip(url: str) -> str:
    """``s3://bucket/prefix`` -> ``bucket/prefix``."""
    return url.split("://", 1)[1] if "://" in url else url


@dataclass(frozen=True)
class UserCredentialFiles:
    """Where one user's credentials are, on the host and as a sandbox or pod sees them.

    ``folder`` is the host folder a sandbox binds read-only at :data:`MOUNT_POINT` (:attr:`bind`);
    :meth:`env` the variables (nothing secret) that point the AWS SDKs at it.
    """

    username: str
    folder: str
    region: str
    expiration: datetime | None = None

    @property
    def credentials_file(self) -> str:
        return os.path.join(self.folder, CREDENTIALS_FILE)

    @property
    def config_file(self) -> str:
        """The config a process that sees the folder at :data:`MOUNT_POINT` uses (``AWS_CONFIG_FILE``)."""
        return os.path.join(self.folder, CONFIG_FILE)

    @property
    def direct_config_file(self) -> str:
        """The config a process outside any sandbox uses (it names the host path)."""
        return os.path.join(self.folder, DIRECT_CONFIG_FILE)

    @property
    def bind(self) -> tuple[str, str]:
        """(host folder, path in the sandbox): bind it read-only (the folder, never the file: files are replaced)."""
        return self.folder, MOUNT_POINT

    def env(self, sandboxed: bool = True) -> dict[str, str]:
        """The AWS variables of a process of this user: ``sandboxed`` when it sees the folder at :data:`MOUNT_POINT`."""
        return {
            "AWS_CONFIG_FILE": f"{MOUNT_POINT}/{CONFIG_FILE}" if sandboxed else self.direct_config_file,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            # Go SDK v1 tools (rclone, older s5cmd) read AWS_CONFIG_FILE only with this
            "AWS_SDK_LOAD_CONFIG": "1",
            # no quiet fall-back to the machine's own role when the file cannot be read
            "AWS_EC2_METADATA_DISABLED": "true",
        }


def aws_config(credentials_path: str, *, region: str, endpoint_url: str = "", cat: str = "/bin/cat") -> str:
    """An AWS config whose default profile reads its credentials from ``credentials_path`` (credential_process)."""
    lines = ["# Written by trainhub: this user's storage credentials, refreshed by the platform before they expire.",
             "[default]", f"credential_process = {shlex.quote(cat)} {shlex.quote(credentials_path)}",
             f"region = {region}"]
    if endpoint_url:
        lines.append(f"endpoint_url = {endpoint_url}")
    return "\n".join(lines) + "\n"


class CredentialBroker(LoggingConfigurable):
    """Keeps each user's credentials file fresh while the user has servers or jobs (one per hub or jobs service).

    ``ensure(username, account)`` before starting a user's process; ``release(username)`` once the user has none
    left in this process; ``refresh_all()`` periodically (``start_refresher()`` on the service's event loop).
    """

    directory = Unicode(
        help="""Folder of the per-user credential folders (<directory>/<user>/). The platform's: 0711, each user's
        folder root-owned, group the user's account, 0750. Default: $TRAINHUB_DATA_DIR/credentials.""",
    ).tag(config=True)
    refresh_interval = Float(60.0, help="Seconds between two refresh passes of start_refresher().").tag(config=True)
    cat_command = Unicode(help="The program the users' credential_process runs to print the file (default: cat on PATH).").tag(config=True)

    @default("directory")
    def _directory_default(self):
        data_dir = os.environ.get("TRAINHUB_DATA_DIR")
        return os.path.join(data_dir, "credentials") if data_dir else ""

    @default("cat_command")
    def _cat_default(self):
        return os.path.realpath(shutil.which("cat") or "/bin/cat")

    def __init__(self, storage: StorageConfig, minter: CredentialMinter | None = None,
                 clock: Callable[[], datetime] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.storage = storage
        self.minter = minter if minter is not None else CredentialMinter(parent=self)
        #: the time (UTC, aware); a seam for tests
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self._active: dict[str, Account | None] = {}
        self._lock = threading.Lock()
        self._loop = None
        if self.minter.refresh_margin >= self.minter.duration:
            raise ValueError(f"CredentialMinter.refresh_margin ({self.minter.refresh_margin}s) must be shorter than its "
                             f"duration ({self.minter.duration}s)")
        if self.minter.refresh_margin < CLIENT_REFRESH_WINDOW + self.refresh_interval:
            self.log.warning("CredentialMinter.refresh_margin %ds is under 15 min + refresh_interval: clients will run "
                             "credential_process on every request for a while before each refresh",
                             self.minter.refresh_margin)

    # -- paths -----------------------------------------------------------------------------------
    def files(self, username: str) -> UserCredentialFiles:
        """The paths of ``username``'s credentials (nothing is read or written)."""
        if not self.directory:
            raise CredentialsError("CredentialBroker.directory is not set (and $TRAINHUB_DATA_DIR is not either)")
        return UserCredentialFiles(username, os.path.join(os.path.abspath(self.directory), safe_username(username)),
                                   self.minter.region)

    def env_for(self, username: str, account: Account | None = None, *, sandboxed: bool = True) -> dict[str, str]:
        """:meth:`ensure`, then the whole storage environment of a process of ``username``
        (``StorageConfig.env_for`` with the file's variables: no key of the platform's, no credential at all)."""
        files = self.ensure(username, account)
        return self.storage.env_for(username, credentials_env=files.env(sandboxed))

    # -- ensure and refresh ----------------------------------------------------------------------
    def ensure(self, username: str, account: Account | None = None) -> UserCredentialFiles:
        """Make ``username``'s credentials file current: mint when missing, within ``refresh_margin`` of expiry or
        minted under another policy; write it (atomically) and the configs; remember the user for refresh_all.
        Blocking (STS/IAM calls, file writes as the platform): call it on a worker thread from an event loop."""
        files = self._refresh(username, account, force=False)
        with self._lock:
            self._active[username] = account
        return files

    def refresh(self, username: str, account: Account | None = None, *, force: bool = True) -> UserCredentialFiles:
        """Mint and write ``username``'s credentials now (``force``), or only when :meth:`ensure` would."""
        return self._refresh(username, account, force=force)

    def release(self, username: str) -> None:
        """``username`` has no server or job left here: stop refreshing (the file stays and simply expires)."""
        with self._lock:
            self._active.pop(username, None)

    @property
    def active_users(self) -> list[str]:
        with self._lock:
            return sorted(self._active)

    def refresh_all(self) -> dict[str, datetime | Exception]:
        """One refresh pass over every user ensured and not released; a failure is logged, the others go on."""
        with self._lock:
            users = dict(self._active)
        results: dict[str, datetime | Exception] = {}
        for username, account in users.items():
            try:
                results[username] = self._refresh(username, account, force=False).expiration
            except Exception as e:  # the next pass tries again; the file keeps the current credentials meanwhile
                self.log.error("Could not refresh the storage credentials of %s: %s", username, e)
                results[username] = e
        return results

    def start_refresher(self):
        """Run :meth:`refresh_all` every ``refresh_interval`` seconds on the running event loop (off it, in a thread)."""
        import asyncio

        from trainhub.loops import PeriodicLoop

        async def body():
            await asyncio.to_thread(self.refresh_all)

        self._loop = PeriodicLoop("storage-credentials-refresh", body, lambda: self.refresh_interval, self.log, jitter=0.1)
        self._loop.start()
        return self._loop

    async def stop_refresher(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None

    def read(self, username: str) -> dict | None:
        """The current credentials file of ``username`` (as the platform reads it), None when there is none."""
        try:
            with open(self.files(username).credentials_file) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None

    # -- internals -------------------------------------------------------------------------------
    def _stale(self, current: dict | None, expected_policy: str) -> bool:
        if not current:
            return True
        try:
            expiration = _utc(current["Expiration"])
        except (KeyError, ValueError):
            return True
        if current.get("TrainhubPolicy") != expected_policy:
            return True
        return self.clock() >= expiration - timedelta(seconds=self.minter.refresh_margin)

    def _refresh(self, username: str, account: Account | None, force: bool) -> UserCredentialFiles:
        files = self.files(username)
        expected = self.minter.expected_digest(self.storage, username)
        with self._user_folder(files, account) as dfd:
            current = _read_json(dfd, CREDENTIALS_FILE)
            if force or self._stale(current, expected):
                minted = self.minter.mint(self.storage, username, now=self.clock())
                current = minted.process_output()
                _write(dfd, CREDENTIALS_FILE, json.dumps(current, indent=1) + "\n", account)
                self.log.info("Minted storage credentials of %s (%s), valid until %s", username, minted.source,
                              current["Expiration"])
            for name, path in ((CONFIG_FILE, f"{MOUNT_POINT}/{CREDENTIALS_FILE}"),
                               (DIRECT_CONFIG_FILE, files.credentials_file)):
                text = aws_config(path, region=self.minter.region, endpoint_url=self.storage.endpoint_url,
                                  cat=self.cat_command)
                if _read_text(dfd, name) != text:
                    _write(dfd, name, text, account)
        return replace(files, expiration=_utc(current["Expiration"]))

    @contextlib.contextmanager
    def _user_folder(self, files: UserCredentialFiles, account: Account | None) -> Iterator[int]:
        """The user's folder, opened (no symbolic link followed), made the platform's with the account's group and
        locked against another refresher (the hub and the jobs service may both refresh one user)."""
        base = os.path.dirname(files.folder)
        os.makedirs(base, mode=0o711, exist_ok=True)
        bfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(bfd)
            if st.st_uid != os.geteuid():
                raise CredentialsError(f"{base} is not the platform's (owner uid {st.st_uid}): refusing to keep credentials there")
            os.fchmod(bfd, 0o711)  # accounts traverse to their own folder; nothing is listable
            name = os.path.basename(files.folder)
            try:
                os.mkdir(name, 0o700, dir_fd=bfd)
            except FileExistsError:
                pass
            dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=bfd)
        finally:
            os.close(bfd)
        try:
            st = os.fstat(dfd)
            if st.st_uid != os.geteuid():
                raise CredentialsError(f"{files.folder} is not the platform's (owner uid {st.st_uid})")
            if account is not None and os.geteuid() == 0:
                if st.st_gid != account.gid:
                    os.fchown(dfd, -1, account.gid)
                os.fchmod(dfd, 0o750)
            else:
                os.fchmod(dfd, 0o700)
            fcntl.flock(dfd, fcntl.LOCK_EX)
            yield dfd
        finally:
            os.close(dfd)  # releases the lock


def _read_text(dfd: int, name: str) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except (FileNotFoundError, OSError):
        return None
    with os.fdopen(fd) as f:
        return f.read()


def _read_json(dfd: int, name: str) -> dict | None:
    text = _read_text(dfd, name)
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _write(dfd: int, name: str, text: str, account: Account | None) -> None:
    """Replace ``name`` in the folder ``dfd`` atomically: a new file (0640, group the account's; 0600 without one),
    written and synced, renamed over the old one within the folder (a bind mount of the folder sees it)."""
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dfd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        if account is not None and os.geteuid() == 0:
            os.fchown(fd, -1, account.gid)
            os.fchmod(fd, 0o640)
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dfd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


_brokers: dict[tuple[str, str], CredentialBroker] = {}


def storage_credentials_broker(storage: StorageConfig, parent=None) -> CredentialBroker | None:
    """The one broker of a process (the hub, the jobs service) for ``storage``, its refresher started on the running
    event loop the first time; None where users get no credentials of their own (local storage, or the platform's
    key shared on purpose: ``StorageConfig.share_platform_credentials``)."""
    if storage.protocol != "s3" or storage.share_platform_credentials:
        return None
    broker = CredentialBroker(storage, parent=parent)
    key = (storage.url, broker.directory)
    known = _brokers.get(key)
    if known is not None:
        return known
    _brokers[key] = broker
    try:
        broker.start_refresher()
    except RuntimeError:  # no running loop (a script, a test): refreshed by each ensure only
        pass
    return broker


def credentials_problem(storage: StorageConfig, parent=None) -> str:
    """Why users of ``storage`` could get no credentials of their own ("" when they can): said at `trainhub up`."""
    if storage.protocol != "s3" or storage.share_platform_credentials or storage.user_credentials_hook:
        return ""
    if CredentialMinter(parent=parent).configured:
        return ""
    return ("S3 storage: users' servers and jobs get credentials of their own, never the platform's key, and nothing "
            "makes them: set c.CredentialMinter.role_arn (STS AssumeRole with a session policy per user) or "
            "c.CredentialMinter.per_user_roles = True (a role per user), or c.StorageConfig.user_credentials_hook; "
            "c.StorageConfig.share_platform_credentials = True gives every user the platform's key (unsafe: "
            "docs/storage.md, \"Per-user credentials\")")
