"""Storage for the Kubernetes back end's notebook pods: the user's area and the datasets as a mount (CSI volumes or
fuse sidecars), the fsspec environment, and the objects behind them (the credentials Secret, volumes and claims),
made before the pod and removed by ``storage_volume_cleanup``. A mixin of
:class:`~trainhub.spawner.kubernetes.GPUKubeSpawner`, configured as ``c.GPUKubeSpawner.storage_*``; the manifests
come from the pure builders in ``trainhub.spawner.k8s_manifests``.
"""

from __future__ import annotations

import asyncio
import json

from kubernetes_asyncio.client.rest import ApiException
from traitlets import Bool, Dict, Enum, Instance, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from trainhub.boundary.credentials import CredentialMinter
from trainhub.exceptions import TrainhubError
from trainhub.kube import credentials as kc
from trainhub.spawner import k8s_manifests as m
from trainhub.spawner.errors import spawn_refusal
from trainhub.storage import StorageConfig


STORAGE_LABELS = {"app.kubernetes.io/managed-by": "trainhub", "app.kubernetes.io/component": "storage"}


class KubeStorage(LoggingConfigurable):
    """The storage options and objects of :class:`~trainhub.spawner.kubernetes.GPUKubeSpawner` (needs its
    ``api``, ``namespace``, ``user``, ``_base`` and ``_k8s_request``)."""

    # the user's own credentials: minted lazily, then the Secret's data and when they end (None: unknown, mint again)
    _pod_creds: kc.PodCredentials | None = None
    _credentials_data: dict | None = None
    _credentials_expire = None

    storage = Instance(StorageConfig, help="Storage areas (configured as c.StorageConfig).")

    @default("storage")
    def _storage_default(self):
        return StorageConfig(parent=self)

    storage_mount = Enum(
        ["none", "csi", "fuse-sidecar"],
        "none",
        help="""How the user's storage area and the shared datasets appear inside the notebook pod,
        under storage_mount_root/home and storage_mount_root/datasets (read-only):

        "csi": a statically provisioned PersistentVolume + claim per user prefix (and one pair for
        the datasets) using the CSI driver in storage_csi_driver (default the Mountpoint for S3
        driver, s3.csi.aws.com); "fuse-sidecar": native sidecar containers running `rclone mount`
        into a shared emptyDir with Bidirectional mount propagation (privileged, needs /dev/fuse);
        "none": no mount, only the fsspec environment variables.""",
    ).tag(config=True)

    storage_mount_root = Unicode("/mnt/trainhub", help="Where the storage mounts appear in the notebook container.").tag(config=True)

    storage_link = Unicode(
        "storage",
        help="""With a storage mount: the name of a link in the notebook's home to the user's storage area
        (storage_mount_root/home), made by a postStart hook, so JupyterLab's file browser shows the area (notebook jobs
        put their outputs there, where a job pod can reach them). A file or folder of the user's by that name is kept.
        Empty: no link. An admin's own postStart hook (lifecycle_hooks) wins, and there is no link then.""",
    ).tag(config=True)

    storage_secret = Enum(
        ["managed", "existing", "none"],
        "managed",
        help="""Where per-user storage credentials come from. "managed": the hub writes a Secret named by
        storage_secret_name_template before each start. With S3 it holds the user's own short-lived credentials,
        limited to the user's prefix and datasets/ (minted by c.CredentialMinter or StorageConfig.user_credentials_hook;
        a start is refused with what to set when neither is), as files the pod mounts read-only at
        /run/trainhub/credentials, minted again by the hub's poll before they expire; only with
        StorageConfig.share_platform_credentials (one-person set-ups) the platform's key as AWS_* keys.
        "existing": the Secret is made by someone else (for example an external-secrets operator) and its AWS_*
        keys are referenced, optional. "none": credentials go into plain environment values (development only).
        With a Secret, the pod spec holds references and never the values.""",
    ).tag(config=True)

    storage_secret_name_template = Unicode(
        "trainhub-storage-{username}",
        help="Name of the per-user credentials Secret; {username} is the escaped user name (KubeSpawner's expansion).",
    ).tag(config=True)

    storage_csi_driver = Unicode("s3.csi.aws.com", help="CSI driver for storage_mount='csi'.").tag(config=True)

    storage_csi_volume_attributes = Dict(
        {},
        help="""Extra csi.volumeAttributes for the PersistentVolumes (e.g. {"authenticationSource": "pod"}).
        bucketName is filled in from StorageConfig.url.""",
    ).tag(config=True)

    storage_csi_mount_options = List(
        Unicode(),
        help="""PersistentVolume mountOptions. Empty (default): the Mountpoint for S3 options (allow-other,
        prefix <user prefix>/, allow-delete or read-only, uid/gid, endpoint-url). Set a list for other
        drivers; "{prefix}" in an option is replaced by the volume's prefix.""",
    ).tag(config=True)

    storage_csi_node_publish_secret = Bool(
        False,
        help="""Reference the user's credentials Secret as csi.nodePublishSecretRef (for drivers that read
        per-volume credentials, such as csi-s3). The Mountpoint for S3 driver does not; it uses driver- or
        pod-level IAM. Never the users' own minted credentials (they expire, and a driver reads them once, at mount):
        with them the driver mounts with its own identity.""",
    ).tag(config=True)

    storage_volume_cleanup = Enum(
        ["user-deleted", "server-stopped", "never"],
        "user-deleted",
        help="""When the per-user storage objects go: the home PersistentVolume and claim (storage_mount="csi") and
        the managed credentials Secret. "user-deleted" (default): when JupyterHub deletes the user (or their default
        server for good: Spawner.delete_forever); "server-stopped": each time the last of the user's servers stops
        (made again at the next start); "never": kept, as before. Only the objects go: the files stay in the object
        store (the volumes are Retain and point at the user's prefix). The shared datasets volume is never removed.""",
    ).tag(config=True)

    storage_sidecars = Enum(
        ["auto", "native", "containers"],
        "auto",
        help="""How the storage_mount="fuse-sidecar" containers join the notebook pod. "native": native sidecars (init
        containers with restartPolicy Always, Kubernetes 1.28+), started and mounted before the notebook, stopped after it.
        "containers": ordinary containers beside the notebook (any Kubernetes; the mount appears in the notebook seconds
        after it starts). "auto" (default): native from 1.28 on, containers before (an older server would drop
        restartPolicy and refuse the sidecars' probes).""",
    ).tag(config=True)

    storage_capacity = Unicode("1Ti", help="Nominal capacity of the storage PersistentVolumes (object stores ignore it).").tag(config=True)
    storage_sidecar_image = Unicode("rclone/rclone:1.68", help="Image of the fuse-sidecar containers; needs sh, rclone and fusermount.").tag(config=True)

    storage_sidecar_resources = Dict(
        {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        help="Resources of each fuse-sidecar container.",
    ).tag(config=True)

    storage_uid = Integer(1000, allow_none=True, help="Owner uid of the mounted files (None = driver default).").tag(config=True)
    storage_gid = Integer(100, allow_none=True, help="Owner gid of the mounted files (None = driver default).").tag(config=True)

    @property
    def storage_enabled(self) -> bool:
        return bool(self.storage.url)

    def storage_secret_name(self) -> str:
        return self._expand_user_properties(self.storage_secret_name_template)

    def _storage_names(self) -> dict:
        user = self._expand_user_properties("{username}")
        return {
            "home_pv": m.k8s_name("trainhub", self.namespace, user, "home"),
            "home_pvc": m.k8s_name("trainhub-home", user),
            "datasets_pv": m.k8s_name("trainhub", self.namespace, "datasets"),
            "datasets_pvc": "trainhub-datasets",
        }

    # the API server's (major, minor) per API URL, read once per process
    _server_versions: dict = {}

    async def native_sidecars(self) -> bool:
        """Whether the fuse-sidecar containers go in as native sidecars (storage_sidecars; "auto": the server is 1.28+)."""
        if self.storage_sidecars != "auto":
            return self.storage_sidecars == "native"
        from kubernetes_asyncio.client import VersionApi

        host = self.api.api_client.configuration.host
        if host not in KubeStorage._server_versions:
            info = await self._k8s_request("read the API server's version", VersionApi(self.api.api_client).get_code)
            KubeStorage._server_versions[host] = tuple(int("".join(ch for ch in str(v) if ch.isdigit()) or 0)
                                                          for v in (info.major, info.minor))
        return KubeStorage._server_versions[host] >= (1, 28)

    def storage_pod_fragments(self) -> dict:
        """volumes / volume_mounts / init_containers for the configured storage mount, and the user's own
        credentials (a Secret volume) where the pods get them."""
        if not self.storage_enabled:
            return {}
        own = self.own_storage_credentials
        creds_volume, creds_mount = kc.volume_parts(self.storage_secret_name()) if own else (None, None)
        if self.storage_mount == "none":
            return {"volumes": [creds_volume], "volume_mounts": [creds_mount]} if own else {}
        frag = self._mount_fragments(creds_mount if own else None)
        if own:
            frag["volumes"] = [*frag.get("volumes", []), creds_volume]
            frag["volume_mounts"] = [*frag.get("volume_mounts", []), creds_mount]
        return frag

    def _mount_fragments(self, creds_mount: dict | None) -> dict:
        """The storage mount's part of storage_pod_fragments (``creds_mount``: the user's own credentials, which the
        fuse sidecars read as the notebook does)."""
        own = creds_mount is not None
        root = self.storage_mount_root.rstrip("/")
        if self.storage_mount == "csi":
            names = self._storage_names()
            frag = m.csi_pod_storage(names["home_pvc"], names["datasets_pvc"], root)
        else:
            frag = m.fuse_sidecar_pod_storage(
                image=self.storage_sidecar_image,
                home_url=self.storage.user_url(self.user.name),
                datasets_url=self.storage.datasets_url(),
                mount_root=root,
                secret_name=self.storage_secret_name() if self.storage_secret != "none" and not own else None,
                credentials=(creds_mount, self._pod_credentials().env(self.user.name)) if own else None,
                endpoint_url=self.storage.endpoint_url or None,
                uid=self.storage_uid, gid=self.storage_gid,
                resources=self.storage_sidecar_resources,
                native=getattr(self, "_native_sidecars", self.storage_sidecars != "containers"),
            )
        if self.storage_link and not (self._base().get("lifecycle_hooks") or {}).get("postStart"):
            frag["lifecycle_hooks"] = m.storage_link_hooks(f"{root}/home", self.storage_link)
        return frag

    # -- the user's own credentials (trainhub.kube.credentials) ---------------------------------------
    @property
    def own_storage_credentials(self) -> bool:
        """Whether this server's pod gets its user's own minted credentials in the managed Secret (S3 storage,
        storage_secret "managed", the platform's key not shared on purpose)."""
        return self.storage_secret == "managed" and kc.pods_get_own_credentials(self.storage)

    def _pod_credentials(self) -> kc.PodCredentials:
        if self._pod_creds is None:
            self._pod_creds = kc.PodCredentials(self.storage, CredentialMinter(parent=self))
        return self._pod_creds

    async def _mint_credentials(self) -> None:
        """Mint the user's credentials for the Secret (on a worker thread: STS or the admin's hook)."""
        data, expires = await asyncio.to_thread(self._pod_credentials().secret_data, self.user.name)
        self._credentials_data, self._credentials_expire = data, expires

    async def refresh_storage_credentials(self) -> bool:
        """Mint the user's credentials again and replace the Secret when they are due (the hub's poll of a running
        server calls this); True when it did. A failure is logged: the Secret keeps what it has until the next poll."""
        if not (self.storage_enabled and self.own_storage_credentials):
            return False
        if not self._pod_credentials().due(self._credentials_expire):
            return False
        try:
            await self._mint_credentials()
            await self._put_secret(self._credentials_secret())
        except Exception as e:
            self.log.warning("trainhub: could not refresh the storage credentials of %s: %s", self.user.name, e)
            return False
        self.log.info("trainhub: storage credentials of %s refreshed (valid until %s)", self.user.name,
                      self._credentials_expire.isoformat())
        return True

    def _credentials_secret(self) -> dict:
        return m.make_storage_secret(self.storage_secret_name(), self.namespace, self._credentials_data, STORAGE_LABELS)

    def _storage_user_env(self) -> dict:
        """StorageConfig.env_for for the pod: with its own credentials, the config file in the mounted Secret and
        nothing secret; otherwise ("existing" or "none" Secrets, or the platform's key shared on purpose) the AWS_*
        values the Secret or the pod spec carries (the admin's user_credentials_hook or else the platform's key)."""
        if self.own_storage_credentials:
            return self._pod_credentials().env(self.user.name)
        return self.storage.env_for(self.user.name, platform_credentials=True)

    def storage_env(self) -> dict:
        """fsspec environment for the notebook; credentials as secretKeyRef unless storage_secret='none'."""
        if not self.storage_enabled:
            return {}
        env = self._storage_user_env()
        opts = json.loads(env.get("TRAINHUB_STORAGE_OPTIONS") or "{}")
        if self.storage_secret != "none":
            # credentials reach s3fs through AWS_* variables read from the Secret
            opts = {k: v for k, v in opts.items() if k not in ("key", "secret", "token")}
            env["TRAINHUB_STORAGE_OPTIONS"] = json.dumps(opts)
        plain, secret = m.split_secret_env(env)
        if self.storage_secret == "none":
            out = {**plain, **secret}
        elif self.storage_secret == "managed":
            out = {**plain, **m.secret_env_refs(self.storage_secret_name(), sorted(secret))}
        else:
            out = {**plain, **m.secret_env_refs(self.storage_secret_name(), m.SECRET_ENV_KEYS, optional=True)}
        if self.storage_mount != "none":
            out.update(m.storage_paths_env(self.storage_mount_root.rstrip("/")))
        return out

    def storage_manifests(self) -> list[dict]:
        """Objects to create before the pod: the credentials Secret and, for csi, PVs and PVCs."""
        if not self.storage_enabled:
            return []
        out = []
        labels = STORAGE_LABELS
        if self.own_storage_credentials:
            if self._credentials_data is None:
                self._credentials_data, self._credentials_expire = self._pod_credentials().secret_data(self.user.name)
            out.append(self._credentials_secret())
        elif self.storage_secret == "managed":
            env = self._storage_user_env()
            _, secret = m.split_secret_env(env)
            if secret:  # no credentials configured (IAM roles, anonymous): nothing to store
                out.append(m.make_storage_secret(self.storage_secret_name(), self.namespace, secret, labels))
        if self.storage_mount == "csi":
            names = self._storage_names()
            bucket, root_prefix = m.s3_bucket_prefix(self.storage.root() + "/")
            # the driver reads AWS_* keys from a node-publish Secret once, at mount: never the users' own credentials,
            # which expire (with them the driver's own identity mounts: docs/storage.md, "On Kubernetes")
            publish = (self.namespace, self.storage_secret_name()) if (
                self.storage_csi_node_publish_secret and self.storage_secret != "none"
                and not self.own_storage_credentials) else None
            for which, url, read_only in (
                ("home", self.storage.user_url(self.user.name), False),
                ("datasets", self.storage.datasets_url(), True),
            ):
                _, prefix = m.s3_bucket_prefix(url + "/")
                if not self.storage_csi_mount_options:
                    options = m.mountpoint_mount_options(
                        prefix, read_only, self.storage_uid, self.storage_gid,
                        endpoint_url=self.storage.endpoint_url or None,
                    )
                else:
                    options = [o.replace("{prefix}", prefix) for o in self.storage_csi_mount_options]
                pv, pvc = names[f"{which}_pv"], names[f"{which}_pvc"]
                out.append(m.make_csi_pv(
                    pv, driver=self.storage_csi_driver, volume_handle=pv, claim_namespace=self.namespace,
                    claim_name=pvc, volume_attributes={"bucketName": bucket, **self.storage_csi_volume_attributes},
                    mount_options=options, read_only=read_only, capacity=self.storage_capacity,
                    node_publish_secret=publish if which == "home" else None, labels=labels,
                ))
                out.append(m.make_bound_pvc(pvc, self.namespace, pv, read_only=read_only,
                                            capacity=self.storage_capacity, labels=labels))
        return out

    async def _put_secret(self, obj: dict) -> None:
        """Create the Secret, or replace the one there."""
        name = obj["metadata"]["name"]
        try:
            await self._k8s_request(f"create secret {name}", self.api.create_namespaced_secret, self.namespace, obj)
        except ApiException as e:
            if e.status != 409:
                raise
            await self._k8s_request(f"replace secret {name}", self.api.replace_namespaced_secret, name, self.namespace, obj)

    async def ensure_storage_objects(self) -> None:
        """Create (or, for the managed Secret, replace) the storage objects; existing PV/PVC are kept. The user's own
        credentials are minted first (a refusal, such as nothing configured to mint them, stops the start with what to
        set: the pod never starts with the platform's key instead)."""
        if self.storage_enabled and self.own_storage_credentials:
            try:
                await self._mint_credentials()
            except TrainhubError as e:
                raise spawn_refusal(e) from None
        for obj in self.storage_manifests():
            kind, name = obj["kind"], obj["metadata"]["name"]
            try:
                if kind == "Secret":
                    await self._put_secret(obj)
                elif kind == "PersistentVolume":
                    await self._k8s_request(f"create pv {name}", self.api.create_persistent_volume, obj)
                else:
                    await self._k8s_request(f"create pvc {name}", self.api.create_namespaced_persistent_volume_claim, self.namespace, obj)
            except ApiException as e:
                if e.status == 409 and kind != "Secret":
                    self.log.debug("trainhub: %s %s exists", kind, name)
                    continue
                self.log.exception("trainhub: creating %s %s failed", kind, name)
                raise

    async def remove_user_storage_objects(self) -> None:
        """Delete this user's home claim and volume and the managed credentials Secret (never the datasets')."""
        if not self.storage_enabled:
            return
        names = self._storage_names()
        calls = []
        if self.storage_mount == "csi":
            calls += [("pvc", names["home_pvc"], self.api.delete_namespaced_persistent_volume_claim, (names["home_pvc"], self.namespace)),
                      ("pv", names["home_pv"], self.api.delete_persistent_volume, (names["home_pv"],))]
        if self.storage_secret == "managed":
            calls.append(("secret", self.storage_secret_name(), self.api.delete_namespaced_secret,
                          (self.storage_secret_name(), self.namespace)))
        for kind, name, call, args in calls:
            try:
                await self._k8s_request(f"delete {kind} {name}", call, *args)
                self.log.info("trainhub: deleted %s %s of %s (storage_volume_cleanup=%s)", kind, name, self.user.name,
                              self.storage_volume_cleanup)
            except ApiException as e:
                if e.status != 404:
                    self.log.warning("trainhub: deleting %s %s of %s failed: %s %s", kind, name, self.user.name,
                                     e.status, e.reason)
