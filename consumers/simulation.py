"""A simulated HA control plane on the real ledger: ``svledger simulate SCENARIO.yaml``.

What is real: each simulated apiserver embeds the real :class:`~ledger.reporter.Reporter`
(heartbeats, storage-version reports, the write gate) on the real Kafka broker, and the
real projector, migration trigger, migration worker and lease GC run beside them as
asyncio tasks on the same topic and database. What is simulated is the rest of the
cluster (:mod:`consumers.sim_target`): etcd (a SQL table of objects with the version
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
  allowance (:class:`~consumers.sim_target.Allowance`).

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

**Output.** A table per resource in the style of the KEP's case walkthrough, read from
the projection views after each step, one row per step in which something changed;
then the pollution check:

* *polluted objects*: objects stored in a version whose hash is not in the persisted
  hashes (``Unknown`` in the list covers every version), measured after every step; the
  worst is reported. A correct trigger keeps it at 0.
* *migrations while apiservers disagreed*: migrations requested while the apiservers
  did not all encode the target version, or still Pending or Running at the end of a
  step while they disagreed. Checked on the run's own fold of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, TextIO, TypeAlias

from sqlalchemy import Engine, func, select

from consumers import migrator
from consumers.lease_gc import run_lease_gc
from consumers.migrator import run_migrator
from consumers.scenario import Crash, Entry, Resource, Restart, Scenario, Start, Stop, Write, load
from consumers.sim_target import Allowance, LoadBalancer, ObjectStore, SimApiserver, SimulatedTarget
from consumers.worker import next_migration, run_worker
from ledger.clock import VirtualClock
from ledger.events import (
    ApiserverLeaseExpired,
    Event,
    Meta,
    MigrationCancelled,
    MigrationFailed,
    MigrationRequested,
    MigrationSucceeded,
    Position,
)
from ledger.hashing import storage_version_hash
from ledger.identity import apiserver_id
from ledger.kafka import EndOffsets, EventConsumer, EventProducer, Record, create_topics
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings
from projections import database
from projections.fold import active_migrations, apply
from projections.projector import run_projector
from projections.schema import ledger_events, projection_checkpoints
from projections.state import UNKNOWN_HASH, Migration, ResourceKey, State
from projections.store import load_state

log = logging.getLogger(__name__)

Trigger: TypeAlias = Literal["agreement", "discovery-hash"]
TRIGGERS: Final[tuple[Trigger, ...]] = ("agreement", "discovery-hash")

EPOCH: Final = datetime(2024, 1, 1, tzinfo=UTC)
PROJECTION: Final = "views"
BASELINE_SOURCE: Final = "discovery-hash-trigger"
SETTLE_TIMEOUT_SECONDS: Final = 60.0
_FOREVER: Final = 100 * 365 * 24 * 3600.0


class SimulationError(RuntimeError):
    """The simulation cannot run, or its system did not come to rest."""


@dataclasses.dataclass(frozen=True, slots=True)
class TimelineRow:
    """A resource after a step in which something changed, as the views show it."""

    at_seconds: int
    resource: str
    events: tuple[str, ...]
    encoding_versions: tuple[str | None, ...]  # per apiserver, in scenario order
    common_version: str | None
    persisted_versions: tuple[str, ...]  # the ledger's StorageState, hashes shown as versions
    baseline_persisted_versions: tuple[str, ...] | None  # the old trigger's StorageState
    migration: str | None  # the latest migration, e.g. "Running v2"
    stored: Mapping[str, int]  # objects per encoded version
    polluted: int  # objects outside the persisted hashes of the trigger in charge

    @property
    def time(self) -> str:
        return f"{self.at_seconds // 60}:{self.at_seconds % 60:02d}"


@dataclasses.dataclass(frozen=True, slots=True)
class SimulationResult:
    cluster: str
    trigger: Trigger
    apiservers: tuple[str, ...]  # hostnames, the order of TimelineRow.encoding_versions
    rows: tuple[TimelineRow, ...]
    # Objects outside the persisted hashes, worst after any step, summed over resources:
    # against the StorageState of the trigger in charge (the old trigger's own in
    # discovery-hash mode), and against the ledger's guarded StorageState.
    polluted_objects: int
    ledger_polluted_objects: int
    # IDs of migrations requested, or left active, while the apiservers disagreed.
    migrations_while_disagreeing: tuple[str, ...]
    final_persisted_versions: Mapping[str, tuple[str, ...]]  # by resource name
    final_stored: Mapping[str, Mapping[str, int]]  # by resource name
    refused_writes: int  # client writes that found no apiserver ready to serve them
    events: int  # records of the cluster in the log


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


# --- the old-way trigger ------------------------------------------------------------------


@dataclasses.dataclass
class _Belief:
    """The old trigger's StorageState of one resource."""

    current_hash: str
    persisted_hashes: list[str]
    migration_id: str | None  # its migration in flight


