"""``svledger collect`` against real kube-apiservers (etcd + three apiservers built here).

The module's cluster serves the alpha StorageVersion API, so that the collector's
events, folded, can be held against what the apiservers publish: every StorageVersion's
entries, common encoding version and condition, field by field, and every identity
Lease. When an apiserver stops, the ledger drops its lease and its entries from every
StorageVersion by itself (upstream leaves them to kube-controller-manager's GC, which
does not run here, so upstream's objects keep them). Killing the collector at random
points, or running two at once, must leave no event appended twice and none missing.
The tests of stock clusters (no StorageVersion API, protobuf in etcd) start clusters of
their own and hold the ledger against each apiserver's discovery.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import random
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from deploy.kube.cluster import LocalCluster
from deploy.kube.rolling_upgrade import (
    GROUP,
    NEW,
    NEW_VERSION,
    OLD,
    OLD_VERSION,
    RESOURCES,
    addressed,
)
from kube import watch
from kube.client import ApiError, Kube, connect
from kube.cluster_check import IdentityCheck
from kube.collector import run_collector
from ledger.clock import SystemClock
from ledger.events import SOURCE_STORAGE_VERSION, ApiserverHeartbeat, StorageVersionReported
from ledger.hashing import storage_version_hash
from ledger.identity import apiserver_id
from ledger.kafka import create_topics
from ledger.names import resource_name, split_group_version
from ledger.settings import KafkaSettings
from projections.fold import apply
from projections.replay import cluster_log
from projections.state import State
from tests.kube import (
    KUBE_LEASE_SECONDS,
    KUBE_RENEW_SECONDS,
    assert_nothing_twice,
    eventually,
    kube_at,
    ledger_leases,
    ledger_views,
    upstream_leases,
    upstream_views,
)
from tests.processes import svledger

CLUSTER = "real"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def storage_version_api() -> bool:
    """``agree`` holds the ledger against upstream's StorageVersion objects."""
    return True


@pytest.fixture
async def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=3)
    await create_topics(settings)
    return settings


@pytest.fixture
async def kube(kubeconfig: str) -> AsyncIterator[Kube]:
    client = await connect(kubeconfig)
    yield client
    await client.close()


