"""Operator actions: request a migration, reset a StorageState."""

from __future__ import annotations

import argparse
import asyncio

from svledger.options import (
    Subparsers,
    add_cluster_option,
    add_command,
    add_kafka_options,
    from_environment,
    group,
    kafka_settings,
    non_empty,
)


def add_migrations(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "migrations",
        _migrations_request,
        help="operator actions on migrations: request one",
        description=(
            "svledger migrations request GROUP RESOURCE: append MigrationRequested for the\n"
            "resource's common encoding version, with the operator as source. A migration\n"
            "only ever targets the version every apiserver writes: --version names it to\n"
            "make sure, and the request is refused if it is not that one."
        ),
    )
    parser.add_argument("action", choices=["request"], help="request: start a migration")
    _add_operator_arguments(parser)
    parser.add_argument(
        "--version",
        type=_version,
        help=(
            "the version the migration must target, group-qualified (apps/v1; v1 for the core"
            " group); refused unless it is the common encoding version (default: that one)"
        ),
    )


def _version(text: str) -> str:
    """An argparse type: a group-qualified version, checked before the log is read."""
    from ledger.validation import InvalidReport, check_version

    try:
        check_version("version", text)
    except InvalidReport as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _migrations_request(args: argparse.Namespace) -> int:
    from consumers.operator import request_migration

    settings = kafka_settings(args)
    event = asyncio.run(
        request_migration(
            settings, args.cluster, args.group, args.resource, args.version, args.operator
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
    parser.add_argument(
        "--reason",
        required=True,
        type=non_empty("reason"),
        help="why, recorded in the event (e.g. 'etcd restored')",
    )


def _storagestate_reset(args: argparse.Namespace) -> int:
    from consumers.operator import reset_storage_state

    settings = kafka_settings(args)
    asyncio.run(
        reset_storage_state(
            settings, args.cluster, args.group, args.resource, args.reason, args.operator
        )
    )
    print(f"reset the StorageState of {args.resource} in {args.cluster}")
    return 0


def _add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "group", metavar="GROUP", type=group, help='API group; "" or core for the core group'
    )
    parser.add_argument("resource", metavar="RESOURCE", help="resource, e.g. deployments")
    add_cluster_option(parser, "the cluster the resource is in", required=True)
    parser.add_argument(
        "--operator",
        type=non_empty("name"),
        default=from_environment("USER", "operator"),
        help="who is acting, recorded as the event's source (default: $USER)",
    )
    add_kafka_options(parser, "operator")
