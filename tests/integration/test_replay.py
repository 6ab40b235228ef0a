"""Replay on the real broker into SQLite and PostgreSQL; history and explain read its views.

The reference is again the fold in memory of the records the broker holds: a whole
replay equals the fold of the whole log, a replay ``--until`` equals the fold of the
prefix it names, a ``--cluster`` replay the fold of that cluster's events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import re
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from sqlalchemy import Connection, Engine, create_engine, insert, select, text, update
from sqlalchemy.exc import DBAPIError

from ledger.events import Event, Position
from ledger.kafka import create_topics, partition_of, topic_partitions
from ledger.names import resource_name
from ledger.settings import KafkaSettings
from projections import history as history_module
from projections import store
from projections.database import engine, upgrade
from projections.history import ResourceKey, format_history, gather, history
from projections.replay import ReplayError, parse_until, replay
from projections.schema import ledger_events, projection_checkpoints
from projections.state import StorageVersion
from svledger.commands.log import _read_resource
from tests.integration.test_projector import (
    append,
    clear,
    kafka_settings,
    reference_snapshot,
    snapshot,
)
from tests.workloads import mixed_events

EVENTS = 3_000


@pytest.fixture
async def log(
    kafka_bootstrap: str, unique_topic: str
) -> tuple[KafkaSettings, list[tuple[Event, Position]]]:
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=3)
    await create_topics(settings)
    return settings, await append(settings, mixed_events(EVENTS, clusters=8, seed=5))


def until_time(
    records: list[tuple[Event, Position]], until: datetime
) -> list[tuple[Event, Position]]:
    """What a replay ``--until`` that time folds: each partition up to its first later event."""
    stopped: set[int] = set()
    prefix = []
    for event, position in sorted(records, key=lambda record: record[1]):
        if position.partition in stopped or event.meta.occurred_at > until:
            stopped.add(position.partition)
            continue
        prefix.append((event, position))
    return prefix


def checkpoints(db: Engine, topic: str) -> dict[int, int]:
    with db.connect() as connection:
        return store.load_checkpoints(connection, topic, "views")


async def test_replaying_twice_gives_identical_databases_equal_to_the_fold(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    settings, records = log
    first = await replay(settings, database_url, progress=False)
    replayed, replayed_checkpoints = snapshot(db), checkpoints(db, settings.topic)
    clear(db)
    second = await replay(settings, database_url, progress=False)
    assert snapshot(db) == replayed
    assert checkpoints(db, settings.topic) == replayed_checkpoints == first.next_offsets
    assert first.events == second.events == len(records)
    assert replayed == reference_snapshot(db, records, settings.topic)


async def test_a_replay_in_small_batches_reads_every_record_to_the_end(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    # Many fetches, each started while the batch before is written: the last of them
    # reaches the ends of the partitions before the replay has taken its records.
    settings, records = log
    result = await replay(settings, database_url, progress=False, max_batch=50)
    assert result.events == len(records)
    assert snapshot(db) == reference_snapshot(db, records, settings.topic)


async def test_until_an_offset_gives_the_views_as_of_that_offset(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    settings, records = log
    until = EVENTS // 6
    await replay(settings, database_url, until=until, progress=False)
    prefix = [(event, position) for event, position in records if position.offset <= until]
    assert len(prefix) < len(records)
    assert snapshot(db) == reference_snapshot(db, prefix, settings.topic)


async def test_until_a_time_stops_each_partition_at_its_first_later_event(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    settings, records = log
    times = sorted(event.meta.occurred_at for event, _ in records)
    until = times[len(times) // 3]
    await replay(settings, database_url, until=until, progress=False)
    prefix = until_time(records, until)
    assert snapshot(db) == reference_snapshot(db, prefix, settings.topic)


async def test_one_cluster_replays_that_cluster_alone(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    settings, records = log
    cluster = records[0][0].meta.cluster
    result = await replay(settings, database_url, cluster=cluster, progress=False)
    own = [(event, position) for event, position in records if event.meta.cluster == cluster]
    assert result.events == len(own)
    assert snapshot(db) == reference_snapshot(db, own, settings.topic)


async def test_a_cluster_without_events_is_named_with_those_its_partition_has(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]],
    database_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    settings, records = log
    with pytest.raises(ReplayError, match="cluster 'no-such-cluster' has no events") as refused:
        await replay(settings, database_url, cluster="no-such-cluster", progress=False)
    partition = partition_of("no-such-cluster", range(3))
    there = {e.meta.cluster for e, p in records if p.partition == partition}
    assert there and all(cluster in str(refused.value) for cluster in there)
    # As of a time before its first event, a cluster may have none: said, not refused.
    first = min(event.meta.occurred_at for event, _ in records)
    until = first - timedelta(seconds=1)
    result = await replay(settings, fresh, cluster="no-such-cluster", until=until, progress=False)
    assert result.events == 0
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "cluster 'no-such-cluster' has no events in topic" in warning
    assert "up to --until" in warning


async def test_an_offset_past_every_partitions_end_is_warned_of_and_replays_to_the_end(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]],
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings, records = log
    past = len(records)  # no partition holds every record
    result = await replay(settings, database_url, until=past, progress=False)
    assert result.events == len(records)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    ends = {p: max(q.offset for _, q in records if q.partition == p) + 1 for p in range(3)}
    assert f"--until {past} is past the end of every partition" in warning
    assert all(f"{p} ends at {end}" in warning for p, end in ends.items())


async def test_an_offset_within_some_partition_is_not_warned_of(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]],
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings, records = log
    longest = max(p.offset for _, p in records)  # the last record of the longest partition
    await replay(settings, database_url, until=longest, progress=False)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


async def test_a_snapshot_continues_from_its_checkpoint(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    settings, records = log
    await replay(settings, database_url, until=EVENTS // 10, progress=False)
    rest = await replay(settings, database_url, from_snapshot=True, progress=False)
    assert 0 < rest.events < len(records)
    assert snapshot(db) == reference_snapshot(db, records, settings.topic)


async def test_a_snapshot_that_does_not_know_its_time_is_not_continued_to_a_time(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    # Projected before the checkpoints recorded a time (schema revision 0003), it may be
    # past any --until time: continued, it would silently stay past it.
    settings, records = log
    await replay(settings, database_url, until=EVENTS // 10, progress=False)
    with db.begin() as connection:
        connection.execute(update(projection_checkpoints).values(log_time=None))
    latest = max(event.meta.occurred_at for event, _ in records)
    with pytest.raises(ReplayError, match="does not know when the events before its checkpoint"):
        await replay(settings, database_url, until=latest, from_snapshot=True, progress=False)
    rest = await replay(settings, database_url, from_snapshot=True, progress=False)
    assert 0 < rest.events < len(records)


async def test_two_processes_replay_what_one_replays(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], postgres_url: str
) -> None:
    settings, records = log
    upgrade(postgres_url)
    db = engine(postgres_url)
    try:
        times = sorted(event.meta.occurred_at for event, _ in records)
        until = times[len(times) // 2]
        half = await replay(settings, postgres_url, until=until, processes=2, progress=False)
        prefix = until_time(records, until)
        assert half.events == len(prefix)
        assert snapshot(db) == reference_snapshot(db, prefix, settings.topic)
        assert checkpoints(db, settings.topic) == half.next_offsets
        # Continued from there in more processes than partitions: the whole log.
        rest = await replay(settings, postgres_url, from_snapshot=True, processes=5, progress=False)
        assert half.events + rest.events == len(records)
        assert snapshot(db) == reference_snapshot(db, records, settings.topic)
        assert checkpoints(db, settings.topic) == rest.next_offsets
        assert len(rest.next_offsets) == settings.partitions
    finally:
        db.dispose()


async def test_the_helpers_send_their_dead_letters_and_log_through_the_parent(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=3)
    await create_topics(settings)
    events = list(mixed_events(600, clusters=6, seed=8))
    records = await append(settings, events[:300])
    garbage = []
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for partition in range(settings.partitions):
            sent = await producer.send_and_wait(
                settings.topic, b"\x00not avro", key=b"c", partition=partition
            )
            garbage.append(Position(sent.partition, sent.offset))
    finally:
        await producer.stop()
    records += await append(settings, events[300:])
    with caplog.at_level(logging.WARNING):
        result = await replay(settings, postgres_url, processes=3, progress=False)
    assert result.events == len(records)
    # Each partition was replayed by its own process; all three said so here.
    for position in garbage:
        assert any(
            f"{settings.topic}:{position.partition}@{position.offset} is a dead letter"
            in record.getMessage()
            for record in caplog.records
        ), position
    upgrade(postgres_url)
    db = engine(postgres_url)
    try:
        assert snapshot(db) == reference_snapshot(db, records, settings.topic)
    finally:
        db.dispose()


async def test_replays_side_by_side_each_finish_and_send_each_dead_letter_once(
    kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    # Every reader of a partition sends its dead letters under one transactional ID,
    # so readers side by side (replays, projectors of two databases) fence each other:
    # the one fenced waits and checks again instead of failing.
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=2)
    await create_topics(settings)
    records = await append(settings, mixed_events(200, clusters=4, seed=6))
    garbage = []
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for partition, number in itertools.product(range(settings.partitions), range(3)):
            sent = await producer.send_and_wait(
                settings.topic, b"\x00not avro %d" % number, key=b"c", partition=partition
            )
            garbage.append((sent.partition, sent.offset))
    finally:
        await producer.stop()
    environment = dict(
        os.environ, SVLEDGER_KAFKA_BOOTSTRAP=kafka_bootstrap, SVLEDGER_TOPIC=settings.topic
    )
    replays = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "svledger",
            "--log-format",
            "text",
            "replay",
            "--db",
            f"sqlite:///{tmp_path / f'replay{number}.db'}",
            "--no-progress",
            env=environment,
            stderr=asyncio.subprocess.PIPE,
        )
        for number in range(5)
    ]
    for process in replays:
        _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
    for number in range(5):
        db = engine(f"sqlite:///{tmp_path / f'replay{number}.db'}")
        try:
            assert snapshot(db) == reference_snapshot(db, records, settings.topic)
        finally:
            db.dispose()
    assert sorted(await dead_letter_sources(settings)) == sorted(garbage)


async def dead_letter_sources(settings: KafkaSettings) -> list[tuple[int, int]]:
    """The source position of every dead letter in ``settings``' dead-letter topic."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        partitions = [
            TopicPartition(settings.dlq_topic, partition)
            for partition in await topic_partitions(settings, settings.dlq_topic)
        ]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        letters = []
        for partition in partitions:
            while await consumer.position(partition) < ends[partition]:
                letters += (await consumer.getmany(partition, timeout_ms=1000)).get(partition, [])
    finally:
        await consumer.stop()
    return [
        (
            int(dict(m.headers)["svledger-dlq-partition"]),
            int(dict(m.headers)["svledger-dlq-offset"]),
        )
        for m in letters
    ]


