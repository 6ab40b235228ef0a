"""Kill -9 the Kafka broker again and again while everything runs: nothing lost or doubled.

The test has a broker of its own (the session's is shared) and kills it hard three times
at random moments of a rolling upgrade, starting it again each time on the same data
directory and ports. Meanwhile the apiservers' reporters (real :class:`Reporter` s, three
per cluster, in this process), the projector, lease GC, the migrator, the migration
worker and the collector of a real cluster (etcd and three kube-apiservers) run on, as
processes; none is restarted by hand. The outages outlast the reporters' leases (and
often the real apiservers'), so leases expire and apiservers join again; the migrator
requests (and cancels) migrations of the real cluster's resources too, which the worker
runs.

Afterwards the ledger holds the real cluster's apiservers and StorageVersions as its
apiservers publish them, every event a producer had acknowledged is in the log, no event
is in it twice, every requested migration ended once, the processes are still up and
stop cleanly, and the projector's views equal a fresh replay of the log.

The smaller tests pin down what the kills showed. A broker killed right after it
acknowledged a commit may, restarted, drop the transaction's markers and leave it open
for ever; a consumer then rebuilds and its new producer aborts it. A commit gives up in
time while the broker is away. A reporter or a collector started while the broker is
down does not give up on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.cluster import ClusterMetadata

from consumers import partitions
from consumers.admission import run_admission
from consumers.partitions import PartitionFollower, PartitionLost
from deploy.kafka.broker import LocalKafka
from deploy.kube.cluster import LocalCluster
from kube.client import connect
from ledger import kafka
from ledger.events import ApiserverHeartbeat, Event, Meta, MigrationRequested, Position
from ledger.identity import apiserver_id
from ledger.kafka import (
    BROKER_ERRORS,
    EndOffsets,
    EventConsumer,
    EventProducer,
    GroupMember,
    PartitionProducer,
    create_topics,
    ledger_consumer,
    transactions,
)
from ledger.reporter import Reporter, ResourceReport, ThreadedReporter
from ledger.settings import KafkaSettings
from projections.database import engine
from projections.replay import cluster_log, replay
from projections.store import load_checkpoints, views_snapshot
from readapi.ledger import LedgerViews
from tests.integration.test_collector import CLUSTER, agree, start_collector
from tests.integration.test_consumer_crash import _fold, _spawn
from tests.integration.test_migrator import read_records
from tests.kube import assert_nothing_twice
from tests.processes import svledger

pytestmark = pytest.mark.slow

CLUSTERS = ("east", "west", "north")
HOSTS = ("a1", "a2", "a3")
KILLS = 3  # the replicated cluster's test kills its partition leader five times
LEASE_SECONDS = 8  # shorter than an outage: leases expire, reporters re-register


@pytest.fixture(scope="module")
def storage_version_api() -> bool:
    """``agree`` holds the ledger against the real cluster's StorageVersion objects."""
    return True


def pods(version: str) -> list[ResourceReport]:
    return [ResourceReport("", "pods", "Pod", version, ("v1", "v2"), ("v1", "v2"))]


class RecordingProducer(EventProducer):
    """An EventProducer that remembers every event the broker acknowledged."""

    acknowledged: set[str]

    async def send(self, event: Event) -> Position:
        position = await super().send(event)
        self.acknowledged.add(event.meta.event_id)
        return position

    async def send_many(self, events: Iterable[Event]) -> list[Position]:
        batch = list(events)
        positions = await super().send_many(batch)
        self.acknowledged.update(event.meta.event_id for event in batch)
        return positions


@pytest.fixture
def broker() -> Iterator[LocalKafka]:
    kafka = LocalKafka().start()
    try:
        yield kafka
    finally:
        kafka.stop()