@contextlib.asynccontextmanager
async def collecting(
    settings: KafkaSettings,
    kube: Kube,
    renewal_interval: timedelta = timedelta(0),
    apiservers: dict[str, Kube] | None = None,
) -> AsyncIterator[None]:
    """A collector of ``CLUSTER`` while the block runs; then it is stopped and the
    ``apiservers``' clients are closed."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_collector(
            settings,
            CLUSTER,
            kube,
            stop=stop,
            clock=SystemClock(),
            renewal_interval=renewal_interval,
            apiservers=apiservers,
        )
    )
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        for client in (apiservers or {}).values():
            await client.close()


async def agree(
    settings: KafkaSettings,
    kube: Kube,
    dead: frozenset[str] = frozenset(),
    *,
    renewals: bool = True,
) -> None:
    """Wait until the ledger equals upstream, less the entries of ``dead`` apiservers.

    Leases renew while the log is read, so a lease's last renewal in the ledger must lie
    between upstream's before and after the read; without ``renewals`` it is not
    compared (a log busy with other clusters is read more slowly than the leases are
    renewed)."""

    async def wrong() -> str | None:
        before = await upstream_leases(kube)
        state, _ = await cluster_log(settings, CLUSTER)
        after = await upstream_leases(kube)
        ledger_has = ledger_leases(state, CLUSTER)
        held = {a: lease[:3] for a, lease in ledger_has.items()}
        if before.keys() != after.keys() or held != {a: lease[:3] for a, lease in after.items()}:
            return f"leases {ledger_has} != upstream {after}"
        if renewals:
            behind = [
                a for a, lease in ledger_has.items() if not before[a][3] <= lease[3] <= after[a][3]
            ]
            if behind:
                return f"renewals of {behind}: ledger {ledger_has} not between {before} and {after}"
        upstream = await upstream_views(kube)
        for name, (entries, _, _) in list(upstream.items()):
            live = {a: e for a, e in entries.items() if a not in dead}
            if len(live) != len(entries):
                # Upstream keeps a stopped apiserver's entries until its GC runs.
                common = {e[0] for e in live.values()}
                upstream[name] = (
                    live,
                    common.pop() if len(common) == 1 else None,
                    upstream[name][2],
                )
        upstream = {name: view for name, view in upstream.items() if view[0]}
        # What upstream's objects say; the ledger holds each apiserver's discovery too.
        ledger = ledger_views(state, CLUSTER, SOURCE_STORAGE_VERSION)
        if not dead and ledger != upstream:
            differ = sorted(
                n for n in upstream.keys() | ledger.keys() if upstream.get(n) != ledger.get(n)
            )
            first = differ[0]
            return (
                f"{len(differ)} StorageVersions differ, e.g. {first}: ledger"
                f" {ledger.get(first)} != upstream {upstream.get(first)}"
            )
        if dead and {n: v[:2] for n, v in ledger.items()} != {
            n: v[:2] for n, v in upstream.items()
        }:
            return "entries differ"
        return None

    await eventually(wrong, "the ledger holds what the apiservers publish")


async def test_the_ledger_holds_exactly_what_the_apiservers_publish(
    settings: KafkaSettings, kube: Kube, kube_cluster: LocalCluster
) -> None:
    async with collecting(settings, kube):
        await agree(settings, kube)
        state, records = await cluster_log(settings, CLUSTER)
        assert len(ledger_leases(state, CLUSTER)) == 3
        views = ledger_views(state, CLUSTER)
        # Upstream's own names and versions: core as "core.", group-qualified versions,
        # events.k8s.io events stored as core v1 Events.
        assert views["apps.deployments"][1] == "apps/v1"
        assert views["core.pods"][1] == "v1"
        assert "events.k8s.io/v1" in next(iter(views["core.events"][0].values()))[1]
        assert len(views) > 40

        # An apiserver that stops: its lease and its entries leave the ledger.
        stopped = kube_cluster.apiserver_hostnames[2]
        gone = frozenset(
            a for a, (_, host, _, _) in ledger_leases(state, CLUSTER).items() if host == stopped
        )
        assert len(gone) == 1
        await asyncio.to_thread(kube_cluster.stop_apiserver, 2)
        await agree(settings, kube, dead=gone)
        state, _ = await cluster_log(settings, CLUSTER)
        assert all(
            apiserver not in entries
            for entries, _, _ in ledger_views(state, CLUSTER).values()
            for apiserver in gone
        )

        # Back with the same identity: a heartbeat, then every entry reported again.
        await asyncio.to_thread(kube_cluster.start_apiserver, 2)
        await agree(settings, kube)
        _, records = await cluster_log(settings, CLUSTER)
        assert_nothing_twice(records)


async def test_the_workers_identity_check_tells_the_collected_cluster_from_another(
    settings: KafkaSettings, kube: Kube
) -> None:
    async with collecting(settings, kube):
        await agree(settings, kube)
        state, _ = await cluster_log(settings, CLUSTER)
    check = IdentityCheck(kube)
    assert await check(state, CLUSTER) is None

    # Another cluster whose apiservers have the same names (the same hostnames): other
    # processes, other holders.
    for lease in [lease for lease in state.leases.values() if lease.cluster == CLUSTER]:
        other = dataclasses.replace(
            lease, cluster="other", holder_identity=f"{lease.apiserver_id}_{uuid.uuid4()}"
        )
        state.leases[other.key] = other
    reason = await check(state, "other")
    assert reason is not None
    assert f"the kubeconfig's API server {kube.host} may not be cluster 'other'" in reason
    assert "none in common" in reason
    for holder in {h for h, _, _, _ in (await upstream_leases(kube)).values()}:
        assert holder in reason
    assert "the ledger's leases of 'nowhere' by nobody" in (await check(state, "nowhere") or "")


async def test_a_renewal_interval_thins_the_apiservers_renewals_and_keeps_their_leases(
    settings: KafkaSettings, kube: Kube, kube_cluster: LocalCluster
) -> None:
    """``svledger collect --renewal-interval``: the apiservers renew every 2 s, the ledger
    takes a renewal of a holder only once it is the interval newer than the last one,
    and never lets it fall half a lease duration behind; membership stays upstream's."""
    interval = timedelta(seconds=3 * KUBE_RENEW_SECONDS)
    async with collecting(settings, kube, interval):
        await agree(settings, kube, renewals=False)
        await asyncio.sleep(4 * interval.total_seconds())
        await agree(settings, kube, renewals=False)
    _, records = await cluster_log(settings, CLUSTER)
    assert_nothing_twice(records)
    renewed: dict[tuple[str, str], list[datetime]] = collections.defaultdict(list)
    for record in records:
        if isinstance(event := record.event, ApiserverHeartbeat):
            renewed[event.apiserver_id, event.holder_identity].append(event.renew_time)
    assert len(renewed) == 3
    # The next renewal past the interval is taken (here within 2 s of it, later only if
    # the collector stalls): the ledger's lease never lapses while upstream's lives.
    lease = timedelta(seconds=KUBE_LEASE_SECONDS)
    for holder, times in renewed.items():
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert len(gaps) >= 2, (holder, times)
        assert all(interval <= gap < lease for gap in gaps), (holder, gaps)


