"""The projector on the real broker into SQLite and PostgreSQL.

The reference for every check is the fold in memory: the log's events, folded in
order and written in one batch, must give exactly the views the projector wrote
batch by batch (``views_snapshot`` equality, ``ledger_events`` included).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from hypothesis import HealthCheck, Phase, given, settings
from sqlalchemy import Engine, create_engine, delete, func, select, text

from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Meta,
    Position,
    StorageVersionReported,
)
from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from projections import database, store
from projections.database import DatabaseNotMigrated
from projections.projector import NotThisLog, Projection, Projector, fold_batch
from projections.replay import replay
from projections.schema import ledger_events, metadata, rejected_events
from projections.state import State
from tests.consumed import consumed_log
from tests.histories import histories
from tests.workloads import mixed_events

# Guards against a hung broker or projector, not measurements.
CATCH_UP_DEADLINE_SECONDS = 120.0


def kafka_settings(bootstrap: str, topic: str, partitions: int = 3) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=bootstrap, topic=topic, partitions=partitions)


async def append(settings: KafkaSettings, events: Iterable[Event]) -> list[tuple[Event, Position]]:
    """Append events to the log; return them with the positions the broker gave them."""
    events = list(events)
    async with EventProducer(settings) as producer:
        positions = await producer.send_many(events)
    return list(zip(events, positions, strict=True))


def reference_snapshot(
    db: Engine, records: Sequence[tuple[Event, Position]], topic: str
) -> dict[str, list[tuple[object, ...]]]:
    """Views of ``records`` folded in memory and written as one batch (clears ``db`` first)."""
    clear(db)
    folded = fold_batch(
        Projection("views", topic, State(), {}),
        consumed_log(records),
    )
    with db.begin() as connection:
        store.write(connection, folded.batch)
    return snapshot(db)


def snapshot(db: Engine) -> dict[str, list[tuple[object, ...]]]:
    with db.connect() as connection:
        return store.views_snapshot(connection)


def clear(db: Engine) -> None:
    with db.begin() as connection:
        for table in reversed(metadata.sorted_tables):
            connection.execute(delete(table))


def next_offsets(records: Iterable[tuple[Event, Position]]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for _, position in records:
        ends[position.partition] = max(ends.get(position.partition, 0), position.offset + 1)
    return ends


@asynccontextmanager
async def projecting(
    settings: KafkaSettings, db_url: str, **options: object
) -> AsyncIterator[Projector]:
    """A projector running in the background; stopped cleanly on exit."""
    projector = Projector(settings, db_url, log_interval=3600, **options)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        yield projector
    finally:
        stop.set()
        await task


async def caught_up(db: Engine, projector: Projector, ends: dict[int, int]) -> None:
    """Wait until the projector's checkpoints reach ``ends``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CATCH_UP_DEADLINE_SECONDS
    while True:
        with db.connect() as connection:
            checkpoints = store.load_checkpoints(
                connection, projector.settings.topic, projector.projection
            )
        if all(checkpoints.get(p, 0) >= offset for p, offset in ends.items()):
            return
        assert loop.time() < deadline, f"projector stuck at {checkpoints}, log ends at {ends}"
        await asyncio.sleep(0.1)


@settings(
    max_examples=6,
    deadline=None,
    # Every example runs the real broker and projector: seconds each, too slow to shrink.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories(max_events=80))
def test_projector_writes_the_fold_of_the_log(
    kafka_bootstrap: str,
    database_url: str,
    db: Engine,
    history: list[tuple[Event, Position]],
) -> None:
    settings = kafka_settings(kafka_bootstrap, f"svledger-test.fold.{uuid.uuid4().hex[:8]}")

    async def scenario() -> tuple[
        list[tuple[Event, Position]], dict[str, list[tuple[object, ...]]]
    ]:
        await create_topics(settings)
        records = await append(settings, [event for event, _ in history])
        async with projecting(settings, database_url) as projector:
            await caught_up(db, projector, next_offsets(records))
        return records, snapshot(db)

    clear(db)
    records, projected = asyncio.run(scenario())
    assert projected == reference_snapshot(db, records, settings.topic)


async def test_clusters_spread_over_partitions_and_two_projectors_sharing_them(
    kafka_bootstrap: str, unique_topic: str, database_url: str, db: Engine
) -> None:
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=4)
    await create_topics(settings)
    events = list(mixed_events(6_000, clusters=12, seed=1))
    first = await append(settings, events[:3_000])
    async with projecting(settings, database_url) as one:
        await caught_up(db, one, next_offsets(first))
        # A second instance joins: the group rebalances and both carry on.
        async with projecting(settings, database_url) as two:
            rest = await append(settings, events[3_000:])
            records = first + rest
            await caught_up(db, one, next_offsets(records))
    assert len({position.partition for _, position in records}) == 4
    assert one.metrics.events_folded + two.metrics.events_folded >= len(records)
    assert snapshot(db) == reference_snapshot(db, records, settings.topic)


