from __future__ import annotations

import argparse

from trainhub.cli import CommandError
from trainhub.commands import add_data_dir


def port(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, not {n}")
    return n


def gpus(value: str) -> str:
    from trainhub.gpus import parse_gpus_flag

    try:
        return parse_gpus_flag(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub):
    p = sub.add_parser(
        "up",
        help="start the whole platform in the foreground",
        description="Start JupyterHub, its proxy and trainhub's services on this machine (the embedded back end). "
        "Prints the URL and how to log in; Ctrl-C stops everything it started.",
        epilog="Examples:\n  trainhub up\n  trainhub up --gpus 4            # 4 simulated GPUs when no NVIDIA driver is present\n"
        "  trainhub up --storage s3://team-bucket/trainhub   # endpoint/credentials from AWS_* variables",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ip", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; others print a warning without TLS)")
    p.add_argument("--port", type=port, default=8000, help="public port (default: 8000)")
    add_data_dir(p)
    p.add_argument("--gpus", type=gpus, default="auto",
                   help="'auto' (NVML devices if a driver is present, else none) or N (the first N real devices, or N simulated ones without a driver)")
    p.add_argument("--storage", default="", metavar="URL",
                   help="storage root: a local folder (default: DATA_DIR/storage) or s3://bucket/prefix (endpoint and keys from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the config file)")
    p.add_argument("--config", default="", metavar="FILE", help="a trainhub/JupyterHub traitlets config file (default: DATA_DIR/trainhub_config.py if present)")
    p.add_argument("--hub-port", type=port, default=0, help="internal hub port (default: a free port)")
    p.add_argument("--admin-user", default="admin", help="name of the admin account created on first start (default: admin)")
    p.add_argument("--ssl-cert", default="", metavar="FILE", help="TLS certificate for the public port")
    p.add_argument("--ssl-key", default="", metavar="FILE", help="TLS key for the public port")
    p.add_argument("--insecure", action="store_true", help="acknowledge plain HTTP on a non-loopback address (silences the warning)")
    p.add_argument("--quiet", action="store_true", help="keep JupyterHub's log in DATA_DIR/logs only")
    p.add_argument("--debug", action="store_true", help="debug logging")
    p.set_defaults(func=run)


def run(args):
    from trainhub.app.up import UpError, run as up

    if bool(args.ssl_cert) != bool(args.ssl_key):
        raise CommandError("--ssl-cert and --ssl-key go together", 2)
    try:
        return up(args)
    except (UpError, FileNotFoundError) as e:
        raise CommandError(str(e)) from None
