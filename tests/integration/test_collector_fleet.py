"""``svledger collect --fleet``: one process for many real clusters, and several sharing them.

Three real clusters (etcd and one stock kube-apiserver each, all three apiservers under
the same hostname, so the same apiserver ID in each cluster) are collected by a fleet
collector process into one topic and by three single collectors (``run_collector``, one
per cluster) into another: each cluster's ledger must be the same in both. A second
fleet process then joins and takes part of the fleet; the first is killed (``kill -9``),
and the second must take its clusters over: what changes in every cluster after the
kill reaches the ledger, and no event is appended twice.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeAlias

import pytest

from deploy.kube.cluster import LocalCluster
from kube.client import Kube, connect
from kube.collector import run_collector
from ledger.clock import SystemClock
from ledger.kafka import create_topics
from ledger.kafka.topics import partition_of
from ledger.settings import KafkaSettings
from projections.replay import cluster_log
from projections.state import State
from tests.kube import (
    KUBE_LEASE_SECONDS,
    KUBE_RENEW_SECONDS,
    Views,
    assert_nothing_twice,
    eventually,
    ledger_leases,
    ledger_views,
)
from tests.processes import svledger

PARTITIONS = 3


def names() -> list[str]:
    """Three cluster names placed in the three partitions, one each: two processes of a
    fleet then each hold a cluster (the group deals each of them a partition at least)."""
    chosen: dict[int, str] = {}
    for i in range(100):
        chosen.setdefault(partition_of(f"fleet-{i}", range(PARTITIONS)), f"fleet-{i}")
    assert len(chosen) == PARTITIONS
    return sorted(chosen.values())


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, LocalCluster]]:
    """The fleet: a cluster of one apiserver per name, started side by side."""
    fleet = {
        name: LocalCluster(
            1,
            identity_lease_duration_seconds=KUBE_LEASE_SECONDS,
            identity_lease_renew_interval=KUBE_RENEW_SECONDS,
        )
        for name in names()
    }
    try:
        with ThreadPoolExecutor(len(fleet)) as pool:
            list(pool.map(LocalCluster.start, fleet.values()))
        yield fleet
    finally:
        with ThreadPoolExecutor(len(fleet)) as pool:
            list(pool.map(LocalCluster.stop, fleet.values()))


def start_fleet_collector(
    settings: KafkaSettings, fleet: Path, log: Path
) -> subprocess.Popen[bytes]:
    return svledger("collect", "--fleet", str(fleet), settings=settings, log=log)


def collecting(log: Path) -> set[str]:
    """The clusters the collector process logging to ``log`` collects now, by its log."""
    held: set[str] = set()
    for line in log.read_text().splitlines():
        message = json.loads(line).get("message", "") if line.startswith("{") else ""
        if message.startswith("collecting cluster "):
            held.add(message.split()[2])
        elif message.startswith("letting cluster "):
            held.discard(message.split()[2])
    return held


Summary: TypeAlias = tuple[dict[str, tuple[object, ...]], Views, list[tuple[object, ...]]]


def summary(state: State, cluster: str) -> Summary:
    """What a cluster's ledger says, less what differs between two runs that collect it at
    once: when each renewal and observation was read."""
    leases = {a: lease[:3] for a, lease in ledger_leases(state, cluster).items()}
    definitions = sorted(
        (d.name, d.uid, d.generation, d.versions, d.storage_version, d.stored_versions)
        for d in state.custom_resources.values()
        if d.cluster == cluster
    )
    return leases, ledger_views(state, cluster), definitions


async def differences(
    fleet: KafkaSettings, single: KafkaSettings, clusters: Mapping[str, str]
) -> str | None:
    """What differs between the two ledgers of each cluster, each of which must hold its
    lease and the custom resource ``clusters`` names for it."""
    for cluster, plural in clusters.items():
        ours = summary((await cluster_log(fleet, cluster))[0], cluster)
        theirs = summary((await cluster_log(single, cluster))[0], cluster)
        leases, views, definitions = ours
        if len(leases) != 1 or len(views) < 40:
            return f"{cluster}: not collected yet ({len(views)} resources)"
        if not any(str(d[0]).startswith(f"{plural}.") for d in definitions):
            return f"{cluster}: no {plural} in {definitions}"
        if ours != theirs:
            return f"{cluster}: the fleet collector's ledger {ours} != the single one's {theirs}"
    return None


def crd(plural: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.fleet.example.com"},
        "spec": {
            "group": "fleet.example.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural.title()[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }


async def define(kubes: Mapping[str, Kube], plurals: Mapping[str, str]) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for cluster, plural in plurals.items():
        await kubes[cluster].request("POST", path, crd(plural))


async def test_a_fleet_process_collects_as_single_collectors_do_and_its_clusters_are_taken_over(
    clusters: dict[str, LocalCluster], kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    fleet_settings = KafkaSettings(kafka_bootstrap, topic=unique_topic, partitions=PARTITIONS)
    single_settings = KafkaSettings(
        kafka_bootstrap, topic=f"{unique_topic}.single", partitions=PARTITIONS
    )
    await create_topics(fleet_settings)
    await create_topics(single_settings)
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    kubes = {
        name: await connect(str(cluster.write_kubeconfig(fleet / f"{name}.yaml")))
        for name, cluster in clusters.items()
    }
    (fleet / "..data").mkdir()  # as kubelet mounts a Secret: skipped
    stop = asyncio.Event()
    singles = [
        asyncio.create_task(
            run_collector(single_settings, name, kube, stop=stop, clock=SystemClock())
        )
        for name, kube in kubes.items()
    ]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = start_fleet_collector(fleet_settings, fleet, logs[0])
    second: subprocess.Popen[bytes] | None = None
    try:
        # One process, three clusters, each with a definition of its own: a collector
        # that crossed two clusters' wires would show one in the other's ledger.
        before = {name: f"widgets{i}" for i, name in enumerate(kubes)}
        await define(kubes, before)
        await eventually(
            lambda: differences(fleet_settings, single_settings, before),
            "one fleet collector's ledgers equal three single collectors'",
        )
        assert collecting(logs[0]) == set(kubes)

        # A second process of the fleet takes part of it over.
        second = start_fleet_collector(fleet_settings, fleet, logs[1])

        async def shared() -> str | None:
            held = [collecting(log) for log in logs]
            if not all(held) or held[0] | held[1] != set(kubes) or held[0] & held[1]:
                return f"held {held}"
            return None

        await eventually(shared, "the two processes share the fleet", timeout=90)
        taken = collecting(logs[0])

        # The first is killed; whatever changes in every cluster after that is collected,
        # by the second, for the clusters the first held too.
        first.send_signal(signal.SIGKILL)
        first.wait()
        after = {name: f"gadgets{i}" for i, name in enumerate(kubes)}
        await define(kubes, after)
        await eventually(
            lambda: differences(fleet_settings, single_settings, after),
            f"the clusters of the killed process ({sorted(taken)}) taken over",
            timeout=90,
        )
        assert collecting(logs[1]) == set(kubes)
    finally:
        stop.set()
        await asyncio.gather(*singles)
        for kube in kubes.values():
            await kube.close()
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        if second is not None:
            assert second.wait(60) == 0, logs[1].read_text()[-3000:]
    for name in kubes:
        _, records = await cluster_log(fleet_settings, name)
        assert_nothing_twice(records)
