"""The long-running reactors: lease GC, the migration trigger, the migration worker."""

from __future__ import annotations

import argparse
import asyncio

from ledger.errors import UsageError
from svledger.options import (
    Subparsers,
    add_command,
    add_kafka_options,
    kafka_settings,
    positive,
    run_until_signalled,
)


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
        type=positive(float, "number of seconds"),
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
        type=positive(int, "whole number"),
        default=500,
        metavar="N",
        help="objects listed per request (default: 500, as upstream)",
    )


def _worker(args: argparse.Namespace) -> int:
    from consumers.worker import GROUP_ID, run_worker
    from kube.target import ConfigurationError, KubernetesTarget
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


def add_collect(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "collect",
        _collect,
        help="follow a real cluster's kube-apiservers into the ledger",
        description=(
            "Watch one real Kubernetes cluster's apiserver identity Leases (kube-system,\n"
            "apiserver.kubernetes.io/identity=kube-apiserver) and StorageVersion objects\n"
            "(internal.apiserver.k8s.io/v1alpha1; kube-apiserver needs the StorageVersionAPI\n"
            "feature gate and that API enabled) and append what the ledger lacks:\n"
            "a heartbeat per lease renewal, the lease's end when it is deleted, a report per\n"
            "new or changed entry (never a withdrawal: the ledger removes an apiserver's\n"
            "entries itself when its lease ends). A restarted collector appends only what is\n"
            "missing; a second one for the same cluster is fenced and appends nothing.\n"
            "The cluster is addressed as kubectl does: --kubeconfig, KUBECONFIG or\n"
            "~/.kube/config with --context, else the pod's service account."
        ),
    )
    parser.add_argument(
        "--cluster", required=True, help="the cluster's name in the ledger (every event's key)"
    )
    add_kafka_options(parser)
    add_kubeconfig_options(parser)


def add_kubeconfig_options(parser: argparse.ArgumentParser) -> None:
    api = parser.add_argument_group(
        "Kubernetes API", "as kubectl: a kubeconfig, else the pod's service account"
    )
    api.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)",
    )
    api.add_argument("--context", help="kubeconfig context (default: its current context)")


def _collect(args: argparse.Namespace) -> int:
    from kube.client import connect
    from kube.collector import run_collector
    from ledger.clock import SystemClock

    settings = kafka_settings(args)

    async def collect(stop: asyncio.Event) -> None:
        kube = await connect(args.kubeconfig, args.context)
        try:
            await run_collector(settings, args.cluster, kube, stop=stop, clock=SystemClock())
        finally:
            await kube.close()

    return run_until_signalled(collect)
