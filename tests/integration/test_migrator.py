"""The migration trigger on the real broker, fed by real reporters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.migrator import REASON_DISAGREE, REASON_UNKNOWN, run_migrator
from ledger.codec import decode
from ledger.events import (
    Event,
    Meta,
    MigrationCancelled,
    MigrationRequested,
    MigrationStarted,
    Position,
)
from ledger.kafka import EventProducer, create_topics
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings

# A guard against a hung broker, not a measurement.
DEADLINE = 60.0


def pods(version: str) -> ResourceReport:
    return ResourceReport("", "pods", "Pod", version, ("v1", "v2"), ("v1", "v2"))


def configmaps(version: str) -> ResourceReport:
    return ResourceReport("", "configmaps", "ConfigMap", version, ("v1", "v2"), ("v1", "v2"))


async def read_log(settings: KafkaSettings) -> list[Event]:
    """Every committed event of the topic, partition by partition, up to its end now."""
    return [event for event, _ in await read_records(settings)]


async def read_records(settings: KafkaSettings) -> list[tuple[Event, Position]]:
    """:func:`read_log` with each event's position."""
    consumer = AIOKafkaConsumer(
        **settings.client_kwargs(), enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(settings.topic, p) for p in range(settings.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[tuple[Event, Position]] = []
        for tp in partitions:
            while await consumer.position(tp) < ends[tp]:
                for message in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    records.append((decode(message.value), Position(tp.partition, message.offset)))
        return records
    finally:
        await consumer.stop()


async def wait_for(settings: KafkaSettings, done: Callable[[list[Event]], bool]) -> list[Event]:
    """The committed log once ``done`` holds for it."""
    async with asyncio.timeout(DEADLINE):
        while True:
            events = await read_log(settings)
            if done(events):
                return events
            await asyncio.sleep(0.1)


def migration_events(events: list[Event], resource: str = "pods") -> list[Event]:
    requested = {
        e.migration_id
        for e in events
        if isinstance(e, MigrationRequested) and e.resource == resource
    }
    return [e for e in events if getattr(e, "migration_id", None) in requested]


@contextlib.asynccontextmanager
async def migrator(settings: KafkaSettings, group_id: str) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_migrator(settings, stop=stop, group_id=group_id))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, DEADLINE)


@pytest.fixture
async def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    return settings


def requested(events: list[Event], resource: str = "pods") -> list[MigrationRequested]:
    return [e for e in migration_events(events, resource) if isinstance(e, MigrationRequested)]


async def test_agreement_requests_once_disagreement_cancels_and_change_requests_again(
    settings: KafkaSettings, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "consumers.partitions")
    group = f"{unique_topic}.migrator"
    async with EventProducer(settings) as producer:
        reporters = [
            Reporter("east", f"cp-{i}", [pods("v1")], producer, heartbeat_interval=5.0)
            for i in range(3)
        ]
        try:
            # Started before the migrator, which so decides on all three reports at once;
            # had it followed them one by one, each new member (a new StorageVersion
            # revision) would rightly cancel and request again.
            for reporter in reporters:
                await reporter.start()
            async with migrator(settings, group):
                events = await wait_for(settings, lambda es: len(requested(es)) == 1)
                (first,) = requested(events)
                assert first.target_version == "v1"
                # Its decision is logged, naming the migration and where it went.
                assert any(
                    f"appended MigrationRequested {first.migration_id} (east) at " in r.getMessage()
                    for r in caplog.records
                    if r.name == "consumers.partitions"
                )
                await producer.send(
                    MigrationStarted(
                        Meta.new("east", "worker", datetime.now(UTC)), first.migration_id
                    )
                )

                # One apiserver upgrades: the running migration is cancelled.
                await reporters[0].update([pods("v2")])
                events = await wait_for(
                    settings,
                    lambda es: any(isinstance(e, MigrationCancelled) for e in migration_events(es)),
                )
                cancels = [e for e in migration_events(events) if isinstance(e, MigrationCancelled)]
                assert [(c.migration_id, c.reason) for c in cancels] == [
                    (first.migration_id, REASON_DISAGREE)
                ]

                # All upgraded: a migration to v2 is requested.
                for reporter in reporters[1:]:
                    await reporter.update([pods("v2")])
                events = await wait_for(settings, lambda es: len(requested(es)) == 2)
                second = requested(events)[1]
                assert second.target_version == "v2"

                # A fourth apiserver joins: agreement is unknown until it reports (it
                # agrees), so the migration is cancelled as unknown, and requested again
                # for the new revision.
                reporters.append(
                    Reporter("east", "cp-3", [pods("v2")], producer, heartbeat_interval=5.0)
                )
                await reporters[-1].start()
                events = await wait_for(settings, lambda es: len(requested(es)) == 3)
                third = requested(events)[2]
                assert third.storage_version_revision != second.storage_version_revision
                assert [
                    e.reason
                    for e in migration_events(events)
                    if isinstance(e, MigrationCancelled) and e.migration_id == second.migration_id
                ] == [REASON_UNKNOWN]

            # A restarted migrator re-reads everything and appends nothing twice.
            async with migrator(settings, group):
                reporters.append(
                    Reporter("east", "cp-9", [configmaps("v1")], producer, heartbeat_interval=5.0)
                )
                await reporters[-1].start()
                # Its decision on configmaps proves the new migrator has caught up ...
                after = await wait_for(settings, lambda es: len(requested(es, "configmaps")) == 1)
        finally:
            for reporter in reporters:
                await reporter.stop()
    # ... and it decided nothing about pods again: its decisions on pods (cp-9 joined, so
    # pods' agreement was unknown until it reported) are all caused by cp-9's events.
    before = migration_events(events)
    assert migration_events(after)[: len(before)] == before
    earlier = {e.meta.event_id for e in events}
    assert all(e.meta.causation_id not in earlier for e in migration_events(after)[len(before) :])
