"""`trainhub datasets`: the dataset registry (list, search, show, register, deprecate).

Talks to ``{api}/datasets`` (docs/storage.md) with :class:`trainhub.client.TrainhubClient`:
``$TRAINHUB_API_URL`` and ``$JUPYTERHUB_API_TOKEN`` (set in platform terminals) or
``--url``/``--token``.
"""

from __future__ import annotations

import argparse
import json
import sys

from trainhub.cli import CommandError
from trainhub.fmt import clip, fmt_size, plural, text_table
from trainhub.states import FAILED, PENDING, READY


def _connection(p):
    g = p.add_argument_group("connection")
    g.add_argument("--url", metavar="URL", help="trainhub API base URL (default: $TRAINHUB_API_URL)")
    g.add_argument("--token", metavar="TOKEN", help="JupyterHub API token (default: $JUPYTERHUB_API_TOKEN)")


def add_parser(sub):
    p = sub.add_parser("datasets", help="the dataset registry: named, versioned storage prefixes",
                       description="List, search, show, register and deprecate datasets. Every user sees the same "
                       "registry; owners and admins register versions and deprecate them. Versions are immutable.",
                       epilog="Examples:\n  trainhub datasets list\n  trainhub datasets list --search mnist\n"
                       "  trainhub datasets show mnist\n"
                       "  trainhub datasets register mnist datasets/mnist --format shards --description 'MNIST'\n"
                       "  trainhub datasets deprecate mnist 1 --message 'labels fixed in v2'",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="action", metavar="ACTION")
    ls = s.add_parser("list", help="list or search datasets")
    ls.add_argument("--search", "-q", default="", help="substring of the name or description")
    ls.add_argument("--json", action="store_true", help="print JSON")
    _connection(ls)
    ls.set_defaults(func=run_list)
    sh = s.add_parser("show", help="one dataset and its versions, or one version")
    sh.add_argument("name")
    sh.add_argument("version", nargs="?", help="a version number or 'latest' (default: all versions)")
    sh.add_argument("--json", action="store_true", help="print JSON")
    _connection(sh)
    sh.set_defaults(func=run_show)
    rg = s.add_parser("register", help="register a new version pointing at a storage path")
    rg.add_argument("name")
    rg.add_argument("path", help="storage path: datasets/... or users/<you>/...")
    rg.add_argument("--format", default="", help="data format, e.g. shards, parquet, images")
    rg.add_argument("--description", default="")
    rg.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata (repeatable)")
    rg.add_argument("--no-wait", action="store_true", help="do not wait for the size/count scan")
    rg.add_argument("--json", action="store_true", help="print JSON")
    _connection(rg)
    rg.set_defaults(func=run_register)
    dp = s.add_parser("deprecate", help="mark a version deprecated (owner or admin)")
    dp.add_argument("name")
    dp.add_argument("version")
    dp.add_argument("--message", default="", help="why, and what to use instead")
    dp.add_argument("--undo", action="store_true", help="remove the deprecation")
    _connection(dp)
    dp.set_defaults(func=run_deprecate)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _client(args):
    from trainhub.commands.jobs import client_from_args

    return client_from_args(args)


def _api(call, *a, **kw):
    from trainhub.commands.jobs import _api as api

    return api(call, *a, **kw)


def version_line(v: dict) -> str:
    state = v["status"] if v["status"] != READY else f"{plural(v['file_count'], 'file')}, {fmt_size(v['size'])}"
    dep = f"  DEPRECATED: {v.get('deprecation_message') or ''}" if v.get("deprecated") else ""
    return f"v{v['version']}  {state}  {v.get('format') or '-'}  {v['url']}  {v['created'][:19]}  {v['created_by']}{dep}"


def run_list(args):
    body = _api(_client(args).list_datasets, args.search)
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    if not body["items"]:
        print("no datasets" + (f" matching {args.search!r}" if args.search else ""))
        return 0
    rows = []
    for d in body["items"]:
        lv = d.get("latest") or {}
        rows.append([d["name"], f"v{lv.get('version', '-')}", str(len(d["versions"])), str(lv.get("file_count", "")),
                     fmt_size(lv.get("size", 0)), lv.get("format") or "-", d["owner"],
                     "deprecated" if d["deprecated"] else "", clip(d.get("description"), 50)])
    print(text_table(rows, ["NAME", "LATEST", "VERSIONS", "FILES", "SIZE", "FORMAT", "OWNER", "", "DESCRIPTION"]))
    return 0


def run_show(args):
    c = _client(args)
    if args.version:
        v = _api(c.dataset, args.name, args.version)
        print(json.dumps(v, indent=2) if args.json else version_line(v))
        return 0
    d = _api(c.get_dataset, args.name)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"{d['name']}  owner {d['owner']}  {d.get('description') or ''}")
    for v in d.get("items", []):
        print("  " + version_line(v))
    return 0


def run_register(args):
    meta = {}
    for item in args.meta:
        k, sep, v = item.partition("=")
        if not sep:
            raise CommandError(f"--meta expects KEY=VALUE, got {item!r}", 2)
        meta[k] = v
    c = _client(args)

    def progress(v):
        p = v.get("progress") or {}
        print(f"\rscanning: {plural(p.get('files', 0), 'file')}, {fmt_size(p.get('bytes', 0))}", end="", file=sys.stderr, flush=True)

    v = _api(c.register_dataset, args.name, args.path, format=args.format, description=args.description, metadata=meta,
             wait=not args.no_wait, callback=progress)
    if v.get("status") == PENDING and not args.no_wait:
        print(file=sys.stderr)
    if v.get("status") == FAILED:
        raise CommandError(f"{args.name} v{v['version']}: {v.get('error')}")
    print(json.dumps(v, indent=2) if args.json else f"registered {v['name']} " + version_line(v))
    return 0


def run_deprecate(args):
    v = _api(_client(args).deprecate_dataset, args.name, args.version, args.message, not args.undo)
    print(("deprecated " if v["deprecated"] else "undeprecated ") + f"{v['name']} v{v['version']}")
    return 0
