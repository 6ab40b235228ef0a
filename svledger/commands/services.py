"""The long-running reactors: admission, lease GC, the migration trigger, the migration worker."""

from __future__ import annotations

import argparse
import asyncio
from datetime import timedelta
from typing import Final

from kube.fleet import CONCURRENCY, FLEET_READ_SECONDS
from ledger.errors import UsageError
from ledger.identity import SHUTDOWN_WINDOW_SECONDS
from svledger.options import (
    Subparsers,
    add_cluster_option,
    add_command,
    add_kafka_options,
    add_metrics_option,
    add_snapshots_option,
    kafka_settings,
    non_empty,
    positive,
    run_until_signalled,
    seconds,
    snapshot_source,
)

# The worker's client-side rate limit, as upstream's migrator is deployed
# (kube-storage-version-migrator's manifests/migrator.yaml: --kube-api-qps=40,
# --kube-api-burst=1000; client-go's own defaults, 5 and 10, would take an hour to
# rewrite 9,000 objects).
KUBE_API_QPS: Final = 40.0
KUBE_API_BURST: Final = 1000


def add_admit(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "admit",
        _admit,
        help="move what reporters may say from their clusters' inboxes into the ledger",
        description=(
            "Guard the ledger against forged events: read every inbox topic\n"
            "<topic>.inbox.CLUSTER (reporters write there with SVLEDGER_INBOX=true) and copy\n"
            "each record into the ledger if it is a heartbeat, lease release, storage version\n"
            "report or withdrawal of that cluster; anything else goes to the dead-letter\n"
            "topic with the reason. Exactly once and in each inbox's order (Kafka\n"
            "transactions, one transactional id per inbox). New inboxes are picked up within\n"
            "seconds. See docs/production.md, 'Who may say what'."
        ),
    )
    add_kafka_options(parser, "admission")
    add_metrics_option(parser)


def _admit(args: argparse.Namespace) -> int:
    from consumers.admission import run_admission

    settings = kafka_settings(args)
    return run_until_signalled(
        lambda stop: run_admission(settings, stop=stop), args.metrics_address
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
    add_kafka_options(parser, "lease-gc")
    add_metrics_option(parser)
    add_snapshots_option(parser)
    parser.add_argument(
        "--check-period",
        type=seconds(),
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
            settings,
            stop=stop,
            clock=SystemClock(),
            check_period=args.check_period,
            snapshots=snapshot_source(args),
        ),
        args.metrics_address,
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
            "stored in another; MigrationCancelled when agreement breaks. A failed migration\n"
            "is requested again after a back-off in event time, doubling from --retry-backoff\n"
            "up to --max-retry-backoff. Exactly once: Kafka transactions, one transactional\n"
            "id per input partition."
        ),
    )
    add_kafka_options(parser, "migrator")
    add_metrics_option(parser)
    add_snapshots_option(parser)
    parser.add_argument(
        "--retry-backoff",
        type=seconds(),
        default=60.0,
        metavar="SECONDS",
        help="wait after a migration's first failure before requesting it again (default: 60)",
    )
    parser.add_argument(
        "--max-retry-backoff",
        type=seconds(),
        default=3600.0,
        metavar="SECONDS",
        help="the longest wait, however often it failed (default: 3600)",
    )


def _migrator(args: argparse.Namespace) -> int:
    from consumers.migrator import Backoff, run_migrator

    if args.max_retry_backoff < args.retry_backoff:
        raise UsageError(
            f"--max-retry-backoff {args.max_retry_backoff:g} is shorter than --retry-backoff "
            f"{args.retry_backoff:g}: give a longest wait at least as long as the first"
        )
    settings = kafka_settings(args)
    backoff = Backoff(args.retry_backoff, args.max_retry_backoff)
    return run_until_signalled(
        lambda stop: run_migrator(
            settings, stop=stop, backoff=backoff, snapshots=snapshot_source(args)
        ),
        args.metrics_address,
    )


EXECUTORS = ("rewrite", "storagemigration")