def show_where_they_wait(processes: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    """Have every process still running log where its tasks wait (SIGUSR1, :mod:`ledger.tasks`),
    then print the end of each log in ``logs``: pytest shows it with the failure."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGUSR1)
    time.sleep(2)
    for log in sorted(logs.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-150:]
        print(f"---- the last {len(tail)} lines of {log.name}", *tail, sep="\n")


async def until_done(step: object) -> None:
    """Run ``step()`` until the broker takes it (an outage raises; the caller retries)."""
    while True:
        try:
            await step()  # type: ignore[operator]
            return
        except BROKER_ERRORS:
            await asyncio.sleep(0.5)


async def test_the_pipeline_rides_out_hard_broker_kills(
    broker: LocalKafka, kube_cluster: LocalCluster, kubeconfig: str, tmp_path: Path
) -> None:
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-faults", partitions=2
    )
    await create_topics(settings)
    rng = random.Random(7)
    db_url = f"sqlite:///{tmp_path}/views.db"
    processes = {
        "projector": svledger(
            "project", "--db", db_url, settings=settings, log=tmp_path / "p.log", log_format="text"
        ),
        "lease-gc": svledger(
            "lease-gc",
            "--check-period",
            "2",
            settings=settings,
            log=tmp_path / "gc.log",
            log_format="text",
        ),
        "migrator": _spawn(
            "migrator", settings.bootstrap_servers, settings.topic, tmp_path / "m.log"
        ),
        "worker": _spawn("worker", settings.bootstrap_servers, settings.topic, tmp_path / "w.log"),
        "collector": start_collector(settings, kubeconfig, tmp_path / "c.log"),
    }
    producer = RecordingProducer(settings)
    producer.acknowledged = set()
    kills = 0
    try:
        async with producer:
            reporters = [
                Reporter(cluster, host, pods("v1"), producer, heartbeat_interval=1.0,
                         jitter=0.2, lease_duration_seconds=LEASE_SECONDS)
                for cluster in CLUSTERS
                for host in HOSTS
            ]  # fmt: skip
            await asyncio.gather(*(reporter.start() for reporter in reporters))

            async def kill_and_restart() -> None:
                nonlocal kills
                for _ in range(KILLS):
                    await asyncio.sleep(rng.uniform(2.0, 6.0))
                    broker.kill()
                    kills += 1
                    await asyncio.sleep(rng.uniform(0.0, 4.0))
                    await asyncio.to_thread(broker.restart)

            chaos = asyncio.create_task(kill_and_restart())
            version = "v1"
            while not chaos.done():  # roll the apiservers between v1 and v2, one at a time
                version = "v2" if version == "v1" else "v1"
                for reporter in rng.sample(reporters, len(reporters)):
                    await until_done(lambda r=reporter, v=version: r.update(pods(v)))
                    await asyncio.sleep(rng.uniform(0.1, 1.0))
            await chaos
            for reporter in reporters:  # the upgrade ends with every apiserver on v2
                await until_done(lambda r=reporter: r.update(pods("v2")))
            kube = await connect(kubeconfig)
            try:  # the real cluster's apiservers are in the ledger as they are
                await agree(settings, kube, renewals=False)
            finally:
                await kube.close()
            assert {name: p.poll() for name, p in processes.items()} == dict.fromkeys(processes)
            collector = processes.pop("collector")  # its leases are then expired by lease GC
            collector.send_signal(signal.SIGTERM)
            assert collector.wait(60) == 0

            await settle(settings, db_url, migrated=True)
            for reporter in reporters:  # the apiservers shut down: their leases are released
                await reporter.stop()
            records = await settle(settings, db_url, migrated=False)
            assert {name: p.poll() for name, p in processes.items()} == dict.fromkeys(processes)
    finally:
        if sys.exc_info()[0] is not None:
            show_where_they_wait(processes, tmp_path)
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        codes = {name: process.wait(60) for name, process in processes.items()}
    assert kills == KILLS
    assert codes == {"projector": 0, "lease-gc": 0, "migrator": 0, "worker": 0}
    _, collected = await cluster_log(settings, CLUSTER)
    assert_nothing_twice(collected)

    logged = [event.meta.event_id for event, _ in records]
    assert len(logged) == len(set(logged)), "an event is in the log twice"
    assert producer.acknowledged - set(logged) == set(), "an acknowledged event is missing"

    _, ended = _fold(records)
    requested = [e for e, _ in records if isinstance(e, MigrationRequested)]
    assert requested and ended == {e.migration_id: 1 for e in requested}
    assert any(type(e).__name__ == "ApiserverLeaseExpired" for e, _ in records)

    fresh = f"sqlite:///{tmp_path}/replayed.db"
    await replay(settings, fresh, progress=False)
    with engine(db_url).connect() as live, engine(fresh).connect() as replayed:
        assert views_snapshot(live) == views_snapshot(replayed)


async def settle(
    settings: KafkaSettings, db_url: str, *, migrated: bool, timeout: float = 240.0
) -> list[tuple[Event, Position]]:
    """Wait until no migration is active, every cluster is migrated to v2 (if
    ``migrated``, else every lease has ended) and the projector has read every record."""
    seen = "nothing yet"
    try:
        async with asyncio.timeout(timeout):
            while True:
                records = await read_records(settings)
                state, _ = _fold(records)
                states = {c: state.storage_states.get((c, "", "pods")) for c in CLUSTERS}
                done = (
                    all(
                        s is not None
                        and s.persisted_storage_version_hashes == (s.current_storage_version_hash,)
                        for s in states.values()
                    )
                    if migrated
                    else not state.leases
                )
                active = [m for m in state.migrations.values() if m.active]
                # Past the last record, a partition may hold transaction markers only.
                ends = {position.partition: position.offset + 1 for _, position in records}
                with engine(db_url).connect() as connection:
                    reached = load_checkpoints(connection, settings.topic, "views")
                seen = (
                    f"states {states}, active {active}, leases {sorted(state.leases)},"
                    f" projector at {reached} of {ends}"
                )
                if done and not active and reached == ends:
                    return await read_records(settings)
                await asyncio.sleep(0.5)
    except TimeoutError:
        raise AssertionError(f"the pipeline did not settle in {timeout:g} s: {seen}") from None


@pytest.mark.parametrize("connected", [True, False], ids=["producer-connected", "left-to-start"])
async def test_a_reporter_whose_broker_is_down_opens_its_gate_once_registered(
    broker: LocalKafka, connected: bool
) -> None:
    """Its producer connected before the broker went away, or left for ``start`` to
    connect (which then tries for longer than one connection attempt's timeout)."""
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-down", partitions=1
    )
    await create_topics(settings)
    producer = EventProducer(settings, connect_timeout=1.0)
    if connected:
        await producer.start()
    try:
        broker.kill()
        reporter = Reporter("east", "a1", pods("v1"), producer, heartbeat_interval=1.0, jitter=0)
        starting = asyncio.create_task(reporter.start())
        await asyncio.sleep(3)
        if not connected:  # its connection attempts (1 s each) fail: the 503 says so
            async with asyncio.timeout(30):
                while reporter.gate.error is None:
                    assert not starting.done(), starting
                    await asyncio.sleep(0.05)
            assert f"last seen error: {reporter.gate.error}" in reporter.gate.reason("", "pods")
        assert not starting.done()
        assert not reporter.gate.allows("POST", "", "pods")  # 503 until registered
        await asyncio.to_thread(broker.restart)
        await asyncio.wait_for(starting, 120)
        assert reporter.ready and reporter.gate.allows("POST", "", "pods")
        await reporter.stop()
    finally:
        await producer.__aexit__(None, None, None)
    types = [type(event).__name__ for event, _ in await read_records(settings)]
    assert types[0] == "ApiserverHeartbeat" and "StorageVersionReported" in types


async def test_a_reporter_stopped_while_its_broker_is_down_stops_in_its_shutdown_timeout(
    broker: LocalKafka,
) -> None:
    """As upstream's lease controller: the release is given up after the shutdown
    timeout, and a stop ends a start still retrying, which then never registers."""
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-stopped", partitions=1
    )
    await create_topics(settings)
    threaded = ThreadedReporter("east", "a0", pods("v1"), settings)
    await asyncio.to_thread(threaded.start)
    async with EventProducer(settings) as producer:
        started = Reporter("east", "a1", pods("v1"), producer, heartbeat_interval=1.0, jitter=0)
        await started.start()
        broker.kill()
        await asyncio.wait_for(started.stop(shutdown_timeout=2.0), 60)
        assert not started.ready and not started.gate.allows("POST", "", "pods")
        # Its producer's close is given up too (aiokafka would flush first, for ever).
        await asyncio.wait_for(asyncio.to_thread(threaded.stop), 40)
        assert not threaded.ready

        starting = Reporter("east", "a2", pods("v1"), producer, heartbeat_interval=1.0, jitter=0)
        registering = asyncio.create_task(starting.start())
        await asyncio.sleep(3)
        assert not registering.done()
        await asyncio.wait_for(starting.stop(shutdown_timeout=2.0), 60)
        await asyncio.wait_for(registering, 10)  # ended by the stop
        assert not starting.ready and not starting.gate.allows("POST", "", "pods")
        await asyncio.to_thread(broker.restart)
        await asyncio.sleep(5)  # a start that went on would have registered by now
        assert not starting.ready
    second = [
        type(event).__name__
        for event, _ in await read_records(settings)
        if getattr(event, "apiserver_id", None) == starting.apiserver_id
    ]
    assert "StorageVersionReported" not in second
    assert not second or second[-1] == "ApiserverLeaseReleased", second


