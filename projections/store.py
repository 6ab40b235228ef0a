"""Moving the fold's state in and out of the SQL views.

:func:`write` is the projector's one write per batch: the batch's events into
``ledger_events`` (and ``rejected_events``), exactly the view rows the batch
changed, and the checkpoint, all on the caller's connection inside the caller's
transaction. The events go first: their key is the log position, so a batch that
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
import operator
import typing
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import psycopg
from sqlalchemy import Connection, Select, Table, and_, bindparam, delete, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from ledger.events import EVENT_TYPES, Event, Position, type_name
from projections.schema import (
    apiserver_leases,
    ledger_events,
    projection_checkpoints,
    rejected_events,
    server_storage_versions,
    storage_states,
    storage_version_migrations,
    storage_versions,
)
from projections.state import (
    Changes,
    Condition,
    Lease,
    LeaseKey,
    Migration,
    MigrationKey,
    Rejection,
    ResourceKey,
    ServerStorageVersion,
    State,
    StorageState,
    StorageVersion,
)

VIEWS: Final = (
    apiserver_leases,
    storage_versions,
    server_storage_versions,
    storage_states,
    storage_version_migrations,
    ledger_events,
    rejected_events,
)

Key = TypeVar("Key", bound=tuple[str, ...])
Row = TypeVar("Row")


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """One folded batch, as :func:`write` puts it in the database.

    It holds the view rows the batch changed (``None`` for a row the batch deleted),
    taken from the state right after the batch. The rows are immutable, so a batch
    can be written while the fold goes on with the next one.
    """

    topic: str
    projection: str
    folded: Sequence[tuple[Event, Position, str]]
    rejections: Sequence[Rejection]
    leases: Mapping[LeaseKey, Lease | None]
    storage_versions: Mapping[ResourceKey, StorageVersion | None]
    storage_states: Mapping[ResourceKey, StorageState | None]
    migrations: Mapping[MigrationKey, Migration | None]

    @classmethod
    def of(
        cls,
        state: State,
        changes: Changes,
        folded: Sequence[tuple[Event, Position, str]],
        topic: str,
        projection: str,
    ) -> Batch:
        """The batch whose events are ``folded``, ``state`` and ``changes`` being after it.

        ``folded`` is each event with its log position and subject (what it is about:
        a resource name, an apiserver ID); ``changes`` are the merged changes of its
        events.
        """
        return cls(
            topic,
            projection,
            folded,
            tuple(changes.rejections),
            _rows(changes.leases, state.leases),
            _rows(changes.storage_versions, state.storage_versions),
            _rows(changes.storage_states, state.storage_states),
            _rows(changes.migrations, state.migrations),
        )


def write(connection: Connection, batch: Batch) -> None:
    """Write a batch's events, the rows it changed, and its checkpoint.

    Runs in the caller's transaction and raises
    :class:`sqlalchemy.exc.IntegrityError` if any event was written before.
    """
    if not batch.folded:
        return
    topic = batch.topic
    rejected = {Position.parse(rejection.revision): rejection for rejection in batch.rejections}
    _insert_rows(
        connection,
        ledger_events,
        [
            _ledger_row(event, position, subject, topic, position in rejected)
            for event, position, subject in batch.folded
        ],
    )
    occurred = {position: event.meta.occurred_at for event, position, _ in batch.folded}
    _insert_rows(
        connection,
        rejected_events,
        [
            (
                topic,
                position.partition,
                position.offset,
                rejection.cluster,
                rejection.event_id,
                rejection.event_type,
                rejection.subject,
                occurred[position],
                rejection.reason,
            )
            for position, rejection in rejected.items()
        ],
    )

    _sync(connection, apiserver_leases, batch.leases, _values(apiserver_leases))
    # A StorageVersion's entries are replaced as a whole: the changed resources'
    # entries go, then the current ones of those that still exist come back.
    _delete(connection, server_storage_versions, batch.storage_versions.keys())
    _sync(connection, storage_versions, batch.storage_versions, _storage_version_values)
    _insert_rows(
        connection,
        server_storage_versions,
        [
            _entry_row(storage_version, entry)
            for _, storage_version in sorted(batch.storage_versions.items())
            if storage_version is not None
            for entry in storage_version.entries
        ],
    )
    _sync(connection, storage_states, batch.storage_states, _values(storage_states))
    _sync(
        connection,
        storage_version_migrations,
        batch.migrations,
        _values(storage_version_migrations),
    )

    next_offsets: dict[int, int] = {}
    for _, position, _ in batch.folded:
        next_offsets[position.partition] = max(
            next_offsets.get(position.partition, 0), position.offset + 1
        )
    _upsert(
        connection,
        projection_checkpoints,
        [
            {
                "projection": batch.projection,
                "topic": topic,
                "log_partition": p,
                "next_offset": n,
            }
            for p, n in sorted(next_offsets.items())
        ],
    )


def load_checkpoints(connection: Connection, topic: str, projection: str) -> dict[int, int]:
    """The next offset to consume, per partition, of ``projection`` on ``topic``."""
    rows = connection.execute(
        select(projection_checkpoints.c.log_partition, projection_checkpoints.c.next_offset).where(
            projection_checkpoints.c.projection == projection,
            projection_checkpoints.c.topic == topic,
        )
    )
    return {partition: offset for partition, offset in rows}


def load_state(connection: Connection, resource: ResourceKey | None = None) -> State:
    """The fold's state as the views hold it; with ``resource``, only that resource's rows
    (its StorageVersion, StorageState and migrations, and the leases of its cluster)."""
    entries: dict[ResourceKey, list[ServerStorageVersion]] = defaultdict(list)
    for row in connection.execute(_select(server_storage_versions, resource)).mappings():
        entries[row["cluster"], row["api_group"], row["resource"]].append(
            ServerStorageVersion(
                apiserver_id=row["apiserver_id"],
                encoding_version=row["encoding_version"],
                decodable_versions=tuple(row["decodable_versions"]),
                served_versions=tuple(row["served_versions"]),
            )
        )
    versions: dict[ResourceKey, StorageVersion] = {}
    for row in connection.execute(_select(storage_versions, resource)).mappings():
        storage_version = StorageVersion(
            cluster=row["cluster"],
            group=row["api_group"],
            resource=row["resource"],
            kind=row["kind"],
            # Sorted here, not by ORDER BY: a database collation may order strings
            # differently from Python, and the state sorts them as Python does.
            entries=tuple(
                sorted(
                    entries[row["cluster"], row["api_group"], row["resource"]],
                    key=operator.attrgetter("apiserver_id"),
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
        )
        versions[storage_version.key] = storage_version

    # Built in one go: the State derives its indexes from the rows it is given.
    return State(
        leases=_load(connection, apiserver_leases, Lease, resource),
        storage_versions=versions,
        storage_states=_load(connection, storage_states, StorageState, resource),
        migrations=_load(connection, storage_version_migrations, Migration, resource),
    )


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


def _ledger_row(
    event: Event, position: Position, subject: str, topic: str, rejected: bool
) -> tuple[Any, ...]:
    """The ``ledger_events`` row of one event, values in the table's column order."""
    meta = event.meta
    names, times = _PAYLOAD_FIELDS[type(event)]
    payload = {name: getattr(event, name) for name in names}
    for name in times:
        if payload[name] is not None:
            payload[name] = payload[name].astimezone(UTC).isoformat()
    return (
        topic,
        position.partition,
        position.offset,
        meta.cluster,
        meta.event_id,
        type_name(event),
        subject,
        meta.occurred_at,
        meta.source,
        meta.causation_id,
        meta.correlation_id,
        payload,
        "rejected" if rejected else "applied",
    )


