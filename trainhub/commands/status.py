from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from trainhub.cli import CommandError
from trainhub.commands import add_data_dir
from trainhub.fmt import as_utc


def add_parser(sub):
    p = sub.add_parser(
        "status",
        help="show the GPU pool: each device, who holds it, since when",
        description="Show the GPU pool from the ledger: each device, its holder (a notebook server or a job), the user, since when. "
        "Reads the data dir directly, so it works while the platform is stopped too.",
    )
    add_data_dir(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _ago(since: datetime) -> str:
    s = int((datetime.now(timezone.utc) - as_utc(since)).total_seconds())
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def run(args):
    from trainhub.config import load_platform_config
    from trainhub.ledger import LocalGPUAllocator

    try:
        allocator = LocalGPUAllocator(config=load_platform_config(args.data_dir))
        allocator.devices()
    except (FileNotFoundError, PermissionError) as e:
        if os.environ.get("JUPYTERHUB_SERVICE_PREFIX"):
            # inside a user's server: the data dir is the platform's (closed to users), not this server's
            raise CommandError(
                "`trainhub status` reads the platform's data dir on the host (run it there, as the platform's "
                "owner); in a notebook server see your own GPUs and work with `trainhub usage` and "
                "`trainhub jobs list`, and why a job waits with `trainhub jobs why ID`") from None
        raise CommandError(str(e)) from None
    devices = allocator.devices()
    held = {h.device: h for h in allocator.holdings()}
    rows = []
    for d in devices:
        h = held.get(d.index)
        rows.append({
            "device": d.index, "name": d.name, "simulated": d.simulated, "uuid": d.uuid,
            "holder": h.holder if h else None, "kind": h.kind if h else None, "user": h.user if h else None,
            "profile": h.profile if h else None,
            "since": (h.since.replace(tzinfo=h.since.tzinfo or timezone.utc).isoformat() if h else None),
        })
    if args.json:
        print(json.dumps({"devices": rows, "free": sum(r["holder"] is None for r in rows), "total": len(rows)}, indent=2))
        return 0
    if not devices:
        print("GPU pool: no devices (no NVIDIA driver found; start with --gpus N to simulate N devices)")
        return 0
    free = sum(r["holder"] is None for r in rows)
    print(f"GPU pool: {free} of {len(rows)} free" + (" (simulated devices)" if any(d.simulated for d in devices) else ""))
    print(f"{'GPU':4} {'NAME':24} {'HOLDER':24} {'USER':14} {'PROFILE':10} SINCE")
    for r, d in zip(rows, devices):
        name = d.name + (" (sim)" if d.simulated else "")
        if r["holder"]:
            h = held[d.index]
            print(f"{d.index:<4} {name:24} {r['holder']:24} {r['user']:14} {r['profile'] or '-':10} {h.since:%Y-%m-%d %H:%M:%S} ({_ago(h.since)})")
        else:
            print(f"{d.index:<4} {name:24} {'free':24} {'-':14} {'-':10} -")
    return 0
