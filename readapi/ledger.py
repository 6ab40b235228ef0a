"""The read API's copy of the ledger: every cluster's fold, followed live, and its past.

:class:`LedgerViews` reads every partition of the topic from the beginning and folds
each record into its cluster's :class:`~projections.state.State` with the projector's
own fold (:func:`projections.fold.apply`), so it shows what the SQL views show. What
the log held at start-up, but its last ``watch_window`` records per partition, is
folded as the projector folds it, plain lease renewals thinned
(:mod:`projections.thinning`: most of the log, and most of them never decoded), into
exactly the same views. For each cluster it keeps:

* the live view (the state: its rows record when and at which offset each was created,
  and its cluster's latest event time, :mod:`projections.state`);
* a window of the latest changes (offset, ADDED/MODIFIED/DELETED, the row before and
  after), from which watches are served; a watch from an offset older than the
  window (or than the records folded thinned at start-up) is answered 410 Gone, as
  Kubernetes answers a compacted resourceVersion. A cluster keeps its latest
  ``watch_window`` changes, or on a fleet its share of ``watch_budget``, whichever is
  less, but never fewer than ``WATCH_FLOOR`` (:meth:`LedgerViews.watch_share`): the
  windows are most of the server's memory on a fleet (each change holds the row
  before and after), and with a budget they stop growing once each cluster's share is
  full, however long the server follows the log and however many clusters it meets,
  while a ledger of a few clusters keeps a long history for watches;
* checkpoints: every ``checkpoint_every`` records of a partition, a copy of the state
  of each of its clusters (rows are immutable, so a copy is a copy of four dicts).
  The newest ``recent_checkpoints`` of a partition are kept at that spacing, the ones
  before them at twice it, then four times, and so on (:func:`kept`), so a partition
  keeps about ``recent_checkpoints * log2(taken / recent_checkpoints)`` of them and the
  server's memory grows with the logarithm of the log, not with the log. With
  snapshots (below) only the newest checkpoint of each partition is kept: a copy holds
  every cluster of the partition (a fleet's: about 0.35 MiB per 80 clusters), so a
  year of them would take most of a fleet's replica's memory, and the projector's fold
  snapshots already are the checkpoints of the past.

With a :class:`~projections.snapshots.SnapshotSource` (``serve --snapshots-from URL``,
the projector's database) each partition starts instead from the projector's latest
sound fold snapshot at or before the partition's end (with a known log time), as the
consumers' folds do, and the log is read on from there: the start costs the snapshot's
rows and at most ``--snapshot-every`` records of each partition, not the whole log. The
records before the snapshot are passed over as records folded thinned are: a watch from
before them is answered 410 Gone. The snapshot is the fold's state exactly, with each
row's creation and each cluster the partition has events of (with the latest time one
occurred at), so what is served from it is, bit for bit, what a fold from the log's
beginning serves. No snapshot, a corrupt one, or a database that cannot be read or does
not answer: the partition is read from its beginning, with a warning.

A past view (:meth:`LedgerViews.view_at`) starts from the latest checkpoint at or
before the point and folds the records of the cluster's partition after it, read
again from Kafka: at most ``checkpoint_every`` for the recent past, and for an older
point at most about its age in records divided by ``recent_checkpoints / 2``; with
snapshots, a point before every checkpoint kept starts from the projector's latest
snapshot at or before it (:func:`projections.snapshots.latest`, the cut ``replay
--until`` makes). Built views are kept in a small LRU cache. A point is an offset in
the cluster's partition (the resourceVersion the API shows) or a time: the view then
holds every event of the cluster before its partition's first event (of any cluster)
that occurred after that time, the cut ``replay --until`` makes
(:mod:`projections.replay`), so the two agree, and its resourceVersion is the offset
before that cut, wherever the fold started from. A view of a time no event of the
partition is after yet is built again when asked again (a later record may still belong
before the cut), not kept.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal, TypeAlias, cast

from ledger import metrics
from ledger.errors import Unavailable, UsageError
from ledger.events import Event, Position, micros
from ledger.kafka import (
    EndOffsets,
    EventConsumer,
    Message,
    Record,
    decode_message,
    decode_messages,
    first_at,
    message_time,
    while_away,
)
from ledger.names import resource_name
from ledger.progress import CatchUp
from ledger.settings import KafkaSettings
from ledger.tasks import in_daemon_thread, retrieved
from projections.fold import apply
from projections.history import resolve
from projections.replay import cluster_log
from projections.snapshots import Rows, Snapshot, SnapshotSource, state_of
from projections.state import Changes, ResourceKey, State
from projections.thinning import LeaseTerms, Thinning
from readapi import (
    CHECKPOINT_EVERY,
    RECENT_CHECKPOINTS,
    WATCH_BUDGET,
    WATCH_FLOOR,
    WATCH_WINDOW,
    timeline,
)
from readapi.kinds import Row, ServedStorageState, View, served_storage_state

Point: TypeAlias = int | datetime
ChangeType: TypeAlias = Literal["ADDED", "MODIFIED", "DELETED"]
RowKey: TypeAlias = tuple[str, tuple[str, ...]]  # kind, and the row's key but its cluster

log = logging.getLogger(__name__)

CACHED_VIEWS: Final = 64
READER: Final = "serve"  # its label in the Prometheus metrics (ledger.metrics)
# How long a read of fold snapshots waits for their database before the partition is
# read from the log's beginning instead (a frozen server: no error comes).
SNAPSHOT_WAIT_SECONDS: Final = 60.0
# The views start only from a snapshot whose log time is known (every one but those
# taken before log times were kept): ``/at/TIME`` cuts by it.
_KNOWN_LOG_TIME: Final = datetime.max.replace(tzinfo=UTC)


class UnknownCluster(UsageError):
    """No event of the cluster is in the log."""


class NotCaughtUp(Unavailable):
    """A cluster not folded yet by views still reading the log up to where it ended at
    their start (the broker may be away): it may be further on."""


class PointOutOfRange(UsageError):
    """A point the log has not reached yet, or not a point at all."""


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One row changed by one event, as a watch sends it."""

    offset: int
    type: ChangeType
    row: Row  # the row after the change; for DELETED, the last one
    previous: Row | None


