from __future__ import annotations

import re

from trainhub.cli import CommandError
from trainhub.commands import add_data_dir


def add_parser(sub):
    p = sub.add_parser(
        "token",
        help="print a JupyterHub API token for a user (creating the user if needed)",
        description="Print a new JupyterHub API token for user NAME, creating the user if needed. "
        "Uses the CLI credentials kept in the data dir, so it works for whoever can read that directory. "
        "Scripts use the token as 'Authorization: token ...' against the hub and trainhub APIs.",
    )
    p.add_argument("name", metavar="NAME", help="user name")
    p.add_argument("--admin", action="store_true", help="make the user an admin")
    p.add_argument("--group", action="append", default=[], metavar="GROUP", help="also add the user to GROUP (repeatable)")
    p.add_argument("--expires-in", type=int, default=0, metavar="SECONDS", help="token lifetime (default: no expiry)")
    p.add_argument("--note", default="trainhub token", help="note stored with the token")
    add_data_dir(p)
    p.set_defaults(func=run)


def run(args):
    from trainhub.hubapi import HubClient, HubError

    if not re.match(r"^[A-Za-z0-9._@-]{1,255}$", args.name):
        raise CommandError(f"{args.name!r} is not a valid user name (letters, digits, . _ @ -)", 2)
    try:
        hub = HubClient(args.data_dir)
        hub.ensure_user(args.name, admin=args.admin)
        for g in args.group:
            hub.add_to_group(args.name, g)
        print(hub.new_token(args.name, note=args.note, expires_in=args.expires_in or None))
    except (HubError, FileNotFoundError) as e:
        raise CommandError(str(e)) from None
