"""Fold snapshots: one partition's fold state as of a log position, so a replay need not
start from the log's beginning.

The projector writes one (:func:`take`) for a partition each time the partition's
checkpoint passes a multiple of ``every`` offsets (:data:`SNAPSHOT_EVERY` by default),
in the transaction of the batch that passes it. A snapshot holds the view rows of the
partition's clusters and the event IDs the fold remembers of them (a row belongs to the
partition of its ``revision``: every event of a cluster is in its cluster's partition;
a :class:`~projections.state.Cluster` names its partition), with each row's creation and
each cluster's latest event time, which the read API serves from (``serve``),
the offset the fold goes on from, and the partition's **log time** there: the latest
``occurred_at`` of its events before that offset, or None where the projector cannot
know it (a checkpoint written before log times were kept). Rows are immutable, so a
snapshot is a copy of the fold's state, exactly: folding on from it gives what folding
from the beginning gives.

A replay (``svledger replay --snapshots-from URL``) takes, per partition, the latest
snapshot it may start from (:func:`latest`): at or before ``--until``, whether that
is an offset (the snapshot's offset is at most the one after it) or a time (no event
of the partition before the snapshot occurred after it, by its log time). A snapshot
whose digest or content is wrong is logged and passed over for an older one, and
with none left the partition is read from the beginning: snapshots make a replay
faster, never different. The consumers that keep a fold per partition (the lease GC,
the migrator, the worker, the collector; ``--snapshots-from URL``) rebuild it the same
way, from the latest sound snapshot at or before the partition's end
(:class:`SnapshotSource`), and so does the read API (``serve --snapshots-from URL``),
which also builds a view of a point older than its own copies of the fold from the
latest snapshot at or before that point (:meth:`SnapshotSource.find`).

The payload is the rows pickled (protocol 5) and compressed with zlib, under a
BLAKE2b digest of it and of where it belongs (projection, topic, partition, offset, log
time). It is read back with an unpickler that knows only the row classes
and :mod:`datetime`'s, so a payload that was tampered with cannot run code; its
digest is checked first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import pickle
import zlib
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

from sqlalchemy import Connection, Engine, select
from sqlalchemy.exc import SQLAlchemyError

from projections.database import DatabaseNotReady, engine, parse_url, shown
from projections.schema import fold_snapshots
from projections.state import (
    Cluster,
    Condition,
    CustomResourceDefinition,
    Lease,
    LeaseKey,
    Migration,
    MigrationKey,
    ResourceKey,
    SeenEvent,
    ServerStorageVersion,
    State,
    StorageAudit,
    StorageState,
    StorageVersion,
    seen_by_cluster,
)

log = logging.getLogger(__name__)

SNAPSHOT_EVERY: Final = 50_000  # offsets of a partition between two snapshots
# The log time of a partition with no event yet: before any event could occur.
NO_EVENTS: Final = datetime.min.replace(tzinfo=UTC)
# Of the payload; a snapshot of another format is passed over. 2: StorageVersion entries
# in upstream's order (1 held them sorted by apiserver ID). 3: the event IDs seen. 4: no
# Failed migration that a fresh success or another request has dropped since, and a
# digest that covers where the snapshot belongs too. 5: CustomResourceDefinitions.
# 6: storage audits. 7: rows' creations, and the clusters with their latest event times.
FORMAT: Final = 7

# The rows of a snapshot: leases, StorageVersions, StorageStates, migrations (the
# views), the event IDs a repeated event would be found by (State.seen), and
# CustomResourceDefinitions, storage audits and the clusters (views too, last as they
# came last).
Rows: TypeAlias = tuple[
    tuple[Lease, ...],
    tuple[StorageVersion, ...],
    tuple[StorageState, ...],
    tuple[Migration, ...],
    tuple[SeenEvent, ...],
    tuple[CustomResourceDefinition, ...],
    tuple[StorageAudit, ...],
    tuple[Cluster, ...],
]

_ALLOWED: Final = {
    "projections.state": {
        cls.__name__
        for cls in (
            Lease,
            StorageVersion,
            ServerStorageVersion,
            Condition,
            StorageState,
            Migration,
            SeenEvent,
            CustomResourceDefinition,
            StorageAudit,
            Cluster,
        )
    },
    "datetime": {"datetime", "timezone", "timedelta"},
}


class CorruptSnapshot(Exception):
    """A snapshot's payload is not what its digest or format says."""


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """One partition's fold state as of ``next_offset``, as a ``fold_snapshots`` row holds it."""

    projection: str
    topic: str
    partition: int
    next_offset: int
    log_time: datetime | None
    rows: int  # how many view rows it holds, for people looking at the table
    payload: bytes
    digest: str
    format: int = FORMAT

    def state_rows(self) -> Rows:
        """The rows it holds; :class:`CorruptSnapshot` if they are not what was written."""
        if self.format != FORMAT:
            raise CorruptSnapshot(f"format {self.format}, not {FORMAT}")
        if self.computed_digest() != self.digest:
            raise CorruptSnapshot("its payload or place does not match its digest")
        try:
            rows = _Unpickler(io.BytesIO(zlib.decompress(self.payload))).load()
        except Exception as error:  # whatever the bytes make the unpickler raise
            raise CorruptSnapshot(f"its payload does not unpickle: {error}") from None
        if not _well_formed(rows):
            raise CorruptSnapshot("its payload is not eight tuples of fold rows")
        return rows  # type: ignore[no-any-return]

    def describe(self) -> str:
        return f"snapshot of partition {self.partition} at offset {self.next_offset}"

    def computed_digest(self) -> str:
        """BLAKE2b of the payload and of where it belongs: a sound payload filed under
        another partition, offset or log time (a row copied over another) is found."""
        time = None if self.log_time is None else self.log_time.astimezone(UTC).isoformat()
        place = (self.projection, self.topic, self.partition, self.next_offset, time)
        digest = hashlib.blake2b(repr(place).encode(), digest_size=32)
        digest.update(self.payload)
        return digest.hexdigest()


