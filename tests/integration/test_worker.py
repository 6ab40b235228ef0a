"""The worker on the real broker, without a Kubernetes cluster to migrate."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import pytest

from consumers.worker import run_worker
from ledger.events import ApiserverHeartbeat, Event, Meta
from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from projections.state import Migration
from tests.integration.test_migrator import DEADLINE


class NoExecutor:
    """An executor no migration may reach: the worker below has none to run."""

    async def run(
        self,
        migration: Migration,
        *,
        append: Callable[[Sequence[Event]], Awaitable[None]],
        cancelled: Callable[[], bool],
    ) -> None:
        raise AssertionError(f"{migration.migration_id} was run")


async def test_a_worker_for_a_cluster_the_log_never_had_says_so_and_names_those_it_has(
    kafka_bootstrap: str, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "consumers.worker")
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    now = datetime.now(UTC)
    async with EventProducer(settings) as producer:
        for cluster in ("east", "west"):
            meta = Meta.new(cluster, "a1", now)
            await producer.send(ApiserverHeartbeat(meta, "a1", "a1_1", "cp-0", 60, now))

    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(
            settings,
            NoExecutor(),
            stop=stop,
            group_id=f"{unique_topic}.worker.esat",
            cluster="esat",
        )
    )
    try:
        async with asyncio.timeout(DEADLINE):
            while not [r for r in caplog.records if "esat" in r.getMessage()]:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(worker, DEADLINE)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "consumers.worker"]
    assert f"no event of cluster 'esat' in topic {unique_topic}" in warning
    assert "the log has clusters 'east', 'west'. Check --cluster" in warning
