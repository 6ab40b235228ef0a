"""The in-tree executor while its cluster is away: a cancellation still ends the migration."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio import client

from deploy.kafka.broker import free_port
from kube.client import Kube
from kube.executor import StorageMigrationExecutor
from ledger.clock import SystemClock
from ledger.events import Event
from projections.state import Migration, Phase

START = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.fixture
async def away() -> AsyncIterator[Kube]:
    """A client of an API server that does not answer: nothing listens on its port."""
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    kube = Kube(configuration)
    yield kube
    await kube.close()


def migration(phase: Phase) -> Migration:
    return Migration(
        "east", "m-1", "apps", "deployments", "apps/v1", "h", "0:1", phase, 0, None, None,
        None, START, START, "0:2",
    )  # fmt: skip


@pytest.mark.parametrize("phase", ["Pending", "Running"])
async def test_a_migration_cancelled_while_its_cluster_is_away_ends(
    away: Kube, phase: Phase
) -> None:
    appended: list[Event] = []
    polls = 0

    async def append(events: Sequence[Event]) -> None:
        appended.extend(events)

    def cancelled() -> bool:
        nonlocal polls
        polls += 1
        return polls > 3  # cancelled after a few attempts to reach the cluster

    executor = StorageMigrationExecutor(away, SystemClock(), poll_seconds=0.01)
    await asyncio.wait_for(
        executor.run(migration(phase), append=append, cancelled=cancelled), timeout=30
    )
    assert appended == []  # nothing was created, nothing started, nothing to report
    assert polls == 4
