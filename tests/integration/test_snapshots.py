"""Replays and consumers from the projector's fold snapshots, on the real broker, SQLite
and PostgreSQL.

A source database is projected by a real projector that takes a snapshot of each
partition every 150 offsets. A replay that starts from those snapshots must write
the views a replay from the log's beginning writes, bit for bit, to any point
(an offset, a time, the end) and for one cluster; its history tables hold exactly
the reference's rows from the snapshot on. A corrupt snapshot is passed over for an
older one, and with none the replay reads the log from its beginning. A consumer's
fold of a partition (each kind: the lease GC's, the migrator's, the collector's)
rebuilt from the snapshots reaches the state a rebuild from the beginning reaches,
and a migrator that starts from a snapshot still decides on what came before it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from consumers import partitions
from consumers.migrator import run_migrator
from consumers.partitions import PartitionFollower
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    Event,
    Meta,
    Position,
    StorageVersionReported,
)
from ledger.kafka import create_topics
from ledger.names import resource_name
from ledger.settings import KafkaSettings
from projections import database, store
from projections.fold import fold
from projections.history import history, known_resources
from projections.replay import ReplayError, replay
from projections.schema import fold_snapshots
from projections.snapshots import SnapshotSource
from projections.state import State
from tests.frozen import freeze_database
from tests.integration.test_migrator import read_log, requested, wait_for
from tests.integration.test_projector import (
    append,
    caught_up,
    clear,
    kafka_settings,
    next_offsets,
    projecting,
    snapshot,
)
from tests.workloads import mixed_events

EVENTS = 3_000
EVERY = 150
HISTORY_VIEWS = ("ledger_events", "rejected_events")

Log = tuple[KafkaSettings, list[tuple[Event, Position]], str]


@pytest.fixture
async def projected(kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> Log:
    """The log, and a database the projector wrote it to with snapshots."""
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=3)
    await create_topics(settings)
    records = await append(settings, mixed_events(EVENTS, clusters=8, seed=7))
    source_url = f"sqlite:///{tmp_path / 'source.db'}"
    database.upgrade(source_url)
    source = database.engine(source_url)
    try:
        async with projecting(
            settings, source_url, group=False, max_batch=60, snapshot_every=EVERY
        ) as projector:
            await caught_up(source, projector, next_offsets(records))
    finally:
        source.dispose()
    return settings, records, source_url


def expiries(events: list[Event]) -> list[Event]:
    """The expiry of every lease ``events`` leave held: each drops its apiserver's entries."""
    state = fold((event, Position(0, offset)) for offset, event in enumerate(events))
    return [
        ApiserverLeaseExpired(
            Meta.new(lease.cluster, "svledger-lease-gc", lease.renew_time + timedelta(hours=1)),
            lease.apiserver_id,
            lease.renew_time,
            lease.lease_duration_seconds,
        )
        for lease in state.leases.values()
    ]


@pytest.fixture
def reference_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'reference.db'}"


def snapshots_in(url: str) -> list[tuple[int, int, datetime | None]]:
    engine = database.engine(url)
    try:
        with engine.connect() as connection:
            table = fold_snapshots
            rows = connection.execute(
                select(table.c.log_partition, table.c.next_offset, table.c.log_time)
            )
            return sorted((p, o, t) for p, o, t in rows)
    finally:
        engine.dispose()


def starts(db: Engine) -> dict[int, int]:
    """Where a replayed database's history begins: the snapshots it started from."""
    with db.connect() as connection:
        rows = connection.execute(
            select(fold_snapshots.c.log_partition, fold_snapshots.c.next_offset)
        )
        return {partition: offset for partition, offset in rows}


def from_on(rows: list[tuple[Any, ...]], begins: dict[int, int]) -> list[tuple[Any, ...]]:
    """Rows of a history table (topic, partition, offset first) at or after ``begins``."""
    return [row for row in rows if row[2] >= begins.get(row[1], 0)]


def assert_same_as_from_the_beginning(
    db: Engine, reference: dict[str, list[tuple[Any, ...]]]
) -> None:
    replayed = snapshot(db)
    for view in store.STATE_VIEWS:
        assert replayed[view] == reference[view], view
    begins = starts(db)
    for view in HISTORY_VIEWS:
        assert replayed[view] == from_on(reference[view], begins), view


