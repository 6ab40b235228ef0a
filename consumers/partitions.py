"""Following the log partition by partition, with a fold and a fencing producer each.

Every consumer that appends events in reaction to the log (the lease GC, the
migration trigger, the migration worker) has the same needs, served here once:

* It is one member of a consumer group: each partition (= a set of whole clusters)
  is followed by exactly one member, so one member decides for a cluster.
* Per assigned partition it keeps a :class:`PartitionLog`: the partition's own fold
  (the projections' :func:`projections.fold.apply`, so its state is the views'
  state) and a **transactional producer** whose ID is ``<prefix>-<partition>``.
  Starting that producer fences every earlier producer of the same ID - a member
  that lost the partition in a rebalance, or a crashed process whose transaction
  was left open (it is aborted) - so from then on only this member's transactions
  can commit for the partition.
* After the producer is started, the state is rebuilt by folding the partition from
  the beginning up to its end as of that moment (read_committed: the last stable
  offset). Until the fold reaches that *barrier* the log is not ``caught_up`` and the
  consumer must not act: up to the barrier the state holds everything ever committed
  for the partition, including the consumer's own earlier output, so a decision is
  never taken on a state that misses an event it already appended. Rebuilding from
  the beginning is correctness over speed: the state needs the whole history.
* :meth:`PartitionLog.commit` appends events to the partition and sends the consumed
  offsets in one transaction, then moves the barrier past its own output, so the
  next decision waits until the output has come back through the log and been
  folded like any other event.
* Anything going wrong with a partition (fenced, transaction failed, revoked) marks
  its log lost; the next poll rebuilds it from scratch as on assignment.

Records that do not decode are skipped with a warning (the projector sends them to
the dead-letter topic); they never stop a consumer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from ledger.codec import CodecError, decode
from ledger.events import Event, Meta, Position
from ledger.kafka import connect, ledger_consumer, to_record
from ledger.settings import KafkaSettings
from projections.fold import apply
from projections.state import Changes, ResourceKey, State

log = logging.getLogger(__name__)


class PartitionLost(Exception):
    """The partition's producer was fenced or its transaction failed; the log is rebuilt."""


class PartitionLog:
    """One assigned partition: its fold state, where the fold is, and its producer."""

    def __init__(
        self, follower: PartitionFollower, partition: int, producer: AIOKafkaProducer, barrier: int
    ) -> None:
        self.partition = partition
        self.state = State()
        self.position = 0  # the next offset the fold will read
        self.barrier = barrier
        self.lost = False
        # Resources touched since the consumer last decided on them, with the last
        # event that touched each (the cause of what is decided).
        self.touched: dict[ResourceKey, Meta] = {}
        self._follower = follower
        self._producer = producer
        self._lock = asyncio.Lock()
        self._moved = asyncio.Event()

    @property
    def caught_up(self) -> bool:
        return not self.lost and self.position >= self.barrier

    def _advance(self, position: int) -> None:
        self.position = position
        self._moved.set()
        self._moved = asyncio.Event()

    async def wait_folded(self, offset: int = 0) -> None:
        """Wait until the fold is caught up and has read every offset before ``offset``.

        Raises :class:`PartitionLost` if the log is lost meanwhile.
        """
        while not self.caught_up or self.position < offset:
            if self.lost:
                raise PartitionLost(f"partition {self.partition} was lost")
            await self._moved.wait()

    async def wait_moved(self) -> None:
        """Wait until the fold moves (or the log is lost)."""
        await self._moved.wait()

    async def commit(self, events: Sequence[Event]) -> list[Position]:
        """Append ``events`` and commit the consumed offset in one transaction."""
        topic = self._follower.settings.topic
        async with self._lock:
            if self.lost:
                raise PartitionLost(f"partition {self.partition} was lost")
            try:
                futures = []
                async with self._producer.transaction():
                    for event in events:
                        key, value, headers = to_record(event)
                        futures.append(
                            await self._producer.send(
                                topic,
                                value=value,
                                key=key,
                                headers=headers,
                                partition=self.partition,
                            )
                        )
                    await self._producer.send_offsets_to_transaction(
                        {TopicPartition(topic, self.partition): self.position},
                        self._follower.group_id,
                    )
                positions = [
                    Position(m.partition, m.offset) for m in await asyncio.gather(*futures)
                ]
            except KafkaError as error:
                for future in futures:  # their error is the one handled here
                    if future.done():
                        future.exception()
                    else:
                        future.cancel()
                log.warning(
                    "partition %d: transaction failed (%s); rebuilding", self.partition, error
                )
                self.lose()
                raise PartitionLost(f"partition {self.partition}: {error}") from error
        if positions:
            self.barrier = max(self.barrier, max(p.offset for p in positions) + 1)
        return positions

    def lose(self) -> None:
        self.lost = True
        self._advance(self.position)

    async def close(self) -> None:
        self.lose()
        await self._producer.stop()


