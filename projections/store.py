"""Moving the fold's state in and out of the SQL views.

:func:`commit` is the projector's one transaction per batch. It locks the SQL
checkpoint of every partition in the batch and checks it is the one the batch was
folded from (else :class:`StaleProjection`: another projector wrote meanwhile),
then :func:`write` puts the batch's events into ``ledger_events`` (and
``rejected_events``), exactly the view rows the batch changed, and the new
checkpoint. The events go first: their key is the log position, so a batch that
was already written fails on its first statement and the caller's rollback leaves
the database as it was. The checkpoint commits with the rows it accounts for, so a
crash anywhere either keeps both or loses both, and the projector resumes from the
checkpoint without applying anything twice.

Rows are written with one statement per table and kind of statement, never one
round trip per row: plain inserts (every event, StorageVersion entries) by binary
``COPY`` on PostgreSQL and executemany on SQLite, upserts by executemany of
``INSERT .. ON CONFLICT DO UPDATE``, which SQLite and PostgreSQL spell the same
way. A :class:`Batch` holds the changed rows themselves, not the live state, so
the projector can write one batch while it folds the next.

:func:`load_state` is the inverse (how a projector resumes, and how a replay
continues from a snapshot database); :func:`views_snapshot` dumps every view in a
canonical order so two databases can be compared row for row.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import typing
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeAlias, TypeVar

from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    Insert,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from ledger.events import EVENT_TYPES, ApiserverHeartbeat, Event, Position, type_name
from projections.crds import stored_version_verdicts
from projections.database import writing
from projections.fold import subject
from projections.schema import (
    apiserver_leases,
    clusters,
    custom_resource_definitions,
    database_identity,
    fold_snapshots,
    json_text,
    lease_renewals,
    ledger_events,
    projection_checkpoints,
    rejected_events,
    server_storage_versions,
    storage_audits,
    storage_states,
    storage_version_migrations,
    storage_versions,
)
from projections.snapshots import Rows, Snapshot, row_values
from projections.snapshots import latest as latest_snapshot
from projections.state import (
    Changes,
    Cluster,
    Condition,
    CustomResourceDefinition,
    HolderKey,
    Lease,
    LeaseKey,
    Migration,
    MigrationKey,
    Rejection,
    RenewalCount,
    ResourceKey,
    SeenEvent,
    SeenEvents,
    ServerStorageVersion,
    State,
    StorageAudit,
    StorageState,
    StorageVersion,
    seen_horizon,
)

VIEWS: Final = (
    apiserver_leases,
    storage_versions,
    server_storage_versions,
    storage_states,
    storage_version_migrations,
    custom_resource_definitions,
    storage_audits,
    clusters,
    ledger_events,
    rejected_events,
    lease_renewals,
)

# The views that are the fold's state; the others in VIEWS are history (events, rejections,
# renewal counts), which a replay started from fold snapshots has from the snapshot on.
STATE_VIEWS: Final = tuple(
    table.name
    for table in (
        apiserver_leases,
        storage_versions,
        server_storage_versions,
        storage_states,
        storage_version_migrations,
        custom_resource_definitions,
        storage_audits,
        clusters,
    )
)

Key = TypeVar("Key", bound=tuple[str, ...])
Row = TypeVar("Row")


# A CustomResourceDefinition row as a batch carries it: with what the ledger makes of each
# version of its storedVersions (projections.crds), as the view's JSON holds it.
CrdRow: TypeAlias = tuple[CustomResourceDefinition, list[dict[str, Any]]]

# A folded event as a batch carries it: its ``ledger_events`` row but the topic and
# outcome (log partition and offset, meta's fields, event type, subject and payload
# as JSON text; see :func:`logged`). A plain tuple, because batches are pickled and it
# pickles fastest.
LoggedEvent: TypeAlias = tuple[
    int, int, str, str, str, str, datetime, str, str | None, str | None, str
]


class StaleProjection(Exception):
    """The database's checkpoint is not the one a batch was folded from."""


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """One folded batch, as :func:`write` puts it in the database.

    Its events' ``ledger_events`` rows (:func:`logged`), the view rows the batch
    changed (``None`` for a row it deleted), and the checkpoints it moves from and to.
    Nothing in it refers to the live state, so a batch can be written while the fold
    goes on with the next one, and it pickles cheaply for the writer process
    (:mod:`projections.writer`): tuples of strings, numbers and times.
    """

    topic: str
    projection: str
    events: Sequence[LoggedEvent]
    rejections: Sequence[Rejection]
    leases: Mapping[LeaseKey, Lease | None]
    storage_versions: Mapping[ResourceKey, StorageVersion | None]
    storage_states: Mapping[ResourceKey, StorageState | None]
    migrations: Mapping[MigrationKey, Migration | None]
    # Per partition with records in the batch: the checkpoint the database must hold
    # before it (absent: none yet), and the one it holds after.
    start_offsets: Mapping[int, int]
    next_offsets: Mapping[int, int]
    # The plain lease renewals of the batch, per holder (projections.thinning).
    renewals: Mapping[HolderKey, RenewalCount] = dataclasses.field(default_factory=dict)
    # Per partition in next_offsets: its log time there (projections.snapshots), None
    # if unknown; and the fold snapshots taken at the batch's end.
    log_times: Mapping[int, datetime | None] = dataclasses.field(default_factory=dict)
    snapshots: Sequence[Snapshot] = ()
    custom_resources: Mapping[ResourceKey, CrdRow | None] = dataclasses.field(default_factory=dict)
    audits: Mapping[ResourceKey, StorageAudit | None] = dataclasses.field(default_factory=dict)
    # The clusters whose latest event time the batch moved (never deleted).
    clusters: Sequence[Cluster] = ()

    @classmethod
    def of(
        cls,
        state: State,
        changes: Changes,
        events: Sequence[LoggedEvent],
        topic: str,
        projection: str,
        start_offsets: Mapping[int, int],
        *,
        renewals: Mapping[HolderKey, RenewalCount] | None = None,
        next_offsets: Mapping[int, int] | None = None,
        log_times: Mapping[int, datetime | None] | None = None,
        snapshots: Sequence[Snapshot] = (),
    ) -> Batch:
        """The batch of ``events``, ``state`` and ``changes`` being after it.

        ``events`` are the folded events in log order; ``changes`` are their
        changes; ``start_offsets`` the checkpoint the fold started from;
        ``renewals`` the plain renewals counted instead of logged; ``next_offsets``
        the checkpoint after the batch (default: past its last event), which also
        covers renewals and dead letters; ``log_times`` the partitions' log times
        there (default: unknown); ``snapshots`` those taken at the batch's end.
        """
        if next_offsets is None:
            next_offsets = {partition: offset + 1 for partition, offset, *_ in events}
        return cls(
            topic,
            projection,
            events,
            tuple(changes.rejections),
            _rows(changes.leases, state.leases),
            _rows(changes.storage_versions, state.storage_versions),
            _rows(changes.storage_states, state.storage_states),
            _rows(changes.migrations, state.migrations),
            {p: start_offsets[p] for p in next_offsets if p in start_offsets},
            dict(next_offsets),
            dict(renewals or {}),
            {p: (log_times or {}).get(p) for p in next_offsets},
            tuple(snapshots),
            _crd_rows(state, changes),
            _rows(changes.audits, state.audits),
            tuple(state.clusters[cluster] for cluster in sorted(changes.clusters)),
        )

    @classmethod
    def whole(
        cls,
        state: State,
        topic: str,
        projection: str,
        next_offsets: Mapping[int, int],
        log_times: Mapping[int, datetime | None],
        snapshots: Sequence[Snapshot],
    ) -> Batch:
        """The batch that writes all of ``state`` into a fresh database, checkpointed at
        ``next_offsets`` with ``log_times``: a fold that starts from ``snapshots``."""
        return cls.of(
            state,
            Changes.everything(state),
            (),
            topic,
            projection,
            {},
            next_offsets=next_offsets,
            log_times=log_times,
            snapshots=snapshots,
        )


