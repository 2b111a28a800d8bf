"""A user's own storage credentials in Kubernetes pods (notebook servers and job attempts).

The credentials the local back end writes to a file (``trainhub.boundary.credentials``: minted per user, limited to
the user's prefix and ``datasets/``, valid for hours) reach a pod as a Secret with two keys: ``credentials.json``
(what a ``credential_process`` prints) and ``config`` (an AWS config whose ``credential_process`` prints that file).
The pod mounts the Secret as a volume, read-only, at :data:`~trainhub.boundary.credentials.MOUNT_POINT`; never by
``subPath``, since kubelet swaps a Secret volume's files at once and a running pod sees each new version within its
sync period (about a minute). Its variables point the AWS SDKs, s3fs and rclone at the config: nothing secret is in
the pod spec or its environment, and the platform's key stays in the platform's processes. Whoever writes a Secret
(the hub for a server, the jobs service for an attempt) mints again once :meth:`PodCredentials.due`, and botocore runs
the ``credential_process`` again in its last 15 minutes, so a week-long server or job keeps working.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from trainhub.boundary.credentials import (CONFIG_FILE, CREDENTIALS_FILE, MOUNT_POINT, CredentialMinter,
                                           UserCredentialFiles, aws_config)
from trainhub.storage import StorageConfig

VOLUME = "trainhub-credentials"
#: a path every image has (Debian's, Ubuntu's, busybox's): the config runs it inside the pod
POD_CAT = "/bin/cat"


def pods_get_own_credentials(storage: StorageConfig) -> bool:
    """Whether users' pods get credentials of their own: S3 storage whose platform key is not shared on purpose
    (``StorageConfig.share_platform_credentials``, one-person development set-ups only)."""
    return bool(storage.url) and storage.protocol == "s3" and not storage.share_platform_credentials


def volume_parts(secret_name: str) -> tuple[dict, dict]:
    """(volume, volume mount) of a credentials Secret: read-only at MOUNT_POINT, the files world-readable inside
    the pod (every process of the pod is its user's, whatever uid the image runs as)."""
    volume = {"name": VOLUME, "secret": {"secretName": secret_name, "defaultMode": 0o444}}
    mount = {"name": VOLUME, "mountPath": MOUNT_POINT, "readOnly": True}
    return volume, mount


class PodCredentials:
    """Mints one user's credentials as a pod's Secret holds them, and says when to mint again."""

    def __init__(self, storage: StorageConfig, minter: CredentialMinter,
                 clock: Callable[[], datetime] | None = None):
        self.storage = storage
        self.minter = minter
        self.clock = clock or (lambda: datetime.now(timezone.utc))

    def secret_data(self, username: str) -> tuple[dict[str, str], datetime]:
        """New credentials for ``username`` as the Secret's ``stringData``, and when they expire. Blocking (STS, or the
        admin's hook): run it on a worker thread. Raises ``CredentialsError`` with what to configure."""
        minted = self.minter.mint(self.storage, username, self.clock())
        config = aws_config(f"{MOUNT_POINT}/{CREDENTIALS_FILE}", region=self.minter.region,
                            endpoint_url=self.storage.endpoint_url or "", cat=POD_CAT)
        return {CREDENTIALS_FILE: json.dumps(minted.process_output()), CONFIG_FILE: config}, minted.expiration

    def env(self, username: str) -> dict[str, str]:
        """The storage environment of ``username``'s pods: where the areas are, the endpoint, and the config file in
        the mounted Secret (``StorageConfig.env_for`` with no credential at all)."""
        files = UserCredentialFiles(username, MOUNT_POINT, self.minter.region)
        return self.storage.env_for(username, credentials_env=files.env(sandboxed=True))

    def due(self, expiration: datetime | None) -> bool:
        """Whether credentials expiring at ``expiration`` (None: unknown, say after a restart) must be minted again
        now: within ``CredentialMinter.refresh_margin`` of their end."""
        if expiration is None:
            return True
        return expiration - self.clock() <= timedelta(seconds=self.minter.refresh_margin)
