"""The read side: the ledger's views as a Kubernetes API that kubectl reads."""

from __future__ import annotations

import argparse
from pathlib import Path

from ledger.errors import UsageError
from readapi import (
    CHECKPOINT_EVERY,
    RECENT_CHECKPOINTS,
    WATCH_BUDGET,
    WATCH_FLOOR,
    WATCH_WINDOW,
)
from svledger.options import (
    Subparsers,
    add_command,
    add_kafka_options,
    add_metrics_option,
    add_snapshots_option,
    kafka_settings,
    positive,
    run_until_signalled,
    snapshot_source,
)


def add_serve(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "serve",
        _serve,
        help="serve the views as a read-only Kubernetes API (kubectl, client libraries)",
        description=(
            "Fold the log in memory and serve every cluster's views as a read-only\n"
            "Kubernetes API under /clusters/CLUSTER: StorageVersions\n"
            "(internal.apiserver.k8s.io/v1alpha1), apiserver identity Leases in kube-system\n"
            "(coordination.k8s.io/v1), StorageStates and StorageVersionMigrations\n"
            "(migration.k8s.io/v1alpha1). metadata.resourceVersion is the log offset;\n"
            "watches stream every change live. /clusters/CLUSTER/at/POINT answers as the\n"
            "cluster stood at POINT: an offset or an RFC 3339 time.\n"
            "\n"
            "  S=http://127.0.0.1:8080/clusters/prod-eu-1\n"
            "  kubectl --server $S get storageversions\n"
            "  kubectl --server $S/at/2026-11-02T10:00:00Z get storageversions -o yaml\n"
            "\n"
            "/healthz answers while the process runs, /readyz once the log is folded up to\n"
            "the end it had at start. That reads every record of the log; with\n"
            "--snapshots-from, each partition is read on from the projector's latest fold\n"
            "snapshot before its end instead, and /at/ a point older than any fold kept in\n"
            "memory from the projector's latest snapshot before that point."
        ),
    )
    add_kafka_options(parser, "reader")
    add_metrics_option(parser)
    add_snapshots_option(parser)
    parser.add_argument(
        "--address",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="where to listen (default: 127.0.0.1:8080; 0.0.0.0:8080 for every interface)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require 'Authorization: Bearer TOKEN' with a token from FILE (one per line;"
        " kube-apiserver's 'token,user,uid,\"groups\"' lines name the user)",
    )
    parser.add_argument(
        "--tls-cert-file", type=Path, metavar="FILE", help="serve HTTPS with this certificate"
    )
    parser.add_argument(
        "--tls-private-key-file", type=Path, metavar="FILE", help="the certificate's private key"
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive(int, "number of records"),
        default=CHECKPOINT_EVERY,
        metavar="RECORDS",
        help="keep a copy of the fold every RECORDS records of a partition, so a view of\n"
        "the recent past refolds at most that many (default: %(default)s)",
    )
    parser.add_argument(
        "--recent-checkpoints",
        type=positive(int, "number of checkpoints"),
        default=RECENT_CHECKPOINTS,
        metavar="N",
        help="keep a partition's newest N copies at --checkpoint-every, the ones before\n"
        "them at twice that, then four times, and so on: memory grows with the log's\n"
        "logarithm, and a view of an older point refolds about its age in records / (N/2).\n"
        "With --snapshots-from, the newest copy alone: older points start from the\n"
        "projector's fold snapshots (default: %(default)s)",
    )
    parser.add_argument(
        "--watch-window",
        type=positive(int, "number of changes"),
        default=WATCH_WINDOW,
        metavar="CHANGES",
        help="changes kept per cluster for watches; an older resourceVersion gets 410 Gone.\n"
        "Of the log found at start, the last CHANGES records of each partition are folded\n"
        "one by one for watches, the rest faster, lease renewals thinned (default: %(default)s)",
    )
    parser.add_argument(
        "--watch-budget",
        type=positive(int, "number of changes"),
        default=WATCH_BUDGET,
        metavar="CHANGES",
        help="changes kept for watches across all clusters: on a fleet each cluster keeps its\n"
        f"share, if less than --watch-window, but at least {WATCH_FLOOR}; about 600 bytes each,\n"
        "most of a fleet's replica's memory (default: %(default)s)",
    )


def _serve(args: argparse.Namespace) -> int:
    from ledger.metrics import parse_address
    from readapi.access import read_tokens
    from readapi.ledger import LedgerViews
    from readapi.server import ServeOptions, serve

    try:
        host, port = parse_address(args.address)
    except ValueError as error:
        raise UsageError(f"--address: {error}") from error
    if (args.tls_cert_file is None) != (args.tls_private_key_file is None):
        raise UsageError("give both --tls-cert-file and --tls-private-key-file, or neither")
    if args.token_file is not None:
        try:
            read_tokens(args.token_file)
        except ValueError as error:
            raise UsageError(f"--token-file: {error}") from error
    options = ServeOptions(
        host=host,
        port=port,
        token_file=args.token_file,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_private_key_file,
    )
    settings = kafka_settings(args)
    views = LedgerViews(
        settings,
        checkpoint_every=args.checkpoint_every,
        recent_checkpoints=args.recent_checkpoints,
        watch_window=args.watch_window,
        watch_budget=args.watch_budget,
        snapshots=snapshot_source(args),
    )
    return run_until_signalled(lambda stop: serve(views, options, stop), args.metrics_address)
