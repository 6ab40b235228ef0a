"""The log and its views: topics, the schema, the projector, replay, history and explain."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ledger.errors import UsageError
from svledger.options import (
    Subparsers,
    add_cluster_option,
    add_command,
    add_db_option,
    add_kafka_options,
    add_metrics_option,
    add_resource_argument,
    database_url,
    kafka_settings,
    positive,
    run_until_signalled,
)


def add_topics(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "topics",
        _topics,
        help="create the ledger's topics, or add partitions to the events topic",
        description=(
            "svledger topics create: create the events topic, its dead-letter topic and\n"
            "its placement topic (SVLEDGER_KAFKA_PARTITIONS partitions, kept for ever)\n"
            "unless they exist, and wait for their leaders (idempotent). Replicas:\n"
            "SVLEDGER_KAFKA_REPLICATION_FACTOR, by default min(3, brokers);\n"
            "min.insync.replicas: SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS, by default one less\n"
            "(at least 1). It prints what it chose, warns about a layout that cannot ride\n"
            "out a broker down, and refuses one that can never accept a write. Run it once\n"
            "per deployment, with every broker up, before the other roles (and again on\n"
            "upgrading from a version without the placement topic), and with --inbox for\n"
            "each cluster whose reporters write through 'svledger admit'.\n\n"
            "svledger topics grow --partitions N: raise the events topic to N partitions\n"
            "while every cluster keeps its partition (and so its order): it records where\n"
            "each cluster in the log is, in <topic>.placement, then adds the partitions; new\n"
            "clusters spread over all of them. Safe under load. Every writer (reporters,\n"
            "collectors, admit, audit) must record placements, as this version does."
        ),
    )
    parser.add_argument(
        "action",
        choices=["create", "grow"],
        help="create: create missing topics; grow: add partitions to the events topic",
    )
    parser.add_argument(
        "--inbox",
        action="append",
        default=[],
        metavar="CLUSTER",
        help="create: also create CLUSTER's inbox topic <topic>.inbox.CLUSTER (one\n"
        "partition); repeat for more clusters (see docs/production.md, 'Who may say what')",
    )
    parser.add_argument(
        "--partitions",
        type=positive(int, "partition count"),
        metavar="N",
        help="grow: the partition count the events topic grows to (more than it has)",
    )
    add_kafka_options(parser, "setup")


def _topics(args: argparse.Namespace) -> int:
    if args.action == "grow":
        if args.partitions is None:
            raise UsageError("topics grow needs --partitions N, the count to grow the topic to")
        if args.inbox:
            raise UsageError("--inbox is for topics create; drop it from topics grow")
        return _topics_grow(args)
    if args.partitions is not None:
        raise UsageError(
            "--partitions is for topics grow; topics create takes SVLEDGER_KAFKA_PARTITIONS"
        )
    return _topics_create(args)


def _topics_create(args: argparse.Namespace) -> int:
    from ledger.kafka import create_topics

    settings = kafka_settings(args)
    for cluster in args.inbox:  # checked before any I/O
        settings.inbox_topic(cluster)
    done = asyncio.run(create_topics(settings, args.inbox))
    if done.created:
        print(f"created {_listed(done.created)}: {done.layout}")
        if done.layout.warning is not None:
            print(f"warning: {done.layout.warning}", file=sys.stderr)
    if done.existing:
        print(f"{_listed(done.existing)} already existed: left as they are")
    return 0


def _topics_grow(args: argparse.Namespace) -> int:
    from ledger.kafka import grow
    from ledger.progress import ProgressBar

    settings = kafka_settings(args)
    bar = ProgressBar("topics grow: reading the log", "records", tty=sys.stderr.isatty(),
                      stream=sys.stderr)  # fmt: skip
    grown = asyncio.run(grow(settings, args.partitions, bar.update))
    bar.finish()
    print(
        f"topic {settings.topic} grew from {grown.before} to {grown.after} partitions;"
        f" its {grown.clusters} clusters keep their partitions ({grown.recorded} placements"
        f" recorded now in {settings.placement_topic})"
    )
    return 0


def _listed(topics: Sequence[str]) -> str:
    *others, last = topics
    return f"topics {', '.join(others)} and {last}" if others else f"topic {last}"


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
    from projections.database import shown, upgrade

    upgrade(args.db)
    print(f"schema of {shown(args.db)} is up to date")
    return 0


def add_project(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "project",
        _project,
        help="fold the log into the SQL views, continuously",
        description=(
            "Consume the events topic and fold every event into the SQL views\n"
            "(apiserver_leases, storage_versions, storage_states, migrations, ledger_events;\n"
            "plain lease renewals are counted per holder in lease_renewals).\n"
            "Each batch's rows and its checkpoint are written in one transaction; on start\n"
            "the projector resumes from the checkpoint. Several projectors share the\n"
            "partitions. While catching up it writes large batches from a writer process\n"
            "of its own (python -m projections.writer), so fold and write use two cores.\n"
            "Every --snapshot-every offsets of a partition it also writes a fold snapshot\n"
            "(fold_snapshots), from which replay --snapshots-from starts.\n"
            "SIGTERM finishes the batch, commits and exits."
        ),
    )
    add_kafka_options(parser, "projector")
    add_metrics_option(parser)
    add_db_option(parser)
    parser.add_argument(
        "--snapshot-every",
        type=_offsets,
        metavar="OFFSETS",
        help="offsets of a partition between two fold snapshots; 0: none (default 50000)",
    )


def _project(args: argparse.Namespace) -> int:
    from projections.database import upgrade
    from projections.projector import run_projector
    from projections.snapshots import SNAPSHOT_EVERY

    settings = kafka_settings(args)
    upgrade(args.db)
    every = SNAPSHOT_EVERY if args.snapshot_every is None else args.snapshot_every or None
    return run_until_signalled(
        lambda stop: run_projector(settings, args.db, stop=stop, snapshot_every=every),
        args.metrics_address,
    )


def _offsets(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of offsets (0 or more)")
    return int(text)


def add_replay(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "replay",
        _replay,
        help="rebuild the views into a fresh database from the log, as of any point",
        description=(
            "Rebuild every view into a fresh database by replaying the log from the start,\n"
            "up to now or to --until, optionally for one cluster only. With --snapshots-from\n"
            "it starts each partition from the latest fold snapshot the projector wrote at or\n"
            "before --until, and reads the log on from there (the views come out the same;\n"
            "ledger_events, rejected_events and lease_renewals then begin at the snapshot).\n"
            "With --from-snapshot an existing projection database is continued from its\n"
            "checkpoint."
        ),
    )
    add_kafka_options(parser, "projector")
    add_db_option(parser)
    parser.add_argument(
        "--until",
        metavar="OFFSET|TIMESTAMP",
        help="stop after this log offset (e.g. 12345) or this time (e.g. 2026-01-02T03:04:05Z)",
    )
    add_cluster_option(parser, "replay only this cluster's events", required=False)
    parser.add_argument(
        "--snapshots-from",
        metavar="URL",
        type=database_url,
        help="a projection database (the projector's) to take fold snapshots from",
    )
    parser.add_argument(
        "--from-snapshot",
        action="store_true",
        help="continue the existing database from its checkpoint instead of a fresh one",
    )
    parser.add_argument(
        "--processes",
        type=positive(int, "number of processes"),
        default=1,
        metavar="N",
        help=(
            "fold the partitions in N processes at once, e.g. one per core (PostgreSQL"
            " only; SQLite takes one writer at a time; default: 1)"
        ),
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )


def _replay(args: argparse.Namespace) -> int:
    from projections.replay import parse_until, replay

    settings = kafka_settings(args)
    until = parse_until(args.until) if args.until is not None else None
    result = asyncio.run(
        replay(
            settings,
            args.db,
            until=until,
            cluster=args.cluster,
            from_snapshot=args.from_snapshot,
            snapshots_from=args.snapshots_from,
            progress=args.progress,
            processes=args.processes,
        )
    )
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
    add_resource_argument(parser)
    add_cluster_option(parser, "the cluster, when the resource is in several", required=False)
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
    from projections.database import engine, one_snapshot

    with engine(args.db).connect() as connection:
        return read(one_snapshot(connection))
