"""`trainhub data ...`: delegated whole to trainhub.data.cli, which owns its options."""

from __future__ import annotations

import argparse



def add_parser(sub):
    from trainhub.data.cli import build_parser

    inner = build_parser()
    p = sub.add_parser("data", help="pack many small files into shards, inspect packed data",
                       description=inner.description, epilog=inner.epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=lambda args: main([]))


def main(argv) -> int:
    from trainhub.data.cli import main as data_main

    return data_main(list(argv) or ["--help"])
