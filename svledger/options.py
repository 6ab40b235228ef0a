"""What the subcommands share: registering one, and the options for Kafka and the database.

A subcommand is an ``add_<name>(subparsers)`` function that calls :func:`add_command`
with its handler. A handler takes the parsed arguments and returns the exit code; it
imports what it needs (Kafka, SQL) inside, so a quick command such as ``svledger hash``
never loads them. A value only the handler can check is refused by raising
:class:`ledger.errors.UsageError`; the command line prints it as argparse prints its
own errors.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import math
import os
import shlex
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from ledger.errors import UsageError
from ledger.names import parse_group

if TYPE_CHECKING:
    from ledger.kafka import NotAuthorized
    from ledger.settings import KafkaSettings
    from projections.snapshots import SnapshotSource

log = logging.getLogger(__name__)

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DEFAULT_DB: Final = "sqlite:///svledger.db"


LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS: Final = ("json", "text")


def add_logging_options(parser: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """``--log-level`` and ``--log-format``: on ``svledger`` itself with their defaults, and
    on every subcommand without (``defaults=False``), so that they may stand before or
    after the subcommand: one given after it wins, one not given there leaves the value
    given before it (or the default) as it is."""

    def default(value: str) -> str:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=default("INFO"),
        help="lowest level of log records written to stderr (default: INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default("json"),
        help="json: one JSON object per line (default); text: for a terminal",
    )


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
    add_logging_options(parser, defaults=False)
    return parser


def add_kafka_options(parser: argparse.ArgumentParser, role: str | None) -> None:
    """``--bootstrap`` and ``--topic``; ``role`` is the command's role in Kafka's ACLs.

    The roles are those of ``deploy/kafka/acls.py`` (None: a development command
    with no role of its own); a command refused by an ACL names the role to grant.
    """
    parser.set_defaults(kafka_role=role)
    group = parser.add_argument_group(
        "Kafka", "also from SVLEDGER_KAFKA_* variables (security: SASL/SSL, see docs/production.md)"
    )
    group.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,...]",
        type=bootstrap,
        help="Kafka bootstrap servers (default: $SVLEDGER_KAFKA_BOOTSTRAP or localhost:9092)",
    )
    group.add_argument(
        "--topic",
        type=non_empty("topic name"),
        help="the events topic (default: $SVLEDGER_TOPIC or svledger.events)",
    )


def bootstrap(text: str) -> str:
    """An argparse type: a comma-separated list of Kafka ``host:port``."""
    from ledger.settings import bootstrap_addresses

    try:
        bootstrap_addresses(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; give host:port[,host:port...]") from None
    return text


class EnvironmentDefault(str):
    """An option's default read from an environment variable (:func:`from_environment`)."""

    variable: str


def from_environment(variable: str, fallback: str | None = None) -> str | None:
    """The default of an option: ``variable``'s value if it is set, else ``fallback``. An
    empty variable counts as unset, as for the Kafka settings (:mod:`ledger.settings`).

    argparse checks a default with the option's type as if it were given, and reports a
    refusal against the option; a type made with :func:`_naming_variable` then also
    says that the value came from ``variable``, which the user may not know is set.
    """
    value = os.environ.get(variable)
    if not value:
        return fallback
    default = EnvironmentDefault(value)
    default.variable = variable
    return default


_Parsed = TypeVar("_Parsed")


def _naming_variable(parse: Callable[[str], _Parsed]) -> Callable[[str], _Parsed]:
    """``parse``, an argparse type, refusing a :class:`EnvironmentDefault` by name (and
    given a plain string, so no value it returns carries the mark on)."""

    @functools.wraps(parse)
    def checked(text: str) -> _Parsed:
        try:
            return parse(str(text))
        except argparse.ArgumentTypeError as error:
            if not isinstance(text, EnvironmentDefault):
                raise
            raise argparse.ArgumentTypeError(
                f"{error} (the value of ${text.variable}, which applies when the option is"
                " not given)"
            ) from None

    return checked


