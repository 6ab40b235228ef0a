"""The ledger on Kafka as production runs it: three brokers, replication factor 3,
``min.insync.replicas`` 2, and every kind of broker failure while everything runs.

The module starts one cluster of three brokers and a KRaft controller of their own.
``svledger topics create`` against it chooses replication factor 3 and
``min.insync.replicas`` 2 and says so; an impossible layout is refused.

The fault test runs what the single-broker test (``test_broker_faults``) runs: reporters
of three clusters rolling between v1 and v2, the projector, lease GC, the migrator, the
worker and the collector of a real cluster (etcd and a kube-apiserver), as
processes that nobody restarts. Through it the brokers fail, one kind of failure after
another:

* **leader kills**: the ledger partition's leader is killed (SIGKILL) five times, at
  random moments (transactions of the migrator and the worker are open at most of them),
  and restarted on its data; each kill waits until the previous broker is back in sync;
* **a rolling restart**: each broker in turn shut down cleanly and started again, the
  next one once every partition is fully replicated again, as an operator rolls a
  cluster;
* **a wiped disk**: one broker killed, its partition data deleted and its directory
  formatted again, restarted: it fetches every replica again from the leaders;
* **two brokers down**: fewer in-sync replicas than ``min.insync.replicas``; an append
  then waits, Kafka's client retrying it, and the producer logs why (the partition, its
  in-sync replicas, the setting); nothing is half-written, and everything resumes when
  one broker returns, the waiting append landing once.

After each, once the cluster has recovered: the pipeline settles (every cluster migrated
to v2, no migration active, the projector at the log's end) within
:data:`RECOVERY_BOUND` s, the bound docs/production.md states; every event a producer had
acknowledged is in the log, none twice; every requested migration ended once; the
processes are up; and the projector's views equal a replay of the log up to the
projector's checkpoint. At the end the real cluster's apiservers are in the ledger as
they are and the processes stop cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from sqlalchemy import Connection, select

from deploy.kafka.broker import LocalKafka
from deploy.kube.cluster import LocalCluster
from kube.client import connect
from ledger.events import ApiserverHeartbeat, Event, Meta, MigrationRequested, Position
from ledger.kafka import EventProducer, create_topics
from ledger.reporter import Reporter
from ledger.settings import KafkaSettings
from projections.database import engine
from projections.replay import cluster_log, replay
from projections.schema import projection_checkpoints
from projections.store import views_snapshot
from tests.integration.test_broker_faults import (
    CLUSTERS,
    HOSTS,
    RecordingProducer,
    pods,
    settle,
    show_where_they_wait,
    svledger,
    until_done,
)
from tests.integration.test_collector import (
    CLUSTER,
    agree,
    assert_nothing_twice,
    start_collector,
)
from tests.integration.test_consumer_crash import _fold, _spawn
from tests.kube import KUBE_LEASE_GC_SECONDS, KUBE_LEASE_SECONDS, KUBE_RENEW_SECONDS

pytestmark = [pytest.mark.slow, pytest.mark.replicated]

BROKERS = 3
KILLS = 5
LEASE_SECONDS = 8
#: After the cluster has recovered, the pipeline settles within this many seconds
#: (docs/production.md, "When Kafka is down").
RECOVERY_BOUND = 120.0


@pytest.fixture(scope="module")
def kube_cluster() -> Iterator[LocalCluster]:
    """etcd and one kube-apiserver, serving StorageVersion objects for ``agree`` to hold
    the ledger against: the collector's cluster, lighter on the cores than the usual
    three (the brokers' faults are under test here, not the apiservers')."""
    with LocalCluster(
        1,
        identity_lease_duration_seconds=KUBE_LEASE_SECONDS,
        identity_lease_renew_interval=KUBE_RENEW_SECONDS,
        identity_lease_gc_period=KUBE_LEASE_GC_SECONDS,
        storage_version_api=True,
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with LocalKafka(brokers=BROKERS) as cluster:
        yield cluster


async def describe(settings: KafkaSettings, topics: list[str]) -> list[dict[str, Any]]:
    """The topics' partitions as the brokers see them, asked again while a node is away."""
    async with asyncio.timeout(60):
        while True:
            admin = AIOKafkaAdminClient(**settings.client_kwargs())
            try:
                await admin.start()
                return list(await admin.describe_topics(topics))
            except KafkaError:
                await asyncio.sleep(0.5)
            finally:
                await admin.close()


