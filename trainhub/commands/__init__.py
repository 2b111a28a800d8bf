"""Sub-commands of the `trainhub` CLI, one module each."""

from __future__ import annotations

import argparse

from trainhub.settings import DEFAULT_DATA_DIR, default_data_dir


def add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir", default=str(default_data_dir()), metavar="DIR",
        help=f"the platform's data directory (default: $TRAINHUB_DATA_DIR or {DEFAULT_DATA_DIR})",
    )
