"""The checks of a run, judged on the run's own fold of the log, not the projector's.

:class:`LogMirror` reads the cluster's records as they are appended and folds them
with the projections' fold; it knows when every appended record has been read (the
run's quiescence test) and which migrations were requested or left active while the
apiservers disagreed. :func:`polluted` counts objects stored outside a StorageState's
persisted hashes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from ledger.events import (
    MigrationRequested,
    MigrationSucceeded,
    Position,
)
from ledger.hashing import storage_version_hash
from ledger.kafka import EndOffsets, EventConsumer, Record
from ledger.settings import KafkaSettings
from projections.fold import active_migrations, apply
from projections.state import UNKNOWN_HASH, Migration, ResourceKey, State
from simulation.scenario import Resource


class LogMirror:
    """The run's own reader and fold of its cluster's log, independent of the projector."""

    def __init__(self, settings: KafkaSettings, cluster: str) -> None:
        self._settings = settings
        self._consumer = EventConsumer(settings, group_id=None)
        # High watermarks, not last stable offsets: a transaction's commit returns
        # before the broker has written its markers, so for a moment the last stable
        # offset stops short of a record already appended (a lease GC's expiry, say)
        # and the log would look read to its end while that record is still to come.
        self._ends = EndOffsets(settings, committed=False)
        self._cluster = cluster
        self.state = State()
        self.records: list[Record] = []  # of the cluster
        self.refused_successes: set[str] = set()  # event IDs of successes the fold refused
        # The common version of each StorageVersion revision the log went through.
        self.common_at: dict[tuple[ResourceKey, str], str | None] = {}
        self.disagreeing: set[str] = set()  # migration IDs requested while servers disagreed
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LogMirror:
        await self._ends.__aenter__()
        await self._consumer.__aenter__()
        self._task = asyncio.create_task(self._read(), name="svledger-simulation-mirror")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.__aexit__(None, None, None)
        await self._ends.__aexit__(None, None, None)

    async def _read(self) -> None:
        async for batch in self._consumer.batches(timeout_ms=100, key=self._cluster.encode()):
            for record in batch:
                self._fold(record)

    def _fold(self, record: Record) -> None:
        event = record.event
        if isinstance(event, MigrationRequested):
            # Judged by the StorageVersion revision the request was decided on: a trigger
            # decides on the log as it has read it, and reports may land in between.
            key = (event.meta.cluster, event.group, event.resource)
            if self.common_at.get((key, event.storage_version_revision)) != event.target_version:
                self.disagreeing.add(event.migration_id)
        changes = apply(self.state, event, record.position)
        for key in changes.storage_versions:
            storage_version = self.state.storage_versions.get(key)
            if storage_version is not None:
                self.common_at[key, storage_version.revision] = (
                    storage_version.common_encoding_version
                )
        if isinstance(event, MigrationSucceeded) and changes.rejections:
            self.refused_successes.add(event.meta.event_id)
        self.records.append(record)

    async def caught_up(self) -> bool:
        """Whether every record appended to the topic so far has been read.

        The reader reads committed records only, so it gets to the high watermark once
        no transaction is open: a record of an undecided transaction is still to come.
        """
        positions = await self._consumer.positions()
        ends = await self._ends(positions)
        return all(positions[partition] >= end for partition, end in ends.items())

    def check_active(self) -> None:
        """Flag migrations still active while their resource's apiservers disagree."""
        for key, storage_version in self.state.storage_versions.items():
            if storage_version.common_encoding_version is None:
                self.disagreeing.update(m.migration_id for m in active_migrations(self.state, key))
        for migration in self.state.migrations.values():
            if migration.active and migration.resource_key not in self.state.storage_versions:
                self.disagreeing.add(migration.migration_id)


def polluted(resource: Resource, hashes: Sequence[str], stored: Mapping[str, int]) -> int:
    """Objects of ``resource`` stored in a version whose hash is not in ``hashes``."""
    if UNKNOWN_HASH in hashes:
        return 0
    return sum(
        count
        for version, count in stored.items()
        if storage_version_hash(resource.group, version, resource.kind) not in hashes
    )


def latest_migration(views: State, key: ResourceKey) -> Migration | None:
    migrations = [m for m in views.migrations.values() if m.resource_key == key]
    return max(migrations, key=lambda m: (m.requested_at, Position.parse(m.revision)), default=None)
