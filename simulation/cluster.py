"""The simulated cluster's data plane: an object store, the apiservers in front of it,
a load balancer, and the migration target that goes through them.

:class:`ObjectStore` stands in for etcd: one SQL table, ``sim_objects``, in the
simulation's database beside the projection views, holding every object with the
version it is **encoded in** — the encoding version of the apiserver that last wrote
it — and a resource version bumped on every real write. It is the simulation's own
table, not a view of the ledger, so it is created here and not by the projection
schema's migrations.

A :class:`SimApiserver` is one apiserver process: a binary (how it encodes each
resource) and the real :class:`~ledger.reporter.Reporter` whose
:class:`~ledger.gate.WriteGate` decides whether it may serve a write. The
:class:`LoadBalancer` sends each request to a random ready apiserver (seeded, so runs
repeat) whose gate admits it, as kube-apiserver's Service does.

:class:`SimulatedTarget` is the migration worker's :class:`~consumers.targets.Target`
on this cluster. A rewrite is what the upstream migrator sends: a no-op PUT, served
by whichever apiserver the load balancer picks, which re-encodes the object in *its*
storage version — exactly how a migration run during a rolling upgrade pollutes the
store. As in upstream's storage layer, a PUT that would store the same bytes (the
object is already in the serving apiserver's version) writes nothing.

The target serves at most ``requests_per_second`` requests per *virtual* second
(client-side rate limiting). The simulation grants each step's allowance with
:meth:`Allowance.grant`; a worker that used it up waits on the allowance, not on the
clock, so a step's amount of migration work is the same on every run. While no
apiserver can serve a request the target waits for the next step instead of failing,
for the same reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    and_,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from consumers.targets import NotFound, ObjectRef, Page
from ledger.clock import VirtualClock
from ledger.kafka import EventProducer
from ledger.names import group_version
from ledger.reporter import Reporter, ResourceReport
from projections.database import writing
from simulation.scenario import (
    Binary,
    Crash,
    Entry,
    Resource,
    Restart,
    Scenario,
    Start,
    Stop,
    Write,
)

metadata = MetaData()

sim_objects = Table(
    "sim_objects",
    metadata,
    Column("cluster", String, nullable=False),
    Column("api_group", String, nullable=False),
    Column("resource", String, nullable=False),
    Column("name", String, nullable=False),
    Column("encoded_version", String, nullable=False),
    Column("resource_version", BigInteger, nullable=False),
    Column("written_by", String, nullable=False),  # hostname of the last writer
    PrimaryKeyConstraint("cluster", "api_group", "resource", "name"),
)


class ObjectStore:
    """The objects of one simulated cluster, with the version each is encoded in."""

    def __init__(self, engine: Engine, cluster: str) -> None:
        self._engine = engine
        self._writes = writing(engine)  # its transactions that write
        self._cluster = cluster
        metadata.create_all(engine)
        self._revision = 0

    def _where(self, resource: Resource) -> list[ColumnElement[bool]]:
        return [
            sim_objects.c.cluster == self._cluster,
            sim_objects.c.api_group == resource.group,
            sim_objects.c.resource == resource.resource,
        ]

    def clear(self) -> None:
        """Forget the cluster's objects (a fresh etcd for a fresh run)."""
        with self._writes.begin() as connection:
            connection.execute(sim_objects.delete().where(sim_objects.c.cluster == self._cluster))

    def write(self, resource: Resource, name: str, version: str, writer: str) -> None:
        """Create or update an object: a client write, stored in ``version``."""
        self._revision += 1
        values = {
            "cluster": self._cluster,
            "api_group": resource.group,
            "resource": resource.resource,
            "name": name,
            "encoded_version": version,
            "resource_version": self._revision,
            "written_by": writer,
        }
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        statement = dialect.insert(sim_objects).values(values)
        statement = statement.on_conflict_do_update(
            index_elements=["cluster", "api_group", "resource", "name"],
            set_={
                k: statement.excluded[k]
                for k in ("encoded_version", "resource_version", "written_by")
            },
        )
        with self._writes.begin() as connection:
            connection.execute(statement)

    def reencode(self, resource: Resource, name: str, version: str, writer: str) -> bool:
        """A no-op update served in ``version``; False if the object does not exist.

        Stores nothing when the object is already encoded in ``version`` (same bytes).
        """
        with self._writes.begin() as connection:
            stored = connection.execute(
                select(sim_objects.c.encoded_version).where(
                    *self._where(resource), sim_objects.c.name == name
                )
            ).scalar_one_or_none()
            if stored is None:
                return False
            if stored != version:
                self._revision += 1
                connection.execute(
                    update(sim_objects)
                    .where(and_(*self._where(resource), sim_objects.c.name == name))
                    .values(
                        encoded_version=version,
                        resource_version=self._revision,
                        written_by=writer,
                    )
                )
            return True

    def names(self, resource: Resource, after: str | None, limit: int) -> list[str]:
        """Object names in order, after ``after``, at most ``limit`` (a chunked list)."""
        conditions = self._where(resource)
        if after is not None:
            conditions.append(sim_objects.c.name > after)
        with self._engine.connect() as connection:
            return list(
                connection.execute(
                    select(sim_objects.c.name)
                    .where(*conditions)
                    .order_by(sim_objects.c.name)
                    .limit(limit)
                ).scalars()
            )

    def versions(self, resource: Resource) -> Counter[str]:
        """How many objects of ``resource`` are stored in each version."""
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(sim_objects.c.encoded_version, func.count())
                .where(*self._where(resource))
                .group_by(sim_objects.c.encoded_version)
            )
            return Counter({version: count for version, count in rows})