def commit(db: Engine, batch: Batch) -> None:
    """Write ``batch`` and its checkpoint in one transaction, if the database is where it starts.

    Raises :class:`StaleProjection`, writing nothing, unless the database's checkpoint
    of every partition in the batch is the batch's ``start_offsets``.
    """
    if not batch.next_offsets:
        return
    with db.begin() as connection:
        committed = _locked_checkpoints(connection, batch)
        if committed != batch.start_offsets:
            raise StaleProjection(
                f"projection {batch.projection!r} of topic {batch.topic!r} is at"
                f" {_offsets(committed)} in the database, not {_offsets(batch.start_offsets)}"
                " as this projector's state; another projector wrote it meanwhile"
            )
        write(connection, batch)


def _locked_checkpoints(connection: Connection, batch: Batch) -> dict[int, int]:
    # FOR UPDATE makes a concurrent writer of the same partitions wait for this
    # transaction and then see its checkpoint (SQLite writers are serialized anyway).
    table = projection_checkpoints
    rows = connection.execute(
        select(table.c.log_partition, table.c.next_offset)
        .where(
            table.c.projection == batch.projection,
            table.c.topic == batch.topic,
            table.c.log_partition.in_(sorted(batch.next_offsets)),
        )
        .with_for_update()
    )
    return {partition: offset for partition, offset in rows}


