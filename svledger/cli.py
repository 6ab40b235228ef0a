"""The ``svledger`` command line: one subcommand per task over the ledger.

The subcommands live in :mod:`svledger.commands`, one module per family (the log and
its views, the reactors, operator actions, the simulation, pure look-ups); what they
share is in :mod:`svledger.options`. Errors map to exit codes by their base class
(:mod:`ledger.errors`): a :class:`~ledger.errors.UsageError` prints the command's
usage and the message and exits 2, an :class:`~ledger.errors.Unavailable` prints the
message (what could not be reached and what to check) and exits 69. So does an
:class:`~ledger.errors.AccessDenied`, a kind of it; when Kafka's ACLs refused the
command, the message ends with how to grant the command's role (:func:`acl_remedy`).

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
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

from ledger.errors import AccessDenied, Unavailable, UsageError
from ledger.logcontext import ClusterField
from svledger.commands import COMMANDS
from svledger.options import (
    Handler,
    StoppedEarly,
    acl_remedy,
    add_logging_options,
    stop_early_on_signals,
)

log = logging.getLogger(__name__)

USAGE_ERROR: Final = 2
UNAVAILABLE: Final = 69  # EX_UNAVAILABLE: a service the command needs cannot be reached

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


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per log record, with the record's ``extra`` fields as keys."""

    # ``cluster_tag`` is the text formats' rendering of ``cluster`` (ledger.logcontext).
    _STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {
        "message",
        "asctime",
        "cluster_tag",
    }

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


class LibraryRepeats(logging.Filter):
    """Lets each message of a client library through once per ``window`` seconds.

    While a broker cannot be reached, aiokafka logs an error at every retry of every
    connection, hundreds a second; svledger's own warning already says what is wrong
    and what to check. A message is told by its logger and its format string (so the
    node or error in it may vary); the first one after a quiet window says how many
    like it were held back.
    """

    def __init__(self, prefixes: tuple[str, ...] = ("aiokafka",), window: float = 10.0) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.window = window
        self._shown: dict[tuple[str, object], tuple[float, int]] = {}  # when, held back since

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        key = (record.name, record.msg)
        shown = self._shown.get(key)
        if shown is not None and record.created - shown[0] < self.window:
            self._shown[key] = (shown[0], shown[1] + 1)
            return False
        self._shown[key] = (record.created, 0)
        if shown is not None and shown[1]:
            record.msg = f"{record.msg} ({shown[1]} more like it held back)"
        return True


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_logging` installs; a marker so it replaces only its own."""


def configure_logging(level: str = "INFO", log_format: str = "json") -> None:
    """Send log records at ``level`` and above to stderr as JSON lines or plain text,
    a client library's repeated messages thinned (:class:`LibraryRepeats`), each tagged
    with the cluster it is about, if any (:mod:`ledger.logcontext`)."""
    handler = _StderrHandler(sys.stderr)
    handler.addFilter(LibraryRepeats())
    handler.addFilter(ClusterField())
    handler.setFormatter(
        JsonLinesFormatter()
        if log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(cluster_tag)s%(message)s")
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Alembic narrates every migration check at INFO; only a debugging user wants that.
    logging.getLogger("alembic").setLevel(level if level == "DEBUG" else "WARNING")


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
    add_logging_options(parser)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # told by the subcommand, whose usage shows what it takes
            command_parser: argparse.ArgumentParser = getattr(args, "command_parser", parser)
            command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as stop:  # --help, --version or an argument argparse rejected
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    configure_logging(args.log_level, args.log_format)
    handler: Handler = args.handler
    try:
        if getattr(args, "long_running", False):
            stop_early_on_signals()
        return handler(args)
    except StoppedEarly as stopped:
        log.info("%s as it started: stopped", stopped)
        return 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Its reader left (`svledger explain ... | head`): say nothing more, as a shell
        # tool does, and let nothing flush into the closed pipe at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    except UsageError as error:
        command: argparse.ArgumentParser = args.command_parser
        command.print_usage(sys.stderr)
        print(f"{command.prog}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except Unavailable as error:
        # The message says what could not be reached and what to check; no traceback.
        print(f"svledger: error: {_explained(error, args)}", file=sys.stderr, flush=True)
        if error.leaves_a_thread_waiting:
            logging.shutdown()
            os._exit(UNAVAILABLE)
        return UNAVAILABLE


def _explained(error: Unavailable, args: argparse.Namespace) -> str:
    """The message of ``error``; for an ACL's refusal, how to grant the command's role."""
    if not isinstance(error, AccessDenied) or getattr(args, "kafka_role", None) is None:
        return str(error)
    from ledger.kafka import NotAuthorized  # loaded already: the command talked to Kafka

    if not isinstance(error, NotAuthorized):
        return str(error)
    return f"{error.refused}; {acl_remedy(args, error)}"