@dataclasses.dataclass
class SimApiserver:
    """One running apiserver process: its binary and the reporter it embeds."""

    hostname: str
    binary: Binary
    reporter: Reporter
    alive: bool = True  # False once crashed or stopped: the process serves nothing

    def encoding_version(self, resource: Resource) -> str:
        return self.binary.encodings[resource.name].encoding_version

    def serves(self, method: str, resource: Resource) -> bool:
        return (
            self.alive
            and self.reporter.ready
            and self.reporter.gate.allows(method, resource.group, resource.resource)
        )


class LoadBalancer:
    """Sends each request to a random apiserver that can serve it (seeded)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self.apiservers: dict[str, SimApiserver] = {}  # by hostname; the current process

    def pick(
        self, method: str, resource: Resource, rng: random.Random | None = None
    ) -> SimApiserver | None:
        """A random apiserver able to serve the request; ``rng`` for a client of its own."""
        candidates = [
            server
            for _, server in sorted(self.apiservers.items())
            if server.serves(method, resource)
        ]
        return (rng or self._rng).choice(candidates) if candidates else None


class Allowance:
    """Requests the target may serve, granted per virtual step; None means unlimited."""

    def __init__(self, requests_per_second: float | None) -> None:
        self._rate = requests_per_second
        self._tokens = 0.0
        self._step = asyncio.Event()
        self.waiting = 0  # requests waiting for a later step

    def grant(self, seconds: float) -> None:
        """A step of ``seconds`` passed: unused requests do not carry over (beyond one)."""
        if self._rate is not None:
            self._tokens = min(self._tokens, 1.0) + self._rate * seconds
        self._step.set()
        self._step = asyncio.Event()

    async def next_step(self) -> None:
        self.waiting += 1
        try:
            await self._step.wait()
        finally:
            self.waiting -= 1

    async def take(self) -> None:
        if self._rate is None:
            return
        while self._tokens < 1:
            await self.next_step()
        self._tokens -= 1


class SimulatedTarget:
    """The migration worker's target: list and no-op PUT through the load balancer."""

    def __init__(
        self,
        store: ObjectStore,
        balancer: LoadBalancer,
        resources: Iterable[Resource],
        allowance: Allowance,
    ) -> None:
        self._store = store
        self._balancer = balancer
        self._resources = {(r.group, r.resource): r for r in resources}
        self._allowance = allowance

    async def _served_by(self, method: str, resource: Resource) -> SimApiserver:
        await self._allowance.take()
        while (server := self._balancer.pick(method, resource)) is None:
            await self._allowance.next_step()
        return server

    def _resource(self, group: str, resource: str) -> Resource:
        try:
            return self._resources[group, resource]
        except KeyError:
            raise NotFound(f"the simulated cluster has no resource {resource}.{group}") from None

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        known = self._resource(group, resource)
        await self._served_by("GET", known)
        names = self._store.names(known, continue_token, limit + 1)
        more = len(names) > limit
        names = names[:limit]
        return Page(
            tuple(ObjectRef(None, name) for name in names),
            names[-1] if more else None,
        )

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        known = self._resource(group, resource)
        server = await self._served_by("PUT", known)
        if not self._store.reencode(
            known, ref.name, server.encoding_version(known), server.hostname
        ):
            raise NotFound(f"{known.name} {ref.name!r} no longer exists")


