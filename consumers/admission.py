"""Who may say what: reporters write to their cluster's inbox; admission moves what they may say.

**The threat.** Whoever may write the ledger topic may append any event: a
``MigrationSucceeded`` that narrows a StorageState's persisted versions and so hides
objects still stored in an old version, or a report in the name of another cluster's
apiserver. Kafka's ACLs say who may write a *topic*; a consumer cannot tell who wrote
a record. So the writers are told apart by topic.

**The defence.** Reporters are many and run inside every API server; they get no
access to the ledger. Each cluster has an inbox topic, ``<topic>.inbox.<cluster>``
(one partition: one order), which only that cluster's reporter principal may write
(the ACLs: docs/production.md, ``deploy/kafka``). :func:`run_admission` (``svledger
admit``) reads every inbox and copies each record into the ledger, byte for byte,
when :func:`judge` finds the reporter may say it:

* the event decodes and the record's key is its cluster (as every ledger record);
* its ``meta.cluster`` is the inbox's cluster: no report for another cluster;
* it is one a reporter emits (:data:`REPORTER_EVENTS`): heartbeats, lease releases,
  storage version reports and withdrawals. Lease expiry, storage state resets and
  every migration event are decisions of svledger's own consumers or of an operator;
* its ``meta.source`` is its apiserver, as the reporter writes it;
* it is no larger than :data:`MAX_VALUE_BYTES` (checked first: a record near the
  broker's limit could not go on as a dead letter, and would stop its inbox).

A record refused goes to the dead-letter topic with the reason in its
``svledger-dlq-reason`` header, is counted in ``svledger_admission_refused_total``
by rule, and is logged; it never reaches the ledger, so no view changes.

The consumers that decide (lease GC, migrator, worker, collector) and the operators'
CLI keep writing the ledger directly, each under a principal of its own: they read the
ledger to decide and wait for their own output to come back through it, and they are
svledger's own services, not code inside every API server. Their events carry
``meta.source``, and each principal's ACLs name what it may touch.

**Exactly once, in order.** Each inbox partition has its own transactional producer
(``svledger-admission-<inbox topic>-<partition>``): the admitted and refused records of
a batch and the inbox offset after it are committed in one transaction. A new owner of
the partition (a rebalance, a restart) starts its producer first, which fences the
last owner, then reads the committed offset and goes on from there, so every inbox
record reaches the ledger or the dead-letter topic once, in the inbox's order. New
inboxes are found by the subscription's pattern within
:data:`ledger.kafka.METADATA_MAX_AGE_MS`.

**Markers a broker lost.** A broker that restarts right after it acknowledged a commit
may never write the transaction's markers on some of its partitions, which then keep it
open for ever: no ``read_committed`` reader of the partition (the projector, every
consumer) gets past it. An inbox's moves write two partitions only, so that its
producer's start can end such a transaction, as aborted
(:class:`~ledger.kafka.TransactionalProducer`): the cluster's ledger partition, and the
dead-letter partition of the cluster's name (:func:`~ledger.kafka.partition_of`; a
refused record's own key may be anything, and would spread an inbox's dead letters over
the topic's partitions). A later move of the same producer ends what the broker left
open on a partition as committed, so admission watches only each partition's last move
(:meth:`~ledger.kafka.TransactionalProducer.markers_lost`), once nothing followed it
there for a quarter of :data:`~ledger.kafka.TRANSACTION_TIMEOUT_SECONDS`; a move with
dead letters is confirmed readable before the inbox moves on, as the next move, without
one, would end its ledger part alone. When a partition's last stable offset still stands
at a move a transaction timeout after its commit, admission replaces the inbox's
producer, whose start aborts the move, and moves the inbox again from the group's
committed offset: once, as long as the broker lost the markers on every partition of
the transaction, the group's offset included.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
from typing import Any, Final

from ledger import metrics
from ledger.codec import CodecError, decode
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseReleased,
    Event,
    StorageVersionReported,
    StorageVersionWithdrawn,
    type_name,
)
from ledger.kafka import (
    TRANSACTION_TIMEOUT_SECONDS,
    Addressed,
    BrokerUnavailable,
    OutgoingRecord,
    PatternMember,
    Placements,
    TopicPartition,
    TransactionalProducer,
    TransactionFailed,
    dead_letter_headers,
    partition_of,
    to_record,
    topic_partitions,
    while_away,
)
from ledger.settings import KafkaSettings

log = logging.getLogger(__name__)

GROUP_ID: Final = "svledger-admission"
REPORTER_EVENTS: Final = (
    ApiserverHeartbeat,
    ApiserverLeaseReleased,
    StorageVersionReported,
    StorageVersionWithdrawn,
)
MAX_RECORDS: Final = 5_000
# A reporter's event is a few hundred bytes. A record near the broker's limit (1 MiB)
# could not go on as a dead letter (the headers make it larger), and its inbox would
# stop behind it: one larger than this is refused, and only its beginning kept.
MAX_VALUE_BYTES: Final = 64 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """Why a record may not enter the ledger: the rule it breaks and a sentence."""

    rule: str  # undecodable, size, key, cluster, type, source
    reason: str


def judge(inbox_cluster: str, key: bytes | None, value: bytes | None) -> Event | Refused:
    """The event of an inbox record of ``inbox_cluster``, or why it is refused."""
    if value is None:
        return Refused("undecodable", "record has no value (a tombstone); the ledger never deletes")
    if len(value) > MAX_VALUE_BYTES:
        return Refused(
            "size",
            f"record of {len(value)} bytes, more than the {MAX_VALUE_BYTES} any reporter's"
            f" event takes; its first {MAX_VALUE_BYTES} bytes are kept here",
        )
    try:
        event = decode(value)
    except CodecError as error:
        return Refused("undecodable", str(error))
    cluster = event.meta.cluster
    if cluster != inbox_cluster:
        return Refused(
            "cluster",
            f"{type_name(event)} {event.meta.event_id} is for cluster {cluster!r} but came"
            f" through the inbox of cluster {inbox_cluster!r}: a reporter speaks only for"
            " its own cluster",
        )
    if key != cluster.encode():
        return Refused("key", f"record key {key!r} is not the event's meta.cluster {cluster!r}")
    if not isinstance(event, REPORTER_EVENTS):
        allowed = ", ".join(sorted(kind.__name__ for kind in REPORTER_EVENTS))
        return Refused(
            "type",
            f"{type_name(event)} {event.meta.event_id} may not come from a reporter's inbox"
            f" (a reporter may say only {allowed})",
        )
    if event.meta.source != event.apiserver_id:
        return Refused(
            "source",
            f"{type_name(event)} {event.meta.event_id} of apiserver {event.apiserver_id!r}"
            f" names {event.meta.source!r} as its source: a reporter speaks as its apiserver",
        )
    return event


def inbox_pattern(settings: KafkaSettings) -> str:
    """The subscription pattern matching every inbox topic of the ledger."""
    return f"^{re.escape(settings.inbox_prefix)}.+$"


class _Inbox:
    """One assigned inbox partition: its producer, the next offset to move, its lag."""

    def __init__(
        self, tp: TopicPartition, producer: TransactionalProducer, next_offset: int
    ) -> None:
        self.producer = producer
        self.next_offset = next_offset
        self.lag = metrics.ReaderLag(tp.topic)  # reader: the inbox topic

    async def close(self) -> None:
        self.lag.clear()
        await self.producer.stop()


class Admission:
    """``async with Admission(settings) as admission: await admission.step()`` until done."""

    def __init__(self, settings: KafkaSettings, group_id: str = GROUP_ID) -> None:
        self.settings = settings
        self.group_id = group_id
        self._placements = Placements(settings)
        self._dlq_partitions: list[int] = []
        self._member = PatternMember(settings, group_id, inbox_pattern(settings))
        self._inboxes: dict[TopicPartition, _Inbox] = {}

    async def __aenter__(self) -> Admission:
        await topic_partitions(self.settings)  # the ledger's topic exists
        self._dlq_partitions = await topic_partitions(self.settings, self.settings.dlq_topic)
        await self._member.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for inbox in self._inboxes.values():
            await inbox.close()
        self._inboxes.clear()
        await self._member.__aexit__()

    async def step(self, timeout_ms: int = 200) -> int:
        """Fetch once and move what was fetched; the number of records moved."""
        await self._sync()
        fetched = await self._member.fetch(timeout_ms, MAX_RECORDS)
        moved = 0
        for tp, messages in fetched.items():
            inbox = self._inboxes.get(tp)
            if inbox is None:
                continue  # assigned since the sync: moved once its producer has fenced
            messages = [m for m in messages if m.offset >= inbox.next_offset]
            if messages:
                moved += await self._move(tp, inbox, messages)
        for tp, inbox in self._inboxes.items():
            lag = self._member.lag(tp, inbox.next_offset)
            if lag is not None:
                inbox.lag.set({tp.partition: lag})
        await self._mend()
        return moved

    def _cluster(self, tp: TopicPartition) -> str:
        cluster: str = tp.topic[len(self.settings.inbox_prefix) :]
        return cluster

    async def _writes(self, cluster: str) -> tuple[TopicPartition, TopicPartition]:
        """Where an inbox's records go: its cluster's ledger partition (placed, as the
        writer of its first event: :mod:`ledger.kafka.placement`) and its dead-letter
        partition."""
        (placed,) = (await self._placements.where([cluster], place=True)).values()
        return (
            TopicPartition(self.settings.topic, placed),
            TopicPartition(self.settings.dlq_topic, partition_of(cluster, self._dlq_partitions)),
        )

    async def _mend(self) -> None:
        """Move an inbox again whose last commit to a partition the broker acknowledged
        but never ended there (see the module's docstring)."""
        for tp, inbox in list(self._inboxes.items()):
            try:
                lost = await inbox.producer.markers_lost(every=TRANSACTION_TIMEOUT_SECONDS / 4)
            except BrokerUnavailable as error:  # asked again at a later step
                log.warning("cannot tell whether %s's last move is readable: %s", tp.topic, error)
                continue
            if lost:
                await self._move_again(tp, lost)

    async def _move_again(self, tp: TopicPartition, lost: list[TopicPartition]) -> None:
        """Replace the producer of an inbox whose move is ``lost`` on those partitions:
        the next step starts a new one, which aborts it, and moves the inbox again from
        its committed offset."""
        log.warning(
            "what %s moved to %s is still not readable %.0f s after its commit (the broker"
            " did not write the transaction's markers); moving it again from its committed"
            " offset with a new producer, which aborts it",
            tp.topic,
            ", ".join(f"{lost_tp.topic}:{lost_tp.partition}" for lost_tp in lost),
            TRANSACTION_TIMEOUT_SECONDS,
        )
        await self._inboxes.pop(tp).close()

    async def _sync(self) -> None:
        """Producers for newly assigned inbox partitions, none for revoked ones."""
        assigned = self._member.assignment()
        for tp in [tp for tp in self._inboxes if tp not in assigned]:
            await self._inboxes.pop(tp).close()
        for tp in sorted(assigned - self._inboxes.keys()):
            try:
                writes = await self._writes(self._cluster(tp))
            except BrokerUnavailable as error:  # an outage: tried again at the next step
                log.warning("cannot move %s yet: %s", tp.topic, error)
                continue
            producer = TransactionalProducer(
                self.settings,
                f"{self.group_id}-{tp.topic}-{tp.partition}",
                writes=writes,
                group=(self.group_id, tp),
            )
            try:
                # Fences the last owner (its offsets are final now) and ends what the
                # broker left open of its transactions.
                await producer.start()
                next_offset = await self._member.resume(tp)
            except BrokerUnavailable as error:  # an outage: tried again at the next step
                log.warning("cannot move %s yet: %s", tp.topic, error)
                await producer.stop()
                continue
            if next_offset is None:  # revoked meanwhile
                await producer.stop()
                continue
            self._inboxes[tp] = _Inbox(tp, producer, next_offset)

    async def _move(self, tp: TopicPartition, inbox: _Inbox, messages: list[Any]) -> int:
        inbox_cluster = self._cluster(tp)
        ledger, dead_letters = await self._writes(inbox_cluster)
        records: list[Addressed] = []
        admitted: collections.Counter[str] = collections.Counter()
        refused: collections.Counter[str] = collections.Counter()
        for message in messages:
            verdict = judge(inbox_cluster, message.key, message.value)
            if isinstance(verdict, Refused):
                refused[verdict.rule] += 1
                log.warning(
                    "refused %s:%d@%d: %s",
                    tp.topic,
                    tp.partition,
                    message.offset,
                    verdict.reason,
                    extra={"topic": tp.topic, "offset": message.offset, "rule": verdict.rule},
                )
                headers = dead_letter_headers(message, verdict.reason)
                value = message.value and message.value[:MAX_VALUE_BYTES]
                records.append(
                    Addressed(
                        dead_letters.topic,
                        dead_letters.partition,
                        OutgoingRecord(message.key, value, headers),
                    )
                )
                continue
            name = type_name(verdict)
            admitted[name] += 1
            records.append(
                Addressed(ledger.topic, ledger.partition, to_record(verdict, message.value))
            )
        next_offset = messages[-1].offset + 1
        try:
            await inbox.producer.commit(records, group_id=self.group_id, offsets={tp: next_offset})
        except TransactionFailed as error:
            # Nothing of it is visible; a fresh producer fences this one and goes on
            # from the committed offset.
            log.warning("%s; moving %s again from its committed offset", error, tp.topic)
            await self._inboxes.pop(tp).close()
            return 0
        if refused:
            # Confirmed before the inbox moves on, or its next move, with no dead letter,
            # would end the ledger part of a transaction the broker lost as committed and
            # leave the dead letters alone open, to be aborted: they would be lost.
            try:
                lost = await inbox.producer.wait_readable()
            except BrokerUnavailable as error:
                # A new producer ends the transaction if it is open, and the inbox goes
                # on from its committed offset, whichever way it ended.
                log.warning(
                    "cannot tell whether %s's last move is readable: %s; going on from its"
                    " committed offset with a new producer",
                    tp.topic,
                    error,
                )
                await self._inboxes.pop(tp).close()
                return 0
            if lost:
                await self._move_again(tp, lost)
                return 0
        inbox.next_offset = next_offset
        for name, count in admitted.items():
            metrics.EVENTS_APPENDED.labels(self.group_id, name).inc(count)
        for rule, count in refused.items():
            metrics.ADMISSION_REFUSED.labels(rule).inc(count)
        if refused:
            metrics.RECORDS_DEAD_LETTERED.labels(tp.topic).inc(sum(refused.values()))
        return len(messages)


async def run_admission(
    settings: KafkaSettings, *, stop: asyncio.Event, group_id: str = GROUP_ID
) -> None:
    """Move inbox records into the ledger (or the dead-letter topic) until ``stop`` is set,
    waiting for a broker that is away at the start (as the other services do)."""
    admission = await while_away(
        stop, lambda: Admission(settings, group_id).__aenter__(), f"join group {group_id}"
    )
    if admission is None:
        return
    try:
        while not stop.is_set():
            await admission.step()
    finally:
        await admission.__aexit__(None, None, None)
