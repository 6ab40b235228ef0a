"""The simulation's model of the automated-migration KEP's trigger against upstream's
(kube-storage-version-migrator's ``pkg/trigger/discovery_handler.go``)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import cast

from ledger.events import Event, MigrationRequested
from ledger.hashing import storage_version_hash
from projections.state import UNKNOWN_HASH, Migration, Phase, State
from simulation.baseline import DiscoveryHashTrigger
from simulation.cluster import LoadBalancer
from simulation.scenario import Resource

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DEPLOYMENTS = Resource("apps", "deployments", "Deployment", 10)


class _Discovery:
    """One apiserver whose discovery says the resource is stored in ``version``."""

    def __init__(self, version: str) -> None:
        self.version = version

    def pick(self, method: str, resource: Resource, rng: random.Random) -> _Discovery:
        return self

    def encoding_version(self, resource: Resource) -> str:
        return self.version


def _requested(events: list[Event]) -> MigrationRequested:
    [request] = events
    assert isinstance(request, MigrationRequested)
    return request


def _folded(state: State, request: MigrationRequested, phase: Phase) -> None:
    state.migrations["east", request.migration_id] = Migration(
        "east", request.migration_id, request.group, request.resource, request.target_version,
        request.target_hash, "0:1", phase, 0, None, None, None, NOW, NOW, "0:2", "0:2", NOW,
    )  # fmt: skip


def test_a_failed_or_cancelled_migration_is_requested_again_until_one_succeeds() -> None:
    """Upstream's ``needsMigration``: a StorageState not migrated, with no migration
    pending or running, is migrated again at the next discovery."""
    discovery = _Discovery("v1")
    trigger = DiscoveryHashTrigger(
        "east", [DEPLOYMENTS], cast(LoadBalancer, discovery), random.Random(0)
    )
    state = State()
    first = _requested(trigger.poll(state, NOW))
    v1 = storage_version_hash("apps", "v1", "Deployment")
    assert first.target_hash == v1
    assert trigger.poll(state, NOW) == []  # requested, not folded yet: in flight
    _folded(state, first, "Running")
    assert trigger.poll(state, NOW) == []
    for ended in ("Failed", "Cancelled"):
        _folded(state, first, ended)
        again = _requested(trigger.poll(state, NOW))
        assert (again.target_hash, again.migration_id != first.migration_id) == (v1, True)
        first = again
    _folded(state, first, "Succeeded")
    # Polled before its informer shows the success: migrated all the same.
    assert trigger.poll(state, NOW) == []
    assert trigger.beliefs[DEPLOYMENTS.name].persisted_hashes == [v1]


def test_a_changed_hash_is_appended_to_the_persisted_hashes_present_or_not() -> None:
    """Upstream's ``updateStorageState`` appends the new current hash unconditionally."""
    discovery = _Discovery("v1")
    trigger = DiscoveryHashTrigger(
        "east", [DEPLOYMENTS], cast(LoadBalancer, discovery), random.Random(0)
    )
    state = State()
    _folded(state, _requested(trigger.poll(state, NOW)), "Running")
    for version in ("v2", "v1", "v2"):
        discovery.version = version
        request = _requested(
            [e for e in trigger.poll(state, NOW) if isinstance(e, MigrationRequested)]
        )
        _folded(state, request, "Running")
    hashes = [storage_version_hash("apps", v, "Deployment") for v in ("v2", "v1", "v2")]
    assert trigger.beliefs[DEPLOYMENTS.name].persisted_hashes == [UNKNOWN_HASH, *hashes]
