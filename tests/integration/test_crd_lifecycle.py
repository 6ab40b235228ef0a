"""A custom resource's old version retired on a real cluster: ``storedVersions`` pruned only
when the ledger proves every object stored in the new version.

Two stock kube-apiservers (v1.37.2) share etcd; the collector, the migration trigger and
the worker (``rewrite`` executor, ``--prune-stored-versions``) run in this process, on
one topic for the whole module, for cluster ``crds``. Each test has a CRD of its own
(group ``<test>.svledger.test``, resource ``widgets``, versions v1 and v2 with a schema
that keeps every field, so no conversion is needed) and switches its storage version
from v1 to v2 through the apiservers while a client writes through both.

The worker's target is the real one behind a gate: a test may hold a group's rewrites,
so that it can change the cluster (switch the storage back, bump the CRD's generation,
stop an apiserver) while a migration of that group is surely running, and then let it go.
The in-tree executor's test starts kube-controller-manager and has the worker run its
group's migration to v2 as a StorageVersionMigration (as ``--executor storagemigration``
does), where upstream's controller prunes ``storedVersions`` itself.

What each test relies on is read where it is: ``storedVersions`` and conditions from the
apiserver, the stored versions from etcd, the decisions from the log, and the words from
``explain`` on views replayed from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from sqlalchemy import create_engine

from consumers.migrator import run_migrator
from consumers.targets import ObjectRef, Page
from consumers.worker import Append, Rewriter, run_worker
from deploy.kube.cluster import LocalCluster
from deploy.kube.rolling_upgrade import NEW, addressed, stored_as
from kube.client import Kube, connect
from kube.collector import run_collector
from kube.executor import StorageMigrationExecutor
from kube.stored_versions import GROUP, RULE, StoredVersionsPruner
from kube.target import KubernetesTarget
from ledger import metrics
from ledger.clock import SystemClock
from ledger.errors import AccessDenied
from ledger.events import (
    Event,
    MigrationCancelled,
    MigrationRequested,
    MigrationSucceeded,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
)
from ledger.kafka import create_topics
from ledger.settings import KafkaSettings
from projections.history import explain
from projections.replay import cluster_log, replay
from projections.state import Migration, State
from svledger.cli import UNAVAILABLE
from tests.integration.test_worker_real import ROLE, worker_identity
from tests.kube import eventually

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes, pytest.mark.asyncio(loop_scope="module")]

CLUSTER = "crds"
RESOURCE = "widgets"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class Gate:
    """The real target; a rewrite of an object of a held group waits until it is let go."""

    def __init__(self, target: KubernetesTarget) -> None:
        self.target = target
        self._held: dict[str, asyncio.Event] = {}
        self.waiting: set[str] = set()  # held groups whose rewrite is waiting

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        return await self.target.list(group, resource, continue_token, limit)

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        held = self._held.get(group)
        if held is not None:
            self.waiting.add(group)
            await held.wait()
        await self.target.rewrite(group, resource, ref)

    def hold(self, group: str) -> None:
        self._held[group] = asyncio.Event()

    def release(self, group: str) -> None:
        self._held.pop(group).set()
        self.waiting.discard(group)


class Routed:
    """The worker's executor and hooks: a group in ``in_tree`` has its migrations to v2 run
    by the in-tree executor (kube-controller-manager marks and prunes its CRD itself), the
    others by the rewrite executor, with svledger's prune."""

    def __init__(self, rewriter: Rewriter, in_tree: StorageMigrationExecutor) -> None:
        self.rewriter = rewriter
        self.in_tree_executor = in_tree
        self.pruner = StoredVersionsPruner(in_tree.kube, in_tree.clock)
        self.in_tree: set[str] = set()

    def _upstream(self, migration: Migration) -> bool:
        return migration.group in self.in_tree and migration.target_version.endswith("/v2")

    async def run(self, migration: Migration, *, append: Append, cancelled: Any) -> None:
        executor = self.in_tree_executor if self._upstream(migration) else self.rewriter
        await executor.run(migration, append=append, cancelled=cancelled)

    async def started(self, migration: Migration) -> None:
        if not self._upstream(migration):
            await self.pruner.started(migration)

    async def ended(self, state: State, migration: Migration, append: Append) -> None:
        if not self._upstream(migration):
            await self.pruner.ended(state, migration, append)


