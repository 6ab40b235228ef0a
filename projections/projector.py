"""The projector: folds the log into the SQL views, exactly once, for ever.

Correctness rests on one step, shared with replay: the records past the checkpoint
are folded in memory (:func:`fold_batch`) into a :class:`~projections.store.Batch`
of rows, then a single transaction (:func:`projections.store.commit`) locks the SQL
checkpoint of every partition in the batch, checks it is the one the fold started
from, and writes the ``ledger_events`` rows, the view rows the batch changed and
the new checkpoint. The database, never Kafka's committed offsets, says how far
the views are. So:

* A crash (even ``kill -9``) anywhere loses nothing and applies nothing twice: an
  uncommitted batch leaves no trace and is read again from the checkpoint.
* Records at or before the checkpoint are skipped, whatever the consumer delivers.
* The in-memory :class:`Projection` (fold state and the offset it expects next per
  partition) must be exactly what the database holds. If the database's checkpoint
  differs (another projector wrote the partition in between, e.g. after a rebalance
  it did not see in time), or ``ledger_events`` already has one of the batch's
  positions, the batch is refused with :class:`~projections.store.StaleProjection`.
  Then, and after any failed transaction (the fold mutated the state in place), the
  projector reloads state and checkpoints from SQL and seeks back to them.

The :class:`Projector` is the shell around it. It joins a consumer group per
projection, so running several instances spreads the partitions over them (a
cluster's events live in one partition, so its state is wholly in one instance).
On every assignment the consumer starts each partition at its SQL checkpoint and
the state is reloaded from SQL before the next batch. Batches are whatever one
poll returns, up to ``max_batch`` records: thousands while catching up, a handful
when live.

Throughput comes from a pipeline of depth one: while a batch is written, by the
writer process (:mod:`projections.writer`: writing then runs on a core of its own
instead of waiting for the fold's interpreter lock), the event loop fetches,
decodes and folds the next, and starts writing it only once the previous one has
committed; while it waits for that commit, it fetches the batch after (aiokafka
parses the records as it hands them out). Batches therefore commit one at a time,
in log order, and the state is never more than one batch ahead of the database. If
a write fails, the batch folded on top of it is dropped with it, and so is the one
fetched after it. A rebalance may now happen while a batch is being written; it
needs no care: the batch's transaction still checks and locks its checkpoints, a
new owner of the partition that read the checkpoint too early is refused and
reloads, and this projector finishes the write before it reloads for its new
assignment.

Outages do not stop it: an unreachable broker or database is logged (naming which
one), and retried with exponential backoff; the batch in hand is dropped and read
again from the checkpoint once the database is back. ``stop`` ends it cleanly: the
batch in hand is committed first, then it leaves the consumer group. A database that
does not finish that batch within :data:`STOP_GRACE_SECONDS` (a frozen server: no
error comes) is given up (:class:`WriteAbandoned`): the batch commits or rolls back
with its checkpoint, whichever the database does, and the next start reads on from it.
Its reads (the schema check, a load, a rebalance's checkpoints) run off the event loop,
so the group's heartbeats and a stop are heard meanwhile; nothing is in hand while it
reads, so a stop gives a read up at once (a rebalance's, which aiokafka waits for, within
:data:`CHECKPOINTS_WAIT_SECONDS`).

Progress shows in :class:`ProjectorMetrics` and the Prometheus metrics
(:mod:`ledger.metrics`): events folded and rejected once their batch has committed,
and each partition's lag after every poll, the batches being written and fetched
counted as read.
While the broker or the database is out of reach the lag is unknown, and not shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from ledger import metrics
from ledger.errors import Unavailable, UsageError
from ledger.events import from_micros, micros
from ledger.kafka import (
    BROKER_ERRORS,
    EventConsumer,
    Message,
    Messages,
    Record,
    drop_fetch,
    end_offsets,
    first_at,
    max_time,
)
from ledger.memory import Sweeper, fewer_collections
from ledger.settings import KafkaSettings
from ledger.tasks import in_daemon_thread
from projections import store
from projections.database import DatabaseUnreachable, engine, shown
from projections.snapshots import NO_EVENTS, SNAPSHOT_EVERY, Snapshot, take
from projections.state import Changes, State
from projections.store import StaleProjection, load_checkpoints, load_log_times, load_state
from projections.thinning import LeaseTerms, Thinning
from projections.writer import BatchWriter, WriterLost

log = logging.getLogger(__name__)

DEFAULT_PROJECTION: Final = "views"
READER: Final = "projector"  # its label in the Prometheus metrics (ledger.metrics)
MAX_BATCH: Final = 20_000
POLL_MS: Final = 200
LOG_INTERVAL_SECONDS: Final = 10.0
# How long a stopping projector waits for the batch being written: well within the 30 s
# Kubernetes grants a pod to stop.
STOP_GRACE_SECONDS: Final = 10.0
# How long a rebalance waits for the checkpoints of the partitions it assigns: well
# within the group's session timeout (10 s), as aiokafka sends no heartbeat meanwhile.
CHECKPOINTS_WAIT_SECONDS: Final = 5.0
BACKOFF_START_SECONDS: Final = 0.5
BACKOFF_MAX_SECONDS: Final = 30.0

_T = TypeVar("_T")
_DATABASE_DOWN: Final = (OperationalError, InterfaceError, DatabaseUnreachable)


_NEVER: Final = micros(NO_EVENTS)


@dataclasses.dataclass
class Projection:
    """The fold's state and, per partition, the next offset it expects, as last committed.

    ``log_times``: per partition, the latest time (microseconds since 1970) an event
    before that offset occurred at; None if unknown, absent if no event yet.
    ``snapshot_every``: take a fold snapshot of a partition each time its offset
    passes a multiple of it (:mod:`projections.snapshots`); None, never.
    """

    name: str
    topic: str
    state: State
    next_offsets: dict[int, int]
    log_times: dict[int, int | None] = dataclasses.field(default_factory=dict)
    snapshot_every: int | None = None
    terms: LeaseTerms | None = None  # the leases' terms, once a batch needs them

    @classmethod
    def load(
        cls, connection: Connection, topic: str, name: str, snapshot_every: int | None = None
    ) -> Projection:
        times = load_log_times(connection, topic, name)
        return cls(
            name,
            topic,
            load_state(connection),
            load_checkpoints(connection, topic, name),
            {p: None if t is None else micros(t) for p, t in times.items()},
            snapshot_every,
        )

    def check_within(self, ends: Mapping[int, int], db_shown: str) -> None:
        """Raise :class:`NotThisLog` if a checkpoint is past its partition's end (``ends``:
        last stable offsets, which a checkpoint never passes).

        The checkpoints name the topic, not one incarnation of it: if the topic was
        deleted and created again, its offsets start over, the consumer's position past
        the end is reset to the beginning, and the fold would skip every record below the
        old checkpoint as already in the views, silently. A topic that has grown past
        the old checkpoints by then is not told apart (Kafka's topic IDs are not read).
        """
        past = {p: o for p, o in sorted(self.next_offsets.items()) if o > ends.get(p, 0)}
        if past:
            found = ", ".join(
                f"partition {p} up to offset {o}, which now ends at {ends[p]}"
                if p in ends
                else f"partition {p}, which the topic no longer has"
                for p, o in past.items()
            )
            raise NotThisLog(
                f"the views in {db_shown} were projected from topic {self.topic!r} further"
                f" than it reaches now ({found}): the topic was deleted and created again, or"
                " this is another broker's. They are not this log's views: replay the topic"
                " into a fresh database (svledger replay --db URL), or give the database of"
                " this topic's views"
            )


class NotThisLog(UsageError):
    """The database holds the views of a log that went further than the topic does now."""


@dataclasses.dataclass(frozen=True, slots=True)
class BatchResult:
    folded: int  # plain renewals included
    rejected: int
    skipped: int  # at or before the checkpoint: already in the views


@dataclasses.dataclass(frozen=True, slots=True)
class FoldedBatch:
    """A batch folded in memory, not yet committed (:func:`projections.store.commit`).

    ``dead``: records the fold found undecodable (the consumer hands them all over
    undecoded), to be sent to the dead-letter topic before the batch commits.
    """

    batch: store.Batch
    result: BatchResult
    dead: Sequence[tuple[Any, str]] = ()


def fold_batch(projection: Projection, batch: Messages, only: bytes | None = None) -> FoldedBatch:
    """Fold the consumed records past ``projection``'s offsets into it, as a batch to commit.

    ``batch``: per partition, its records in log order, undecoded (as
    :meth:`~ledger.kafka.EventConsumer.fetch_for_fold` hands them out); the fold decodes
    what it must. Plain lease renewals are counted, not logged one by one
    (:mod:`projections.thinning`). ``projection`` moves past the batch at once, so the
    next batch can be folded while this one is written; if the write fails, reload it
    (:meth:`Projection.load`). With ``only`` (a cluster's name, encoded), only that
    cluster's records are folded; the checkpoints and log times still pass every record,
    as a fold snapshot's do, so a replay of one cluster ends where one from a snapshot does.
    """
    next_offsets = projection.next_offsets
    times = projection.log_times
    start_offsets = dict(next_offsets)
    if projection.terms is None:
        projection.terms = LeaseTerms(projection.state)
    changes = Changes()
    thinning = Thinning(projection.state, projection.terms, changes)
    logged: list[Record] = []
    moved: dict[int, int] = {}
    skipped = 0
    for partition, messages in batch.items():
        first = first_at(messages, next_offsets.get(partition, 0))
        skipped += first
        if first == len(messages):
            continue
        next_offsets[partition] = moved[partition] = messages[-1].offset + 1
        rest: Iterable[Message] = itertools.islice(messages, first, None)
        latest = times.get(partition, _NEVER)
        if only is not None:
            rest = list(rest)
            latest = max_time((m for m in rest if m.key != only), latest)
            rest = [m for m in rest if m.key == only]
        latest = thinning.fold(rest, logged, latest)
        if latest is not None:
            times[partition] = latest
    thinning.finish()
    log_times = {p: _time(times.get(p, _NEVER)) for p in moved}
    snapshots: list[Snapshot] = []
    if (every := projection.snapshot_every) is not None:
        snapshots.extend(
            take(projection.state, projection.name, projection.topic, p, o, log_times[p])
            for p, o in sorted(moved.items())
            if o // every > start_offsets.get(p, 0) // every
        )
    folded = store.Batch.of(
        projection.state,
        changes,
        [store.logged(r.event, r.position) for r in logged],
        projection.topic,
        projection.name,
        start_offsets,
        renewals=thinning.counts,
        next_offsets=moved,
        log_times=log_times,
        snapshots=snapshots,
    )
    result = BatchResult(len(logged) + thinning.renewals, len(changes.rejections), skipped)
    return FoldedBatch(folded, result, thinning.dead)


def _time(moment: int | None) -> datetime | None:
    return None if moment is None else from_micros(moment)


@dataclasses.dataclass
class ProjectorMetrics:
    """This projector's counters since start and its lag (summed over its partitions) as
    last measured, for tests, benchmarks and the progress log; the Prometheus metrics
    (:mod:`ledger.metrics`) show the same per process."""

    events_folded: int = 0
    batches: int = 0
    rejected: int = 0
    skipped: int = 0
    reloads: int = 0
    lag: int = 0


class _Backoff:
    def __init__(self) -> None:
        self.delay = BACKOFF_START_SECONDS

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, BACKOFF_MAX_SECONDS)
        return delay

    def reset(self) -> None:
        self.delay = BACKOFF_START_SECONDS


class WriteAbandoned(Unavailable):
    """A stopping projector gave up waiting for the database to finish a batch."""

    leaves_a_thread_waiting = True  # the writer's, in the database driver


async def _done_unless_stopped(
    work: asyncio.Future[Any], stop: asyncio.Event, grace: float = 0.0
) -> bool:
    """Wait for ``work``; once ``stop`` is set, ``grace`` seconds at most. Whether it
    finished."""
    if not stop.is_set():
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((work, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
    if not work.done() and grace > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(work), grace)
    return work.done()


def group_id(topic: str, projection: str, database_id: str) -> str:
    """The consumer group of ``projection``'s projectors of ``topic`` into one database."""
    return f"svledger-projector.{topic}.{projection}.{database_id}"


async def _read(call: Callable[[], _T], stop: asyncio.Event, what: str) -> _T | None:
    """``call()``, a read of the database, in a thread of its own: meanwhile the event
    loop goes on (the consumer group's heartbeats, the metrics, a stop). None once
    ``stop`` is set before it is done: nothing is in hand while the projector reads, so
    it stops at once, and the thread, which may wait for ever on a database that takes
    queries and answers none, does not hold up its exit (:func:`in_daemon_thread`)."""
    reading = in_daemon_thread(call, name=f"svledger-projector-read-{what}")
    try:
        if await _done_unless_stopped(reading, stop):
            return reading.result()
    finally:
        reading.cancel()  # given up on (or its waiter cancelled): its answer is dropped
    log.info("stopped while reading %s from the database, which had not answered", what)
    return None


async def _sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class Projector:
    """Keeps one projection database up to date with the log; see the module docstring.

    With ``group`` (the default) instances of the same projection of the same topic
    into the same database share a consumer group and split its partitions, dealt by
    the records each has left to fold (:mod:`ledger.assignment`); the group
    is named by the database's own ID (:func:`projections.store.database_id`), so
    projectors of two databases each read every partition. ``group=False`` reads every
    partition by manual assignment: one instance, no rebalancing, and a restart
    after a crash does not wait for the broker to notice the dead group member.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        db_url: str,
        *,
        projection: str = DEFAULT_PROJECTION,
        group: bool = True,
        max_batch: int = MAX_BATCH,
        poll_ms: int = POLL_MS,
        log_interval: float = LOG_INTERVAL_SECONDS,
        snapshot_every: int | None = SNAPSHOT_EVERY,
    ) -> None:
        self.settings = settings
        self.snapshot_every = snapshot_every
        self.db_url = db_url
        self.projection = projection
        self.grouped = group
        self.group_id: str | None = None  # named once the database is known
        self.max_batch = max_batch
        self.poll_ms = poll_ms
        self.log_interval = log_interval
        self.metrics = ProjectorMetrics()
        self._lag = metrics.ReaderLag(READER)
        self._db: Engine | None = None
        self._state: Projection | None = None
        self._reassigned = False
        self._backoff = _Backoff()
        self._writer = BatchWriter(db_url)  # commits batches in turn, in its own process
        self._writing: asyncio.Future[None] | None = None  # the batch being written
        self._written = BatchResult(0, 0, 0)  # and what it holds
        self._sweeper = Sweeper()

    async def run(self, stop: asyncio.Event) -> None:
        """Project until ``stop`` is set; the batch in hand is committed before returning."""
        try:
            with fewer_collections():
                async with self._writer:
                    while not stop.is_set():
                        try:
                            await self._session(stop)
                        except BROKER_ERRORS as error:
                            await self._outage(
                                "kafka", self.settings.bootstrap_servers, error, stop
                            )
        finally:
            if self._db is not None:
                self._db.dispose()

    async def _session(self, stop: asyncio.Event) -> None:
        """One connection to the broker, from the SQL checkpoints until ``stop``."""
        db = await self._database(stop)
        if db is None or not await self._reload(stop):
            return
        assert self._state is not None
        ends = await end_offsets(self.settings)
        self._state.check_within(ends, shown(db.url))

        def backlog() -> dict[int, int]:
            """The records each partition has left to fold, as far as this session
            knows: to the ends read at its start, from the state's offsets now."""
            assert self._state is not None
            offsets = self._state.next_offsets
            return {p: max(0, end - offsets.get(p, 0)) for p, end in ends.items()}

        async with EventConsumer(
            self.settings,
            group_id=self.group_id,
            start_offsets=self._start_offsets,
            backlog=backlog if self.grouped else None,
        ) as consumer:
            log.info(
                "projecting topic %s into %s as %r (group %s)",
                self.settings.topic,
                shown(db.url),
                self.projection,
                self.group_id,
                extra={"topic": self.settings.topic, "projection": self.projection},
            )
            fetch: asyncio.Future[Messages] | None = None
            stopped = asyncio.ensure_future(stop.wait())
            progress = _Progress(self.metrics, self.log_interval)
            try:
                while True:
                    if fetch is None:
                        fetch = asyncio.ensure_future(
                            consumer.fetch_for_fold(self.max_batch, self.poll_ms)
                        )
                    # Waiting for records is the one place a stop may cut short.
                    waiting: set[asyncio.Future[Any]] = {fetch, stopped}
                    if self._writing is not None:
                        waiting.add(self._writing)
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    if not fetch.done():
                        if stop.is_set():
                            return  # the fetch is cancelled below
                        if await self._settle(stop):
                            continue
                        # The write failed while records were being fetched, maybe
                        # fetched past it: drop them and read on from the checkpoints.
                        await drop_fetch(fetch)
                        fetch = None
                        await self._recover(consumer, stop)
                        continue
                    fetched, fetch = fetch, None
                    messages = fetched.result()
                    if messages:
                        fetch = await self._project(consumer, messages, stop)
                    # Measured after every poll, empty ones too: a poll that only passes
                    # a transaction's commit marker moves the position to the end.
                    lags = await consumer.lags()
                    self._lag.set(lags)
                    self.metrics.lag = sum(lags.values())
                    progress.maybe_log()
                    if stop.is_set():
                        return
            finally:
                stopped.cancel()
                if fetch is not None:
                    await drop_fetch(fetch)
                self._lag.clear()  # unknown until the next session polls
                # Whatever ended the session, the batch being written is finished first;
                # if it failed, the next session reloads from the database anyway.
                await self._settle(stop)

    async def _database(self, stop: asyncio.Event) -> Engine | None:
        def connect() -> tuple[Engine, str]:
            db = engine(self.db_url)
            try:
                with db.connect() as connection:
                    return db, store.database_id(connection)
            except BaseException:
                db.dispose()
                raise

        while self._db is None and not stop.is_set():
            try:
                connected = await _read(connect, stop, "its schema")
            except _DATABASE_DOWN as error:
                await self._outage("database", self.db_url, error, stop)
                continue
            if connected is not None:
                self._db, identity = connected
                if self.grouped:
                    self.group_id = group_id(self.settings.topic, self.projection, identity)
        return self._db

    async def _reload(self, stop: asyncio.Event) -> bool:
        """Load state and checkpoints from SQL, retrying while the database is down."""
        db = self._db
        assert db is not None

        def load() -> Projection:
            with db.connect() as connection:
                return Projection.load(
                    connection, self.settings.topic, self.projection, self.snapshot_every
                )

        while not stop.is_set():
            self._reassigned = False  # set again by an assignment during the load
            try:
                state = await _read(load, stop, "the views' state")
            except _DATABASE_DOWN as error:
                await self._outage("database", self.db_url, error, stop)
                continue
            if state is None:
                return False
            self._state = state
            self.metrics.reloads += 1
            self._backoff.reset()
            return True
        return False

    async def _start_offsets(self, partitions: set[int]) -> Mapping[int, int]:
        """Where newly assigned partitions resume: their SQL checkpoints.

        Read off the event loop, as :func:`_read` reads, and waited for
        :data:`CHECKPOINTS_WAIT_SECONDS` at most: aiokafka holds the group's heartbeats
        while it asks, and a database that takes the query and never answers would
        otherwise hold them (and a stop) for ever. Unread, the partitions start at the
        beginning; fold_batch skips what the views already hold, so that costs time, not
        correctness."""
        db = self._db
        assert db is not None
        self._reassigned = True
        if not partitions:
            return {}

        def read() -> Mapping[int, int]:
            with db.connect() as connection:
                return load_checkpoints(connection, self.settings.topic, self.projection)

        try:
            checkpoints = await asyncio.wait_for(
                in_daemon_thread(read, name="svledger-projector-read-checkpoints"),
                CHECKPOINTS_WAIT_SECONDS,
            )
        except (TimeoutError, *_DATABASE_DOWN) as error:
            reason = (
                f"no answer within {CHECKPOINTS_WAIT_SECONDS:.0f} s"
                if isinstance(error, TimeoutError)
                else str(error)
            )
            log.warning(
                "cannot read checkpoints for partitions %s from the database: %s; they"
                " start at the beginning, and what the views hold is skipped",
                sorted(partitions),
                reason,
                extra={"unreachable": "database"},
            )
            return {}
        return {p: checkpoints[p] for p in partitions if p in checkpoints}

    async def _project(
        self,
        consumer: EventConsumer,
        messages: Messages,
        stop: asyncio.Event,
    ) -> asyncio.Future[Messages] | None:
        """Fold a batch and start writing it, once the batch before it is committed;
        returns the fetch of the next batch, if it started one.

        Folding this batch overlaps the write of the one before it, and fetching the
        next (aiokafka parses its records as it hands them out, on this process's
        interpreter) overlaps both that write, when it is still going, and this one's;
        batches still commit one at a time, in order.
        """
        assert self._db is not None
        if self._reassigned:
            if not await self._settle(stop):
                await self._recover(consumer, stop)
                return None
            if not await self._reload(stop):
                return None
        assert self._state is not None
        folded = fold_batch(self._state, messages)
        # Before the checkpoint moves past them.
        await consumer.send_dead_letters(folded.dead)
        fetch = asyncio.ensure_future(consumer.fetch_for_fold(self.max_batch, self.poll_ms))
        if not await self._settle(stop):
            # Folded on top of a batch that did not commit: dropped, read again, and so
            # is what was fetched after it.
            await drop_fetch(fetch)
            await self._recover(consumer, stop)
            return None
        self._writing = self._writer.commit(folded.batch)
        self._sweeper.folded(sum(map(len, messages.values())))
        self._written = folded.result
        return fetch

    async def _settle(self, stop: asyncio.Event) -> bool:
        """Wait for the batch being written, if any; False if it did not commit."""
        if self._writing is None:
            return True
        writing, result, self._writing = self._writing, self._written, None
        try:
            await self._finished(writing, result, stop)
        except StaleProjection as refused:
            log.warning(
                "batch of %d events refused, reloading from the database: %s",
                result.folded,
                refused,
                extra={"projection": self.projection},
            )
        except WriterLost as lost:
            # Backing off: a writer that cannot start at all must not be respawned in a loop.
            delay = self._backoff.next()
            log.warning(
                "batch of %d events may not have committed, reloading from the database"
                " in %.1f s: %s",
                result.folded,
                delay,
                lost,
                extra={"projection": self.projection, "retry_in": delay},
            )
            await _sleep_unless_stopped(stop, delay)
        except _DATABASE_DOWN as error:
            await self._outage("database", self.db_url, error, stop)
        else:
            self.metrics.batches += 1
            self.metrics.events_folded += result.folded
            self.metrics.rejected += result.rejected
            self.metrics.skipped += result.skipped
            metrics.EVENTS_FOLDED.labels(READER).inc(result.folded)
            metrics.EVENTS_REJECTED.labels(READER).inc(result.rejected)
            self._backoff.reset()
            return True
        return False

    async def _finished(
        self, writing: asyncio.Future[None], result: BatchResult, stop: asyncio.Event
    ) -> None:
        """Wait for the batch being written; once ``stop`` is set, for
        :data:`STOP_GRACE_SECONDS` at most, then give it up (:class:`WriteAbandoned`)."""
        if not await _done_unless_stopped(writing, stop, STOP_GRACE_SECONDS):
            self._writer.abandon()
            raise WriteAbandoned(
                f"the database at {shown(self.db_url)} did not finish writing a batch of"
                f" {result.folded} events within {STOP_GRACE_SECONDS:.0f} s of the stop"
                " (is it frozen, or its host unreachable?); stopped without waiting for"
                " it. Nothing is lost: the database commits or rolls back the batch with"
                " its checkpoint, and the next start goes on from whichever it did"
            )
        writing.result()

    async def _recover(self, consumer: EventConsumer, stop: asyncio.Event) -> None:
        """After a batch that did not commit: the state was folded past the database."""
        if await self._reload(stop):
            self._seek_to_checkpoints(consumer)

    def _seek_to_checkpoints(self, consumer: EventConsumer) -> None:
        assert self._state is not None
        consumer.seek(self._state.next_offsets)

    async def _outage(
        self, what: str, address: str, error: BaseException, stop: asyncio.Event
    ) -> None:
        delay = self._backoff.next()
        log.warning(
            "%s unreachable at %s, retrying in %.1f s: %s",
            what,
            shown(address),
            delay,
            str(error).strip().splitlines()[0],
            extra={"unreachable": what, "address": shown(address), "retry_in": delay},
        )
        # Not polling meanwhile, its lag would stay as last measured (0, say) while
        # the views fall behind: unknown, it leaves the metric until the next poll.
        self._lag.clear()
        await _sleep_unless_stopped(stop, delay)


class _Progress:
    """Logs throughput and lag every ``interval`` seconds."""

    def __init__(self, metrics: ProjectorMetrics, interval: float) -> None:
        self.metrics = metrics
        self.interval = interval
        self.since = time.monotonic()
        self.folded = metrics.events_folded

    def maybe_log(self) -> None:
        now = time.monotonic()
        if now - self.since < self.interval:
            return
        rate = (self.metrics.events_folded - self.folded) / (now - self.since)
        log.info(
            "folded %d events (%.0f events/s), lag %d, %d batches, %d rejected",
            self.metrics.events_folded,
            rate,
            self.metrics.lag,
            self.metrics.batches,
            self.metrics.rejected,
            extra={"events_per_second": rate, **dataclasses.asdict(self.metrics)},
        )
        self.since, self.folded = now, self.metrics.events_folded


async def run_projector(
    settings: KafkaSettings,
    db_url: str,
    *,
    projection: str = DEFAULT_PROJECTION,
    stop: asyncio.Event | None = None,
    group: bool = True,
    max_batch: int = MAX_BATCH,
    snapshot_every: int | None = SNAPSHOT_EVERY,
) -> ProjectorMetrics:
    """``svledger project --db URL``: project until ``stop`` is set (wire SIGTERM to it)."""
    projector = Projector(
        settings,
        db_url,
        projection=projection,
        group=group,
        max_batch=max_batch,
        snapshot_every=snapshot_every,
    )
    await projector.run(stop if stop is not None else asyncio.Event())
    return projector.metrics
