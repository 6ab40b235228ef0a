"""Comparing the ledger with what real kube-apiservers publish, for the real-cluster tests."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias
from urllib.parse import quote

from kubernetes_asyncio.client import Configuration

from kube.client import Kube
from kube.upstream import SOURCE, parse_lease, parse_storage_version
from ledger.events import SOURCE_STORAGE_VERSION, ApiserverHeartbeat, StorageVersionReported
from ledger.identity import IDENTITY_SELECTOR
from ledger.kafka import Record
from ledger.names import resource_name
from projections.fold import apply
from projections.state import State

# name -> (entries by apiserver ID: (encoding, decodable versions, served versions, each in
# the order upstream lists them), common version, condition (type, status, reason))
Views: TypeAlias = dict[
    str, tuple[dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]], Any, Any]
]
# apiserver ID -> (holder, hostname, duration, renew time)
Leases: TypeAlias = dict[str, tuple[str, str, int, Any]]

# Identity leases short enough to watch them end in a test: upstream's are 3600 s,
# renewed every 10 s, expired ones collected hourly.
KUBE_LEASE_SECONDS = 20
KUBE_RENEW_SECONDS = 2.0
KUBE_LEASE_GC_SECONDS = 5.0


def ledger_views(state: State, cluster: str, source: str | None = None) -> Views:
    """The ledger's StorageVersions as :func:`upstream_views` shows upstream's: one entry
    per apiserver, the one read from its StorageVersion entry where there is one (the
    ledger also holds what its discovery shows, which must agree). With ``source``, only
    the entries read from it, and the StorageVersions that have some."""
    views: Views = {}
    for (c, group, resource), sv in state.storage_versions.items():
        if c != cluster:
            continue
        shown = [e for e in sv.entries if source is None or e.source == source]
        if not shown:
            continue
        preferred = sorted(shown, key=lambda e: e.source != SOURCE_STORAGE_VERSION)
        entries = {
            e.apiserver_id: (
                e.encoding_version,
                e.decodable_versions,
                e.served_versions,
            )
            for e in reversed(preferred)
        }
        condition = (sv.condition.type, sv.condition.status, sv.condition.reason)
        views[resource_name(group, resource)] = (entries, sv.common_encoding_version, condition)
    return views


def ledger_leases(state: State, cluster: str) -> Leases:
    return {
        a: (lease.holder_identity, lease.hostname, lease.lease_duration_seconds, lease.renew_time)
        for (c, a), lease in state.leases.items()
        if c == cluster
    }


async def upstream_views(kube: Kube) -> Views:
    listed = await kube.get("/apis/internal.apiserver.k8s.io/v1alpha1/storageversions")
    views: Views = {}
    for obj in listed["items"]:
        entries = {
            e.apiserver_id: (
                e.encoding_version,
                e.decodable_versions,
                e.served_versions,
            )
            for e in parse_storage_version(obj).values()
        }
        status = obj.get("status") or {}
        conditions = [(c["type"], c["status"], c["reason"]) for c in status.get("conditions") or ()]
        if not entries:
            continue  # the GC deletes such objects; the ledger has none
        views[obj["metadata"]["name"]] = (
            entries,
            status.get("commonEncodingVersion"),
            conditions[0] if conditions else None,
        )
    return views


async def upstream_leases(kube: Kube) -> Leases:
    listed = await kube.get(
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
        f"?labelSelector={quote(IDENTITY_SELECTOR)}"
    )
    leases = [parse_lease(obj) for obj in listed["items"]]
    return {
        lease.apiserver_id: (
            lease.holder_identity,
            lease.hostname,
            lease.lease_duration_seconds,
            lease.renew_time,
        )
        for lease in leases
    }


async def eventually(
    check: Callable[[], Awaitable[str | None]], what: str, timeout: float = 120.0
) -> None:
    """Wait until ``check`` returns None (it returns what is still wrong otherwise)."""
    deadline = time.monotonic() + timeout
    wrong: str | None = "not checked"
    while time.monotonic() < deadline:
        wrong = await check()
        if wrong is None:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s: {wrong}")


def kube_at(url: str) -> Kube:
    """A client of the server at ``url``, without credentials (a stand-in's, say)."""
    configuration = Configuration()
    configuration.host = url.rstrip("/")
    return Kube(configuration)


def assert_nothing_twice(records: list[Record]) -> None:
    """Each renewal is one heartbeat; every report changed the fold; the fold refused none
    of the collector's events (lease GC's, where it runs, may be stale)."""
    renewals = collections.Counter(
        (r.event.apiserver_id, r.event.holder_identity, r.event.renew_time)
        for r in records
        if isinstance(r.event, ApiserverHeartbeat)
    )
    assert [r for r, n in renewals.items() if n > 1] == []
    state = State()
    for record in records:
        changes = apply(state, record.event, record.position)
        if record.event.meta.source == SOURCE:
            assert changes.rejections == [], changes.rejections
        if isinstance(record.event, StorageVersionReported):
            assert changes.storage_versions, f"{record.position}: a report that changed nothing"