@dataclasses.dataclass
class Pipeline:
    cluster: LocalCluster
    settings: KafkaSettings
    kube: Kube
    servers: list[Kube]  # one client per apiserver
    gate: Gate
    routed: Routed
    workdir: Path


@pytest.fixture(scope="module")
def two_apiservers() -> Iterator[LocalCluster]:
    with LocalCluster(2, version=NEW) as cluster:
        yield cluster


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipeline(
    two_apiservers: LocalCluster, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    workdir = tmp_path_factory.mktemp("crds")
    topic = f"svledger-test.crds.{uuid.uuid4().hex[:8]}"
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=topic, partitions=1)
    await create_topics(settings)
    kube = await connect(str(two_apiservers.write_kubeconfig(workdir / "kubeconfig")))
    direct = addressed(kube, two_apiservers)
    clock = SystemClock()
    gate = Gate(KubernetesTarget(kube))
    rewriter = Rewriter(gate, clock, chunk_size=10)
    routed = Routed(rewriter, StorageMigrationExecutor(kube, clock, rewriter, poll_seconds=1.0))
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            run_collector(settings, CLUSTER, kube, stop=stop, clock=clock, apiservers=direct)
        ),
        asyncio.create_task(run_migrator(settings, stop=stop, group_id=f"{topic}.migrator")),
        asyncio.create_task(
            run_worker(
                settings,
                routed,
                stop=stop,
                cluster=CLUSTER,
                group_id=f"{topic}.worker",
                hooks=routed,
            )
        ),
    ]
    try:
        yield Pipeline(two_apiservers, settings, kube, list(direct.values()), gate, routed, workdir)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for client in direct.values():
            await client.close()
        await kube.close()


# ------------------------------------------------------------------ the cluster


def definition(group: str, storage: str, description: str = "") -> dict[str, Any]:
    schema = {
        "openAPIV3Schema": {
            "type": "object",
            "description": description,
            "x-kubernetes-preserve-unknown-fields": True,
        }
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{RESOURCE}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": RESOURCE, "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": v, "served": True, "storage": v == storage, "schema": schema}
                for v in ("v1", "v2")
            ],
        },
    }


async def crd(kube: Kube, group: str) -> dict[str, Any]:
    return await kube.get(f"{CRDS}/{RESOURCE}.{group}")


async def change_crd(kube: Kube, group: str, storage: str, description: str = "") -> None:
    """Give the CRD ``storage`` as its storage version (and a schema ``description``)."""
    current = await crd(kube, group)
    spec = definition(group, storage, description)["spec"]
    body = {**current, "spec": {**current["spec"], "versions": spec["versions"]}}
    await kube.request("PUT", f"{CRDS}/{RESOURCE}.{group}", body)


async def pruned_to(pipeline: Pipeline, group: str, version: str, timeout: float) -> None:
    """Wait until the CRD of ``group`` lists ``version`` alone in ``status.storedVersions``."""

    async def pruned() -> str | None:
        stored = stored_versions(await crd(pipeline.kube, group))
        return None if stored == [version] else f"storedVersions {stored}"

    await eventually(pruned, f"storedVersions of {group} pruned to [{version}]", timeout)


def status_list(obj: dict[str, Any], field: str) -> list[Any]:
    """A list of a CRD's status: the apiserver writes null for an empty one (a CRD just
    created has ``conditions: null``)."""
    return list((obj.get("status") or {}).get(field) or ())


def stored_versions(obj: dict[str, Any]) -> list[str]:
    return status_list(obj, "storedVersions")


def condition(obj: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in status_list(obj, "conditions") if c["type"] == "StorageMigrating"]
    return found[0] if found else {}