class DiscoveryHashTrigger:
    """The KEP's trigger without HA support: poll one apiserver, trust what it says.

    Every poll reads the storage version hash of each resource from ONE apiserver (the
    one the load balancer picks). On first sight the StorageState is created with
    persisted hashes ``["Unknown"]`` and a migration is requested; when the hash differs
    from the current one, the running migration is cancelled, a migration to the new
    version is requested and the hash is appended to the persisted hashes. When its
    migration succeeds, the persisted hashes become the current hash alone.
    """

    def __init__(
        self,
        cluster: str,
        resources: Iterable[Resource],
        balancer: LoadBalancer,
        rng: random.Random,
    ) -> None:
        self._cluster = cluster
        self._resources = tuple(resources)
        self._balancer = balancer
        self._rng = rng
        self.beliefs: dict[str, _Belief] = {}

    def poll(self, state: State, now: datetime) -> list[Event]:
        events: list[Event] = []
        for resource in self._resources:
            server = self._balancer.pick("GET", resource, self._rng)
            if server is None:
                continue
            version = server.encoding_version(resource)
            found = storage_version_hash(resource.group, version, resource.kind)
            belief = self.beliefs.get(resource.name)
            if belief is not None and belief.current_hash == found:
                continue
            if belief is None:
                belief = self.beliefs[resource.name] = _Belief(found, [UNKNOWN_HASH], None)
            else:
                running = state.migrations.get((self._cluster, belief.migration_id or ""))
                if running is not None and running.active:
                    events.append(
                        MigrationCancelled(
                            self._meta(now),
                            running.migration_id,
                            running.objects_migrated,
                            reason=migrator.REASON_CHANGED,
                            message=f"discovery shows {resource.name} stored in {version}",
                        )
                    )
                belief.current_hash = found
                if found not in belief.persisted_hashes:
                    belief.persisted_hashes.append(found)
            storage_version = state.storage_versions.get(
                (self._cluster, resource.group, resource.resource)
            )
            belief.migration_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            events.append(
                MigrationRequested(
                    self._meta(now),
                    belief.migration_id,
                    resource.group,
                    resource.resource,
                    target_version=version,
                    target_hash=found,
                    # The old trigger knows no revisions; the ledger's guard gets the
                    # StorageVersion as it stands when the request is made.
                    storage_version_revision=storage_version.revision if storage_version else "",
                )
            )
        return events

    def observe(self, state: State) -> None:
        """Watch the migrations (the KEP's informer): a success refines persisted hashes."""
        for belief in self.beliefs.values():
            migration = state.migrations.get((self._cluster, belief.migration_id or ""))
            if migration is not None and migration.phase == "Succeeded":
                belief.persisted_hashes = [belief.current_hash]
                belief.migration_id = None

    def _meta(self, now: datetime) -> Meta:
        return Meta.new(self._cluster, BASELINE_SOURCE, now)


# --- one run ------------------------------------------------------------------------------