def start_collector(settings: KafkaSettings, kubeconfig: str, log: Path) -> subprocess.Popen[bytes]:
    return svledger(
        "collect", "--cluster", CLUSTER, "--kubeconfig", kubeconfig, settings=settings, log=log
    )


async def test_a_killed_collector_restarts_without_duplicates_or_gaps(
    settings: KafkaSettings, kube: Kube, kube_cluster: LocalCluster, kubeconfig: str, tmp_path: Path
) -> None:
    rng = random.Random(9)
    log = tmp_path / "collector.log"
    for round_ in range(6):
        collector = start_collector(settings, kubeconfig, log)
        await asyncio.sleep(rng.uniform(0.5, 12.0))
        if round_ == 2:  # something to collect while collectors come and go
            await asyncio.to_thread(kube_cluster.restart_apiserver, 1)
        collector.send_signal(signal.SIGKILL)
        collector.wait()
    # The last one has a log of its own: the ledger may agree before it has even started,
    # and it must own the partition (so it runs, and handles SIGTERM) before it is stopped.
    log = tmp_path / "last-collector.log"
    collector = start_collector(settings, kubeconfig, log)
    try:
        await agree(settings, kube)
        await eventually(lambda: joined(log), "the last collector joins its group")
    finally:
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(60) == 0, log.read_text()[-3000:]
    _, records = await cluster_log(settings, CLUSTER)
    assert_nothing_twice(records)


async def joined(log: Path) -> str | None:
    if "Setting newly assigned partitions" in log.read_text():
        return None
    return "not yet: " + log.read_text()[-500:]


async def test_two_collectors_for_one_cluster_append_nothing_twice(
    settings: KafkaSettings, kube: Kube, kube_cluster: LocalCluster, kubeconfig: str, tmp_path: Path
) -> None:
    collectors = [start_collector(settings, kubeconfig, tmp_path / f"c{i}.log") for i in (0, 1)]
    try:
        await agree(settings, kube)
        await asyncio.to_thread(kube_cluster.restart_apiserver, 0)
        await agree(settings, kube)
    finally:
        for collector in collectors:
            collector.send_signal(signal.SIGTERM)
        for i, collector in enumerate(collectors):
            assert collector.wait(60) == 0, (tmp_path / f"c{i}.log").read_text()[-3000:]
    _, records = await cluster_log(settings, CLUSTER)
    assert_nothing_twice(records)