async def test_a_heartbeat_kafka_holds_while_its_broker_hangs_is_told_of_until_it_lands(
    broker: LocalKafka, caplog: pytest.LogCaptureFixture
) -> None:
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-held", partitions=1
    )
    await create_topics(settings)
    async with EventProducer(settings) as producer:
        reporter = Reporter("east", "a1", pods("v1"), producer, heartbeat_interval=1.0, jitter=0)
        await reporter.start()
        with caplog.at_level(logging.WARNING, logger="ledger.reporter"):
            broker.hang()

            def told() -> list[str]:
                return [r.getMessage() for r in caplog.records if r.name == "ledger.reporter"]

            try:
                async with asyncio.timeout(30):
                    while not any("has not acknowledged its heartbeat in" in m for m in told()):
                        await asyncio.sleep(0.1)
            finally:
                broker.resume()
        await reporter.stop()


async def test_leaving_a_producer_while_its_broker_hangs_gives_up_what_it_holds(
    broker: LocalKafka,
) -> None:
    """aiokafka's stop delivers what the producer holds first, for as long as the broker
    stays away: an API server leaving ``async with EventProducer`` would never end."""
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-leaving", partitions=1
    )
    await create_topics(settings)
    producer = EventProducer(settings)
    await producer.start()
    await producer.send(heartbeat("h0"))
    broker.hang()
    try:
        held = asyncio.create_task(producer.send(heartbeat("h1")))
        await asyncio.sleep(1)
        assert not held.done()
        left = asyncio.create_task(producer.__aexit__(None, None, None))
        done, _ = await asyncio.wait({left}, timeout=30)
        assert done, "the producer waited for the hung broker"
        left.result()
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
    finally:
        broker.resume()


