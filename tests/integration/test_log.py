"""The log on a real broker: record layout, reporter order, the write gate, dead letters."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.partitions import PartitionFollower
from ledger.clock import SystemClock, VirtualClock
from ledger.codec import CodecError, decode
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseReleased,
    Meta,
    Position,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
    type_name,
)
from ledger.gate import WriteGateMiddleware
from ledger.identity import apiserver_id
from ledger.kafka import (
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_REASON_HEADER,
    DLQ_TOPIC_HEADER,
    TIME_HEADER,
    TYPE_HEADER,
    BrokerUnavailable,
    EventConsumer,
    EventProducer,
    Record,
    create_topics,
    to_record,
)
from ledger.reporter import Reporter, ResourceReport, ThreadedReporter
from ledger.settings import KafkaSettings
from projections.fold import fold
from projections.replay import cluster_log
from tests.workloads import mixed_events

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 6
RESOURCES = (
    ResourceReport(
        "apps", "deployments", "Deployment", "apps/v1", ("apps/v1", "apps/v1beta1"), ("apps/v1",)
    ),
    ResourceReport("", "pods", "Pod", "v1", ("v1",), ("v1",)),
    ResourceReport(
        "batch", "cronjobs", "CronJob", "batch/v1", ("batch/v1", "batch/v1beta1"), ("batch/v1",)
    ),
)
ReporterEvent = (
    ApiserverHeartbeat | ApiserverLeaseReleased | StorageVersionReported | StorageVersionWithdrawn
)
# A guard against a hung broker, not a measurement.
DEADLINE_SECONDS = 60.0


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), unsigned 32-bit."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    body = len(data) - len(data) % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[body:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_murmur2_matches_kafkas_reference_value() -> None:
    # Kafka's UtilsTest: murmur2("21".getBytes()) == -973932308 as a signed int.
    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF


async def _settings(bootstrap: str, topic: str) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic=topic, partitions=PARTITIONS)
    await create_topics(settings)
    return settings


async def _read_all(settings: KafkaSettings) -> list[Record]:
    async with EventConsumer(settings, until="end") as consumer:
        records = [record async for record in consumer]
    return sorted(records, key=lambda r: r.position)


async def _raw_messages(bootstrap: str, topic: str) -> list[Any]:
    """Every message of a topic as stored, undecoded."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        messages: list[Any] = []
        async with asyncio.timeout(DEADLINE_SECONDS):
            while any([await consumer.position(tp) < ends[tp] for tp in partitions]):
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    messages.extend(batch)
        return messages
    finally:
        await consumer.stop()


def _by_apiserver(records: Sequence[Record]) -> dict[str, list[ReporterEvent]]:
    events: dict[str, list[ReporterEvent]] = defaultdict(list)
    for record in records:
        assert isinstance(record.event, ReporterEvent)
        events[record.event.apiserver_id].append(record.event)
    return events


