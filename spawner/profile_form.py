"""The spawn page: profiles the user may use, with live GPU availability and quota."""

from __future__ import annotations

from html import escape

from trainhub.fmt import plural
from trainhub.profiles import Profile
from trainhub.quotas import QuotaStatus


def availability_text(profile: Profile, free: int, total: int, simulated: bool) -> str:
    if profile.gpus == 0:
        return "no GPU"
    sim = " (simulated)" if simulated else ""
    model = f" {profile.gpu_model}" if profile.gpu_model else ""
    return f"{free} of {total}{model} GPUs free{sim}"


def render_form(profiles: list[tuple[Profile, int, int]], quota: QuotaStatus, default_slug: str, simulated: bool,
                queue: bool = False) -> str:
    """``profiles``: (profile, free, total) for each profile the user may use; ``queue``: a GPU server
    whose GPUs are all held waits in line (so busy GPUs are a note, not a block)."""
    rows = []
    remaining = quota.remaining
    for profile, free, total in profiles:
        blocked = wait = ""
        if profile.gpus:
            if total < profile.gpus:
                blocked = f"needs {profile.gpus} GPUs; this platform has {total}"
            elif remaining is not None and profile.gpus > remaining:
                blocked = f"over your quota ({plural(remaining, 'GPU')} left)"
            elif free < profile.gpus and queue:
                wait = "all busy: it will wait in line and start when GPUs free up"
            elif free < profile.gpus:
                blocked = "not enough free GPUs right now"
        checked = " checked" if profile.slug == default_slug and not blocked else ""
        note = f'<span class="trainhub-blocked text-danger"> — {escape(blocked)}</span>' if blocked else ""
        if wait:
            note = f'<span class="trainhub-wait text-warning"> — {escape(wait)}</span>'
        rows.append(
            f"""
  <label class="trainhub-profile list-group-item" data-profile="{escape(profile.slug)}">
    <input type="radio" name="profile" value="{escape(profile.slug)}"{checked}>
    <strong>{escape(profile.display_name)}</strong>
    <span class="trainhub-availability text-muted">{escape(availability_text(profile, free, total, simulated))}</span>{note}
    <div class="small text-muted">{escape(profile.description)}</div>
  </label>"""
        )
    if remaining is None:
        quota_line = f"You hold {plural(quota.held, 'GPU')}; no GPU quota applies to you."
    else:
        quota_line = f"Your GPU quota: {remaining} of {quota.limit if quota.limit is not None else '∞'} remaining (you hold {quota.held})."
        for g, info in quota.groups.items():
            quota_line += f" Group {escape(g)}: {info['held']} of {info['limit']} in use."
    return f"""
<div class="trainhub-spawn-form">
  <p class="trainhub-quota">{escape(quota_line)}</p>
  <div class="list-group">{''.join(rows)}
  </div>{WAIT_OPTION if queue else ""}
</div>
"""


WAIT_OPTION = """
  <div class="form-check mt-2">
    <input class="form-check-input" type="checkbox" name="wait" value="on" id="trainhub-wait" checked>
    <label class="form-check-label" for="trainhub-wait">If no GPU is free, wait in line (the page shows your place
    and an estimate; it starts by itself)</label>
  </div>"""