def heartbeat(hostname: str) -> ApiserverHeartbeat:
    now = datetime.now(UTC)
    apiserver = apiserver_id(hostname)
    return ApiserverHeartbeat(
        Meta.new("east", apiserver, now), apiserver, f"{apiserver}_1", hostname, 3600, now
    )


async def stable_and_high(settings: KafkaSettings) -> tuple[int, int]:
    """Partition 0's last stable offset and high watermark."""
    async with EndOffsets(settings) as stable, EndOffsets(settings, committed=False) as high:
        return (await stable())[0], (await high())[0]


async def test_commits_cut_by_broker_kills_are_each_read_back_once_and_leave_nothing_open(
    broker: LocalKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker acknowledges a commit (EndTxn) and is killed before it writes the
    markers. Restarted, it may find the partition without a leader for a moment, skip
    the markers and record the transaction complete: the partition then keeps the
    transaction open for ever, and a consumer that waits to read its output back before
    it decides again (all of them do) would wait for ever; its output is aborted and
    appended again instead. Each commit of the consumer here is cut so, until one has
    lost its markers or the kills are spent: whether the broker writes them before it
    dies is timing (a run may lose none), and the consumer must end with every event
    once and no transaction open either way."""
    monkeypatch.setattr(partitions, "TRANSACTION_TIMEOUT_SECONDS", 3.0)
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-markers", partitions=1
    )
    await create_topics(settings)
    kills = 6  # at most: more commits than that are made, so each may be cut
    hosts = [f"h{i}" for i in range(kills + 2)]
    committing = False  # the consumer's commit, not the fencing transaction of a start
    killed = asyncio.Event()
    lost = asyncio.Event()  # an acknowledged commit's output never became readable
    send = AIOKafkaClient.send

    async def send_then_kill(self: Any, node_id: int, request: Any, **options: Any) -> Any:
        nonlocal kills
        response = await send(self, node_id, request, **options)
        if committing and kills and not lost.is_set() and type(request).__name__ == "EndTxnRequest":
            kills -= 1
            broker.kill()  # the commit is acknowledged; its markers may not be written yet
            killed.set()
        return response

    monkeypatch.setattr(AIOKafkaClient, "send", send_then_kill)
    acknowledged: set[str] = set()
    stop = asyncio.Event()

    async def register() -> None:
        """Append a heartbeat of each host in turn, once its fold has the one before."""
        nonlocal committing
        follower = PartitionFollower(settings, group_id="markers", transactional_prefix="markers")
        async with follower:
            async for folded in follower.batches(stop):
                partition_log = folded.log
                state = partition_log.state
                missing = [h for h in hosts if ("east", apiserver_id(h)) not in state.leases]
                if partition_log.caught_up and missing:
                    if missing[0] in acknowledged:  # read back, its commit is not there
                        lost.set()
                    event = heartbeat(missing[0])
                    committing = True
                    with contextlib.suppress(PartitionLost):
                        await partition_log.commit([event])
                        acknowledged.add(missing[0])
                    committing = False

    async def killed_or_lost() -> None:
        waits = [asyncio.create_task(event.wait()) for event in (killed, lost)]
        try:
            # Before: after a commit whose markers were lost, no commit came again.
            done, _ = await asyncio.wait(waits, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        assert done, "no commit came for 60 s"

    consumer = asyncio.create_task(register())
    try:
        while kills and not lost.is_set():
            await killed_or_lost()
            if killed.is_set():
                killed.clear()
                await asyncio.to_thread(broker.restart)
        async with asyncio.timeout(60):
            while len(await read_records(settings)) < len(hosts):
                await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.wait_for(consumer, 60)

    logged = [event.meta.event_id for event, _ in await read_records(settings)]
    assert len(logged) == len(set(logged)) == len(hosts)
    stable, high = await stable_and_high(settings)
    assert stable == high


async def test_a_commit_gives_up_in_time_while_the_broker_is_down(
    broker: LocalKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transactions, "TRANSACTION_TIMEOUT_SECONDS", 3.0)
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-timeout", partitions=1
    )
    await create_topics(settings)
    producer = PartitionProducer(settings, 0, "timeout-0", "timeout")
    await producer.start()
    await producer.append([heartbeat("h1")], consumed=0)
    stable, high = await stable_and_high(settings)
    while stable < high:  # its markers are written: this test is not about losing them
        await asyncio.sleep(0.1)
        stable, high = await stable_and_high(settings)
    broker.kill()
    started = time.monotonic()
    committing = asyncio.create_task(producer.append([heartbeat("h2")], consumed=1))
    # Before: the cancelled transaction's abort waited for the broker to come back.
    done, _ = await asyncio.wait({committing}, timeout=30)
    assert done, "the commit did not give up while the broker was down"
    with pytest.raises(kafka.TransactionFailed, match="did not complete within 3 s"):
        committing.result()
    await producer.stop()  # abandoned: what it holds cannot be flushed
    assert time.monotonic() - started < 3.0 + kafka.STOP_TIMEOUT_SECONDS + 5.0

    await asyncio.to_thread(broker.restart)
    successor = PartitionProducer(settings, 0, "timeout-0", "timeout")
    await successor.start()  # fences the first, whose transaction is aborted
    await successor.append([heartbeat("h3")], consumed=2)
    await successor.stop()
    logged = [
        e.hostname for e, _ in await read_records(settings) if isinstance(e, ApiserverHeartbeat)
    ]
    assert logged == ["h1", "h3"]
    stable, high = await stable_and_high(settings)
    assert stable == high


async def test_a_service_told_to_stop_while_its_broker_hangs_stops_within_the_grace_period(
    broker: LocalKafka,
) -> None:
    # A hung broker answers nothing: a commit waits out its transaction timeout (60 s)
    # and a group member's leave request aiokafka's request timeout (40 s), unless
    # stopping cuts them short. Kubernetes kills a pod 30 s after SIGTERM.
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-hang", partitions=1
    )
    await create_topics(settings)
    async with EventProducer(settings) as producer:
        await producer.send(heartbeat("h0"))
    stop = asyncio.Event()
    kafka.stop_connecting_on(stop)  # as every service does (svledger.options)
    follower = PartitionFollower(settings, group_id="hang", transactional_prefix="hang")
    committing = asyncio.Event()

    async def service() -> None:
        async with follower:
            async for folded in follower.batches(stop):
                broker.hang()
                committing.set()
                await folded.log.commit([heartbeat("h1")])

    running = asyncio.create_task(service())
    try:
        await asyncio.wait_for(committing.wait(), 60)
        await asyncio.sleep(1)  # the transaction is under way
        stop.set()
        started = time.monotonic()
        done, _ = await asyncio.wait({running}, timeout=60)
        stopped_in = time.monotonic() - started
    finally:
        broker.resume()
    assert done and running.cancelled()  # StoppedConnecting: the commit was given up
    assert stopped_in < 30, f"stopped {stopped_in:.0f} s after it was told to"
    logged: list[Event] = []

    async def read_back() -> None:
        async with EventConsumer(settings, until="end", dead_letters=False) as consumer:
            logged[:] = [record.event async for record in consumer]

    # A broker frozen past its session is fenced by its own controller when it goes on:
    # its metadata lists no broker until it heartbeats again, an outage of a few seconds.
    async with asyncio.timeout(60):
        await until_done(read_back)
    assert [e.hostname for e in logged if isinstance(e, ApiserverHeartbeat)] == ["h0"]


async def first_partition(follower: PartitionFollower, stop: asyncio.Event) -> int | None:
    """The partition of the follower's first batch, once it has joined and folded one."""
    async with follower:
        async for folded in follower.batches(stop):
            return folded.log.partition
    return None


async def test_a_follower_whose_broker_dies_as_it_joins_joins_once_it_is_back(
    broker: LocalKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker is killed between a follower's connection and its first request, the
    topic's description: the follower (the collector, the migrator, the worker) waits
    for the broker and joins, as through any outage. It used to exit."""
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-join", partitions=1
    )
    await create_topics(settings)
    killed = asyncio.Event()
    describe = AIOKafkaAdminClient.describe_topics

    async def kill_then_describe(self: Any, *args: Any, **options: Any) -> Any:
        if not killed.is_set():
            killed.set()
            broker.kill()
        return await describe(self, *args, **options)

    monkeypatch.setattr(AIOKafkaAdminClient, "describe_topics", kill_then_describe)
    follower = PartitionFollower(settings, group_id="join", transactional_prefix="join")
    joining = asyncio.create_task(first_partition(follower, asyncio.Event()))
    await asyncio.wait_for(killed.wait(), 60)
    await asyncio.sleep(1)
    assert not joining.done(), "the follower gave up while the broker was away"
    await asyncio.to_thread(broker.restart)
    assert await asyncio.wait_for(joining, 120) == 0


async def test_a_follower_that_joined_before_its_topic_was_listed_is_assigned_once_it_is(
    kafka_bootstrap: str, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker just restarted may answer a metadata request before it lists the
    topic's partitions; a member that joins its group then is assigned none. It must
    get its partitions once the metadata lists them, not after aiokafka's 5 minutes."""
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    await create_topics(settings)
    listed = asyncio.Event()
    partitions_for_topic = ClusterMetadata.partitions_for_topic

    def unlisted_at_first(self: Any, topic: str) -> Any:
        return partitions_for_topic(self, topic) if listed.is_set() else None

    monkeypatch.setattr(ClusterMetadata, "partitions_for_topic", unlisted_at_first)
    stop = asyncio.Event()
    follower = PartitionFollower(settings, group_id="unlisted", transactional_prefix="unlisted")

    def joined() -> bool:  # the group answered its join (its generation is set)
        member = follower._member
        consumer = None if member is None else member._consumer
        return consumer is not None and consumer._coordinator.generation > 0

    joining = asyncio.create_task(first_partition(follower, stop))
    try:
        async with asyncio.timeout(60):
            while not joined():
                await asyncio.sleep(0.1)
        await asyncio.sleep(2)  # its assignment (none) is synced
        assert not joining.done() and follower.member.assignment() == set()
        listed.set()
        assert await asyncio.wait_for(joining, 60) == 0
    finally:
        stop.set()
        joining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await joining


async def test_a_partition_given_back_while_its_log_is_rebuilt_is_rebuilt_again(
    kafka_bootstrap: str, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebalance gives a member back the partition it is rebuilding, right after the
    rebuild seeked to the partition's start (a broker restart makes every member rejoin).
    The partition, assigned anew, is read from the group's committed offset. The fold
    used to start there without the partition's history, and the consumer decided on
    that: the chaos test's worker once sat for ever on a Running migration its fold had
    never seen. The rebuild is now made again on the new assignment."""
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    other = KafkaSettings(
        bootstrap_servers=kafka_bootstrap, topic=f"{unique_topic}.other", partitions=1
    )
    await create_topics(settings)
    await create_topics(other)
    group = "given-back"
    async with EventProducer(settings) as producer:
        await producer.send_many([heartbeat("h1"), heartbeat("h2")])
    earlier = PartitionProducer(settings, 0, f"{group}-0", group)
    await earlier.start()
    await earlier.append([heartbeat("h3")], consumed=2)  # the group's offset: past h1, h2
    await earlier.stop()

    joiner = ledger_consumer(other, group)  # a member of the group that reads another topic
    joined = False
    seek = GroupMember.seek

    async def seek_then_rebalance(self: GroupMember, partition: int, offset: int = 0) -> bool:
        nonlocal joined
        sought = await seek(self, partition, offset)
        if joined:
            return sought
        joined = True
        coordinator = self._kafka._coordinator
        generation = coordinator.generation
        await joiner.start()
        joiner.subscribe([other.topic])
        async with asyncio.timeout(60):  # this member rejoins and gets its partition back
            while coordinator.generation == generation or partition not in self.assignment():
                await asyncio.sleep(0.1)
        return sought

    monkeypatch.setattr(GroupMember, "seek", seek_then_rebalance)
    stop = asyncio.Event()
    follower = PartitionFollower(settings, group_id=group, transactional_prefix=group)
    try:
        async with asyncio.timeout(120), follower:
            async for folded in follower.batches(stop):
                if folded.log.caught_up:
                    break
    finally:
        await joiner.stop()
    assert joined, "no rebalance was made"
    assert sorted(key[1] for key in folded.log.state.leases) == sorted(
        apiserver_id(host) for host in ("h1", "h2", "h3")
    )


async def test_a_collector_started_while_the_broker_is_down_collects_once_it_is_back(
    broker: LocalKafka, kube_cluster: LocalCluster, kubeconfig: str, tmp_path: Path
) -> None:
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-collect-down", partitions=2
    )
    await create_topics(settings)
    broker.kill()
    log = tmp_path / "c.log"
    collector = start_collector(settings, kubeconfig, log)
    try:
        await asyncio.sleep(45)  # longer than a client waits for a broker at its start (30 s)
        assert collector.poll() is None, log.read_text()[-3000:]
        await asyncio.to_thread(broker.restart)
        kube = await connect(kubeconfig)
        try:
            await agree(settings, kube)
        finally:
            await kube.close()
    finally:
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(60) == 0, log.read_text()[-3000:]
    _, records = await cluster_log(settings, CLUSTER)
    assert_nothing_twice(records)


async def test_the_read_api_and_admission_started_while_the_broker_is_down_go_on_once_it_is_back(
    broker: LocalKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """``serve`` and ``admit`` exited (69) when the broker was away at their start, where
    the other services wait for it."""
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-serve-down", partitions=1
    )
    await create_topics(settings, ["east"])
    broker.kill()
    stop = asyncio.Event()
    views = LedgerViews(settings)
    following = asyncio.create_task(views.follow(stop))
    admitting = asyncio.create_task(run_admission(settings, stop=stop))

    def waited(doing: str) -> bool:
        return any(f"cannot {doing}" in r.getMessage() for r in caplog.records)

    try:
        with caplog.at_level(logging.WARNING, logger="ledger.kafka"):
            async with asyncio.timeout(120):  # one connect timeout (30 s), and a margin
                while not (waited("start reading the events topic") and waited("join group")):
                    assert not following.done(), following
                    assert not admitting.done(), admitting
                    await asyncio.sleep(0.5)
            await asyncio.to_thread(broker.restart)
            inbox = dataclasses.replace(settings, inbox=True)
            async with EventProducer(inbox) as producer:
                await producer.send(heartbeat("a1"))  # admitted, then folded by the views
            async with asyncio.timeout(120):
                while "east" not in views.clusters:
                    assert not following.done(), following
                    assert not admitting.done(), admitting
                    await asyncio.sleep(0.5)
        assert views.ready.is_set()
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(following, admitting), 60)


async def test_admission_whose_broker_dies_in_a_transaction_moves_the_record_once_it_is_back(
    broker: LocalKafka, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction given up, the inbox's next producer cannot start while the broker
    is away: admission exited (69) there."""
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap, topic="svledger-admit-down", partitions=1
    )
    await create_topics(settings, ["east"])
    monkeypatch.setattr(transactions, "TRANSACTION_TIMEOUT_SECONDS", 3.0)
    commit = kafka.TransactionalProducer.commit
    killed = asyncio.Event()

    async def kill_then_commit(self: Any, *args: Any, **options: Any) -> Any:
        if not killed.is_set():
            killed.set()
            broker.kill()
        return await commit(self, *args, **options)

    monkeypatch.setattr(kafka.TransactionalProducer, "commit", kill_then_commit)
    stop = asyncio.Event()
    admitting = asyncio.create_task(run_admission(settings, stop=stop))
    try:
        async with EventProducer(dataclasses.replace(settings, inbox=True)) as producer:
            sent = heartbeat("a1")
            await producer.send(sent)
        with caplog.at_level(logging.WARNING, logger="consumers.admission"):
            async with asyncio.timeout(120):  # the transaction's 3 s, a connect's 30 s
                while not any("cannot move" in r.getMessage() for r in caplog.records):
                    assert not admitting.done(), admitting
                    await asyncio.sleep(0.5)
        await asyncio.to_thread(broker.restart)
        async with asyncio.timeout(120):
            while not (records := await read_records(settings)):
                assert not admitting.done(), admitting
                await asyncio.sleep(0.5)
        assert [event.meta.event_id for event, _ in records] == [sent.meta.event_id]
    finally:
        stop.set()
        await asyncio.wait_for(admitting, 60)


async def test_a_follower_whose_transaction_coordinator_never_answers_says_so_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker whose transaction coordinator cannot start (its state topic wants three
    replicas of one broker) gives a transactional producer no producer ID, and aiokafka
    asks again for ever, logging nothing. The follower used to wait in the producer's
    start for ever, silently, polling no more; now the start gives up in time, the
    follower says why and what to check, polls on, and stops when asked."""
    broker = LocalKafka(overrides={"transaction.state.log.replication.factor": "3"}).start()
    try:
        settings = KafkaSettings(
            bootstrap_servers=broker.bootstrap, topic="svledger-no-coordinator", partitions=1
        )
        await create_topics(settings)
        stop = asyncio.Event()
        follower = PartitionFollower(settings, group_id="stuck", transactional_prefix="stuck")
        following = asyncio.create_task(first_partition(follower, stop))

        def said() -> list[str]:
            return [
                r.getMessage() for r in caplog.records if "cannot be rebuilt yet" in r.getMessage()
            ]

        async with asyncio.timeout(120):  # one connect timeout (30 s), and a margin
            while not said():
                assert not following.done(), following
                await asyncio.sleep(0.5)
        assert "did not start within 30 s" in said()[0]
        assert "transaction.state.log.replication.factor" in said()[0]
        assert not following.done()
        stop.set()
        assert await asyncio.wait_for(following, 60) is None  # no partition was ever built
    finally:
        broker.stop()