def _offsets(offsets: Mapping[int, int]) -> str:
    shown = ", ".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
    return f"{{{shown}}}" if shown else "the beginning"


def write(connection: Connection, batch: Batch) -> None:
    """Write a batch's events, the rows it changed, and its checkpoint.

    Runs in the caller's transaction and raises
    :class:`sqlalchemy.exc.IntegrityError` if any event was written before.
    """
    if not batch.next_offsets:
        return
    topic = batch.topic
    rejected = {Position.parse(rejection.revision): rejection for rejection in batch.rejections}
    events = []
    rejected_rows = []
    for event in batch.events:
        partition, offset = event[0], event[1]
        rejection = rejected.get(Position(partition, offset))
        events.append((topic, *event, "applied" if rejection is None else "rejected"))
        if rejection is not None:
            rejected_rows.append(
                (
                    topic,
                    partition,
                    offset,
                    rejection.cluster,
                    rejection.event_id,
                    rejection.event_type,
                    rejection.subject,
                    event[6],  # occurred_at
                    rejection.reason,
                )
            )
    _insert_rows(connection, ledger_events, events)
    _insert_rows(connection, rejected_events, rejected_rows)
    _count_renewals(connection, topic, batch.renewals)

    _sync(connection, apiserver_leases, batch.leases, _values(apiserver_leases))
    # A StorageVersion's entries are replaced as a whole: the changed resources'
    # entries go, then the current ones of those that still exist come back.
    _delete(connection, server_storage_versions, batch.storage_versions.keys())
    _sync(connection, storage_versions, batch.storage_versions, _storage_version_values)
    _insert_rows(
        connection,
        server_storage_versions,
        [
            _entry_row(storage_version, ordinal, entry)
            for _, storage_version in sorted(batch.storage_versions.items())
            if storage_version is not None
            for ordinal, entry in enumerate(storage_version.entries)
        ],
    )
    _sync(connection, storage_states, batch.storage_states, _values(storage_states))
    _sync(
        connection,
        storage_version_migrations,
        batch.migrations,
        _values(storage_version_migrations),
    )
    _sync(connection, custom_resource_definitions, batch.custom_resources, _crd_values)
    _sync(connection, storage_audits, batch.audits, _values(storage_audits))
    _upsert(connection, clusters, [_cluster_values(row) for row in batch.clusters])
    _upsert(
        connection,
        projection_checkpoints,
        [
            {
                "projection": batch.projection,
                "topic": batch.topic,
                "log_partition": p,
                "next_offset": n,
                "log_time": batch.log_times.get(p),
            }
            for p, n in sorted(batch.next_offsets.items())
        ],
    )
    if batch.snapshots:
        connection.execute(insert(fold_snapshots), [row_values(s) for s in batch.snapshots])


def _count_renewals(
    connection: Connection, topic: str, renewals: Mapping[HolderKey, RenewalCount]
) -> None:
    """Add a batch's plain renewals to each holder's count."""
    if not renewals:
        return
    table = lease_renewals
    statement = _INSERTS[connection.dialect.name](table)
    statement = statement.on_conflict_do_update(
        index_elements=[column.name for column in table.primary_key.columns],
        set_={
            "last_offset": statement.excluded.last_offset,
            "renewals": table.c.renewals + statement.excluded.renewals,
        },
    )
    connection.execute(
        statement,
        [
            {
                "cluster": cluster,
                "apiserver_id": apiserver_id,
                "holder_identity": holder,
                "topic": topic,
                "log_partition": count.partition,
                "first_offset": count.first_offset,
                "last_offset": count.last_offset,
                "renewals": count.renewals,
            }
            for (cluster, apiserver_id, holder), count in sorted(renewals.items())
        ],
    )