FOREVER: Final = 100 * 365 * 24 * 3600.0


class ProcessClock:
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
                await self._clock.sleep(FOREVER)
        finally:
            if task is not None:
                self.sleeping.discard(task)


@dataclasses.dataclass
class Process:
    server: SimApiserver
    clock: ProcessClock


class SimCluster:
    """The simulated cluster: the data plane above, and the apiserver processes.

    Each process embeds the real :class:`~ledger.reporter.Reporter` with a clock of its
    own (:class:`ProcessClock`); :meth:`act` carries out the scenario's timeline entries:
    starts, upgrades and rollbacks (a graceful stop, then a new process), crashes (the
    process freezes, its lease left to the lease GC) and clients' writes through the
    load balancer. Every random choice comes from ``rng``, the scenario's seed.
    """

    def __init__(
        self, scenario: Scenario, db: Engine, clock: VirtualClock, rng: random.Random
    ) -> None:
        self.scenario = scenario
        self.clock = clock
        self.rng = rng
        self.store = ObjectStore(db, scenario.cluster)
        self.balancer = LoadBalancer(random.Random(rng.getrandbits(64)))
        self.allowance = Allowance(scenario.requests_per_second)
        self.target = SimulatedTarget(self.store, self.balancer, scenario.resources, self.allowance)
        self.processes: dict[str, Process] = {}
        self.frozen: list[ProcessClock] = []
        self.refused_writes = 0  # client writes that found no apiserver ready to serve them

    def put_to_sleep(self) -> None:
        """Cancel every process's sleeping tasks (the run is over)."""
        for process_clock in [*self.frozen, *(p.clock for p in self.processes.values())]:
            for task in process_clock.sleeping:
                task.cancel()

    async def act(self, entry: Entry, producer: EventProducer) -> str | None:
        """Carry out a timeline entry; say what happened (None for client writes)."""
        action = entry.action
        match action:
            case Write():
                self._write(self.scenario.resource(action.resource), action.count)
                return None
            case Start():
                await self._start(action.hostname, action.binary, producer)
                done = f"{action.hostname} started on {action.binary}"
            case Restart():
                await self._stop(action.hostname)
                await self._start(action.hostname, action.binary, producer)
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

    async def _start(self, hostname: str, binary_name: str, producer: EventProducer) -> None:
        s = self.scenario
        binary = s.binaries[binary_name]
        clock = ProcessClock(self.clock)
        reporter = Reporter(
            s.cluster,
            hostname,
            [
                ResourceReport(
                    r.group,
                    r.resource,
                    r.kind,
                    group_version(r.group, e.encoding_version),
                    tuple(group_version(r.group, v) for v in e.decodable_versions),
                    tuple(group_version(r.group, v) for v in e.served_versions),
                )
                for r in s.resources
                for e in [binary.encodings[r.name]]
            ],
            producer,
            clock,
            heartbeat_interval=s.heartbeat_interval_seconds,
            lease_duration_seconds=s.lease_duration_seconds,
            binary_version=binary.name,
            rng=random.Random(self.rng.getrandbits(64)),
        )
        await reporter.start()
        server = SimApiserver(hostname, binary, reporter)
        self.balancer.apiservers[hostname] = server
        self.processes[hostname] = Process(server, clock)

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
