"""Kafka transactions: records and a group's consumed offsets committed at once, fenced.

:class:`TransactionalProducer` commits records to any topics plus a consumer group's
offsets in one transaction (consume-transform-produce), or sends them in one it aborts;
:class:`PartitionProducer` does so for one partition of the ledger. Starting a producer
fences every earlier producer of its transactional ID, so a consumer that lost its
partition can no longer commit for it.

One other record is written, never read: a transactional producer that starts while a
transaction is open on a partition it writes appends an empty record with header
``svledger-fence`` (its transactional ID) there in a transaction it aborts, so
``read_committed`` readers, as every reader of the ledger is, never see it. It ends a
transaction whose markers the broker lost (:class:`TransactionalProducer`); a producer
tells that one of its own commits was so lost (:meth:`TransactionalProducer.markers_lost`),
and its owner replaces it.

A transaction that does not complete within :data:`TRANSACTION_TIMEOUT_SECONDS` is
given up (:class:`TransactionFailed`) without waiting for its abort, and sooner in a
service told to stop (:func:`~ledger.kafka.connection.finish_within`): an abandoned
transaction is invisible to every reader, and the next producer of its ID aborts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError

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


class _Unread(NamedTuple):
    """A producer's last commit to a partition, not yet seen readable: its first offset,
    when it was committed, and when the partition's last stable offset was last asked."""

    first: int
    committed_at: float
    asked_at: float


class TransactionalProducer:
    """Records to any topics plus a group's consumed offsets, in one Kafka transaction.

    Starting it fences every earlier producer with the same ``transactional_id`` (their
    open transaction is aborted, their later ones refused).

    Starting it also ends a transaction that no coordinator knows to be open on a
    partition it ``writes``. When the coordinator writes the markers of a transaction it
    has prepared to commit (the producer has been told it committed), a partition of the
    transaction may have no leader for a moment, as when the only broker restarts; the
    coordinator then skips that partition as if it had been deleted and records the
    transaction complete. The partition keeps it open for ever: its last stable offset
    stays at the transaction's first record and no ``read_committed`` reader gets past
    it. Only a marker of the same producer ID ends it, and the init that fences writes
    none (the coordinator knows of nothing open). So for each partition of ``writes``
    whose last stable offset is below its end (some transaction is open on it), the new
    producer appends one record there (empty, header ``svledger-fence``), with the
    offset of ``group`` (its group ID and the partition it consumes), in a transaction
    it aborts: the abort marker ends whatever the ID left open there, as aborted. It
    cannot tell whose the open transaction is; another producer's costs the partition
    two offsets. No reader has seen such a record; the owner reads its state again (a
    consumer's fold, admission's committed inbox offset, the dead letters sent) and
    writes what it still decides to.

    The owner learns that this happened to one of its commits from
    :meth:`markers_lost`, which watches the partitions a commit wrote until their last
    stable offsets pass it; then it replaces the producer (the new one's start ends the
    transaction). Each partition a producer writes goes into ``writes``: one it left
    out would stay open.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        transactional_id: str,
        *,
        writes: Sequence[TopicPartition] = (),
        group: tuple[str, TopicPartition] | None = None,
    ) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.writes = tuple(writes)
        self.group = group
        self._producer: AIOKafkaProducer | None = None
        self._unread: dict[TopicPartition, _Unread] = {}

    async def start(self) -> None:
        """Connect, fence earlier producers of the ID and end what they left open on the
        partitions it ``writes``.

        Raises what :func:`connect` raises, :class:`~aiokafka.errors.KafkaError`,
        :class:`NotAuthorized` or :class:`TransactionFailed`.
        """
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
        try:
            if open_ := await _transactions_open(self.settings, self.writes):
                fence = OutgoingRecord(None, b"", [(FENCE_HEADER, self.transactional_id.encode())])
                group_id, consumed = self.group or (None, None)
                await self.abort(
                    [Addressed(tp.topic, tp.partition, fence) for tp in open_],
                    group_id=group_id,
                    offsets=None if consumed is None else {consumed: 0},
                )
        except BaseException:
            await self.stop()
            raise

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
        # A producer that fails in a transaction (fenced as it adds a partition or the
        # group's offsets) fails the transaction's end too, which aiokafka awaits only to
        # commit or abort: not when the failure surfaced inside the transaction, from a
        # send of the offsets. The caller was told (TransactionFailed); left unread, the
        # failure is logged again as "Future exception was never retrieved" whenever a
        # garbage collection finds it, in any later code of the process. After an
        # abandoned stop the sender may still fail it: then it is read as it fails.
        ended = producer._txn_manager.wait_for_transaction_end()
        if ended is None:  # no transaction was begun
            return
        if ended.done():
            retrieved(ended)
        else:
            ended.add_done_callback(retrieved)

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
            written = await asyncio.gather(*futures)
            now = asyncio.get_running_loop().time()
            firsts: dict[TopicPartition, int] = {}
            for m in written:
                tp = TopicPartition(m.topic, m.partition)
                firsts[tp] = min(firsts.get(tp, m.offset), m.offset)
            # A commit ends whatever this producer left open on the partition, as
            # committed: only the last one there can still be unreadable.
            self._unread.update({tp: _Unread(first, now, now) for tp, first in firsts.items()})
            return [Position(m.partition, m.offset) for m in written]

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
        except IllegalOperation as error:
            # aiokafka's producer, once in error (fenced while the transaction began), says
            # so as "Can't send messages while not in transaction": a failed transaction.
            raise TransactionFailed(
                f"{self.transactional_id}: {error} (the producer is in error: fenced by a"
                " newer instance, or its transaction failed)"
            ) from error
        finally:
            for future in futures:  # their error is the one raised here
                if future.done() and not future.cancelled():
                    future.exception()
                elif not future.done():
                    future.cancel()

    async def markers_lost(self, every: float = 0.0) -> list[TopicPartition]:
        """The partitions whose last stable offset still stands at the first record of
        this producer's last commit there :data:`TRANSACTION_TIMEOUT_SECONDS` after it:
        the broker acknowledged the commit but did not write its markers there, and
        nothing of it there is readable until a new producer of the ID starts.

        Asks the last stable offset of each partition whose last commit of this producer
        has not been seen readable yet, and was neither made nor asked about within the
        last ``every`` seconds (so that a partition written again and again is not asked
        about at all: each commit ends what the last one left open as committed); once
        the partition's last stable offset has passed it, it is not asked about again.
        Raises :class:`BrokerUnavailable` if the broker cannot be asked.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = {
            tp: unread
            for tp, unread in self._unread.items()
            if now - max(unread.committed_at, unread.asked_at) >= every
        }
        if not due:
            return []
        # Asked now, answered or not: a broker that is away is asked again ``every`` later.
        due = {tp: unread._replace(asked_at=now) for tp, unread in due.items()}
        self._unread.update(due)
        stable = await _ends(self.settings, list(due))
        lost = []
        for tp, unread in due.items():
            if self._unread.get(tp) != unread:
                continue  # committed to again meanwhile
            if stable[tp] > unread.first:
                del self._unread[tp]
                continue
            # Below it: another producer's transaction, opened before this commit, is
            # still open; this one cannot be told from it yet.
            if (
                stable[tp] == unread.first
                and unread.asked_at - unread.committed_at >= TRANSACTION_TIMEOUT_SECONDS
            ):
                lost.append(tp)
        return lost

    async def wait_readable(self) -> list[TopicPartition]:
        """Wait until this producer's commits are readable; the partitions where
        :meth:`markers_lost` found one lost as soon as it does, else []. Gives up waiting
        a transaction timeout after the call: what still holds them then is a transaction
        of another producer, opened before them, and that producer's to end.
        """
        loop = asyncio.get_running_loop()
        give_up = loop.time() + TRANSACTION_TIMEOUT_SECONDS
        pause = 0.01
        while self._unread:
            last = loop.time() >= give_up  # then a lost commit is told by this ask
            if lost := await self.markers_lost():
                return lost
            if last:
                break
            await asyncio.sleep(pause)
            pause = min(1.0, 2 * pause)
        return []


