"""API server identity as upstream Kubernetes defines it (KEP-1965).

The ID is stable across restarts of the same host: ``apiserver-`` followed by the
lowercase, unpadded base32 of the first 16 bytes of SHA-256 over the hostname and the
identity name ``kube-apiserver``, each prefixed with its length as a big-endian uint16
(Go's ``cryptobyte`` ``AddUint16LengthPrefixed``). Source: ``NewConfig`` in
``staging/src/k8s.io/apiserver/pkg/server/config.go`` (kubernetes/kubernetes), checked
by ``expectedAPIServerIdentity`` in ``test/integration/controlplane/apiserver_identity_test.go``.

The ID names the server's identity Lease in ``kube-system``; the Lease's
``holderIdentity`` is ``<ID>_<uuid>`` with a UUID new on every start, so a restart is
visible as a new holder of the same lease. The defaults below are upstream's
(``pkg/controlplane/apiserver/server.go``).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import uuid
from typing import Final

IDENTITY_NAME: Final = "kube-apiserver"
LEASE_NAMESPACE: Final = "kube-system"
IDENTITY_LABEL: Final = "apiserver.kubernetes.io/identity"
# The label selector that lists the identity Leases of kube-apiservers (and no other lease).
IDENTITY_SELECTOR: Final = f"{IDENTITY_LABEL}={IDENTITY_NAME}"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
# Where peers proxy requests to the apiserver (its UnknownVersionInteroperabilityProxy).
PEER_ADDRESS_ANNOTATION: Final = "kubernetes.io/peer-advertise-address"
# How long an apiserver whose lease was deleted, and which the collector cannot ask, is
# taken to serve on (kube-apiserver's --shutdown-delay-duration; upstream's default is 0,
# managed offerings and OpenShift run 70 s); ``svledger collect --shutdown-window``.
SHUTDOWN_WINDOW_SECONDS: Final = 90.0
LEASE_DURATION_SECONDS: Final = 3600
RENEW_INTERVAL_SECONDS: Final = 10
GC_PERIOD_SECONDS: Final = 3600

_UINT16_MAX: Final = 0xFFFF


def apiserver_id(hostname: str) -> str:
    """The stable ID of the API server running on ``hostname``.

    As upstream, any hostname has one, the empty one too (upstream hashes whatever its
    hostname function returns); a caller that takes a hostname from a user refuses an
    empty one itself (:func:`check_hostname`).
    """
    encoded = hostname.encode()
    if len(encoded) > _UINT16_MAX:
        raise ValueError(
            f"hostname {hostname[:40]!r}... is {len(encoded)} bytes long; "
            f"at most {_UINT16_MAX} fit the length prefix upstream hashes"
        )
    data = b"".join(
        struct.pack(">H", len(part)) + part for part in (encoded, IDENTITY_NAME.encode())
    )
    digest = hashlib.sha256(data).digest()
    return "apiserver-" + base64.b32encode(digest[:16]).decode("ascii").rstrip("=").lower()


def check_hostname(hostname: str) -> None:
    """Refuse an empty hostname given by a user: it names no host."""
    if not hostname:
        raise ValueError("the hostname is empty; give the host the API server runs on")


def holder_identity(apiserver_id: str, instance: uuid.UUID | None = None) -> str:
    """The Lease holder identity of one run of a server: ``<ID>_<uuid>``.

    ``instance`` defaults to a fresh random UUID, as upstream draws one per start.
    """
    return f"{apiserver_id}_{instance if instance is not None else uuid.uuid4()}"
