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
    positive,
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


def add_audit(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "audit",
        _audit,
        help="count what a cluster's etcd stores, per resource, and append it to the ledger",
        description=(
            "svledger audit --cluster NAME --etcd-servers URL: read the cluster's etcd, strictly\n"
            "read-only, every key at one revision, page by page and at a bounded rate, and\n"
            "count per resource the objects per stored apiVersion, the values per encryption\n"
            "key, the undecodable values and the bytes. Objects stored in a version the ledger\n"
            "holds none can be stored in are pollution: an alarm in the event, the metric\n"
            "svledger_storage_polluted_objects and `svledger explain`. One StorageAudited per\n"
            "resource is appended, all in one transaction; a failed audit appends nothing.\n"
            "Give the etcd flags kube-apiserver has (--etcd-servers, --etcd-cafile,\n"
            "--etcd-certfile, --etcd-keyfile, --etcd-prefix, --encryption-provider-config)."
        ),
    )
    add_cluster_option(
        parser, "the cluster whose etcd this is (its name in the ledger)", required=True
    )
    etcd = parser.add_argument_group("etcd", "as kube-apiserver's flags of the same names")
    etcd.add_argument(
        "--etcd-servers",
        required=True,
        type=non_empty("etcd URL"),
        metavar="URL[,URL...]",
        help="etcd's client URLs, e.g. https://127.0.0.1:2379 (the first that answers is read)",
    )
    etcd.add_argument(
        "--etcd-cafile", metavar="FILE", help="CA bundle that signed etcd's certificate"
    )
    etcd.add_argument("--etcd-certfile", metavar="FILE", help="client certificate for etcd")
    etcd.add_argument("--etcd-keyfile", metavar="FILE", help="the client certificate's key")
    etcd.add_argument(
        "--etcd-prefix",
        default="/registry",
        type=non_empty("key prefix"),
        help="the prefix kube-apiserver keeps objects under (default: /registry)",
    )
    etcd.add_argument(
        "--encryption-provider-config",
        metavar="FILE",
        help=(
            "the EncryptionConfiguration the apiservers run with: every key it names for a"
            " resource is counted, 0 included, so explain can say which can go"
        ),
    )
    pace = parser.add_argument_group("pace", "how gently etcd is read")
    pace.add_argument(
        "--page-size",
        type=positive(int, "number of keys"),
        default=500,
        help="keys per range request (default: 500)",
    )
    pace.add_argument(
        "--requests-per-second",
        type=positive(float, "rate"),
        default=20.0,
        help="range requests a second at most (default: 20: 10,000 keys/s with pages of 500)",
    )
    parser.add_argument(
        "--resource",
        dest="resources",
        action="append",
        default=[],
        metavar="NAME",
        help=(
            "audit only this resource (repeatable), named as explain takes it:"
            " <group>.<resource>, <resource>.<group> or a core <resource> (default: every"
            " resource the ledger knows)"
        ),
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="count and print, append nothing",
    )
    add_kafka_options(parser, "operator")


def _audit(args: argparse.Namespace) -> int:
    import sys

    import yaml

    from kube.auditor import AuditOptions, describe, run_audit
    from kube.etcd import EtcdSettings, open_store
    from ledger.errors import UsageError
    from ledger.progress import ProgressBar

    encryption = None
    if args.encryption_provider_config:
        try:
            with open(args.encryption_provider_config, encoding="utf-8") as file:
                encryption = yaml.safe_load(file)
        except (OSError, yaml.YAMLError) as error:
            raise UsageError(
                f"--encryption-provider-config {args.encryption_provider_config}: {error}"
            ) from None
    options = AuditOptions(
        cluster=args.cluster,
        prefix=args.etcd_prefix,
        resources=tuple(args.resources),
        page_size=args.page_size,
        pages_per_second=args.requests_per_second,
        encryption=encryption,
    )
    etcd = EtcdSettings(
        servers=tuple(s.strip() for s in args.etcd_servers.split(",") if s.strip()),
        cafile=args.etcd_cafile,
        certfile=args.etcd_certfile,
        keyfile=args.etcd_keyfile,
    )
    bar = ProgressBar("audit", "keys", tty=sys.stderr.isatty(), stream=sys.stderr)

    async def audit() -> str:
        async with open_store(etcd) as store:
            result = await run_audit(
                kafka_settings(args), store, options, progress=bar.update, append=not args.dry_run
            )
        bar.finish()
        return describe(result)

    print(asyncio.run(audit()))
    return 0
