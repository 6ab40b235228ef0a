"""A move of ``svledger admit`` whose markers a broker restart lost is aborted, moved again once.

Admission moves an inbox batch in one transaction across two topics: the admitted
events to the cluster's ledger partition, the refused records to the cluster's
dead-letter partition, and the inbox offset. A broker killed right after it acknowledged
the commit may, restarted, skip the markers and record the transaction complete: both
partitions keep it open for ever, and no ``read_committed`` reader of the ledger
partition (the projector, every consumer) gets past it. Admission notices that its
output is still not readable a transaction timeout after the commit and replaces the
inbox's producer, whose start appends a fence record to each partition in a transaction
it aborts (:class:`~ledger.kafka.TransactionalProducer`); the inbox is then moved again
from the group's committed offset.

The test has a broker of its own, as :mod:`tests.integration.test_broker_faults` does,
and kills it right after each acknowledged commit of admission, until one commit has
lost its markers or the kills are spent (whether the broker writes them before it dies
is timing: a run may lose none). Then every inbox record is in the ledger or the
dead-letter topic once, the group's offset is the inbox's end, nothing is left open on
either partition, and the lost copies, if any, are in the log as aborted records
(``read_uncommitted``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import AIOKafkaClient

from consumers import admission
from consumers.admission import run_admission
from deploy.kafka.broker import LocalKafka
from ledger.codec import decode
from ledger.events import ApiserverHeartbeat, Event, Meta, MigrationStarted
from ledger.kafka import EndOffsets, create_topics, to_record, transactions
from ledger.settings import KafkaSettings
from tests.integration.test_admission import read_topic
from tests.integration.test_admission_fencing import committed
from tests.integration.test_migrator import read_records

pytestmark = pytest.mark.slow

KILLS = 6  # at most
TIMEOUT = 3.0  # the transaction timeout, for the test


@pytest.fixture
def broker() -> Iterator[LocalKafka]:
    kafka = LocalKafka().start()
    try:
        yield kafka
    finally:
        kafka.stop()


def batch(round_: int) -> list[Event]:
    """A heartbeat admission admits and a migration event it refuses (a dead letter)."""
    now = datetime.now(UTC)
    host = f"a{round_}"
    return [
        ApiserverHeartbeat(Meta.new("east", host, now), host, f"h-{host}", host, 60, now),
        MigrationStarted(Meta.new("east", host, now), f"m-{round_}"),
    ]


async def write_inbox(settings: KafkaSettings, events: list[Event]) -> int:
    """Write ``events`` to the inbox in one transaction (admission fetches them together,
    so its transaction writes both topics); the inbox's end after them."""
    async with AIOKafkaProducer(
        **settings.client_kwargs(), transactional_id=f"{settings.topic}.reporter"
    ) as writer:
        async with writer.transaction():
            sent = [
                await writer.send(settings.inbox_topic("east"), value, key=key, headers=headers)
                for key, value, headers in map(to_record, events)
            ]
        return int((await sent[-1]).offset) + 1


async def uncommitted_ids(settings: KafkaSettings, topic: str) -> list[str]:
    """The event ID of every record of ``topic``'s partition 0, aborted ones included
    (fence records have none)."""
    consumer = AIOKafkaConsumer(
        **settings.client_kwargs(), enable_auto_commit=False, isolation_level="read_uncommitted"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        ids = []
        while await consumer.position(tp) < end:
            for message in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                if message.value:
                    ids.append(decode(message.value).meta.event_id)
        return ids
    finally:
        await consumer.stop()


async def nothing_open(settings: KafkaSettings) -> bool:
    """Whether the last stable offset of both topics' partition is their end."""
    for named in (settings, dataclasses.replace(settings, topic=settings.dlq_topic, dlq_topic="")):
        async with EndOffsets(named) as stable, EndOffsets(named, committed=False) as high:
            if (await stable([0]))[0] < (await high([0]))[0]:
                return False
    return True


async def test_a_move_whose_markers_a_restart_lost_is_aborted_and_moved_again_once(
    broker: LocalKafka, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(transactions, "TRANSACTION_TIMEOUT_SECONDS", TIMEOUT)
    monkeypatch.setattr(admission, "TRANSACTION_TIMEOUT_SECONDS", TIMEOUT)
    caplog.set_level(logging.WARNING, "consumers.admission")
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-admit-markers", partitions=1
    )
    group = "markers-admission"
    await create_topics(settings, ["east"])
    inbox = TopicPartition(settings.inbox_topic("east"), 0)
    armed = False  # the next commit of admission is cut
    killed = asyncio.Event()
    send = AIOKafkaClient.send

    async def send_then_kill(self: Any, node_id: int, request: Any, **options: Any) -> Any:
        nonlocal armed
        response = await send(self, node_id, request, **options)
        if (
            armed
            and type(request).__name__ == "EndTxnRequest"
            and request._transactional_id.startswith(group)  # not the test's inbox writer
            and request._transaction_result  # a commit, not a fence's abort
        ):
            armed = False
            broker.kill()  # the commit is acknowledged; its markers may not be written yet
            killed.set()
        return response

    monkeypatch.setattr(AIOKafkaClient, "send", send_then_kill)

    def lost() -> list[str]:
        """Admission's warnings that a move's markers were lost."""
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "consumers.admission" and "still not readable" in r.getMessage()
        ]

    async def moved(events: list[Event], end: int) -> None:
        """Wait until ``events`` are in the ledger and the dead-letter topic and the
        group's offset is ``end``."""
        heartbeat, forged = (e.meta.event_id for e in events)
        async with asyncio.timeout(30):
            while True:
                ledger = [e.meta.event_id for e, _ in await read_records(settings)]
                dead = [decode(v).meta.event_id for v, _ in await read_topic(settings, dlq)]
                if (
                    heartbeat in ledger
                    and forged in dead
                    and await committed(settings, group, inbox) == end
                ):
                    return
                await asyncio.sleep(0.2)

    dlq = settings.dlq_topic
    written: list[Event] = []
    stop = asyncio.Event()
    admitting = asyncio.create_task(run_admission(settings, stop=stop, group_id=group))
    try:
        for round_ in range(KILLS):
            events = batch(round_)
            armed = True
            end = await write_inbox(settings, events)
            written += events
            async with asyncio.timeout(30):
                await killed.wait()
            killed.clear()
            await asyncio.to_thread(broker.restart)
            await moved(events, end)
            if lost():  # shown: whether a kill loses the markers is timing, a run may not
                break
    finally:
        stop.set()
        await asyncio.wait_for(admitting, 60)

    # Every inbox record moved once, in order: the heartbeats to the ledger, the
    # forged events to the dead-letter topic.
    ledger = [e.meta.event_id for e, _ in await read_records(settings)]
    dead = [decode(v).meta.event_id for v, _ in await read_topic(settings, dlq)]
    assert ledger == [e.meta.event_id for e in written if isinstance(e, ApiserverHeartbeat)]
    assert dead == [e.meta.event_id for e in written if isinstance(e, MigrationStarted)]
    assert await committed(settings, group, inbox) == end
    assert await nothing_open(settings)
    if lost():
        # The lost move's copies are in both partitions twice: aborted, then moved again.
        lost_heartbeat, lost_forged = (e.meta.event_id for e in events)
        assert (await uncommitted_ids(settings, settings.topic)).count(lost_heartbeat) == 2
        assert (await uncommitted_ids(settings, dlq)).count(lost_forged) == 2
        [warning] = lost()
        assert f"{settings.topic}:0" in warning and f"{dlq}:0" in warning, warning