async def test_projectors_of_two_databases_each_project_every_partition(
    kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    """Projectors of one database share a consumer group; of two, each reads every
    partition (their groups are named by each database's own ID)."""
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=4)
    await create_topics(settings)
    urls = [f"sqlite:///{tmp_path / name}.db" for name in ("first", "second", "reference")]
    for url in urls:
        database.upgrade(url)
    first, second, reference = (create_engine(url) for url in urls)
    try:
        async with projecting(settings, urls[0]) as one, projecting(settings, urls[1]) as two:
            records = await append(settings, list(mixed_events(2_000, clusters=12, seed=2)))
            await caught_up(first, one, next_offsets(records))
            await caught_up(second, two, next_offsets(records))
        assert one.group_id != two.group_id
        expected = reference_snapshot(reference, records, settings.topic)
        assert snapshot(first) == expected and snapshot(second) == expected
    finally:
        for db in (first, second, reference):
            db.dispose()


async def test_a_restarted_projector_resumes_from_its_checkpoint(
    kafka_bootstrap: str, unique_topic: str, database_url: str, db: Engine
) -> None:
    settings = kafka_settings(kafka_bootstrap, unique_topic)
    await create_topics(settings)
    events = list(mixed_events(2_000, clusters=6, seed=2))
    first = await append(settings, events[:1_200])
    async with projecting(settings, database_url) as projector:
        await caught_up(db, projector, next_offsets(first))
    rest = await append(settings, events[1_200:])
    async with projecting(settings, database_url) as restarted:
        await caught_up(db, restarted, next_offsets(first + rest))
    # It read on from the checkpoint: nothing already in the views came again.
    assert restarted.metrics.skipped == 0
    assert restarted.metrics.events_folded == len(rest)
    assert snapshot(db) == reference_snapshot(db, first + rest, settings.topic)


async def test_views_of_a_topic_deleted_and_created_again_are_refused(
    kafka_bootstrap: str, unique_topic: str, database_url: str, db: Engine
) -> None:
    # The new topic's offsets start over below the checkpoints: read from them, every
    # record below them would have been skipped as already in the views.
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=2)
    await create_topics(settings)
    events = list(mixed_events(400, clusters=4, seed=3))
    records = await append(settings, events[:300])
    async with projecting(settings, database_url) as projector:
        await caught_up(db, projector, next_offsets(records))
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([settings.topic])
        async with asyncio.timeout(30):
            while settings.topic in await admin.list_topics():
                await asyncio.sleep(0.2)
    finally:
        await admin.close()
    await create_topics(settings)
    await append(settings, events[300:])
    before = snapshot(db)

    with pytest.raises(NotThisLog, match=r"deleted and created again.*svledger replay"):
        async with asyncio.timeout(60):  # else it projects on for ever
            await Projector(settings, database_url).run(asyncio.Event())
    with pytest.raises(NotThisLog, match=f"from topic {settings.topic!r} further than"):
        await replay(settings, database_url, from_snapshot=True, progress=False)
    assert snapshot(db) == before


async def test_a_projector_whose_schema_a_newer_release_upgraded_stops_saying_so(
    kafka_bootstrap: str, unique_topic: str, database_url: str, db: Engine
) -> None:
    # A newer release's upgrade ran under it, adding a column this one does not write:
    # its inserts are refused, and reloading (as after another projector's batch) would
    # loop for ever.
    settings = kafka_settings(kafka_bootstrap, unique_topic)
    await create_topics(settings)
    events = list(mixed_events(2_000, clusters=3, seed=4))
    records = await append(settings, events[:1_000])
    projector = Projector(settings, database_url, log_interval=3600)
    stop = asyncio.Event()
    running = asyncio.create_task(projector.run(stop))
    try:
        await caught_up(db, projector, next_offsets(records))
        with db.begin() as connection:
            connection.execute(
                text("ALTER TABLE ledger_events ADD COLUMN newer TEXT NOT NULL DEFAULT ''")
            )
            connection.execute(text("UPDATE alembic_version SET version_num = '9999_newer'"))
        if db.dialect.name == "postgresql":  # SQLite cannot drop a default: a trigger refuses
            with db.begin() as connection:
                connection.execute(
                    text("ALTER TABLE ledger_events ALTER COLUMN newer DROP DEFAULT")
                )
        else:
            with db.begin() as connection:
                connection.execute(
                    text(
                        "CREATE TRIGGER newer BEFORE INSERT ON ledger_events"
                        " BEGIN SELECT RAISE(ABORT, 'NOT NULL constraint failed: newer'); END"
                    )
                )
        await append(settings, events[1_000:])
        with pytest.raises(DatabaseNotMigrated, match="a newer svledger wrote it"):
            await asyncio.wait_for(running, 60)
    finally:
        stop.set()
        running.cancel()


