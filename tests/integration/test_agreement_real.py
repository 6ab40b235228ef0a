"""Agreement on stock kube-apiservers: every member reports, sources agree, leaving means stopped.

Real etcd and kube-apiservers built here, run with upstream's defaults (no StorageVersion
API, protobuf storage) unless a test is about that API; the collector and the migration
trigger run in this process against the suite's broker, and the assertions read the log
(every decision is an event in it) and, for ``explain``, views replayed from it.

* An apiserver the collector cannot ask (its address withheld, then its port closed)
  leaves agreement on every resource unknown, and no migration is requested (or one
  requested goes on) until it is read again.
* With the alpha StorageVersion API on, a StorageVersion entry that contradicts the same
  apiserver's discovery hash is a disagreement, shown in the condition and the metric.
* An apiserver told to stop deletes its lease and serves on for its shutdown delay: the
  ledger keeps it a member until it no longer answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from consumers.migrator import REASON_UNKNOWN, run_migrator
from deploy.kube.cluster import LocalCluster, free_port
from deploy.kube.rolling_upgrade import NEW, OLD, addressed
from kube.client import ApiError, ClusterUnreachable, Kube, connect
from kube.collector import run_collector
from ledger import metrics
from ledger.clock import SystemClock
from ledger.events import (
    ApiserverLeaseReleased,
    Event,
    MigrationCancelled,
    MigrationRequested,
    StorageVersionWithdrawn,
)
from ledger.identity import SHUTDOWN_WINDOW_SECONDS, apiserver_id
from ledger.kafka import create_topics
from ledger.settings import KafkaSettings
from projections.history import explain
from projections.replay import cluster_log, replay
from tests.kube import eventually

CLUSTER = "stock"
PODS = ("", "pods")
POLICIES = ("admissionregistration.k8s.io", "mutatingadmissionpolicies")


@pytest.fixture(scope="module")
def two_apiservers() -> Iterator[LocalCluster]:
    with LocalCluster(2, version=NEW) as cluster:
        yield cluster


@pytest.fixture
async def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    return settings


@contextlib.asynccontextmanager
async def running(
    settings: KafkaSettings,
    cluster: LocalCluster,
    tmp_path: Path,
    closed: frozenset[int] = frozenset(),
    shutdown_window: float = SHUTDOWN_WINDOW_SECONDS,
) -> AsyncIterator[Kube]:
    """A collector, given each apiserver's address but a closed port for those numbered
    ``closed``, and the migration trigger, while the block runs; it gets a client of the
    cluster."""
    kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
    given = addressed(kube, cluster)
    for index in closed:
        given[apiserver_id(cluster.apiserver_hostnames[index])] = kube.at(
            f"https://127.0.0.1:{free_port()}"
        )
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            run_collector(
                settings,
                CLUSTER,
                kube,
                stop=stop,
                clock=SystemClock(),
                apiservers=given,
                shutdown_window=shutdown_window,
            )
        ),
        asyncio.create_task(run_migrator(settings, stop=stop)),
    ]
    try:
        yield kube
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for client in given.values():
            await client.close()
        await kube.close()


async def log_of(settings: KafkaSettings) -> list[Event]:
    return [record.event for record in (await cluster_log(settings, CLUSTER))[1]]


def sampled(gauge: metrics.SampledGauge) -> dict[tuple[str, ...], float]:
    """The gauge's samples as a scrape shows them (taken on this loop)."""
    (family,) = gauge.collect()
    return {tuple(sample.labels.values()): sample.value for sample in family.samples}