class PartitionProducer(TransactionalProducer):
    """Appends events to one partition of the ledger in transactions that also commit
    ``group_id``'s consumed offset of that partition (consume-transform-produce).

    Its transactional ID fences: starting it aborts any open transaction of an earlier
    producer with the same ID and refuses that producer's later ones, so a consumer
    that lost its partition (or crashed mid-transaction) can no longer commit for it,
    and ends a transaction whose markers the broker lost on the partition
    (:class:`TransactionalProducer`); the consumer rebuilds from the log
    (:mod:`consumers.partitions`) and appends again what it still decides to.
    """

    def __init__(
        self, settings: KafkaSettings, partition: int, transactional_id: str, group_id: str
    ) -> None:
        tp = TopicPartition(settings.topic, partition)
        super().__init__(settings, transactional_id, writes=[tp], group=(group_id, tp))
        self.partition = partition
        self.group_id = group_id

    async def append(self, events: Sequence[Event], *, consumed: int) -> list[Position]:
        """Append ``events`` and commit the group's next offset ``consumed``, atomically."""
        topic = self.settings.topic
        return await self.commit(
            [Addressed(topic, self.partition, to_record(event)) for event in events],
            group_id=self.group_id,
            offsets={TopicPartition(topic, self.partition): consumed},
        )


async def _transactions_open(
    settings: KafkaSettings, tps: Sequence[TopicPartition]
) -> list[TopicPartition]:
    """Those of ``tps`` on which a transaction is open: the last stable offset is below
    the end (the ends are read first, so that records appended meanwhile do not count)."""
    if not tps:
        return []
    high = await _ends(settings, tps, committed=False)
    stable = await _ends(settings, tps)
    return [tp for tp in tps if stable[tp] < high[tp]]


async def _ends(
    settings: KafkaSettings, tps: Sequence[TopicPartition], *, committed: bool = True
) -> dict[TopicPartition, int]:
    """The last stable offsets (``committed``) or high watermarks of ``tps``, now."""
    ends: dict[TopicPartition, int] = {}
    for topic in sorted({tp.topic for tp in tps}):
        # EndOffsets asks about the settings' events topic: these settings, with this
        # topic as theirs.
        named = (
            settings
            if topic == settings.topic
            else dataclasses.replace(settings, topic=topic, dlq_topic="")
        )
        async with EndOffsets(named, committed=committed) as asked:
            offsets = await asked([tp.partition for tp in tps if tp.topic == topic])
        ends.update({TopicPartition(topic, p): offset for p, offset in offsets.items()})
    return ends