def add_worker(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "worker",
        _worker,
        help="run the requested storage migrations against a Kubernetes API server",
        description=(
            "The migration worker: follow the log and run each requested migration of\n"
            "--cluster, running ones first, then the oldest, through that cluster's API server\n"
            "(addressed as kubectl does: --kubeconfig, KUBECONFIG or ~/.kube/config with\n"
            "--context, else the pod's service account). Reports\n"
            "MigrationStarted/Progressed/Succeeded/Failed.\n"
            "\n"
            "Before each migration it checks that the API server is --cluster's: one of its\n"
            "kube-apiserver identity Leases (kube-system) must be held by a holder the\n"
            "ledger's leases of --cluster have (the collector copies them); until then the\n"
            "migration waits, and says why.\n"
            "\n"
            "--executor rewrite (default): list the resource in chunks with continue tokens\n"
            "and write every object back unchanged, so the API server stores it in its\n"
            "storage version; a restarted worker resumes from the last continue token; an\n"
            "object refused for good does not stop its chunk, the migration fails after it.\n"
            "--executor storagemigration: create a storagemigration.k8s.io\n"
            "StorageVersionMigration per migration and let kube-controller-manager's in-tree\n"
            "migrator run it; follow its conditions; delete it when the migration is\n"
            "cancelled.\n"
            "\n"
            "--prune-stored-versions (with --executor rewrite): for a custom resource, do what\n"
            "kube-controller-manager's in-tree migrator does for its own migrations, guarded by\n"
            "the ledger. While a migration runs, the CustomResourceDefinition's condition\n"
            "StorageMigrating is True (reason MigrationRunning, observedGeneration its\n"
            "generation); when it ends, False (MigrationSucceeded, or MigrationFailed). After a\n"
            "success, status.storedVersions becomes the storage version alone, only if the\n"
            "spec's storage version is still the migration's target, the CRD's generation is\n"
            "still the one the migration started under, and the ledger proves every other\n"
            "version empty (no apiserver has encoded the resource in it since a migration under\n"
            "agreement rewrote every object). The write is conditional on the CRD's\n"
            "resourceVersion (re-read and decided again on a conflict). The outcome is\n"
            "recorded: StoredVersionsPruned, or StoredVersionsPruneRefused with the reason.\n"
            "Needs get on customresourcedefinitions and update on\n"
            "customresourcedefinitions/status (apiextensions.k8s.io), checked at start."
        ),
    )
    add_cluster_option(
        parser,
        "the cluster whose migrations to run (the name its apiservers report under)",
        required=True,
    )
    add_kafka_options(parser, "worker")
    add_metrics_option(parser)
    add_snapshots_option(parser)
    add_kubeconfig_options(parser)
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="rewrite",
        help=(
            "who rewrites the objects: this worker (rewrite), or kube-controller-manager"
            " through StorageVersionMigration objects (storagemigration) (default: rewrite)"
        ),
    )
    parser.add_argument(
        "--skip-identity-check",
        action="store_true",
        help=(
            "run migrations without checking that the API server is --cluster's: for a"
            " cluster whose apiservers report through svledger's reporter, not identity"
            " Leases"
        ),
    )
    parser.add_argument(
        "--prune-stored-versions",
        action="store_true",
        help=(
            "after a migration of a custom resource, prune its CRD's status.storedVersions"
            " to the storage version when the ledger proves the other versions empty, and"
            " mark the CRD StorageMigrating while it runs (--executor rewrite only; see above)"
        ),
    )
    parser.add_argument(
        "--chunk-size",
        type=positive(int, "whole number"),
        metavar="N",
        help="objects listed per request by the rewrite executor (default: 500, as upstream)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive(int, "whole number"),
        metavar="N",
        help="migrations run at once, of different resources (default: 1 for rewrite,"
        " 16 for storagemigration)",
    )
    parser.add_argument(
        "--kube-api-qps",
        type=positive(float, "number"),
        default=KUBE_API_QPS,
        metavar="QPS",
        help="requests a second to the API server, on average, as client-go's QPS"
        f" (default: {KUBE_API_QPS:g}, as upstream's migrator is deployed)",
    )
    parser.add_argument(
        "--kube-api-burst",
        type=positive(int, "whole number"),
        default=KUBE_API_BURST,
        metavar="N",
        help="requests at once before --kube-api-qps holds them back, as client-go's"
        f" Burst (default: {KUBE_API_BURST})",
    )