async def fully_replicated(settings: KafkaSettings) -> None:
    """Wait until every partition of the ledger's topics and of Kafka's own (consumer
    offsets, transactions) has every replica in sync: an operator's go-ahead."""
    topics = [settings.topic, settings.dlq_topic, "__consumer_offsets", "__transaction_state"]
    lagging: list[str] = []
    try:
        async with asyncio.timeout(120):
            while True:
                lagging = [
                    f"{topic['topic']}/{p['partition']} isr {p['isr']} of {p['replicas']}"
                    for topic in await describe(settings, topics)
                    for p in topic["partitions"]
                    if sorted(p["isr"]) != sorted(p["replicas"]) or p["leader"] < 0
                ]
                if not lagging:
                    return
                await asyncio.sleep(0.5)
    except TimeoutError:
        raise AssertionError(f"not in sync after 120 s: {lagging}") from None


async def leader(settings: KafkaSettings) -> int:
    """The broker ID leading the ledger's partition."""
    (topic,) = await describe(settings, [settings.topic])
    (partition,) = topic["partitions"]
    return int(partition["leader"])


def test_topics_create_replicates_over_three_brokers_and_refuses_what_cannot_be_written(
    kafka: LocalKafka,
) -> None:
    def topics_create(topic: str, **environment: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "svledger", "topics", "create"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                "SVLEDGER_KAFKA_BOOTSTRAP": kafka.bootstrap,
                "SVLEDGER_TOPIC": topic,
                **environment,
            },
        )

    done = topics_create("svledger-layout")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "created topics svledger-layout, svledger-layout.dlq and svledger-layout.placement:"
        " replication factor 3, min.insync.replicas 2 (3 brokers)\n"
    )
    assert "warning" not in done.stderr

    async def layout() -> list[tuple[int, str]]:
        settings = KafkaSettings(bootstrap_servers=kafka.bootstrap, topic="svledger-layout")
        described = await describe(settings, [settings.topic, settings.dlq_topic])
        admin = AIOKafkaAdminClient(**settings.client_kwargs())
        await admin.start()
        try:
            resources = [
                ConfigResource(ConfigResourceType.TOPIC, t["topic"], {"min.insync.replicas": None})
                for t in described
            ]
            configs = await admin.describe_configs(resources)
        finally:
            await admin.close()
        in_sync = [
            value
            for response in configs
            for _, _, _, _, entries in response.resources
            for name, value, *_ in entries
            if name == "min.insync.replicas"
        ]
        replicas = {len(p["replicas"]) for t in described for p in t["partitions"]}
        return [(r, v) for r in sorted(replicas) for v in sorted(set(in_sync))]

    assert asyncio.run(layout()) == [(3, "2")]

    refused = topics_create("svledger-never", SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS="4")
    assert refused.returncode == 2, refused.stderr
    assert "SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS=4 is more than the replication factor 3" in (
        refused.stderr
    )
    assert "Traceback" not in refused.stderr
    too_many = topics_create("svledger-never", SVLEDGER_KAFKA_REPLICATION_FACTOR="4")
    assert too_many.returncode == 2 and "has 3 broker(s)" in too_many.stderr
    strict = topics_create("svledger-strict", SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS="3")
    assert strict.returncode == 0, strict.stderr
    assert "warning: min.insync.replicas 3 equals the replication factor" in strict.stderr


