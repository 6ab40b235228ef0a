"""A zombie ``svledger admit`` cannot commit once a new one has started for its inbox.

Admission moves a batch of an inbox partition (the events it admits to the ledger, the
records it refuses to the dead-letter topic, and the inbox offset after them) in one
transaction of a producer whose transactional ID names the group and the inbox
partition (:mod:`consumers.admission`): the next owner's producer fences every earlier
one. On the real broker, an :class:`Admission` moves a first batch, then stops dead with
the next batch in hand, as a process does in a long GC pause or under SIGSTOP: its whole
event loop stands still in a thread of its own, heartbeats included, so the group
expels it. That happens either before its transaction begins or in it, once the batch's
offset is pending in the transaction. A second :class:`Admission` of the same group
takes the inbox over and moves the batch; then the zombie goes on. Its commit fails
with Kafka's fencing error, nothing it wrote is visible to a ``read_committed`` reader,
neither its copy of the admitted events nor its dead letter, the group's offset is the
new owner's, every inbox record is in the ledger or the dead-letter topic once, in
the inbox's order, and the zombie's failure is told once: nothing of it is left for
asyncio to log as never retrieved when it is collected, in whatever code runs then.

The zombie is stopped by a :class:`logging.Filter` on a log record its thread writes at
that point (admission's warning about the refused record; aiokafka's debug record of a
transactional offset commit): nothing of the behaviour under test is replaced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.admission import Admission
from ledger.codec import decode
from ledger.events import ApiserverHeartbeat, Event, Meta, MigrationStarted
from ledger.kafka import DLQ_REASON_HEADER, EventProducer, create_topics, to_record
from ledger.settings import KafkaSettings
from tests.integration.test_admission import read_topic
from tests.integration.test_migrator import read_records

DEADLINE = 60.0
ZOMBIE = "zombie-admission"  # the zombie's thread


class Freeze(logging.Filter):
    """Once armed, stops the zombie's thread dead at a log record whose message starts
    with ``prefix`` (its event loop, heartbeats included, stands still) until released."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.armed = False
        self.frozen = threading.Event()
        self.released = threading.Event()

    def filter(self, record: logging.LogRecord) -> bool:
        zombie = threading.current_thread().name == ZOMBIE
        if self.armed and zombie and str(record.msg).startswith(self.prefix):
            self.armed = False
            self.frozen.set()
            self.released.wait(DEADLINE)
        return True


@dataclasses.dataclass(frozen=True)
class Point:
    """Where the zombie stops: at a record ``prefix`` of ``logger`` at ``level``."""

    logger: str
    prefix: str
    level: int


POINTS = {
    # Admission warns of a refused record as it builds the batch, before its transaction.
    "before its transaction": Point("consumers.admission", "refused", logging.WARNING),
    # The transaction is open: its partitions and group added, the batch's offset pending.
    "in its transaction": Point(
        "aiokafka.producer.sender", "Offset %s for partition", logging.DEBUG
    ),
}


@pytest.fixture(params=list(POINTS.values()), ids=list(POINTS))
def freeze(request: pytest.FixtureRequest) -> Iterator[Freeze]:
    point: Point = request.param
    logger = logging.getLogger(point.logger)
    level = logger.level
    freeze = Freeze(point.prefix)
    logger.setLevel(min(point.level, logger.getEffectiveLevel()))
    logger.addFilter(freeze)
    try:
        yield freeze
    finally:
        freeze.released.set()
        logger.removeFilter(freeze)
        logger.setLevel(level)


def heartbeat(cluster: str) -> ApiserverHeartbeat:
    now = datetime.now(UTC)
    return ApiserverHeartbeat(Meta.new(cluster, "a1", now), "a1", "h-a1", "a1", 60, now)