def _worker(args: argparse.Namespace) -> int:
    from consumers.worker import CHUNK_SIZE, GROUP_ID, Executor, Rewriter, run_worker
    from kube.client import RateLimit, connect
    from kube.cluster_check import IdentityCheck
    from kube.executor import StorageMigrationExecutor
    from kube.stored_versions import StoredVersionsPruner
    from kube.target import KubernetesTarget
    from ledger.clock import SystemClock

    if args.chunk_size is not None and args.executor != "rewrite":
        raise UsageError(
            f"--chunk-size is for --executor rewrite; with --executor {args.executor}"
            " kube-controller-manager lists the objects itself: drop --chunk-size"
        )
    if args.prune_stored_versions and args.executor != "rewrite":
        raise UsageError(
            f"--prune-stored-versions is for --executor rewrite; with --executor"
            f" {args.executor} kube-controller-manager's migrator prunes status.storedVersions"
            " itself (and svledger records what it did): drop --prune-stored-versions"
        )
    settings = kafka_settings(args)
    clock = SystemClock()

    async def work(stop: asyncio.Event) -> None:
        rate_limit = RateLimit(args.kube_api_qps, args.kube_api_burst)
        kube = await connect(args.kubeconfig, args.context, rate_limit=rate_limit)
        executor: Executor = Rewriter(
            KubernetesTarget(kube), clock, chunk_size=args.chunk_size or CHUNK_SIZE
        )
        if args.executor == "storagemigration":  # events are still rewritten by svledger
            executor = StorageMigrationExecutor(kube, clock, executor)
        pruner = StoredVersionsPruner(kube, clock) if args.prune_stored_versions else None
        try:
            if pruner is not None:
                await pruner.check_access()
            await run_worker(
                settings,
                executor,
                stop=stop,
                # A group per cluster: each cluster's workers follow every partition.
                group_id=f"{GROUP_ID}.{args.cluster}",
                cluster=args.cluster,
                concurrency=args.concurrency or (1 if args.executor == "rewrite" else 16),
                snapshots=snapshot_source(args),
                check=None if args.skip_identity_check else IdentityCheck(kube),
                hooks=pruner,
            )
        finally:
            await kube.close()

    return run_until_signalled(work, args.metrics_address)


def add_collect(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "collect",
        _collect,
        help="follow a real cluster's kube-apiservers into the ledger",
        description=(
            "Watch a real Kubernetes cluster's (or, --fleet, many clusters') apiserver\n"
            "identity Leases (kube-system, apiserver.kubernetes.io/identity=kube-apiserver),\n"
            "each apiserver's own discovery (the storageVersionHash of every resource; needs\n"
            "each apiserver's address: --apiserver, or the peer address its lease advertises)\n"
            "and, where served, the alpha StorageVersion objects\n"
            "(internal.apiserver.k8s.io/v1alpha1), and append what the ledger lacks: a\n"
            "heartbeat per lease renewal, the lease's end once the apiserver has stopped, a\n"
            "report per new or changed entry, saying its source, and a withdrawal of what an\n"
            "apiserver's discovery no longer shows or when it cannot be read. Agreement on a\n"
            "resource needs an entry of every apiserver with a live lease: one the collector\n"
            "cannot ask keeps it unknown. A restarted collector appends only what is missing;\n"
            "a second one for the same cluster is fenced and appends nothing.\n"
            "One cluster (--cluster) is addressed as kubectl does: --kubeconfig, KUBECONFIG\n"
            "or ~/.kube/config with --context, else the pod's service account.\n"
            "Many (--fleet): every cluster of a kubeconfig's contexts or of a directory of\n"
            "kubeconfigs, in one process. Several processes given the same fleet share it:\n"
            "each cluster is collected by one of them at a time, and the clusters of one that\n"
            "stops or dies are taken over by the others."
        ),
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--cluster",
        type=non_empty("cluster name"),
        help="collect this one cluster: its name in the ledger (every event's key)",
    )
    which.add_argument(
        "--fleet",
        metavar="PATH",
        type=non_empty("path"),
        help="collect many clusters: a kubeconfig, each context a cluster named by the\n"
        "context, or a directory of kubeconfigs, each file a cluster named by the file\n"
        "(prod-eu-1.yaml: prod-eu-1), through its current context; read again every\n"
        f"{FLEET_READ_SECONDS:.0f} s, so clusters can be added and removed while it runs.\n"
        "Each apiserver is asked at the peer address its identity lease advertises",
    )
    parser.add_argument(
        "--group",
        type=non_empty("consumer group"),
        help="with --fleet: the consumer group the processes sharing the fleet join; each\n"
        "must be given the same fleet (default svledger-collector)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive(int, "number of requests"),
        default=CONCURRENCY,
        metavar="N",
        help="with --fleet: at most N requests to the fleet's apiservers at once (lists and\n"
        f"discovery reads; watches aside) (default {CONCURRENCY})",
    )
    add_kafka_options(parser, "collector")
    add_metrics_option(parser)
    add_snapshots_option(parser)
    add_kubeconfig_options(parser)
    parser.add_argument(
        "--apiserver",
        action="append",
        type=_apiserver,
        default=[],
        metavar="HOSTNAME=URL",
        help="an apiserver's own address (not a load balancer's), once per apiserver: its\n"
        "discovery tells which version it stores each resource in (built-in ones too, all\n"
        "a cluster without the StorageVersion API gives), and the kinds of the resources\n"
        "only an upgraded apiserver serves in a rolling upgrade",
    )
    parser.add_argument(
        "--shutdown-window",
        type=seconds(zero=True),
        default=SHUTDOWN_WINDOW_SECONDS,
        metavar="SECONDS",
        help="how long an apiserver whose identity lease was deleted is taken to still\n"
        "serve when it cannot be asked (no address): kube-apiserver deletes its lease when\n"
        "told to stop and serves, writes included, for its --shutdown-delay-duration; one\n"
        "with an address is a member until its discovery no longer answers (default\n"
        f"{SHUTDOWN_WINDOW_SECONDS:.0f})",
    )
    parser.add_argument(
        "--renewal-interval",
        type=seconds(zero=True),
        default=0.0,
        metavar="SECONDS",
        help="append a lease renewal only once it is this much newer than the ledger's\n"
        "(at most half the lease's duration): fewer heartbeats in the log, a renew time\n"
        "that lags by less than this (default 0: every renewal, every 10 s upstream)",
    )


