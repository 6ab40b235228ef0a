"""Exactly-once under ``kill -9``: projectors killed at random points, on real PostgreSQL.

Projectors run in their own processes (:mod:`tests.integration.projector_proc`) and
are killed with SIGKILL at random moments while they ingest a pre-filled topic with
a few undecodable records in it, then restarted, many times: one projector alone, and
two in one consumer group, where each kill and restart moves partitions between them.
After the last restart has caught up, the views must equal a fresh replay of the log
row for row, ``ledger_events`` must hold every offset of every decodable record
exactly once (a plain lease renewal is counted once in ``lease_renewals`` instead), and
the dead-letter topic every undecodable record exactly once. The projectors take fold
snapshots as they go: each partition has one for every multiple of the interval a
batch passed, and a replay from the last ones writes the views a replay from the
beginning writes.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from sqlalchemy import Engine, func, select

from ledger.events import Event, Position
from ledger.kafka import (
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    EventConsumer,
    EventProducer,
    create_topics,
)
from ledger.settings import KafkaSettings
from projections import database, store
from projections.replay import replay
from projections.schema import fold_snapshots, lease_renewals, ledger_events
from tests.histories import plain_renewals
from tests.integration.test_admission import read_topic
from tests.integration.test_projector import clear, snapshot
from tests.workloads import mixed_events

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 100_000
KILLS = 12
GROUP_KILLS = 8
GARBAGE = 5
# Guards against a hung process, not measurements.
DEADLINE_SECONDS = 300.0
SNAPSHOT_EVERY = 997  # offsets of a partition between fold snapshots


def start_projector(
    bootstrap: str, topic: str, db_url: str, *, group: bool = False
) -> subprocess.Popen[bytes]:
    mode = "group" if group else "solo"
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "tests.integration.projector_proc", bootstrap, topic, db_url),
            *(mode, str(SNAPSHOT_EVERY)),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )


def checkpoints(db: Engine, topic: str) -> dict[int, int]:
    with db.connect() as connection:
        return store.load_checkpoints(connection, topic, "views")


async def fill(
    settings: KafkaSettings, count: int = EVENTS
) -> tuple[dict[int, int], set[Position]]:
    """Append the events with a few garbage records among them (never last in a partition).

    Returns the end offset of every partition and the positions of the garbage.
    """
    await create_topics(settings)
    events = list(mixed_events(count, clusters=40, seed=7))
    positions: list[Position] = []
    garbage: set[Position] = set()
    raw = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await raw.start()
    try:
        async with EventProducer(settings, linger_ms=20) as producer:
            step = len(events) // (GARBAGE + 1) + 1
            for start in range(0, len(events), step):
                chunk = events[start : start + step]
                positions += await producer.send_many(chunk)
                if len(garbage) < GARBAGE:
                    sent = await raw.send_and_wait(
                        settings.topic, b"garbage", key=chunk[0].meta.cluster.encode()
                    )
                    garbage.add(Position(sent.partition, sent.offset))
    finally:
        await raw.stop()
    ends: dict[int, int] = {}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends, garbage


@pytest.mark.slow
def test_killed_projectors_leave_the_views_a_replay_gives(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str, sqlite_url: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=4)
    ends, garbage = asyncio.run(fill(settings))
    database.upgrade(postgres_url)
    db = database.engine(postgres_url)
    rng = random.Random(11)
    try:
        kills = 0
        while kills < KILLS:
            process = start_projector(kafka_bootstrap, unique_topic, postgres_url)
            try:
                process.wait(timeout=rng.uniform(1.0, 3.0))
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
                kills += 1
            else:
                pytest.fail(f"the projector exited by itself with {process.returncode}")

        process = start_projector(kafka_bootstrap, unique_topic, postgres_url)
        try:
            deadline = time.monotonic() + DEADLINE_SECONDS
            while checkpoints(db, unique_topic) != ends:
                assert process.poll() is None, f"projector exited with {process.returncode}"
                assert time.monotonic() < deadline, f"stuck at {checkpoints(db, unique_topic)}"
                time.sleep(0.5)
        finally:
            # The last killed projector may have finished the log already: wait until
            # this one handles SIGTERM before sending it.
            assert process.stdout is not None
            assert process.stdout.readline() == b"ready\n"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0

        assert_applied_once(settings, db, ends, garbage, postgres_url, sqlite_url)
    finally:
        db.dispose()


@pytest.mark.slow
def test_two_projectors_sharing_the_partitions_killed_by_turns_apply_every_offset_once(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str, sqlite_url: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=4)
    ends, garbage = asyncio.run(fill(settings, EVENTS // 2))
    database.upgrade(postgres_url)
    db = database.engine(postgres_url)
    rng = random.Random(13)
    processes = [
        start_projector(kafka_bootstrap, unique_topic, postgres_url, group=True) for _ in range(2)
    ]
    try:
        for _ in range(GROUP_KILLS):  # each kill and each restart is a rebalance
            time.sleep(rng.uniform(1.0, 4.0))
            victim = rng.randrange(len(processes))
            assert processes[victim].poll() is None, "a projector exited by itself"
            processes[victim].send_signal(signal.SIGKILL)
            processes[victim].wait()
            processes[victim] = start_projector(
                kafka_bootstrap, unique_topic, postgres_url, group=True
            )
        deadline = time.monotonic() + DEADLINE_SECONDS
        while checkpoints(db, unique_topic) != ends:
            assert all(p.poll() is None for p in processes), "a projector exited by itself"
            assert time.monotonic() < deadline, f"stuck at {checkpoints(db, unique_topic)}"
            time.sleep(0.5)
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline() == b"ready\n"
            process.send_signal(signal.SIGTERM)
        assert [process.wait(timeout=60) for process in processes] == [0, 0]
        assert_applied_once(settings, db, ends, garbage, postgres_url, sqlite_url)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        db.dispose()


def assert_applied_once(
    settings: KafkaSettings,
    db: Engine,
    ends: dict[int, int],
    garbage: set[Position],
    postgres_url: str,
    spare_url: str,
) -> None:
    """Every decodable record in ``ledger_events`` once, or, a plain lease renewal,
    counted once in ``lease_renewals``; every undecodable one in the dead-letter topic
    once; a fold snapshot per multiple passed; and the views those of a fresh replay,
    from the beginning and (into ``spare_url``) from the snapshots."""
    history = asyncio.run(decodable_records(settings))
    assert len(history) == sum(ends.values()) - len(garbage)
    plain, renewals = plain_renewals(history)
    with db.connect() as connection:
        positions = connection.execute(
            select(ledger_events.c.log_partition, ledger_events.c.log_offset)
        ).all()
        count = connection.scalar(select(func.count()).select_from(ledger_events))
        counted = connection.execute(select(lease_renewals)).all()
    expected = {position for _, position in history} - plain
    assert count == len(positions) == len(set(positions)) == len(expected)
    assert set(positions) == expected
    assert sorted(tuple(row) for row in counted) == [
        (*holder, settings.topic, *count) for holder, count in sorted(renewals.items())
    ]
    assert plain, "no plain renewal in the log: thinning was not exercised"
    dead = asyncio.run(dead_letters(settings))
    assert sorted(dead) == sorted(garbage), "a dead letter is missing or sent twice"

    with db.connect() as connection:
        taken = connection.execute(
            select(fold_snapshots.c.log_partition, fold_snapshots.c.next_offset)
        ).all()
    for partition, end in ends.items():
        multiples = sorted(o // SNAPSHOT_EVERY for p, o in taken if p == partition)
        assert multiples == sorted(set(multiples)), "two snapshots for one multiple"
        assert multiples[-1] == end // SNAPSHOT_EVERY, "the last multiple has no snapshot"
    projected = snapshot(db)
    asyncio.run(replay(settings, spare_url, snapshots_from=postgres_url, progress=False))
    spare = database.engine(spare_url)
    from_snapshots = snapshot(spare)
    spare.dispose()
    assert {view: from_snapshots[view] for view in store.STATE_VIEWS} == {
        view: projected[view] for view in store.STATE_VIEWS
    }
    clear(db)
    db.dispose()
    asyncio.run(replay(settings, postgres_url, progress=False))
    assert snapshot(db) == projected
    assert sorted(asyncio.run(dead_letters(settings))) == sorted(garbage), "the replay sent again"


async def decodable_records(settings: KafkaSettings) -> list[tuple[Event, Position]]:
    """Every decodable event of the log, in log order, with its position."""
    async with EventConsumer(settings, until="end", dead_letters=False) as consumer:
        return [(record.event, record.position) async for record in consumer]


async def dead_letters(settings: KafkaSettings) -> list[Position]:
    """The source position of every record in the dead-letter topic (committed ones)."""
    found = []
    for _, headers in await read_topic(settings, settings.dlq_topic):
        found.append(
            Position(
                int(dict(headers)[DLQ_PARTITION_HEADER]), int(dict(headers)[DLQ_OFFSET_HEADER])
            )
        )
    return found
