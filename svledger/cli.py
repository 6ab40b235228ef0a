"""The ``svledger`` command line: one subcommand per task over the ledger.

Each subcommand is one ``add_<name>(subparsers)`` function that calls
:func:`add_command` with its handler and declares its arguments, listed in
:data:`COMMANDS` in the order ``--help`` shows them. A handler takes the parsed
arguments and returns the exit code; it imports what it needs (Kafka, SQL) inside,
so a quick command such as ``svledger hash`` never loads them. A bad argument value
that only the handler can detect is reported by raising :class:`UsageError`: the
command prints it the way argparse prints its own errors and exits 2.

Results go to stdout. Logs go to stderr, as JSON lines by default (one object per
record: time, level, logger, message and any ``extra`` fields), because most
subcommands are long-running services whose logs are collected by machines;
``--log-format text`` suits a terminal.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

from ledger.hashing import storage_version_hash
from ledger.identity import apiserver_id

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS: Final = ("json", "text")
USAGE_ERROR: Final = 2

DESCRIPTION: Final = """\
svledger keeps an event-sourced ledger of Kubernetes storage versions.

API servers append heartbeats and the storage version of every resource they serve
to a Kafka log. Projections fold the log into SQL views (apiserver leases,
StorageVersions, StorageStates, migrations), and consumers act on them: they expire
leases of API servers that stopped heartbeating, and start a storage version
migration only once every live API server encodes a resource in the same version.
Every view can be rebuilt, exactly, by replaying the log.
"""

EPILOG: Final = """\
examples:
  svledger hash apps v1 Deployment     the storageVersionHash of apps/v1 Deployment
  svledger hash "" v1 Pod              the same for the core group ("" or core)
  svledger apiserver-id "$(hostname)"  the apiserver ID of this host

Run 'svledger COMMAND --help' for a command's options.
"""


class UsageError(Exception):
    """A command-line value is wrong; the message names it and says what to give instead."""


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per log record, with the record's ``extra`` fields as keys."""

    _STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((k, v) for k, v in vars(record).items() if k not in self._STANDARD)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_logging` installs; a marker so it replaces only its own."""


def configure_logging(level: str = "INFO", log_format: str = "json") -> None:
    """Send log records at ``level`` and above to stderr as JSON lines or plain text."""
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(
        JsonLinesFormatter()
        if log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def add_command(
    subparsers: Subparsers, name: str, handler: Handler, *, help: str, description: str
) -> argparse.ArgumentParser:
    """Register subcommand ``name``, run by ``handler``; returns its parser for arguments."""
    parser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=handler, command_parser=parser)
    return parser


def add_hash(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "hash",
        _hash,
        help="print the storageVersionHash of a group/version/kind",
        description=(
            "Print the storageVersionHash Kubernetes publishes in discovery for objects of\n"
            "KIND stored as GROUP/VERSION: base64 of the first 8 bytes of\n"
            "sha256('GROUP/VERSION/KIND'), with an empty group for the core group."
        ),
    )
    parser.add_argument("group", metavar="GROUP", help='API group; "" or core for the core group')
    parser.add_argument("version", metavar="VERSION", help="storage version, e.g. v1")
    parser.add_argument("kind", metavar="KIND", help="kind, e.g. Deployment")


def _hash(args: argparse.Namespace) -> int:
    try:
        print(storage_version_hash(args.group, args.version, args.kind))
    except ValueError as error:
        raise UsageError(str(error)) from error
    return 0


def add_apiserver_id(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "apiserver-id",
        _apiserver_id,
        help="print the apiserver ID Kubernetes derives from a hostname",
        description=(
            "Print the stable ID of the API server on HOSTNAME, as Kubernetes derives it:\n"
            "'apiserver-' + base32 of sha256 over the hostname and 'kube-apiserver'.\n"
            "It names the server's identity Lease in kube-system."
        ),
    )
    parser.add_argument("hostname", metavar="HOSTNAME", help="the API server's host name")


def _apiserver_id(args: argparse.Namespace) -> int:
    try:
        print(apiserver_id(args.hostname))
    except ValueError as error:
        raise UsageError(str(error)) from error
    return 0


COMMANDS: Final[tuple[Callable[[Subparsers], None], ...]] = (
    add_hash,
    add_apiserver_id,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``svledger`` argument parser with every subcommand of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="svledger",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"svledger {importlib.metadata.version('svledger')}"
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        help="lowest level of log records written to stderr (default: INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="json",
        help="json: one JSON object per line (default); text: for a terminal",
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help, --version or an argument argparse rejected
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    configure_logging(args.log_level, args.log_format)
    handler: Handler = args.handler
    try:
        return handler(args)
    except UsageError as error:
        command: argparse.ArgumentParser = args.command_parser
        command.print_usage(sys.stderr)
        print(f"{command.prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130