def non_empty(what: str) -> Callable[[str], str]:
    """An argparse type: any text but an empty one."""

    @_naming_variable
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}: give one")
        return text

    return parse


def add_cluster_option(parser: argparse.ArgumentParser, help: str, *, required: bool) -> None:
    """``--cluster NAME``: a cluster's name in the ledger (its events' key), never empty."""
    parser.add_argument("--cluster", required=required, type=non_empty("cluster name"), help=help)


def add_resource_argument(parser: argparse.ArgumentParser) -> None:
    """``RESOURCE`` as the commands that look one resource up take it."""
    parser.add_argument(
        "resource",
        metavar="RESOURCE",
        type=non_empty("resource"),
        help="e.g. apps.deployments or core.pods",
    )


def acl_remedy(args: argparse.Namespace, refused: NotAuthorized) -> str:
    """How to grant what ``refused`` lacks: the ACL script for the command's role."""
    role: str = args.kafka_role
    command = ["python", "deploy/kafka/acls.py", "--role", role]
    command += ["--principal", refused.principal or "PRINCIPAL", "--topic", refused.topic]
    if getattr(args, "cluster", None) and role in ("worker", "collector"):
        command += ["--cluster", args.cluster]
    prog: str = args.command_parser.prog
    return (
        f"`{prog}` runs as role {role}: grant it with {shlex.join(command)} "
        "(see docs/production.md, Security)"
    )


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        type=database_url,
        default=from_environment("SVLEDGER_DATABASE_URL", DEFAULT_DB),
        help=(
            "SQLAlchemy URL of the projection database, e.g. sqlite:///svledger.db or "
            "postgresql://user:pass@host/db (default: $SVLEDGER_DATABASE_URL or "
            f"{DEFAULT_DB})"
        ),
    )


def add_snapshots_option(parser: argparse.ArgumentParser) -> None:
    """``--snapshots-from``: for a consumer that keeps a fold per partition."""
    parser.add_argument(
        "--snapshots-from",
        metavar="URL",
        type=database_url,
        default=from_environment("SVLEDGER_SNAPSHOTS_FROM"),
        help=(
            "the projector's database: rebuild each assigned partition's fold from its\n"
            "latest fold snapshot there, reading the log on from it instead of from its\n"
            "beginning (the same state). Unreachable, or no snapshot: from the beginning\n"
            "(default: $SVLEDGER_SNAPSHOTS_FROM, else none)"
        ),
    )


def snapshot_source(args: argparse.Namespace) -> SnapshotSource | None:
    """Where ``--snapshots-from`` says to start partitions' folds from, if anywhere."""
    if args.snapshots_from is None:
        return None
    from projections.projector import DEFAULT_PROJECTION
    from projections.snapshots import SnapshotSource

    return SnapshotSource(args.snapshots_from, DEFAULT_PROJECTION)


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    from ledger.settings import KafkaSettings

    overrides: dict[str, Any] = {}
    if args.bootstrap is not None:
        overrides["bootstrap_servers"] = args.bootstrap
    if args.topic is not None:
        overrides["topic"] = args.topic
    return KafkaSettings.from_env(**overrides)


def add_metrics_option(parser: argparse.ArgumentParser) -> None:
    """``--metrics-address HOST:PORT`` for a long-running command; hand the parsed
    ``args.metrics_address`` to :func:`run_until_signalled`. Marks the command as one
    (``args.long_running``: :func:`stop_early_on_signals` from its start)."""
    parser.set_defaults(long_running=True)
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        type=metrics_address,
        default=from_environment("SVLEDGER_METRICS_ADDRESS"),
        help="expose Prometheus metrics on http://HOST:PORT/metrics (port 0: any free one;\n"
        "default: $SVLEDGER_METRICS_ADDRESS, else none); see docs/metrics.md",
    )