async def widget(server: Kube, group: str, name: str) -> None:
    body = {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": len(name)},
    }
    await server.request("POST", f"/apis/{group}/v1/namespaces/default/{RESOURCE}", body)


@contextlib.asynccontextmanager
async def writing(pipeline: Pipeline, group: str) -> AsyncIterator[list[str]]:
    """A client creating widgets through every apiserver in turn while the block runs; it
    gets the names written so far."""
    names: list[str] = []
    stop = asyncio.Event()

    async def write() -> None:
        for index in itertools.count():
            if stop.is_set():
                return
            name = f"w-{index}"
            await widget(pipeline.servers[index % len(pipeline.servers)], group, name)
            names.append(name)
            await asyncio.sleep(0.05)

    task = asyncio.create_task(write())
    try:
        yield names
    finally:
        stop.set()
        await task


async def created(pipeline: Pipeline, group: str, objects: int = 20) -> list[str]:
    """A fresh CRD of ``group`` storing v1, ``objects`` widgets written through both
    apiservers, and the ledger agreeing that every object is stored in v1."""
    await pipeline.kube.request("POST", CRDS, definition(group, "v1"))

    async def established() -> str | None:
        conditions = status_list(await crd(pipeline.kube, group), "conditions")
        ok = any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
        return None if ok else f"conditions {conditions}"

    await eventually(established, f"CRD of {group} established", 30)

    async def served() -> str | None:
        # Established is the CRD's status; each apiserver serves the group once its own
        # informer saw it, so a write through one that has not yet answers 404.
        for index, server in enumerate(pipeline.servers):
            try:
                await server.get(f"/apis/{group}/v1/namespaces/default/{RESOURCE}")
            except Exception as error:  # not served by this apiserver yet
                return f"apiserver {index}: {error}"
        return None

    await eventually(served, f"{RESOURCE} of {group} served by every apiserver", 60)
    names: list[str] = []
    for index in range(objects):
        names.append(f"seed-{index}")
        await widget(pipeline.servers[index % len(pipeline.servers)], group, names[-1])
    await eventually(lambda: migrated(pipeline, group, "v1"), f"{group} migrated to v1", 180)
    return names


async def migrated(pipeline: Pipeline, group: str, version: str) -> str | None:
    """None once the ledger's StorageState of ``group`` holds the hash of ``version`` alone."""
    state, _ = await cluster_log(pipeline.settings, CLUSTER)
    storage_state = state.storage_states.get((CLUSTER, group, RESOURCE))
    storage_version = state.storage_versions.get((CLUSTER, group, RESOURCE))
    if storage_state is None or storage_version is None:
        return "no StorageState yet"
    if storage_version.common_encoding_version != f"{group}/{version}":
        return f"common version {storage_version.common_encoding_version}"
    if len(storage_state.persisted_storage_version_hashes) != 1:
        return f"persisted {storage_state.persisted_storage_version_hashes}"
    return None


def in_etcd(cluster: LocalCluster, group: str) -> dict[str, int]:
    """How many widgets of ``group`` etcd holds per stored apiVersion."""
    counts: dict[str, int] = {}
    for key, value in cluster.etcd_get_prefix(f"/registry/{group}/{RESOURCE}/"):
        version = stored_as(key, value)
        counts[version] = counts.get(version, 0) + 1
    return counts


async def events(pipeline: Pipeline, group: str) -> list[tuple[str, Event]]:
    """The log's events about ``group``'s widgets and their migrations, with positions."""
    _, records = await cluster_log(pipeline.settings, CLUSTER)
    ours: set[str] = set()
    found = []
    for record in records:
        event = record.event
        if isinstance(event, MigrationRequested) and event.group == group:
            ours.add(event.migration_id)
        if getattr(event, "group", None) == group or getattr(event, "migration_id", "") in ours:
            found.append((f"{record.partition}:{record.offset}", event))
    return found


