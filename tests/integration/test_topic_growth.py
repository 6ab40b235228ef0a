"""``svledger topics grow`` under load, on the shared broker: no cluster's events change
partition or order, new clusters spread over the new partitions, the projector and the
lease GC (group members) take the new partitions on, and the views equal a replay."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer

from ledger.events import ApiserverHeartbeat, Event, Meta, Position
from ledger.identity import apiserver_id
from ledger.kafka import EventProducer, create_topics, end_offsets, to_record
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings
from projections.database import engine
from projections.replay import replay
from projections.store import load_checkpoints, views_snapshot
from tests.integration.test_broker_faults import svledger
from tests.integration.test_migrator import read_records

ROOT = Path(__file__).resolve().parents[2]
BEFORE, AFTER = 2, 5
OLD = [f"old-{i}" for i in range(4)]  # written before placements were recorded
EARLY = [f"early-{i}" for i in range(4)]  # placed before the grow, writing through it
LATE = [f"late-{i}" for i in range(8)]  # first written after the grow


class OrderedProducer(EventProducer):
    """An EventProducer that remembers, per cluster, the acknowledged events in order."""

    acknowledged: dict[str, list[str]]

    async def send_many(self, events: Iterable[Event]) -> list[Position]:
        batch = list(events)
        positions = await super().send_many(batch)
        for event in batch:
            self.acknowledged.setdefault(event.meta.cluster, []).append(event.meta.event_id)
        return positions


def reports() -> list[ResourceReport]:
    return [ResourceReport("", "pods", "Pod", "v1", ("v1",), ("v1",))]


async def write_unplaced(settings: KafkaSettings) -> dict[str, int]:
    """A heartbeat of each :data:`OLD` cluster, keyed by the cluster and placed by the
    default partitioner, as a writer that does not record placements did; the partition
    each landed in."""
    producer = AIOKafkaProducer(**settings.client_kwargs(), enable_idempotence=True, acks="all")
    await producer.start()
    try:
        landed = {}
        for cluster in OLD:
            now = datetime.now(UTC)
            apiserver = apiserver_id("h")
            event = ApiserverHeartbeat(
                Meta.new(cluster, apiserver, now), apiserver, f"{apiserver}_1", "h", 3600, now
            )
            key, value, headers = to_record(event)
            sent = await producer.send_and_wait(settings.topic, value, key=key, headers=headers)
            landed[cluster] = sent.partition
        return landed
    finally:
        await producer.stop()


async def settled(settings: KafkaSettings, db_url: str, timeout: float = 120.0) -> None:
    """Wait until the projector has read every partition of the grown topic to its end."""
    reached: dict[int, int] = {}
    ends: dict[int, int] = {}
    try:
        async with asyncio.timeout(timeout):
            while True:
                ends = await end_offsets(settings)
                with engine(db_url).connect() as connection:
                    reached = load_checkpoints(connection, settings.topic, "views")
                if len(ends) == AFTER and all(reached.get(p, 0) >= e for p, e in ends.items()):
                    return
                await asyncio.sleep(0.5)
    except TimeoutError:
        raise AssertionError(f"the projector is at {reached} of {ends}") from None


async def test_growing_the_topic_under_load_moves_no_cluster(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    settings = KafkaSettings(
        bootstrap_servers=kafka_bootstrap, topic=f"svledger-grow-{uuid.uuid4().hex[:8]}",
        partitions=BEFORE,
    )  # fmt: skip
    await create_topics(settings)
    legacy = await write_unplaced(settings)
    db_url = f"sqlite:///{tmp_path}/views.db"
    processes = {
        "projector": svledger("project", "--db", db_url, settings=settings, log=tmp_path / "p.log"),
        "lease-gc": svledger(
            "lease-gc", "--check-period", "1", settings=settings, log=tmp_path / "gc.log"
        ),
    }
    producer = OrderedProducer(settings)
    producer.acknowledged = {}
    try:
        async with producer:

            def started(clusters: list[str]) -> list[Reporter]:
                return [
                    Reporter(cluster, "h", reports(), producer, heartbeat_interval=0.2,
                             jitter=0.05, lease_duration_seconds=5)
                    for cluster in clusters
                ]  # fmt: skip

            early = started(EARLY)
            await asyncio.gather(*(reporter.start() for reporter in early))
            await asyncio.sleep(2)
            grow = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "svledger", "topics", "grow", "--partitions", str(AFTER),
                cwd=ROOT, env=dict(os.environ, SVLEDGER_KAFKA_BOOTSTRAP=kafka_bootstrap,
                                   SVLEDGER_TOPIC=settings.topic),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            out, err = await grow.communicate()
            assert grow.returncode == 0, err.decode()
            assert (
                f"topic {settings.topic} grew from {BEFORE} to {AFTER} partitions;"
                f" its {len(OLD) + len(EARLY)} clusters keep their partitions"
                f" ({len(OLD)} placements recorded now" in out.decode()
            )
            late = started(OLD + LATE)  # the old clusters write again, through placements
            await asyncio.gather(*(reporter.start() for reporter in late))
            await asyncio.sleep(3)
            for reporter in early + late:
                await reporter.stop()
            await settled(settings, db_url)
            assert {name: p.poll() for name, p in processes.items()} == dict.fromkeys(processes)
    finally:
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        codes = {name: process.wait(60) for name, process in processes.items()}
    assert codes == dict.fromkeys(processes, 0)

    records = await read_records(dataclasses.replace(settings, partitions=AFTER))
    where: dict[str, set[int]] = {}
    order: dict[str, list[str]] = {}
    for event, position in records:
        where.setdefault(event.meta.cluster, set()).add(position.partition)
        order.setdefault(event.meta.cluster, []).append(event.meta.event_id)
    assert {cluster: len(held) for cluster, held in where.items()} == dict.fromkeys(
        OLD + EARLY + LATE, 1
    ), where
    home = {cluster: min(held) for cluster, held in where.items()}
    assert {cluster: home[cluster] for cluster in OLD} == legacy
    assert {home[cluster] for cluster in EARLY} <= {0, 1}
    assert {home[cluster] for cluster in LATE} & {2, 3, 4}, "no new cluster in a new partition"
    for cluster, sent in producer.acknowledged.items():  # the lease GC's events between
        assert [e for e in order[cluster] if e in set(sent)] == sent, cluster

    fresh = f"sqlite:///{tmp_path}/replayed.db"
    await replay(settings, fresh, progress=False)
    with engine(db_url).connect() as live, engine(fresh).connect() as replayed:
        assert views_snapshot(live) == views_snapshot(replayed)
