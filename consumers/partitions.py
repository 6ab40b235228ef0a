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
  never taken on a state that misses an event it already appended. The state needs
  the whole history, so without snapshots the rebuild reads it all.
* With a :class:`~projections.snapshots.SnapshotSource` (``--snapshots-from URL``, the
  projector's database) the rebuild starts instead from the latest sound fold snapshot
  of the partition at or before the barrier: the same state the fold of every record
  before the snapshot's offset gives (the projector folds with the same
  :func:`~projections.fold.apply`), then the records from there to the barrier are
  folded as above. The log is then ``resumed``: the consumer did not see the events
  before the snapshot, which a consumer that reacts to events (the migrator) must
  make up for. No database, no sound snapshot, or no answer within
  :data:`SNAPSHOT_WAIT_SECONDS` (a frozen server): from the beginning, as without.
* :meth:`PartitionLog.commit` appends events to the partition and sends the consumed
  offsets in one transaction, then moves the barrier past its own output, so the
  next decision waits until the output has come back through the log and been
  folded like any other event.
* Anything going wrong with a partition (fenced, transaction failed, revoked) marks
  its log lost; the next poll rebuilds it from scratch as on assignment. So does
  output of its own that a transaction timeout after its commit is still not
  readable, with the partition's last stable offset stopped at it: the broker
  acknowledged the commit but never wrote its markers (see
  :class:`~ledger.kafka.PartitionProducer`), and the new producer's start aborts it.
  The fold rebuilt without it, the consumer decides again, exactly once.
* A rebuild during which the partition was revoked or assigned again is made again:
  aiokafka reads a partition assigned anew from the group's committed offset, not
  from where the rebuild seeked, and the fold would miss the partition's history.
* A log lost because its transaction failed (fenced, most often) is rebuilt only after
  a jittered backoff that doubles with each such loss in a row (:class:`Backoff`).
  Within one group a fence means a rebalance gave the partition away, and the
  revocation says so anyway. But two groups sharing the producer IDs (an old
  deployment still running beside a new one, or the two racing lease GCs of the
  tests) fence each other on every rebuild: the one fenced rebuilds at once, which
  fences the other before its rebuilt fold catches up and commits, and so on for
  ever, nothing ever committed. Waiting longer each time lets one of them commit.
* A broker that cannot be reached (down, restarting) stops nothing: joining the
  group, and building a partition's log, are tried again on later polls until the
  broker answers or ``stop`` is set.

Records that do not decode are skipped with a warning (the projector sends them to
the dead-letter topic); they never stop a consumer.

The Prometheus metrics (:mod:`ledger.metrics`) show every follower under its group
id: each followed partition's lag after every poll, the events folded (a rebuild
folds the partition's history again) and the events appended, by type.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any, Final, Self

from ledger import metrics
from ledger.events import Event, Meta, Position, type_name
from ledger.kafka import (
    BROKER_ERRORS,
    TRANSACTION_TIMEOUT_SECONDS,
    GroupMember,
    PartitionProducer,
    Record,
    TransactionFailed,
    decode_message,
    first_at,
    while_away,
)
from ledger.progress import CatchUp
from ledger.settings import KafkaSettings
from ledger.tasks import in_daemon_thread, retrieved
from projections.fold import apply, subject
from projections.snapshots import SnapshotSource
from projections.state import Changes, ResourceKey, State
from projections.thinning import LeaseTerms, Pending, Thinning

log = logging.getLogger(__name__)

# A follower that thins renewals folds those still pending at least this often, and
# once it has read this many records since (what it holds meanwhile).
SETTLE_SECONDS: Final = 1.0
SETTLE_RECORDS: Final = 50_000
REBUILD_BACKOFF_SECONDS: Final = 0.5  # before rebuilding a log lost to a failed transaction
REBUILD_BACKOFF_MAX_SECONDS: Final = 300.0
# How long a partition's rebuild waits for the fold snapshots' database before it reads
# the partition from the log's beginning instead (a frozen server: no error comes).
SNAPSHOT_WAIT_SECONDS: Final = 60.0


class PartitionLost(Exception):
    """The partition's producer was fenced or its transaction failed; the log is rebuilt."""