async def migration_to(pipeline: Pipeline, group: str, version: str) -> str | None:
    """The ID of the latest migration of ``group`` to ``version``, once one is requested."""
    ids = [
        e.migration_id
        for _, e in await events(pipeline, group)
        if isinstance(e, MigrationRequested) and e.target_version == f"{group}/{version}"
    ]
    return ids[-1] if ids else None


async def explained(pipeline: Pipeline, group: str) -> str:
    database = f"sqlite:///{pipeline.workdir / f'views-{uuid.uuid4().hex[:6]}.db'}"
    await replay(pipeline.settings, database, progress=False)
    with create_engine(database).connect() as connection:
        return explain(connection, f"{group}.{RESOURCE}", CLUSTER)


async def held_migration(pipeline: Pipeline, group: str) -> str:
    """Switch ``group``'s storage to v2 while a client writes through both apiservers, with
    its rewrites held: the ID of the migration to v2, once it waits at the gate."""
    pipeline.gate.hold(group)
    async with writing(pipeline, group):
        await asyncio.sleep(1)
        await change_crd(pipeline.kube, group, "v2")
        await asyncio.sleep(3)

    async def waiting() -> str | None:
        return None if group in pipeline.gate.waiting else "no rewrite waits at the gate"

    await eventually(waiting, f"a migration of {group} to v2 held", 120)
    migration_id = await migration_to(pipeline, group, "v2")
    assert migration_id is not None
    assert condition(await crd(pipeline.kube, group))["status"] == "True"
    return migration_id


# ------------------------------------------------------------------------ tests


async def test_v1_leaves_stored_versions_only_once_every_object_is_stored_as_v2(
    pipeline: Pipeline,
) -> None:
    group = "retire.svledger.test"
    await created(pipeline, group)
    async with writing(pipeline, group) as names:
        await asyncio.sleep(1)
        await change_crd(pipeline.kube, group, "v2")
        await asyncio.sleep(4)
    assert names, "the client wrote through both apiservers"

    await pruned_to(pipeline, group, "v2", 180)
    counts = in_etcd(pipeline.cluster, group)
    assert counts == {f"{group}/v2": 20 + len(names)}, counts
    # The prune came after the migration to v2 succeeded, and says so.
    logged = await events(pipeline, group)
    migration_id = await migration_to(pipeline, group, "v2")
    succeeded = next(
        p for p, e in logged if isinstance(e, MigrationSucceeded) and e.migration_id == migration_id
    )
    prune = next((p, e) for p, e in logged if isinstance(e, StoredVersionsPruned))
    assert int(prune[0].split(":")[1]) > int(succeeded.split(":")[1])
    assert prune[1].stored_versions_after == ("v2",)
    found = condition(await crd(pipeline.kube, group))
    assert (found["status"], found["reason"]) == ("False", "MigrationSucceeded")

    text = await explained(pipeline, group)
    assert "storedVersions [v2]" in text
    assert "v1 can be removed from spec.versions now" in text

    # The author drops v1: the apiserver accepts it now that storedVersions lacks it.
    current = await crd(pipeline.kube, group)
    current["spec"]["versions"] = [v for v in current["spec"]["versions"] if v["name"] == "v2"]
    await pipeline.kube.request("PUT", f"{CRDS}/{RESOURCE}.{group}", current)
    assert [v["name"] for v in (await crd(pipeline.kube, group))["spec"]["versions"]] == ["v2"]


async def test_a_storage_version_switched_back_mid_migration_keeps_stored_versions(
    pipeline: Pipeline,
) -> None:
    group = "back.svledger.test"
    await created(pipeline, group)
    migration_id = await held_migration(pipeline, group)
    await change_crd(pipeline.kube, group, "v1")  # back, while the migration to v2 runs

    async def back_on_v1() -> str | None:
        ended = [
            e for _, e in await events(pipeline, group)
            if isinstance(e, MigrationCancelled) and e.migration_id == migration_id
        ]  # fmt: skip
        return None if ended else f"migration {migration_id} not cancelled yet"

    await eventually(back_on_v1, f"the migration of {group} to v2 cancelled", 120)
    assert stored_versions(await crd(pipeline.kube, group)) == ["v1", "v2"]
    text = await explained(pipeline, group)
    assert re.search(r"v2 stays: objects may still be stored in v2: .* at \d+:\d+", text), text
    assert "v1 stays: the storage version" in text
    assert not any(isinstance(e, StoredVersionsPruned) for _, e in await events(pipeline, group))
    pipeline.gate.release(group)

    # Everything rewritten to v1 again: now v2 can go, and v1 stays.
    await pruned_to(pipeline, group, "v1", 180)
    assert set(in_etcd(pipeline.cluster, group)) == {f"{group}/v1"}