def take(
    state: State,
    projection: str,
    topic: str,
    partition: int,
    next_offset: int,
    log_time: datetime | None,
) -> Snapshot:
    """A snapshot of the rows of ``state`` that belong to ``partition``."""
    prefix = f"{partition}:"
    rows: Rows = (
        _of(state.leases.values(), prefix),
        _of(state.storage_versions.values(), prefix),
        _of(state.storage_states.values(), prefix),
        _of(state.migrations.values(), prefix),
        _of((row for seen in state.seen.values() for row in seen.rows()), prefix),
        _of(state.custom_resources.values(), prefix),
        _of(state.audits.values(), prefix),
        tuple(row for row in state.clusters.values() if row.partition == partition),
    )
    payload = zlib.compress(pickle.dumps(rows, protocol=5), 1)
    unsigned = Snapshot(
        projection,
        topic,
        partition,
        next_offset,
        log_time,
        sum(len(group) for index, group in enumerate(rows) if index != 4),
        payload,
        "",
    )
    return dataclasses.replace(unsigned, digest=unsigned.computed_digest())


def state_of(rows: Iterable[Rows], cluster: str | None = None) -> State:
    """The fold state made of snapshots' rows (only ``cluster``'s, if given)."""
    leases: dict[LeaseKey, Lease] = {}
    storage_versions: dict[ResourceKey, StorageVersion] = {}
    storage_states: dict[ResourceKey, StorageState] = {}
    migrations: dict[MigrationKey, Migration] = {}
    seen: list[SeenEvent] = []
    custom_resources: dict[ResourceKey, CustomResourceDefinition] = {}
    audits: dict[ResourceKey, StorageAudit] = {}
    clusters: dict[str, Cluster] = {}
    for (
        lease_rows,
        version_rows,
        state_rows,
        migration_rows,
        seen_rows,
        crd_rows,
        audit_rows,
        cluster_rows,
    ) in rows:
        leases.update(_keyed(lease_rows, cluster))
        storage_versions.update(_keyed(version_rows, cluster))
        storage_states.update(_keyed(state_rows, cluster))
        migrations.update(_keyed(migration_rows, cluster))
        seen.extend(row for row in seen_rows if cluster is None or row.cluster == cluster)
        custom_resources.update(_keyed(crd_rows, cluster))
        audits.update(_keyed(audit_rows, cluster))
        clusters.update(_keyed(cluster_rows, cluster))
    return State(
        leases,
        storage_versions,
        storage_states,
        migrations,
        seen_by_cluster(seen),
        custom_resources,
        audits,
        clusters,
    )


def latest(
    connection: Connection,
    projection: str,
    topic: str,
    partition: int,
    *,
    limit: int,
    until_time: datetime | None = None,
    source: str = "the database",
) -> tuple[Snapshot, Rows] | None:
    """The latest sound snapshot of ``partition`` a replay may start from, and its rows.

    ``limit``: the offset the replay reads up to (exclusive); ``until_time``: the
    replay stops at the partition's first event that occurred after it. None if no
    snapshot qualifies: the replay reads the partition from its beginning.
    """
    table = fold_snapshots
    query = (
        select(table.c.next_offset)
        .where(
            table.c.projection == projection,
            table.c.topic == topic,
            table.c.log_partition == partition,
            table.c.next_offset <= limit,
        )
        .order_by(table.c.next_offset.desc())
    )
    if until_time is not None:
        query = query.where(table.c.log_time.is_not(None), table.c.log_time <= until_time)
    for next_offset in list(connection.scalars(query)):
        snapshot = _load(connection, projection, topic, partition, next_offset)
        try:
            return snapshot, snapshot.state_rows()
        except CorruptSnapshot as error:
            log.warning(
                "%s in %s is unusable (%s); trying an older one, else the log itself",
                snapshot.describe(),
                source,
                error,
            )
    return None


