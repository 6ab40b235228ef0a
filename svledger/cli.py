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
import asyncio
import importlib.metadata
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from ledger.hashing import storage_version_hash
from ledger.identity import apiserver_id

if TYPE_CHECKING:
    from ledger.settings import KafkaSettings

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
    # Alembic narrates every migration check at INFO; only a debugging user wants that.
    logging.getLogger("alembic").setLevel(level if level == "DEBUG" else "WARNING")


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


# --- options shared by the commands that touch Kafka or the database ---------------

DEFAULT_DB: Final = "sqlite:///svledger.db"


def add_kafka_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Kafka", "also from SVLEDGER_KAFKA_* variables (security: SASL/SSL, see README)"
    )
    group.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers (default: $SVLEDGER_KAFKA_BOOTSTRAP or localhost:9092)",
    )
    group.add_argument(
        "--topic", help="the events topic (default: $SVLEDGER_TOPIC or svledger.events)"
    )


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        type=_database_url,
        default=os.environ.get("SVLEDGER_DATABASE_URL", DEFAULT_DB),
        help=(
            "SQLAlchemy URL of the projection database, e.g. sqlite:///svledger.db or "
            "postgresql://user:pass@host/db (default: $SVLEDGER_DATABASE_URL or "
            f"{DEFAULT_DB})"
        ),
    )


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    from ledger.settings import KafkaSettings, SettingsError

    overrides: dict[str, Any] = {}
    if args.bootstrap:
        overrides["bootstrap_servers"] = args.bootstrap
    if args.topic:
        overrides["topic"] = args.topic
    try:
        return KafkaSettings.from_env(**overrides)
    except SettingsError as error:
        raise UsageError(str(error)) from error