async def test_the_pipeline_rides_out_every_failure_of_a_replicated_cluster(
    kafka: LocalKafka,
    kube_cluster: LocalCluster,
    kubeconfig: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = KafkaSettings(
        bootstrap_servers=kafka.bootstrap, topic="svledger-replicated", partitions=1
    )
    assert (await create_topics(settings)).layout.replication_factor == BROKERS
    rng = random.Random(11)
    db_url = f"sqlite:///{tmp_path}/views.db"
    processes = {
        "projector": svledger("project", "--db", db_url, settings=settings, log=tmp_path / "p.log"),
        "lease-gc": svledger(
            "lease-gc", "--check-period", "2", settings=settings, log=tmp_path / "gc.log"
        ),
        "migrator": _spawn(
            "migrator", settings.bootstrap_servers, settings.topic, tmp_path / "m.log"
        ),
        "worker": _spawn("worker", settings.bootstrap_servers, settings.topic, tmp_path / "w.log"),
        "collector": start_collector(settings, kubeconfig, tmp_path / "c.log"),
    }
    producer = RecordingProducer(settings)
    producer.acknowledged = set()

    async def leader_kills() -> None:
        for _ in range(KILLS):
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            node = kafka.node_of(await leader(settings))
            kafka.kill(node)
            await asyncio.sleep(rng.uniform(0.0, 3.0))
            await asyncio.to_thread(kafka.restart, node)
            await fully_replicated(settings)

    async def rolling_restart() -> None:
        for node in range(BROKERS):
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            await asyncio.to_thread(kafka.terminate, node)
            await asyncio.to_thread(kafka.restart, node)
            await fully_replicated(settings)

    async def wiped_disk() -> None:
        node = rng.randrange(BROKERS)
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        kafka.kill(node)
        await asyncio.to_thread(kafka.wipe, node)
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        await asyncio.to_thread(kafka.restart, node)
        await fully_replicated(settings)

    async def two_brokers_down() -> None:
        # A producer that has its producer ID: one started during the outage could not get
        # one (the transaction coordinator's own partition lacks its in-sync replicas too).
        async with EventProducer(settings, request_timeout=2.0) as appender:
            await appender.send(heartbeat())  # it has found the topic, while it could
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            down = sorted(rng.sample(range(BROKERS), 2))
            for node in down:
                kafka.kill(node)
            probe = heartbeat()
            with caplog.at_level(logging.WARNING, logger="ledger.kafka.producers"):
                appending = asyncio.create_task(appender.send(probe))
                async with asyncio.timeout(60):  # it waits, saying why
                    while "min.insync.replicas is 2" not in caplog.text:
                        assert not appending.done(), appending
                        await asyncio.sleep(0.2)
            assert "Kafka's client retries it until they do, and nothing is half-written" in (
                caplog.text
            )
            await asyncio.sleep(rng.uniform(2.0, 5.0))
            await asyncio.to_thread(kafka.restart, down[0])  # writes are accepted again
            await asyncio.wait_for(appending, RECOVERY_BOUND)
        producer.acknowledged.add(probe.meta.event_id)  # in the log, once
        await asyncio.sleep(rng.uniform(2.0, 5.0))
        await asyncio.to_thread(kafka.restart, down[1])
        await fully_replicated(settings)

    faults: dict[str, Callable[[], Awaitable[None]]] = {
        "leader kills": leader_kills,
        "rolling restart": rolling_restart,
        "wiped disk": wiped_disk,
        "two brokers down": two_brokers_down,
    }
    try:
        async with producer:
            reporters = [
                Reporter(cluster, host, pods("v1"), producer, heartbeat_interval=1.0,
                         jitter=0.2, lease_duration_seconds=LEASE_SECONDS)
                for cluster in CLUSTERS
                for host in HOSTS
            ]  # fmt: skip
            await asyncio.gather(*(reporter.start() for reporter in reporters))
            version = "v1"
            for name, fault in faults.items():
                chaos = asyncio.create_task(brokers_back_on_failure(kafka, fault()), name=name)
                while not chaos.done():  # roll the apiservers, one at a time
                    version = "v2" if version == "v1" else "v1"
                    for reporter in rng.sample(reporters, len(reporters)):
                        await until_done(lambda r=reporter, v=version: r.update(pods(v)))
                        await asyncio.sleep(rng.uniform(0.1, 0.5))
                await chaos
                for reporter in reporters:  # the upgrade ends with every apiserver on v2
                    await until_done(lambda r=reporter: r.update(pods("v2")))
                acknowledged = set(producer.acknowledged)  # the reporters heartbeat on
                records = await settle(settings, db_url, migrated=True, timeout=RECOVERY_BOUND)
                check(name, records, acknowledged)
                alive = {n: p.poll() for n, p in processes.items()}
                assert alive == dict.fromkeys(processes), f"after {name}: {alive}"
                await equal_to_a_replay(name, settings, db_url, tmp_path)
            kube = await connect(kubeconfig)
            try:  # the real cluster's apiservers are in the ledger as they are
                await agree(settings, kube, renewals=False)
            finally:
                await kube.close()
            for reporter in reporters:
                await reporter.stop()
    finally:
        if sys.exc_info()[0] is not None:
            show_where_they_wait(processes, tmp_path)
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        codes = {name: process.wait(60) for name, process in processes.items()}
    assert codes == dict.fromkeys(processes, 0)
    _, collected = await cluster_log(settings, CLUSTER)
    assert_nothing_twice(collected)


async def brokers_back_on_failure(kafka: LocalKafka, fault: Awaitable[None]) -> None:
    """Run ``fault``; if it fails, start the nodes it left down before saying so: the
    reporters' appends, the producer and the processes would wait for them for ever."""
    try:
        await fault
    except BaseException:
        for node in range(BROKERS):
            if not kafka.running(node):
                await asyncio.to_thread(kafka.restart, node)
        raise


def heartbeat() -> ApiserverHeartbeat:
    """A heartbeat of a cluster of its own, appended beside the pipeline's."""
    now = datetime.now(UTC)
    return ApiserverHeartbeat(Meta.new("probe", "a1", now), "a1", "a1_1", "a1", LEASE_SECONDS, now)


def check(after: str, records: list[tuple[Event, Position]], acknowledged: set[str]) -> None:
    """Every acknowledged event in the log once, and every requested migration ended once."""
    logged = [event.meta.event_id for event, _ in records]
    assert len(logged) == len(set(logged)), f"after {after}: an event is in the log twice"
    missing = acknowledged - set(logged)
    assert missing == set(), f"after {after}: acknowledged events are missing: {missing}"
    _, ended = _fold(records)
    requested = [e for e, _ in records if isinstance(e, MigrationRequested)]
    assert requested and ended == {e.migration_id: 1 for e in requested}, after


async def equal_to_a_replay(after: str, settings: KafkaSettings, db_url: str, tmp: Path) -> None:
    """The projector's views equal a replay of the log up to its checkpoint. The
    checkpoint is read before and after the views, so both are of one transaction."""
    live = engine(db_url)
    try:
        while True:
            with live.connect() as connection:
                before = checkpoint(connection)
                views = views_snapshot(connection)
                if checkpoint(connection) == before:
                    break
    finally:
        live.dispose()
    fresh = f"sqlite:///{tmp}/replayed-{after.replace(' ', '-')}.db"
    await replay(settings, fresh, until=before - 1, progress=False)
    replayed = engine(fresh)
    try:
        with replayed.connect() as connection:
            assert views_snapshot(connection) == views, f"after {after}"
    finally:
        replayed.dispose()


def checkpoint(connection: Connection) -> int:
    return int(
        connection.execute(
            select(projection_checkpoints.c.next_offset).where(
                projection_checkpoints.c.projection == "views"
            )
        ).scalar_one()
    )
