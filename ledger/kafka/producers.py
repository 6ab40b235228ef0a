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
import logging
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError

from ledger.events import Event, Position
from ledger.kafka.connection import connect, stop_within
from ledger.kafka.errors import BrokerUnavailable, NotAuthorized, refusals
from ledger.kafka.placement import Placements
from ledger.kafka.records import to_record
from ledger.kafka.topics import topic_partitions, why_unacknowledged
from ledger.settings import KafkaSettings
from ledger.tasks import retrieved

log = logging.getLogger(__name__)


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
        request_timeout: float = 40.0,
    ) -> None:
        """``request_timeout``: how long a request to a broker may take, and how often an
        append still waiting for its acknowledgement is logged, saying why."""
        self.settings = settings
        self._linger_ms = linger_ms
        self._request_timeout = request_timeout
        self._max_batch_size = max_batch_size
        self._connect_timeout = connect_timeout
        self._producer: AIOKafkaProducer | None = None
        self._placements: Placements | None = None
        self._found: set[str] = set()  # topics found to exist

    def _make(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self.settings.client_kwargs(),
            enable_idempotence=True,
            acks="all",
            linger_ms=self._linger_ms,
            max_batch_size=self._max_batch_size,
            request_timeout_ms=int(self._request_timeout * 1000),
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
        self._placements = Placements(self.settings, self._producer)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        producer, self._producer = self._producer, None
        self._placements = None
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

    async def _find(self, topic: str) -> None:
        """Check once that ``topic`` exists. aiokafka asks for a topic's metadata in a
        way that has a broker which creates topics on first use (Kafka's default) create
        it, with the broker's defaults (one partition, seven days' retention): ask first,
        without creating it."""
        if topic in self._found:
            return
        try:
            await topic_partitions(self.settings, topic, timeout=self._connect_timeout)
        except NotAuthorized as refused:  # Describe, which Write would grant
            raise NotAuthorized(
                self.settings, "Write", f"topic {topic!r}", "TopicAuthorizationFailed"
            ) from refused
        self._found.add(topic)

    async def _knows(self, topic: str, partitions: set[int]) -> None:
        """Have the client's metadata list ``partitions`` of ``topic``: a cluster may be
        placed in a partition added since the client last asked (``topics grow``), and
        it refuses to send to a partition it does not know."""
        producer = self.producer
        try:
            async with asyncio.timeout(self._connect_timeout):
                while not partitions <= await producer.partitions_for(topic):
                    await producer.client.force_metadata_update()
        except TimeoutError:
            raise BrokerUnavailable(
                f"the brokers at {self.settings.bootstrap_servers!r} do not list partitions"
                f" {sorted(partitions)} of topic {topic!r} after {self._connect_timeout:g} s;"
                " check that they are running; services try again"
            ) from None

    async def _enqueue(
        self, event: Event, partition: int | None
    ) -> tuple[str, asyncio.Future[Any]]:
        key, value, headers = to_record(event)
        topic = self.settings.write_topic(event.meta.cluster)
        with self._refusals(topic):
            future: asyncio.Future[Any] = await self.producer.send(
                topic, value=value, key=key, headers=headers, partition=partition
            )
        return topic, future

    async def send(self, event: Event) -> Position:
        """Append one event and wait until the broker has it on every in-sync replica."""
        (position,) = await self.send_many([event])
        return position

    async def send_many(self, events: Iterable[Event]) -> list[Position]:
        """Append events (order kept per cluster) and wait for all acknowledgements.

        Kafka's client retries an append the brokers refuse for a while (a partition
        with fewer in-sync replicas than its ``min.insync.replicas``, or without a
        leader) until they take it, without a word of its own but a line per retry.
        Every ``request_timeout`` s an append is still waiting, this logs a warning that
        says which partitions and why (:func:`~ledger.kafka.topics.why_unacknowledged`),
        and goes on waiting: giving up would leave the record in the client, to land
        later beside the caller's retry, twice. Nothing is half-written meanwhile
        (``acks=all``). An append the client itself gives up (its batch expired before
        any broker could be asked) raises :class:`~ledger.kafka.errors.BrokerUnavailable`
        with the same reasons; the caller retries, as through an outage.
        """
        batch = list(events)
        for topic in sorted({self.settings.write_topic(e.meta.cluster) for e in batch}):
            await self._find(topic)
        placed: dict[str, int] = {}
        if not self.settings.inbox:  # an inbox has one partition; admission places
            self.producer  # noqa: B018 (raises unless started)
            assert self._placements is not None  # started with the producer
            with self._refusals(self.settings.placement_topic):
                placed = await self._placements.where(
                    {event.meta.cluster for event in batch}, place=True
                )
            await self._knows(self.settings.topic, set(placed.values()))
        enqueued = [await self._enqueue(e, placed.get(e.meta.cluster)) for e in batch]
        topics = sorted({topic for topic, _ in enqueued})
        pending = asyncio.gather(*(future for _, future in enqueued))
        pending.add_done_callback(retrieved)  # a caller cancelled leaves nothing to log
        waited = 0.0
        try:
            with self._refusals(", ".join(topics)):
                while not (await asyncio.wait({pending}, timeout=self._request_timeout))[0]:
                    waited += self._request_timeout
                    log.warning(
                        "the brokers at %r have not acknowledged an append to %s for %g s: %s;"
                        " Kafka's client retries it until they do, and nothing is half-written",
                        self.settings.bootstrap_servers,
                        ", ".join(map(repr, topics)),
                        waited,
                        await why_unacknowledged(self.settings, topics),
                    )
                acknowledged = pending.result()
        except KafkaTimeoutError as error:
            why = await why_unacknowledged(self.settings, topics)
            raise BrokerUnavailable(
                f"the brokers at {self.settings.bootstrap_servers!r} did not acknowledge the"
                f" append to {', '.join(map(repr, topics))}: {why}. Check that they are"
                " running; services try again"
            ) from error
        finally:
            pending.cancel()  # when the caller is cancelled; done already otherwise
        return [Position(m.partition, m.offset) for m in acknowledged]