async def test_three_reporters_join_then_report_then_heartbeat_in_one_partition(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = await _settings(kafka_bootstrap, unique_topic)
    clock = VirtualClock()
    start = clock.now()
    async with EventProducer(settings) as producer:
        reporters = [
            Reporter(
                "prod",
                f"apiserver-{i}.example",
                RESOURCES,
                producer,
                clock,
                binary_version="v1.37.2",
                peer_advertise_address=f"10.0.0.{i}:6443",
            )
            for i in range(3)
        ]
        for reporter in reporters:
            await reporter.start()
        await clock.advance(35)  # heartbeats every 10-11 s: three more each
        for reporter in reporters:
            await reporter.stop()

    records = await _read_all(settings)
    assert {r.position.partition for r in records} == {kafka_partition(b"prod", PARTITIONS)}
    by_apiserver = _by_apiserver(records)
    assert set(by_apiserver) == {r.apiserver_id for r in reporters}
    holders = set()
    for reporter in reporters:
        events = by_apiserver[reporter.apiserver_id]
        kinds = [type_name(e) for e in events]
        assert kinds == (
            ["ApiserverHeartbeat"]
            + ["StorageVersionReported"] * len(RESOURCES)
            + ["ApiserverHeartbeat"] * 3
            + ["ApiserverLeaseReleased"]
        ), kinds
        reports = [e for e in events if isinstance(e, StorageVersionReported)]
        # Upstream's storage version manager updates by group, then resource: core first.
        assert [(e.group, e.resource, e.encoding_version) for e in reports] == [
            ("", "pods", "v1"),
            ("apps", "deployments", "apps/v1"),
            ("batch", "cronjobs", "batch/v1"),
        ]
        beats = [e for e in events if isinstance(e, ApiserverHeartbeat)]
        assert beats[0].renew_time == start
        assert {(b.binary_version, b.peer_advertise_address) for b in beats} == {
            ("v1.37.2", reporter.peer_advertise_address)
        }
        for previous, following in itertools.pairwise(beats):
            assert (
                timedelta(seconds=10)
                <= following.renew_time - previous.renew_time
                <= timedelta(seconds=11)
            )
        assert {e.holder_identity for e in events if hasattr(e, "holder_identity")} == {
            reporter.holder_identity
        }
        holders.add(reporter.holder_identity)
    assert len(holders) == 3


async def test_each_clusters_events_land_in_the_partition_of_its_own_key(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    first = names[0]
    second = next(
        n
        for n in names
        if kafka_partition(n.encode(), PARTITIONS) != kafka_partition(first.encode(), PARTITIONS)
    )
    settings = await _settings(kafka_bootstrap, unique_topic)
    async with EventProducer(settings) as producer:
        reporters = [
            Reporter(cluster, f"{cluster}-{i}", RESOURCES, producer, VirtualClock())
            for cluster in (first, second)
            for i in range(2)
        ]
        await asyncio.gather(*(r.start() for r in reporters))
        await asyncio.gather(*(r.stop() for r in reporters))

    messages = await _raw_messages(kafka_bootstrap, settings.topic)
    assert len(messages) == len(reporters) * (2 + len(RESOURCES))
    partitions_of: dict[str, set[int]] = defaultdict(set)
    for message in messages:
        event = decode(message.value)
        assert message.key == event.meta.cluster.encode()
        assert message.partition == kafka_partition(message.key, PARTITIONS)
        assert dict(message.headers)[TYPE_HEADER] == type_name(event).encode()
        partitions_of[event.meta.cluster].add(message.partition)
    assert set(partitions_of) == {first, second}
    assert all(len(p) == 1 for p in partitions_of.values())
    assert partitions_of[first] != partitions_of[second]


async def _request(app: Any, method: str, path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": method, "path": path, "headers": []}, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def _created(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"created"})


async def test_gate_refuses_writes_until_the_reporter_is_ready(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = await _settings(kafka_bootstrap, unique_topic)
    deployments = "/apis/apps/v1/namespaces/default/deployments"
    async with EventProducer(settings) as producer:
        reporter = Reporter("prod", "gated.example", RESOURCES, producer, VirtualClock())
        app = WriteGateMiddleware(_created, reporter.gate)

        status, body = await _request(app, "POST", deployments)
        assert (status, reporter.ready) == (503, False)
        assert json.loads(body)["message"].startswith(
            "wait for storage version registration to complete for resource: deployments.apps"
        )
        assert (await _request(app, "GET", deployments))[0] == 201

        await reporter.start()
        assert reporter.ready
        assert await _request(app, "POST", deployments) == (201, b"created")
        assert (await _request(app, "DELETE", "/api/v1/namespaces/default/pods/p"))[0] == 201

        await reporter.stop()
        assert (await _request(app, "POST", deployments))[0] == 503

    reported = [r for r in await _read_all(settings) if isinstance(r.event, StorageVersionReported)]
    assert len(reported) == len(RESOURCES)  # writes passed only once all of these were on record


async def test_killed_reporter_stops_heartbeating_while_others_go_on(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = await _settings(kafka_bootstrap, unique_topic)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.reporter_proc",
        kafka_bootstrap,
        settings.topic,
        "prod",
        "doomed.example",
        "0.2",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), DEADLINE_SECONDS)
        assert line.startswith(b"ready "), line
        doomed = line.split()[1].decode()
        async with EventProducer(settings) as producer:
            survivor = Reporter(
                "prod", "survivor.example", RESOURCES, producer, SystemClock(),
                heartbeat_interval=0.2, jitter=0,
            )  # fmt: skip
            await survivor.start()
            await _wait_for_heartbeats(settings, doomed, 3)
            process.send_signal(signal.SIGKILL)
            await process.wait()
            at_kill = _last_position(await _read_all(settings), doomed)
            await _wait_for_heartbeats(settings, survivor.apiserver_id, 5, after=at_kill)
            await survivor.stop()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    records = await _read_all(settings)
    doomed_events = _by_apiserver(records)[doomed]
    assert not any(isinstance(e, ApiserverLeaseReleased) for e in doomed_events)
    # The whole log, read after both stopped: the killed server wrote nothing after
    # the kill (while the survivor heartbeat on past it).
    assert _last_position(records, doomed) == at_kill


def _last_position(records: Sequence[Record], apiserver: str) -> Position:
    return max(
        r.position
        for r in records
        if isinstance(r.event, ReporterEvent) and r.event.apiserver_id == apiserver
    )


async def _wait_for_heartbeats(
    settings: KafkaSettings,
    apiserver: str,
    count: int,
    after: Position | None = None,
) -> None:
    """Wait until ``apiserver`` has ``count`` heartbeats at positions after ``after``."""
    async with asyncio.timeout(DEADLINE_SECONDS):
        while True:
            records = await _read_all(settings)
            mine = [
                r.position
                for r in records
                if isinstance(r.event, ApiserverHeartbeat)
                and r.event.apiserver_id == apiserver
                and (after is None or r.position > after)
            ]
            if len(mine) >= count:
                return
            await asyncio.sleep(0.3)


async def test_undecodable_and_mislabelled_records_go_to_the_dlq_and_the_stream_goes_on(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = await _settings(kafka_bootstrap, unique_topic)
    clock = SystemClock()

    def reset(cluster: str) -> StorageStateReset:
        return StorageStateReset(Meta.new(cluster, "test", clock.now()), "apps", "deployments", "t")

    before, stray, after = reset("prod"), reset("elsewhere"), reset("prod")
    garbage = b"\xc3\x01 this is not an event"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        sent = []
        for key, value, original_headers in (
            to_record(before),
            (b"prod", garbage, [(TYPE_HEADER, b"Nonsense")]),
            to_record(stray)._replace(key=b"prod"),  # key disagrees with meta.cluster
            to_record(after),
        ):
            sent.append(
                await producer.send_and_wait(
                    settings.topic, value, key=key, headers=original_headers
                )
            )
    finally:
        await producer.stop()

    consumed = [r.event for r in await _read_all(settings)]
    assert consumed == [before, after]
    # A second reader (a replay, a restarted projector) meets them again: sent once.
    assert [r.event for r in await _read_all(settings)] == consumed

    dead = sorted(await _raw_messages(kafka_bootstrap, settings.dlq_topic), key=lambda m: m.offset)
    assert [(m.key, m.value) for m in dead] == [
        (b"prod", garbage),
        (b"prod", to_record(stray).value),
    ]
    with pytest.raises(CodecError) as garbage_error:
        decode(garbage)
    expected_reasons = [
        str(garbage_error.value),
        "record key b'prod' is not the event's meta.cluster 'elsewhere'",
    ]
    for message, origin, reason in zip(dead, sent[1:3], expected_reasons, strict=True):
        headers = dict(message.headers)
        assert headers[DLQ_REASON_HEADER].decode() == reason
        assert headers[DLQ_TOPIC_HEADER].decode() == settings.topic
        assert int(headers[DLQ_PARTITION_HEADER]) == origin.partition
        assert int(headers[DLQ_OFFSET_HEADER]) == origin.offset
    assert dict(dead[0].headers)[TYPE_HEADER] == b"Nonsense"  # original headers kept


@pytest.mark.parametrize(
    "mode",
    [{"events": False}, {"renewals": False}, {}],
    ids=["state (lease GC, worker)", "events but renewals (migrator)", "events (collector)"],
)
async def test_every_consumer_folds_none_of_the_records_the_projector_dead_letters(
    kafka_bootstrap: str, unique_topic: str, mode: dict[str, bool]
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    await create_topics(settings)
    now = SystemClock().now()

    def heartbeat(host: str) -> ApiserverHeartbeat:
        server = apiserver_id(host)
        return ApiserverHeartbeat(
            Meta.new("prod", server, now), server, f"{server}_1", host, 60, now
        )

    good, after = heartbeat("cp-0"), heartbeat("cp-1")
    lying_time = to_record(heartbeat("cp-3"))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        sent = [
            await producer.send_and_wait(unique_topic, value, key=key, headers=headers)
            for key, value, headers in (
                to_record(good),
                to_record(heartbeat("cp-2"))._replace(key=None),
                lying_time._replace(
                    headers=[
                        (name, b"\0" * 8) if name == TIME_HEADER else (name, value)
                        for name, value in lying_time.headers
                    ]
                ),
                to_record(after),
            )
        ]
    finally:
        await producer.stop()

    follower = PartitionFollower(
        settings, group_id=unique_topic, transactional_prefix=unique_topic, **mode
    )
    stop = asyncio.Event()
    async with follower, asyncio.timeout(60):
        async for folded in follower.batches(stop):
            if folded.log.caught_up:
                stop.set()
        [partition_log] = follower.logs.values()
        partition_log.settle()
    expected = fold([(good, Position(0, sent[0].offset)), (after, Position(0, sent[3].offset))])
    assert partition_log.state == expected


async def test_one_clusters_log_is_read_by_key_passing_the_others_over_undecoded(
    kafka_bootstrap: str, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    await create_topics(settings)
    events = list(mixed_events(300, clusters=3))
    own, other = events[0].meta.cluster, events[1].meta.cluster
    stray = next(event for event in events if event.meta.cluster == other)
    async with EventProducer(settings) as producer:
        await producer.send_many(events[:150])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        garbage = await producer.send_and_wait(unique_topic, b"\xc3\x01 not", key=other.encode())
        mislabelled = await producer.send_and_wait(
            unique_topic, to_record(stray).value, key=own.encode()
        )
    finally:
        await producer.stop()
    async with EventProducer(settings) as producer:
        await producer.send_many(events[150:])

    with caplog.at_level(logging.WARNING, logger="ledger.kafka"):
        state, records = await cluster_log(settings, own)

    assert [record.event for record in records] == [e for e in events if e.meta.cluster == own]
    offsets = [record.position.offset for record in records]
    assert offsets == sorted(offsets)
    assert state == fold([(record.event, record.position) for record in records])
    skipped = caplog.text
    assert f"@{mislabelled.offset} skipped: record key {own.encode()!r}" in skipped
    assert f"@{garbage.offset} " not in skipped  # another cluster's record: not decoded


async def test_update_reports_changes_withdraws_removed_and_gates_until_acked(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = await _settings(kafka_bootstrap, unique_topic)
    clock = VirtualClock()
    _, pods, cronjobs = RESOURCES
    upgraded = ResourceReport(
        "apps", "deployments", "Deployment", "apps/v2", ("apps/v1", "apps/v2"), ("apps/v2",)
    )
    jobs = ResourceReport("batch", "jobs", "Job", "batch/v1", ("batch/v1",), ("batch/v1",))
    producer = EventProducer(settings)
    async with producer:
        reporter = Reporter("prod", "upgraded.example", RESOURCES, producer, clock)
        await reporter.start()
    # The broker is out of reach (the producer is closed): the update fails, and the
    # changed resources stay closed, the unchanged one open.
    with pytest.raises(RuntimeError):
        await reporter.update([upgraded, pods, jobs])
    assert not reporter.ready
    assert not reporter.gate.allows("PUT", "apps", "deployments")
    assert not reporter.gate.allows("POST", "batch", "jobs")
    assert reporter.gate.allows("POST", "", "pods")
    assert reporter.gate.reason("apps", "deployments").endswith(
        "last seen error: EventProducer is not started: use 'async with EventProducer(...)'"
    )  # the error's own text, as upstream's %v
    async with producer:
        await clock.advance(11)  # the next heartbeat tick sends what is missing
        assert reporter.ready
        await reporter.stop()

    events = _by_apiserver(await _read_all(settings))[reporter.apiserver_id]
    after_start = events[1 + len(RESOURCES) :]
    assert [type_name(e) for e in after_start] == [
        "ApiserverHeartbeat",
        "StorageVersionWithdrawn",
        "StorageVersionReported",
        "StorageVersionReported",
        "ApiserverLeaseReleased",
    ]
    assert [
        (e.group, e.resource) for e in after_start if isinstance(e, StorageVersionWithdrawn)
    ] == [(cronjobs.group, cronjobs.resource)]
    reported = [e for e in after_start if isinstance(e, StorageVersionReported)]
    assert {(e.resource, e.encoding_version) for e in reported} == {
        (upgraded.resource, upgraded.encoding_version),
        (jobs.resource, jobs.encoding_version),
    }
    assert reporter.resources == [upgraded, pods, jobs]


@pytest.mark.parametrize(("outage", "rejoins"), [(60, True), (30, True), (10, False)])
async def test_heartbeat_after_half_a_lease_of_gap_rejoins_and_reports_again(
    kafka_bootstrap: str, unique_topic: str, outage: int, rejoins: bool
) -> None:
    """A lease GC whose clock is ahead may expire a lease before a whole lease duration
    of the reporter's clock has passed: a gap of half of one re-joins."""
    settings = await _settings(kafka_bootstrap, unique_topic)
    clock = VirtualClock()
    producer = EventProducer(settings)
    async with producer:
        reporter = Reporter(
            "prod", "stalled.example", RESOURCES, producer, clock,
            heartbeat_interval=10, jitter=0, lease_duration_seconds=60,
        )  # fmt: skip
        await reporter.start()
        await clock.advance(20)  # two heartbeats, no gap
    await clock.advance(outage)  # failed heartbeats: the loop logs them and goes on
    async with producer:
        await clock.advance(10)  # acknowledged outage + 10 s after the last one
        assert reporter.ready
        await clock.advance(10)
        await reporter.stop()

    events = _by_apiserver(await _read_all(settings))[reporter.apiserver_id]
    kinds = [type_name(e) for e in events]
    n = len(RESOURCES)
    again = ["StorageVersionReported"] * n if rejoins else []
    assert kinds == (
        ["ApiserverHeartbeat"] + ["StorageVersionReported"] * n + ["ApiserverHeartbeat"] * 2
    ) + (["ApiserverHeartbeat"] + again + ["ApiserverHeartbeat"]) + ["ApiserverLeaseReleased"]
    beats = [e for e in events if isinstance(e, ApiserverHeartbeat)]
    assert beats[3].renew_time - beats[2].renew_time == timedelta(seconds=outage + 10)


async def test_heartbeats_are_jittered_as_upstreams_lease_controller(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    """By default a heartbeat follows the one before by 10 s plus up to 4 % of it, as
    upstream's lease controller renews (``wait.JitterUntil(sync, 10s, 0.04, ...)``)."""
    settings = await _settings(kafka_bootstrap, unique_topic)
    clock = VirtualClock()
    async with EventProducer(settings) as producer:
        reporter = Reporter("prod", "jittered.example", RESOURCES, producer, clock)
        await reporter.start()
        for _ in range(100):
            await clock.advance(10.5)
        await reporter.stop()

    events = _by_apiserver(await _read_all(settings))[reporter.apiserver_id]
    times = [e.renew_time for e in events if isinstance(e, ApiserverHeartbeat)]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
    assert len(gaps) >= 95
    assert all(10 <= gap <= 10.4 for gap in gaps), gaps
    assert max(gaps) > 10.2 and min(gaps) < 10.2  # drawn, not fixed


def test_threaded_reporter_serves_a_blocking_server(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = asyncio.run(_settings(kafka_bootstrap, unique_topic))
    reporter = ThreadedReporter("prod", "threaded.example", RESOURCES, settings)
    assert not reporter.gate.allows("POST", "", "pods")
    with reporter:
        assert reporter.ready
        assert reporter.gate.allows("POST", "", "pods")
        reporter.update(RESOURCES[:2])
        assert reporter.ready
    assert not reporter.ready

    events = _by_apiserver(asyncio.run(_read_all(settings)))[reporter.apiserver_id]
    assert [type_name(e) for e in events] == (
        ["ApiserverHeartbeat"]
        + ["StorageVersionReported"] * len(RESOURCES)
        + ["StorageVersionWithdrawn", "ApiserverLeaseReleased"]
    )


def test_a_threaded_start_that_times_out_stops_trying(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    settings = KafkaSettings(bootstrap_servers=address)
    reporter = ThreadedReporter("prod", "late.example", RESOURCES, settings, timeout=1.0)
    with caplog.at_level(logging.ERROR, logger="aiokafka"):
        with pytest.raises(TimeoutError):
            reporter.start()
        caplog.clear()
        time.sleep(4)  # aiokafka retries every 2 s while something still tries
        assert not [r for r in caplog.records if address.split(":")[1] in r.getMessage()]
    assert not reporter.ready
    reporter.stop()


def test_a_threaded_reporter_that_cannot_enter_ends_its_thread_and_says_why() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    settings = KafkaSettings(bootstrap_servers=address)
    reporter = ThreadedReporter("prod", "unentered.example", RESOURCES, settings, timeout=1.0)
    with pytest.raises(TimeoutError) as raised, reporter:
        pass
    assert reporter.apiserver_id in str(raised.value) and address in str(raised.value)
    assert "svledger-reporter-unentered.example" not in {t.name for t in threading.enumerate()}
    assert not reporter.ready


async def test_unreachable_broker_fails_naming_the_address_and_what_to_check() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    settings = KafkaSettings(bootstrap_servers=address)
    with pytest.raises(BrokerUnavailable) as raised:
        async with EventProducer(settings, connect_timeout=1.0):
            pass
    assert repr(address) in str(raised.value)
    assert "SVLEDGER_KAFKA_BOOTSTRAP" in str(raised.value)


def test_topics_create_makes_both_topics_once_and_replay_names_a_missing_one(
    kafka_bootstrap: str, unique_topic: str, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from svledger.cli import UNAVAILABLE, main

    kafka = ["--bootstrap", kafka_bootstrap, "--topic", unique_topic]
    assert main(["replay", *kafka, "--db", sqlite_url]) == UNAVAILABLE
    assert "svledger topics create" in capsys.readouterr().err

    assert main(["topics", "create", *kafka]) == 0
    printed = capsys.readouterr()
    assert printed.out == (
        f"created topics {unique_topic}, {unique_topic}.dlq and {unique_topic}.placement:"
        " replication factor 1, min.insync.replicas 1 (1 broker)\n"
    )
    assert "warning: replication factor 1: every record has one copy" in printed.err
    assert main(["topics", "create", *kafka]) == 0  # the second run finds them, changes nothing
    assert capsys.readouterr().out == (
        f"topics {unique_topic}, {unique_topic}.dlq and {unique_topic}.placement already existed:"
        " left as they are\n"
    )

    async def partitions() -> dict[str, int]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            return {
                topic: len(await producer.partitions_for(topic))
                for topic in (unique_topic, f"{unique_topic}.dlq")
            }
        finally:
            await producer.stop()

    default = KafkaSettings(bootstrap_servers=kafka_bootstrap).partitions
    assert asyncio.run(partitions()) == {unique_topic: default, f"{unique_topic}.dlq": default}
