"""``svledger collect``: the ledger's source for real Kubernetes clusters, one or a fleet.

kube-apiservers are Go programs that cannot embed the reporter, but they publish the
same facts: an identity Lease each in ``kube-system``, and (``StorageVersionAPI``)
their ``serverStorageVersions`` entries in a StorageVersion object per resource. The
collector watches both, and each apiserver's discovery (:mod:`kube.watch`), and appends
what the ledger lacks (:mod:`kube.upstream` says what that is; this module only moves
data).

**One writer per cluster.** The collector follows the log with
:class:`~consumers.partitions.PartitionFollower` as a member of a consumer group and
appends through the transactional producer of the partition that holds the cluster's
events. Starting that producer fences every earlier collector of the partition in the
group (a zombie, a second copy started by mistake), and the partition's fold is rebuilt
up to the log's end as of that moment before anything is decided, so the ledger state
the collector compares with includes everything any earlier collector ever appended: a
restarted collector appends only what is missing, and two collectors never both append.
The collector decides on a partition only once it is caught up with its own last append.

**Fleets.** ``--cluster NAME`` collects one cluster in a group of its own,
``svledger-collector.NAME``; ``--fleet PATH`` collects every cluster of a fleet
(:mod:`kube.fleet`) in one process, in the group ``svledger-collector`` (or ``--group``).
Every process of a fleet's group is given the same fleet; the group deals the topic's
partitions among them, and each process collects the clusters placed in the partitions
it holds (:class:`Collector`): it watches them (:class:`Collection`, one task per
cluster, with its own back-off) from the moment it holds the partition, and lets them go
when a rebalance gives the partition to another member. A process that dies (``kill
-9``) leaves the group once its session times out; its partitions are dealt to the
others, whose new producers fence it, and whose rebuilt folds hold everything it
committed: they take its clusters over, appending what it had not. So each cluster has
one writer at a time, as with ``--cluster``, and a fleet of N clusters needs as many
processes as its load needs, not N. Requests other than watches (lists, discovery reads)
share ``--concurrency`` slots across the fleet's clients, so a thousand clusters
starting at once do not all list at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Final

from consumers.partitions import Folded, PartitionFollower, PartitionLost
from kube.client import Kube
from kube.fleet import FLEET_READ_SECONDS, Source
from kube.upstream import reconcile
from kube.watch import MAX_BACKOFF_SECONDS, ClusterWatch, Discovery, sleep_or_stop
from ledger import metrics
from ledger.clock import Clock
from ledger.errors import UsageError
from ledger.events import Event
from ledger.identity import SHUTDOWN_WINDOW_SECONDS
from ledger.kafka import BROKER_ERRORS, Placements
from ledger.logcontext import about
from ledger.settings import KafkaSettings
from projections.snapshots import SnapshotSource

log = logging.getLogger(__name__)

GROUP_ID: Final = "svledger-collector"
HOLD_SECONDS: Final = 1.0  # how often the clusters collected are held against the assignment


async def run_collector(
    settings: KafkaSettings,
    cluster: str,
    kube: Kube,
    *,
    stop: asyncio.Event,
    clock: Clock,
    group_id: str = GROUP_ID,
    apiservers: Mapping[str, Kube] | None = None,
    renewal_interval: timedelta = timedelta(0),
    snapshots: SnapshotSource | None = None,
    shutdown_window: float = SHUTDOWN_WINDOW_SECONDS,
) -> None:
    """Collect ``cluster``'s apiserver leases and storage versions until ``stop`` is set,
    in a group of its own (``<group_id>.<cluster>``), through ``kube`` (its caller's to
    close, as are ``apiservers``).

    ``apiservers`` (apiserver ID -> a client that reaches that apiserver itself, not
    through a load balancer) adds custom resources, from each one's discovery.
    ``snapshots``: the projector's database, to rebuild partitions from their latest
    fold snapshots instead of the log's beginning (:mod:`consumers.partitions`).
    """

    async def given() -> Kube:
        return kube

    source = Source(given, apiservers or {}, owned=False)
    collector = Collector(
        settings,
        lambda: {cluster: source},
        group_id=f"{group_id}.{cluster}",
        clock=clock,
        renewal_interval=renewal_interval,
        snapshots=snapshots,
        shutdown_window=shutdown_window,
    )
    await collector.run(stop)


class Collection:
    """One cluster this process collects, from when it holds the cluster's partition until
    it lets the cluster go (:meth:`close`): its :class:`ClusterWatch` and
    :class:`Discovery`, once its client is open. A client that cannot be opened (a
    kubeconfig being rewritten, an exec plugin missing) is tried again, backing off, as
    is a watch that fails unexpectedly; the other clusters go on meanwhile. Everything
    it logs names the cluster (:mod:`ledger.logcontext`)."""

    def __init__(self, name: str, source: Source, clock: Clock, shutdown_window: float) -> None:
        self.name = name
        self.source = source
        self.watch: ClusterWatch | None = None
        self.discovery: Discovery | None = None
        self.told: set[str] = set()  # problems logged once each
        with about(name):
            self._task = asyncio.create_task(
                self._run(clock, shutdown_window), name=f"svledger-collect-{name}"
            )

    def due(self, touched: set[str]) -> bool:
        """Whether the ledger is to be compared with the cluster: both watched lists are
        synced, and the cluster changed or the ledger's events of it did (``touched``)."""
        watch = self.watch
        return (
            watch is not None and watch.synced and (watch.changed.is_set() or self.name in touched)
        )

    async def _run(self, clock: Clock, shutdown_window: float) -> None:
        backoff = 0.5
        while True:
            try:
                kube = await self.source.open()
            except UsageError as error:
                log.warning(
                    "cannot address cluster %s: %s; trying again in %.0f s",
                    self.name,
                    error,
                    backoff,
                )
            else:
                try:
                    self.discovery = Discovery(kube, clock, self.source.apiservers.values())
                    self.watch = ClusterWatch(kube, self.source.apiservers, shutdown_window)
                    await self.watch.run(asyncio.Event())  # until closed
                except Exception:
                    log.exception(
                        "collecting cluster %s failed; starting again in %.0f s",
                        self.name,
                        backoff,
                    )
                finally:
                    self.watch = self.discovery = None
                    if self.source.owned:
                        await kube.close()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class Collector:
    """Collects each cluster ``clusters()`` names whose partition this member of
    ``group_id`` holds (the module docstring, "Fleets").

    ``clusters`` is asked again every :data:`~kube.fleet.FLEET_READ_SECONDS`; once it
    has answered, one that fails (:class:`~ledger.errors.UsageError`) keeps the clusters
    of its last answer.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        clusters: Callable[[], Mapping[str, Source]],
        *,
        group_id: str,
        clock: Clock,
        renewal_interval: timedelta = timedelta(0),
        snapshots: SnapshotSource | None = None,
        shutdown_window: float = SHUTDOWN_WINDOW_SECONDS,
    ) -> None:
        self.group_id = group_id
        self.collections: dict[str, Collection] = {}
        self._clusters = clusters
        self._sources: dict[str, Source] = {}
        self._homes: dict[str, int] = {}  # cluster -> the partition of its events
        self._clock = clock
        self._renewal_interval = renewal_interval
        self._shutdown_window = shutdown_window
        self._placements = Placements(settings)
        self._follower = PartitionFollower(
            settings,
            group_id=group_id,
            transactional_prefix=f"{group_id}-{settings.topic}",
            snapshots=snapshots,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Collect until ``stop`` is set, or either half fails (the placement topic is
        missing, say): following the log, or keeping the clusters collected in step with
        the fleet and the assignment."""
        self._read()
        try:
            async with self._follower:
                halves = {
                    asyncio.create_task(self._follow(stop), name="svledger-collector-follow"),
                    asyncio.create_task(self._keep(stop), name="svledger-collector-keep"),
                }
                try:
                    done, _ = await asyncio.wait(halves, return_when=asyncio.FIRST_EXCEPTION)
                    for half in done:
                        half.result()  # what failed
                    await asyncio.gather(*halves)  # both end once stop is set
                finally:
                    for half in halves:
                        half.cancel()
                    await asyncio.gather(*halves, return_exceptions=True)
        finally:
            await asyncio.gather(*(c.close() for c in self.collections.values()))
            self.collections.clear()
            metrics.COLLECTED_CLUSTERS.labels(self.group_id).set(0)

    async def _follow(self, stop: asyncio.Event) -> None:
        async for folded in self._follower.batches(stop):
            await self._reconcile(folded)

    def _read(self) -> None:
        try:
            sources = dict(self._clusters())
        except UsageError as error:
            if not self._sources:
                raise
            log.warning("%s; collecting the clusters read before", error)
            return
        added = sorted(sources.keys() - self._sources.keys())
        removed = sorted(self._sources.keys() - sources.keys())
        if self._sources and (added or removed):
            log.info(
                "the fleet changed: %d clusters added (%s), %d removed (%s)",
                len(added),
                ", ".join(added) or "none",
                len(removed),
                ", ".join(removed) or "none",
            )
        self._sources = sources

    async def _keep(self, stop: asyncio.Event) -> None:
        """Read the fleet again now and then, place its clusters, and collect those whose
        partitions the group gives this member: started as a partition comes (taken
        over from a member that left, say), let go as it goes."""
        loop = asyncio.get_running_loop()
        read_at = loop.time()
        while not stop.is_set():
            if loop.time() - read_at >= FLEET_READ_SECONDS:
                read_at = loop.time()
                self._read()
            unplaced = self._sources.keys() - self._homes.keys()
            if unplaced:
                try:  # placed now, as the writer of their first events
                    self._homes.update(await self._placements.where(unplaced, place=True))
                except BROKER_ERRORS as error:
                    log.warning(
                        "cannot tell the partitions of %d clusters yet: %s", len(unplaced), error
                    )
            await self._hold(self._follower.assigned())
            await sleep_or_stop(stop, HOLD_SECONDS)

    async def _hold(self, assigned: set[int]) -> None:
        wanted = {
            name: source
            for name, source in self._sources.items()
            if self._homes.get(name) in assigned
        }
        for name, collection in list(self.collections.items()):
            if wanted.get(name) is not collection.source:
                del self.collections[name]
                log.info(
                    "letting cluster %s go: %s",
                    name,
                    "its kubeconfig changed"
                    if name in wanted
                    else "it left the fleet"
                    if name not in self._sources
                    else f"partition {self._homes[name]} is another member's now",
                )
                await collection.close()
        for name, source in sorted(wanted.items()):
            if name not in self.collections:
                log.info("collecting cluster %s (partition %d)", name, self._homes[name])
                self.collections[name] = Collection(
                    name, source, self._clock, self._shutdown_window
                )
        metrics.COLLECTED_CLUSTERS.labels(self.group_id).set(len(self.collections))

    async def _reconcile(self, folded: Folded) -> None:
        """Append what the ledger lacks of each due cluster of the folded partition, in
        one transaction."""
        partition_log = folded.log
        if not partition_log.caught_up:
            return
        touched = {event.meta.cluster for event, _ in folded.events}
        due = [
            collection
            for name, collection in self.collections.items()
            if self._homes.get(name) == partition_log.partition and collection.due(touched)
        ]
        for collection in due:
            assert collection.watch is not None
            collection.watch.changed.clear()
        await asyncio.gather(*map(_refresh, due))
        events: list[Event] = []
        now = self._clock.now()
        for collection in due:
            watch, discovery = collection.watch, collection.discovery
            if watch is None or discovery is None:  # its client closed meanwhile
                continue
            with about(collection.name):
                found, problems = reconcile(
                    partition_log.state,
                    collection.name,
                    watch.snapshot,
                    discovery.kind_of,
                    now,
                    self._renewal_interval,
                )
                for problem in problems:
                    if problem not in collection.told:
                        collection.told.add(problem)
                        log.warning("cannot report yet: %s", problem)
            if problems:
                watch.changed.set()  # try again once discovery is read again
            events += found
        if not events:
            return
        try:
            await partition_log.commit(events)  # which logs what it appended
        except PartitionLost:
            for collection in due:
                if collection.watch is not None:
                    collection.watch.changed.set()


async def _refresh(collection: Collection) -> None:
    if collection.discovery is not None:
        with about(collection.name):
            await _guard(collection.discovery.refresh, "discovery")


async def _guard(action: Callable[[], Awaitable[None]], what: str) -> None:
    try:
        await action()
    except Exception as error:
        log.warning("%s failed: %s; retried at the next change", what, error)