@_naming_variable
def metrics_address(text: str) -> str:
    """An argparse type: ``HOST:PORT`` as :func:`ledger.metrics.serve_metrics` takes it."""
    from ledger.metrics import parse_address

    try:
        parse_address(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return text


class StoppedEarly(BaseException):
    """A stop signal (named by the message) that came before the service began; the
    command then exits 0. A BaseException, so no ``except Exception`` on the way holds it."""


def stop_early_on_signals() -> None:
    """Until :func:`run_until_signalled` takes them over, have SIGTERM and SIGINT end the
    command at once with :class:`StoppedEarly`: a service told to stop while it still
    loads its modules or prepares its database exits 0 without starting, as it would a
    second later, not 143 (or with a KeyboardInterrupt's traceback)."""

    def stop(signum: int, _: object) -> None:
        raise StoppedEarly(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


def run_until_signalled(
    service: Callable[[asyncio.Event], Awaitable[object]], metrics_address: str | None = None
) -> int:
    """Run a long-lived ``service(stop)``; SIGTERM or SIGINT sets ``stop`` for a clean exit,
    and SIGUSR1 logs where each of its asyncio tasks waits (:mod:`ledger.tasks`). A
    service still waiting for Kafka to answer then stops at once (exit 0), not after
    the connect timeout (:func:`ledger.kafka.stop_connecting_on`).

    With ``metrics_address`` its metrics are exposed there first
    (:func:`ledger.metrics.serve_metrics` logs the bound address, so a port 0 can be
    found).
    """
    if metrics_address:
        from ledger.metrics import serve_metrics

        try:
            serve_metrics(metrics_address)
        except ValueError as error:
            raise UsageError(f"--metrics-address: {error}") from error
        except OSError as error:
            raise UsageError(
                f"--metrics-address {metrics_address}: cannot listen: {error.strerror}; "
                "choose a free port"
            ) from error

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopping(signum: int) -> None:
            if not stop.is_set():
                name = signal.Signals(signum).name
                log.info("%s: stopping, once the work in hand is done", name)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping, signum)
        log_tasks_on_signal(loop)
        stop_connecting_on(stop)
        try:
            await service(stop)
        except asyncio.CancelledError:  # StoppedConnecting, or a task that awaited one
            if not stop.is_set():
                raise
            log.info("stopped while waiting for Kafka to answer")
        else:
            if stop.is_set():
                log.info("stopped")

    from ledger.kafka import stop_connecting_on
    from ledger.memory import fewer_collections
    from ledger.tasks import log_tasks_on_signal

    with fewer_collections():  # every service folds the log, as the projector does
        asyncio.run(main())
    return 0


@_naming_variable
def database_url(text: str) -> str:
    """An argparse type: a PostgreSQL or SQLite database URL that names a database a
    later command can open again (not SQLite's in-memory one)."""
    from projections.database import parse_url

    try:
        url = parse_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise argparse.ArgumentTypeError(
            f"database URL {text!r} names no file: its views would live in memory and be "
            "gone when the command exits; give sqlite:///PATH.db"
        )
    return text


Number = TypeVar("Number", int, float)


def positive(convert: Callable[[str], Number], what: str) -> Callable[[str], Number]:
    """An argparse type: ``convert`` the text, refusing values that are not above zero."""

    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {what}") from None
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {what}")
        return value

    return parse


YEAR_SECONDS: Final = 365 * 24 * 3600


def seconds(*, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a number of seconds above zero (with ``zero``, or zero), at most
    a year, so that every wait and back-off built from it stays a real, finite time."""
    least = "0 or more" if zero else "above 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        least_ok = value >= 0 if zero else value > 0  # False for NaN
        if not least_ok or not value <= YEAR_SECONDS:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds ({least}, at most {YEAR_SECONDS:,})"
            )
        return value

    return parse


def group(text: str) -> str:
    """An argparse type for an API group: ``core`` or ``""`` is the core group."""
    return parse_group(text)