async def test_a_generation_changed_during_the_migration_keeps_stored_versions(
    pipeline: Pipeline,
) -> None:
    group = "generation.svledger.test"
    await created(pipeline, group)
    migration_id = await held_migration(pipeline, group)
    started_under = condition(await crd(pipeline.kube, group))["observedGeneration"]
    await change_crd(pipeline.kube, group, "v2", description="a widget, described")
    assert (await crd(pipeline.kube, group))["metadata"]["generation"] == started_under + 1
    pipeline.gate.release(group)

    async def refused() -> str | None:
        found = [
            (p, e) for p, e in await events(pipeline, group)
            if isinstance(e, StoredVersionsPruneRefused) and e.migration_id == migration_id
        ]  # fmt: skip
        return None if found else "no refusal yet"

    await eventually(refused, f"the prune of {group} refused", 120)
    assert stored_versions(await crd(pipeline.kube, group)) == ["v1", "v2"]
    assert set(in_etcd(pipeline.cluster, group)) == {f"{group}/v2"}  # migrated all the same
    text = await explained(pipeline, group)
    assert re.search(r"refused \(GenerationChanged\) at \d+:\d+: .*generation", text), text


async def test_an_apiserver_stopped_mid_migration_keeps_v1_until_it_answers_again(
    pipeline: Pipeline,
) -> None:
    group = "stopped.svledger.test"
    await created(pipeline, group)
    migration_id = await held_migration(pipeline, group)
    pipeline.cluster.pause_apiserver(1)  # SIGSTOP: its lease stays, its discovery is silent
    try:

        async def cancelled() -> str | None:
            ended = [
                e for _, e in await events(pipeline, group)
                if isinstance(e, MigrationCancelled) and e.migration_id == migration_id
            ]  # fmt: skip
            return None if ended else f"migration {migration_id} not cancelled yet"

        await eventually(cancelled, f"the migration of {group} cancelled", 120)
        pipeline.gate.release(group)
        assert stored_versions(await crd(pipeline.kube, group)) == ["v1", "v2"]
        text = await explained(pipeline, group)
        assert "Agreement is unknown" in text
        assert re.search(r"v1 stays: objects may still be stored in v1: .* at \d+:\d+", text), text
    finally:
        pipeline.cluster.resume_apiserver(1)

    # Back: it reports v2, a migration runs under agreement, and v1 goes.
    await pruned_to(pipeline, group, "v2", 240)
    assert set(in_etcd(pipeline.cluster, group)) == {f"{group}/v2"}


@contextlib.asynccontextmanager
async def discovery_held(server: Kube, group: str) -> AsyncIterator[None]:
    """``server``'s discovery of ``group`` held at what it answers now, as a lagging
    apiserver's (whose CRD informer is behind) stays after a change: its answers to
    ``/apis/<group>/<version>`` are read now and served again, in transit, to whoever
    asks through this client (the collector). The apiserver itself is real and up to date:
    it serves and stores as the CRD says."""
    get = server.get
    held = {
        f"/apis/{group}/{version}": await get(f"/apis/{group}/{version}")
        for version in ("v1", "v2")
    }

    async def lagging(path: str, *args: Any, **kwargs: Any) -> Any:
        return held[path] if path in held else await get(path, *args, **kwargs)

    server.get = lagging  # type: ignore[method-assign]
    try:
        yield
    finally:
        del server.get  # the class's own again


