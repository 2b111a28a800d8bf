"""`trainhub models`: the model registry (list, show, register from a job, stage, export).

Talks to ``{api}/models`` (docs/storage.md) with :class:`trainhub.client.TrainhubClient`:
``$TRAINHUB_API_URL`` and ``$JUPYTERHUB_API_TOKEN`` (set in platform terminals) or
``--url``/``--token``.
"""

from __future__ import annotations

import argparse
import json

from trainhub.commands.datasets import _api, _client, _connection
from trainhub.fmt import clip, fmt_size, plural, text_table

STAGES = ("none", "staging", "production", "archived")


def add_parser(sub):
    p = sub.add_parser("models", help="the model registry: versions from job outputs, stages, export",
                       description="Register a finished job's outputs as a model version (files copied immutably, "
                       "metrics, params and lineage recorded), move versions between stages (audited) and export a "
                       "version as a bundle for a serving system.",
                       epilog="Examples:\n  trainhub models register resnet --job j-000042 --dataset imagenet:3\n"
                       "  trainhub models list\n  trainhub models show resnet 2\n"
                       "  trainhub models stage resnet 2 production --comment 'beats v1 by 2%'\n"
                       "  trainhub models export resnet production -o .",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="action", metavar="ACTION")
    ls = s.add_parser("list", help="list or search models")
    ls.add_argument("--search", "-q", default="")
    ls.add_argument("--stage", choices=STAGES[1:], help="only models with a version in this stage")
    ls.add_argument("--json", action="store_true")
    _connection(ls)
    ls.set_defaults(func=run_list)
    sh = s.add_parser("show", help="a model's versions, or one version (number, 'latest' or a stage)")
    sh.add_argument("name")
    sh.add_argument("version", nargs="?")
    sh.add_argument("--json", action="store_true")
    _connection(sh)
    sh.set_defaults(func=run_show)
    rg = s.add_parser("register", help="register a finished job's outputs as the next version")
    rg.add_argument("name")
    rg.add_argument("--job", help="job id (j-000042); its outputs are copied")
    rg.add_argument("--path", help="with --job: a sub-folder of the outputs; without: a storage path in your area")
    rg.add_argument("--description", default="")
    rg.add_argument("--metric", action="append", default=[], metavar="KEY=NUMBER", help="extra metric (repeatable)")
    rg.add_argument("--dataset", action="append", default=[], metavar="NAME[:VERSION]", help="dataset lineage (repeatable)")
    rg.add_argument("--stage", choices=STAGES)
    rg.add_argument("--json", action="store_true")
    _connection(rg)
    rg.set_defaults(func=run_register)
    st = s.add_parser("stage", help="move a version to another stage (owner or admin; audited)")
    st.add_argument("name")
    st.add_argument("version")
    st.add_argument("stage", choices=STAGES)
    st.add_argument("--comment", default="")
    st.add_argument("--exclusive", action="store_true", help="archive the versions now in that stage")
    _connection(st)
    st.set_defaults(func=run_stage)
    ex = s.add_parser("export", help="download a version as a bundle (tar.gz with MANIFEST.json)")
    ex.add_argument("name")
    ex.add_argument("version")
    ex.add_argument("-o", "--output", default=".", help="file or folder (default: current folder)")
    _connection(ex)
    ex.set_defaults(func=run_export)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _metrics(v: dict) -> str:
    return " ".join(f"{k}={x:.4g}" if isinstance(x, (int, float)) else f"{k}={x}" for k, x in (v.get("metrics") or {}).items())


def version_line(v: dict) -> str:
    lin = v.get("lineage") or {}
    src = f"job {lin['job']}" if lin.get("job") else v.get("source_url", "")
    if lin.get("sweep") is not None:
        src += f" (sweep {lin['sweep']})"
    ds = ", ".join(f"{d['name']}:{d['version']}" for d in lin.get("datasets", []))
    return (f"v{v['version']}  {v['stage']:<10}  {v['status']}  {plural(len(v.get('files', [])), 'file')} {fmt_size(v.get('size', 0))}"
            f"  {src}{'  data ' + ds if ds else ''}  {_metrics(v)}")


def run_list(args):
    body = _api(_client(args).list_models, args.search, stage=args.stage)
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    if not body["items"]:
        print("no models")
        return 0
    rows = [[m["name"], str(len(m["versions"])), " ".join(f"{s}:v{','.join(map(str, vs))}" for s, vs in m["stages"].items()) or "-",
             m["owner"], clip(_metrics(m.get("latest") or {}), 60)] for m in body["items"]]
    print(text_table(rows, ["NAME", "VERSIONS", "STAGES", "OWNER", "LATEST METRICS"]))
    return 0


def run_show(args):
    c = _client(args)
    if args.version:
        v = _api(c.model_version, args.name, args.version)
        if args.json:
            print(json.dumps(v, indent=2))
            return 0
        print(version_line(v))
        print(f"  files at {v['url']}/files/")
        for e in v.get("stage_history", []):
            print(f"  {e['time'][:19]}  {e['user']}: {e['from']} -> {e['to']}  {e['comment']}")
        return 0
    m = _api(c.get_model, args.name)
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    print(f"{m['name']}  owner {m['owner']}  {m.get('description') or ''}")
    for v in m.get("items", []):
        print("  " + version_line(v))
    return 0


def run_register(args):
    from trainhub.cli import CommandError

    metrics = {}
    for item in args.metric:
        k, sep, val = item.partition("=")
        try:
            metrics[k] = float(val)
        except ValueError:
            raise CommandError(f"--metric expects KEY=NUMBER, got {item!r}", 2) from None
    if not args.job and not args.path:
        raise CommandError("give --job (a finished job of yours) or --path (a storage path in your area)", 2)
    v = _api(_client(args).register_model, args.name, args.job, path=args.path, description=args.description,
             metrics=metrics or None, datasets=args.dataset, stage=args.stage)
    print(json.dumps(v, indent=2) if args.json else f"registered {v['name']} " + version_line(v))
    return 0


def run_stage(args):
    v = _api(_client(args).set_model_stage, args.name, args.version, args.stage, args.comment, args.exclusive)
    print(f"{v['name']} v{v['version']} is now {v['stage']}")
    return 0


def run_export(args):
    path = _api(_client(args).export_model, args.name, args.version, args.output)
    print(path)
    return 0