def database_id(connection: Connection) -> str:
    """The database's own random ID (``database_identity``), the same by every URL; a
    new one if its row was deleted (the tables emptied by hand)."""
    query = select(database_identity.c.database_id)
    found: str | None = connection.execute(query).scalar()
    if found is None:
        connection.rollback()
        row = {"singleton": 1, "database_id": uuid.uuid4().hex[:12]}
        try:  # in a transaction that begins as a writer, on a connection of its own
            with writing(connection.engine).begin() as writer:
                writer.execute(insert(database_identity).values(row))
        except IntegrityError:  # another projector made it meanwhile: the one row
            pass
        found = connection.execute(query).scalar_one()
    return found


def load_checkpoints(connection: Connection, topic: str, projection: str) -> dict[int, int]:
    """The next offset to consume, per partition, of ``projection`` on ``topic``."""
    rows = connection.execute(
        select(projection_checkpoints.c.log_partition, projection_checkpoints.c.next_offset).where(
            projection_checkpoints.c.projection == projection,
            projection_checkpoints.c.topic == topic,
        )
    )
    return {partition: offset for partition, offset in rows}


def load_log_times(
    connection: Connection, topic: str, projection: str
) -> dict[int, datetime | None]:
    """Each checkpointed partition's log time (:mod:`projections.snapshots`), None if unknown."""
    table = projection_checkpoints
    rows = connection.execute(
        select(table.c.log_partition, table.c.log_time).where(
            table.c.projection == projection, table.c.topic == topic
        )
    )
    return {partition: log_time for partition, log_time in rows}


def load_state(connection: Connection, resource: ResourceKey | None = None) -> State:
    """The fold's state as the views hold it; with ``resource``, only that resource's rows
    (its StorageVersion, StorageState and migrations, and the leases of its cluster)."""
    entries: dict[ResourceKey, list[tuple[int, ServerStorageVersion]]] = defaultdict(list)
    for row in connection.execute(_select(server_storage_versions, resource)).mappings():
        entries[row["cluster"], row["api_group"], row["resource"]].append(
            (
                row["ordinal"],
                ServerStorageVersion(
                    apiserver_id=row["apiserver_id"],
                    encoding_version=row["encoding_version"],
                    decodable_versions=tuple(row["decodable_versions"]),
                    served_versions=tuple(row["served_versions"]),
                    source=row["source"],
                ),
            )
        )
    versions: dict[ResourceKey, StorageVersion] = {}
    for row in connection.execute(_select(storage_versions, resource)).mappings():
        storage_version = StorageVersion(
            cluster=row["cluster"],
            group=row["api_group"],
            resource=row["resource"],
            kind=row["kind"],
            entries=tuple(
                entry
                for _, entry in sorted(
                    entries[row["cluster"], row["api_group"], row["resource"]],
                    key=operator.itemgetter(0),
                )
            ),
            common_encoding_version=row["common_encoding_version"],
            condition=Condition(
                type=row["condition_type"],
                status=row["condition_status"],
                reason=row["condition_reason"],
                message=row["condition_message"],
                last_transition_time=row["condition_last_transition_time"],
            ),
            revision=row["revision"],
            created_revision=row["created_revision"],
            created_at=row["created_at"],
        )
        versions[storage_version.key] = storage_version

    # Built in one go: the State derives its indexes from the rows it is given.
    return State(
        leases=_load(connection, apiserver_leases, Lease, resource),
        storage_versions=versions,
        storage_states=_load(connection, storage_states, StorageState, resource),
        migrations=_load(connection, storage_version_migrations, Migration, resource),
        seen={} if resource is not None else _load_seen(connection),
        custom_resources=_load(
            connection, custom_resource_definitions, CustomResourceDefinition, resource
        ),
        audits=_load(connection, storage_audits, StorageAudit, resource),
        clusters=_load(connection, clusters, Cluster, resource),
    )