async def test_an_apiserver_whose_discovery_lags_keeps_v1_until_it_catches_up(
    pipeline: Pipeline,
) -> None:
    """The storage switched to v2, one apiserver's discovery still shows v1's hash: the
    apiservers disagree, so no migration to v2 runs and storedVersions keeps v1, and
    explain says which apiserver still encodes v1, at which offset. Caught up, v1 goes."""
    group = "lagging.svledger.test"
    await created(pipeline, group)
    async with discovery_held(pipeline.servers[1], group):
        async with writing(pipeline, group):
            await asyncio.sleep(1)
            await change_crd(pipeline.kube, group, "v2")
            await asyncio.sleep(3)

        async def disagreeing() -> str | None:
            text = await explained(pipeline, group)
            split = re.search(r"They disagree \(\S+/v1 by \S+; \S+/v2 by \S+\)", text)
            return None if split else text

        await eventually(disagreeing, f"the apiservers disagreeing on {group}", 60)
        await asyncio.sleep(5)  # the migration trigger polls: nothing may start meanwhile
        assert await migration_to(pipeline, group, "v2") is None
        assert stored_versions(await crd(pipeline.kube, group)) == ["v1", "v2"]
        assert not any(
            isinstance(e, StoredVersionsPruned) for _, e in await events(pipeline, group)
        )
        text = await explained(pipeline, group)
        assert re.search(r"v1 stays: objects may still be stored in v1: .* at \d+:\d+", text), text

    # Caught up: every apiserver writes v2, a migration runs under agreement, v1 goes.
    await pruned_to(pipeline, group, "v2", 180)
    assert set(in_etcd(pipeline.cluster, group)) == {f"{group}/v2"}


async def test_the_in_tree_migrator_prunes_and_the_ledger_backs_it_or_raises_the_alarm(
    pipeline: Pipeline,
) -> None:
    """Upstream's controller prunes after its own migration. Run by svledger's worker under
    agreement, the ledger backs it (the prune lands before the worker has seen the end: it
    is judged then); made by hand while an apiserver is silent, the ledger raises the alarm
    until a migration under agreement proves every object stored in v2."""
    cluster = pipeline.cluster
    cluster.start_controller_manager()
    try:
        backed = "intree.svledger.test"
        pipeline.routed.in_tree.add(backed)
        await created(pipeline, backed)
        await change_crd(pipeline.kube, backed, "v2")

        async def pruned_upstream() -> str | None:
            obj = await crd(pipeline.kube, backed)
            stored, found = stored_versions(obj), condition(obj)
            if stored != ["v2"] or found.get("reason") != "MigrationSucceeded":
                return f"storedVersions {stored}, StorageMigrating {found}"
            state, _ = await cluster_log(pipeline.settings, CLUSTER)
            row = state.custom_resources.get((CLUSTER, backed, RESOURCE))
            if row is None or row.stored_versions != ("v2",) or row.pending_prune:
                return f"the ledger's row {row}"
            return None

        await eventually(pruned_upstream, f"{backed} pruned by kube-controller-manager", 240)
        assert set(in_etcd(cluster, backed)) == {f"{backed}/v2"}
        text = await explained(pipeline, backed)
        assert "storedVersions [v2]" in text and "ALARM" not in text, text
        assert "StorageMigrating=False (MigrationSucceeded" in text
        assert not any(
            isinstance(e, StoredVersionsPruned | StoredVersionsPruneRefused)
            for _, e in await events(pipeline, backed)
        )  # svledger's worker left it to upstream

        flagged = "byhand.svledger.test"
        await created(pipeline, flagged)
        cluster.pause_apiserver(1)
        try:
            await change_crd(pipeline.kube, flagged, "v2")
            by_hand = {
                "apiVersion": "storagemigration.k8s.io/v1",
                "kind": "StorageVersionMigration",
                "metadata": {"name": "widgets-by-hand"},
                "spec": {"resource": {"group": flagged, "resource": RESOURCE}},
            }
            await pipeline.kube.request(
                "POST", "/apis/storagemigration.k8s.io/v1/storageversionmigrations", by_hand
            )

            async def alarm() -> str | None:
                state, _ = await cluster_log(pipeline.settings, CLUSTER)
                row = state.custom_resources.get((CLUSTER, flagged, RESOURCE))
                return None if row is not None and row.prune_alarm else f"the ledger's row {row}"

            await eventually(alarm, f"the alarm on {flagged}'s prune", 240)
            assert stored_versions(await crd(pipeline.kube, flagged)) == ["v2"]  # upstream's
            text = await explained(pipeline, flagged)
            assert re.search(r"ALARM: .*v1 left status.storedVersions at \d+:\d+", text), text
            assert unsafe_prunes(f"{flagged}.{RESOURCE}") == 1
        finally:
            cluster.resume_apiserver(1)

        async def proven() -> str | None:
            state, _ = await cluster_log(pipeline.settings, CLUSTER)
            row = state.custom_resources.get((CLUSTER, flagged, RESOURCE))
            return None if row is not None and row.prune_alarm is None else f"row {row}"

        await eventually(proven, f"{flagged} proven by a migration under agreement", 240)
        await asyncio.sleep(0.5)  # the migrator's fold too
        assert unsafe_prunes(f"{flagged}.{RESOURCE}") == 0
    finally:
        cluster.stop_controller_manager()