def run_until_signalled(service: Callable[[asyncio.Event], Awaitable[object]]) -> int:
    """Run a long-lived ``service(stop)``; SIGTERM or SIGINT sets ``stop`` for a clean exit."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await service(stop)

    asyncio.run(main())
    return 0


# --- schema ------------------------------------------------------------------------


def add_db(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "db",
        _db_upgrade,
        help="create or upgrade the projection database schema",
        description=(
            "svledger db upgrade: apply every Alembic migration of the projection schema\n"
            "to the database (idempotent; on PostgreSQL concurrent runs queue on a lock).\n"
            "'svledger project' applies it too when it starts; run it alone to upgrade\n"
            "ahead of them."
        ),
    )
    parser.add_argument("action", choices=["upgrade"], help="upgrade: apply migrations")
    add_db_option(parser)


def _db_upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy.engine import make_url

    from projections.database import upgrade

    upgrade(args.db)
    shown = make_url(args.db).render_as_string(hide_password=True)
    print(f"schema of {shown} is up to date")
    return 0


def add_topics(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "topics",
        _topics_create,
        help="create the events topic and its dead-letter topic",
        description=(
            "svledger topics create: create the events topic and its dead-letter topic\n"
            "(SVLEDGER_KAFKA_PARTITIONS partitions, SVLEDGER_KAFKA_REPLICATION_FACTOR\n"
            "replicas, kept for ever) unless they exist, and wait for their leaders\n"
            "(idempotent). Run it once per deployment, before the other roles."
        ),
    )
    parser.add_argument("action", choices=["create"], help="create: create missing topics")
    add_kafka_options(parser)


def _topics_create(args: argparse.Namespace) -> int:
    from ledger.kafka import create_topics

    settings = kafka_settings(args)
    asyncio.run(create_topics(settings))
    print(f"topics {settings.topic} and {settings.dlq_topic} exist")
    return 0


def _database_url(text: str) -> str:
    from projections.database import parse_url

    try:
        parse_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return text


# --- the projector, replay and reading the history ----------------------------------


def add_project(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "project",
        _project,
        help="fold the log into the SQL views, continuously",
        description=(
            "Consume the events topic and fold every event into the SQL views\n"
            "(apiserver_leases, storage_versions, storage_states, migrations, ledger_events).\n"
            "Each batch's rows and its checkpoint are written in one transaction; on start\n"
            "the projector resumes from the checkpoint. Several projectors share the\n"
            "partitions. While catching up it writes large batches from a writer process\n"
            "of its own (python -m projections.writer), so fold and write use two cores.\n"
            "SIGTERM finishes the batch, commits and exits."
        ),
    )
    add_kafka_options(parser)
    add_db_option(parser)


def _project(args: argparse.Namespace) -> int:
    from projections.database import upgrade
    from projections.projector import run_projector

    settings = kafka_settings(args)
    upgrade(args.db)
    return run_until_signalled(lambda stop: run_projector(settings, args.db, stop=stop))


def add_replay(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "replay",
        _replay,
        help="rebuild the views into a fresh database from the log, as of any point",
        description=(
            "Rebuild every view into a fresh database by replaying the log from the start,\n"
            "up to now or to --until, optionally for one cluster only. With --from-snapshot\n"
            "an existing projection database is continued from its checkpoint."
        ),
    )
    add_kafka_options(parser)
    add_db_option(parser)
    parser.add_argument(
        "--until",
        metavar="OFFSET|TIMESTAMP",
        help="stop after this log offset (e.g. 12345) or this time (e.g. 2026-01-02T03:04:05Z)",
    )
    parser.add_argument("--cluster", help="replay only this cluster's events")
    parser.add_argument(
        "--from-snapshot",
        action="store_true",
        help="continue the existing database from its checkpoint instead of a fresh one",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )


def _replay(args: argparse.Namespace) -> int:
    from projections.replay import ReplayError, parse_until, replay

    settings = kafka_settings(args)
    try:
        until = parse_until(args.until) if args.until is not None else None
        result = asyncio.run(
            replay(
                settings,
                args.db,
                until=until,
                cluster=args.cluster,
                from_snapshot=args.from_snapshot,
                progress=args.progress,
            )
        )
    except ReplayError as error:
        raise UsageError(str(error)) from error
    print(
        json.dumps(
            {
                "events": result.events,
                "rejected": result.rejected,
                "seconds": round(result.seconds, 3),
                "checkpoint": {str(p): o for p, o in sorted(result.next_offsets.items())},
            }
        )
    )
    return 0


def add_history(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "history",
        _history,
        help="print the events that touched a resource",
        description=(
            "Print, in log order, every event that touched RESOURCE: reports, withdrawals,\n"
            "lease ends that removed an entry, resets and migrations, with log positions.\n"
            "RESOURCE is <group>.<resource> (core.pods), <resource>.<group> or a core resource."
        ),
    )
    _add_resource_arguments(parser)


def add_explain(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "explain",
        _explain,
        help="say in plain words why a resource is in its current state",
        description=(
            "Explain RESOURCE's current StorageVersion and StorageState: who reports which\n"
            "encoding version, whether they agree and since when, which events put each\n"
            "persisted hash there, and its latest migration, citing log positions."
        ),
    )
    _add_resource_arguments(parser)


def _add_resource_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("resource", metavar="RESOURCE", help="e.g. apps.deployments or core.pods")
    parser.add_argument("--cluster", help="the cluster, when the resource is in several")
    add_db_option(parser)


def _history(args: argparse.Namespace) -> int:
    from projections.history import format_history, history

    print(
        _read_resource(
            args, lambda conn: format_history(history(conn, args.resource, args.cluster))
        )
    )
    return 0


def _explain(args: argparse.Namespace) -> int:
    from projections.history import explain

    print(_read_resource(args, lambda conn: explain(conn, args.resource, args.cluster)))
    return 0


def _read_resource(args: argparse.Namespace, read: Callable[[Any], str]) -> str:
    from projections.database import engine
    from projections.history import ResourceNameError

    try:
        with engine(args.db).connect() as connection:
            return read(connection)
    except ResourceNameError as error:
        raise UsageError(str(error)) from error


# --- consumers ------------------------------------------------------------------------


def add_lease_gc(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "lease-gc",
        _lease_gc,
        help="expire the leases of apiservers that stopped heartbeating",
        description=(
            "Follow the log and, every check period, append ApiserverLeaseExpired for each\n"
            "lease whose renew time plus its duration has passed. Never expires a lease that\n"
            "was renewed; safe to run twice at once."
        ),
    )
    add_kafka_options(parser)
    parser.add_argument(
        "--check-period",
        type=_positive(float, "number of seconds"),
        default=3600.0,
        metavar="SECONDS",
        help="how often to look for expired leases (default: 3600, as upstream)",
    )


def _lease_gc(args: argparse.Namespace) -> int:
    from consumers.lease_gc import run_lease_gc
    from ledger.clock import SystemClock

    settings = kafka_settings(args)
    return run_until_signalled(
        lambda stop: run_lease_gc(
            settings, stop=stop, clock=SystemClock(), check_period=args.check_period
        )
    )


def add_migrator(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "migrator",
        _migrator,
        help="request storage migrations when apiservers agree; cancel when they don't",
        description=(
            "The migration trigger: follow the log and append MigrationRequested once every\n"
            "live apiserver encodes a resource in the same version and objects may still be\n"
            "stored in another; MigrationCancelled when agreement breaks. Exactly once: Kafka\n"
            "transactions, one transactional id per input partition."
        ),
    )
    add_kafka_options(parser)


def _migrator(args: argparse.Namespace) -> int:
    from consumers.migrator import run_migrator

    settings = kafka_settings(args)
    return run_until_signalled(lambda stop: run_migrator(settings, stop=stop))


def add_worker(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "worker",
        _worker,
        help="run the requested storage migrations against a Kubernetes API server",
        description=(
            "The migration worker: follow the log and run each requested migration of the\n"
            "partitions it owns, oldest first: list the resource in chunks with continue\n"
            "tokens and write every object back unchanged, so the API server stores it in\n"
            "its storage version. Reports MigrationStarted/Progressed/Succeeded/Failed; a\n"
            "restarted worker resumes from the last continue token. It runs the migrations of\n"
            "--cluster only, through that cluster's API server: inside the cluster as the\n"
            "pod's service account, elsewhere as given by --server."
        ),
    )
    parser.add_argument(
        "--cluster",
        required=True,
        help="the cluster whose migrations to run (the name its apiservers report under)",
    )
    add_kafka_options(parser)
    api = parser.add_argument_group(
        "Kubernetes API", "default: the cluster the worker runs in, as its service account"
    )
    api.add_argument("--server", metavar="URL", help="API server URL, e.g. https://10.0.0.1:6443")
    api.add_argument("--token-file", metavar="PATH", help="file holding the bearer token")
    api.add_argument("--ca-file", metavar="PATH", help="PEM file of the API server's CA")
    api.add_argument(
        "--insecure-skip-tls-verify",
        action="store_true",
        help="do not verify the API server's certificate (testing only)",
    )
    parser.add_argument(
        "--chunk-size",
        type=_positive(int, "whole number"),
        default=500,
        metavar="N",
        help="objects listed per request (default: 500, as upstream)",
    )


def _worker(args: argparse.Namespace) -> int:
    from consumers.kubernetes import ConfigurationError, KubernetesTarget
    from consumers.worker import GROUP_ID, run_worker
    from ledger.clock import SystemClock

    settings = kafka_settings(args)
    if args.server is None and (args.token_file or args.ca_file or args.insecure_skip_tls_verify):
        raise UsageError(
            "--token-file, --ca-file and --insecure-skip-tls-verify apply to --server; "
            "give the API server with --server URL"
        )
    try:
        if args.server is None:
            target = KubernetesTarget.in_cluster()
        else:
            target = KubernetesTarget(
                args.server,
                token_file=args.token_file,
                ca_file=args.ca_file,
                insecure_skip_tls_verify=args.insecure_skip_tls_verify,
            )
    except ConfigurationError as error:
        hint = "; give the API server with --server URL" if args.server is None else ""
        raise UsageError(f"{error}{hint}") from error

    async def work(stop: asyncio.Event) -> None:
        try:
            await run_worker(
                settings,
                target,
                stop=stop,
                clock=SystemClock(),
                chunk_size=args.chunk_size,
                # A group per cluster: each cluster's workers follow every partition.
                group_id=f"{GROUP_ID}.{args.cluster}",
                cluster=args.cluster,
            )
        finally:
            target.close()

    return run_until_signalled(work)


def add_migrations(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "migrations",
        _migrations_request,
        help="operator actions on migrations: request one",
        description=(
            "svledger migrations request GROUP RESOURCE: append MigrationRequested for the\n"
            "resource's common encoding version (or --version), with the operator as source."
        ),
    )
    parser.add_argument("action", choices=["request"], help="request: start a migration")
    _add_operator_arguments(parser)
    parser.add_argument("--version", help="target version (default: the common encoding version)")


def _migrations_request(args: argparse.Namespace) -> int:
    from consumers.operator import request_migration

    settings = kafka_settings(args)
    event = _operator_action(
        lambda: request_migration(
            settings, args.cluster, _group(args.group), args.resource, args.version, args.operator
        )
    )
    print(f"requested migration {event.migration_id} to {event.target_version}")
    return 0


def add_storagestate(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "storagestate",
        _storagestate_reset,
        help="operator actions on StorageStates: reset one",
        description=(
            "svledger storagestate reset GROUP RESOURCE --reason TEXT: set the persisted\n"
            'hashes back to ["Unknown"] (e.g. after restoring etcd from a backup).'
        ),
    )
    parser.add_argument("action", choices=["reset"], help="reset: persisted hashes to Unknown")
    _add_operator_arguments(parser)
    parser.add_argument("--reason", required=True, help="why, recorded in the event")


def _storagestate_reset(args: argparse.Namespace) -> int:
    from consumers.operator import reset_storage_state

    settings = kafka_settings(args)
    _operator_action(
        lambda: reset_storage_state(
            settings, args.cluster, _group(args.group), args.resource, args.reason, args.operator
        )
    )
    print(f"reset the StorageState of {args.resource} in {args.cluster}")
    return 0


def _add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group", metavar="GROUP", help='API group; "" or core for the core group')
    parser.add_argument("resource", metavar="RESOURCE", help="resource, e.g. deployments")
    parser.add_argument("--cluster", required=True, help="the cluster the resource is in")
    parser.add_argument(
        "--operator",
        default=os.environ.get("USER", "operator"),
        help="who is acting, recorded as the event's source (default: $USER)",
    )
    add_kafka_options(parser)


def _group(text: str) -> str:
    return "" if text == "core" else text


T = TypeVar("T")


def _operator_action(action: Callable[[], Coroutine[Any, Any, T]]) -> T:
    from consumers.operator import OperatorError

    try:
        return asyncio.run(action())
    except OperatorError as error:
        raise UsageError(str(error)) from error


Number = TypeVar("Number", int, float)


def _positive(convert: Callable[[str], Number], what: str) -> Callable[[str], Number]:
    """An argparse type: ``convert`` the text, refusing values that are not above zero."""

    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {what}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {what}")
        return value

    return parse


# --- the simulation --------------------------------------------------------------------


def add_simulate(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "simulate",
        _simulate,
        help="simulate an HA control plane's rolling upgrade on the real log",
        description=(
            "Run SCENARIO.yaml (see docs/scenarios.md): simulated apiservers embedding the\n"
            "real reporter and write gate, clients writing through a load balancer, and the\n"
            "real projector, lease GC, migrator and worker, on Kafka and SQL, in virtual time.\n"
            "Prints a timeline and a pollution check; exits 1 if objects were left in a\n"
            "version outside the persisted hashes or a migration ran while apiservers\n"
            "disagreed. Use a topic of its own: its lease GC runs on virtual time."
        ),
    )
    parser.add_argument("scenario", metavar="SCENARIO.yaml", help="the scenario file")
    add_kafka_options(parser)
    add_db_option(parser)
    parser.add_argument(
        "--trigger",
        choices=["agreement", "discovery-hash"],
        default="agreement",
        help=(
            "agreement: the ledger's migrator (default); discovery-hash: the old way, "
            "polling one apiserver every 10 minutes, for comparison"
        ),
    )


def _simulate(args: argparse.Namespace) -> int:
    from consumers.scenario import ScenarioError
    from consumers.simulation import simulate

    settings = kafka_settings(args)
    try:
        result = asyncio.run(simulate(args.scenario, settings, args.db, trigger=args.trigger))
    except (ScenarioError, OSError) as error:
        raise UsageError(str(error)) from error
    if args.trigger == "agreement":
        return int(bool(result.polluted_objects or result.migrations_while_disagreeing))
    return 0


COMMANDS: Final[tuple[Callable[[Subparsers], None], ...]] = (
    add_simulate,
    add_topics,
    add_db,
    add_project,
    add_lease_gc,
    add_migrator,
    add_worker,
    add_migrations,
    add_storagestate,
    add_replay,
    add_history,
    add_explain,
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
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if isinstance(error, _usage_errors()):
            command: argparse.ArgumentParser = args.command_parser
            command.print_usage(sys.stderr)
            print(f"{command.prog}: error: {error}", file=sys.stderr)
            return USAGE_ERROR
        if not isinstance(error, _unavailable_errors()):
            raise
        # The message says what could not be reached and what to check; no traceback.
        print(f"svledger: error: {error}", file=sys.stderr)
        return UNAVAILABLE


UNAVAILABLE: Final = 69  # EX_UNAVAILABLE: a service the command needs cannot be reached


def _usage_errors() -> tuple[type[Exception], ...]:
    """What the user fixes in the command: a bad argument, a database without the schema."""
    from projections.database import DatabaseNotMigrated

    return (UsageError, DatabaseNotMigrated)


def _unavailable_errors() -> tuple[type[Exception], ...]:
    from ledger.kafka import BrokerUnavailable, TopicMissing
    from projections.database import DatabaseUnreachable

    return (BrokerUnavailable, TopicMissing, DatabaseUnreachable)
