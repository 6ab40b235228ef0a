"""Kafka transactions: records and a group's consumed offsets committed at once, fenced.

:class:`TransactionalProducer` commits records to any topics plus a consumer group's
offsets in one transaction (consume-transform-produce), or sends them in one it aborts;
:class:`PartitionProducer` does so for one partition of the ledger. Starting a producer
fences every earlier producer of its transactional ID, so a consumer that lost its
partition can no longer commit for it.

One other record is written, never read: a transactional producer that starts while a
transaction is open on its partition appends an empty record with header
``svledger-fence`` (its transactional ID) in a transaction it aborts
(:class:`PartitionProducer`), so ``read_committed`` readers, as every reader of the
ledger is, never see it.

A transaction that does not complete within :data:`TRANSACTION_TIMEOUT_SECONDS` is
given up (:class:`TransactionFailed`) without waiting for its abort, and sooner in a
service told to stop (:func:`~ledger.kafka.connection.finish_within`): an abandoned
transaction is invisible to every reader, and the next producer of its ID aborts it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from ledger.events import Event, Position
from ledger.kafka.connection import connect, finish_within, stop_within
from ledger.kafka.errors import as_refusal, refusals
from ledger.kafka.records import OutgoingRecord, to_record
from ledger.kafka.topics import EndOffsets
from ledger.settings import KafkaSettings
from ledger.tasks import retrieved

FENCE_HEADER: Final = "svledger-fence"
# A transaction that has not completed by then is given up.
TRANSACTION_TIMEOUT_SECONDS: Final = 60.0


class TransactionFailed(Exception):
    """A transaction did not commit, or did not answer in time (then it may have): the
    producer was fenced, the broker refused the transaction, or the broker is away. The
    producer is not used again; its owner rebuilds what it knows from the log."""


class Addressed(NamedTuple):
    """A record and where it goes: a topic and a partition (None: by its key)."""

    topic: str
    partition: int | None
    record: OutgoingRecord


class _Aborted(Exception):
    """Raised inside a transaction that is meant to be aborted."""


class TransactionalProducer:
    """Records to any topics plus a group's consumed offsets, in one Kafka transaction.

    Starting it fences every earlier producer with the same ``transactional_id`` (their
    open transaction is aborted, their later ones refused).
    """

    def __init__(self, settings: KafkaSettings, transactional_id: str) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        with refusals(self.settings, transactional_id=self.transactional_id):
            self._producer = await connect(
                lambda: AIOKafkaProducer(
                    **self.settings.client_kwargs(),
                    transactional_id=self.transactional_id,
                    enable_idempotence=True,
                    acks="all",
                    linger_ms=0,
                    # A transaction begun right after the last one ended is refused
                    # (CONCURRENT_TRANSACTIONS) until its markers are written; retry soon.
                    retry_backoff_ms=10,
                ),
                self.settings,
            )

    async def stop(self) -> None:
        """Stop the producer, or abandon it if it has not stopped within
        :data:`STOP_TIMEOUT_SECONDS`."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        # Stopping flushes what is pending, which waits for the broker: for ever if a
        # transaction can no longer complete. The next producer of the ID fences this
        # one, and the broker aborts what it has open.
        await stop_within(producer, f"transactional producer {self.transactional_id}")

    async def commit(
        self,
        records: Sequence[Addressed],
        *,
        group_id: str | None = None,
        offsets: Mapping[TopicPartition, int] | None = None,
    ) -> list[Position]:
        """Append ``records`` and commit ``group_id``'s ``offsets`` (if given), atomically.

        Raises :class:`TransactionFailed` when the transaction does not commit, or does
        not complete within :data:`TRANSACTION_TIMEOUT_SECONDS` (the next producer of the
        ID aborts it if it is still open); nothing of it is then visible to
        ``read_committed`` readers, and the producer must be stopped and replaced.
        :class:`NotAuthorized` when an ACL refused it: a new producer would not help.
        """
        return await self._transact(records, group_id, offsets, commit=True)

    async def abort(
        self,
        records: Sequence[Addressed],
        *,
        group_id: str | None = None,
        offsets: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """Send ``records`` and ``group_id``'s ``offsets`` in a transaction, then abort it:
        nothing of it is visible, but each partition it touched gets this producer's abort
        marker. Raises as :meth:`commit`."""
        await self._transact(records, group_id, offsets, commit=False)

    async def _transact(
        self,
        records: Sequence[Addressed],
        group_id: str | None,
        offsets: Mapping[TopicPartition, int] | None,
        *,
        commit: bool,
    ) -> list[Position]:
        assert self._producer is not None, "start() the TransactionalProducer first"
        producer = self._producer
        futures: list[asyncio.Future[Any]] = []

        async def transact() -> list[Position]:
            with contextlib.suppress(_Aborted):
                async with producer.transaction():
                    for topic, partition, (key, value, headers) in records:
                        future = await producer.send(
                            topic, value=value, key=key, headers=headers, partition=partition
                        )
                        # A transaction that fails fails its records' futures too, which
                        # no one awaits then: the failure is raised once, by the transaction.
                        future.add_done_callback(retrieved)
                        futures.append(future)
                    if group_id is not None and offsets:
                        await producer.send_offsets_to_transaction(dict(offsets), group_id)
                    if not commit:
                        raise _Aborted
            if not commit:
                return []
            return [Position(m.partition, m.offset) for m in await asyncio.gather(*futures)]

        task = asyncio.create_task(transact())
        try:
            # In a service told to stop, the transaction is abandoned sooner: an abandoned
            # transaction is invisible to every reader, and the next producer of its ID
            # aborts it.
            if not await finish_within(task, TRANSACTION_TIMEOUT_SECONDS, "a transaction"):
                # An idempotent producer retries a refused batch for ever (a coordinator
                # that keeps answering "not enough replicas", a broker that is gone), and
                # the abort a cancellation starts waits for the same broker: give up on
                # this producer without waiting for it; the caller builds a new one.
                raise TransactionFailed(
                    f"{self.transactional_id}: the transaction did not complete within"
                    f" {TRANSACTION_TIMEOUT_SECONDS:.0f} s; check that the broker is up and"
                    " its log"
                )
            return task.result()
        except KafkaError as error:
            topics = ", ".join(sorted({record.topic for record in records}))
            refusal = as_refusal(
                error,
                self.settings,
                topic=("Write", topics),
                group=group_id,
                transactional_id=self.transactional_id,
            )
            if refusal is not None:
                raise refusal from error
            raise TransactionFailed(f"{self.transactional_id}: {error}") from error
        finally:
            for future in futures:  # their error is the one raised here
                if future.done() and not future.cancelled():
                    future.exception()
                elif not future.done():
                    future.cancel()


class PartitionProducer(TransactionalProducer):
    """Appends events to one partition of the ledger in transactions that also commit
    ``group_id``'s consumed offset of that partition (consume-transform-produce).

    Its transactional ID fences: starting it aborts any open transaction of an earlier
    producer with the same ID and refuses that producer's later ones, so a consumer
    that lost its partition (or crashed mid-transaction) can no longer commit for it.

    Starting it also ends a transaction that no coordinator knows to be open. When the
    coordinator writes the markers of a transaction it has prepared to commit (the
    producer has been told it committed), a partition of the transaction may have no
    leader for a moment, as when the only broker restarts; the coordinator then skips
    that partition as if it had been deleted and records the transaction complete. The
    partition keeps it open for ever: its last stable offset stays at the transaction's
    first record and no ``read_committed`` reader gets past it. Only a marker of the same
    producer ID ends it, and the init that fences writes none (the coordinator knows of
    nothing open). So when the partition's last stable offset is below its end (some
    transaction is open on it), the new producer appends one record (empty, header
    ``svledger-fence``) to its partition, and the group's offset, in a transaction it
    aborts: the abort marker ends whatever the ID left open there, as aborted. No reader
    has seen such a record; the consumer that appended it rebuilds from the log
    (:mod:`consumers.partitions`) and appends it again if it still decides to.
    """

    def __init__(
        self, settings: KafkaSettings, partition: int, transactional_id: str, group_id: str
    ) -> None:
        super().__init__(settings, transactional_id)
        self.partition = partition
        self.group_id = group_id

    async def start(self) -> None:
        """Connect, fence earlier producers of the ID and abort what they left open.

        Raises what :func:`connect` raises, :class:`~aiokafka.errors.KafkaError`,
        :class:`NotAuthorized` or :class:`TransactionFailed`.
        """
        await super().start()
        try:
            if await self._transaction_open():
                tp = TopicPartition(self.settings.topic, self.partition)
                fence = OutgoingRecord(None, b"", [(FENCE_HEADER, self.transactional_id.encode())])
                await self.abort(
                    [Addressed(tp.topic, tp.partition, fence)],
                    group_id=self.group_id,
                    offsets={tp: 0},
                )
        except BaseException:
            await self.stop()
            raise

    async def append(self, events: Sequence[Event], *, consumed: int) -> list[Position]:
        """Append ``events`` and commit the group's next offset ``consumed``, atomically."""
        topic = self.settings.topic
        return await self.commit(
            [Addressed(topic, self.partition, to_record(event)) for event in events],
            group_id=self.group_id,
            offsets={TopicPartition(topic, self.partition): consumed},
        )

    async def _transaction_open(self) -> bool:
        """Whether a transaction is open on the partition: its last stable offset is below
        its end (the end is read first, so that records appended meanwhile do not count)."""
        async with EndOffsets(self.settings, committed=False) as high:
            end = (await high([self.partition]))[self.partition]
        async with EndOffsets(self.settings) as stable:
            return (await stable([self.partition]))[self.partition] < end
