"""Upstream's StorageVersion GC races with apiserver restarts; the ledger does not.

kube-controller-manager's StorageVersion GC removes an apiserver's entries from every
StorageVersion when that apiserver's identity lease is deleted. kube-apiserver deletes
its own lease when it stops and again when it starts, then re-registers its entries.
The GC checks the lease, then lists and rewrites the objects: when the apiserver it
talks to restarts, the GC can remove the entries the restarted apiserver has just
re-registered, and nothing puts them back until the apiserver's next periodic
registration (10 minutes). Upstream's objects then lack entries of a live apiserver,
and a migrator trusting them could start while that apiserver still writes an old
version. The ledger removes entries only when a lease ends, so it stays complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from deploy.kube.cluster import LocalCluster
from kube.client import Kube, connect
from ledger.kafka import create_topics
from ledger.settings import KafkaSettings
from projections.replay import cluster_log
from tests.integration.test_collector import CLUSTER, collecting
from tests.kube import eventually, ledger_views, upstream_leases, upstream_views

RESTARTS = 8


@pytest.fixture
async def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=3)
    await create_topics(settings)
    return settings


@pytest.fixture
async def kube(kube_cluster: LocalCluster, tmp_path: Path) -> AsyncIterator[Kube]:
    # The collector talks to apiserver 1, which stays up; the GC to apiserver 0.
    client = await connect(str(kube_cluster.write_kubeconfig(tmp_path / "kubeconfig", 1)))
    yield client
    await client.close()


async def short_objects(kube: Kube, names: set[str]) -> list[str]:
    """StorageVersions upstream that lack an entry of a live apiserver (or are gone)."""
    live = set(await upstream_leases(kube))
    views = await upstream_views(kube)
    return sorted(name for name in names if name not in views or set(views[name][0]) != live)


async def test_the_ledger_stays_complete_where_upstream_gc_loses_entries(
    settings: KafkaSettings, kube: Kube, kube_cluster: LocalCluster
) -> None:
    await asyncio.to_thread(
        kube_cluster.start_controller_manager,
        ("storageversion-garbage-collector-controller",),
        server_index=0,
    )
    async with collecting(settings, kube):

        async def complete() -> str | None:
            state, _ = await cluster_log(settings, CLUSTER)
            live = set(await upstream_leases(kube))
            views = ledger_views(state, CLUSTER)
            short = [n for n, (entries, _, _) in views.items() if set(entries) != live]
            if len(views) < 40 or short:
                return f"{len(views)} StorageVersions, {len(short)} short, e.g. {short[:3]}"
            return None

        await eventually(complete, "the ledger holds every apiserver's entries")
        names = set(ledger_views((await cluster_log(settings, CLUSTER))[0], CLUSTER))
        short: list[str] = []
        for _ in range(RESTARTS):
            await asyncio.to_thread(kube_cluster.restart_apiserver, 0)
            await asyncio.sleep(5)  # registration and the GC have run by now
            short = await short_objects(kube, names)
            if short:
                break
        assert short, f"the GC race did not show in {RESTARTS} restarts of its apiserver"

        await eventually(complete, "the ledger holds every live apiserver's entries")
        # Upstream has not repaired itself: its objects still lack entries.
        assert await short_objects(kube, names)
