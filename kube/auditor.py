"""``svledger audit --cluster NAME``: count what the cluster's etcd stores, and append it.

Everything else svledger says about storage is inferred from reports and migrations;
the audit looks. It reads the cluster's etcd strictly read-only (:class:`Store`:
:mod:`kube.etcd`), every key at **one** revision, the current one when the read begins,
so the counts are one moment of the store however long the read takes; in pages of
``page_size`` keys, at most ``pages_per_second`` requests a second, so a large
cluster's etcd serves its apiservers first; only under the prefixes of the resources
asked for (:meth:`kube.store_layout.Layout.prefixes`). Each page is counted by
:class:`kube.audit.Audit` (:func:`read_store`).

The ledger is read twice, the cluster's partition folded to its end: when the audit
begins (which resources the ledger knows, where their keys are, what it holds objects
may be stored in) and when it ends; a version found in neither's persisted hashes is
pollution (:func:`projections.audits.pollution`). Then one ``StorageAudited`` per
resource audited (those with keys, and those asked for or known to the ledger with
none) is appended, all in **one** Kafka transaction: an audit that fails anywhere (etcd
unreachable, refused, compacted past its revision; Kafka down) appends nothing, and no
reader ever sees part of one.

Given the apiservers' ``EncryptionConfiguration`` (``--encryption-provider-config``),
every key it names for a resource is counted, 0 included, so ``explain`` can say which
keys no longer encrypt anything (:mod:`kube.encryption`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from kube.audit import Audit, Tally
from kube.client import RateLimit
from kube.encryption import IDENTITY, keys_for
from kube.store_layout import Layout, prefix_end
from ledger.events import Meta, StorageAudited
from ledger.hashing import hash_of_stored
from ledger.kafka import (
    Addressed,
    Placements,
    TransactionalProducer,
    to_record,
)
from ledger.names import resource_name
from ledger.settings import KafkaSettings
from projections.audits import pollution
from projections.history import resolve
from projections.replay import cluster_log
from projections.state import ResourceKey, State

log = logging.getLogger(__name__)

SOURCE: Final = "svledger-audit"
PAGE_SIZE: Final = 500
PAGES_PER_SECOND: Final = 20.0


class Store(Protocol):
    """etcd, read only: :class:`kube.etcd.EtcdStore`."""

    async def revision(self) -> int:
        """The store's current revision."""
        ...

    async def count(self, start: bytes, end: bytes, revision: int) -> int:
        """How many keys ``[start, end)`` holds at ``revision``."""
        ...

    async def page(
        self, start: bytes, end: bytes, revision: int, limit: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """At most ``limit`` (key, value) pairs of ``[start, end)`` at ``revision``, by key,
        and the bytes the answer took."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class AuditOptions:
    """What to audit and how gently."""

    cluster: str
    prefix: str = "/registry"
    resources: tuple[str, ...] = ()  # names as explain takes them; none: every resource
    page_size: int = PAGE_SIZE
    pages_per_second: float = PAGES_PER_SECOND
    encryption: Mapping[str, Any] | None = None  # a parsed EncryptionConfiguration

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page size {self.page_size} must be at least 1, e.g. {PAGE_SIZE}")
        if self.pages_per_second <= 0:
            raise ValueError(
                f"pages per second {self.pages_per_second} must be above 0, e.g. {PAGES_PER_SECOND}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """An audit: its events (appended), and what reading the store took."""

    events: tuple[StorageAudited, ...]
    revision: int
    keys: int
    requests: int
    bytes_read: int
    unplaced: int
    seconds: float


# Told the keys counted so far and the keys to count in all.
Progress = Callable[[int, int], None]


async def run_audit(
    settings: KafkaSettings,
    store: Store,
    options: AuditOptions,
    *,
    progress: Progress | None = None,
    append: bool = True,
) -> Result:
    """Audit ``options.cluster``'s store and append what it found (see the module doc)."""
    began = time.monotonic()
    before, offset = await _ledger(settings, options.cluster)
    layout = _layout(before, options)
    wanted = [_resolve(before, layout, options, name) for name in options.resources]
    audit = await read_store(
        store,
        layout,
        layout.prefixes(wanted or None),
        options.page_size,
        options.pages_per_second,
        progress,
    )
    revision = audit.revision
    after, _ = await _ledger(settings, options.cluster)
    audit_id = str(uuid.uuid4())
    tallies = {(t.group, t.resource): t for t in audit.tallies}
    covered = sorted(set(tallies) | set(wanted or _known(before)))
    now = datetime.now(UTC)
    events = tuple(
        _event(
            Meta.new(options.cluster, SOURCE, now),
            audit_id,
            tallies.get(key) or Tally(*key, 0, 0, (), (), 0, ()),
            before,
            after,
            offset,
            revision,
            options,
        )
        for key in covered
    )
    if audit.unplaced:
        log.warning(
            "keys holding no object of a resource the ledger knows: %d; the first: %s",
            audit.unplaced,
            "; ".join(f"{u.key} ({u.reason})" for u in audit.unplaced_kept),
        )
    if append:
        await _append(settings, options.cluster, events)
    return Result(
        events,
        revision,
        audit.keys,
        audit.pages,
        audit.bytes_read,
        audit.unplaced,
        time.monotonic() - began,
    )


async def read_store(
    store: Store,
    layout: Layout,
    prefixes: Sequence[str],
    page_size: int,
    pages_per_second: float,
    progress: Progress | None = None,
) -> Audit:
    """Every key under ``prefixes`` at the store's current revision, counted by ``layout``:
    first how many there are (one request per prefix), then in pages of ``page_size``
    keys, at most ``pages_per_second`` pages a second."""
    revision = await store.revision()
    ranges = [(p.encode(), prefix_end(p.encode())) for p in prefixes]
    total = sum([await store.count(start, end, revision) for start, end in ranges])
    audit = Audit(layout, revision)
    pace = RateLimit(pages_per_second, burst=1)  # a page at once, then one per 1/rate s
    for start, end in ranges:
        while True:
            await pace.wait()
            pairs, size = await store.page(start, end, revision, page_size)
            audit.add_page(
                [(k.decode("utf-8", errors="surrogateescape"), v) for k, v in pairs],
                bytes_read=size,
            )
            if progress is not None:
                progress(audit.keys, total)
            if len(pairs) < page_size:
                break
            start = pairs[-1][0] + b"\0"  # strictly after the last key
    return audit


async def _ledger(settings: KafkaSettings, cluster: str) -> tuple[State, int]:
    """The cluster's fold as the log stands, and the offset after its last record."""
    state, records = await cluster_log(settings, cluster)
    return state, max((r.position.offset + 1 for r in records), default=0)


def _known(state: State) -> set[tuple[str, str]]:
    """The resources the ledger knows: reported ones, and those of its CRDs."""
    return {key[1:] for key in (*state.storage_states, *state.custom_resources)}


def _layout(state: State, options: AuditOptions) -> Layout:
    custom = {key[1:] for key in state.custom_resources}
    return Layout.of(_known(state) - custom, custom, options.prefix)


def _resolve(state: State, layout: Layout, options: AuditOptions, name: str) -> tuple[str, str]:
    """The (group, resource) ``name`` designates, as ``explain`` names resources."""
    key = resolve(
        name,
        options.cluster,
        {(options.cluster, *resource) for resource in _known(state)},
        source="the ledger",
        advice="check --cluster and that svledger collect has reported it",
    )
    return key[1], key[2]


def _event(
    meta: Meta,
    audit_id: str,
    tally: Tally,
    before: State,
    after: State,
    offset: int,
    revision: int,
    options: AuditOptions,
) -> StorageAudited:
    key: ResourceKey = (options.cluster, tally.group, tally.resource)
    kinds = dict(tally.kinds)
    versions = tuple(version for version, _ in tally.versions)
    counts = tuple(count for _, count in tally.versions)
    hashes = tuple(hash_of_stored(version, kinds.get(version, "")) for version in versions)
    encryption = dict(tally.encryption)
    configured = () if options.encryption is None else keys_for(options.encryption, *key[1:])
    plain = sum(counts)
    keys = (*configured, *sorted(set(encryption) - set(configured)))
    key_counts = tuple(plain if k == IDENTITY else encryption.get(k, 0) for k in keys)
    polluted, why = pollution(before, after, key, versions, hashes, counts, revision)
    return StorageAudited(
        meta=meta,
        audit_id=audit_id,
        group=tally.group,
        resource=tally.resource,
        etcd_revision=revision,
        ledger_offset=offset,
        objects=tally.objects,
        total_bytes=tally.bytes,
        versions=versions,
        version_hashes=hashes,
        version_counts=counts,
        encryption_keys=keys,
        encryption_counts=key_counts,
        undecodable=tally.undecodable,
        undecodable_keys=tuple(f"{u.key}: {u.reason}" for u in tally.undecodable_kept),
        polluted_versions=polluted,
        pollution=why,
    )


async def _append(settings: KafkaSettings, cluster: str, events: Sequence[StorageAudited]) -> None:
    """Append every event of the audit in one transaction, or none."""
    (partition,) = (await Placements(settings).where([cluster], place=True)).values()
    producer = TransactionalProducer(settings, f"{SOURCE}-{settings.topic}-{cluster}")
    await producer.start()
    try:
        await producer.commit(
            [Addressed(settings.topic, partition, to_record(event)) for event in events]
        )
    finally:
        await producer.stop()


def describe(result: Result) -> str:
    """The audit in a few lines, for the terminal."""
    lines = [
        f"etcd revision {result.revision}: {result.keys} keys in {result.requests} requests,"
        f" {result.bytes_read} bytes, {result.seconds:.1f} s"
        + (f"; {result.unplaced} keys of no resource the ledger knows" if result.unplaced else "")
    ]
    for event in result.events:
        found = ", ".join(
            f"{count} {version}"
            for version, count in zip(event.versions, event.version_counts, strict=True)
        )
        keys = ", ".join(
            f"{count} {key}"
            for key, count in zip(event.encryption_keys, event.encryption_counts, strict=True)
        )
        parts = [part for part in (found, keys) if part]
        if event.undecodable:
            parts.append(f"{event.undecodable} undecodable")
        lines.append(
            f"{resource_name(event.group, event.resource)}: {event.objects} objects"
            + (f" ({'; '.join(parts)})" if parts else "")
            + (f"  POLLUTED: {event.pollution}" if event.pollution else "")
        )
    return "\n".join(lines)