def test_the_kubernetes_manifests_are_accepted_by_a_real_apiserver(
    kube_cluster: LocalCluster, kubeconfig: str
) -> None:
    kubectl = ["kubectl", "--kubeconfig", kubeconfig]
    # Server-side dry run persists nothing, so the namespace the rest lives in must exist.
    subprocess.run([*kubectl, "create", "namespace", "svledger"], check=True, capture_output=True)
    applied = subprocess.run(
        [*kubectl, "apply", "--dry-run=server", "-f", str(ROOT / "deploy" / "kubernetes")],
        capture_output=True,
        text=True,
    )
    assert applied.returncode == 0, applied.stderr
    assert "deployment.apps/svledger-collector created (server dry run)" in applied.stdout


def widgets(storage: str) -> dict[str, object]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {"name": v, "served": True, "storage": v == storage, "schema": schema}
                for v in ("v1", "v2")
            ],
        },
    }


async def test_custom_resources_are_collected_from_each_apiservers_discovery(
    settings: KafkaSettings, kube: Kube, kube_cluster: LocalCluster
) -> None:
    direct = addressed(kube, kube_cluster)
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    await kube.request("POST", path, widgets(storage="v1"))

    async def stored_in(version: str) -> str | None:
        state, _ = await cluster_log(settings, CLUSTER)
        view = ledger_views(state, CLUSTER).get("example.com.widgets")
        expected = {a: version for a in direct}
        if view is None or {a: e[0] for a, e in view[0].items()} != expected:
            return f"widgets: {view}"
        assert view[1] == version  # the common encoding version
        assert all(e[1] == ("example.com/v1", "example.com/v2") for e in view[0].values())
        return None

    async with collecting(settings, kube, apiservers=direct):
        await eventually(lambda: stored_in("example.com/v1"), "widgets stored in v1")
        current = await kube.get(f"{path}/widgets.example.com")
        changed = {**widgets(storage="v2"), "metadata": current["metadata"]}
        await kube.request("PUT", f"{path}/widgets.example.com", changed)
        await eventually(lambda: stored_in("example.com/v2"), "widgets stored in v2")
        state, records = await cluster_log(settings, CLUSTER)
        hashes = state.storage_states[CLUSTER, "example.com", "widgets"]
        assert hashes.current_storage_version_hash == storage_version_hash(
            "example.com", "v2", "Widget"
        )
        assert_nothing_twice(records)


async def discovered_hashes(kube: Kube) -> dict[str, str]:
    """Every resource (``<group>.<resource>``, ``core.`` for the core group) that the
    apiserver ``kube`` addresses lists with a storageVersionHash, and that hash."""
    groups = await kube.get("/apis")
    paths = ["/api/v1"] + [
        f"/apis/{v['groupVersion']}" for g in groups["groups"] for v in g["versions"]
    ]
    hashes: dict[str, str] = {}
    for path in paths:
        try:
            document = await kube.get(path)
        except ApiError as error:
            # An apiserver lists the group/versions of every local APIService, those a
            # newer release registered too, and serves only its own.
            if error.status == 404:
                continue
            raise
        group = document["groupVersion"].rpartition("/")[0]
        for resource in document["resources"]:
            if "/" not in resource["name"] and resource.get("storageVersionHash"):
                hashes[f"{group or 'core'}.{resource['name']}"] = resource["storageVersionHash"]
    return hashes


