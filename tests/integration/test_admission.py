"""Reporters write to their cluster's inbox; ``svledger admit`` admits only what they may say.

On a real broker: real :class:`Reporter` s of two clusters write through their inboxes
(``SVLEDGER_INBOX``) while admission runs; then a reporter's producer forges a
``MigrationSucceeded`` for a Pending migration (which, admitted, would narrow the
persisted storage versions of pods) and a report in the name of the other cluster's
apiserver. Both are refused with a reason in the dead-letter topic, the ledger has
not one record more, and the views replayed from it are what they were. A second
test kills ``svledger admit`` processes with SIGKILL while two of them share the
inboxes: every inbox record reaches the ledger once, in its inbox's order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.admission import MAX_VALUE_BYTES, Admission
from ledger.codec import decode
from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Meta,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    Position,
    StorageVersionReported,
)
from ledger.kafka import DLQ_REASON_HEADER, EventProducer, create_topics, to_record
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings
from projections.database import engine
from projections.fold import apply
from projections.replay import replay
from projections.state import State
from projections.store import views_snapshot
from tests.integration.test_migrator import read_records

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


def pods(version: str) -> list[ResourceReport]:
    return [ResourceReport("", "pods", "Pod", version, ("v1", "v2"), ("v1", "v2"))]


@pytest.fixture
def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)


async def read_topic(
    settings: KafkaSettings, topic: str
) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """Every committed record of ``topic``, which has as many partitions as the ledger."""
    consumer = AIOKafkaConsumer(
        **settings.client_kwargs(), enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records = []
        for tp in partitions:
            while await consumer.position(tp) < ends[tp]:
                for message in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    records.append((message.value, list(message.headers)))
        return records
    finally:
        await consumer.stop()


async def admitted_all(settings: KafkaSettings, clusters: list[str]) -> None:
    """Wait until admission's committed offset is every inbox's end."""
    consumer = AIOKafkaConsumer(
        **settings.client_kwargs(),
        group_id="svledger-admission",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        inboxes = [TopicPartition(settings.inbox_topic(c), 0) for c in clusters]
        async with asyncio.timeout(DEADLINE):
            while True:
                ends = await consumer.end_offsets(inboxes)
                committed = {tp: await consumer.committed(tp) for tp in inboxes}
                if all((committed[tp] or 0) == ends[tp] for tp in inboxes):
                    return
                await asyncio.sleep(0.2)
    finally:
        await consumer.stop()


def fold(records: list[tuple[Event, Position]]) -> State:
    state = State()
    for event, position in records:
        apply(state, event, position)
    return state


async def test_forged_outcomes_and_reports_for_another_cluster_are_refused(
    settings: KafkaSettings, tmp_path: Path
) -> None:
    await create_topics(settings, ["east", "west"])
    inbox = dataclasses.replace(settings, inbox=True)
    stop = asyncio.Event()

    async def admit() -> None:
        async with Admission(settings) as admission:
            while not stop.is_set():
                await admission.step()

    admission = asyncio.create_task(admit())
    try:
        async with EventProducer(inbox) as producer:
            # No heartbeat falls between the two reads of the ledger compared below.
            reporters = {
                (cluster, host): Reporter(
                    cluster, host, pods("v1"), producer, heartbeat_interval=1800.0
                )
                for cluster in ("east", "west")
                for host in ("a1", "a2")
            }
            await asyncio.gather(*(r.start() for r in reporters.values()))
            for reporter in reporters.values():  # an upgrade: everyone encodes v2 now
                await reporter.update(pods("v2"))
            await admitted_all(settings, ["east", "west"])

            # Every reporter event reached the ledger, in its cluster's partition.
            records = await read_records(settings)
            state = fold(records)
            east_pods = ("east", "", "pods")
            storage_state = state.storage_states[east_pods]
            current = storage_state.current_storage_version_hash
            assert storage_state.persisted_storage_version_hashes != (current,)  # v1 may remain
            assert {(c, a) for c, a in state.leases} == {
                (c, r.apiserver_id) for (c, _), r in reporters.items()
            }

            # A trusted writer (the migrator, the operator) requests a migration to v2.
            version = state.storage_versions[east_pods]
            requested = MigrationRequested(
                Meta.new("east", "operator", datetime.now(UTC)),
                "m-1",
                "",
                "pods",
                "v2",
                current,
                version.revision,
            )
            async with EventProducer(settings) as ledger_writer:
                await ledger_writer.send(requested)

            # An east reporter's principal forges the worker's events, and speaks for west.
            forged: list[Event] = [
                MigrationStarted(Meta.new("east", "a1", datetime.now(UTC)), "m-1"),
                MigrationSucceeded(Meta.new("east", "a1", datetime.now(UTC)), "m-1", 40),
            ]
            west_a1 = reporters[("west", "a1")].apiserver_id
            for_west = StorageVersionReported(
                Meta.new("west", west_a1, datetime.now(UTC)),
                west_a1, "", "pods", "Pod", "v1", ("v1",), ("v1",),
            )  # fmt: skip
            before = await read_records(settings)
            before_views = await replayed(settings, tmp_path / "before.db")
            # Admitted, the forgery would hide objects stored in v1: it matters.
            would_be = fold([*before, *((e, Position(9, 10**6 + i)) for i, e in enumerate(forged))])
            assert would_be.storage_states[east_pods].persisted_storage_version_hashes == (current,)

            await producer.send_many(forged)
            raw = AIOKafkaProducer(**settings.client_kwargs())
            await raw.start()
            try:
                key, value, headers = to_record(for_west)
                await raw.send_and_wait(
                    settings.inbox_topic("east"), value, key=key, headers=headers
                )
            finally:
                await raw.stop()
            await admitted_all(settings, ["east", "west"])

            after = await read_records(settings)
            assert [e.meta.event_id for e, _ in after] == [*(e.meta.event_id for e, _ in before)], (
                "a forged record reached the ledger"
            )
            assert await replayed(settings, tmp_path / "after.db") == before_views

            dead = {
                decode(value).meta.event_id: dict(headers)[DLQ_REASON_HEADER].decode()
                for value, headers in await read_topic(settings, settings.dlq_topic)
            }
            assert "MigrationStarted" in dead[forged[0].meta.event_id]
            assert "may not come from a reporter's inbox" in dead[forged[1].meta.event_id]
            assert "for cluster 'west'" in dead[for_west.meta.event_id]
            assert "inbox of cluster 'east'" in dead[for_west.meta.event_id]

            # A record near the broker's limit, then a report: the report is admitted (its
            # inbox stopped behind such a record, which could not go on as a dead letter).
            raw = AIOKafkaProducer(**settings.client_kwargs())
            await raw.start()
            try:
                await raw.send_and_wait(settings.inbox_topic("east"), bytes(1_000_000), key=b"east")
            finally:
                await raw.stop()
            await reporters[("east", "a1")].update(pods("v1"))
            await admitted_all(settings, ["east", "west"])
            [(kept, headers)] = [
                (value, dict(headers))
                for value, headers in await read_topic(settings, settings.dlq_topic)
                if not value.startswith(b"\xc3\x01")
            ]
            assert len(kept) == MAX_VALUE_BYTES
            assert "record of 1000000 bytes" in headers[DLQ_REASON_HEADER].decode()
            reports = [e for e, _ in await read_records(settings) if e.meta.cluster == "east"]
            assert isinstance(reports[-1], StorageVersionReported)
            assert reports[-1].encoding_version == "v1"
            for reporter in reporters.values():
                await reporter.stop()
    finally:
        stop.set()
        await admission


async def replayed(settings: KafkaSettings, path: Path) -> dict[str, list[tuple[object, ...]]]:
    url = f"sqlite:///{path}"
    await replay(settings, url, progress=False)
    with engine(url).connect() as connection:
        return views_snapshot(connection)


def admit_process(settings: KafkaSettings, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "svledger", "admit", "--bootstrap", settings.bootstrap_servers,
         "--topic", settings.topic],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )  # fmt: skip


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    running: list[subprocess.Popen[bytes]] = []
    yield running
    for process in running:
        if process.poll() is None:
            process.kill()
        process.wait(30)


@pytest.mark.slow
async def test_admission_moves_every_inbox_record_once_in_order_through_kills(
    settings: KafkaSettings, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    clusters = ["c0", "c1", "c2"]
    await create_topics(settings, clusters)
    inbox = dataclasses.replace(settings, inbox=True)
    log = tmp_path / "admit.log"
    processes += [admit_process(settings, log), admit_process(settings, log)]
    rng = random.Random(3)
    sent: dict[str, list[str]] = {c: [] for c in clusters}
    async with EventProducer(inbox) as producer:
        for burst in range(12):
            events = [
                ApiserverHeartbeat(
                    Meta.new(cluster, "a1", datetime.now(UTC)),
                    "a1",
                    "h-a1",
                    "a1",
                    60,
                    datetime.now(UTC),
                )
                for _ in range(rng.randrange(50, 300))
                for cluster in clusters
            ]
            await producer.send_many(events)
            for event in events:
                sent[event.meta.cluster].append(event.meta.event_id)
            if burst % 3 == 1:  # kill -9 one of them, start another
                victim = processes.pop(rng.randrange(len(processes)))
                victim.send_signal(signal.SIGKILL)
                victim.wait(30)
                processes.append(admit_process(settings, log))
            await asyncio.sleep(rng.uniform(0.1, 1.5))
    await admitted_all(settings, clusters)
    ledger = await read_records(settings)
    by_cluster: dict[str, list[str]] = {c: [] for c in clusters}
    for event, _ in sorted(ledger, key=lambda record: record[1]):
        by_cluster[event.meta.cluster].append(event.meta.event_id)
    assert by_cluster == sent, log.read_text()[-3000:]
    for process in processes:
        process.send_signal(signal.SIGTERM)
    assert [process.wait(60) for process in processes] == [0] * len(processes)
