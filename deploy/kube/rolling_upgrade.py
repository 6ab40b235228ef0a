"""A real rolling upgrade, checked in etcd: does a storage migration leave objects behind?

Three stock kube-apiservers of Kubernetes v1.36.3 (upstream's defaults: no StorageVersion
API, objects stored as protobuf; see :mod:`deploy.kube.cluster`) share one etcd and are
upgraded one by one to v1.37.2. Between these releases MutatingAdmissionPolicy and its
bindings move their storage version from ``admissionregistration.k8s.io/v1beta1`` to
``.../v1`` (both releases serve v1). Clients keep creating such objects through every
apiserver while svledger runs beside the cluster: ``collect`` (which reads the version
each apiserver encodes in from that apiserver's own discovery, as ``--apiserver`` gives it
every apiserver's address), ``project`` (into SQLite), the trigger and the worker, all on
a real Kafka broker. Afterwards etcd's raw values, read by :mod:`kube.stored`, show the
version every object is stored in.

Two triggers:

* ``agreement``, the ledger's migrator: a migration is requested only once every live
  apiserver encodes the resource in the same version, and cancelled when they stop
  agreeing. Expected: every object ends in v1 (0 left in v1beta1), no migration was
  requested on a disagreement and none succeeded while the apiservers disagreed
  (:func:`while_disagreeing`).
* ``discovery-hash``, the way of the automated-migration KEP without its HA design:
  poll one apiserver's discovery and migrate as soon as its ``storageVersionHash``
  changes. It migrates right after the first apiserver is upgraded, believes the
  resource migrated, and leaves behind every object the not yet upgraded apiservers
  write in v1beta1.

Each run prints, per resource, how many objects etcd holds in each version, and the
objects left in an old version; and ``svledger audit``'s counts (:mod:`kube.auditor`),
taken before the upgrade and after the migrations, next to what the ledger holds objects
may be stored in then.

Two executors run the migrations: svledger's own worker (``rewrite``: list in chunks,
no-op update of every object) or kube-controller-manager's in-tree migrator
(``storagemigration``: svledger creates StorageVersionMigration objects).

Run from the repository root with the project's virtualenv (``make demo-real``)::

    .venv/bin/python -m deploy.kube.rolling_upgrade [--trigger agreement] [--executor rewrite]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Final

from consumers.migrator import Backoff, run_migrator
from consumers.worker import Executor, Rewriter, run_worker
from deploy.kafka.broker import kafka_bootstrap
from deploy.kube.cluster import LocalCluster
from kube.auditor import AuditOptions, run_audit
from kube.client import ApiError, ClusterUnreachable, Kube, connect
from kube.cluster_check import IdentityCheck
from kube.collector import run_collector
from kube.etcd import EtcdSettings, open_store
from kube.executor import StorageMigrationExecutor
from kube.stored import EncryptedValue, StoredObject, decode
from kube.target import KubernetesTarget
from ledger.clock import SystemClock
from ledger.events import Meta, MigrationRequested, MigrationSucceeded, StorageAudited
from ledger.hashing import hash_of_stored
from ledger.identity import apiserver_id
from ledger.kafka import EventProducer, PartitionProducer, create_topics
from ledger.settings import KafkaSettings
from projections import database
from projections.fold import apply
from projections.projector import run_projector
from projections.replay import cluster_log
from projections.state import State
from projections.store import load_state

OLD: Final = "v1.36.3"
NEW: Final = "v1.37.2"
GROUP: Final = "admissionregistration.k8s.io"
RESOURCES: Final = (
    ("mutatingadmissionpolicies", "MutatingAdmissionPolicy"),
    ("mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding"),
)
OLD_VERSION: Final = f"{GROUP}/v1beta1"
NEW_VERSION: Final = f"{GROUP}/v1"
CLUSTER: Final = "rolling-upgrade"
TRIGGERS: Final = ("agreement", "discovery-hash")
EXECUTORS: Final = ("rewrite", "storagemigration")
BASELINE_SOURCE: Final = "discovery-hash-trigger"
_LABEL_IT: Final = 'Object{metadata: Object.metadata{labels: {"by": "svledger"}}}'

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Result:
    trigger: str
    executor: str
    stored: dict[str, Counter[str]]  # resource -> etcd objects per stored apiVersion
    written: int  # objects the clients created
    migrations_while_disagreeing: list[str]
    succeeded: dict[str, int]  # resource -> migrations that succeeded
    believed_migrated: dict[str, bool]  # the trigger in charge thinks all is in v1
    views_match_apiservers: bool  # the projection's StorageVersions equal their discovery
    # resource -> svledger audit's count before the upgrade and after the migrations, each
    # with the versions the ledger then held objects may be stored in
    audits: dict[str, list[tuple[StorageAudited, tuple[str, ...]]]] = dataclasses.field(
        default_factory=dict
    )

    @property
    def left_behind(self) -> int:
        return sum(n for c in self.stored.values() for v, n in c.items() if v != NEW_VERSION)


def addressed(kube: Kube, cluster: LocalCluster) -> dict[str, Kube]:
    """A client of each of ``cluster``'s apiservers, by apiserver ID, as ``svledger collect
    --apiserver HOSTNAME=URL`` makes them: ``kube``'s credentials, each apiserver's URL."""
    return {
        apiserver_id(host): kube.at(url)
        for host, url in zip(cluster.apiserver_hostnames, cluster.urls, strict=True)
    }


def stored_as(key: str, value: bytes) -> str:
    """The apiVersion etcd's ``value`` under ``key`` was written in (:mod:`kube.stored`), or
    what it is instead: such a value is counted as left in an old version."""
    found = decode(key, value)
    if isinstance(found, StoredObject):
        return found.api_version
    if isinstance(found, EncryptedValue):
        return f"encrypted ({found.provider})"
    log.warning("an etcd value that cannot be read: %s", found)
    return f"undecodable ({found.reason})"


def policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": NEW_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["deployments"],
                    }
                ]
            },
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": _LABEL_IT,
                    },
                }
            ],
            "reinvocationPolicy": "Never",
            "failurePolicy": "Fail",
        },
    }


def binding(name: str, policy_name: str) -> dict[str, Any]:
    return {
        "apiVersion": NEW_VERSION,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy_name},
    }


async def clients(
    servers: Sequence[Kube], stop: asyncio.Event, created: list[str], period: float = 0.25
) -> None:
    """Create policies and bindings round-robin through every apiserver until ``stop``."""
    for n in itertools.count():
        if stop.is_set():
            return
        server = servers[n % len(servers)]
        try:
            await server.request("POST", f"/apis/{GROUP}/v1/{RESOURCES[0][0]}", policy(f"p-{n}"))
            await server.request(
                "POST", f"/apis/{GROUP}/v1/{RESOURCES[1][0]}", binding(f"b-{n}", f"p-{n}")
            )
            created.append(f"p-{n}")
        except (ApiError, ClusterUnreachable):
            pass  # that apiserver is restarting; the next request goes to another
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)


async def discovery_hash_trigger(
    settings: KafkaSettings, server: Kube, stop: asyncio.Event
) -> None:
    """The baseline: trust one apiserver's discovery; migrate when its hash changes.

    Only that part of upstream's trigger, which is what pollutes a rolling upgrade:
    unlike :class:`simulation.baseline.DiscoveryHashTrigger` it keeps no StorageState
    and does not ask again for a migration that failed (the run's checks read etcd, not
    the trigger's belief)."""
    seen: dict[str, str] = {}
    versions = {
        hash_of_stored(version, kind): (resource, version)
        for resource, kind in RESOURCES
        for version in (OLD_VERSION, NEW_VERSION)
    }
    async with EventProducer(settings) as producer:
        while not stop.is_set():
            try:
                listing = await server.get(f"/apis/{GROUP}/v1")
            except (ApiError, ClusterUnreachable):
                listing = {"resources": []}
            for entry in listing["resources"]:
                resource = entry["name"]
                found = entry.get("storageVersionHash")
                if found not in versions or seen.get(resource) == found:
                    continue
                seen[resource] = found
                _, version = versions[found]
                migration_id = str(uuid.uuid4())
                await producer.send(
                    MigrationRequested(
                        Meta.new(CLUSTER, BASELINE_SOURCE, SystemClock().now()),
                        migration_id,
                        GROUP,
                        resource,
                        version,
                        found,
                        storage_version_revision="",  # it knows no revisions
                    )
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)


def while_disagreeing(records: Sequence[Any]) -> list[str]:
    """Migrations requested on a disagreement, or that succeeded while the apiservers
    disagreed, each named with its event, position, target and the common version.

    A request is judged by the StorageVersion revision it names, the state it was
    decided on, not by where it landed: a trigger decides on the log as far as it has
    read it, and a report appended meanwhile can land first. Such a request is stale
    when it lands; the worker does not run it and the migrator cancels it. A request
    that names no revision (the discovery-hash trigger knows none) was decided on no
    agreement. A success counts if it moved an active migration (not one cancelled
    before) and the fold took it as done. A success that lands after a report that
    changed the StorageVersion, as the worker's append can (it decided on its fold as
    far as it had read), is stale: the fold rejects it, keeps the persisted hashes and
    the next agreement requests the migration again, so it claims nothing and is not
    counted (as :mod:`simulation.checks` counts it apart).
    """
    state = State()
    common_at: dict[tuple[str, str], str | None] = {}  # (resource, revision) -> common
    bad: list[str] = []
    for record in records:
        event = record.event
        if isinstance(event, MigrationRequested) and event.group == GROUP:
            decided_on = common_at.get((event.resource, event.storage_version_revision))
            if decided_on != event.target_version:
                bad.append(
                    f"MigrationRequested {event.migration_id} of {event.resource} at"
                    f" {record.position}: target {event.target_version}, decided at revision"
                    f" {event.storage_version_revision!r} on common {decided_on}"
                )
        succeeded = None
        if isinstance(event, MigrationSucceeded):
            migration = state.migrations.get((CLUSTER, event.migration_id))
            if migration is not None and migration.active and migration.group == GROUP:
                storage_version = state.storage_versions.get(migration.resource_key)
                common = storage_version.common_encoding_version if storage_version else None
                if common != migration.target_version:
                    succeeded = (
                        f"MigrationSucceeded {event.migration_id} of {migration.resource} at"
                        f" {record.position}: target {migration.target_version}, common {common}"
                    )
        changes = apply(state, event, record.position)
        if succeeded is not None and not changes.rejections:
            bad.append(succeeded)
        for key in changes.storage_versions:
            storage_version = state.storage_versions.get(key)
            if key[1] == GROUP and storage_version is not None:
                common_at[(key[2], storage_version.revision)] = (
                    storage_version.common_encoding_version
                )
    return bad


async def run(settings: KafkaSettings, trigger: str, executor_name: str, workdir: Path) -> Result:
    """One rolling upgrade with ``trigger`` and ``executor_name``; see the module doc."""
    await create_topics(settings)
    db_url = f"sqlite:///{workdir / 'views.db'}"
    database.upgrade(db_url)
    with LocalCluster(
        3,
        version=OLD,
        identity_lease_duration_seconds=30,
        identity_lease_renew_interval=2.0,
        identity_lease_gc_period=5.0,
    ) as cluster:
        kubeconfig = str(cluster.write_kubeconfig(workdir / "kubeconfig", 1))
        kube = await connect(kubeconfig)
        direct = addressed(kube, cluster)
        servers = list(direct.values())
        stop = asyncio.Event()
        clients_stop = asyncio.Event()
        created: list[str] = []
        believed: dict[str, bool] = {}
        executor: Executor = Rewriter(KubernetesTarget(kube), SystemClock(), chunk_size=50)
        if executor_name == "storagemigration":  # as `svledger worker` makes it
            executor = StorageMigrationExecutor(kube, SystemClock(), executor)
        tasks: list[Coroutine[Any, Any, object]] = [
            run_collector(
                settings, CLUSTER, kube, stop=stop, clock=SystemClock(), apiservers=direct
            ),
            run_projector(settings, db_url, stop=stop, group=False),
            run_worker(
                settings,
                executor,
                stop=stop,
                cluster=CLUSTER,
                group_id="rolling-worker",
                concurrency=1 if executor_name == "rewrite" else 100,
                current_only=trigger == "agreement",
                # As `svledger worker` runs; the baseline runs what it is given, as upstream.
                check=IdentityCheck(kube) if trigger == "agreement" else None,
            ),
            clients(servers, clients_stop, created),
        ]
        if trigger == "agreement":
            tasks.append(run_migrator(settings, stop=stop, backoff=Backoff(seconds=5)))
        else:
            tasks.append(discovery_hash_trigger(settings, servers[0], stop))
        running = [asyncio.create_task(t) for t in tasks]
        audits: dict[str, list[tuple[StorageAudited, tuple[str, ...]]]] = {}
        try:
            await asyncio.sleep(10)
            await _audit(settings, cluster, audits)
            for index in range(3):
                log.info("upgrading kube-apiserver %d to %s", index, NEW)
                await asyncio.to_thread(cluster.restart_apiserver, index, NEW)
                await asyncio.sleep(10)
            if executor_name == "storagemigration":
                await asyncio.to_thread(cluster.start_controller_manager, version=NEW)
            await asyncio.sleep(5)
            clients_stop.set()
            await _settle(settings, trigger)
            await _audit(settings, cluster, audits)
            discovered = await _discovered(direct)
        finally:
            stop.set()
            clients_stop.set()
            await asyncio.wait(running, timeout=60)
            for server in [kube, *servers]:
                await server.close()
        state, records = await cluster_log(settings, CLUSTER)
        for resource, kind in RESOURCES:
            if trigger == "discovery-hash":
                # Its belief: the last migration it requested succeeded.
                mine = [
                    r.event.migration_id
                    for r in records
                    if isinstance(r.event, MigrationRequested)
                    and r.event.meta.source == BASELINE_SOURCE
                    and r.event.resource == resource
                ]
                believed[resource] = bool(mine) and (
                    state.migrations[(CLUSTER, mine[-1])].phase == "Succeeded"
                )
            else:
                persisted = state.storage_states[(CLUSTER, GROUP, resource)]
                believed[resource] = persisted.persisted_storage_version_hashes == (
                    hash_of_stored(NEW_VERSION, kind),
                )
        stored = {
            resource: Counter(
                stored_as(key, value)
                for key, value in cluster.etcd_get_prefix(f"/registry/{resource}/")
            )
            for resource, _ in RESOURCES
        }
    engine = database.engine(db_url)
    with engine.connect() as connection:
        projected = load_state(connection)
    engine.dispose()
    return Result(
        trigger=trigger,
        executor=executor_name,
        stored=stored,
        written=len(created),
        migrations_while_disagreeing=while_disagreeing(records),
        succeeded={
            r: sum(
                1 for m in state.migrations.values() if m.resource == r and m.phase == "Succeeded"
            )
            for r, _ in RESOURCES
        },
        believed_migrated=believed,
        views_match_apiservers=_views_match(projected, discovered),
        audits=audits,
    )


async def _audit(
    settings: KafkaSettings,
    cluster: LocalCluster,
    audits: dict[str, list[tuple[StorageAudited, tuple[str, ...]]]],
) -> None:
    """``svledger audit`` of :data:`RESOURCES`, appended to the log, and what the ledger
    then holds objects of each may be stored in (its persisted hashes as versions)."""
    options = AuditOptions(
        CLUSTER, resources=tuple(f"{GROUP}.{r}" for r, _ in RESOURCES), pages_per_second=1000.0
    )
    async with open_store(EtcdSettings((cluster.etcd_url,))) as store:
        result = await run_audit(settings, store, options)
    state, _ = await cluster_log(settings, CLUSTER)
    for event in result.events:
        kind = dict(RESOURCES)[event.resource]
        persisted = state.storage_states[(CLUSTER, GROUP, event.resource)]
        named = {hash_of_stored(v, kind): v for v in (OLD_VERSION, NEW_VERSION)}
        held = tuple(named.get(h, h) for h in persisted.persisted_storage_version_hashes)
        audits.setdefault(event.resource, []).append((event, held))


async def _settle(settings: KafkaSettings, trigger: str) -> None:
    """Wait until the trigger in charge believes both resources migrated (at most 240 s)."""
    for _ in range(240):
        state, _ = await cluster_log(settings, CLUSTER)
        done = []
        for resource, kind in RESOURCES:
            storage_state = state.storage_states.get((CLUSTER, GROUP, resource))
            migrations = [m for m in state.migrations.values() if m.resource == resource]
            if trigger == "agreement":
                done.append(
                    storage_state is not None
                    and storage_state.persisted_storage_version_hashes
                    == (hash_of_stored(NEW_VERSION, kind),)
                )
            else:
                done.append(bool(migrations) and all(not m.active for m in migrations))
        if all(done):
            return
        await asyncio.sleep(1)
    log.warning("the migrations did not settle within 240 s")


async def _discovered(servers: dict[str, Kube]) -> dict[str, dict[str, str]]:
    """Resource -> apiserver ID -> the storageVersionHash that apiserver's own discovery
    shows for it (the version it encodes the resource in)."""
    found: dict[str, dict[str, str]] = {resource: {} for resource, _ in RESOURCES}
    for apiserver, server in servers.items():
        for entry in (await server.get(f"/apis/{GROUP}/v1"))["resources"]:
            if entry["name"] in found and entry.get("storageVersionHash"):
                found[entry["name"]][apiserver] = entry["storageVersionHash"]
    return found


def _views_match(projected: State, discovered: dict[str, dict[str, str]]) -> bool:
    """Whether the projection's StorageVersions of :data:`RESOURCES` hold each apiserver
    encoding in the version its discovery hash names, and their common version."""
    for resource, kind in RESOURCES:
        ours = projected.storage_versions.get((CLUSTER, GROUP, resource))
        if ours is None:
            return False
        entries = {e.apiserver_id: e.encoding_version for e in ours.entries}
        hashes = {a: hash_of_stored(version, kind) for a, version in entries.items()}
        if hashes != discovered[resource]:
            return False
        versions = set(entries.values())
        if ours.common_encoding_version != (versions.pop() if len(versions) == 1 else None):
            return False
    return True


def render(result: Result) -> str:
    lines = [f"## trigger {result.trigger}, executor {result.executor}", ""]
    for resource, stored in result.stored.items():
        versions = ", ".join(f"{v}: {n}" for v, n in sorted(stored.items()))
        believed = "yes" if result.believed_migrated.get(resource) else "no"
        lines.append(
            f"* {resource}: stored in etcd as {versions}; trigger believes all in v1: {believed};"
            f" migrations succeeded: {result.succeeded[resource]}"
        )
    for resource, taken in result.audits.items():
        for when, (event, held) in zip(("before the upgrade", "after"), taken, strict=False):
            found = ", ".join(
                f"{v}: {n}" for v, n in zip(event.versions, event.version_counts, strict=True)
            )
            alarm = f"; POLLUTED: {event.pollution}" if event.pollution else ""
            lines.append(
                f"* svledger audit of {resource} {when} (etcd revision {event.etcd_revision}):"
                f" {found or 'none'}; the ledger then held objects may be in"
                f" {', '.join(held)}{alarm}"
            )
    lines += [
        f"* objects left in an old version (etcd, not {NEW_VERSION}): {result.left_behind}",
        f"* migrations while the apiservers disagreed: {len(result.migrations_while_disagreeing)}",
        f"* projection's StorageVersions equal the apiservers' discovery:"
        f" {result.views_match_apiservers}",
        "",
    ]
    return "\n".join(lines)


async def warm_up(bootstrap: str) -> None:
    """One transaction on a fresh broker, so its internal topics exist before the roles
    start (they otherwise all wait for the transaction coordinator at once)."""
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic="svledger.warm-up", partitions=1)
    await create_topics(settings)
    producer = PartitionProducer(settings, 0, "svledger.warm-up", "svledger.warm-up")
    await producer.start()
    try:
        await producer.append([], consumed=0)
    finally:
        await producer.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trigger", choices=TRIGGERS, action="append")
    parser.add_argument("--executor", choices=EXECUTORS, default="rewrite")
    args = parser.parse_args(argv)
    # Restarting apiservers make every role log warnings; the run's result is the point.
    logging.basicConfig(level=os.environ.get("SVLEDGER_LOG_LEVEL", "ERROR"))

    async def all_runs() -> int:
        failed = 0
        left: dict[str, int] = {}
        with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as tmp:
            await warm_up(bootstrap)
            for trigger in args.trigger or TRIGGERS:
                workdir = Path(tmp) / trigger
                workdir.mkdir()
                topic = f"svledger.rolling-upgrade.{trigger}.{uuid.uuid4().hex[:8]}"
                settings = KafkaSettings(bootstrap_servers=bootstrap, topic=topic, partitions=3)
                result = await run(settings, trigger, args.executor, workdir)
                print(render(result), flush=True)
                left[trigger] = result.left_behind
                if trigger == "agreement" and (
                    result.left_behind or result.migrations_while_disagreeing
                ):
                    failed = 1
        print(
            "objects left in an old version:",
            ", ".join(f"{trigger} trigger {n}" for trigger, n in left.items()),
            flush=True,
        )
        return failed

    return asyncio.run(all_runs())


if __name__ == "__main__":
    sys.exit(main())
