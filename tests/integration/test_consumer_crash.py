"""Kill -9 the migrator and the worker at random points: no migration event lost or doubled.

The migrator and the worker run as real processes (this module is also their entry
point). A driver appends the heartbeats and reports of three apiservers per cluster
that keep changing their minds (upgrades, rollbacks), so migrations are requested,
started, cancelled and requested again, while both consumers are killed at random
moments and restarted. Afterwards, once the rollout has settled and the last
migration has ended, the log must show every migration requested once and ended
once, and the trigger's rules must hold on the fold of the whole log.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.migrator import decide, run_migrator
from consumers.targets import ObjectRef, Page
from consumers.worker import RetryPolicy, Rewriter, run_worker
from ledger.clock import SystemClock
from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Meta,
    MigrationCancelled,
    MigrationFailed,
    MigrationRequested,
    MigrationSucceeded,
    Position,
    StorageVersionReported,
)
from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from ledger.tasks import log_tasks_on_signal
from projections.fold import active_migrations, apply
from projections.state import State
from svledger.cli import configure_logging
from tests.integration.test_migrator import DEADLINE, read_records

CLUSTERS = ("east", "west", "north")
APISERVERS = ("a1", "a2", "a3")
OBJECTS = 40


class SlowTarget:
    """``OBJECTS`` objects per resource, each rewrite taking a moment (so kills land mid-run)."""

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        start = int(continue_token) if continue_token else 0
        end = min(start + limit, OBJECTS)
        refs = tuple(ObjectRef(None, f"{resource}-{i}") for i in range(start, end))
        return Page(refs, str(end) if end < OBJECTS else None)

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        await asyncio.sleep(0.01)


async def _serve(role: str, bootstrap: str, topic: str) -> None:
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic=topic, partitions=2)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    log_tasks_on_signal(asyncio.get_running_loop())
    if role == "migrator":
        await run_migrator(settings, stop=stop, group_id=f"{topic}.migrator")
    else:
        rewriter = Rewriter(
            SlowTarget(),
            SystemClock(),
            chunk_size=7,
            policy=RetryPolicy(max_retries=2, backoff=0.1),
        )
        await run_worker(settings, rewriter, stop=stop, group_id=f"{topic}.worker")


def _spawn(
    role: str, bootstrap: str, topic: str, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """Run ``role`` as a process of its own; its warnings go to ``log`` if given."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.test_consumer_crash", role, bootstrap, topic],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if log is None else log.open("ab"),
    )


def _meta(cluster: str, source: str) -> Meta:
    return Meta.new(cluster, source, datetime.now(UTC))


def _report(cluster: str, apiserver: str, version: str) -> StorageVersionReported:
    """``apiserver`` encodes pods in ``version``, decoding and serving v1 and v2."""
    return StorageVersionReported(
        _meta(cluster, apiserver), apiserver, "", "pods", "Pod", version, ("v1", "v2"), ("v1", "v2")
    )


async def _drive(settings: KafkaSettings, rng: random.Random, rounds: int) -> None:
    async with EventProducer(settings) as producer:
        for cluster in CLUSTERS:
            for apiserver in APISERVERS:
                now = datetime.now(UTC)
                await producer.send(
                    ApiserverHeartbeat(
                        _meta(cluster, apiserver), apiserver, f"{apiserver}_1", apiserver, 3600, now
                    )
                )
        for _ in range(rounds):
            cluster = rng.choice(CLUSTERS)
            apiserver = rng.choice(APISERVERS)
            version = rng.choice(("v1", "v2"))
            await producer.send(_report(cluster, apiserver, version))
            await asyncio.sleep(rng.uniform(0.05, 0.4))
        # Settle: every cluster agrees on v2, so each ends with one migration to run.
        for cluster in CLUSTERS:
            for apiserver in APISERVERS:
                await producer.send(_report(cluster, apiserver, "v2"))


@pytest.mark.slow
async def test_kills_lose_and_double_no_migration_event(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    rng = random.Random(20240101)
    processes = {
        role: _spawn(role, kafka_bootstrap, unique_topic) for role in ("migrator", "worker")
    }
    driver = asyncio.create_task(_drive(settings, rng, rounds=150))
    kills = 0
    try:
        while not driver.done() or kills < 4:  # a fast run's settling sees the rest
            # A killed member's partitions move after its session times out (10 s).
            await asyncio.sleep(rng.uniform(3.0, 9.0))
            role = rng.choice(("migrator", "worker"))
            processes[role].send_signal(signal.SIGKILL)
            processes[role].wait()
            kills += 1
            processes[role] = _spawn(role, kafka_bootstrap, unique_topic)
        await driver

        def settled(records: list[tuple[Event, Position]]) -> bool:
            state, _ = _fold(records)
            agreed = all(
                state.storage_states.get((c, "", "pods")) is not None
                and state.storage_states[(c, "", "pods")].persisted_storage_version_hashes
                == (state.storage_states[(c, "", "pods")].current_storage_version_hash,)
                for c in CLUSTERS
            )
            return agreed and not any(m.active for m in state.migrations.values())

        async with asyncio.timeout(DEADLINE):
            while not settled(records := await read_records(settings)):
                await asyncio.sleep(0.2)
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        for process in processes.values():
            process.wait(DEADLINE)

    migration_events = [e for e, _ in records if hasattr(e, "migration_id")]
    event_ids = [e.meta.event_id for e in migration_events]
    assert len(event_ids) == len(set(event_ids)), "a migration event was appended twice"
    requested = [e for e in migration_events if isinstance(e, MigrationRequested)]
    assert len({e.migration_id for e in requested}) == len(requested)
    assert len(requested) > len(CLUSTERS)  # the chaos did cancel and re-request

    # Every requested migration ended exactly once. (A worker's step racing the
    # migrator's cancellation may still land; the fold refuses it, so count what it applied.)
    state, ended = _fold(records)
    assert ended == collections.Counter(e.migration_id for e in requested)
    for key in state.storage_states:
        assert decide(state, key, requested[-1].meta) == []
        assert active_migrations(state, key) == []


def _fold(records: list[tuple[Event, Position]]) -> tuple[State, collections.Counter[str]]:
    """The state of the log, and how many terminal steps the fold applied per migration."""
    state = State()
    ended: collections.Counter[str] = collections.Counter()
    for event, position in records:
        changes = apply(state, event, position)
        terminal = isinstance(event, MigrationSucceeded | MigrationFailed | MigrationCancelled)
        if terminal and (event.meta.cluster, event.migration_id) in changes.migrations:  # type: ignore[union-attr]
            ended[event.migration_id] += 1  # type: ignore[union-attr]
    return state, ended


if __name__ == "__main__":
    # Timed text lines as ``svledger`` writes them, warnings and up, and aiokafka's
    # group membership (joins, assignments) too: what a failed run needs to be read.
    configure_logging("WARNING", "text")
    logging.getLogger("aiokafka.consumer.group_coordinator").setLevel(logging.INFO)
    asyncio.run(_serve(*sys.argv[1:4]))
