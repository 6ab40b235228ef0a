"""Consumer group members that hand out raw records, for consumers that fold per partition.

:class:`GroupMember` reads the events topic partition by partition and says which
partitions a rebalance took or gave, whose folds must be rebuilt
(:mod:`consumers.partitions`); :class:`PatternMember` reads every topic whose name
matches a pattern, for records moved in transactions of their own
(:mod:`consumers.admission`). Both read as every ledger reader reads
(:func:`~ledger.kafka.readers.ledger_consumer`) and hand out records undecoded: the
caller decodes what it folds (:func:`~ledger.kafka.records.decode_message`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Self

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError

from ledger.kafka.connection import connect, stop_within
from ledger.kafka.errors import lost, refusals
from ledger.kafka.readers import lags, ledger_consumer
from ledger.kafka.topics import topic_partitions
from ledger.settings import KafkaSettings


class _Member:
    """What the group members below share: one consumer, stopped on leaving the block."""

    _consumer: AIOKafkaConsumer | None = None

    async def __aexit__(self, *exc_info: object) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_within(consumer, "group member")

    @property
    def _kafka(self) -> AIOKafkaConsumer:
        assert self._consumer is not None, f"use 'async with {type(self).__name__}(...)'"
        return self._consumer


class GroupMember(_Member):
    """A member of a consumer group on the topic that reads raw records, partition by partition.

    For consumers that keep a fold per assigned partition (:mod:`consumers.partitions`):
    ``on_change`` is called with the partitions revoked or newly assigned, whose folds
    must be rebuilt; :meth:`fetch` returns each partition's raw records (``offset``,
    ``value``), undecoded, read as every ledger reader reads (:func:`ledger_consumer`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        group_id: str,
        on_change: Callable[[set[int]], None],
        *,
        fetch_max_wait_ms: int = 10,
    ) -> None:
        self.settings = settings
        self.group_id = group_id
        self.partitions: list[int] = []
        self._on_change = on_change
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Self:
        # A missing topic is an error, not a wait.
        self.partitions = await topic_partitions(self.settings)
        self._consumer = await connect(
            lambda: ledger_consumer(
                self.settings, self.group_id, fetch_max_wait_ms=self._fetch_max_wait_ms
            ),
            self.settings,
        )
        self._consumer.subscribe([self.settings.topic], listener=_ChangeListener(self._on_change))
        return self

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.settings.topic, partition)

    def _refusals(self) -> contextlib.AbstractContextManager[None]:
        return refusals(self.settings, topic=("Read", self.settings.topic), group=self.group_id)

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._kafka.assignment()}

    async def end_offset(self, partition: int) -> int:
        """The partition's last stable offset now (read_committed end)."""
        tp = self._tp(partition)
        with self._refusals():
            ends: dict[TopicPartition, int] = await self._kafka.end_offsets([tp])
        return ends[tp]

    def last_stable_offset(self, partition: int) -> int | None:
        """The partition's last stable offset as the last fetch response gave it, if any."""
        end: int | None = self._kafka.last_stable_offset(self._tp(partition))
        return None if end is None or end < 0 else end

    async def seek(self, partition: int, offset: int = 0) -> bool:
        """Read ``partition`` from ``offset`` (0: its start, whatever the log's retention
        left); False if a rebalance has taken it meanwhile, or the broker did not answer
        the seek to the start within the request timeout (the caller tries again)."""
        tp = self._tp(partition)
        if tp not in self._kafka.assignment():
            return False
        try:
            with self._refusals():
                if offset:
                    self._kafka.seek(tp, offset)
                    return True
                return bool(await self._kafka.seek_to_beginning(tp))
        except IllegalStateError:  # revoked between the check and the seek
            return False

    async def position(self, partition: int) -> int:
        with self._refusals():
            position: int = await self._kafka.position(self._tp(partition))
        return position

    async def lags(self) -> dict[int, int]:
        """Records each assigned partition has yet to hand out (:func:`lags`)."""
        return await lags(self._kafka)

    async def fetch(self, timeout_ms: int) -> dict[int, list[Any]]:
        """The records fetched within ``timeout_ms``, by partition."""
        with self._refusals():
            fetched = await self._kafka.getmany(timeout_ms=timeout_ms)
        return {tp.partition: messages for tp, messages in fetched.items()}


class PatternMember(_Member):
    """A consumer group member of every topic whose name matches ``pattern``; raw records.

    For consumers that move records from many topics in transactions of their own
    (:mod:`consumers.admission`): before moving a newly assigned partition, the caller
    fences its last owner and then :meth:`resume` s it from the group's committed offset.
    Topics created later are found within :data:`METADATA_MAX_AGE_MS`.
    """

    def __init__(self, settings: KafkaSettings, group_id: str, pattern: str) -> None:
        self.settings = settings
        self.group_id = group_id
        self._pattern = pattern
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Self:
        self._consumer = await connect(
            lambda: ledger_consumer(self.settings, self.group_id), self.settings
        )
        self._consumer.subscribe(pattern=self._pattern)
        return self

    def assignment(self) -> set[TopicPartition]:
        return set(self._kafka.assignment())

    async def resume(self, tp: TopicPartition) -> int | None:
        """Seek ``tp`` to the group's committed offset (else its beginning) and return it;
        None if the partition was revoked meanwhile; :class:`BrokerUnavailable` if the
        broker is lost on the way."""
        with lost(self.settings, f"asking group {self.group_id}'s offset of {tp.topic}"):
            committed: int | None = await self._kafka.committed(tp)
            if tp not in self._kafka.assignment():
                return None
            if committed is None:
                await self._kafka.seek_to_beginning(tp)
                committed = await self._kafka.position(tp)
            else:
                self._kafka.seek(tp, committed)
        return committed

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        """The records fetched within ``timeout_ms``, by topic partition."""
        fetched: dict[TopicPartition, list[Any]] = await self._kafka.getmany(
            timeout_ms=timeout_ms, max_records=max_records
        )
        return fetched

    def lag(self, tp: TopicPartition, next_offset: int) -> int | None:
        """The last stable offset of an assigned ``tp`` minus ``next_offset``; None if unknown."""
        if tp not in self._kafka.assignment():
            return None
        end: int | None = self._kafka.last_stable_offset(tp)
        return None if end is None or end < 0 else max(0, end - next_offset)


class _ChangeListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, on_change: Callable[[set[int]], None]) -> None:
        self._on_change = on_change

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._on_change({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._on_change({tp.partition for tp in assigned})