@pytest.mark.kubernetes
async def test_a_stock_cluster_gives_every_resource_each_apiserver_stores_from_its_discovery(
    settings: KafkaSettings, tmp_path: Path
) -> None:
    """No StorageVersion objects, protobuf in etcd, a v1.36.3 and a v1.37.2 apiserver side
    by side: the ledger holds, for each apiserver, every resource (built-in and custom) its
    discovery lists with a storageVersionHash, encoded in the version that hash names."""
    with LocalCluster(
        2,
        version=OLD,
        identity_lease_duration_seconds=KUBE_LEASE_SECONDS,
        identity_lease_renew_interval=KUBE_RENEW_SECONDS,
    ) as cluster:
        await asyncio.to_thread(cluster.restart_apiserver, 1, NEW)
        kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", 0)))
        direct = addressed(kube, cluster)
        old, new = direct
        try:
            with pytest.raises(ApiError) as refused:
                await upstream_views(kube)
            assert refused.value.status == 404
            path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
            await kube.request("POST", path, widgets(storage="v1"))

            async def collected() -> str | None:
                state, _ = await cluster_log(settings, CLUSTER)
                held = {a: lease[:3] for a, lease in ledger_leases(state, CLUSTER).items()}
                upstream = {a: lease[:3] for a, lease in (await upstream_leases(kube)).items()}
                if held != upstream:
                    return f"leases {held} != upstream {upstream}"
                expected = {a: await discovered_hashes(k) for a, k in direct.items()}
                if "example.com.widgets" not in expected[next(iter(direct))]:
                    return "widgets not discovered yet"
                ledger: dict[str, dict[str, str]] = {a: {} for a in direct}
                for (c, group, resource), view in state.storage_versions.items():
                    for entry in view.entries if c == CLUSTER else ():
                        ledger[entry.apiserver_id][resource_name(group, resource)] = (
                            storage_version_hash(
                                *split_group_version(entry.encoding_version), view.kind
                            )
                        )
                for a in direct:
                    if ledger[a] != expected[a]:
                        differ = sorted(
                            n
                            for n in ledger[a].keys() | expected[a].keys()
                            if ledger[a].get(n) != expected[a].get(n)
                        )
                        return f"{a}: {len(differ)} differ from its discovery, e.g. {differ[:5]}"
                return None

            async with collecting(settings, kube, apiservers=direct):
                await eventually(collected, "every discovered resource collected, as stored")
            state, records = await cluster_log(settings, CLUSTER)
            assert_nothing_twice(records)
        finally:
            await kube.close()
    views = ledger_views(state, CLUSTER)
    assert len(views) > 40
    assert views["events.k8s.io.events"][0][new][0] == "v1"  # stored as core v1 Events
    assert views["events.k8s.io.events"][0][new][1] == ("events.k8s.io/v1", "v1")
    assert views["apps.deployments"][0][old][0] == "apps/v1"
    # The release that changes a storage version, side by side: no agreement.
    policies = views["admissionregistration.k8s.io.mutatingadmissionpolicies"]
    assert {a: e[0] for a, e in policies[0].items()} == {
        old: "admissionregistration.k8s.io/v1beta1",
        new: "admissionregistration.k8s.io/v1",
    }
    assert policies[1] is None


@pytest.mark.kubernetes
async def test_an_apiserver_restarted_on_the_older_release_never_inherits_what_the_newer_stored(
    settings: KafkaSettings, tmp_path: Path
) -> None:
    """A stock apiserver on v1.37.2 (``mutatingadmissionpolicies`` and their
    bindings stored as ``v1``) restarted on v1.36.3 (stored as ``v1beta1``). From its new
    lease's first heartbeat on, no state of the ledger, event by event, holds the new
    lease with ``v1``: what the v1.37.2 process's discovery showed is never carried over;
    and the ledger ends with ``v1beta1``, as the v1.36.3 process's discovery shows."""
    with LocalCluster(
        2,
        version=NEW,
        identity_lease_duration_seconds=KUBE_LEASE_SECONDS,
        identity_lease_renew_interval=KUBE_RENEW_SECONDS,
    ) as cluster:
        kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", 0)))
        direct = addressed(kube, cluster)
        restarted = apiserver_id(cluster.apiserver_hostnames[1])
        names = [resource_name(GROUP, resource) for resource, _ in RESOURCES]

        def stored(state: State) -> dict[str, str | None]:
            views = ledger_views(state, CLUSTER)
            return {
                n: views[n][0][restarted][0] if n in views and restarted in views[n][0] else None
                for n in names
            }

        async def stored_in(version: str, holder: str | None) -> str | None:
            state, _ = await cluster_log(settings, CLUSTER)
            lease = ledger_leases(state, CLUSTER).get(restarted)
            if lease is None or (holder is not None and lease[0] != holder):
                return f"the ledger's lease of {restarted}: {lease}"
            held = stored(state)
            return None if set(held.values()) == {version} else f"{restarted} stores {held}"

        try:
            async with collecting(settings, kube, apiservers=direct):
                await eventually(lambda: stored_in(NEW_VERSION, None), f"stored as {NEW_VERSION}")
                old_holder = (await upstream_leases(kube))[restarted][0]
                await asyncio.to_thread(cluster.restart_apiserver, 1, OLD)

                async def new_lease() -> str | None:
                    lease = (await upstream_leases(kube)).get(restarted)
                    if lease is None or lease[0] == old_holder:
                        return f"upstream's lease of {restarted}: {lease}"
                    return None

                await eventually(new_lease, f"{OLD}'s lease of {restarted}")
                new_holder = (await upstream_leases(kube))[restarted][0]
                await eventually(
                    lambda: stored_in(OLD_VERSION, new_holder), f"stored as {OLD_VERSION} again"
                )
            _, records = await cluster_log(settings, CLUSTER)
        finally:
            await kube.close()
    assert_nothing_twice(records)
    state = State()
    joined = False
    for record in records:
        apply(state, record.event, record.position)
        event = record.event
        if isinstance(event, ApiserverHeartbeat) and event.apiserver_id == restarted:
            joined = joined or event.holder_identity == new_holder
        if joined:
            assert state.leases[CLUSTER, restarted].holder_identity == new_holder
            assert NEW_VERSION not in stored(state).values(), (record.position, event)
            if (
                isinstance(event, StorageVersionReported)
                and event.apiserver_id == restarted
                and resource_name(event.group, event.resource) in names
            ):
                assert event.encoding_version != NEW_VERSION, (record.position, event)
    assert joined
    assert set(stored(state).values()) == {OLD_VERSION}