@dataclasses.dataclass(frozen=True, slots=True)
class Folded:
    """What one poll folded into a partition's state: each event with what it changed."""

    log: PartitionLog
    events: list[tuple[Event, Changes]]


class PartitionFollower:
    """``async with PartitionFollower(...) as f: async for folded in f.batches(stop)``."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        group_id: str,
        transactional_prefix: str,
        poll_ms: int = 100,
        fetch_max_wait_ms: int = 10,
    ) -> None:
        self.settings = settings
        self.group_id = group_id
        self.transactional_prefix = transactional_prefix
        self.logs: dict[int, PartitionLog] = {}
        self._poll_ms = poll_ms
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Self:
        self._consumer = await connect(
            lambda: ledger_consumer(
                self.settings, self.group_id, fetch_max_wait_ms=self._fetch_max_wait_ms
            ),
            self.settings,
        )
        self._consumer.subscribe([self.settings.topic], listener=_Listener(self))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for partition_log in self.logs.values():
            await partition_log.close()
        self.logs.clear()
        if self._consumer is not None:
            await self._consumer.stop()

    @property
    def consumer(self) -> AIOKafkaConsumer:
        assert self._consumer is not None, "use 'async with PartitionFollower(...)'"
        return self._consumer

    def _lose(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            partition_log = self.logs.get(tp.partition)
            if partition_log is not None:
                partition_log.lose()

    async def end_offset(self, partition: int) -> int:
        """The partition's last stable offset now (read_committed end)."""
        tp = TopicPartition(self.settings.topic, partition)
        ends: dict[TopicPartition, int] = await self.consumer.end_offsets([tp])
        return ends[tp]

    async def _sync_assignment(self) -> None:
        consumer = self.consumer
        assigned = {tp.partition for tp in consumer.assignment()}
        for partition in [p for p in self.logs if p not in assigned]:
            await self.logs.pop(partition).close()
        for partition in sorted(assigned):
            current = self.logs.get(partition)
            if current is not None and not current.lost:
                continue
            if current is not None:
                await current.close()
            tp = TopicPartition(self.settings.topic, partition)
            producer = await connect(
                lambda p=partition: AIOKafkaProducer(  # type: ignore[misc]
                    **self.settings.client_kwargs(),
                    transactional_id=f"{self.transactional_prefix}-{p}",
                    enable_idempotence=True,
                    acks="all",
                    linger_ms=0,
                    # A transaction begun right after the last one ended is refused
                    # (CONCURRENT_TRANSACTIONS) until its markers are written; retry soon.
                    retry_backoff_ms=10,
                ),
                self.settings,
            )
            # The barrier is read after the producer fenced every earlier one.
            barrier = await self.end_offset(partition)
            await consumer.seek_to_beginning(tp)
            self.logs[partition] = PartitionLog(self, partition, producer, barrier)

    async def batches(self, stop: asyncio.Event) -> AsyncIterator[Folded]:
        """Poll until ``stop`` is set; yield each followed partition after every poll."""
        consumer = self.consumer
        while not stop.is_set():
            await self._sync_assignment()
            fetched: dict[TopicPartition, list[Any]] = await consumer.getmany(
                timeout_ms=self._poll_ms
            )
            for partition, partition_log in list(self.logs.items()):
                tp = TopicPartition(self.settings.topic, partition)
                events = self._fold(partition_log, fetched.get(tp, []))
                if partition_log.lost:
                    continue
                partition_log._advance(await consumer.position(tp))
                yield Folded(partition_log, events)

    @staticmethod
    def _fold(partition_log: PartitionLog, messages: list[Any]) -> list[tuple[Event, Changes]]:
        folded: list[tuple[Event, Changes]] = []
        for message in messages:
            if partition_log.lost or message.offset < partition_log.position:
                continue
            try:
                event = decode(message.value or b"")
            except CodecError as error:
                log.warning(
                    "skipping undecodable record %d@%d: %s",
                    message.partition,
                    message.offset,
                    error,
                )
                continue
            changes = apply(partition_log.state, event, Position(message.partition, message.offset))
            folded.append((event, changes))
        return folded


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Marks revoked and newly assigned partitions lost, so they are rebuilt from scratch."""

    def __init__(self, follower: PartitionFollower) -> None:
        self._follower = follower

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._follower._lose(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._follower._lose(assigned)