@dataclasses.dataclass
class ClusterFold:
    """One cluster's fold and what the API needs beside it.

    ``rows`` mirrors the state's served rows by kind and name, so a deletion is sent
    with the row's last content.
    """

    cluster: str
    partition: int
    state: State = dataclasses.field(default_factory=State)
    rows: dict[RowKey, Row] = dataclasses.field(default_factory=dict)
    offset: int = -1  # the last offset of the partition folded (or passed over)
    changes: collections.deque[Change] = dataclasses.field(default_factory=collections.deque)
    horizon: int = -1  # every change at an offset above this is in ``changes``

    def apply(self, event: Event, position: Position, window: int) -> None:
        """Fold one event; keep its changes for watches if ``window`` is not 0."""
        changes = apply(self.state, event, position)
        self.offset = position.offset
        found = self._track(changes, position.offset)
        if window:
            self.changes.extend(found)
            while len(self.changes) > window:
                self.horizon = self.changes.popleft().offset

    def track(self, record: Record, changes: Changes) -> None:
        """Take the ``changes`` of a record folded into the state by someone else (a
        :class:`~projections.thinning.Thinning`), right after it, keeping none for watches."""
        self._track(changes, record.position.offset)

    @property
    def time(self) -> datetime | None:
        """The latest time an event of the cluster occurred at (None: no event yet)."""
        known = self.state.clusters.get(self.cluster)
        return None if known is None else known.latest_occurred_at

    def _track(self, changes: Changes, offset: int) -> list[Change]:
        state = self.state
        # A StorageState is served with its CustomResourceDefinition's verdicts, which its
        # migrations change too, and with its last audit
        # (:class:`~readapi.kinds.ServedStorageState`).
        storage_states = (
            changes.storage_states
            | changes.custom_resources
            | changes.audits
            | {
                migration.resource_key
                for k in changes.migrations
                if (migration := state.migrations.get(k)) is not None
            }
        )
        touched: list[tuple[str, tuple[str, ...], Row | None]] = [
            *(("Lease", k[1:], state.leases.get(k)) for k in changes.leases),
            *(
                ("StorageVersion", k[1:], state.storage_versions.get(k))
                for k in changes.storage_versions
            ),
            *(("StorageState", k[1:], self._storage_state(k)) for k in storage_states),
            *(
                ("StorageVersionMigration", k[1:], state.migrations.get(k))
                for k in changes.migrations
            ),
        ]
        found: list[Change] = []
        for kind, name, row in sorted(touched, key=lambda item: (item[0], item[1])):
            row_key = (kind, name)
            previous = self.rows.get(row_key)
            if row is None:
                if previous is not None:
                    del self.rows[row_key]
                    found.append(Change(offset, "DELETED", previous, previous))
                continue
            self.rows[row_key] = row
            if previous is None:
                found.append(Change(offset, "ADDED", row, None))
            elif previous is not row and previous != row:
                found.append(Change(offset, "MODIFIED", row, previous))
        return found

    def _storage_state(self, key: ResourceKey) -> ServedStorageState | None:
        row = self.state.storage_states.get(key)
        return None if row is None else served_storage_state(self.state, row)

    def copy(self) -> ClusterFold:
        """A copy that later folds do not change: the checkpoint of this fold."""
        state = self.state
        return ClusterFold(
            cluster=self.cluster,
            partition=self.partition,
            state=State(
                leases=dict(state.leases),
                storage_versions=dict(state.storage_versions),
                storage_states=dict(state.storage_states),
                migrations=dict(state.migrations),
                seen={cluster: seen.copy() for cluster, seen in state.seen.items()},
                custom_resources=dict(state.custom_resources),
                audits=dict(state.audits),
                clusters=dict(state.clusters),
            ),
            rows=dict(self.rows),
            offset=self.offset,
        )

    def view(self, time: datetime | None = None) -> View:
        return View(
            cluster=self.cluster,
            offset=self.offset,
            time=time or self.time or datetime.now(UTC),
            state=self.state,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """The folds of a partition's clusters after every record before ``next_offset``.

    ``number`` counts the partition's checkpoints from 1, in the order they were taken;
    ``log_time``: the latest time an event before ``next_offset`` occurred at, of any
    of its clusters (None: no event yet).
    """

    number: int
    next_offset: int
    folds: dict[str, ClusterFold]
    log_time: datetime | None


def kept(number: int, taken: int, recent: int) -> bool:
    """Whether a partition keeps its ``number``-th checkpoint once ``taken`` were taken.

    The newest ``recent`` are kept, the ``2 * recent`` before them every second one, the
    ``4 * recent`` before those every fourth one, and so on: checkpoint ``number`` at age
    ``taken - number`` is kept if ``number`` is a multiple of ``2**level``, where
    ``level = floor(log2(age // recent + 1))``. A checkpoint dropped is never wanted
    again (the level only grows with age, and a multiple of ``2**(level + 1)`` is one of
    ``2**level``), so each new checkpoint prunes the list with no bookkeeping. At most
    ``recent * (log2(taken / recent + 1) + 1)`` are kept, and the kept checkpoint at or
    before any taken one is fewer than ``2 * (age // recent + 1)`` checkpoints back.
    """
    level = ((taken - number) // recent + 1).bit_length() - 1
    return number % (1 << level) == 0


class LedgerViews:
    """Every cluster's fold, followed live from the topic; and views of the past."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        checkpoint_every: int = CHECKPOINT_EVERY,
        recent_checkpoints: int = RECENT_CHECKPOINTS,
        watch_window: int = WATCH_WINDOW,
        watch_budget: int = WATCH_BUDGET,
        cached_views: int = CACHED_VIEWS,
        snapshots: SnapshotSource | None = None,
    ) -> None:
        self.settings = settings
        self.snapshots = snapshots
        self.checkpoint_every = checkpoint_every
        self.recent_checkpoints = recent_checkpoints
        self.watch_window = watch_window
        self.watch_budget = watch_budget
        self.clusters: dict[str, ClusterFold] = {}
        self.ready = asyncio.Event()
        self.events_folded = 0
        self._partitions: list[int] = []
        self._positions: dict[int, int] = {}  # next offset to read, per partition
        self._since_checkpoint: dict[int, int] = {}
        self._checkpoints: dict[int, list[Checkpoint]] = {}  # per partition, ascending
        # Of a partition started from a fold snapshot: the offset before it (no change
        # before it is kept for watches).
        self._passed_over: dict[int, int] = {}
        self._unanswered: asyncio.Future[Any] | None = None  # a snapshot read given up on
        self._changed = asyncio.Event()
        self._cache: collections.OrderedDict[tuple[str, Point], View] = collections.OrderedDict()
        self._cached_views = cached_views
        self._lock = asyncio.Lock()  # one past view built at a time: they share 2 cores

    # ------------------------------------------------------------------ following

    async def follow(self, stop: asyncio.Event) -> None:
        """Fold the topic from its beginning and keep folding until ``stop`` is set,
        waiting for a broker that is away at the start (as the other services do)."""
        started = await while_away(stop, self._start, "start reading the events topic")
        if started is None:
            return
        consumer, targets = started
        try:
            if begins := await self._start_from_snapshots(targets, stop):
                consumer.seek(begins)  # the others from the beginning
        except BaseException:
            await consumer.__aexit__(None, None, None)
            raise
        # Below these offsets renewals are thinned; the rest is folded one by one, so
        # watches can start from the tail of the log as it was at start-up.
        thinned = {p: end - self.watch_window for p, end in targets.items()}
        lag = metrics.ReaderLag(READER)
        try:
            catch_up = CatchUp(READER, targets, await consumer.positions())
            catch_up.update(self._positions)
            self._check_ready(targets)
            while not stop.is_set():
                batch = await consumer.fetch_for_fold(timeout_ms=200)
                dead: list[tuple[Message, str]] = []
                records: list[Record] = []
                for partition, messages in batch.items():
                    cut = first_at(messages, thinned.get(partition, 0))
                    dead += self._fold_thinned(partition, messages[:cut])
                    decode_messages(messages[cut:], records, dead)
                await consumer.send_dead_letters(dead)  # logged and passed over
                self._fold(records)
                if folded := sum(map(len, batch.values())) - len(dead):
                    metrics.EVENTS_FOLDED.labels(READER).inc(folded)
                await self._passed(await consumer.positions(), targets, bool(batch))
                catch_up.update(self._positions)
                lag.set(await consumer.lags())
        finally:
            lag.clear()
            self._wake()  # watches look at the stop signal
            await consumer.__aexit__(None, None, None)
            if self.snapshots is not None:
                self.snapshots.close()

    async def _start(self) -> tuple[EventConsumer, dict[int, int]]:
        """A consumer of every partition, from the beginning, and the partitions' ends
        now (read_committed): the views are ready once they have read that far."""
        consumer = await EventConsumer(
            self.settings, dead_letters=False, fetch_max_wait_ms=100
        ).__aenter__()
        try:
            async with EndOffsets(self.settings) as ends:
                self._partitions = ends.partitions
                return consumer, await ends()
        except BaseException:
            await consumer.__aexit__(None, None, None)
            raise

    def watch_share(self) -> int:
        """How many changes each cluster keeps for watches now: ``watch_window``, or its
        share of ``watch_budget`` among the clusters met so far if that is less, but at
        least :data:`~readapi.WATCH_FLOOR` (as kube-apiserver's watch cache keeps at
        least 100 events), and never more than ``watch_window``. A cluster's window is
        cut to a smaller share as its next change comes."""
        share = self.watch_budget // max(1, len(self.clusters))
        return min(self.watch_window, max(WATCH_FLOOR, share))

    def _fold(self, batch: list[Record]) -> None:
        window = self.watch_share()
        for record in batch:
            position = record.position
            cluster = record.event.meta.cluster
            fold = self.clusters.get(cluster)
            if fold is None:
                fold = self.clusters[cluster] = self._new_fold(cluster, position.partition)
                window = self.watch_share()
            fold.apply(record.event, position, window)
            self.events_folded += 1
            partition = position.partition
            self._positions[partition] = position.offset + 1
            count = self._since_checkpoint.get(partition, 0) + 1
            if count >= self.checkpoint_every:
                self._checkpoint(partition, position.offset + 1)
                count = 0
            self._since_checkpoint[partition] = count

    def _fold_thinned(
        self, partition: int, messages: Sequence[Message]
    ) -> list[tuple[Message, str]]:
        """Fold ``messages`` (``partition``'s, undecoded, in log order) with plain lease
        renewals thinned (:mod:`projections.thinning`): most are not decoded, and of a
        run of them only what one-by-one folding ends with is folded. The state and rows
        are then exactly those of :meth:`_fold`, and so are the checkpoints
        (all renewals are folded before each); the watch window keeps nothing of them, so
        a watch can start only after them. Returns the records that do not decode."""
        dead: list[tuple[Message, str]] = []
        start = 0
        while start < len(messages):
            since = self._since_checkpoint.get(partition, 0)
            end = min(len(messages), start + self.checkpoint_every - since)
            chunk = messages[start:end]
            dead += self._thin(partition, chunk)
            self._positions[partition] = chunk[-1].offset + 1
            since += len(chunk)
            if since >= self.checkpoint_every:
                self._checkpoint(partition, chunk[-1].offset + 1)
                since = 0
            self._since_checkpoint[partition] = since
            start = end
        return dead

    def _thin(self, partition: int, messages: Sequence[Message]) -> list[tuple[Message, str]]:
        by_cluster: dict[bytes | None, list[Message]] = {}
        for message in messages:
            by_cluster.setdefault(message.key, []).append(message)
        dead: list[tuple[Message, str]] = []
        for key, records in by_cluster.items():
            # A record folds only if its key is its event's cluster (else it is dead).
            name = (key or b"").decode(errors="replace")
            fold = self.clusters.get(name) or self._new_fold(name, partition)
            changes = Changes()
            thinning = Thinning(fold.state, LeaseTerms(fold.state), changes, fold.track)
            thinning.fold(records, [], None)
            thinning.finish()
            dead += thinning.dead
            if len(thinning.dead) == len(records):
                continue
            self.clusters[name] = fold
            self.events_folded += len(records) - len(thinning.dead)
            fold.offset = max(fold.offset, records[-1].offset)
            fold.horizon = max(fold.horizon, records[-1].offset)
            for lease_key in changes.leases:  # renewed, as the renewals left them
                if (lease := fold.state.leases.get(lease_key)) is not None:
                    fold.rows["Lease", lease_key[1:]] = lease
        return dead

    def _new_fold(self, cluster: str, partition: int) -> ClusterFold:
        """The fold of a cluster first met at this point of ``partition``: a partition
        started from a snapshot may have held its changes before, which are not kept."""
        return ClusterFold(cluster, partition, horizon=self._passed_over.get(partition, -1))

    def _checkpoint(self, partition: int, next_offset: int) -> None:
        folds = {
            name: fold.copy() for name, fold in self.clusters.items() if fold.partition == partition
        }
        times = [f.time for f in folds.values() if f.time is not None]
        checkpoints = self._checkpoints.get(partition, [])
        taken = checkpoints[-1].number + 1 if checkpoints else 1  # the newest is always kept
        newest = Checkpoint(taken, next_offset, folds, max(times, default=None))
        if self.snapshots is not None:
            # The projector's fold snapshots are the checkpoints of the past: a view of a
            # point before this one starts from the latest at or before it.
            self._checkpoints[partition] = [newest]
            return
        self._checkpoints[partition] = [
            *(c for c in checkpoints if kept(c.number, taken, self.recent_checkpoints)),
            newest,
        ]

    # ------------------------------------------------------------------ snapshots

    async def _start_from_snapshots(
        self, targets: Mapping[int, int], stop: asyncio.Event
    ) -> dict[int, int]:
        """Start each partition's folds from its latest sound fold snapshot at or before
        its end in ``targets`` (with ``--snapshots-from``); the offset each such partition
        is read on from. A partition with none is read from its beginning, with a warning."""
        begins: dict[int, int] = {}
        if self.snapshots is None:
            return begins
        for partition, end in sorted(targets.items()):
            if end == 0:
                continue
            found = await self._snapshot(partition, end, _KNOWN_LOG_TIME, stop)
            if found is None:
                log.warning(
                    "%s: partition %d is folded from the log's beginning (%d records): no"
                    " sound fold snapshot of it was found in %s",
                    READER,
                    partition,
                    end,
                    self.snapshots.shown,
                )
                continue
            snapshot, rows = found
            self._start_from(snapshot, rows)
            begins[partition] = snapshot.next_offset
            log.info(
                "%s: partition %d starts from its fold snapshot at offset %d (the log ends at %d)",
                READER,
                partition,
                snapshot.next_offset,
                end,
            )
        return begins

    def _start_from(self, snapshot: Snapshot, rows: Rows) -> None:
        """The folds of ``snapshot``'s partition: its clusters' states, as the fold of every
        record before it left them. Its records are passed over as records folded thinned
        are: no change of them is kept for watches."""
        partition, offset = snapshot.partition, snapshot.next_offset
        for cluster, cluster_rows in _by_cluster(rows).items():
            self.clusters[cluster] = _fold_of(cluster, partition, cluster_rows, offset)
        self._passed_over[partition] = offset - 1
        self._positions[partition] = offset
        self._checkpoint(partition, offset)

    async def _snapshot(
        self,
        partition: int,
        limit: int,
        until_time: datetime | None,
        stop: asyncio.Event | None = None,
    ) -> tuple[Snapshot, Rows] | None:
        """The latest sound fold snapshot of ``partition`` a fold up to ``limit`` (and
        ``until_time``) may start from, read in a thread of its own
        (:func:`~ledger.tasks.in_daemon_thread`); None (the log's beginning) without
        snapshots, for none, for a database that cannot be read (logged by
        :class:`~projections.snapshots.SnapshotSource`), or that does not answer within
        :data:`SNAPSHOT_WAIT_SECONDS`, or once ``stop`` is set. While a read given up on is
        still unanswered, the database is not asked again."""
        snapshots = self.snapshots
        if snapshots is None or (stop is not None and stop.is_set()):
            return None
        if self._unanswered is not None and not self._unanswered.done():
            log.warning(
                "%s: %s has still not answered, so partition %d is read from the log's beginning",
                READER,
                snapshots.shown,
                partition,
            )
            return None
        reading = in_daemon_thread(
            functools.partial(snapshots.find, self.settings.topic, partition, limit, until_time),
            name=f"svledger-serve-snapshot-{partition}",
        )
        reading.add_done_callback(retrieved)  # its answer may come when no one waits
        stopped = asyncio.ensure_future((stop or asyncio.Event()).wait())
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
        if stopped.done():
            return None
        log.warning(
            "%s: no answer from %s within %.0f s for the fold snapshots of partition %d, so"
            " it is read from the log's beginning",
            READER,
            snapshots.shown,
            SNAPSHOT_WAIT_SECONDS,
            partition,
        )
        return None

    async def _passed(
        self, positions: Mapping[int, int], targets: Mapping[int, int], folded: bool
    ) -> None:
        """Record how far each partition is read (control records included); wake watchers."""
        moved = folded
        for partition, position in positions.items():
            moved |= self._positions.get(partition) != position
            self._positions[partition] = position
        if not moved:
            return
        for fold in self.clusters.values():
            fold.offset = max(fold.offset, self._positions.get(fold.partition, 0) - 1)
        self._check_ready(targets)
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _check_ready(self, targets: Mapping[int, int]) -> None:
        if not self.ready.is_set() and all(
            self._positions.get(partition, 0) >= end for partition, end in targets.items()
        ):
            self.ready.set()

    async def changed(self, timeout: float) -> None:
        """Return when the next batch is folded, or after ``timeout`` seconds."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    # ------------------------------------------------------------------ reading

    def fold(self, cluster: str) -> ClusterFold:
        fold = self.clusters.get(cluster)
        if fold is None:
            if not self.ready.is_set():
                raise NotCaughtUp(
                    f"cluster {cluster!r} is not folded yet: the views have not read topic "
                    f"{self.settings.topic} up to its end yet; try again once /readyz is ok"
                )
            known = ", ".join(sorted(self.clusters)[:10]) or "none yet"
            raise UnknownCluster(
                f"cluster {cluster!r} has no events in topic {self.settings.topic} "
                f"(clusters with events: {known})"
            )
        return fold

    async def view_at(self, cluster: str, point: Point) -> View:
        """The cluster as it stood at ``point`` (an offset in its partition, or a time)."""
        live = self.fold(cluster)
        if isinstance(point, int) and point >= live.offset:
            if point > live.offset:
                raise PointOutOfRange(
                    f"offset {point} is beyond the log: cluster {cluster!r} is folded up to "
                    f"offset {live.offset} of partition {live.partition}"
                )
            return live.view()
        key = (cluster, point)
        if (cached := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            return cached
        async with self._lock:
            view, final = await self._build(live, point)
        if final:
            self._cache[key] = view
            while len(self._cache) > self._cached_views:
                self._cache.popitem(last=False)
        return view

    async def _build(self, live: ClusterFold, point: Point) -> tuple[View, bool]:
        """The view at ``point``, and whether it is final: a later record cannot change
        it (an offset the log has reached; a time the partition has an event after)."""
        checkpoint, stop = self._checkpoint_around(live, point)
        fold = ClusterFold(live.cluster, live.partition)
        begin = 0
        if checkpoint is not None:
            begin = checkpoint.next_offset
            if (start := checkpoint.folds.get(live.cluster)) is not None:
                fold = start.copy()
        elif (found := await self._snapshot(live.partition, stop, _cut_time(point))) is not None:
            # Older than any fold kept here: from the projector's snapshot before it.
            snapshot, rows = found
            begin = snapshot.next_offset
            fold = _fold_of(live.cluster, live.partition, rows, begin)
        cut = await self._refold(fold, point, begin, stop) if begin < stop else None
        if isinstance(point, int):
            fold.offset = point
            return fold.view(), True
        # The view holds the partition up to its cut (or up to ``stop``), wherever the
        # fold started from (a checkpoint, a snapshot): its resourceVersion says so.
        fold.offset = (stop if cut is None else cut) - 1
        return fold.view(time=point), cut is not None

    def _checkpoint_around(self, live: ClusterFold, point: Point) -> tuple[Checkpoint | None, int]:
        """The latest checkpoint at or before ``point``, and the offset to read up to.

        For an offset that is the offset after it. For a time it is the first
        checkpoint before which an event of the partition occurred after that time (the
        cut is before that checkpoint), else the live position.
        """
        checkpoints = self._checkpoints.get(live.partition, [])
        if isinstance(point, int):
            offsets = [checkpoint.next_offset for checkpoint in checkpoints]
            index = bisect.bisect_right(offsets, point + 1) - 1
            return (checkpoints[index] if index >= 0 else None), point + 1
        found = None
        for checkpoint in checkpoints:
            if checkpoint.log_time is not None and checkpoint.log_time > point:
                return found, checkpoint.next_offset
            found = checkpoint
        return found, self._positions.get(live.partition, live.offset + 1)

    async def _refold(self, fold: ClusterFold, point: Point, begin: int, stop: int) -> int | None:
        """Fold the cluster's records from ``begin`` to ``stop`` (or, for a time, to the
        partition's first event after it, the other clusters' records passed over
        undecoded); the offset of that cut, if it was found."""
        partition = fold.partition
        key = fold.cluster.encode()
        limit = micros(point) if isinstance(point, datetime) else None
        async with (
            EventConsumer(
                self.settings,
                partitions=[partition],
                start_offsets=lambda _: {partition: begin},
                until={partition: stop},
                dead_letters=False,
            ) as consumer,
            contextlib.aclosing(consumer.batches_for_fold()) as batches,
        ):
            async for batch in batches:
                for message in batch.get(partition, ()):
                    if limit is not None:
                        moment = message_time(message)
                        if moment is not None and moment > limit:
                            cut: int = message.offset
                            return cut
                    if message.key == key:
                        record = decode_message(message)
                        if isinstance(record, Record):
                            fold.apply(record.event, record.position, window=0)
        return None


def _cut_time(point: Point) -> datetime | None:
    return point if isinstance(point, datetime) else None


def _by_cluster(rows: Rows) -> dict[str, Rows]:
    """A snapshot's rows (of its partition's clusters) by cluster."""
    groups: tuple[tuple[Any, ...], ...] = rows
    split: dict[str, tuple[list[Any], ...]] = {}
    for index, group in enumerate(groups):
        for row in group:
            split.setdefault(row.cluster, tuple([] for _ in groups))[index].append(row)
    return {cluster: cast(Rows, tuple(map(tuple, lists))) for cluster, lists in split.items()}


def _fold_of(cluster: str, partition: int, rows: Rows, next_offset: int) -> ClusterFold:
    """``cluster``'s fold from a snapshot's ``rows``, up to (not including) ``next_offset``:
    the state is exactly the one the fold of every record before ``next_offset`` leaves
    (with each row's creation and the cluster's latest event time), and the served rows
    follow from it."""
    state = state_of([rows], cluster)
    served: dict[RowKey, Row] = {
        **{("Lease", key[1:]): row for key, row in state.leases.items()},
        **{("StorageVersion", key[1:]): row for key, row in state.storage_versions.items()},
        **{
            ("StorageState", key[1:]): served_storage_state(state, row)
            for key, row in state.storage_states.items()
        },
        **{("StorageVersionMigration", key[1:]): row for key, row in state.migrations.items()},
    }
    return ClusterFold(
        cluster,
        partition,
        state,
        rows=served,
        offset=next_offset - 1,
        horizon=next_offset - 1,
    )


async def timeline_page(settings: KafkaSettings, cluster: str, name: str) -> str:
    """The timeline page of resource ``name`` in ``cluster``, from the cluster's log now.

    Reads the cluster's whole partition, so it costs a replay of that partition.
    """
    state, records = await cluster_log(settings, cluster)
    if not records:
        raise UnknownCluster(
            f"cluster {cluster!r} has no events in topic {settings.topic}; check the cluster's"
            " name (as its reporters or collector give it) and the topic"
        )
    known = (
        set(state.storage_versions)
        | set(state.storage_states)
        | {migration.resource_key for migration in state.migrations.values()}
        | set(state.custom_resources)
    )
    names = ", ".join(sorted(resource_name(group, resource) for _, group, resource in known))
    _, group, resource = resolve(
        name,
        cluster,
        known,
        source=f"topic {settings.topic}",
        advice=f"pick one the cluster has events of: {names or 'none yet'}",
    )
    folded = [(record.event, record.position) for record in records]
    return timeline.render(cluster, group, resource, folded)
