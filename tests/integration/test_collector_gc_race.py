"""Upstream's StorageVersion GC races with apiserver restarts; the ledger does not.

kube-controller-manager's StorageVersion GC removes an apiserver's entries from every
StorageVersion when that apiserver's identity lease is deleted. kube-apiserver deletes
its own lease when it stops and again when it starts, then re-registers its entries.
The GC checks the lease, then lists and rewrites the objects: when the apiserver it
talks to restarts, the GC can remove the entries the restarted apiserver has just
re-registered, and nothing puts them back while that apiserver runs. Upstream's objects
then lack entries of a live apiserver, and a migrator trusting them could start while
that apiserver still writes an old version. The ledger removes entries only when a
lease ends, and reports a returning apiserver with the entries last seen for it, so it
stays complete.

Whether the GC wins that race on a given restart is timing. The test makes its outcome
certain on real binaries instead: it removes a live apiserver's entries from every
StorageVersion, as the GC's losing write does, then ends that apiserver's lease and
lets it come back without a restart (the process is paused, its lease deleted, and
resumed: it recreates its lease and, not having restarted, registers nothing again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from deploy.kube.cluster import LocalCluster
from kube.client import Kube, connect
from ledger.events import SOURCE_STORAGE_VERSION
from ledger.kafka import create_topics
from ledger.settings import KafkaSettings
from projections.replay import cluster_log
from tests.integration.test_collector import CLUSTER, collecting
from tests.kube import eventually, ledger_leases, ledger_views, upstream_leases, upstream_views

STORAGE_VERSIONS = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
RETURNING = 0  # the apiserver whose lease ends and comes back


@pytest.fixture(scope="module")
def storage_version_api() -> bool:
    """The race is upstream's StorageVersion objects'."""
    return True


@pytest.fixture
async def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=3)
    await create_topics(settings)
    return settings


@pytest.fixture
async def kube(kube_cluster: LocalCluster, tmp_path: Path) -> AsyncIterator[Kube]:
    # The collector and the test talk to apiserver 1, which keeps serving throughout.
    client = await connect(str(kube_cluster.write_kubeconfig(tmp_path / "kubeconfig", 1)))
    yield client
    await client.close()


async def short_objects(kube: Kube, names: set[str]) -> list[str]:
    """StorageVersions upstream that lack an entry of a live apiserver (or are gone)."""
    live = set(await upstream_leases(kube))
    views = await upstream_views(kube)
    return sorted(name for name in names if name not in views or set(views[name][0]) != live)


async def remove_entries(kube: Kube, apiserver_id: str) -> int:
    """Write every StorageVersion without ``apiserver_id``'s entry, as upstream's GC does."""
    removed = 0
    for obj in (await kube.get(STORAGE_VERSIONS))["items"]:
        status = obj.get("status") or {}
        entries = status.get("storageVersions") or []
        kept = [e for e in entries if e.get("apiServerID") != apiserver_id]
        if len(kept) == len(entries):
            continue
        status["storageVersions"] = kept
        path = f"{STORAGE_VERSIONS}/{obj['metadata']['name']}/status"
        await kube.request("PUT", path, {**obj, "status": status})
        removed += 1
    return removed


async def test_the_ledger_stays_complete_where_upstream_gc_loses_entries(
    settings: KafkaSettings, kube: Kube, kube_cluster: LocalCluster
) -> None:
    hostname = kube_cluster.apiserver_hostnames[RETURNING]
    async with collecting(settings, kube):

        async def complete() -> str | None:
            state, _ = await cluster_log(settings, CLUSTER)
            live = set(await upstream_leases(kube))
            views = ledger_views(state, CLUSTER, SOURCE_STORAGE_VERSION)
            short = [n for n, (entries, _, _) in views.items() if set(entries) != live]
            if len(live) < 3 or len(views) < 40 or short:
                return (
                    f"{len(live)} live apiservers, {len(views)} StorageVersions, "
                    f"{len(short)} short, e.g. {short[:3]}"
                )
            return None

        await eventually(complete, "the ledger holds every apiserver's entries")
        state, _ = await cluster_log(settings, CLUSTER)
        names = set(ledger_views(state, CLUSTER, SOURCE_STORAGE_VERSION))
        (returning,) = [
            a for a, lease in (await upstream_leases(kube)).items() if lease[1] == hostname
        ]

        assert await remove_entries(kube, returning) == len(names)
        assert await short_objects(kube, names) == sorted(names)

        await asyncio.to_thread(kube_cluster.pause_apiserver, RETURNING)
        try:
            await kube.request("DELETE", f"{LEASES}/{returning}")

            async def ended() -> str | None:
                state, _ = await cluster_log(settings, CLUSTER)
                views = ledger_views(state, CLUSTER, SOURCE_STORAGE_VERSION)
                holding = [n for n, view in views.items() if returning in view[0]]
                if returning in ledger_leases(state, CLUSTER) or holding:
                    return f"the ledger holds {returning}'s lease or entries ({holding[:3]})"
                return None

            await eventually(ended, f"the ledger ends {returning}'s lease")
        finally:
            await asyncio.to_thread(kube_cluster.resume_apiserver, RETURNING)

        await eventually(complete, "the ledger holds every live apiserver's entries again")
        assert returning in await upstream_leases(kube)
        # Upstream has not repaired itself: its objects still lack the returned entries.
        assert await short_objects(kube, names) == sorted(names)