async def test_prune_stored_versions_refuses_to_start_without_update_on_crd_status(
    two_apiservers: LocalCluster, tmp_path: Path
) -> None:
    """A worker whose ClusterRole may read CRDs but not update their status is turned
    away at its start, by check_access and by ``svledger worker --prune-stored-versions``,
    with the missing permission and the rule to grant; that rule granted, it passes."""
    read_only: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "svledger-worker"},
        "rules": [
            {"apiGroups": [GROUP], "resources": ["customresourcedefinitions"],
             "verbs": ["get", "list", "watch"]},
        ],
    }  # fmt: skip
    kubeconfig = tmp_path / "worker.kubeconfig"
    admin = await connect(str(two_apiservers.write_kubeconfig(tmp_path / "kubeconfig")))
    worker = await worker_identity(two_apiservers, admin, kubeconfig, read_only)
    pruner = StoredVersionsPruner(worker, SystemClock())
    missing = f"may not update customresourcedefinitions/status (group {GROUP})"
    remedy = f"add to its ClusterRole the rule {RULE}"
    try:
        assert "items" in await worker.get(CRDS, limit=1)  # it may read CRDs
        with pytest.raises(AccessDenied) as refused:
            await pruner.check_access()
        assert missing in str(refused.value) and str(refused.value).endswith(remedy)

        command = [sys.executable, "-m", "svledger", "worker", "--cluster", CLUSTER,
                   "--kubeconfig", str(kubeconfig), "--prune-stored-versions"]  # fmt: skip
        ran = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, timeout=120
        )
        assert ran.returncode == UNAVAILABLE, ran.stderr
        assert "svledger: error: --prune-stored-versions: " in ran.stderr
        assert missing in ran.stderr and remedy in ran.stderr, ran.stderr

        # Granted the rule the message names, word for word, it passes.
        current = await admin.get(ROLE)
        granted = {
            **read_only,
            "metadata": current["metadata"],
            "rules": [*current["rules"], yaml.safe_load(RULE)],
        }
        await admin.request("PUT", ROLE, granted)

        async def allowed() -> str | None:
            try:
                await pruner.check_access()
            except AccessDenied as error:
                return str(error)
            return None

        await eventually(allowed, "check_access passes once the rule is granted", 30)
    finally:
        await worker.close()
        await admin.close()


def unsafe_prunes(resource: str) -> float:
    """``svledger_stored_versions_unsafe_prunes`` of ``resource``, as a scrape shows it."""
    (family,) = metrics.STORED_VERSIONS_UNSAFE_PRUNES.collect()
    found = [
        s.value for s in family.samples if s.labels == {"cluster": CLUSTER, "resource": resource}
    ]
    return found[0] if found else -1.0
