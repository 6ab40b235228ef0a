"""Reading the ledger: :class:`EventConsumer`, and how every reader reads.

Every reader of the ledger reads only committed records, commits its offsets itself
and refreshes its metadata often (:func:`ledger_consumer`); what it has left to read
is counted to the last stable offset (:func:`lags`).

:class:`EventConsumer` yields decoded :class:`~ledger.kafka.records.Record` s one by
one or in batches. It reads either as a member of a consumer group or, without a group,
every partition by manual assignment. Where each partition starts is chosen by the
caller (``start_offsets``; the projector resumes from its SQL checkpoint), else it is
the group's committed offset or the beginning. With ``until="end"`` it stops once every
partition reaches the end it had when the consumer started (replay).

A record that does not decode, or whose key is not its event's ``meta.cluster``,
never stops the stream: it is copied to the dead-letter topic with its original key,
value and headers plus ``svledger-dlq-*`` headers (reason, source topic, partition,
offset), logged as a warning, and skipped (:mod:`ledger.kafka.dead_letters`). Dead
letters of a batch are acknowledged before the batch is handed out, so a caller that
checkpoints past a bad record never loses it.

Consumers that keep a fold per partition read raw records as group members instead
(:mod:`ledger.kafka.members`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError

from ledger import metrics
from ledger.kafka.assignor import BacklogAssignor
from ledger.kafka.connection import connect, stop_within
from ledger.kafka.dead_letters import DeadLetters
from ledger.kafka.errors import BROKER_ERRORS, refusals
from ledger.kafka.records import Message, Messages, Record, decode_messages, first_at
from ledger.kafka.topics import topic_partitions
from ledger.settings import KafkaSettings

log = logging.getLogger(__name__)

METADATA_MAX_AGE_MS: Final = 5_000  # a reader's metadata refresh (ledger_consumer)


async def drop_fetch(fetch: asyncio.Future[Any]) -> None:
    """Cancel a fetch whose records are not wanted: how it ends does not matter, a broker
    error included (the next fetch meets the broker as it is)."""
    fetch.cancel()
    with contextlib.suppress(asyncio.CancelledError, *BROKER_ERRORS):
        await fetch


def ledger_consumer(
    settings: KafkaSettings, group_id: str | None, **options: Any
) -> AIOKafkaConsumer:
    """An aiokafka consumer that reads the ledger as every reader must.

    Only committed records (``read_committed`` hides those of aborted transactions),
    offsets committed by the caller and never automatically, and the beginning of a
    partition where the group has no committed offset. ``options`` tune fetching.

    Metadata is refreshed every :data:`METADATA_MAX_AGE_MS`, not aiokafka's 5 min: a
    member that joined its group while the broker, just restarted, did not yet list
    the topic's partitions was assigned none, and it rejoins only once a refresh shows
    them (the group's leader then sees the topic's metadata change).
    """
    options.setdefault("metadata_max_age_ms", METADATA_MAX_AGE_MS)
    return AIOKafkaConsumer(
        **settings.client_kwargs(),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **options,
    )


async def lags(consumer: AIOKafkaConsumer) -> dict[int, int]:
    """Per assigned partition fetched at least once: its end minus the consumer's position.

    The end is the last stable offset the last fetch response carried: the end a
    ``read_committed`` reader reaches. The high watermark would not do: it counts the
    records of a transaction still open, and the position passes the commit marker that
    ends every transaction (the consumers append in transactions), so a partition whose
    last record is a marker would show a lag of 1 to a reader that has read it all.
    Asked between fetches, it costs no request: both numbers are the consumer's own.
    """
    ends = {tp: consumer.last_stable_offset(tp) for tp in consumer.assignment()}
    found: dict[int, int] = {}
    for tp, end in ends.items():
        if end is None or end < 0:
            continue
        try:
            position: int = await consumer.position(tp)
        except IllegalStateError:  # revoked while an earlier position was awaited
            continue
        found[tp.partition] = max(0, end - position)
    return found


StartOffsets: TypeAlias = Callable[[set[int]], Mapping[int, int] | Awaitable[Mapping[int, int]]]
"""Where newly assigned partitions resume (:class:`EventConsumer`'s ``start_offsets``)."""


class EventConsumer:
    """Reads decoded events from the ledger topic; ``async with EventConsumer(settings) as c``.

    * ``group_id``: join this consumer group (partitions balanced across members);
      None reads every partition by manual assignment.
    * ``start_offsets``: called with the partitions just assigned, returns (or, as a
      coroutine, comes to) the next offset to read for those it knows; the others start
      at the beginning. aiokafka holds the group's heartbeats while it runs: keep it short.
    * ``until="end"``: stop at the end offsets of the moment the consumer started;
      a mapping stops each partition it names before that offset (only without a
      group).
    * ``partitions``: without a group, read only these.
    * ``dead_letters=False``: a reader that does not own the log's dead letters (the
      read API, a point-in-time read) skips an undecodable record with a warning
      instead of copying it to the dead-letter topic again.
    * ``fetch_max_wait_ms``: how long the broker may hold a fetch for data; a reader
      that follows the log live wants it short.
    * ``backlog``: with a group, deal the partitions among its members by the records
      each has left to read, as this callable reports them each time the consumer
      joins (:class:`BacklogAssignor`), instead of by count.

    It reads committed records only (:func:`ledger_consumer`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        group_id: str | None = None,
        start_offsets: StartOffsets | None = None,
        until: Literal["end"] | Mapping[int, int] | None = None,
        partitions: Iterable[int] | None = None,
        dead_letters: bool = True,
        fetch_max_wait_ms: int = 500,
        backlog: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        if (until is not None or partitions is not None) and group_id is not None:
            raise ValueError(
                f"until={until!r} and partitions need manual assignment; drop group_id={group_id!r}"
            )
        self.settings = settings
        self.group_id = group_id
        self._start_offsets = start_offsets
        self._until = until
        self._partitions = None if partitions is None else sorted(partitions)
        self._with_dead_letters = dead_letters
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._assignors = () if backlog is None else (BacklogAssignor(backlog),)
        self._consumer: AIOKafkaConsumer | None = None
        self._dead_letters: DeadLetters | None = None
        self._ends: dict[TopicPartition, int] = {}  # until-mode partitions not finished yet

    def _make(self) -> AIOKafkaConsumer:
        return ledger_consumer(
            self.settings,
            self.group_id,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            fetch_max_wait_ms=self._fetch_max_wait_ms,
            **({"partition_assignment_strategy": self._assignors} if self._assignors else {}),
        )

    async def __aenter__(self) -> Self:
        try:
            partitions = await topic_partitions(self.settings)
            if self._with_dead_letters:
                self._dead_letters = await DeadLetters(self.settings).__aenter__()
            if self._partitions is not None:
                missing = sorted(set(self._partitions) - set(partitions))
                if missing:
                    raise ValueError(f"partitions {missing} are not in topic {self.settings.topic}")
                partitions = self._partitions
            consumer = await connect(self._make, self.settings)
            self._consumer = consumer
            if self.group_id is None:
                with self._refusals():
                    await self._assign_all(consumer, partitions)
            else:
                consumer.subscribe([self.settings.topic], listener=_Listener(self))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        consumer, self._consumer = self._consumer, None
        dead_letters, self._dead_letters = self._dead_letters, None
        try:
            if consumer is not None:
                await stop_within(consumer, "consumer")
        finally:
            if dead_letters is not None:
                await dead_letters.__aexit__(None, None, None)

    @property
    def _kafka(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("EventConsumer is not started: use 'async with EventConsumer(...)'")
        return self._consumer

    def _refusals(self) -> contextlib.AbstractContextManager[None]:
        return refusals(self.settings, topic=("Read", self.settings.topic), group=self.group_id)

    def assignment(self) -> set[int]:
        """The partitions this consumer reads now."""
        return {tp.partition for tp in self._kafka.assignment()}

    def seek(self, next_offsets: Mapping[int, int]) -> None:
        """Read each assigned partition next from ``next_offsets`` (0 where it has none)."""
        kafka = self._kafka
        for tp in kafka.assignment():
            kafka.seek(tp, next_offsets.get(tp.partition, 0))

    async def positions(self) -> dict[int, int]:
        """The next offset this consumer reads, per assigned partition."""
        kafka = self._kafka
        with self._refusals():
            return {tp.partition: await kafka.position(tp) for tp in kafka.assignment()}

    async def lags(self) -> dict[int, int]:
        """Records each assigned partition has yet to hand out (:func:`lags`)."""
        return await lags(self._kafka)

    async def _assign_all(self, consumer: AIOKafkaConsumer, partitions: list[int]) -> None:
        topic = self.settings.topic
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        await self._seek(consumer, assigned)
        if self._until == "end":
            ends = await consumer.end_offsets(assigned)
            self._ends = dict(ends)
            await self._pause_finished(consumer)
        elif self._until is not None:
            self._ends = {tp: self._until[tp.partition] for tp in assigned}
            await self._pause_finished(consumer)

    async def _seek(self, consumer: AIOKafkaConsumer, assigned: Iterable[TopicPartition]) -> None:
        assigned = list(assigned)
        if self._start_offsets is None:
            if self.group_id is None:
                await consumer.seek_to_beginning(*assigned)
            return  # a group member starts at its committed offset, else the beginning
        chosen = self._start_offsets({tp.partition for tp in assigned})
        if inspect.isawaitable(chosen):
            chosen = await chosen
        rest = []
        for tp in assigned:
            if tp.partition in chosen:
                consumer.seek(tp, chosen[tp.partition])
            else:
                rest.append(tp)
        if rest:
            await consumer.seek_to_beginning(*rest)

    async def _pause_finished(self, consumer: AIOKafkaConsumer) -> None:
        for tp, end in list(self._ends.items()):
            if await consumer.position(tp) >= end:
                del self._ends[tp]
                consumer.pause(tp)

    async def batches(
        self, max_records: int = 10_000, timeout_ms: int = 1_000, *, key: bytes | None = None
    ) -> AsyncIterator[list[Record]]:
        """Yield non-empty lists of records as they arrive, at most ``max_records`` read
        each; with ``key``, as :meth:`fetch`, only the records of that key."""
        while self._until is None or self._ends:
            if batch := await self.fetch(max_records, timeout_ms, key=key):
                yield batch

    async def batches_for_fold(
        self, max_records: int = 10_000, timeout_ms: int = 1_000
    ) -> AsyncGenerator[Messages, None]:
        """As :meth:`batches`, of what :meth:`fetch_for_fold` returns, one batch ahead:
        the next is fetched while the caller awaits something else (its batch's write,
        say), as aiokafka parses the records when it hands them out. A caller that leaves
        early closes the iterator (:func:`contextlib.aclosing`), which cancels that fetch.
        """
        ahead: asyncio.Future[Messages] | None = None
        if self._until is None or self._ends:
            ahead = asyncio.ensure_future(self.fetch_for_fold(max_records, timeout_ms))
        try:
            while ahead is not None:
                # Whether to read on is asked as each fetch ends, as it may have reached
                # the last ends: every fetch started is handed out.
                messages, ahead = await ahead, None
                if self._until is None or self._ends:
                    ahead = asyncio.ensure_future(self.fetch_for_fold(max_records, timeout_ms))
                if messages:
                    yield messages
        finally:
            if ahead is not None:
                await drop_fetch(ahead)

    async def fetch(
        self, max_records: int = 10_000, timeout_ms: int = 1_000, *, key: bytes | None = None
    ) -> list[Record]:
        """The records that arrive within ``timeout_ms`` (at most ``max_records``); maybe none.

        For a caller that must look up between fetches (a stop signal, positions);
        cancelling it loses nothing, as no record is handed out before it returns. With
        ``key`` (a cluster's name, encoded), only the records of that key are decoded and
        returned: one cluster's log, read from its partition with the others' records
        passed over undecoded.
        """
        records: list[Record] = []
        dead: list[tuple[Message, str]] = []
        for messages in (await self.fetch_for_fold(max_records, timeout_ms)).values():
            if key is not None:
                messages = [message for message in messages if message.key == key]
            decode_messages(messages, records, dead)
        await self.send_dead_letters(dead)
        return records

    async def fetch_for_fold(self, max_records: int = 10_000, timeout_ms: int = 1_000) -> Messages:
        """As :meth:`fetch`, undecoded: for a fold that decodes only what it must (most
        heartbeats it need not; :mod:`projections.thinning`). The caller decodes the rest
        (:func:`decode_message`) and sends those that belong in the dead-letter topic by
        :meth:`send_dead_letters` before it checkpoints past them."""
        consumer = self._kafka
        with self._refusals():
            fetched = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        batch: Messages = {}
        for tp, messages in fetched.items():
            end = self._ends.get(tp)
            if end is not None and messages and messages[-1].offset >= end:
                messages = messages[: first_at(messages, end)]
            if messages:
                batch[tp.partition] = messages
        if self._until is not None:
            with self._refusals():
                await self._pause_finished(consumer)
        return batch

    async def send_dead_letters(self, dead: Sequence[tuple[Any, str]]) -> None:
        """Copy ``(record, reason)`` s to the dead-letter topic, in log order (a reader
        without ``dead_letters`` logs and skips them)."""
        if not dead:
            return
        dead = sorted(dead, key=lambda letter: (letter[0].partition, letter[0].offset))
        if self._dead_letters is None:
            for message, reason in dead:
                log.warning(
                    "record %s:%d@%d skipped: %s",
                    message.topic,
                    message.partition,
                    message.offset,
                    reason,
                )
            return
        await self._send_dead_letters(dead)

    async def __aiter__(self) -> AsyncIterator[Record]:
        async for batch in self.batches():
            for record in batch:
                yield record

    async def _send_dead_letters(self, dead: Sequence[tuple[Any, str]]) -> None:
        assert self._dead_letters is not None
        for message, reason in dead:
            log.warning(
                "record %s:%d@%d is a dead letter: %s",
                message.topic,
                message.partition,
                message.offset,
                reason,
                extra={
                    "topic": message.topic,
                    "partition": message.partition,
                    "offset": message.offset,
                    "dlq_topic": self.settings.dlq_topic,
                    "reason": reason,
                },
            )
        sent = await self._dead_letters.send(dead)
        metrics.RECORDS_DEAD_LETTERED.labels(self.settings.topic).inc(sent)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Seeks newly assigned partitions to where the caller wants to resume."""

    def __init__(self, owner: EventConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._owner._seek(self._owner._kafka, assigned)