class Backoff:
    """When each partition whose transactions failed may be rebuilt.

    The wait after the n-th failure in a row is drawn between half and all of
    ``base * 2**(n-1)`` (at most ``limit``), so that two members fencing each other
    drift apart and one of them gets to commit; a commit that succeeds resets it.
    """

    def __init__(
        self, base: float = REBUILD_BACKOFF_SECONDS, limit: float = REBUILD_BACKOFF_MAX_SECONDS
    ) -> None:
        self._base = base
        self._limit = limit
        self._failures: dict[int, int] = {}
        self._until: dict[int, float] = {}

    def failed(self, partition: int, now: float) -> float:
        """Count a failure of ``partition``'s transaction; the seconds to wait."""
        failures = self._failures[partition] = self._failures.get(partition, 0) + 1
        ceiling = min(self._limit, self._base * 2 ** min(failures - 1, 30))
        wait = random.uniform(ceiling / 2, ceiling)
        self._until[partition] = now + wait
        return wait

    def succeeded(self, partition: int) -> None:
        self._failures.pop(partition, None)

    def waiting(self, partition: int, now: float) -> bool:
        """Whether ``partition`` must not be rebuilt yet."""
        return self._until.get(partition, now) > now


class PartitionLog:
    """One assigned partition: its fold state, where the fold is, and its producer."""

    def __init__(
        self,
        follower: PartitionFollower,
        partition: int,
        producer: PartitionProducer,
        barrier: int,
        start: tuple[int, State] | None = None,
        name: str | None = None,
    ) -> None:
        """``start``: the offset and fold state of a snapshot to start from, else the
        partition's beginning; ``name``: the log's in the progress lines of its
        rebuild (:class:`~ledger.progress.CatchUp`)."""
        self.partition = partition
        self.state = State()
        self.terms: LeaseTerms | None = None  # for a fold that thins renewals, once it has
        # Its plain renewals read but not folded yet, and how many records were read and
        # when (loop time) since it last folded them (:meth:`settle`).
        self.pending: Pending = {}
        self.unsettled = 0
        self.settled_at = 0.0
        self.position = 0  # the next offset the fold will read
        self.barrier = barrier
        self.start = 0  # the offset the fold started at: 0, or a snapshot's
        # Whether it started at a snapshot: the events before it are in the state but
        # were not seen one by one (a consumer that makes up for that clears it).
        self.resumed = False
        self.lost = False
        # Resources touched since the consumer last decided on them, with the last
        # event that touched each (the cause of what is decided).
        self.touched: dict[ResourceKey, Meta] = {}
        self._follower = follower
        self._producer = producer
        self._lock = asyncio.Lock()
        self._moved = asyncio.Event()
        # The first offset of each commit of its own the fold has not read yet, and the
        # offset the partition's last stable offset has stood at since when.
        self._unread: collections.deque[int] = collections.deque()
        self._stuck: tuple[int, float] | None = None
        if start is not None:
            self.start, self.state = start
            self.position = self.start
            self.resumed = True
        self.catch_up = CatchUp(
            name or f"partition {partition}", {partition: barrier}, {partition: self.start}
        )

    @property
    def caught_up(self) -> bool:
        return not self.lost and self.position >= self.barrier

    def lease_terms(self) -> LeaseTerms:
        if self.terms is None:
            self.terms = LeaseTerms(self.state)
        return self.terms

    def settle(self) -> None:
        """Fold the plain renewals still pending: the state is then exactly the fold of
        every record read. A follower that thins renewals carries them from poll to
        poll and folds them every :data:`SETTLE_SECONDS`; live, with polls of a few
        records each, that decodes a lease's last renewal once a second, not once a
        poll. Until then only the leases' renew times lag, which no decision of the
        migrator reads; the lease GC, which reads them, settles first."""
        if self.pending:
            Thinning(self.state, self.lease_terms(), Changes(), pending=self.pending).finish()
        self.unsettled = 0

    def _settle_if_due(self, now: float) -> None:
        if self.unsettled >= SETTLE_RECORDS or now - self.settled_at >= SETTLE_SECONDS:
            self.settle()
            self.settled_at = now

    def _advance(self, position: int) -> None:
        self.position = position
        self._moved.set()
        self._moved = asyncio.Event()

    def _output_unreadable(self, last_stable: int | None, now: float) -> bool:
        """Whether the partition's last stable offset has stood at the first record of a
        commit of this log's own for a transaction timeout: the commit's markers are lost."""
        while self._unread and self._unread[0] < self.position:
            self._unread.popleft()
        if not self._unread or last_stable != self._unread[0]:
            self._stuck = None
            return False
        if self._stuck is None or self._stuck[0] != last_stable:
            self._stuck = (last_stable, now)
        return now - self._stuck[1] >= TRANSACTION_TIMEOUT_SECONDS

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
        async with self._lock:
            if self.lost:
                raise PartitionLost(f"partition {self.partition} was lost")
            backoff = self._follower.backoff
            try:
                positions = await self._producer.append(events, consumed=self.position)
            except TransactionFailed as error:
                wait = backoff.failed(self.partition, asyncio.get_running_loop().time())
                log.warning("%s; rebuilding in %.1f s", error, wait)
                self.lose()
                raise PartitionLost(str(error)) from error
            backoff.succeeded(self.partition)
        if positions:
            self.barrier = max(self.barrier, max(p.offset for p in positions) + 1)
            self._unread.append(min(p.offset for p in positions))
            _log_appended(self._follower.group_id, events, positions)
        for event_type, count in collections.Counter(map(type_name, events)).items():
            metrics.EVENTS_APPENDED.labels(self._follower.group_id, event_type).inc(count)
        return positions

    def lose(self) -> None:
        self.lost = True
        self._advance(self.position)

    async def close(self) -> None:
        self.lose()
        await self._producer.stop()