async def committed(settings: KafkaSettings, group_id: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(**settings.client_kwargs(), group_id=group_id)
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(tp)
        return offset
    finally:
        await consumer.stop()


async def wait(event: threading.Event, what: str, errors: list[BaseException]) -> None:
    if not await asyncio.to_thread(event.wait, DEADLINE) or errors:
        raise AssertionError(f"{what} did not happen within {DEADLINE:.0f} s") from (
            errors[0] if errors else None
        )


async def test_a_zombie_admission_commits_nothing_once_a_new_one_started(
    kafka_bootstrap: str,
    unique_topic: str,
    freeze: Freeze,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    group = f"{unique_topic}.admission"  # its own group: no other test's members rebalance it
    await create_topics(settings, ["east"])
    inbox = TopicPartition(settings.inbox_topic("east"), 0)
    first: list[Event] = [heartbeat("east") for _ in range(3)]
    forged = MigrationStarted(Meta.new("east", "a1", datetime.now(UTC)), "m-1")
    second: list[Event] = [heartbeat("east"), forged, heartbeat("east")]
    async with EventProducer(dataclasses.replace(settings, inbox=True)) as producer:
        await producer.send_many(first)

    moved_first = threading.Event()
    errors: list[BaseException] = []
    last_step: list[int] = []

    async def zombie_admits() -> None:
        async with Admission(settings, group) as zombie:
            async with asyncio.timeout(DEADLINE):
                moved = 0
                while moved < len(first):
                    moved += await zombie.step()
            freeze.armed = True
            moved_first.set()
            async with asyncio.timeout(2 * DEADLINE):
                while not freeze.frozen.is_set():
                    last_step[:] = [await zombie.step()]

    def zombie_thread() -> None:
        try:
            asyncio.run(zombie_admits())
        except BaseException as error:
            errors.append(error)
            moved_first.set()
            freeze.frozen.set()

    thread = threading.Thread(target=zombie_thread, name=ZOMBIE)
    thread.start()
    stop = asyncio.Event()
    successor: asyncio.Task[None] | None = None
    try:
        await wait(moved_first, "the first batch's move", errors)
        # The second batch becomes readable at once (a transaction of the test's own), so
        # the zombie fetches it whole: its transaction holds a dead letter.
        async with AIOKafkaProducer(
            **settings.client_kwargs(), transactional_id=f"{unique_topic}.reporter"
        ) as writer:
            async with writer.transaction():
                sent = [
                    await writer.send(inbox.topic, value, key=key, headers=headers)
                    for key, value, headers in map(to_record, second)
                ]
            end = (await sent[-1]).offset + 1
        await wait(freeze.frozen, "the zombie's stop", errors)

        async def admit() -> None:
            async with Admission(settings, group) as admission:
                while not stop.is_set():
                    await admission.step()

        # The new instance joins once the zombie's session expired; its producer fences
        # the zombie's, and it moves the second batch from the group's committed offset.
        successor = asyncio.create_task(admit())
        async with asyncio.timeout(DEADLINE):
            while await committed(settings, group, inbox) != end:
                await asyncio.sleep(0.2)
        ledger = [event for event, _ in await read_records(settings)]
        dead = await read_topic(settings, settings.dlq_topic)

        freeze.released.set()  # the zombie goes on with its batch
        await asyncio.to_thread(thread.join, DEADLINE)
        assert not thread.is_alive()
        assert not errors, errors
        # Nothing of the zombie's is visible; the new instance moved every record once.
        assert [event for event, _ in await read_records(settings)] == ledger
        assert await read_topic(settings, settings.dlq_topic) == dead
        assert [e.meta.event_id for e in ledger] == [
            e.meta.event_id for e in [*first, *second] if e is not forged
        ]
        [(value, headers)] = dead
        assert decode(value) == forged
        assert "may not come from a reporter's inbox" in dict(headers)[DLQ_REASON_HEADER].decode()
        assert await committed(settings, group, inbox) == end
        assert last_step == [0], "the zombie says it moved its batch"
        transactional_id = f"{group}-{inbox.topic}-0"
        [failure] = [
            r.getMessage()
            for r in caplog.records
            if r.threadName == ZOMBIE and r.name == "consumers.admission" and "again" in r.msg
        ]
        # Fenced as it committed (ProducerFenced), or as it began its transaction: aiokafka
        # then refuses the send ("not in transaction"), the producer in error.
        assert failure.startswith(f"{transactional_id}: "), failure
        assert "ProducerFenced" in failure or "fenced by a newer instance" in failure, failure
        gc.collect()  # what the zombie left is collected now, not in a later test
        assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    finally:
        freeze.released.set()
        stop.set()
        if successor is not None:
            await successor
        await asyncio.to_thread(thread.join, DEADLINE)
