"""Appending events to the ledger (or to a cluster's inbox): :class:`EventProducer`.

:class:`EventProducer` is idempotent with ``acks=all`` and lets aiokafka batch:
``send`` awaits one acknowledgement, ``send_many`` hands every record to the
accumulator first and then awaits all acknowledgements, so a burst costs a few round
trips, not one per event. Per key (per partition) the order of the list is the order
in the log. Each record is :func:`~ledger.kafka.records.to_record`'s.

Records written in transactions, with a consumer group's offsets, are
:mod:`ledger.kafka.transactions`'.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaProducer

from ledger.events import Event, Position
from ledger.kafka.connection import connect, stop_within
from ledger.kafka.errors import NotAuthorized, refusals
from ledger.kafka.records import to_record
from ledger.kafka.topics import topic_partitions
from ledger.settings import KafkaSettings


class EventProducer:
    """Appends events to the ledger topic; ``async with EventProducer(settings) as p``.

    With ``settings.inbox`` each event goes to its cluster's inbox topic instead, for
    ``svledger admit`` to check and move into the ledger (:mod:`consumers.admission`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        linger_ms: int = 10,
        max_batch_size: int = 512 * 1024,
        connect_timeout: float = 30.0,
    ) -> None:
        self.settings = settings
        self._linger_ms = linger_ms
        self._max_batch_size = max_batch_size
        self._connect_timeout = connect_timeout
        self._producer: AIOKafkaProducer | None = None
        self._found: set[str] = set()  # topics found to exist

    def _make(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self.settings.client_kwargs(),
            enable_idempotence=True,
            acks="all",
            linger_ms=self._linger_ms,
            max_batch_size=self._max_batch_size,
        )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def start(self) -> None:
        """Connect, unless connected already (:func:`connect`: for ``connect_timeout`` s)."""
        if self._producer is not None:
            return
        # An idempotent producer asks for its producer ID as it starts: Kafka grants one
        # to a principal that may write some topic (or IdempotentWrite the cluster).
        writes = f"{self.settings.inbox_prefix}<cluster>" if self.settings.inbox else None
        with self._refusals(writes or self.settings.topic):
            self._producer = await connect(self._make, self.settings, timeout=self._connect_timeout)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Bounded: aiokafka delivers what it holds before it stops, and waits for a
            # broker that is away as long as it stays away.
            await stop_within(producer, "the event producer (holding unacknowledged events)")

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("EventProducer is not started: use 'async with EventProducer(...)'")
        return self._producer

    def _refusals(self, topic: str) -> contextlib.AbstractContextManager[None]:
        return refusals(self.settings, topic=("Write", topic))

    async def _enqueue(self, event: Event) -> tuple[str, asyncio.Future[Any]]:
        key, value, headers = to_record(event)
        topic = self.settings.write_topic(event.meta.cluster)
        if topic not in self._found:
            # aiokafka asks for a topic's metadata in a way that has a broker which creates
            # topics on first use (Kafka's default) create it, with the broker's defaults
            # (one partition, seven days' retention): ask first, without creating it.
            try:
                await topic_partitions(self.settings, topic, timeout=self._connect_timeout)
            except NotAuthorized as refused:  # Describe, which Write would grant
                raise NotAuthorized(
                    self.settings, "Write", f"topic {topic!r}", "TopicAuthorizationFailed"
                ) from refused
            self._found.add(topic)
        with self._refusals(topic):
            future: asyncio.Future[Any] = await self.producer.send(
                topic, value=value, key=key, headers=headers
            )
        return topic, future

    async def send(self, event: Event) -> Position:
        """Append one event and wait until the broker has it on every in-sync replica."""
        topic, future = await self._enqueue(event)
        with self._refusals(topic):
            metadata = await future
        return Position(metadata.partition, metadata.offset)

    async def send_many(self, events: Iterable[Event]) -> list[Position]:
        """Append events (order kept per cluster) and wait for all acknowledgements."""
        enqueued = [await self._enqueue(event) for event in events]
        topics = ", ".join(sorted({topic for topic, _ in enqueued}))
        with self._refusals(topics):
            acknowledged = await asyncio.gather(*(future for _, future in enqueued))
        return [Position(m.partition, m.offset) for m in acknowledged]