def _load_seen(connection: Connection) -> dict[str, SeenEvents]:
    """The event IDs the fold remembers (:class:`~projections.state.SeenEvents`), from
    ``ledger_events``, which logs every event but plain lease renewals: per cluster, the
    events (not heartbeats) within the window of its latest one, each ID at the latest
    time it occurred at, and the last of those occurrences in the log. A database whose
    history begins at fold snapshots (a replay started from them) has the IDs of before
    in those snapshots, and they are taken too."""
    table = ledger_events
    not_heartbeat = table.c.event_type != _HEARTBEAT
    before: dict[str, list[SeenEvent]] = defaultdict(list)
    for row in _seen_before_history(connection):
        before[row.cluster].append(row)
    seen: dict[str, SeenEvents] = {}
    # Each query below is a walk of the (cluster, occurred_at) index, however long the
    # table: the projector loads its state again after every failed write.
    for cluster in sorted({*_clusters(connection, table), *before}):
        times = [row.occurred_at for row in before[cluster]]
        times.append(
            connection.scalar(
                select(func.max(table.c.occurred_at)).where(
                    table.c.cluster == cluster, not_heartbeat
                )
            )
        )
        time = max((t for t in times if t is not None), default=None)
        if time is None:
            continue
        rows = connection.execute(
            select(
                table.c.event_id, table.c.occurred_at, table.c.log_partition, table.c.log_offset
            ).where(
                table.c.cluster == cluster,
                table.c.occurred_at >= seen_horizon(time),
                not_heartbeat,
            )
        )
        found = [
            *before[cluster],
            *(SeenEvent(cluster, i, t, str(Position(p, o))) for i, t, p, o in rows),
        ]
        # Later ones replace earlier ones of their ID: the latest time, the last on a tie.
        found.sort(key=lambda row: (row.occurred_at, Position.parse(row.revision).offset))
        seen[cluster] = SeenEvents({row.event_id: row for row in found}.values())
    return seen


def _seen_before_history(connection: Connection) -> list[SeenEvent]:
    """The event IDs in the fold snapshots the database's history begins at."""
    return [seen for rows in history_starts(connection) for seen in rows[4]]


def history_starts(connection: Connection, partition: int | None = None) -> list[Rows]:
    """The rows of the fold snapshots the database's history begins at: per partition,
    the latest sound snapshot at or before its first ``ledger_events`` row (any such
    snapshot holds only what happened before it, so taking one is never wrong; one is
    needed where a replay started from it, whose history has nothing before it); with
    ``partition``, of that partition only."""
    table = fold_snapshots
    found: list[Rows] = []
    query = select(table.c.projection, table.c.topic, table.c.log_partition).distinct()
    if partition is not None:
        query = query.where(table.c.log_partition == partition)
    for projection, topic, number in connection.execute(query):
        first = connection.scalar(
            select(func.min(ledger_events.c.log_offset)).where(
                ledger_events.c.topic == topic, ledger_events.c.log_partition == number
            )
        )
        start = latest_snapshot(
            connection, projection, topic, number, limit=_NO_LIMIT if first is None else first
        )
        if start is not None:
            found.append(start[1])
    return found


def _clusters(connection: Connection, table: Table) -> list[str]:
    """The distinct clusters of ``table``, found by one index lookup each (a recursive
    query: the next cluster after the last one found) rather than by a scan of it."""
    cluster = table.c.cluster
    found = select(func.min(cluster).label("cluster")).cte("found", recursive=True)
    after = select(func.min(cluster)).where(cluster > found.c.cluster).scalar_subquery()
    found = found.union_all(select(after).where(found.c.cluster.is_not(None)))
    return list(connection.scalars(select(found.c.cluster).where(found.c.cluster.is_not(None))))


def _select(table: Table, resource: ResourceKey | None) -> Select[Any]:
    """All of ``table``, or its rows about ``resource`` (by cluster where it has no resource)."""
    query = select(table)
    if resource is None:
        return query
    cluster, group, name = resource
    query = query.where(table.c.cluster == cluster)
    if "resource" in table.c:
        query = query.where(table.c.api_group == group, table.c.resource == name)
    return query


