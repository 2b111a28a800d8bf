from __future__ import annotations

import secrets

from trainhub.cli import CommandError
from trainhub.commands import add_data_dir


def add_parser(sub):
    p = sub.add_parser(
        "users",
        help="add users with passwords, list users",
        description="Manage the embedded platform's users (NativeAuthenticator logins). "
        "Users can also sign up at /hub/signup and be authorized by an admin at /hub/authorize.",
    )
    s = p.add_subparsers(dest="users_command", metavar="ACTION")
    a = s.add_parser("add", help="create a user with a password", description="Create (or reset) a login. Prints the password when generated.")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--password", default="", help="password (default: generate one and print it)")
    a.add_argument("--admin", action="store_true", help="make the user an admin")
    a.add_argument("--group", action="append", default=[], metavar="GROUP", help="add to GROUP (repeatable)")
    add_data_dir(a)
    a.set_defaults(func=add)
    ls = s.add_parser("list", help="list users, their groups and servers")
    add_data_dir(ls)
    ls.set_defaults(func=list_users)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def add(args):
    from trainhub.hubapi import HubClient, HubError, set_native_password

    password = args.password or secrets.token_urlsafe(12)
    if len(password) < 8:
        raise CommandError("passwords need at least 8 characters", 2)
    try:
        hub = HubClient(args.data_dir)
        hub.ensure_user(args.name, admin=args.admin)
        for g in args.group:
            hub.add_to_group(args.name, g)
        set_native_password(args.data_dir, args.name, password)
    except (HubError, FileNotFoundError) as e:
        raise CommandError(str(e)) from None
    print(f"user {args.name} can log in" + ("" if args.password else f" with password: {password}"))


def list_users(args):
    from trainhub.hubapi import HubClient, HubError

    try:
        users = HubClient(args.data_dir).request("GET", "/users")
    except (HubError, FileNotFoundError) as e:
        raise CommandError(str(e)) from None
    print(f"{'USER':20} {'ADMIN':6} {'GROUPS':20} SERVER")
    for u in users:
        server = "running" if u.get("server") else ("pending" if u.get("pending") else "-")
        print(f"{u['name']:20} {'yes' if u.get('admin') else '':6} {','.join(u.get('groups', [])):20} {server}")
