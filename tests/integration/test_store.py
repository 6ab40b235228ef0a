"""Writing folded batches to SQL and reading them back, on SQLite and PostgreSQL.

The fold in memory is the reference: whatever split of a history the projector
writes, and wherever it restarts from the database, the views must hold what
folding the whole history in one go holds.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete
from sqlalchemy.exc import IntegrityError, StatementError

from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Meta,
    Position,
    StorageVersionReported,
)
from projections import fold, store
from projections.projector import Projection, fold_batch
from projections.schema import metadata
from projections.snapshots import state_of, take
from projections.state import Changes, State
from tests.consumed import consumed_log
from tests.histories import histories, plain_renewals

K = TypeVar("K")
V = TypeVar("V")

TOPIC = "svledger.events"
PROJECTION = "views"


def write(
    db: Engine, state: State, records: Sequence[tuple[Event, Position]], topic: str = TOPIC
) -> None:
    """Fold ``records`` into ``state`` and write them as one batch, as the projector does."""
    folded = fold_batch(
        Projection(PROJECTION, topic, state, {}),
        consumed_log(records),
    )
    with db.begin() as connection:
        store.write(connection, folded.batch)


def _only(rows: Mapping[K, V], key: K) -> dict[K, V]:
    return {key: rows[key]} if key in rows else {}


def clear(db: Engine) -> None:
    with db.begin() as connection:
        for table in reversed(metadata.sorted_tables):
            connection.execute(delete(table))


def snapshot(db: Engine) -> dict[str, list[tuple[object, ...]]]:
    with db.connect() as connection:
        return store.views_snapshot(connection)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories(), data=st.data())
def test_any_split_of_a_history_writes_the_fold_of_the_whole(
    db: Engine, history: list[tuple[Event, Position]], data: st.DataObject
) -> None:
    clear(db)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(history) - 1, 1)), max_size=6)))
    bounds = [0, *cuts, len(history)]
    state = State()
    for start, end in itertools.pairwise(bounds):
        if data.draw(st.booleans(), label="restart from the database"):
            with db.connect() as connection:
                state = store.load_state(connection)
        write(db, state, history[start:end])

    expected = fold.fold(history)
    with db.connect() as connection:
        assert store.load_state(connection) == expected
        # One resource's rows, as explain reads them, are the whole state cut down to it.
        for key in {*expected.storage_versions, *expected.storage_states}:
            one = store.load_state(connection, key)
            assert one.storage_versions == _only(expected.storage_versions, key)
            assert one.storage_states == _only(expected.storage_states, key)
            assert one.migrations == {
                k: m for k, m in expected.migrations.items() if m.resource_key == key
            }
            assert one.leases == {k: v for k, v in expected.leases.items() if k[0] == key[0]}
        next_offsets: dict[int, int] = {}
        for _, position in history:
            next_offsets[position.partition] = position.offset + 1
        assert store.load_checkpoints(connection, TOPIC, PROJECTION) == next_offsets
        assert store.load_checkpoints(connection, TOPIC, "another") == {}
    in_batches = snapshot(db)

    clear(db)
    write(db, State(), history)
    assert snapshot(db) == in_batches

    rejections = Changes()
    reference = State()
    for event, position in history:
        fold.apply(reference, event, position, rejections)
    rejected = sorted(Position.parse(rejection.revision) for rejection in rejections.rejections)
    logged = positions(in_batches, "ledger_events")
    plain, renewals = plain_renewals(history)
    assert logged == sorted(position for _, position in history if position not in plain)
    assert in_batches["lease_renewals"] == [
        (*holder, TOPIC, *count) for holder, count in sorted(renewals.items())
    ]
    outcomes = column(in_batches, "ledger_events", "outcome")
    assert [
        p for p, outcome in zip(logged, outcomes, strict=True) if outcome == "rejected"
    ] == rejected
    assert positions(in_batches, "rejected_events") == rejected


def column(views: dict[str, list[tuple[object, ...]]], table: str, name: str) -> list[object]:
    index = metadata.tables[table].columns.keys().index(name)
    return [row[index] for row in views[table]]


def positions(views: dict[str, list[tuple[object, ...]]], table: str) -> list[tuple[object, ...]]:
    return list(
        zip(column(views, table, "log_partition"), column(views, table, "log_offset"), strict=True)
    )


def heartbeat(apiserver: str, offset: int, at: datetime) -> tuple[ApiserverHeartbeat, Position]:
    meta = Meta(f"event-{offset}", "east", at, apiserver)
    event = ApiserverHeartbeat(meta, apiserver, f"{apiserver}_1", "cp-0", 3600, at, "1.31.0")
    return event, Position(0, offset)


def report(apiserver: str, offset: int, at: datetime, version: str) -> tuple[Event, Position]:
    meta = Meta(f"event-{offset}", "east", at, apiserver)
    event = StorageVersionReported(
        meta, apiserver, "apps", "deployments", "Deployment", version, ("v1", "v2"), ("v1", "v2")
    )
    return event, Position(0, offset)


START = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_a_batch_overlapping_written_events_is_refused_whole(db: Engine) -> None:
    first = [heartbeat("apiserver-a", 0, START), report("apiserver-a", 1, START, "v1")]
    write(db, State(), first)
    before = snapshot(db)
    with db.connect() as connection:
        state = store.load_state(connection)

    overlapping = [
        first[1],
        heartbeat("apiserver-b", 2, START + timedelta(seconds=1)),
        report("apiserver-b", 3, START + timedelta(seconds=2), "v2"),
    ]
    with pytest.raises(IntegrityError):
        write(db, state, overlapping)
    assert snapshot(db) == before
    with db.connect() as connection:
        assert store.load_checkpoints(connection, TOPIC, PROJECTION) == {0: 2}


def test_the_same_batch_written_twice_is_refused(db: Engine) -> None:
    batch = [heartbeat("apiserver-a", 0, START), report("apiserver-a", 1, START, "v1")]
    write(db, State(), batch)
    before = snapshot(db)
    with pytest.raises(IntegrityError):
        write(db, State(), batch)
    assert snapshot(db) == before


def test_times_come_back_as_the_same_instant_in_utc(db: Engine) -> None:
    berlin = timezone(timedelta(hours=2))
    at = datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=berlin)
    write(db, State(), [heartbeat("apiserver-a", 0, at)])
    with db.connect() as connection:
        (lease,) = store.load_state(connection).leases.values()
        views = store.views_snapshot(connection)
    assert lease.renew_time == at
    assert lease.renew_time.utcoffset() == timedelta(0)
    (payload,) = column(views, "ledger_events", "payload")
    assert isinstance(payload, dict)
    assert datetime.fromisoformat(payload["renew_time"]) == at
    assert payload["lease_duration_seconds"] == 3600


def test_json_is_stored_as_compact_text_on_sqlite(db: Engine) -> None:
    """docs/sql.md: SQLite holds JSON compact, whichever way a column is written (the
    store's own encoding for speed, or the JSON type for view upserts)."""
    if db.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's jsonb keeps its own form")
    write(db, State(), [heartbeat("apiserver-a", 0, START), report("apiserver-a", 1, START, "v2")])
    with db.connect() as connection:
        texts = connection.exec_driver_sql(
            "SELECT persisted_storage_version_hashes FROM storage_states"
            " UNION ALL SELECT decodable_versions FROM server_storage_versions"
            " UNION ALL SELECT payload FROM ledger_events"
        ).scalars()
        stored = list(texts)
    assert len(stored) == 4
    for text in stored:
        assert text == json.dumps(json.loads(text), separators=(",", ":")), text


def test_naive_times_are_refused(db: Engine) -> None:
    # The codec already refuses to log a naive time; the views refuse one too.
    event, position = heartbeat("apiserver-a", 0, START)
    naive = dataclasses.replace(event, renew_time=datetime(2024, 5, 1, 12, 0))
    state = State()
    changes = fold.apply(state, naive, position)
    batch = store.Batch.of(state, changes, [store.logged(event, position)], TOPIC, PROJECTION, {})
    with pytest.raises(StatementError, match="naive datetime"), db.begin() as connection:
        store.write(connection, batch)
    assert snapshot(db) == {table.name: [] for table in store.VIEWS}


def test_a_database_begun_at_fold_snapshots_remembers_the_event_ids_from_before_them(
    db: Engine,
) -> None:
    """A replay started from fold snapshots writes the views, not the events before them:
    the event IDs the fold remembers from then come from the snapshots."""
    clear(db)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    heartbeat = ApiserverHeartbeat(Meta("e-1", "east", t0, "a1"), "a1", "a1_1", "cp-0", 60, t0)
    report = StorageVersionReported(
        Meta("e-2", "east", t0, "a1"), "a1", "", "pods", "Pod", "v1", ("v1",), ("v1",)
    )
    state = fold.fold([(heartbeat, Position(0, 0)), (report, Position(0, 1))])
    snapshot = take(state, PROJECTION, TOPIC, 0, 2, t0)
    start = state_of([snapshot.state_rows()])
    with db.begin() as connection:
        store.write(
            connection, store.Batch.whole(start, TOPIC, PROJECTION, {0: 2}, {0: t0}, [snapshot])
        )

    with db.connect() as connection:
        loaded = store.load_state(connection)
    assert loaded == state
    assert loaded.seen["east"].rows()[0].revision == "0:1"
    assert fold.apply(loaded, report, Position(0, 2)).rejections  # a repeat, found