_NAMED_APPENDS: Final = 5  # events named one by one in an append's log line


def _log_appended(group_id: str, events: Sequence[Event], positions: Sequence[Position]) -> None:
    """One line per commit, naming what a consumer decided (an expiry, a migration step)."""
    named = [
        f"{type_name(event)} {subject(event)} ({event.meta.cluster}) at {position}"
        for event, position in zip(events[:_NAMED_APPENDS], positions, strict=False)
    ]
    if len(events) > _NAMED_APPENDS:
        named.append(f"{len(events) - _NAMED_APPENDS} more")
    log.info(
        "%s appended %s",
        group_id,
        ", ".join(named),
        extra={"events": len(events), "first": str(positions[0]), "last": str(positions[-1])},
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Folded:
    """What one poll folded into a partition's state: each event with what it changed
    (none for a follower that asked for the state alone; no plain lease renewal for one
    that asked for them thinned), and (:meth:`latest`) the meta of each cluster's last
    event folded, renewals included (its time is the cluster's time now)."""

    log: PartitionLog
    events: list[tuple[Event, Changes]]
    _latest: Callable[[], dict[str, Meta]]

    def latest(self) -> dict[str, Meta]:
        """Each cluster's last event's meta; a follower that thins renewals decodes a
        record per cluster for it, so only when asked (the migrator asks only while a
        resource backs off)."""
        return self._latest()


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
        events: bool = True,
        renewals: bool = True,
        snapshots: SnapshotSource | None = None,
    ) -> None:
        """``events=False``: the consumer reads only the folded state (the lease GC), not
        each event with its changes; the fold then thins plain lease renewals as the
        projector's does (:mod:`projections.thinning`), decoding only the other records,
        and the state after :meth:`PartitionLog.settle` is the same (the renewals left
        pending are folded then, and at least every :data:`SETTLE_SECONDS`).
        ``renewals=False``: the consumer reads each event with its changes but plain
        lease renewals (the migrator: a renewal changes only its lease's renew time,
        which no decision of it reads), and the fold thins them the same way;
        :meth:`Folded.latest` still names each cluster's last event, renewals included.
        ``snapshots``: where to start rebuilt partitions from (the module docstring)."""
        self.settings = settings
        self.snapshots = snapshots
        self.events = events
        self.renewals = renewals
        self.group_id = group_id
        self.transactional_prefix = transactional_prefix
        self.logs: dict[int, PartitionLog] = {}
        self.backoff = Backoff()
        self._poll_ms = poll_ms
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._member: GroupMember | None = None
        self._stop = asyncio.Event()  # that of batches(), once it runs
        self._unanswered: asyncio.Future[Any] | None = None  # a snapshot read given up on
        self._lag = metrics.ReaderLag(group_id)
        # How often each partition was revoked or assigned: a rebuild that sees it move
        # started on an assignment that is gone (:meth:`_build`).
        self._moves: collections.Counter[int] = collections.Counter()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # At once: each close may wait out a producer's stop timeout (a hung broker).
        await asyncio.gather(*(partition_log.close() for partition_log in self.logs.values()))
        self.logs.clear()
        self._lag.clear()
        if self.snapshots is not None:
            self.snapshots.close()
        if self._member is not None:
            await self._member.__aexit__(None, None, None)

    @property
    def member(self) -> GroupMember:
        assert self._member is not None, "the follower joins its group in batches()"
        return self._member

    async def _join(self, stop: asyncio.Event) -> GroupMember | None:
        """Join the group, trying again while the broker cannot be reached; None if stopped."""
        return await while_away(
            stop,
            lambda: GroupMember(
                self.settings, self.group_id, self._lose, fetch_max_wait_ms=self._fetch_max_wait_ms
            ).__aenter__(),  # a fresh member per attempt
            f"join group {self.group_id}",
        )

    def _lose(self, partitions: set[int]) -> None:
        """Revoked and newly assigned partitions are rebuilt from scratch, and so are those
        being rebuilt right now (:meth:`_build`)."""
        for partition in partitions:
            self._moves[partition] += 1
            partition_log = self.logs.get(partition)
            if partition_log is not None:
                partition_log.lose()

    def assigned(self) -> set[int]:
        """The partitions the group gives this member now (none before it has joined)."""
        return set() if self._member is None else self._member.assignment()

    async def end_offset(self, partition: int) -> int:
        """The partition's last stable offset now (read_committed end)."""
        return await self.member.end_offset(partition)

    async def _sync_assignment(self) -> None:
        member = self.member
        assigned = member.assignment()
        now = asyncio.get_running_loop().time()
        for partition in [p for p in self.logs if p not in assigned]:
            await self.logs.pop(partition).close()
        for partition in sorted(assigned):
            current = self.logs.get(partition)
            if (current is not None and not current.lost) or self.backoff.waiting(partition, now):
                continue
            if current is not None:
                await self.logs.pop(partition).close()
            try:
                built = await self._build(partition)
            except (*BROKER_ERRORS, TransactionFailed) as error:
                # Tried again at the next poll.
                log.warning(
                    "%s: partition %d cannot be rebuilt yet: %s", self.group_id, partition, error
                )
                continue
            if built is not None:
                self.logs[partition] = built

    async def _build(self, partition: int) -> PartitionLog | None:
        """A fresh log of ``partition``, or None if a rebalance took it meanwhile (or the
        seek to where its fold starts timed out).

        Or gave it back: a partition assigned anew starts reading at the group's
        committed offset, whatever this rebuild seeked on the assignment before, so the
        fold would start past the partition's history (and the consumer decide on a
        state without it). The next poll builds it again on the new assignment.
        """
        moves = self._moves[partition]
        producer = PartitionProducer(
            self.settings, partition, f"{self.transactional_prefix}-{partition}", self.group_id
        )
        await producer.start()
        try:
            # The barrier is read after the producer fenced every earlier one.
            barrier = await self.end_offset(partition)
            start = None if self.snapshots is None else await self._snapshot(partition, barrier)
            if self._stop.is_set():
                await producer.stop()
                return None
            partition_log = PartitionLog(
                self, partition, producer, barrier, start, f"{self.group_id}: partition {partition}"
            )
            if start is not None:
                log.info(
                    "%s: partition %d starts from its fold snapshot at offset %d (the log"
                    " ends at %d)",
                    self.group_id,
                    partition,
                    partition_log.position,
                    barrier,
                )
            if await self.member.seek(partition, partition_log.position):
                if self._moves[partition] == moves:
                    return partition_log
                log.info(
                    "%s: partition %d was reassigned while its log was rebuilt; rebuilding"
                    " it again",
                    self.group_id,
                    partition,
                )
        except BaseException:
            await producer.stop()
            raise
        await producer.stop()  # a rebalance moved the partition, or the seek timed out
        return None

    async def _snapshot(self, partition: int, barrier: int) -> tuple[int, State] | None:
        """Where the partition's fold starts: its latest fold snapshot before ``barrier``,
        read in a thread of its own (:func:`~ledger.tasks.in_daemon_thread`); None (the
        log's beginning, as for an unreadable snapshot) if the database does not answer
        within :data:`SNAPSHOT_WAIT_SECONDS`, or once the follower is told to stop.

        While a read it gave up on is still unanswered, the database is not asked again:
        the other partitions start at the beginning at once, rather than each waiting in
        turn (no poll meanwhile, which the group would take for a dead member)."""
        snapshots = self.snapshots
        assert snapshots is not None
        if self._unanswered is not None and not self._unanswered.done():
            log.warning(
                "%s: %s has still not answered, so partition %d is read from the log's beginning",
                self.group_id,
                snapshots.shown,
                partition,
            )
            return None
        reading = in_daemon_thread(
            functools.partial(snapshots.start, self.settings.topic, partition, barrier),
            name=f"svledger-snapshot-{partition}",
        )
        reading.add_done_callback(retrieved)  # its answer may come when no one waits
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait(
                (reading, stopped),
                timeout=SNAPSHOT_WAIT_SECONDS,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            stopped.cancel()
        if reading.done():
            return reading.result()
        self._unanswered = reading
        if not self._stop.is_set():
            log.warning(
                "%s: no answer from %s within %.0f s for the fold snapshots of partition %d,"
                " so it is read from the log's beginning",
                self.group_id,
                snapshots.shown,
                SNAPSHOT_WAIT_SECONDS,
                partition,
            )
        return None

    async def batches(self, stop: asyncio.Event) -> AsyncIterator[Folded]:
        """Join the group, then poll until ``stop`` is set; yield each followed partition
        after every poll."""
        self._stop = stop
        member = self._member = await self._join(stop)
        if member is None:
            return
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            await self._sync_assignment()
            fetched = await member.fetch(timeout_ms=self._poll_ms)
            self._lag.set(await member.lags())
            for partition, partition_log in list(self.logs.items()):
                messages = fetched.get(partition, [])
                events: list[tuple[Event, Changes]] = []
                latest: Callable[[], dict[str, Meta]] = dict
                if not self.events:
                    folded = self._fold_thinned(partition_log, messages, None)
                elif self.renewals:
                    events = self._fold(partition_log, messages)
                    folded = len(events)
                    latest = {event.meta.cluster: event.meta for event, _ in events}.copy
                else:
                    unread = messages[first_at(messages, partition_log.position) :]
                    folded = self._fold_thinned(partition_log, messages, events)
                    latest = functools.partial(self._latest, unread)
                if partition_log.lost:
                    continue
                if not (self.events and self.renewals):
                    partition_log._settle_if_due(loop.time())
                if folded:
                    metrics.EVENTS_FOLDED.labels(self.group_id).inc(folded)
                partition_log._advance(await member.position(partition))
                partition_log.catch_up.update({partition: partition_log.position})
                last_stable = member.last_stable_offset(partition)
                if partition_log._output_unreadable(last_stable, loop.time()):
                    log.warning(
                        "%s: partition %d: what this member committed at offset %s is still"
                        " not readable %.0f s later (the broker did not write the"
                        " transaction's markers); rebuilding the partition, which aborts it",
                        self.group_id,
                        partition,
                        last_stable,
                        TRANSACTION_TIMEOUT_SECONDS,
                    )
                    partition_log.lose()
                    continue
                yield Folded(partition_log, events, latest)

    @staticmethod
    def _fold_thinned(
        partition_log: PartitionLog,
        messages: list[Any],
        events: list[tuple[Event, Changes]] | None,
    ) -> int:
        """Fold ``messages`` thinning plain renewals, and append to ``events`` (if a list)
        every other event with its changes; how many records were folded. The plain
        renewals are left pending in the log (:meth:`PartitionLog.settle`)."""
        if partition_log.lost:
            return 0
        first = first_at(messages, partition_log.position)
        thinning = Thinning(
            partition_log.state,
            partition_log.lease_terms(),
            Changes(),
            None
            if events is None
            else lambda record, changes: events.append((record.event, changes)),
            pending=partition_log.pending,
        )
        thinning.fold(itertools.islice(messages, first, None), [], None)
        partition_log.unsettled += len(messages) - first
        for message, reason in thinning.dead:
            log.warning(
                "skipping undecodable record %d@%d: %s", message.partition, message.offset, reason
            )
        return len(messages) - first - len(thinning.dead)

    @staticmethod
    def _latest(messages: list[Any]) -> dict[str, Meta]:
        """The meta of each cluster's last record in ``messages`` that decodes: a record
        of each cluster decoded, most of them not."""
        latest: dict[str, Meta] = {}
        found: set[bytes | None] = set()
        for message in reversed(messages):
            if message.key in found:
                continue
            read = decode_message(message)
            if isinstance(read, Record):
                found.add(message.key)
                latest[read.event.meta.cluster] = read.event.meta
        return latest

    @staticmethod
    def _fold(partition_log: PartitionLog, messages: list[Any]) -> list[tuple[Event, Changes]]:
        folded: list[tuple[Event, Changes]] = []
        for message in messages:
            if partition_log.lost or message.offset < partition_log.position:
                continue
            read = decode_message(message)  # refused as by every reader: folded by none
            if isinstance(read, str):
                log.warning(
                    "skipping undecodable record %d@%d: %s",
                    message.partition,
                    message.offset,
                    read,
                )
                continue
            changes = apply(partition_log.state, read.event, read.position)
            folded.append((read.event, changes))
        return folded