class _ProcessClock:
    """The shared clock as one apiserver process sees it; a crashed process never wakes."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self.crashed = False
        self.sleeping: set[asyncio.Task[Any]] = set()

    def now(self) -> datetime:
        return self._clock.now()

    async def sleep(self, seconds: float) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.sleeping.add(task)
        try:
            await self._clock.sleep(seconds)
            while self.crashed:
                await self._clock.sleep(_FOREVER)
        finally:
            if task is not None:
                self.sleeping.discard(task)


@dataclasses.dataclass
class _Process:
    server: SimApiserver
    clock: _ProcessClock


class _Mirror:
    """The run's own reader and fold of its cluster's log, independent of the projector."""

    def __init__(self, settings: KafkaSettings, cluster: str) -> None:
        self._settings = settings
        self._consumer = EventConsumer(settings, group_id=None)
        # High watermarks, not last stable offsets: a transaction's commit returns
        # before the broker has written its markers, so for a moment the last stable
        # offset stops short of a record already appended (a lease GC's expiry, say)
        # and the log would look read to its end while that record is still to come.
        self._ends = EndOffsets(settings, committed=False)
        self._cluster = cluster
        self.state = State()
        self.records: list[Record] = []  # of the cluster
        self.refused_successes: set[str] = set()  # event IDs of successes the fold refused
        # The common version of each StorageVersion revision the log went through.
        self.common_at: dict[tuple[ResourceKey, str], str | None] = {}
        self.disagreeing: set[str] = set()  # migration IDs requested while servers disagreed
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Mirror:
        await self._ends.__aenter__()
        await self._consumer.__aenter__()
        self._task = asyncio.create_task(self._read(), name="svledger-simulation-mirror")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.__aexit__(None, None, None)
        await self._ends.__aexit__(None, None, None)

    async def _read(self) -> None:
        async for batch in self._consumer.batches(timeout_ms=100):
            for record in batch:
                if record.event.meta.cluster == self._cluster:
                    self._fold(record)

    def _fold(self, record: Record) -> None:
        event = record.event
        if isinstance(event, MigrationRequested):
            # Judged by the StorageVersion revision the request was decided on: a trigger
            # decides on the log as it has read it, and reports may land in between.
            key = (event.meta.cluster, event.group, event.resource)
            if self.common_at.get((key, event.storage_version_revision)) != event.target_version:
                self.disagreeing.add(event.migration_id)
        changes = apply(self.state, event, record.position)
        for key in changes.storage_versions:
            storage_version = self.state.storage_versions.get(key)
            if storage_version is not None:
                self.common_at[key, storage_version.revision] = (
                    storage_version.common_encoding_version
                )
        if isinstance(event, MigrationSucceeded) and changes.rejections:
            self.refused_successes.add(event.meta.event_id)
        self.records.append(record)

    async def caught_up(self) -> bool:
        """Whether every record appended to the topic so far has been read.

        The reader reads committed records only, so it gets to the high watermark once
        no transaction is open: a record of an undecided transaction is still to come.
        """
        positions = await self._consumer.positions()
        ends = await self._ends(positions)
        return all(positions[partition] >= end for partition, end in ends.items())

    def check_active(self) -> None:
        """Flag migrations still active while their resource's apiservers disagree."""
        for key, storage_version in self.state.storage_versions.items():
            if storage_version.common_encoding_version is None:
                self.disagreeing.update(m.migration_id for m in active_migrations(self.state, key))
        for migration in self.state.migrations.values():
            if migration.active and migration.resource_key not in self.state.storage_versions:
                self.disagreeing.add(migration.migration_id)


