"""A projector told to stop while its database does not answer (a frozen server)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, func, select

from ledger.events import Event
from ledger.kafka import EventConsumer, EventProducer, create_topics
from ledger.settings import KafkaSettings
from projections.database import engine, upgrade
from projections.fold import fold
from projections.projector import DEFAULT_PROJECTION, STOP_GRACE_SECONDS, group_id, run_projector
from projections.schema import projection_checkpoints
from projections.store import database_id, load_state
from tests.frozen import asked, freeze_database
from tests.integration.test_migrator import DEADLINE, read_records
from tests.workloads import mixed_events

ROOT = Path(__file__).resolve().parents[2]


def project(settings: KafkaSettings, db_url: str, log: Path) -> subprocess.Popen[bytes]:
    environment = dict(
        os.environ,
        SVLEDGER_KAFKA_BOOTSTRAP=settings.bootstrap_servers,
        SVLEDGER_TOPIC=settings.topic,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "svledger", "--log-format", "text", "project", "--db", db_url],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


async def projected(db: Engine, records: int) -> None:
    """Wait until the projector's checkpoints have passed ``records`` records."""
    async with asyncio.timeout(DEADLINE):
        while True:
            with db.connect() as connection:
                passed = connection.scalar(select(func.sum(projection_checkpoints.c.next_offset)))
            if passed == records:
                return
            await asyncio.sleep(0.1)


async def projecting(
    settings: KafkaSettings, db_url: str, events: list[Event], log: Path
) -> subprocess.Popen[bytes]:
    """A projector (``svledger project``) that has projected ``events``, appended to a
    new topic, into a new database."""
    await create_topics(settings)
    upgrade(db_url)
    async with EventProducer(settings) as producer:
        await producer.send_many(events)
    projector = project(settings, db_url, log)
    db = engine(db_url)
    try:
        await projected(db, len(events))
    except BaseException:
        projector.kill()
        raise
    finally:
        db.dispose()
    return projector


async def stopped(projector: subprocess.Popen[bytes]) -> tuple[int | None, float]:
    """SIGTERM ``projector``: its exit code (None if it ran on past the grace and 20 s
    more) and how long it took to stop."""
    projector.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        code: int | None = await asyncio.to_thread(projector.wait, STOP_GRACE_SECONDS + 20)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - started


def thaw(frozen: list[int]) -> None:
    """Let the processes of a frozen database go on (SIGCONT)."""
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)
    frozen.clear()


async def completed_again(settings: KafkaSettings, db_url: str, records: int, log: Path) -> None:
    """Started again, a projector goes on from what the database committed: every record
    once, the views equal to the fold of the whole log."""
    db = engine(db_url)
    projector = project(settings, db_url, log)
    try:
        await projected(db, records)
        projector.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(projector.wait, DEADLINE) == 0
    finally:
        projector.kill()
    said = log.read_text()  # why it stopped, and that it did
    assert "SIGTERM: stopping, once the work in hand is done" in said
    assert said.rstrip().endswith("stopped")
    with db.connect() as connection:
        assert load_state(connection) == fold(await read_records(settings))
    db.dispose()


async def test_a_projector_stopped_while_its_database_hangs_exits_in_its_grace_losing_nothing(
    kafka_bootstrap: str,
    unique_topic: str,
    postgres_url: str,
    tmp_path: Path,
    frozen: list[int],
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    events = list(mixed_events(4000, clusters=4))
    projector = await projecting(settings, postgres_url, events[:2000], tmp_path / "first.log")
    try:
        freeze_database(engine(postgres_url), frozen)  # mid-session
        async with EventProducer(settings) as producer:
            await producer.send_many(events[2000:])
        async with asyncio.timeout(DEADLINE):  # read, folded, and being written
            while not asked(frozen):
                assert projector.poll() is None
                await asyncio.sleep(0.1)
        assert projector.poll() is None
        code, took = await stopped(projector)
    finally:
        projector.kill()
    thaw(frozen)

    first_log = (tmp_path / "first.log").read_text()
    assert code == 69, first_log
    assert took < STOP_GRACE_SECONDS + 10, first_log
    assert "did not finish writing a batch of" in first_log
    assert "Nothing is lost" in first_log
    await completed_again(settings, postgres_url, 4000, tmp_path / "second.log")


async def test_a_projector_given_partitions_while_its_database_hangs_hears_its_stop(
    kafka_bootstrap: str,
    unique_topic: str,
    postgres_url: str,
    tmp_path: Path,
    frozen: list[int],
) -> None:
    # A rebalance asks the database where the partitions it assigns resume. aiokafka
    # holds the group's heartbeats meanwhile, and a frozen database never answers.
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    events = list(mixed_events(2500, clusters=4))
    log_path = tmp_path / "first.log"
    projector = await projecting(settings, postgres_url, events[:2000], log_path)
    with engine(postgres_url).connect() as connection:
        group = group_id(settings.topic, DEFAULT_PROJECTION, database_id(connection))
    try:
        freeze_database(engine(postgres_url), frozen)
        # Another member joins its group: the projector is given partitions again.
        async with EventConsumer(settings, group_id=group) as member:
            async with asyncio.timeout(DEADLINE):
                while "cannot read checkpoints" not in log_path.read_text():
                    await member.fetch_for_fold(timeout_ms=200)
        assert "no answer within 5 s" in log_path.read_text()
        assert projector.poll() is None
        code, took = await stopped(projector)
    finally:
        projector.kill()
    thaw(frozen)

    first_log = log_path.read_text()
    assert code == 0, first_log  # nothing was in hand
    assert took < STOP_GRACE_SECONDS + 10, first_log
    async with EventProducer(settings) as producer:
        await producer.send_many(events[2000:])
    await completed_again(settings, postgres_url, 2500, tmp_path / "second.log")


def test_a_projector_whose_database_answers_no_connection_stops_at_once(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str, frozen: list[int]
) -> None:
    # The server takes connections and answers none (frozen) as the projector starts:
    # its schema check waits off the event loop, so the stop is heard, and it is given up
    # at once (nothing is in hand).
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    asyncio.run(create_topics(settings))
    upgrade(postgres_url)
    freeze_database(engine(postgres_url), frozen)

    # Its own event loop, in a thread: a loop the projector blocked could not fail the test.
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(run_projector(settings, postgres_url, stop=stop))
        except BaseException as error:  # told below
            raised.append(error)

    running = threading.Thread(target=run, daemon=True)
    running.start()
    time.sleep(3)  # connecting
    assert running.is_alive() and not raised, raised
    loop.call_soon_threadsafe(stop.set)
    running.join(STOP_GRACE_SECONDS)
    assert not running.is_alive(), "the projector did not hear its stop"
    loop.close()
    assert not raised, raised
