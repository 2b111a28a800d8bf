"""`trainhub usage`: GPU-seconds allocated and actually used, per user, group, profile or day.

Talks to the usage API (``GET {api}/usage``, docs/usage.md) with
:class:`trainhub.client.TrainhubClient`: ``$TRAINHUB_API_URL`` and ``$JUPYTERHUB_API_TOKEN``
(set in platform terminals) or ``--url``/``--token``. Admins see everyone; users see themselves.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import date, timedelta

BY = ("user", "group", "profile", "day", "kind", "holder")


def add_parser(sub):
    p = sub.add_parser(
        "usage",
        help="GPU-seconds allocated and actually used (per user, group, profile or day)",
        description="Show GPU usage accounting: GPU-hours each notebook server and job held (allocated) and "
        "used (allocated time weighted by measured utilisation). Admins see everyone; other users see only "
        "their own figures. Works in platform terminals as is; elsewhere pass --url and --token.",
        epilog="Examples:\n  trainhub usage                      # last 30 days, by user\n"
        "  trainhub usage --since 7d --by day\n  trainhub usage --by group --format csv > usage.csv\n"
        "  trainhub usage --prometheus         # the Prometheus text (admins)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--since", metavar="WHEN", type=_day, help="first day: YYYY-MM-DD or N days back (7d); default 30 days")
    p.add_argument("--until", metavar="WHEN", type=_day, help="last day (default today)")
    p.add_argument("--by", choices=BY, default="user", help="group the figures by (default user)")
    p.add_argument("--user", metavar="NAME", help="only NAME's figures (admins)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format (default table)")
    p.add_argument("--prometheus", action="store_true", help="print the Prometheus metrics text instead (admins)")
    g = p.add_argument_group("connection")
    g.add_argument("--url", metavar="URL", help="trainhub API base URL (default: $TRAINHUB_API_URL)")
    g.add_argument("--token", metavar="TOKEN", help="JupyterHub API token (default: $JUPYTERHUB_API_TOKEN)")
    p.set_defaults(func=run)


def _day(text: str) -> str:
    text = text.strip()
    m = re.fullmatch(r"(\d+)d", text)
    if m:
        return (date.today() - timedelta(days=int(m.group(1)))).isoformat()
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD or a number of days like 7d, got {text!r}") from None


def fmt_hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def format_table(report: dict) -> str:
    by = report.get("by", "user")
    items = report.get("items") or []
    who = "everyone" if report.get("scope") == "all" else (report.get("user") or "you")
    head = f"GPU usage {report.get('since')} .. {report.get('until')} by {by} ({who})"
    if not items:
        return head + "\nno GPU usage recorded in this period"
    header = [by.upper(), "GPU-H ALLOC", "GPU-H USED", "UTIL %", "USERS"]
    rows = [[str(i.get(by)), fmt_hours(i["gpu_seconds_allocated"]), fmt_hours(i["gpu_seconds_used"]),
             "-" if i.get("utilization") is None else f"{i['utilization']:.0f}", str(i.get("users", ""))]
            for i in items]
    t = report.get("totals") or {}
    if t and len(items) > 1 and by != "group":  # by group a user counts in each of their groups
        rows.append(["TOTAL", fmt_hours(t.get("gpu_seconds_allocated", 0)), fmt_hours(t.get("gpu_seconds_used", 0)),
                     "-" if t.get("utilization") is None else f"{t['utilization']:.0f}", ""])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [head, "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    lines.append("UTIL % = used / measured GPU time; time the metrics source could not measure counts as allocated only.")
    return "\n".join(lines)


def run(args):
    from trainhub.commands.jobs import _api, client_from_args

    client = client_from_args(args)
    if args.prometheus:
        print(_api(client.usage_metrics), end="")
        return 0
    kw = dict(since=args.since, until=args.until, by=args.by, user=args.user)
    if args.format == "csv":
        print(_api(client.usage_csv, **kw), end="")
        return 0
    report = _api(client.usage, **kw)
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return 0
    print(format_table(report))
    return 0
