"""The worker on the real broker, without a Kubernetes cluster to migrate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import pytest

from consumers.worker import CHECK_RETRY_SECONDS, ClusterCheck, run_worker
from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Meta,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    StorageVersionReported,
)
from ledger.hashing import storage_version_hash
from ledger.kafka import EventProducer, create_topics, partition_of
from ledger.settings import KafkaSettings
from projections.replay import cluster_log
from projections.state import Migration, State
from tests.integration.test_migrator import DEADLINE


class Succeeding:
    """An executor that succeeds at once, and remembers what it ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def run(
        self,
        migration: Migration,
        *,
        append: Callable[[Sequence[Event]], Awaitable[None]],
        cancelled: Callable[[], bool],
    ) -> None:
        self.ran.append(migration.migration_id)
        meta = Meta.new(migration.cluster, "worker", datetime.now(UTC))
        await append([MigrationStarted(meta, migration.migration_id)])
        meta = Meta.new(migration.cluster, "worker", datetime.now(UTC))
        await append([MigrationSucceeded(meta, migration.migration_id, objects_migrated=1)])


def started(
    settings: KafkaSettings, cluster: str, check: ClusterCheck | None = None
) -> tuple[Succeeding, asyncio.Event, asyncio.Task[None]]:
    """A worker of ``cluster`` (``svledger worker --cluster``): its executor, its stop,
    its task."""
    executor, stop = Succeeding(), asyncio.Event()
    group_id = f"{settings.topic}.worker.{cluster}"
    worker = run_worker(
        settings, executor, stop=stop, group_id=group_id, cluster=cluster, check=check
    )
    return executor, stop, asyncio.create_task(worker)


@pytest.fixture
async def settings(
    kafka_bootstrap: str, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> KafkaSettings:
    """A fresh topic of two partitions; the worker's warnings captured."""
    caplog.set_level(logging.WARNING, "consumers.worker")
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    return settings


async def test_a_worker_for_a_cluster_the_log_never_had_says_so_and_names_those_it_has(
    settings: KafkaSettings, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    async with EventProducer(settings) as producer:
        for cluster in ("east", "west"):
            meta = Meta.new(cluster, "a1", now)
            await producer.send(ApiserverHeartbeat(meta, "a1", "a1_1", "cp-0", 60, now))

    executor, stop, worker = started(settings, "esat")
    try:
        async with asyncio.timeout(DEADLINE):
            while not [r for r in caplog.records if "esat" in r.getMessage()]:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(worker, DEADLINE)
    assert executor.ran == []  # no migration of esat's was requested
    [warning] = [r.getMessage() for r in caplog.records if r.name == "consumers.worker"]
    home = partition_of("esat", [0, 1])
    assert f"no event of cluster 'esat' in topic {unique_topic} (partition {home}," in warning
    there = [repr(c) for c in ("east", "west") if partition_of(c, [0, 1]) == home] or ["(none)"]
    assert f"that partition has clusters {', '.join(there)}. Check --cluster" in warning


async def test_a_migration_waits_while_the_check_refuses_it_and_runs_once_it_passes(
    settings: KafkaSettings, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    async with EventProducer(settings) as producer:
        await producer.send(
            ApiserverHeartbeat(Meta.new("east", "a1", now), "a1", "a1_1", "cp-0", 60, now)
        )
        report = StorageVersionReported(
            Meta.new("east", "a1", now), "a1", "", "pods", "Pod", "v1", ("v1",), ("v1",)
        )
        position = await producer.send(report)
        await producer.send(
            MigrationRequested(
                Meta.new("east", "migrator", now),
                "m-1",
                "",
                "pods",
                "v1",
                storage_version_hash("", "v1", "Pod"),
                str(position),
            )
        )

    asked: list[tuple[str, int]] = []
    passes = asyncio.Event()

    async def check(state: State, cluster: str) -> str | None:
        asked.append((cluster, len(state.leases)))
        return None if passes.is_set() else "not this cluster, it seems"

    executor, stop, worker = started(settings, "east", check)

    async def renewing() -> None:
        """The log moves all the time: the lease renews twenty times a second."""
        async with EventProducer(settings) as producer:
            while True:
                now = datetime.now(UTC)
                renewal = ApiserverHeartbeat(
                    Meta.new("east", "a1", now), "a1", "a1_1", "cp-0", 60, now
                )
                await producer.send(renewal)
                await asyncio.sleep(0.05)

    try:
        async with asyncio.timeout(DEADLINE):
            while not asked:
                await asyncio.sleep(0.05)
            # Asked again a while later, not each time the log moves (which it does).
            renewals = asyncio.create_task(renewing())
            try:  # the second ask comes CHECK_RETRY_SECONDS after the first, a third twice
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2 * CHECK_RETRY_SECONDS - 1):
                        while len(asked) < 2:
                            await asyncio.sleep(0.05)
                await asyncio.sleep(1)  # nor is it asked again as the log moves on
            finally:
                renewals.cancel()
            assert executor.ran == []
            assert len(asked) == 2
            assert set(asked) == {("east", 1)}
            passes.set()
            while (await cluster_log(settings, "east"))[0].migrations[
                "east", "m-1"
            ].phase != "Succeeded":
                await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.wait_for(worker, DEADLINE)
    assert executor.ran == ["m-1"]
    [warning] = [r.getMessage() for r in caplog.records if r.name == "consumers.worker"]
    assert warning == "migration m-1 waits: not this cluster, it seems"  # said once