def views_snapshot(connection: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every view's rows, ordered by primary key, for comparing databases row for row.

    Values are as Python reads them on either backend (UTC datetimes, JSON as
    lists and dicts), so a SQLite and a PostgreSQL snapshot compare equal.
    """
    snapshot: dict[str, list[tuple[Any, ...]]] = {}
    for table in VIEWS:
        columns = list(table.columns)
        key = operator.itemgetter(*(columns.index(c) for c in table.primary_key.columns))
        rows = [tuple(row) for row in connection.execute(select(table))]
        snapshot[table.name] = sorted(rows, key=key)
    return snapshot


def logged(event: Event, position: Position) -> LoggedEvent:
    """How a batch carries a folded ``event`` at ``position`` (:data:`LoggedEvent`).

    Built where the event was decoded for the fold, so the writer need not decode it
    again. The payload is the event's Avro record but ``meta``, as JSON text, times in
    ISO 8601: the fields of the event's class are its schema's, in the same order.
    """
    meta = event.meta
    times = _TIME_FIELDS[type(event)]
    payload = {}
    for name in _PAYLOAD[type(event)]:
        value = getattr(event, name)
        payload[name] = value.isoformat() if name in times and value is not None else value
    return (
        position.partition,
        position.offset,
        meta.cluster,
        meta.event_id,
        type_name(event),
        subject(event),
        meta.occurred_at,
        meta.source,
        meta.causation_id,
        meta.correlation_id,
        json_text(payload),
    )


def _time_fields(cls: type[Any]) -> frozenset[str]:
    """The fields of an event class that hold times (ISO 8601 strings in its payload)."""
    hints = typing.get_type_hints(cls)
    return frozenset(
        field.name
        for field in dataclasses.fields(cls)
        if datetime in (hints[field.name], *typing.get_args(hints[field.name]))
    )


def _storage_version_values(storage_version: StorageVersion) -> dict[str, Any]:
    condition = storage_version.condition
    return {
        "cluster": storage_version.cluster,
        "api_group": storage_version.group,
        "resource": storage_version.resource,
        "name": storage_version.name,
        "kind": storage_version.kind,
        "common_encoding_version": storage_version.common_encoding_version,
        "condition_type": condition.type,
        "condition_status": condition.status,
        "condition_reason": condition.reason,
        "condition_message": condition.message,
        "condition_last_transition_time": condition.last_transition_time,
        "revision": storage_version.revision,
        "created_revision": storage_version.created_revision,
        "created_at": storage_version.created_at,
    }


def _entry_row(
    storage_version: StorageVersion, ordinal: int, entry: ServerStorageVersion
) -> tuple[Any, ...]:
    return (
        storage_version.cluster,
        storage_version.group,
        storage_version.resource,
        entry.apiserver_id,
        entry.encoding_version,
        json_text(entry.decodable_versions),
        json_text(entry.served_versions),
        ordinal,
        entry.source,
    )


# Leases, StorageStates, Migrations and clusters are stored field for field: each column
# holds the field (or, for ``name``, the property) of its name, except for the API group
# and a cluster's partition.
_COLUMN_OF_FIELD: Final = {"group": "api_group", "partition": "log_partition"}
_FIELD_OF_COLUMN: Final = {column: field for field, column in _COLUMN_OF_FIELD.items()}
_NO_LIMIT: Final = 2**63 - 1  # past any offset
_HEARTBEAT: Final = ApiserverHeartbeat.__name__  # the type whose IDs the fold does not keep

_Stored = TypeVar(
    "_Stored", Lease, StorageState, Migration, CustomResourceDefinition, StorageAudit, Cluster
)


def _values(table: Table, computed: Collection[str] = ()) -> Callable[[Any], dict[str, Any]]:
    """How :func:`_sync` writes a stored row to ``table``: tuples become JSON lists; the
    ``computed`` columns, which are no field of the row, are left to the caller."""
    fields = [
        (column.name, _FIELD_OF_COLUMN.get(column.name, column.name))
        for column in table.columns
        if column.name not in computed
    ]

    def values(row: Any) -> dict[str, Any]:
        written = {column: getattr(row, field) for column, field in fields}
        return {c: list(v) if isinstance(v, tuple) else v for c, v in written.items()}

    return values


def _load(
    connection: Connection, table: Table, cls: type[_Stored], resource: ResourceKey | None
) -> dict[Any, _Stored]:
    """The rows of ``table`` (see :func:`_select`) as ``cls``, by key; undoes :func:`_values`."""
    columns = [
        (field.name, _COLUMN_OF_FIELD.get(field.name, field.name))
        for field in dataclasses.fields(cls)
    ]
    loaded: dict[Any, _Stored] = {}
    for row in connection.execute(_select(table, resource)).mappings():
        fields: dict[str, Any] = {}
        for field, column in columns:
            value = row[column]
            fields[field] = tuple(value) if isinstance(value, list) else value
        stored = cls(**fields)
        loaded[stored.key] = stored
    return loaded


def _crd_rows(state: State, changes: Changes) -> dict[ResourceKey, CrdRow | None]:
    """The CustomResourceDefinition rows to write: those the batch changed, and those whose
    resource's StorageState, migrations or audit it changed (what can leave storedVersions
    rests on them). A migration is dropped from the views only when another of its resource is
    requested or succeeds, so the resources of the migrations still there cover those."""
    moved = {m.resource_key for k in changes.migrations if (m := state.migrations.get(k))}
    keys = changes.custom_resources | (
        (changes.storage_states | changes.audits | moved) & state.custom_resources.keys()
    )
    rows: dict[ResourceKey, CrdRow | None] = {}
    for key in keys:
        crd = state.custom_resources.get(key)
        rows[key] = (
            None
            if crd is None
            else (crd, [dataclasses.asdict(v) for v in stored_version_verdicts(state, key)])
        )
    return rows


_crd_columns: Final = _values(custom_resource_definitions, computed={"stored_version_verdicts"})
_cluster_values: Final = _values(clusters)


def _crd_values(row: CrdRow) -> dict[str, Any]:
    crd, verdicts = row
    return {**_crd_columns(crd), "stored_version_verdicts": verdicts}


def _rows(changed: Collection[Key], rows: Mapping[Key, Row]) -> dict[Key, Row | None]:
    return {key: rows.get(key) for key in changed}


def _sync(
    connection: Connection,
    table: Table,
    rows: Mapping[Key, Row | None],
    values: Callable[[Row], dict[str, Any]],
) -> None:
    """Make ``table`` hold each row: upsert it, or delete its key where it is ``None``."""
    ordered = sorted(rows.items())
    _delete(connection, table, [key for key, row in ordered if row is None])
    _upsert(connection, table, [values(row) for _, row in ordered if row is not None])


def _delete(connection: Connection, table: Table, keys: Collection[tuple[str, ...]]) -> None:
    """Delete the rows whose leading primary-key columns equal each key."""
    if not keys:
        return
    columns = list(table.primary_key.columns)[: len(next(iter(keys)))]
    statement = delete(table).where(
        and_(*(column == bindparam(f"key_{column.name}") for column in columns))
    )
    connection.execute(
        statement,
        [{f"key_{c.name}": part for c, part in zip(columns, key, strict=True)} for key in keys],
    )


def _upsert(connection: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    statement = _INSERTS[connection.dialect.name](table)
    keys = [column.name for column in table.primary_key.columns]
    statement = statement.on_conflict_do_update(
        index_elements=keys,
        set_={name: statement.excluded[name] for name in rows[0] if name not in keys},
    )
    connection.execute(statement, rows)


def _insert_rows(connection: Connection, table: Table, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows``, each with a value per column of ``table`` in column order.

    JSON columns come as JSON text, encoded once where the row was built. PostgreSQL
    takes them by ``COPY`` (:mod:`projections.postgres`), SQLite by executemany.
    """
    if not rows:
        return
    if connection.dialect.name == "postgresql":
        # Imported here: psycopg is only in the postgres extra.
        from projections.postgres import copy_rows

        copy_rows(connection, table, rows)
        return
    names = table.columns.keys()
    connection.execute(
        _insert_json_as_text(table), [dict(zip(names, row, strict=True)) for row in rows]
    )


@functools.cache
def _insert_json_as_text(table: Table) -> Insert:
    """An INSERT into ``table`` that takes its JSON columns' values as JSON text."""
    return insert(table).values(
        {
            column.name: bindparam(
                column.name, type_=Text() if isinstance(column.type, JSON) else column.type
            )
            for column in table.columns
        }
    )


_TIME_FIELDS: Final = {cls: _time_fields(cls) for cls in EVENT_TYPES.values()}
_PAYLOAD: Final = {
    cls: tuple(field.name for field in dataclasses.fields(cls) if field.name != "meta")
    for cls in EVENT_TYPES.values()
}

_INSERTS: Final[dict[str, Callable[[Table], postgresql.Insert | sqlite.Insert]]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}