@pytest.mark.kubernetes
async def test_in_a_rolling_upgrade_the_resources_only_the_new_release_serves_are_collected(
    settings: KafkaSettings, tmp_path: Path
) -> None:
    # The kubeconfig names the apiserver still on the old release, whose discovery does
    # not know the kinds of what the new release adds; the upgraded apiserver's does.
    with LocalCluster(
        2,
        version=OLD,
        identity_lease_duration_seconds=KUBE_LEASE_SECONDS,
        identity_lease_renew_interval=KUBE_RENEW_SECONDS,
        storage_version_api=True,
    ) as cluster:
        kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig", 0)))
        direct = addressed(kube, cluster)
        try:
            before = set(await upstream_views(kube))
            await asyncio.to_thread(cluster.restart_apiserver, 1, NEW)
            added = set(await upstream_views(kube)) - before
            assert added, f"{NEW} publishes no StorageVersion that {OLD} does not"
            async with collecting(settings, kube, apiservers=direct):
                await agree(settings, kube, renewals=False)
            state, records = await cluster_log(settings, CLUSTER)
            assert added <= set(ledger_views(state, CLUSTER))
            assert_nothing_twice(records)
        finally:
            await kube.close()


async def test_kinds_the_cluster_does_not_name_are_asked_of_each_apiserver_a_hung_one_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch, "DISCOVERY_SECONDS", 0.0)
    monkeypatch.setattr(watch, "PEER_DISCOVERY_SECONDS", 1.0)
    asked: dict[str, int] = collections.Counter()
    core = {"groupVersion": "v1", "resources": list[dict[str, str]]()}

    def discovery(name: str, documents: dict[str, object]) -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            asked[name] += 1
            return web.json_response(documents[request.path])

        application = web.Application()
        for path in documents:
            application.router.add_get(path, answer)
        return application

    old = discovery("old", {"/apis": {"groups": []}, "/api/v1": core})
    new = discovery(
        "new",
        {
            "/apis": {"groups": [{"versions": [{"groupVersion": "example.com/v1"}]}]},
            "/api/v1": {"groupVersion": "v1", "resources": []},
            "/apis/example.com/v1": {
                "groupVersion": "example.com/v1",
                "resources": [{"name": "things", "kind": "Thing"}],
            },
        },
    )
    with socket.socket() as hung:  # takes connections, answers nothing
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        async with TestServer(old) as cluster, TestServer(new) as upgraded:
            kube = kube_at(str(cluster.make_url("")))
            peers = [
                kube.at(f"http://127.0.0.1:{hung.getsockname()[1]}"),
                kube.at(str(upgraded.make_url("")).rstrip("/")),
            ]
            found = watch.Discovery(kube, SystemClock(), peers)
            try:
                await asyncio.wait_for(found.refresh(), 30)  # the first read asks everyone
                assert found.kind_of("example.com", "things", "example.com/v1") == "Thing"
                await found.refresh()  # nothing missed: nothing read
                assert asked == {"old": 2, "new": 3}
                # A kind missed that the cluster names now: only the cluster is asked,
                # and what the apiservers named is kept.
                assert found.kind_of("", "pods", "v1") is None
                core["resources"] = [{"name": "pods", "kind": "Pod"}]
                await found.refresh()
                assert asked == {"old": 4, "new": 3}
                assert found.kind_of("", "pods", "v1") == "Pod"
                assert found.kind_of("example.com", "things", "example.com/v1") == "Thing"
            finally:
                for client in (kube, *peers):
                    await client.close()