class SnapshotSource:
    """A projection database (the projector's) to start partitions' folds from.

    For a consumer that rebuilds a partition's fold from the log whenever it is
    assigned one (:mod:`consumers.partitions`): :meth:`start` gives the state and the
    offset of the latest sound snapshot of the partition, from which the fold reads
    on instead of from the log's beginning. A database that cannot be read (down,
    not migrated, a wrong URL) is logged, naming it, and the partition is read from
    its beginning: slower, never different.
    """

    def __init__(self, url: str, projection: str) -> None:
        self.url = url
        self.projection = projection
        # As logs show it, without the password; a URL that is no database's fails here.
        self.shown = shown(parse_url(url))
        self._db: Engine | None = None

    def start(self, topic: str, partition: int, limit: int) -> tuple[int, State] | None:
        """The offset and fold state of the latest sound snapshot of ``partition`` of
        ``topic`` at or before offset ``limit``; None to read it from the beginning."""
        found = self.find(topic, partition, limit)
        if found is None:
            return None
        snapshot, rows = found
        return snapshot.next_offset, state_of([rows])

    def find(
        self, topic: str, partition: int, limit: int, until_time: datetime | None = None
    ) -> tuple[Snapshot, Rows] | None:
        """The latest sound snapshot of ``partition`` of ``topic`` a fold up to ``limit``
        (and ``until_time``) may start from (:func:`latest`), and its rows; None to read
        the partition from its beginning."""
        try:
            if self._db is None:
                self._db = engine(self.url)
            with self._db.connect() as connection:
                return latest(
                    connection,
                    self.projection,
                    topic,
                    partition,
                    limit=limit,
                    until_time=until_time,
                    source=self.shown,
                )
        except (DatabaseNotReady, SQLAlchemyError) as error:
            log.warning(
                "cannot read fold snapshots of partition %d from %s, so it is read from the"
                " log's beginning: %s",
                partition,
                self.shown,
                str(error).strip().splitlines()[0],
            )
            return None

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
            self._db = None


def row_values(snapshot: Snapshot) -> dict[str, Any]:
    """``snapshot`` as a ``fold_snapshots`` row."""
    return {
        "projection": snapshot.projection,
        "topic": snapshot.topic,
        "log_partition": snapshot.partition,
        "next_offset": snapshot.next_offset,
        "log_time": snapshot.log_time,
        "format": snapshot.format,
        "row_count": snapshot.rows,
        "digest": snapshot.digest,
        "payload": snapshot.payload,
    }


def _load(
    connection: Connection, projection: str, topic: str, partition: int, next_offset: int
) -> Snapshot:
    table = fold_snapshots
    row = (
        connection.execute(
            select(table).where(
                table.c.projection == projection,
                table.c.topic == topic,
                table.c.log_partition == partition,
                table.c.next_offset == next_offset,
            )
        )
        .mappings()
        .one()
    )
    return Snapshot(
        row["projection"],
        row["topic"],
        row["log_partition"],
        row["next_offset"],
        row["log_time"],
        row["row_count"],
        bytes(row["payload"]),
        row["digest"],
        row["format"],
    )


def _of(rows: Iterable[Any], prefix: str) -> tuple[Any, ...]:
    return tuple(row for row in rows if row.revision.startswith(prefix))


def _keyed(rows: Iterable[Any], cluster: str | None) -> Iterator[tuple[Any, Any]]:
    return ((row.key, row) for row in rows if cluster is None or row.cluster == cluster)


def _well_formed(rows: object) -> bool:
    kinds = (
        Lease,
        StorageVersion,
        StorageState,
        Migration,
        SeenEvent,
        CustomResourceDefinition,
        StorageAudit,
        Cluster,
    )
    return (
        isinstance(rows, tuple)
        and len(rows) == len(kinds)
        and all(
            isinstance(group, tuple) and all(type(row) is kind for row in group)
            for group, kind in zip(rows, kinds, strict=True)
        )
    )


class _Unpickler(pickle.Unpickler):
    """Makes only fold rows and times: any other global in a payload is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a fold row")
