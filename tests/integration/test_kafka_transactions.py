"""Kafka transactions through aiokafka on the project's broker release.

The migrator's exactly-once consume-transform-produce rests on two broker guarantees,
checked here on the real broker: a committed transaction publishes its records and the
consumer group's offsets together, and an aborted transaction leaves neither a record a
``read_committed`` consumer can see nor an offset commit. And a producer fenced by a
newer one of its transactional ID fails once, and stops without a word more.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ledger.kafka import (
    Addressed,
    OutgoingRecord,
    TransactionalProducer,
    TransactionFailed,
    create_topics,
)
from ledger.settings import KafkaSettings

# A guard against a hung broker, not a measurement: reads normally finish in milliseconds.
_READ_DEADLINE_SECONDS = 60.0


async def _create_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, num_partitions=1, replication_factor=1) for name in names]
        )
    finally:
        await admin.close()


@asynccontextmanager
async def _consumer(bootstrap: str, **config: Any) -> AsyncIterator[Any]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **config,
    )
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


@asynccontextmanager
async def _transactional_producer(bootstrap: str, transactional_id: str) -> AsyncIterator[Any]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def _read_values(consumer: Any, partition: Any, *, until: bytes) -> list[bytes]:
    """Values read from ``partition`` from its start up to and including ``until``."""
    consumer.assign([partition])
    values: list[bytes] = []

    async def read() -> None:
        while until not in values:
            batches = await consumer.getmany(partition, timeout_ms=500)
            values.extend(record.value for record in batches.get(partition, []))

    try:
        await asyncio.wait_for(read(), _READ_DEADLINE_SECONDS)
    except TimeoutError:
        raise AssertionError(f"{until!r} never arrived on {partition}; read {values!r}") from None
    return values


async def test_committed_transaction_publishes_records_and_offsets_together(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    source, sink, group = f"{unique_topic}.in", f"{unique_topic}.out", f"{unique_topic}.group"
    await _create_topics(kafka_bootstrap, source, sink)
    inputs = [b"alpha", b"beta", b"gamma"]
    async with AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all") as producer:
        for value in inputs:
            await producer.send_and_wait(source, value)
    source_partition = TopicPartition(source, 0)

    async with _consumer(
        kafka_bootstrap, group_id=group, isolation_level="read_committed"
    ) as consumer:
        consumed = await _read_values(consumer, source_partition, until=inputs[-1])
        source_end = (await consumer.end_offsets([source_partition]))[source_partition]
        async with (
            _transactional_producer(kafka_bootstrap, f"{unique_topic}.txn") as txn,
            txn.transaction(),
        ):
            for value in consumed:
                await txn.send(sink, value.upper())
            await txn.send_offsets_to_transaction({source_partition: source_end}, group)

    async with _consumer(
        kafka_bootstrap, group_id=group, isolation_level="read_committed"
    ) as reader:
        published = await _read_values(reader, TopicPartition(sink, 0), until=b"GAMMA")
        committed = await reader.committed(source_partition)
    assert published == [value.upper() for value in inputs]
    assert committed == source_end == len(inputs)


async def test_aborted_transaction_is_invisible_and_commits_no_offsets(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    source, sink, group = f"{unique_topic}.in", f"{unique_topic}.out", f"{unique_topic}.group"
    await _create_topics(kafka_bootstrap, source, sink)
    source_partition, sink_partition = TopicPartition(source, 0), TopicPartition(sink, 0)

    async with _transactional_producer(kafka_bootstrap, f"{unique_topic}.txn") as txn:
        await txn.begin_transaction()
        await txn.send(sink, b"aborted-1")
        await txn.send(sink, b"aborted-2")
        await txn.send_offsets_to_transaction({source_partition: 1}, group)
        await txn.abort_transaction()
        async with txn.transaction():
            await txn.send(sink, b"committed")

    async with _consumer(kafka_bootstrap, isolation_level="read_uncommitted") as raw:
        # The aborted records are in the log; hiding them is the broker's and client's job.
        assert await _read_values(raw, sink_partition, until=b"committed") == [
            b"aborted-1",
            b"aborted-2",
            b"committed",
        ]
    async with _consumer(
        kafka_bootstrap, group_id=group, isolation_level="read_committed"
    ) as reader:
        assert await _read_values(reader, sink_partition, until=b"committed") == [b"committed"]
        assert await reader.committed(source_partition) is None


async def test_a_fenced_producer_stops_with_its_failure_told_once(
    kafka_bootstrap: str, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A dead-letter sender fenced by a concurrent replay's is stopped and replaced: the
    # failure reaches the caller once, as TransactionFailed, and nothing is left to
    # make asyncio log it again ("Future exception was never retrieved") later.
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    await create_topics(settings)
    record = [Addressed(unique_topic, 0, OutgoingRecord(b"key", b"value", []))]
    fenced = TransactionalProducer(settings, f"{unique_topic}.txn")
    await fenced.start()
    await fenced.commit(record)
    successor = TransactionalProducer(settings, f"{unique_topic}.txn")
    await successor.start()
    try:
        with pytest.raises(TransactionFailed, match="ProducerFenced"):
            await fenced.commit(record)
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            await fenced.stop()
            del fenced
            gc.collect()
            await asyncio.sleep(0)
        assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
        await successor.commit(record)  # the successor writes on
    finally:
        await successor.stop()