async def reference_replay(
    settings: KafkaSettings, url: str, **options: Any
) -> dict[str, list[tuple[Any, ...]]]:
    database.upgrade(url)
    engine = database.engine(url)
    try:
        clear(engine)
        await replay(settings, url, progress=False, **options)
        return snapshot(engine)
    finally:
        engine.dispose()


def test_the_projector_takes_a_snapshot_each_time_a_partition_passes_a_multiple(
    projected: Log,
) -> None:
    _, records, source_url = projected
    taken = snapshots_in(source_url)
    for partition, end in next_offsets(records).items():
        offsets = [o for p, o, _ in taken if p == partition]
        assert len(offsets) == end // EVERY  # batches of 60 never pass two multiples at once
        assert all(o // EVERY == n + 1 for n, o in enumerate(offsets))
        for p, offset, log_time in taken:
            if p == partition:
                assert log_time == max(
                    event.meta.occurred_at
                    for event, position in records
                    if position.partition == partition and position.offset < offset
                )


@pytest.mark.parametrize("point", ["offset", "time", "end"])
async def test_a_replay_from_snapshots_writes_the_views_of_a_replay_from_the_beginning(
    projected: Log, database_url: str, db: Engine, reference_url: str, point: str
) -> None:
    settings, records, source_url = projected
    ordered = sorted(records, key=lambda record: record[1])
    until: int | datetime | None = {
        "offset": EVENTS // 3 - 40,  # in the last tenth of each of the three partitions
        "time": ordered[len(ordered) * 9 // 10][0].meta.occurred_at,
        "end": None,
    }[point]
    reference = await reference_replay(settings, reference_url, until=until)

    result = await replay(
        settings, database_url, until=until, snapshots_from=source_url, progress=False
    )

    assert_same_as_from_the_beginning(db, reference)
    assert set(starts(db)) == {0, 1, 2}, "every partition started from a snapshot"
    # Each partition is read from its snapshot on: less than EVERY and a batch of 60.
    assert result.events < 3 * (EVERY + 60)
    assert checkpoints_of(database_url, settings) == checkpoints_of(reference_url, settings)


async def test_the_history_of_a_replay_from_snapshots_is_the_whole_history_from_there(
    projected: Log, sqlite_url: str, reference_url: str
) -> None:
    """``svledger history`` on a database replayed from snapshots lists what the full
    history lists from where it begins, the lease ends that remove an entry held then
    included, though no report of it is there."""
    settings, records, source_url = projected
    # After the snapshots: each expiry drops its apiserver's entries, reported before them.
    await append(settings, expiries([event for event, _ in records]))
    await reference_replay(settings, reference_url)
    await replay(settings, sqlite_url, snapshots_from=source_url, progress=False)
    full, replayed = database.engine(reference_url), database.engine(sqlite_url)
    lease_ends = 0
    try:
        begins = starts(replayed)
        with full.connect() as whole, replayed.connect() as part:
            for cluster, group, resource in sorted(known_resources(whole)):
                name = resource_name(group, resource)
                expected = [
                    entry
                    for entry in history(whole, name, cluster)
                    if entry.position.offset >= begins[entry.position.partition]
                ]
                found = history(part, name, cluster) if expected else []
                assert found == expected, (cluster, name)
                lease_ends += sum("Lease" in entry.event_type for entry in found)
    finally:
        full.dispose()
        replayed.dispose()
    assert lease_ends > 0  # the case in question was there


def checkpoints_of(url: str, settings: KafkaSettings) -> tuple[object, ...]:
    """A database's checkpoints and log times: where a projector would carry it on."""
    engine = database.engine(url)
    try:
        with engine.connect() as connection:
            return (
                store.load_checkpoints(connection, settings.topic, "views"),
                store.load_log_times(connection, settings.topic, "views"),
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("point", ["time", "end"])
async def test_one_clusters_replay_from_snapshots_is_that_clusters_alone(
    projected: Log, database_url: str, db: Engine, reference_url: str, point: str
) -> None:
    settings, records, source_url = projected
    cluster = records[0][0].meta.cluster
    ordered = sorted(records, key=lambda record: record[1])
    until = ordered[len(ordered) * 9 // 10][0].meta.occurred_at if point == "time" else None
    reference = await reference_replay(settings, reference_url, cluster=cluster, until=until)

    await replay(
        settings,
        database_url,
        cluster=cluster,
        until=until,
        snapshots_from=source_url,
        progress=False,
    )

    assert_same_as_from_the_beginning(db, reference)
    assert {row[0] for row in snapshot(db)["apiserver_leases"]} == {cluster}
    assert checkpoints_of(database_url, settings) == checkpoints_of(reference_url, settings)


async def test_a_corrupt_snapshot_is_passed_over_and_without_any_the_log_is_read(
    projected: Log,
    database_url: str,
    db: Engine,
    reference_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings, records, source_url = projected
    reference = await reference_replay(settings, reference_url)
    *_, older, latest = [o for p, o, _ in snapshots_in(source_url) if p == 0]
    source = database.engine(source_url)
    with source.begin() as connection:
        connection.execute(
            update(fold_snapshots)
            .where(fold_snapshots.c.log_partition == 0, fold_snapshots.c.next_offset == latest)
            .values(payload=b"not a snapshot")
        )

    with caplog.at_level(logging.WARNING, logger="projections.snapshots"):
        await replay(settings, database_url, snapshots_from=source_url, progress=False)

    assert f"snapshot of partition 0 at offset {latest}" in caplog.text
    assert "does not match its digest" in caplog.text
    assert_same_as_from_the_beginning(db, reference)
    assert starts(db)[0] == older

    with source.begin() as connection:
        connection.execute(fold_snapshots.delete())
    source.dispose()
    clear(db)
    result = await replay(settings, database_url, snapshots_from=source_url, progress=False)
    assert result.events == len(records)
    assert snapshot(db) == reference


async def test_snapshots_start_only_a_fresh_database(
    projected: Log, database_url: str, db: Engine
) -> None:
    settings, _, source_url = projected
    with pytest.raises(ReplayError, match="pass one of them"):
        await replay(
            settings, database_url, from_snapshot=True, snapshots_from=source_url, progress=False
        )


# ------------------------------------------------- consumers rebuilt from snapshots


async def rebuilt(
    settings: KafkaSettings, group: str, snapshots: SnapshotSource | None, **mode: bool
) -> dict[int, tuple[int, State]]:
    """Per partition, where a follower's fold started and its state once caught up."""
    follower = PartitionFollower(
        settings, group_id=group, transactional_prefix=group, snapshots=snapshots, **mode
    )
    stop = asyncio.Event()
    async with follower, asyncio.timeout(60):
        async for _ in follower.batches(stop):
            logs = follower.logs.values()
            if len(logs) == settings.partitions and all(log.caught_up for log in logs):
                stop.set()
        for partition_log in follower.logs.values():
            partition_log.settle()  # the renewals a thinning fold left pending
        return {p: (log.start, log.state) for p, log in follower.logs.items()}


@pytest.mark.parametrize(
    "mode",
    [
        {"events": False},  # the lease GC and the worker: the state alone
        {"renewals": False},  # the migrator: each event but plain renewals
        {},  # the collector: each event
    ],
    ids=["state", "events-but-renewals", "events"],
)
async def test_a_consumer_rebuilds_its_fold_from_the_latest_snapshot_to_the_same_state(
    projected: Log, unique_topic: str, mode: dict[str, bool]
) -> None:
    settings, _, source_url = projected
    from_beginning = await rebuilt(settings, f"{unique_topic}.log", None, **mode)
    from_snapshots = await rebuilt(
        settings, f"{unique_topic}.snap", SnapshotSource(source_url, "views"), **mode
    )

    taken = snapshots_in(source_url)
    for partition, (start, state) in from_snapshots.items():
        assert start == max(o for p, o, _ in taken if p == partition) > 0
        assert from_beginning[partition] == (0, state)
        assert state.leases, "a partition of several clusters, not an empty fold"


async def test_a_consumer_whose_snapshot_database_cannot_be_read_rebuilds_from_the_beginning(
    projected: Log, unique_topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings, _, _ = projected
    reference = await rebuilt(settings, f"{unique_topic}.log", None, events=False)
    missing = f"sqlite:///{tmp_path / 'no-such.db'}"

    with caplog.at_level(logging.WARNING):
        rebuilt_anyway = await rebuilt(
            settings, f"{unique_topic}.snap", SnapshotSource(missing, "views"), events=False
        )

    assert rebuilt_anyway == reference
    warnings = [r.getMessage() for r in caplog.records if "fold snapshots" in r.getMessage()]
    assert all("no-such.db" in w and "log's beginning" in w for w in warnings)
    # One for each partition (a rebalance while joining may rebuild one twice).
    named = {int(w.split("partition ")[1].split()[0]) for w in warnings}
    assert named == set(range(settings.partitions))


async def test_a_consumer_whose_snapshot_database_never_answers_rebuilds_from_the_beginning(
    projected: Log,
    unique_topic: str,
    postgres_url: str,
    frozen: list[int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A frozen server takes the connection and never answers: no error comes to fall
    # back on, so the rebuild stops waiting for it.
    settings, _, _ = projected
    reference = await rebuilt(settings, f"{unique_topic}.log", None, events=False)
    database.upgrade(postgres_url)
    freeze_database(database.engine(postgres_url), frozen)
    monkeypatch.setattr(partitions, "SNAPSHOT_WAIT_SECONDS", 2.0)

    with caplog.at_level(logging.WARNING):
        rebuilt_anyway = await rebuilt(
            settings, f"{unique_topic}.snap", SnapshotSource(postgres_url, "views"), events=False
        )

    assert rebuilt_anyway == reference
    warned = [r.getMessage() for r in caplog.records if "log's beginning" in r.getMessage()]
    # Waited for once; the other partitions did not wait in turn.
    assert len([w for w in warned if "no answer from" in w]) == 1, warned
    assert len([w for w in warned if "has still not answered" in w]) >= 2, warned


async def test_a_migrator_rebuilt_from_a_snapshot_decides_on_what_came_before_it(
    kafka_bootstrap: str, unique_topic: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Agreement was reached while no migrator ran, and the projector's snapshot is past
    it: a migrator that starts from that snapshot never sees the reports one by one,
    and must still request the migration (once), at its cluster's next event. The
    projector's database is SQLite, then PostgreSQL."""
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=1)
    await create_topics(settings)
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def heartbeat(apiserver: str, seconds: int) -> ApiserverHeartbeat:
        at = start + timedelta(seconds=seconds)
        meta = Meta.new("east", apiserver, at)
        return ApiserverHeartbeat(meta, apiserver, f"{apiserver}_1", apiserver, 3600, at, "1.35")

    def report(apiserver: str) -> StorageVersionReported:
        meta = Meta.new("east", apiserver, start + timedelta(seconds=1))
        versions = ("v1", "v2")
        return StorageVersionReported(meta, apiserver, "", "pods", "Pod", "v1", versions, versions)

    apiservers = ["apiserver-a", "apiserver-b"]
    records = await append(
        settings, [*(heartbeat(a, 0) for a in apiservers), *(report(a) for a in apiservers)]
    )
    source_url = database_url
    database.upgrade(source_url)
    source = database.engine(source_url)
    try:
        async with projecting(settings, source_url, group=False, snapshot_every=1) as projector:
            await caught_up(source, projector, next_offsets(records))
    finally:
        source.dispose()
    assert snapshots_in(source_url)[-1][1] == len(records)
    assert not requested(await read_log(settings))

    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="consumers.partitions")
    migrating = asyncio.create_task(
        run_migrator(
            settings,
            stop=stop,
            group_id=f"{unique_topic}.migrator",
            snapshots=SnapshotSource(source_url, "views"),
        )
    )
    try:
        started = f"partition 0 starts from its fold snapshot at offset {len(records)}"
        async with asyncio.timeout(60):
            while started not in caplog.text:
                await asyncio.sleep(0.1)
        # Caught up at once (the snapshot is at the log's end), and no event came since.
        await asyncio.sleep(1)
        assert not requested(await read_log(settings))
        await append(settings, [heartbeat("apiserver-a", 10)])  # a plain renewal
        events = await wait_for(settings, lambda es: len(requested(es)) == 1)
        (request,) = requested(events)
        assert request.target_version == "v1"
        assert request.meta.occurred_at == start + timedelta(seconds=10), "at its cause's time"
        await append(settings, [heartbeat("apiserver-b", 20)])
        await wait_for(settings, lambda es: len(es) == len(records) + 3)
        await asyncio.sleep(2)
        assert len(requested(await read_log(settings))) == 1, "requested once"
    finally:
        stop.set()
        await asyncio.wait_for(migrating, 60)
