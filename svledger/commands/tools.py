"""Pure look-ups: the storageVersionHash of a group/version/kind, an apiserver's ID."""

from __future__ import annotations

import argparse

from ledger.errors import UsageError
from ledger.hashing import storage_version_hash
from ledger.identity import apiserver_id, check_hostname
from svledger.options import (
    Subparsers,
    add_command,
)


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
        check_hostname(args.hostname)
        print(apiserver_id(args.hostname))
    except ValueError as error:
        raise UsageError(str(error)) from error
    return 0