async def test_a_replay_in_several_processes_interrupted_ends_quietly_leaving_none(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str
) -> None:
    # A terminal's Ctrl-C reaches the whole process group: the helpers (and their writer
    # processes) printed its traceback each, or a broken pipe's once the parent was gone.
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=3)
    await create_topics(settings)
    await append(settings, mixed_events(200_000, clusters=9, seed=1))  # seconds to replay
    environment = dict(
        os.environ, SVLEDGER_KAFKA_BOOTSTRAP=kafka_bootstrap, SVLEDGER_TOPIC=settings.topic
    )
    argv = ["--log-format", "text", "replay", "--processes", "3", "--no-progress"]
    # On a loaded machine the first batch may commit late and the replay end before the
    # Ctrl-C reaches it (exit 0): that moment is tried again, at most twice.
    moments = ["starting", "replaying", "replaying", "replaying"]
    while moments:
        moment = moments.pop(0)
        replaying = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "svledger", *argv, "--db", postgres_url,
            env=environment, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        if moment == "starting":  # the helpers have just been started: they are importing
            await helpers_started(f"SVLEDGER_TOPIC={settings.topic}")
        else:  # the first batch is committed (a fixed delay could outlast the replay)
            await first_checkpoint(postgres_url)
        with contextlib.suppress(ProcessLookupError):  # the replay may have ended
            os.killpg(replaying.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        _, stderr = await replaying.communicate()
        finished = moment == "replaying" and replaying.returncode == 0
        assert finished or replaying.returncode == 130, stderr.decode()
        if finished and not moments:
            pytest.skip("each replay ended before its Ctrl-C on this loaded machine")
        if replaying.returncode == 130 and moment == "replaying":
            moments.clear()
        assert b"Traceback" not in stderr, stderr.decode()
        await asyncio.sleep(1)
        left = processes_with(f"SVLEDGER_TOPIC={settings.topic}")
        assert not left, f"helpers left running after Ctrl-C ({moment}): {left}"
        db = create_engine(postgres_url)  # interrupted while starting: maybe no schema yet
        with db.begin() as connection:  # the next replay needs a fresh database
            connection.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
        db.dispose()


async def helpers_started(setting: str) -> None:
    """Wait until a process whose environment holds ``setting`` has started another."""
    for _ in range(600):
        if len(processes_with(setting)) > 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replay started no helper in 30 s")


async def first_checkpoint(url: str) -> None:
    """Wait until a replay into ``url`` has committed its first batch."""
    db = create_engine(url)  # the schema may not be there yet
    try:
        for _ in range(600):
            with contextlib.suppress(DBAPIError), db.connect() as connection:  # no table yet
                if connection.execute(select(projection_checkpoints)).first():
                    return
            await asyncio.sleep(0.05)
        raise AssertionError("the replay committed nothing in 30 s")
    finally:
        db.dispose()


def processes_with(setting: str) -> list[str]:
    """The command lines of the processes whose environment holds ``setting``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if setting.encode() in environ.read_bytes().split(b"\0"):
                command = (environ.parent / "cmdline").read_bytes()
                found.append(command.replace(b"\0", b" ").decode(errors="replace"))
    return found


async def test_a_replay_of_one_cluster_leaves_the_dead_letters_to_whole_readers(
    kafka_bootstrap: str, unique_topic: str, database_url: str, db: Engine
) -> None:
    # Dead letters are sent once per source offset by remembering the highest sent: a
    # reader that passes over other clusters' records must send none, or the earlier
    # dead letters of those clusters would count as sent and never be.
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=1)
    await create_topics(settings)
    events = list(mixed_events(300, clusters=2, seed=4))
    clusters = sorted({event.meta.cluster for event in events})
    records = await append(settings, events[:100])
    garbage = []
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for cluster in clusters:
            sent = await producer.send_and_wait(
                settings.topic, b"\x00not avro", key=cluster.encode()
            )
            garbage.append(sent.offset)
    finally:
        await producer.stop()
    records += await append(settings, events[100:])
    await replay(settings, database_url, cluster=clusters[-1], progress=False)
    clear(db)
    await replay(settings, database_url, progress=False)
    assert snapshot(db) == reference_snapshot(db, records, settings.topic)
    assert sorted(await dead_letter_sources(settings)) == [(0, offset) for offset in garbage]


async def test_a_database_holding_a_projection_is_refused_without_from_snapshot(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    settings, records = log
    await replay(settings, database_url, until=10, progress=False)
    before = snapshot(db)
    with pytest.raises(ReplayError, match="--from-snapshot"):
        await replay(settings, database_url, progress=False)
    with pytest.raises(ReplayError, match="--from-snapshot"):  # its helpers stopped too
        await replay(settings, database_url, progress=False, processes=2)
    with pytest.raises(ReplayError, match="past --until 5"):
        await replay(settings, database_url, until=5, from_snapshot=True, progress=False)
    # A time before an event the database holds: the cut is before its checkpoint.
    earlier = min(e.meta.occurred_at for e, p in records if p.offset <= 10) - timedelta(seconds=1)
    with pytest.raises(ReplayError, match=re.escape(f"past --until {earlier.isoformat()}")):
        await replay(settings, database_url, until=earlier, from_snapshot=True, progress=False)
    assert snapshot(db) == before


async def test_history_lists_every_event_about_a_resource_in_log_order(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]], database_url: str, db: Engine
) -> None:
    settings, records = log
    await replay(settings, database_url, progress=False)
    cluster = records[0][0].meta.cluster
    with db.connect() as connection:
        entries = history(connection, "deployments.apps", cluster)
        assert history(connection, "apps.deployments", cluster) == entries
    own = {
        position
        for event, position in records
        if event.meta.cluster == cluster
        and resource_name(getattr(event, "group", "-"), getattr(event, "resource", "-"))
        == "apps.deployments"
    }
    positions = [entry.position for entry in entries]
    assert positions == sorted(positions)
    assert own <= set(positions)
    assert all(str(entry.position) in format_history(entries) for entry in entries)


async def test_explain_reads_the_views_and_their_history_as_of_one_commit(
    log: tuple[KafkaSettings, list[tuple[Event, Position]]],
    database_url: str,
    db: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # explain reads the views, then the history that led to them: a batch the projector
    # commits in between must not show in the history of views from before it.
    settings, records = log
    await replay(settings, database_url, progress=False)
    key = (records[0][0].meta.cluster, "apps", "deployments")
    with db.connect() as connection:
        last = gather(connection, key).history[-1].position
    events = ledger_events.c
    read_start = history_module._start

    def start_then_commit(connection: Connection, key: ResourceKey) -> StorageVersion | None:
        with db.begin() as writer:  # the projector's next batch, say
            row = writer.execute(
                select(ledger_events).where(
                    events.log_partition == last.partition, events.log_offset == last.offset
                )
            ).one()
            writer.execute(insert(ledger_events).values(**{**row._asdict(), "log_offset": 10**9}))
        return read_start(connection, key)

    monkeypatch.setattr(history_module, "_start", start_then_commit)
    arguments = argparse.Namespace(db=database_url)
    facts = _read_resource(arguments, lambda connection: gather(connection, key))
    assert facts.history, "a resource with a history"
    assert all(entry.position.offset < 10**9 for entry in facts.history)


def test_until_is_an_offset_or_a_zoned_time() -> None:
    assert parse_until("1234") == 1234
    moment = datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert parse_until("2024-05-01T12:00:00Z") == moment
    assert parse_until("2024-05-01T14:00:00+02:00") == moment
    with pytest.raises(ReplayError, match="no time zone"):
        parse_until("2024-05-01T12:00:00")
    with pytest.raises(ReplayError, match="neither an offset"):
        parse_until("yesterday")
