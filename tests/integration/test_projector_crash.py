"""Exactly-once under ``kill -9``: the projector killed at random points, on real PostgreSQL.

The projector runs in its own process (:mod:`tests.integration.projector_proc`)
and is killed with SIGKILL at random moments while it ingests a pre-filled topic,
then restarted, many times. After the last restart has caught up, the views must
equal a fresh replay of the log row for row, and ``ledger_events`` must hold every
offset of every decodable record exactly once.
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

from ledger.events import Position
from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from projections import database, store
from projections.replay import replay
from projections.schema import ledger_events
from tests.integration.test_projector import clear, snapshot
from tests.workloads import mixed_events

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 100_000
KILLS = 20
GARBAGE = 5
# Guards against a hung process, not measurements.
DEADLINE_SECONDS = 300.0


def start_projector(bootstrap: str, topic: str, db_url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.projector_proc", bootstrap, topic, db_url],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )


def checkpoints(db: Engine, topic: str) -> dict[int, int]:
    with db.connect() as connection:
        return store.load_checkpoints(connection, topic, "views")


async def fill(settings: KafkaSettings) -> tuple[dict[int, int], set[Position]]:
    """Append the events with a few garbage records among them (never last in a partition).

    Returns the end offset of every partition and the positions of the garbage.
    """
    await create_topics(settings)
    events = list(mixed_events(EVENTS, clusters=40, seed=7))
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
    kafka_bootstrap: str, unique_topic: str, postgres_url: str
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

        records = sum(ends.values())
        with db.connect() as connection:
            positions = connection.execute(
                select(ledger_events.c.log_partition, ledger_events.c.log_offset)
            ).all()
            count = connection.scalar(select(func.count()).select_from(ledger_events))
        expected = {(p, o) for p, end in ends.items() for o in range(end)} - garbage
        assert count == len(positions) == len(set(positions)) == records - len(garbage)
        assert set(positions) == expected

        projected = snapshot(db)
        clear(db)
        db.dispose()
        asyncio.run(replay(settings, postgres_url, progress=False))
        assert snapshot(db) == projected
    finally:
        db.dispose()