class _Run:
    def __init__(
        self, scenario: Scenario, settings: KafkaSettings, db: Engine, db_url: str, trigger: Trigger
    ) -> None:
        self.scenario = scenario
        self.settings = settings
        self.db = db
        self.db_url = db_url
        self.trigger: Trigger = trigger
        self.clock = VirtualClock(EPOCH)
        self.rng = random.Random(scenario.seed)
        self.store = ObjectStore(db, scenario.cluster)
        self.balancer = LoadBalancer(random.Random(self.rng.getrandbits(64)))
        self.allowance = Allowance(scenario.requests_per_second)
        self.target = SimulatedTarget(self.store, self.balancer, scenario.resources, self.allowance)
        self.baseline = (
            DiscoveryHashTrigger(
                scenario.cluster,
                scenario.resources,
                self.balancer,
                random.Random(self.rng.getrandbits(64)),
            )
            if trigger == "discovery-hash"
            else None
        )
        self.mirror = _Mirror(settings, scenario.cluster)
        self.processes: dict[str, _Process] = {}
        self.frozen: list[_ProcessClock] = []
        self.refused_writes = 0
        self.hostnames = {apiserver_id(a.hostname): a.hostname for a in scenario.apiservers}
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
            self.store.clear()
            tasks = [
                asyncio.create_task(run, name=f"svledger-simulation-{name}")
                for name, run in self._consumers(stop).items()
            ]
            try:
                return await self._timeline(tasks)
            finally:
                for process_clock in [*self.frozen, *(p.clock for p in self.processes.values())]:
                    for task in process_clock.sleeping:
                        task.cancel()
                stop.set()
                self.allowance.grant(0)  # wake a worker waiting for requests: it sees stop
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
                self.settings, self.target, stop=stop, clock=self.clock, group_id=group("worker")
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
                described = await self._act(pending.pop(0))
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
                ledger_polluted = self._polluted(
                    resource, self._persisted(views, resource), row.stored
                )
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
            self.allowance.grant(following - now)
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
            refused_writes=self.refused_writes,
            events=len(self.mirror.records),
        )

    async def _act(self, entry: Entry) -> str | None:
        """Carry out a timeline entry; say what happened (None for client writes)."""
        action = entry.action
        match action:
            case Write():
                self._write(self.scenario.resource(action.resource), action.count)
                return None
            case Start():
                await self._start(action.hostname, action.binary)
                done = f"{action.hostname} started on {action.binary}"
            case Restart():
                await self._stop(action.hostname)
                await self._start(action.hostname, action.binary)
                verb = "upgraded" if action.kind == "upgrade" else "rolled back"
                done = f"{action.hostname} {verb} to {action.binary}"
            case Crash():
                process = self.processes.pop(action.hostname)
                process.server.alive = False
                process.clock.crashed = True
                self.frozen.append(process.clock)
                done = f"{action.hostname} crashed"
            case Stop():
                await self._stop(action.hostname)
                done = f"{action.hostname} stopped"
        return entry.note or done

    async def _start(self, hostname: str, binary_name: str) -> None:
        s = self.scenario
        binary = s.binaries[binary_name]
        clock = _ProcessClock(self.clock)
        reporter = Reporter(
            s.cluster,
            hostname,
            [
                ResourceReport(
                    r.group,
                    r.resource,
                    r.kind,
                    e.encoding_version,
                    e.decodable_versions,
                    e.served_versions,
                )
                for r in s.resources
                for e in [binary.encodings[r.name]]
            ],
            self.producer,
            clock,
            heartbeat_interval=s.heartbeat_interval_seconds,
            lease_duration_seconds=s.lease_duration_seconds,
            binary_version=binary.name,
            rng=random.Random(self.rng.getrandbits(64)),
        )
        await reporter.start()
        server = SimApiserver(hostname, binary, reporter)
        self.balancer.apiservers[hostname] = server
        self.processes[hostname] = _Process(server, clock)

    async def _stop(self, hostname: str) -> None:
        process = self.processes.pop(hostname, None)
        if process is not None:
            process.server.alive = False
            await process.server.reporter.stop()

    def _write(self, resource: Resource, count: int) -> None:
        for _ in range(count):
            name = resource.object_name(self.rng.randrange(resource.objects))
            server = self.balancer.pick("PUT", resource)
            if server is None:
                self.refused_writes += 1
                continue
            self.store.write(resource, name, server.encoding_version(resource), server.hostname)

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
        running = next_migration(state)
        if running is not None and not self.allowance.waiting:
            return f"the worker to run migration {running.migration_id} ({running.phase})"
        # Nothing may have been appended while this was checked.
        if len(self.mirror.records) != read or not await self.mirror.caught_up():
            return "reading the log"
        return None

    async def _wait_for(self, pending: Callable[[], Awaitable[str | None]], what: str) -> None:
        deadline = asyncio.get_running_loop().time() + SETTLE_TIMEOUT_SECONDS
        while (waiting := await pending()) is not None:
            if asyncio.get_running_loop().time() > deadline:
                raise SimulationError(
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

    def _polluted(
        self, resource: Resource, hashes: Sequence[str], stored: Mapping[str, int]
    ) -> int:
        if UNKNOWN_HASH in hashes:
            return 0
        return sum(
            count
            for version, count in stored.items()
            if storage_version_hash(resource.group, version, resource.kind) not in hashes
        )

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
            {e.apiserver_id: e.encoding_version for e in storage_version.entries}
            if storage_version
            else {}
        )
        hashes = self._persisted(views, resource)
        baseline_hashes: tuple[str, ...] | None = None  # the old trigger's, when it is in charge
        if self.baseline is not None:
            belief = self.baseline.beliefs.get(resource.name)
            baseline_hashes = tuple(belief.persisted_hashes) if belief else ()
        stored = self.store.versions(resource)
        latest = _latest_migration(views, key)
        return TimelineRow(
            at_seconds=now,
            resource=resource.name,
            events=(*actions, *self._ledger_news(resource, fresh)),
            encoding_versions=tuple(
                entries.get(apiserver_id(a.hostname)) for a in self.scenario.apiservers
            ),
            common_version=storage_version.common_encoding_version if storage_version else None,
            persisted_versions=self._shown(hashes),
            baseline_persisted_versions=(
                None if baseline_hashes is None else self._shown(baseline_hashes)
            ),
            migration=f"{latest.phase} {latest.target_version}" if latest else None,
            stored=dict(sorted(stored.items())),
            polluted=self._polluted(
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
            migration = state.migrations.get((self.scenario.cluster, event.migration_id))
            if migration is None or migration.resource_key != self._key(resource):
                continue
            to = migration.target_version
            match event:
                case MigrationRequested():
                    news.append(f"migration to {to} requested")
                case MigrationSucceeded() if event.meta.event_id in self.mirror.refused_successes:
                    news.append(
                        f"migration to {to} reported done after it was cancelled: ignored"
                        if migration.phase == "Cancelled"
                        else f"migration to {to} done, but stale: persisted hashes kept"
                    )
                case MigrationSucceeded():
                    news.append(f"migration to {to} succeeded ({event.objects_migrated} objects)")
                case MigrationFailed():
                    news.append(f"migration to {to} failed: {event.reason}")
                case MigrationCancelled():
                    news.append(f"migration to {to} cancelled: {event.reason}")
        return news


def _latest_migration(views: State, key: ResourceKey) -> Migration | None:
    migrations = [m for m in views.migrations.values() if m.resource_key == key]
    return max(migrations, key=lambda m: (m.requested_at, Position.parse(m.revision)), default=None)


# --- output -------------------------------------------------------------------------------


def render(result: SimulationResult) -> str:
    """The timeline tables (Markdown) and the pollution check, as ``simulate`` prints them."""
    baseline = result.trigger == "discovery-hash"
    lines = [f"# Simulation of cluster {result.cluster!r}, trigger {result.trigger}", ""]
    for resource in dict.fromkeys(row.resource for row in result.rows):
        header = ["time", "what happened", *result.apiservers, "common", "persisted (ledger)"]
        if baseline:
            header.append("persisted (discovery-hash trigger)")
        header += ["migration", "stored objects", "polluted"]
        lines += [f"## {resource}", "", _cells(header), _cells(["---"] * len(header))]
        for row in (r for r in result.rows if r.resource == resource):
            cells = [
                row.time,
                "; ".join(row.events),
                *(version or "-" for version in row.encoding_versions),
                row.common_version or "-",
                ", ".join(row.persisted_versions) or "-",
            ]
            if baseline:
                cells.append(", ".join(row.baseline_persisted_versions or ()) or "-")
            cells += [
                row.migration or "-",
                " ".join(f"{v}:{n}" for v, n in row.stored.items()) or "-",
                str(row.polluted),
            ]
            lines.append(_cells(cells))
        lines.append("")
    lines += ["## Pollution check", ""]
    if baseline:
        lines.append(
            "objects stored in a version outside the persisted hashes (worst after any step):"
            f" {result.polluted_objects} against the discovery-hash trigger's StorageState,"
            f" {result.ledger_polluted_objects} against the ledger's guarded StorageState"
        )
    else:
        lines.append(
            "objects stored in a version outside the persisted hashes (worst after any step):"
            f" {result.polluted_objects}"
        )
    lines.append(
        "migrations requested or running while the apiservers disagreed:"
        f" {len(result.migrations_while_disagreeing)}"
    )
    if result.refused_writes:
        lines.append(f"client writes refused (no apiserver ready): {result.refused_writes}")
    return "\n".join(lines) + "\n"


def _cells(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"
