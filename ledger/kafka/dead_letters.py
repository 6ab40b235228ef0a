"""The dead-letter topic: copies of the records no reader can fold, each sent once.

A dead letter is the record as it was logged (key, value and headers) plus
``svledger-dlq-*`` headers that say why and where it came from: reason, source topic,
partition and offset (:func:`dead_letter_headers`). Readers meet a bad record again
and again; :class:`DeadLetters` sends each once, whoever reads it, and tells the
caller when it cannot (:class:`DeadLettersUnsent`: read again later, as after any
broker outage). When readers send them is :mod:`ledger.kafka.readers`'.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Sequence
from typing import Any, Final, Self

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from ledger.kafka.connection import connect
from ledger.kafka.errors import BrokerUnavailable
from ledger.kafka.records import Headers, OutgoingRecord
from ledger.kafka.topics import topic_partitions
from ledger.kafka.transactions import (
    TRANSACTION_TIMEOUT_SECONDS,
    Addressed,
    TransactionalProducer,
    TransactionFailed,
)
from ledger.settings import KafkaSettings

log = logging.getLogger(__name__)

DLQ_REASON_HEADER: Final = "svledger-dlq-reason"
DLQ_TOPIC_HEADER: Final = "svledger-dlq-topic"
DLQ_PARTITION_HEADER: Final = "svledger-dlq-partition"
DLQ_OFFSET_HEADER: Final = "svledger-dlq-offset"
DEAD_LETTER_SENDERS: Final = "svledger-dead-letters"  # prefix of their transactional IDs
DEAD_LETTER_ATTEMPTS: Final = 10
_FENCED: Final = (ProducerFenced, InvalidProducerEpoch)  # a newer producer of the ID began


class DeadLettersUnsent(BrokerUnavailable):
    """A partition's dead letters could not be sent: the broker is away or refuses the
    transaction. The records that hold them are read again, as after any broker outage."""


class DeadLetters:
    """Copies the log's undecodable records to the dead-letter topic, each once, whoever reads them.

    Every reader of the ledger meets a bad record again: the projector after a crash or
    a rebalance, every replay. So before a record is sent, the dead-letter topic itself
    is asked whether it has it: a source partition's dead letters go to one partition
    of the dead-letter topic (the same number, modulo its partitions) in Kafka
    transactions, with one transactional ID per source partition
    (``svledger-dead-letters-<topic>-<partition>``). A sender starts its producer
    (which fences any other sender of the partition and ends its open transaction),
    then reads the dead-letter partition once to learn the highest source offset sent,
    and from then on sends only records past it. If another sender fenced it meanwhile,
    its transaction fails; it waits a random, growing while (readers side by side, such
    as projectors of two databases or replays, fence each other in turn otherwise),
    reads, and sends what is still missing, if anything (read before it starts a
    producer, which would fence the other again). After :data:`DEAD_LETTER_ATTEMPTS`
    fenced attempts, or any other failure, it gives up (:class:`DeadLettersUnsent`, a
    broker outage to its caller: the records are read and sent again later).
    The dead-letter topic is small (bad records are rare), so reading a partition of it
    is cheap, and nothing else has to remember what was sent.

    A send returns once its letters are readable (:meth:`TransactionalProducer.wait_readable
    <ledger.kafka.TransactionalProducer.wait_readable>`). A broker that restarts right
    after it acknowledged the commit may never write the transaction's markers, leaving
    it open on the dead-letter partition for ever (:class:`~ledger.kafka.TransactionalProducer`):
    when the partition's last stable offset still stands at the letters
    :data:`~ledger.kafka.TRANSACTION_TIMEOUT_SECONDS` after their commit, the sender is
    replaced, and the new producer's start ends that transaction as aborted; the letters
    are then not in the partition, and are sent again.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._dlq_partitions: list[int] = []
        self._senders: dict[int, tuple[TransactionalProducer, int]] = {}  # producer, sent until

    async def __aenter__(self) -> Self:
        self._dlq_partitions = await topic_partitions(self.settings, self.settings.dlq_topic)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        senders, self._senders = self._senders, {}
        for producer, _ in senders.values():
            await producer.stop()

    def _dlq_partition(self, partition: int) -> int:
        return self._dlq_partitions[partition % len(self._dlq_partitions)]

    async def send(self, dead: Sequence[tuple[Any, str]]) -> int:
        """Send ``(message, reason)`` pairs not sent before; the number sent."""
        by_partition: dict[int, list[tuple[Any, str]]] = {}
        for message, reason in dead:
            by_partition.setdefault(message.partition, []).append((message, reason))
        sent = 0
        for partition, letters in sorted(by_partition.items()):
            sent += await self._send_partition(partition, letters)
        return sent

    async def _send_partition(self, partition: int, letters: list[tuple[Any, str]]) -> int:
        for attempt in itertools.count(1):
            if partition in self._senders and not await self._readable(partition):
                await self._replace(partition)
            if partition not in self._senders:
                # Read before starting a producer, which would fence the sender that may
                # be sending these very letters: if it sent them, there is nothing to do.
                last = max(message.offset for message, _ in letters)
                if last < await self._sent_until(partition):
                    return 0
            producer, sent_until = await self._sender(partition)
            todo = [(m, r) for m, r in letters if m.offset >= sent_until]
            if not todo:
                return 0
            records = [
                Addressed(
                    self.settings.dlq_topic,
                    self._dlq_partition(partition),
                    OutgoingRecord(
                        message.key, message.value, dead_letter_headers(message, reason)
                    ),
                )
                for message, reason in todo
            ]
            try:
                await producer.commit(records)
            except TransactionFailed as error:
                await producer.stop()
                del self._senders[partition]
                if attempt == DEAD_LETTER_ATTEMPTS or not isinstance(error.__cause__, _FENCED):
                    raise DeadLettersUnsent(
                        f"the dead letters of {self.settings.topic}:{partition} were not sent"
                        f" to {self.settings.dlq_topic} ({attempt} attempts, the last: {error});"
                        " check that the broker is up and its log; they are sent when the"
                        " records are read again"
                    ) from error
                # Readers of one partition (projectors of two databases, replays) send its
                # dead letters at once: each new producer fences the others, so they wait
                # a random while, growing, before starting again, and one gets through.
                pause = random.uniform(0, min(2.0, 0.05 * 2**attempt))
                log.warning(
                    "dead letters of %s:%d: %s; checking again in %.2f s",
                    self.settings.topic,
                    partition,
                    error,
                    pause,
                )
                await asyncio.sleep(pause)
                continue
            self._senders[partition] = (producer, todo[-1][0].offset + 1)
            if await self._readable(partition):
                return len(todo)
            await self._replace(partition)
        raise AssertionError("unreachable")

    async def _readable(self, partition: int) -> bool:
        """Wait until the letters the partition's sender committed are readable; False if
        their transaction's markers were lost (:class:`DeadLetters`)."""
        producer, _ = self._senders[partition]
        if not await producer.wait_readable():
            return True
        log.warning(
            "dead letters of %s:%d were committed but are still not readable %.0f s later"
            " (the broker did not write the transaction's markers); sending them again"
            " with a new producer, which aborts them",
            self.settings.topic,
            partition,
            TRANSACTION_TIMEOUT_SECONDS,
        )
        return False

    async def _replace(self, partition: int) -> None:
        """Stop the partition's sender: the next one's start ends what it left open."""
        producer, _ = self._senders.pop(partition)
        await producer.stop()

    async def _sender(self, partition: int) -> tuple[TransactionalProducer, int]:
        if partition not in self._senders:
            producer = TransactionalProducer(
                self.settings,
                f"{DEAD_LETTER_SENDERS}-{self.settings.topic}-{partition}",
                writes=[TopicPartition(self.settings.dlq_topic, self._dlq_partition(partition))],
            )
            await producer.start()
            try:
                sent_until = await self._sent_until(partition)
            except BaseException:
                await producer.stop()
                raise
            self._senders[partition] = (producer, sent_until)
        return self._senders[partition]

    async def _sent_until(self, partition: int) -> int:
        """One past the highest offset of ``partition`` in the dead-letter topic, else 0."""
        tp = TopicPartition(self.settings.dlq_topic, self._dlq_partition(partition))
        topic, source = self.settings.topic.encode(), str(partition).encode()
        consumer = await connect(
            lambda: AIOKafkaConsumer(
                **self.settings.client_kwargs(),
                enable_auto_commit=False,
                isolation_level="read_committed",
            ),
            self.settings,
        )
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            sent_until = 0
            while await consumer.position(tp) < end:
                for message in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    headers = dict(message.headers)
                    if (
                        headers.get(DLQ_TOPIC_HEADER) == topic
                        and headers.get(DLQ_PARTITION_HEADER) == source
                    ):
                        offset = int(headers[DLQ_OFFSET_HEADER])
                        sent_until = max(sent_until, offset + 1)
            return sent_until
        finally:
            await consumer.stop()


def dead_letter_headers(message: Any, reason: str) -> Headers:
    """A dead letter's headers: the original ones, then why and where it came from."""
    return [
        *message.headers,
        (DLQ_REASON_HEADER, reason.encode()),
        (DLQ_TOPIC_HEADER, message.topic.encode()),
        (DLQ_PARTITION_HEADER, str(message.partition).encode()),
        (DLQ_OFFSET_HEADER, str(message.offset).encode()),
    ]
