"""``trainhub data ...`` command line: ``main(argv)`` returns an exit status.

Examples::

    trainhub data pack ./images s3://datasets/images-shards --shard-size 256MB
    trainhub data info s3://datasets/images-shards
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .exceptions import DataError

EPILOG = """\
storage options:
  S3-compatible stores take fsspec/s3fs options as JSON, e.g.
    --storage-options '{"endpoint_url": "http://127.0.0.1:9000", "key": "AK", "secret": "SK"}'
  Without --storage-options, $TRAINHUB_STORAGE_OPTIONS (the same JSON) is used for remote URLs.
"""


def build_parser(prog: str = "trainhub data") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Pack many small files into tar shards and inspect shard folders\n"
                    "(local folders or fsspec URLs such as s3://bucket/prefix).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "pack",
        help="pack a folder/prefix of files into WebDataset-style tar shards",
        description="Pack every file under SRC into tar shards shard-000000.tar, ... under DST,\n"
                    "grouping files that share a key (cat001.jpg + cat001.json -> one sample),\n"
                    "and write DST/index.json. The same input always gives the same shards.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="source folder or URL, e.g. ./images or s3://raw/images")
    p.add_argument("dst", metavar="DST", help="destination folder or URL (must not be inside SRC)")
    p.add_argument("--shard-size", default="256MB",
                   help="target shard size: bytes or with a unit (500KB, 256MB, 1GiB); default %(default)s")
    p.add_argument("--samples-per-shard", type=int, default=None, metavar="N",
                   help="also cap each shard at N samples (default: no cap)")
    p.add_argument("--storage-options", type=_json_object, default=None, metavar="JSON",
                   help="fsspec storage options as a JSON object (applies to SRC and DST)")
    p.add_argument("--workers", type=int, default=16, help="reader threads for local/sync filesystems (default %(default)s)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="do not show a progress bar")

    i = sub.add_parser("info", help="summarise a packed shard folder from its index.json",
                       description="Print the shard count, sample count and size recorded in URL/index.json.")
    i.add_argument("url", metavar="URL", help="a folder written by `pack`")
    i.add_argument("--storage-options", type=_json_object, default=None, metavar="JSON",
                   help="fsspec storage options as a JSON object")
    i.add_argument("--json", action="store_true", help="print the whole index as JSON")
    return parser


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"endpoint_url\": \"http://host:9000\"}'")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run ``trainhub data`` with ``argv`` (without the program name); return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.command == "pack":
            from .packing import pack

            shards = pack(args.src, args.dst, shard_size=args.shard_size, samples_per_shard=args.samples_per_shard,
                          storage_options=args.storage_options, progress=args.progress, workers=args.workers)
            print(f"wrote {len(shards)} shard(s) and index.json to {args.dst}")
        elif args.command == "info":
            from .reader import ShardReader

            reader = ShardReader(args.url, storage_options=args.storage_options, prefetch=0)
            index = reader.index
            if args.json:
                print(json.dumps(index, indent=1))
            else:
                print(f"{args.url}: {len(index['shards'])} shard(s), {index['total_samples']} samples, "
                      f"{index['total_bytes'] / 2**20:.1f} MiB; fields: "
                      + ", ".join(f"{k} ({v})" for k, v in index.get("extensions", {}).items()))
    except (DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
