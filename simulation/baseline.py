"""The baseline: the automated-migration KEP's trigger without its HA extension.

``svledger simulate --trigger discovery-hash`` runs it in place of the ledger's
migrator, so a run shows what the old way does to the same rolling upgrade.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Final

from consumers import migrator
from ledger.events import (
    Event,
    Meta,
    MigrationCancelled,
    MigrationRequested,
)
from ledger.hashing import storage_version_hash
from ledger.names import group_version
from projections.state import UNKNOWN_HASH, State
from simulation.cluster import LoadBalancer
from simulation.scenario import Resource

BASELINE_SOURCE: Final = "discovery-hash-trigger"


@dataclasses.dataclass
class _Belief:
    """The old trigger's StorageState of one resource."""

    current_hash: str
    persisted_hashes: list[str]
    migration_id: str | None  # its migration in flight


class DiscoveryHashTrigger:
    """The KEP's trigger without HA support: poll one apiserver, trust what it says.

    Every poll reads the storage version hash of each resource from ONE apiserver (the
    one the load balancer picks). On first sight the StorageState is created with
    persisted hashes ``["Unknown"]`` and a migration is requested; when the hash differs
    from the current one, the running migration is cancelled, a migration to the new
    version is requested and the hash is appended to the persisted hashes (as upstream's
    ``updateStorageState`` appends it, present or not); while the resource is not
    migrated (its persisted hashes are not the current one alone) and no migration of
    it is pending or running (the last one failed, or was cancelled), a migration is
    requested again at the next poll (upstream's ``needsMigration``). When its
    migration succeeds, the persisted hashes become the current hash alone.
    """

    def __init__(
        self,
        cluster: str,
        resources: Iterable[Resource],
        balancer: LoadBalancer,
        rng: random.Random,
    ) -> None:
        self._cluster = cluster
        self._resources = tuple(resources)
        self._balancer = balancer
        self._rng = rng
        self.beliefs: dict[str, _Belief] = {}

    def poll(self, state: State, now: datetime) -> list[Event]:
        self.observe(state)  # a success since the last look is not a migration to redo
        events: list[Event] = []
        for resource in self._resources:
            server = self._balancer.pick("GET", resource, self._rng)
            if server is None:
                continue
            version = server.encoding_version(resource)
            found = storage_version_hash(resource.group, version, resource.kind)
            belief = self.beliefs.get(resource.name)
            if belief is not None and belief.current_hash == found:
                if belief.persisted_hashes == [found] or self._in_flight(state, belief):
                    continue
            elif belief is None:
                belief = self.beliefs[resource.name] = _Belief(found, [UNKNOWN_HASH], None)
            else:
                running = state.migrations.get((self._cluster, belief.migration_id or ""))
                if running is not None and running.active:
                    events.append(
                        MigrationCancelled(
                            self._meta(now),
                            running.migration_id,
                            running.objects_migrated,
                            reason=migrator.REASON_CHANGED,
                            message=f"discovery shows {resource.name} stored in {version}",
                        )
                    )
                belief.current_hash = found
                belief.persisted_hashes.append(found)
            storage_version = state.storage_versions.get(
                (self._cluster, resource.group, resource.resource)
            )
            belief.migration_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            events.append(
                MigrationRequested(
                    self._meta(now),
                    belief.migration_id,
                    resource.group,
                    resource.resource,
                    target_version=group_version(resource.group, version),
                    target_hash=found,
                    # The old trigger knows no revisions; the ledger's guard gets the
                    # StorageVersion as it stands when the request is made.
                    storage_version_revision=storage_version.revision if storage_version else "",
                )
            )
        return events

    def _in_flight(self, state: State, belief: _Belief) -> bool:
        """Whether the resource's last migration is pending or running (or requested
        and not folded yet)."""
        if belief.migration_id is None:
            return False
        migration = state.migrations.get((self._cluster, belief.migration_id))
        return migration is None or migration.active

    def observe(self, state: State) -> None:
        """Watch the migrations (the KEP's informer): a success refines persisted hashes."""
        for belief in self.beliefs.values():
            migration = state.migrations.get((self._cluster, belief.migration_id or ""))
            if migration is not None and migration.phase == "Succeeded":
                belief.persisted_hashes = [belief.current_hash]
                belief.migration_id = None

    def _meta(self, now: datetime) -> Meta:
        return Meta.new(self._cluster, BASELINE_SOURCE, now)
