"""A simulated HA control plane on the real ledger: ``svledger simulate SCENARIO.yaml``.

What is real: each simulated apiserver embeds the real :class:`~ledger.reporter.Reporter`
(heartbeats, storage-version reports, the write gate) on the real Kafka broker, and the
real projector, migration trigger, migration worker and lease GC run beside them as
asyncio tasks on the same topic and database. What is simulated is the rest of the
cluster (:mod:`simulation.cluster`): etcd (a SQL table of objects with the version
each is encoded in), the apiservers' request handling, the load balancer, the clients.

**Time is virtual.** One :class:`~ledger.clock.VirtualClock` is shared by everything
that acts on time. The run advances it in steps (``step_seconds``, shorter when a
timeline action falls inside a step) and after each step waits until the system is
*quiescent*:

* the run's own reader of the log has read every record appended to it, so no
  transaction is open (a committed transaction's markers may land after its commit
  returned), and the projector's checkpoint has passed the cluster's last record;
* the migration trigger owes nothing: its rule (:func:`consumers.migrator.decide`, a pure
  function of the folded log) asks for no event on the log as it stands;
* the worker has no active migration, or is waiting for the next step's request
  allowance (:class:`~simulation.cluster.Allowance`).

Only then does time move on, so a run takes as long as its work, not as long as its
virtual hour, and a scenario gives the same timeline on every run: every random choice
(which apiserver serves a request, which object a client writes, heartbeat jitter)
comes from the scenario's seed. One thing stays up to the broker's timing: how the
trigger's polls split the events of one instant. Of two apiservers started together,
the first one's report may be decided on alone, drawing a request that the second
one's report then replaces; each was decided on the StorageVersion as it then stood,
and the checks judge a request by the revision it names, so they hold either way.

**Processes.** ``start`` creates a new apiserver process (a new reporter, so a new
holder identity); ``upgrade`` and ``rollback`` stop it gracefully (lease released) and
start a new process on the other binary; ``stop`` releases; ``crash`` freezes the
process, so its lease stays until the lease GC expires it. A frozen process's tasks go
back to sleep on the virtual clock for ever (advancing the clock must not wait for a
process that will never run again) and are cancelled when the run ends.

**Triggers.** ``agreement`` runs the ledger's migration trigger
(:mod:`consumers.migrator`). ``discovery-hash`` replaces it by the trigger of the
automated-migration KEP without its HA extension (:class:`DiscoveryHashTrigger`).
Its requests go through the same ledger, whose fold refuses a success that is stale
(the StorageVersion changed since the request), so the run measures pollution against
both StorageStates: the one the old trigger believes in, and the ledger's.

**Parts.** :mod:`simulation.scenario` reads the scenario; :mod:`simulation.cluster` is
the simulated data plane and the apiserver processes; :mod:`simulation.baseline` the
old trigger; :mod:`simulation.checks` the run's own fold of the log and the pollution
count; :mod:`simulation.report` the timeline and the check as printed. This module
steps virtual time and drives them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

from sqlalchemy import Engine, func, select

from consumers import migrator
from consumers.lease_gc import run_lease_gc
from consumers.migrator import run_migrator
from consumers.worker import Rewriter, next_migration, run_worker
from ledger.clock import VirtualClock
from ledger.errors import Unavailable, UsageError
from ledger.events import (
    ApiserverLeaseExpired,
    Meta,
    MigrationCancelled,
    MigrationFailed,
    MigrationRequested,
    MigrationSucceeded,
)
from ledger.hashing import storage_version_hash
from ledger.identity import apiserver_id
from ledger.kafka import EventProducer, Record, create_topics
from ledger.names import split_group_version
from ledger.settings import KafkaSettings
from projections import database
from projections.projector import run_projector
from projections.schema import ledger_events, projection_checkpoints
from projections.state import ResourceKey, State
from projections.store import load_state
from simulation.baseline import DiscoveryHashTrigger
from simulation.checks import LogMirror, latest_migration, polluted
from simulation.cluster import SimCluster
from simulation.report import TRIGGERS, SimulationResult, TimelineRow, Trigger, render
from simulation.scenario import Resource, Scenario, load

log = logging.getLogger(__name__)


VIRTUAL_START: Final = datetime(2024, 1, 1, tzinfo=UTC)
PROJECTION: Final = "views"
SETTLE_TIMEOUT_SECONDS: Final = 60.0


class SimulationError(UsageError):
    """The simulation cannot run as asked (its cluster is not its own)."""


class NeverSettled(Unavailable):
    """The simulated system did not come to rest: the broker or the database lags."""


async def simulate(
    scenario: str | Path | Scenario,
    settings: KafkaSettings,
    db_url: str,
    *,
    trigger: Trigger = "agreement",
    out: TextIO | None = sys.stdout,
) -> SimulationResult:
    """Run a scenario on the broker of ``settings`` and the database ``db_url``.

    Creates the topics and the schema if needed. The scenario's cluster must be new to
    both (its name keys every event). Writes the timeline and the pollution check to
    ``out`` (None: nothing) and returns them.
    """
    if trigger not in TRIGGERS:
        raise ValueError(f"unknown trigger {trigger!r}; choose one of {', '.join(TRIGGERS)}")
    model = scenario if isinstance(scenario, Scenario) else load(scenario)
    await create_topics(settings)
    database.upgrade(db_url)
    db = database.engine(db_url)
    try:
        result = await _Run(model, settings, db, db_url, trigger).run()
    finally:
        db.dispose()
    if out is not None:
        out.write(render(result))
    return result


class _Run:
    def __init__(
        self, scenario: Scenario, settings: KafkaSettings, db: Engine, db_url: str, trigger: Trigger
    ) -> None:
        self.scenario = scenario
        self.settings = settings
        self.db = db
        self.db_url = db_url
        self.trigger: Trigger = trigger
        self.clock = VirtualClock(VIRTUAL_START)
        self.rng = random.Random(scenario.seed)
        self.cluster = SimCluster(scenario, db, self.clock, self.rng)
        self.baseline = (
            DiscoveryHashTrigger(
                scenario.cluster,
                scenario.resources,
                self.cluster.balancer,
                random.Random(self.rng.getrandbits(64)),
            )
            if trigger == "discovery-hash"
            else None
        )
        self.mirror = LogMirror(settings, scenario.cluster)
        self.hostnames = {apiserver_id(a.hostname): a.hostname for a in scenario.apiservers}
        # Every migration requested so far: its resource and target version. The state
        # drops a resource's ended migrations on its next request, within a step too.
        self.requested: dict[str, tuple[ResourceKey, str]] = {}
        self.versions = {
            storage_version_hash(r.group, version, r.kind): version
            for binary in scenario.binaries.values()
            for r in scenario.resources
            for version in binary.encodings[r.name].decodable_versions
        }

    async def run(self) -> SimulationResult:
        stop = asyncio.Event()
        async with EventProducer(self.settings) as producer, self.mirror:
            self.producer = producer
            await self._refuse_used_cluster()
            self.cluster.store.clear()
            tasks = [
                asyncio.create_task(run, name=f"svledger-simulation-{name}")
                for name, run in self._consumers(stop).items()
            ]
            try:
                return await self._timeline(tasks)
            finally:
                self.cluster.put_to_sleep()
                stop.set()
                self.cluster.allowance.grant(0)  # wake a worker waiting for requests: it sees stop
                _, late = await asyncio.wait(tasks, timeout=30)
                for task in late:
                    log.warning("%s did not stop within 30 s; cancelling it", task.get_name())
                    task.cancel()
                await asyncio.wait(tasks, timeout=30)

    async def _refuse_used_cluster(self) -> None:
        async def unread() -> str | None:
            return None if await self.mirror.caught_up() else "the end of the topic"

        await self._wait_for(unread, "reading the topic")
        cluster = self.scenario.cluster
        with self.db.connect() as connection:
            projected = connection.execute(
                select(func.count()).where(ledger_events.c.cluster == cluster)
            ).scalar_one()
        if self.mirror.records or projected:
            raise SimulationError(
                f"cluster {cluster!r} already has events in topic {self.settings.topic!r}"
                f" ({len(self.mirror.records)}) or in the database ({projected}): a simulation"
                " needs a cluster of its own; rename the scenario's cluster, or use a fresh"
                " topic (SVLEDGER_TOPIC) and database"
            )

    def _consumers(self, stop: asyncio.Event) -> dict[str, Coroutine[Any, Any, object]]:
        # Consumer groups of their own, so a simulation never joins a real deployment's.
        def group(name: str) -> str:
            return f"svledger-simulation-{name}.{self.settings.topic}"

        consumers: dict[str, Coroutine[Any, Any, object]] = {
            "projector": run_projector(
                self.settings, self.db_url, projection=PROJECTION, stop=stop, group=False
            ),
            "worker": run_worker(
                self.settings,
                Rewriter(self.cluster.target, self.clock),
                stop=stop,
                group_id=group("worker"),
                current_only=self.trigger == "agreement",
            ),
            "lease-gc": run_lease_gc(
                self.settings,
                stop=stop,
                clock=self.clock,
                check_period=self.scenario.lease_gc_check_period_seconds,
                group_id=group("lease-gc"),
            ),
        }
        if self.trigger == "agreement":
            consumers["migrator"] = run_migrator(
                self.settings, stop=stop, group_id=group("migrator")
            )
        return consumers

    # --- the step loop ---

    async def _timeline(self, tasks: Sequence[asyncio.Future[object]]) -> SimulationResult:
        s = self.scenario
        pending = list(s.timeline)
        rows: list[TimelineRow] = []
        shown: dict[str, tuple[object, ...]] = {}
        worst: Counter[str] = Counter()
        ledger_worst: Counter[str] = Counter()
        final: dict[str, TimelineRow] = {}
        seen = 0
        now = 0
        next_poll = 0
        while True:
            actions: list[str] = []
            while pending and pending[0].at_seconds <= now:
                described = await self.cluster.act(pending.pop(0), self.producer)
                if described is not None and described not in actions:
                    actions.append(described)
            await self._settle(now, tasks)
            if self.baseline is not None and now >= next_poll:
                next_poll += s.discovery_poll_seconds
                requests = self.baseline.poll(self.mirror.state, self.clock.now())
                if requests:
                    await self.producer.send_many(requests)
                    await self._settle(now, tasks)
            self.mirror.check_active()
            with self.db.connect() as connection:
                views = load_state(connection)
            if self.baseline is not None:
                self.baseline.observe(views)
            fresh, seen = self.mirror.records[seen:], len(self.mirror.records)
            for resource in s.resources:
                row = self._row(now, resource, views, actions, fresh)
                worst[resource.name] = max(worst[resource.name], row.polluted)
                ledger_polluted = polluted(resource, self._persisted(views, resource), row.stored)
                ledger_worst[resource.name] = max(ledger_worst[resource.name], ledger_polluted)
                final[resource.name] = row
                key = (
                    row.encoding_versions,
                    row.common_version,
                    row.persisted_versions,
                    row.baseline_persisted_versions,
                    row.migration,
                )
                if row.events or key != shown.get(resource.name):
                    rows.append(row)
                shown[resource.name] = key
            if now >= s.end_seconds:
                break
            following = min(now + s.step_seconds, s.end_seconds)
            if pending:
                following = min(following, pending[0].at_seconds)
            self.cluster.allowance.grant(following - now)
            await self.clock.advance(following - now)
            now = following
        return SimulationResult(
            cluster=s.cluster,
            trigger=self.trigger,
            apiservers=tuple(a.hostname for a in s.apiservers),
            rows=tuple(rows),
            polluted_objects=sum(worst.values()),
            ledger_polluted_objects=sum(ledger_worst.values()),
            migrations_while_disagreeing=tuple(sorted(self.mirror.disagreeing)),
            final_persisted_versions={name: row.persisted_versions for name, row in final.items()},
            final_stored={name: row.stored for name, row in final.items()},
            refused_writes=self.cluster.refused_writes,
            events=len(self.mirror.records),
        )

    # --- quiescence ---

    async def _settle(self, now: int, tasks: Sequence[asyncio.Future[object]]) -> None:
        async def unsettled() -> str | None:
            for task in tasks:
                if task.done():
                    task.result()  # a consumer that died fails the run with its error
            return await self._unsettled()

        await self._wait_for(unsettled, f"the system to come to rest at minute {now / 60:g}")

    async def _unsettled(self) -> str | None:
        """What the system is still doing (None: it is at rest)."""
        if not await self.mirror.caught_up():
            return "reading the log"
        state = self.mirror.state
        read = len(self.mirror.records)
        if read:
            last = self.mirror.records[read - 1].position
            with self.db.connect() as connection:
                checkpoint = connection.execute(
                    select(projection_checkpoints.c.next_offset).where(
                        projection_checkpoints.c.projection == PROJECTION,
                        projection_checkpoints.c.topic == self.settings.topic,
                        projection_checkpoints.c.log_partition == last.partition,
                    )
                ).scalar_one_or_none()
            if checkpoint is None or checkpoint <= last.offset:
                return f"the projector (at {checkpoint}) to reach the last record ({last})"
        if self.trigger == "agreement":
            cause = Meta.new(self.scenario.cluster, "simulation", self.clock.now())
            for key in map(self._key, self.scenario.resources):
                owed = migrator.decide(state, key, cause)
                if owed:
                    return f"the migration trigger to append {[type(e).__name__ for e in owed]}"
        running = next_migration(state, current_only=self.trigger == "agreement")
        if running is not None and not self.cluster.allowance.waiting:
            return f"the worker to run migration {running.migration_id} ({running.phase})"
        # Nothing may have been appended while this was checked.
        if len(self.mirror.records) != read or not await self.mirror.caught_up():
            return "reading the log"
        return None

    async def _wait_for(self, pending: Callable[[], Awaitable[str | None]], what: str) -> None:
        deadline = asyncio.get_running_loop().time() + SETTLE_TIMEOUT_SECONDS
        while (waiting := await pending()) is not None:
            if asyncio.get_running_loop().time() > deadline:
                raise NeverSettled(
                    f"gave up waiting for {what} after {SETTLE_TIMEOUT_SECONDS:g} s, still"
                    f" waiting for {waiting}; check that the broker at"
                    f" {self.settings.bootstrap_servers!r} and the database are healthy"
                )
            await asyncio.sleep(0.005)

    # --- what a row shows ---

    def _key(self, resource: Resource) -> ResourceKey:
        return (self.scenario.cluster, resource.group, resource.resource)

    def _shown(self, hashes: Iterable[str]) -> tuple[str, ...]:
        return tuple(self.versions.get(h, h) for h in hashes)

    def _persisted(self, views: State, resource: Resource) -> tuple[str, ...]:
        """The ledger's persisted hashes of ``resource``."""
        storage_state = views.storage_states.get(self._key(resource))
        return storage_state.persisted_storage_version_hashes if storage_state else ()

    def _row(
        self,
        now: int,
        resource: Resource,
        views: State,
        actions: Sequence[str],
        fresh: Sequence[Record],
    ) -> TimelineRow:
        key = self._key(resource)
        storage_version = views.storage_versions.get(key)
        entries = (
            {e.apiserver_id: _bare(e.encoding_version) for e in storage_version.entries}
            if storage_version
            else {}
        )
        hashes = self._persisted(views, resource)
        baseline_hashes: tuple[str, ...] | None = None  # the old trigger's, when it is in charge
        if self.baseline is not None:
            belief = self.baseline.beliefs.get(resource.name)
            baseline_hashes = tuple(belief.persisted_hashes) if belief else ()
        stored = self.cluster.store.versions(resource)
        latest = latest_migration(views, key)
        return TimelineRow(
            at_seconds=now,
            resource=resource.name,
            events=(*actions, *self._ledger_news(resource, fresh)),
            encoding_versions=tuple(
                entries.get(apiserver_id(a.hostname)) for a in self.scenario.apiservers
            ),
            common_version=(
                _bare(storage_version.common_encoding_version)
                if storage_version and storage_version.common_encoding_version
                else None
            ),
            persisted_versions=self._shown(hashes),
            baseline_persisted_versions=(
                None if baseline_hashes is None else self._shown(baseline_hashes)
            ),
            migration=f"{latest.phase} {_bare(latest.target_version)}" if latest else None,
            stored=dict(sorted(stored.items())),
            polluted=polluted(
                resource, hashes if baseline_hashes is None else baseline_hashes, stored
            ),
        )

    def _ledger_news(self, resource: Resource, fresh: Sequence[Record]) -> list[str]:
        """What the log says happened to ``resource`` in a step, in words."""
        state = self.mirror.state
        news = []
        for record in fresh:
            event = record.event
            if isinstance(event, ApiserverLeaseExpired):
                news.append(
                    f"lease of {self.hostnames.get(event.apiserver_id, event.apiserver_id)} expired"
                )
                continue
            if not isinstance(
                event,
                MigrationRequested | MigrationSucceeded | MigrationFailed | MigrationCancelled,
            ):
                continue
            if isinstance(event, MigrationRequested):
                key = (self.scenario.cluster, event.group, event.resource)
                self.requested[event.migration_id] = (key, event.target_version)
            if self.requested.get(event.migration_id, (None, ""))[0] != self._key(resource):
                continue
            to = _bare(self.requested[event.migration_id][1])
            migration = state.migrations.get((self.scenario.cluster, event.migration_id))
            match event:
                case MigrationRequested():
                    news.append(f"migration to {to} requested")
                case MigrationSucceeded() if event.meta.event_id in self.mirror.refused_successes:
                    news.append(
                        f"migration to {to} reported done after it was cancelled: ignored"
                        if migration is None or migration.phase == "Cancelled"
                        else f"migration to {to} done, but stale: persisted hashes kept"
                    )
                case MigrationSucceeded():
                    news.append(f"migration to {to} succeeded ({event.objects_migrated} objects)")
                case MigrationFailed():
                    news.append(f"migration to {to} failed: {event.reason}")
                case MigrationCancelled():
                    news.append(f"migration to {to} cancelled: {event.reason}")
        return news


def _bare(version: str) -> str:
    """A version as the scenario writes it: the resource's own group goes without saying."""
    return split_group_version(version)[1]