def _payload_fields(cls: type[Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An event class's payload fields (all but ``meta``) and those of them that are times.

    Times become ISO 8601 strings in the JSON payload; tuples need nothing, JSON
    writes them as arrays.
    """
    hints = typing.get_type_hints(cls)
    names = tuple(field.name for field in dataclasses.fields(cls) if field.name != "meta")
    return names, tuple(
        name for name in names if datetime in (hints[name], *typing.get_args(hints[name]))
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
    }


def _entry_row(storage_version: StorageVersion, entry: ServerStorageVersion) -> tuple[Any, ...]:
    return (
        storage_version.cluster,
        storage_version.group,
        storage_version.resource,
        entry.apiserver_id,
        entry.encoding_version,
        list(entry.decodable_versions),
        list(entry.served_versions),
    )


# Leases, StorageStates and Migrations are stored field for field: each column holds
# the field (or, for ``name``, the property) of its name, except for the API group.
_COLUMN_OF_FIELD: Final = {"group": "api_group"}
_FIELD_OF_COLUMN: Final = {column: field for field, column in _COLUMN_OF_FIELD.items()}

_Stored = TypeVar("_Stored", Lease, StorageState, Migration)


def _values(table: Table) -> Callable[[Any], dict[str, Any]]:
    """How :func:`_sync` writes a stored row to ``table``: tuples become JSON lists."""
    fields = [
        (column.name, _FIELD_OF_COLUMN.get(column.name, column.name)) for column in table.columns
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

    On PostgreSQL by binary ``COPY``: one statement streams the whole batch, where an
    executemany costs a statement per row, and the server parses no text. A row
    already present fails the COPY on the primary key exactly as an INSERT would;
    the driver's error is raised as SQLAlchemy's
    (:class:`sqlalchemy.exc.IntegrityError` for that case), so callers handle both
    backends alike.
    """
    if not rows:
        return
    if connection.dialect.name != "postgresql":
        names = table.columns.keys()
        connection.execute(insert(table), [dict(zip(names, row, strict=True)) for row in rows])
        return
    statement = f"COPY {table.name} ({', '.join(table.columns.keys())}) FROM STDIN (FORMAT BINARY)"
    types = [column.type.compile(dialect=connection.dialect).lower() for column in table.columns]
    cursor = connection.connection.cursor()
    try:
        with cursor.copy(statement) as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)
    except psycopg.Error as error:
        raise DBAPIError.instance(
            statement, None, error, psycopg.Error, dialect=connection.dialect
        ) from error
    finally:
        cursor.close()


_PAYLOAD_FIELDS: Final = {cls: _payload_fields(cls) for cls in EVENT_TYPES.values()}

_INSERTS: Final[dict[str, Callable[[Table], postgresql.Insert | sqlite.Insert]]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}