def _apiserver(text: str) -> tuple[str, str]:
    hostname, sep, url = text.partition("=")
    scheme, _, address = url.partition("://")
    if not sep or not hostname or scheme not in ("https", "http") or not address.strip("/"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not HOSTNAME=URL, e.g. master-1=https://10.0.0.11:6443"
        )
    return hostname, url


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
    if args.fleet is not None:
        return _collect_fleet(args)
    from kube.client import connect
    from kube.collector import run_collector
    from ledger.clock import SystemClock
    from ledger.identity import apiserver_id

    if args.group is not None:
        raise UsageError(
            f"--group {args.group} is for --fleet; a collector of one cluster joins"
            f" svledger-collector.{args.cluster}"
        )
    hostnames = [hostname for hostname, _ in args.apiserver]
    repeated = sorted({hostname for hostname in hostnames if hostnames.count(hostname) > 1})
    if repeated:
        raise UsageError(
            f"--apiserver {repeated[0]}=... is given more than once; give each apiserver's"
            " address once"
        )
    settings = kafka_settings(args)

    async def collect(stop: asyncio.Event) -> None:
        kube = await connect(args.kubeconfig, args.context)
        direct = {apiserver_id(host): kube.at(url) for host, url in args.apiserver}
        try:
            await run_collector(
                settings,
                args.cluster,
                kube,
                stop=stop,
                clock=SystemClock(),
                apiservers=direct,
                renewal_interval=timedelta(seconds=args.renewal_interval),
                shutdown_window=args.shutdown_window,
                snapshots=snapshot_source(args),
            )
        finally:
            for client in [kube, *direct.values()]:
                await client.close()

    return run_until_signalled(collect, args.metrics_address)


def _collect_fleet(args: argparse.Namespace) -> int:
    from kube.collector import GROUP_ID, Collector
    from kube.fleet import Fleet, read_fleet
    from ledger.clock import SystemClock

    for given, option in ((args.kubeconfig, "--kubeconfig"), (args.context, "--context")):
        if given is not None:
            raise UsageError(f"{option} is for --cluster; --fleet names each cluster's kubeconfig")
    if args.apiserver:
        raise UsageError(
            "--apiserver is for --cluster; with --fleet each apiserver is asked at the peer"
            " address its identity lease advertises"
        )
    read_fleet(args.fleet)  # refused now, not once the group is joined
    settings = kafka_settings(args)

    async def collect(stop: asyncio.Event) -> None:
        fleet = Fleet(args.fleet, asyncio.Semaphore(args.concurrency))
        collector = Collector(
            settings,
            fleet.read,
            group_id=args.group or GROUP_ID,
            clock=SystemClock(),
            renewal_interval=timedelta(seconds=args.renewal_interval),
            shutdown_window=args.shutdown_window,
            snapshots=snapshot_source(args),
        )
        await collector.run(stop)

    return run_until_signalled(collect, args.metrics_address)
