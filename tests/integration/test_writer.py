"""The batch writer that commits the projector's batches, on SQLite and PostgreSQL.

What the projector relies on: batches commit in order with their checkpoints,
whether in its own process or in the writer process; a batch folded from a
checkpoint the database has left is refused and writes nothing; a writer process
that dies is reported and replaced; and a writer process never outlives its
projector, even one killed with ``kill -9``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from sqlalchemy import Engine

from ledger.codec import encode
from ledger.events import Event, Position
from ledger.kafka import EventProducer, Record, create_topics
from ledger.settings import KafkaSettings
from projections import database, store
from projections.projector import Projection, fold_batch
from projections.state import State
from projections.writer import BatchWriter, WriterLost
from tests.consumed import consumed_log
from tests.integration.test_projector import reference_snapshot, snapshot
from tests.integration.test_projector_crash import checkpoints, start_projector
from tests.workloads import mixed_events

TOPIC = "svledger.events"
# Guards against a hung process, not measurements.
DEADLINE_SECONDS = 60.0


def records(count: int, seed: int = 0) -> list[Record]:
    events: list[Event] = list(mixed_events(count, clusters=3, seed=seed))
    return [Record(Position(0, i), event, encode(event)) for i, event in enumerate(events)]


def writer_children(parent: int) -> list[int]:
    """The PIDs of the writer processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"projections.writer" in command:
            found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (an exited one nobody reaped yet is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


async def commit_in_batches(
    writer: BatchWriter, projection: Projection, log: Sequence[Record], size: int
) -> None:
    for start in range(0, len(log), size):
        await writer.commit(fold_batch(projection, consumed_log(log[start : start + size])).batch)


@pytest.mark.parametrize("process_at", [0, 10_000], ids=["in-child", "in-parent"])
async def test_batches_commit_in_order_with_their_checkpoints(
    db: Engine, database_url: str, process_at: int
) -> None:
    log = records(3_000)
    async with BatchWriter(database_url, process_at=process_at) as writer:
        await commit_in_batches(writer, Projection("views", TOPIC, State(), {}), log, 700)
        assert len(writer_children(os.getpid())) == (1 if process_at < 700 else 0)
    written = snapshot(db)
    with db.connect() as connection:
        assert store.load_checkpoints(connection, TOPIC, "views") == {0: len(log)}
    expected = reference_snapshot(db, [(r.event, r.position) for r in log], TOPIC)
    assert written == expected


async def test_a_batch_from_a_checkpoint_the_database_left_is_refused(
    db: Engine, database_url: str
) -> None:
    log = records(1_000)
    async with BatchWriter(database_url, process_at=0) as writer:
        await writer.commit(
            fold_batch(Projection("views", TOPIC, State(), {}), consumed_log(log[:600])).batch
        )
        before = snapshot(db)
        # A second projector that loaded the database before that commit.
        late = fold_batch(Projection("views", TOPIC, State(), {}), consumed_log(log))
        with pytest.raises(store.StaleProjection, match="another projector wrote it"):
            await writer.commit(late.batch)
        assert snapshot(db) == before
        # Reloaded from the database, it carries on.
        with db.connect() as connection:
            reloaded = Projection.load(connection, TOPIC, "views")
        await writer.commit(fold_batch(reloaded, consumed_log(log)).batch)
    assert snapshot(db) == reference_snapshot(db, [(r.event, r.position) for r in log], TOPIC)


async def test_a_writer_that_dies_is_reported_then_replaced(db: Engine, database_url: str) -> None:
    log = records(1_500)
    async with BatchWriter(database_url, process_at=0) as writer:
        projection = Projection("views", TOPIC, State(), {})
        await writer.commit(fold_batch(projection, consumed_log(log[:500])).batch)
        (child,) = writer_children(os.getpid())
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: not running(child), "the writer is gone")
        with pytest.raises(WriterLost, match="restarted for the next one"):
            await writer.commit(fold_batch(projection, consumed_log(log[500:1000])).batch)
        with db.connect() as connection:
            projection = Projection.load(connection, TOPIC, "views")
        assert projection.next_offsets == {0: 500}
        await writer.commit(fold_batch(projection, consumed_log(log[500:])).batch)
        assert writer_children(os.getpid()) != [child]
    assert snapshot(db) == reference_snapshot(db, [(r.event, r.position) for r in log], TOPIC)


def test_no_writer_outlives_a_killed_projector(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic)

    async def fill() -> None:
        await create_topics(settings)
        async with EventProducer(settings) as producer:
            # Enough for a first batch that goes to the writer process.
            await producer.send_many(mixed_events(20_000, clusters=3))

    asyncio.run(fill())
    database.upgrade(postgres_url)
    db = database.engine(postgres_url)
    process = start_projector(kafka_bootstrap, unique_topic, postgres_url)
    try:
        wait_until(lambda: checkpoints(db, unique_topic), "the projector has committed")
        (child,) = writer_children(process.pid)
        process.send_signal(signal.SIGKILL)
        process.wait()
        wait_until(lambda: not running(child), "the writer has exited")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        db.dispose()