async def test_agreement_is_unknown_while_an_apiserver_cannot_be_asked(
    settings: KafkaSettings, two_apiservers: LocalCluster, tmp_path: Path
) -> None:
    cluster = two_apiservers
    first, second = (apiserver_id(host) for host in cluster.apiserver_hostnames)

    # The second apiserver's address is a closed port (each kube-apiserver's lease
    # advertises its address, which --apiserver overrides): it holds a lease and the
    # collector cannot ask it.
    async with running(settings, cluster, tmp_path, closed=frozenset({1})):

        async def unknown_everywhere() -> str | None:
            state, _ = await cluster_log(settings, CLUSTER)
            if {a for c, a in state.leases if c == CLUSTER} != {first, second}:
                return f"leases {sorted(state.leases)}"
            pods = state.storage_versions.get((CLUSTER, *PODS))
            if pods is None:
                return "no StorageVersion of pods yet"
            wrong = [
                sv.name
                for sv in state.storage_versions.values()
                if sv.condition.status != "Unknown" or second not in sv.condition.message
            ]
            return f"not unknown: {wrong}" if wrong else None

        await eventually(unknown_everywhere, "agreement unknown on every resource")
        unreported = sampled(metrics.UNREPORTED_APISERVERS)
        assert unreported[CLUSTER, "core.pods"] == 1
        assert sampled(metrics.AGREEMENT)[CLUSTER, "core.pods", "Unknown"] == 1
        await asyncio.sleep(3)  # time for a trigger that would (wrongly) request
    events = await log_of(settings)
    assert not [e for e in events if isinstance(e, MigrationRequested)]

    database = f"sqlite:///{tmp_path / 'views.db'}"
    await replay(settings, database, progress=False)
    with create_engine(database).connect() as connection:
        text = explain(connection, "core.pods", CLUSTER)
    assert "Agreement is unknown" in text
    assert f"{second} joined at ApiserverHeartbeat" in text
    assert f"its lease names peer address 127.0.0.1:{cluster.urls[1].rpartition(':')[2]}" in text

    # Both addresses: every resource agrees, and migrations are requested.
    async with running(settings, cluster, tmp_path):

        async def requested() -> str | None:
            state, _ = await cluster_log(settings, CLUSTER)
            pods = state.storage_versions[CLUSTER, *PODS]
            if pods.common_encoding_version != "v1":
                return f"pods: {pods.condition}"
            active = [m for m in state.migrations.values() if m.active]
            return None if active else "no migration requested"

        await eventually(requested, "agreement and migrations with every address")

        # The second apiserver's port closed (killed: its lease stays until it expires).
        cluster.kill_apiserver(1)

        async def cancelled() -> str | None:
            state, _ = await cluster_log(settings, CLUSTER)
            pods = state.storage_versions[CLUSTER, *PODS]
            active = [m.resource for m in state.migrations.values() if m.active]
            if pods.condition.status != "Unknown" or active:
                return f"pods {pods.condition.status}, active migrations of {active}"
            return None

        await eventually(cancelled, "agreement unknown once its port is closed")
        events = await log_of(settings)
        withdrawn = [e for e in events if isinstance(e, StorageVersionWithdrawn)]
        assert withdrawn and {e.apiserver_id for e in withdrawn} == {second}
        assert all(e.reason and "could not be read" in e.reason for e in withdrawn)
        cancels = [e for e in events if isinstance(e, MigrationCancelled)]
        assert cancels and all(e.reason == REASON_UNKNOWN for e in cancels)
        cut = len(events)

        # Back: read again under its new lease, and migrations are requested again.
        await asyncio.to_thread(cluster.start_apiserver, 1)
        await eventually(requested, "migrations once it answers again")
        later = (await log_of(settings))[cut:]
        assert any(isinstance(e, ApiserverLeaseReleased) for e in later)  # its old holder