async def test_storage_versions_switched_off_while_watched_are_not_served_not_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A kube-apiserver restarted without the StorageVersion API answers the resumed watch
    with a plain-text ``404 page not found``: the collector counts them as not served
    (entries kept), says so once, and lists them again every ``MAX_BACKOFF_SECONDS`` until
    they are back."""
    monkeypatch.setattr(watch, "MAX_BACKOFF_SECONDS", 0.2)
    group, version = "internal.apiserver.k8s.io", "v1alpha1"
    storage_versions = f"/apis/{group}/{version}/storageversions"
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    served = True
    switched = False
    lists: list[bool] = []  # whether each list of StorageVersions was served
    pods = {
        "metadata": {"name": "core.pods", "resourceVersion": "5"},
        "status": {
            "storageVersions": [
                {
                    "apiServerID": "apiserver-a",
                    "encodingVersion": "v1",
                    "decodableVersions": ["v1"],
                    "servedVersions": ["v1"],
                }
            ]
        },
    }

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal served, switched
        watching = request.query.get("watch", "").lower() in ("true", "1")
        if request.path == storage_versions:
            if not watching:
                lists.append(served)
            elif not switched:  # the apiserver restarts without the API
                switched, served = True, False
            if not served:
                return web.Response(status=404, text="404 page not found\n")
        if not watching:
            items = [pods] if request.path == storage_versions else []
            return web.json_response({"items": items, "metadata": {"resourceVersion": "5"}})
        stream = web.StreamResponse()  # a watch that shows nothing new
        await stream.prepare(request)
        await asyncio.sleep(3600)
        return stream

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "kube.watch"]

    async def listed_while_off() -> str | None:
        return None if lists.count(False) >= 3 else f"lists: {lists}"

    async def back() -> str | None:
        return None if any("serves storageversions now" in m for m in logged()) else "not yet"

    application = web.Application()
    application.router.add_get(storage_versions, answer)
    application.router.add_get(leases, answer)
    caplog.set_level(logging.INFO, logger="kube.watch")
    async with TestServer(application) as server:
        kube = kube_at(str(server.make_url("")))
        watcher = watch.ClusterWatch(kube, {})
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        try:
            await eventually(listed_while_off, "StorageVersions listed again while off")
            assert watcher.synced
            kept = ("apiserver-a", "", "pods", SOURCE_STORAGE_VERSION)
            assert kept in watcher.snapshot.entries  # none lost
            with pytest.raises(ApiError) as refused:  # the client's own word for it
                async for _ in kube.watch(group, version, "storageversions", None, "5"):
                    pass
            assert refused.value.status == 404
            assert "404 page not found" in str(refused.value)
            served = True
            await eventually(back, "StorageVersions listed once served again")
        finally:
            stop.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await kube.close()
    messages = logged()
    assert not [m for m in messages if "string indices" in m or "retrying" in m], messages
    assert len([m for m in messages if "does not serve" in m]) == 1, messages
