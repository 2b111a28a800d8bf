"""Profiles: what an admin offers (GPU count, model, CPU/memory, image, who may use it).

The same profile list drives the local spawner, the Kubernetes spawner, the jobs
service and the culler, so a profile means the same thing on both back ends.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Iterable

from traitlets import List, Unicode, validate
from traitlets.config import LoggingConfigurable

from trainhub.exceptions import ProfileNotAllowed, UnknownProfile

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class Profile:
    slug: str
    display_name: str
    description: str = ""
    gpus: int = 0
    gpu_model: str | None = None  # substring of the device name, e.g. "A100"; None = any
    gpu_resource: str = "nvidia.com/gpu"  # Kubernetes resource name (MIG: nvidia.com/mig-1g.10gb)
    cpu_limit: float | None = None
    mem_limit: str | None = None  # "16G"
    # what a server or job worker is sure to get (Kubernetes: the pod's requests; None = the limit, as Kubernetes
    # defaults a request to its limit); the local back end does not reserve CPU or memory
    cpu_guarantee: float | None = None
    mem_guarantee: str | None = None  # "4G"
    image: str | None = None  # Kubernetes only
    allowed_groups: tuple[str, ...] = ()  # empty = everyone
    node_selector: dict = field(default_factory=dict)
    tolerations: tuple = ()
    idle_timeout: float | None = None  # seconds; culler policy for this profile (None = culler default)

    def allows(self, user_groups: Iterable[str], is_admin: bool = False) -> bool:
        return is_admin or not self.allowed_groups or bool(set(self.allowed_groups) & set(user_groups))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["allowed_groups"] = list(self.allowed_groups)
        d["tolerations"] = list(self.tolerations)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"profile {d.get('slug')!r}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        if "slug" not in d or not SLUG_RE.match(str(d["slug"])):
            raise ValueError(f"profile slug {d.get('slug')!r} must be lowercase letters, digits and dashes")
        d.setdefault("display_name", d["slug"])
        d["gpus"] = int(d.get("gpus", 0))
        if d["gpus"] < 0:
            raise ValueError(f"profile {d['slug']!r}: gpus must be >= 0")
        d["allowed_groups"] = tuple(d.get("allowed_groups", ()))
        d["tolerations"] = tuple(d.get("tolerations", ()))
        return cls(**d)


DEFAULT_PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "description": "No GPU: editing, data preparation, small experiments.", "gpus": 0},
    {"slug": "gpu-1", "display_name": "1 GPU", "description": "One GPU for prototyping and single-GPU training.", "gpus": 1},
    {"slug": "gpu-2", "display_name": "2 GPUs", "description": "Two GPUs for multi-GPU (DDP) prototyping.", "gpus": 2},
]


class ProfileCatalog(LoggingConfigurable):
    """The admin-defined profile list and the default choice."""

    profiles = List(
        default_value=DEFAULT_PROFILES,
        help="""Profiles users may choose (list of dicts).

        Fields: slug (required, e.g. "gpu-1"), display_name, description, gpus (per server),
        gpu_model (substring of the device name such as "A100"; omitted = any), gpu_resource
        (Kubernetes resource name, e.g. "nvidia.com/mig-1g.10gb"), cpu_limit (cores),
        mem_limit ("16G"), cpu_guarantee and mem_guarantee (Kubernetes: the pod's requests, what the
        scheduler must find free on one node; omitted = the limits), image (Kubernetes), allowed_groups (empty = everyone),
        node_selector, tolerations, idle_timeout (seconds, for the culler).
        Default: cpu, gpu-1, gpu-2.
        """,
    ).tag(config=True)

    default_profile = Unicode(
        "",
        help="Slug of the profile used when a request names none. Empty = the first GPU-less profile, else the first.",
    ).tag(config=True)

    cpu_profile = Unicode(
        "",
        help="Slug of the CPU-only profile servers are moved to when the culler releases their GPUs. Empty = the first profile with gpus=0.",
    ).tag(config=True)

    @validate("profiles")
    def _validate_profiles(self, proposal):
        parsed = [Profile.from_dict(p) if isinstance(p, dict) else p for p in proposal["value"]]
        slugs = [p.slug for p in parsed]
        dupes = {s for s in slugs if slugs.count(s) > 1}
        if dupes:
            raise ValueError(f"duplicate profile slugs: {sorted(dupes)}")
        if not parsed:
            raise ValueError("at least one profile is required")
        return [p.to_dict() for p in parsed]

    def all(self) -> list[Profile]:
        return [Profile.from_dict(p) for p in self.profiles]

    def get(self, slug: str | None) -> Profile:
        if not slug:
            return self.default()
        for p in self.all():
            if p.slug == slug:
                return p
        raise UnknownProfile(
            f"Unknown profile {slug!r}. Available profiles: {', '.join(p.slug for p in self.all())}."
        )

    def default(self) -> Profile:
        if self.default_profile:
            return self.get(self.default_profile)
        profiles = self.all()
        return next((p for p in profiles if p.gpus == 0), profiles[0])

    def cpu(self) -> Profile | None:
        if self.cpu_profile:
            return self.get(self.cpu_profile)
        return next((p for p in self.all() if p.gpus == 0), None)

    def for_user(self, groups: Iterable[str], is_admin: bool = False) -> list[Profile]:
        groups = list(groups)
        return [p for p in self.all() if p.allows(groups, is_admin)]

    def resolve(self, slug: str | None, groups: Iterable[str], is_admin: bool = False) -> Profile:
        """The profile a user asked for, checked against its allowed groups."""
        profile = self.get(slug)
        if not profile.allows(groups, is_admin):
            raise ProfileNotAllowed(
                f"Profile {profile.slug!r} is limited to the groups {', '.join(profile.allowed_groups)}; "
                f"you may use: {', '.join(p.slug for p in self.for_user(groups, is_admin)) or 'none'}."
            )
        return profile