async def test_an_undecodable_record_goes_to_the_dlq_and_projection_goes_on(
    kafka_bootstrap: str, unique_topic: str, database_url: str, db: Engine
) -> None:
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=1)
    await create_topics(settings)
    events = list(mixed_events(300, clusters=2, seed=3))
    before = await append(settings, events[:100])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        garbage = await producer.send_and_wait(
            settings.topic, b"\x00not avro", key=events[0].meta.cluster.encode()
        )
    finally:
        await producer.stop()
    after = await append(settings, events[100:])
    records = before + after
    async with projecting(settings, database_url) as projector:
        await caught_up(db, projector, next_offsets(records))

    consumer = AIOKafkaConsumer(
        settings.dlq_topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        dead = await asyncio.wait_for(consumer.getone(), CATCH_UP_DEADLINE_SECONDS)
    finally:
        await consumer.stop()
    assert dead.value == b"\x00not avro"
    assert dict(dead.headers)["svledger-dlq-offset"] == str(garbage.offset).encode()
    with db.connect() as connection:
        offsets = set(connection.scalars(select(ledger_events.c.log_offset)))
    assert garbage.offset not in offsets
    assert snapshot(db) == reference_snapshot(db, records, settings.topic)


async def test_invalid_events_land_in_rejected_events_and_later_ones_apply(
    kafka_bootstrap: str, unique_topic: str, database_url: str, db: Engine
) -> None:
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=1)
    await create_topics(settings)
    now = datetime(2024, 3, 1, tzinfo=UTC)

    def meta(source: str, seconds: int) -> Meta:
        return Meta(str(uuid.uuid4()), "prod", now + timedelta(seconds=seconds), source)

    def report(seconds: int) -> StorageVersionReported:
        return StorageVersionReported(
            meta("apiserver-a", seconds), "apiserver-a", "apps", "deployments", "Deployment",
            "v1", ("v1",), ("v1",),
        )  # fmt: skip

    records = await append(
        settings,
        [
            report(0),  # before any heartbeat: no lease yet
            ApiserverHeartbeat(
                meta("apiserver-a", 1), "apiserver-a", "apiserver-a_1", "cp-a", 3600, now, None
            ),
            report(2),
        ],
    )
    async with projecting(settings, database_url) as projector:
        await caught_up(db, projector, next_offsets(records))
    with db.connect() as connection:
        rejected = connection.execute(
            select(rejected_events.c.log_offset, rejected_events.c.reason)
        ).all()
        applied = connection.scalar(
            text("SELECT count(*) FROM server_storage_versions WHERE apiserver_id = 'apiserver-a'")
        )
        total = connection.scalar(select(func.count()).select_from(ledger_events))
    assert [offset for offset, _ in rejected] == [records[0][1].offset]
    assert "holds no lease" in rejected[0][1]
    assert applied == 1
    assert total == 3
    assert projector.metrics.rejected == 1


async def test_a_database_outage_is_waited_out_and_loses_nothing(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str
) -> None:
    database.upgrade(postgres_url)
    db = database.engine(postgres_url)
    name = db.url.database
    # Locking a database out is done from another one, on the server's maintenance database.
    admin = create_engine(db.url.set(database="postgres"))
    settings = kafka_settings(kafka_bootstrap, unique_topic)
    await create_topics(settings)
    events = list(mixed_events(1_500, clusters=4, seed=4))
    first = await append(settings, events[:500])
    try:
        async with projecting(settings, postgres_url) as projector:
            await caught_up(db, projector, next_offsets(first))
            with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )
                rest = await append(settings, events[500:])
                await asyncio.sleep(2)  # the projector meets the outage meanwhile
                folded_during_outage = projector.metrics.events_folded
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            db.dispose()
            await caught_up(db, projector, next_offsets(first + rest))
        assert folded_during_outage == len(first)
        assert snapshot(db) == reference_snapshot(db, first + rest, settings.topic)
    finally:
        admin.dispose()
        db.dispose()