async def test_a_storage_version_entry_against_its_apiservers_discovery_is_a_disagreement(
    settings: KafkaSettings, tmp_path: Path
) -> None:
    with LocalCluster(1, version=NEW, storage_version_api=True) as cluster:
        only = apiserver_id(cluster.apiserver_hostnames[0])
        async with running(settings, cluster, tmp_path) as kube:

            async def agreed() -> str | None:
                state, _ = await cluster_log(settings, CLUSTER)
                pods = state.storage_versions.get((CLUSTER, *PODS))
                sources = sorted(e.source for e in pods.entries) if pods else []
                if sources != ["discovery", "storageversion"] or pods is None:
                    return f"pods entries from {sources}"
                return None if pods.common_encoding_version == "v1" else str(pods.condition)

            await eventually(agreed, "both sources of pods, agreeing")
            # An entry that says otherwise (written by hand, or left by an earlier process).
            path = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions/core.pods"
            obj = await kube.get(path)
            for entry in obj["status"]["storageVersions"]:
                entry["encodingVersion"] = "v2"
                entry["decodableVersions"] = ["v1", "v2"]
            obj["status"]["commonEncodingVersion"] = "v2"
            await kube.request("PUT", f"{path}/status", body=obj)

            async def conflicting() -> str | None:
                state, _ = await cluster_log(settings, CLUSTER)
                pods = state.storage_versions[CLUSTER, *PODS]
                return None if pods.condition.status == "False" else str(pods.condition)

            await eventually(conflicting, "a disagreement between the sources")
            state, _ = await cluster_log(settings, CLUSTER)
            pods = state.storage_versions[CLUSTER, *PODS]
            assert f"sources disagree: {only}: discovery v1, storageversion v2" in (
                pods.condition.message
            )
            assert sampled(metrics.SOURCE_CONFLICTS)[CLUSTER, "core.pods"] == 1
            migrations = [m for m in state.migrations.values() if (m.group, m.resource) == PODS]
            assert not [m for m in migrations if m.active]


async def test_an_apiserver_told_to_stop_is_a_member_until_it_no_longer_answers(
    settings: KafkaSettings, tmp_path: Path
) -> None:
    # The old release stores mutatingadmissionpolicies in v1beta1, the new one in v1.
    delay = 10
    with LocalCluster(
        2, version=OLD, extra_apiserver_args=[f"--shutdown-delay-duration={delay}s"]
    ) as cluster:
        await asyncio.to_thread(cluster.restart_apiserver, 0, NEW)
        old = apiserver_id(cluster.apiserver_hostnames[1])
        async with running(settings, cluster, tmp_path, shutdown_window=0):

            async def disagreeing() -> str | None:
                state, _ = await cluster_log(settings, CLUSTER)
                policies = state.storage_versions.get((CLUSTER, *POLICIES))
                if policies is None or len({e.apiserver_id for e in policies.entries}) < 2:
                    return "not both apiservers' entries of mutatingadmissionpolicies yet"
                return None if policies.condition.status == "False" else str(policies.condition)

            await eventually(disagreeing, "the two releases disagreeing")
            answered_until = told = time.time()
            stopping = asyncio.create_task(asyncio.to_thread(cluster.stop_apiserver, 1))
            kube = await connect(str(cluster.write_kubeconfig(tmp_path / "asker")))
            clients = addressed(kube, cluster)
            try:
                while not stopping.done():
                    await clients[old].get("/api")
                    answered_until = time.time()
                    await asyncio.sleep(0.2)
            except (ApiError, ClusterUnreachable):
                pass  # it no longer answers
            finally:
                for client in (kube, *clients.values()):
                    await client.close()
            await stopping

            async def requested() -> str | None:
                state, _ = await cluster_log(settings, CLUSTER)
                active = [m for m in state.migrations.values() if m.active]
                return None if any(m.resource == POLICIES[1] for m in active) else "none yet"

            await eventually(requested, "a migration once the old apiserver has stopped")
        events = await log_of(settings)
        [released] = [
            e for e in events if isinstance(e, ApiserverLeaseReleased) and e.apiserver_id == old
        ]
        # It answered for its shutdown delay after it deleted its lease: released after.
        assert answered_until - told >= delay - 2
        assert released.meta.occurred_at.timestamp() >= answered_until
        requests = [
            i
            for i, e in enumerate(events)
            if isinstance(e, MigrationRequested) and e.resource == POLICIES[1]
        ]
        assert requests and min(requests) > events.index(released)
