"""The `trainhub` command.

Each sub-command lives in its own module with ``add_parser(subparsers)``; this module
only assembles them, so later features (jobs, sweeps, data...) plug in without
touching the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from trainhub import __version__

# module -> it registers one top-level sub-command
COMMAND_MODULES = [
    "trainhub.commands.up",
    "trainhub.commands.token",
    "trainhub.commands.status",
    "trainhub.commands.users",
    "trainhub.commands.jobs",
    "trainhub.commands.sweeps",
    "trainhub.commands.data",
    "trainhub.commands.datasets",
    "trainhub.commands.models",
    "trainhub.commands.usage",
]


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """Bad flags: say what is wrong and how to get help (exit 2, as argparse does)."""
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\nRun '{self.prog} --help' for the options.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trainhub",
        description="trainhub: GPU notebooks, %%train jobs and sweeps on JupyterHub. "
        "Start the platform with `trainhub up`, then open the printed URL.",
        epilog="Run `trainhub COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"trainhub {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that feature is not installed
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `trainhub ... | head`: the reader has gone; say nothing more (no traceback, no flush error at exit)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "data":  # a command with its own parser
        from trainhub.commands import data

        return data.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    db_log = logging.getLogger("trainhub.db")
    db_log.addFilter(_not_damaged_database)  # printed below, once
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130
    except CommandError as e:
        print(f"trainhub {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except Exception as e:
        damaged = damaged_database(e, getattr(args, "data_dir", None))
        if damaged is None:
            raise
        print(f"trainhub {args.command}: error: {damaged}", file=sys.stderr)
        return 1
    finally:
        db_log.removeFilter(_not_damaged_database)


def _not_damaged_database(record: logging.LogRecord) -> bool:
    """init_db logs a damaged database for the services' logs; the CLI prints it as its error instead."""
    return not getattr(record, "database_damaged", False)


def damaged_database(error: Exception, data_dir: str | None):
    """``error`` as ``trainhub.db.DatabaseDamaged`` (which names the file and how to restore it) if it is about a
    damaged database file, else None. A driver's error that does not say which file (a database opened by other
    means, such as the hub's by ``trainhub users add``) is matched to the data dir's databases by reading them."""
    if not any(m in sys.modules for m in ("sqlite3", "trainhub.db")):
        return None  # no database was opened
    from trainhub.db import DatabaseDamaged, find_damaged, is_damaged
    from trainhub.settings import DataDir, default_data_dir

    if isinstance(error, DatabaseDamaged):
        return error
    if not is_damaged(error):
        return None
    dd = DataDir(data_dir or default_data_dir())
    return find_damaged([dd.platform_db, dd.hub_db_url.removeprefix("sqlite:///")]) or DatabaseDamaged("", error)


class CommandError(Exception):
    """A failure the user can act on: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


if __name__ == "__main__":
    # `python -m trainhub.cli`: run the imported module's main, so that the CommandError the
    # commands raise (trainhub.cli.CommandError) is the class main() catches
    from trainhub.cli import main as _main

    sys.exit(_main())
