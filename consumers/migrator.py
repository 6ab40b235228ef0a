"""The migration trigger: request a migration exactly when every live apiserver agrees.

:func:`decide` is the rule, a pure function of the folded state of one resource
(DESIGN.md, "Migrator (trigger) rules"):

* no common encoding version (apiservers disagree, or none reports the resource)
  and a migration Pending or Running -> ``MigrationCancelled`` with reason
  ``EncodingVersionsDisagree``, or ``EncodingVersionsUnknown`` where the entries agree
  but an apiserver holding a live lease has none (the condition is ``Unknown``: what
  it writes is not known, so nothing it may have written can be proven migrated);
* a common version with hash ``h``, persisted hashes not just ``[h]``, and no active
  migration for ``(h, current StorageVersion revision)`` -> ``MigrationCancelled``
  (``StorageVersionChanged``) for every other active migration of the resource, then
  ``MigrationRequested(h, revision)``;
* persisted hashes already ``[h]`` (DESIGN.md is silent here): nothing is requested,
  and an active migration for another ``(hash, revision)`` is cancelled
  (``StorageVersionChanged``). Only an operator's forced migration can be in that
  state; it can no longer count, and the worker does not run a stale migration, so
  without this it would stay active for good.

Only live apiservers have entries in a StorageVersion (the fold drops the entries of
an expired or released lease), and the fold sets the common version only when every
live apiserver has one, so "all live apiservers agree" is "the common version is set".

A migration's ID is a UUIDv5 of the state it was decided on: cluster, resource,
target hash, StorageVersion revision and StorageState revision. A request is made
only while no migration of that ID exists, so :func:`decide` is idempotent:
``decide`` on a state that already holds its own output returns nothing. Two
consequences: a restart can never request twice, whatever it re-reads; and a
migration that failed is requested again only after a **back-off measured in event
time**: the n-th consecutive failure of the same request (same target, same
StorageVersion and StorageState revisions) is retried by the first event of the
cluster at least ``backoff * 2**(n-1)`` (capped at ``max_backoff``) after the
failure, as attempt n, whose ID adds the attempt number. Not never, and not in a
tight loop against a broken target; a change of the resource (a report, an expiry,
an operator's ``storagestate reset`` or ``migrations request``) starts afresh at once.
Output events carry the triggering event's time (time is an event) and its ID as ``causation_id``.

:func:`run_migrator` is the shell, consume-transform-produce exactly once:

* a consumer in group ``svledger-migrator`` reads ``read_committed``; each assigned
  partition (= a set of whole clusters) gets its own fold state and its own
  transactional producer, transactional ID ``svledger-migrator-<topic>-<partition>``.
  Initialising it fences any earlier owner of the partition (a zombie after a
  rebalance or a crash) and aborts its open transaction.
* On assignment the partition's state is rebuilt by folding it from the beginning
  up to its end as of that moment (the last stable offset, after the fencing) -
  correctness over speed. Up to that end the state includes every event this
  migrator ever committed, so no decision is taken on a state that misses one of
  its own outputs; then every resource of the partition is decided once (by
  idempotence, only what is missing comes out).
* Per batch: fold it into the partition's state with the projections' own
  :func:`projections.fold.apply`, decide for the resources it touched, and in ONE
  transaction produce the decisions and commit the input offsets
  (``send_offsets_to_transaction``). The migrator's own output comes back through
  the log and is folded like every other event, so its state always equals the
  log's. Until the fold has passed the output of its last transaction, the
  partition's touched resources wait (they are decided as soon as it has), for the
  same reason as on assignment.
* A fenced or failed transaction drops the partition's state; it is rebuilt as on
  assignment.

Metrics (:mod:`ledger.metrics`): the seconds from a MigrationRequested's cause to
its commit, and the migrations of each cluster by phase, counted in the partitions'
folds when scraped. The migrator, not the projector, counts them: each migrator owns
its partitions alone, so the counts of several add up, while every projector reloads
all clusters from the database it shares.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Final

from consumers.partitions import Folded, PartitionFollower, PartitionLost
from ledger import metrics
from ledger.events import Event, Meta, MigrationCancelled, MigrationFailed, MigrationRequested
from ledger.names import resource_name
from ledger.settings import KafkaSettings
from projections.agreement import source_conflicts, unreported
from projections.crds import removable_versions
from projections.fold import active_migrations
from projections.snapshots import SnapshotSource
from projections.state import PHASES, Changes, Migration, ResourceKey, State

SOURCE: Final = "svledger-migrator"
GROUP_ID: Final = "svledger-migrator"
REASON_DISAGREE: Final = "EncodingVersionsDisagree"
REASON_UNKNOWN: Final = "EncodingVersionsUnknown"
REASON_CHANGED: Final = "StorageVersionChanged"

# Fixed namespace of the migrator's UUIDv5 identifiers; never change it.
_NAMESPACE: Final = uuid.UUID("5b0c8d3e-53a4-4c4e-8d0f-6a7e2f0e9b41")


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    """How long, in event time, a failed migration waits before it is requested again."""

    seconds: float = 60.0  # after the first failure; doubles with each further one
    max_seconds: float = 3600.0

    def after(self, failures: int) -> timedelta:
        doublings = min(failures - 1, 64)  # past that the maximum holds anyway
        return timedelta(seconds=min(self.seconds * 2**doublings, self.max_seconds))


def migration_id(
    resource_key: ResourceKey,
    target_hash: str,
    sv_revision: str,
    ss_revision: str,
    attempt: int = 0,
) -> str:
    """The ID of the migration decided on this state of the resource (UUIDv5)."""
    cluster, group, resource = resource_key
    name = f"{cluster}/{group}/{resource}/{target_hash}/{sv_revision}/{ss_revision}"
    if attempt:
        name += f"/attempt-{attempt}"
    return str(uuid.uuid5(_NAMESPACE, name))


def decide(
    state: State, resource_key: ResourceKey, cause: Meta, backoff: Backoff = Backoff()
) -> list[Event]:
    """The events the trigger appends for ``resource_key`` in ``state`` (maybe none)."""
    cluster, group, resource = resource_key
    name = resource_name(group, resource)
    storage_version = state.storage_versions.get(resource_key)
    storage_state = state.storage_states.get(resource_key)
    active = active_migrations(state, resource_key)
    common = storage_version.common_encoding_version if storage_version is not None else None
    target_hash = storage_state.current_storage_version_hash if storage_state is not None else None
    if storage_version is not None and storage_version.condition.status == "Unknown":
        message = f"agreement on {name!r} is unknown: {storage_version.condition.message}"
        return [_cancel(m, cause, REASON_UNKNOWN, message) for m in active]
    if storage_version is None or storage_state is None or common is None or target_hash is None:
        message = f"the live apiservers do not agree on an encoding version of {name!r}"
        return [_cancel(m, cause, REASON_DISAGREE, message) for m in active]
    revision = storage_version.revision
    others = [
        m for m in active if (m.target_hash, m.storage_version_revision) != (target_hash, revision)
    ]
    if storage_state.persisted_storage_version_hashes == (target_hash,):
        # Nothing to migrate. A migration for another state (one an operator forced
        # before the StorageVersion moved) can no longer count, and the worker does
        # not run it: it ends here rather than stay active.
        if not others:
            return []
        return _changed(
            others,
            cause,
            f"the storage version of {name!r} is at revision {revision}, and every object"
            f" is stored in {common!r} already",
        )
    if len(others) < len(active):
        return []  # a migration for this very state is under way
    attempt = 0
    while True:
        new_id = migration_id(resource_key, target_hash, revision, storage_state.revision, attempt)
        earlier = state.migrations.get((cluster, new_id))
        if earlier is None:
            break
        if earlier.phase != "Failed":
            return []  # decided on this state already (it succeeded or was cancelled)
        attempt += 1
        if cause.occurred_at < earlier.updated_at + backoff.after(attempt):
            return []  # backing off; a later event of the cluster decides again
    events = _changed(
        active,
        cause,
        f"the storage version of {name!r} is now {common!r} (hash {target_hash!r})"
        f" at revision {revision}",
    )
    events.append(
        MigrationRequested(
            meta=_meta(cause, f"requested/{cluster}/{new_id}"),
            migration_id=new_id,
            group=group,
            resource=resource,
            target_version=common,
            target_hash=target_hash,
            storage_version_revision=revision,
        )
    )
    return events


def _changed(migrations: list[Migration], cause: Meta, message: str) -> list[Event]:
    """``MigrationCancelled`` (``StorageVersionChanged``) for each of ``migrations``."""
    return [_cancel(m, cause, REASON_CHANGED, message) for m in migrations]


def _cancel(migration: Migration, cause: Meta, reason: str, message: str) -> MigrationCancelled:
    return MigrationCancelled(
        meta=_meta(cause, f"cancelled/{migration.cluster}/{migration.migration_id}"),
        migration_id=migration.migration_id,
        objects_migrated=migration.objects_migrated,
        continue_token=migration.continue_token,
        reason=reason,
        message=message,
    )


def _meta(cause: Meta, name: str) -> Meta:
    # A migration is requested and cancelled at most once: the name is a stable event ID.
    return Meta(
        event_id=str(uuid.uuid5(_NAMESPACE, name)),
        cluster=cause.cluster,
        occurred_at=cause.occurred_at,
        source=SOURCE,
        causation_id=cause.event_id,
        correlation_id=cause.correlation_id or cause.event_id,
    )


def migrations_by_phase(state: State) -> dict[tuple[str, str], int]:
    """How many migrations each cluster of ``state`` has in each phase (0 included)."""
    counts = collections.Counter((m.cluster, m.phase) for m in state.migrations.values())
    clusters = {cluster for cluster, _ in counts}
    return {(cluster, phase): counts[cluster, phase] for cluster in clusters for phase in PHASES}


def touched_resources(state: State, changes: Changes) -> set[ResourceKey]:
    """The resources whose decision an event's changes may have moved."""
    touched = set(changes.resources)
    for key in changes.migrations:
        migration = state.migrations.get(key)
        if migration is not None:
            touched.add(migration.resource_key)
    return touched


async def run_migrator(
    settings: KafkaSettings,
    *,
    stop: asyncio.Event,
    group_id: str = GROUP_ID,
    backoff: Backoff = Backoff(),
    snapshots: SnapshotSource | None = None,
) -> None:
    """Follow the log and append the trigger's decisions, exactly once, until ``stop`` is set.

    ``snapshots``: the projector's database, to rebuild partitions from their latest
    fold snapshots instead of the log's beginning (:mod:`consumers.partitions`).
    """
    follower = PartitionFollower(
        settings,
        group_id=group_id,
        transactional_prefix=f"svledger-migrator-{settings.topic}",
        renewals=False,  # they touch no resource; their time comes in Folded.latest()
        snapshots=snapshots,
    )
    failed: dict[int, set[ResourceKey]] = {}  # per partition: resources backing off

    def phases() -> list[tuple[tuple[str, str], int]]:
        # Partitions still being rebuilt would show part of their history.
        logs = [log for log in follower.logs.values() if log.caught_up]
        return [sample for log in logs for sample in migrations_by_phase(log.state).items()]

    def states() -> list[State]:
        return [log.state for log in follower.logs.values() if log.caught_up]

    async with follower:
        with (
            metrics.MIGRATIONS.sampling(phases),
            metrics.AGREEMENT.sampling(lambda: agreement_samples(states())),
            metrics.UNREPORTED_APISERVERS.sampling(lambda: unreported_samples(states())),
            metrics.SOURCE_CONFLICTS.sampling(lambda: conflict_samples(states())),
            metrics.STORED_VERSIONS_REMOVABLE.sampling(lambda: removable_samples(states())),
            metrics.STORED_VERSIONS_UNSAFE_PRUNES.sampling(lambda: unsafe_prune_samples(states())),
            metrics.POLLUTED_OBJECTS.sampling(lambda: pollution_samples(states())),
        ):
            async for folded in follower.batches(stop):
                await _react(folded, failed, backoff)


def agreement_samples(states: Iterable[State]) -> list[tuple[tuple[str, str, str], int]]:
    """``svledger_storage_version_agreement``: 1 per StorageVersion, for its status."""
    return [
        ((sv.cluster, sv.name, sv.condition.status), 1)
        for state in states
        for sv in state.storage_versions.values()
    ]


def unreported_samples(states: Iterable[State]) -> list[tuple[tuple[str, str], int]]:
    """``svledger_storage_version_unreported_apiservers``: members without an entry."""
    return [
        ((sv.cluster, sv.name), len(unreported(state, key, sv.entries)))
        for state in states
        for key, sv in state.storage_versions.items()
    ]


def conflict_samples(states: Iterable[State]) -> list[tuple[tuple[str, str], int]]:
    """``svledger_storage_version_source_conflicts``: apiservers whose sources disagree."""
    return [
        ((sv.cluster, sv.name), len(source_conflicts(sv.entries)))
        for state in states
        for sv in state.storage_versions.values()
    ]


def removable_samples(states: Iterable[State]) -> list[tuple[tuple[str, str], int]]:
    """``svledger_stored_versions_removable``: versions of storedVersions proven empty."""
    return [
        ((crd.cluster, resource_name(crd.group, crd.resource)), len(removable_versions(state, key)))
        for state in states
        for key, crd in state.custom_resources.items()
    ]


def unsafe_prune_samples(states: Iterable[State]) -> list[tuple[tuple[str, str], int]]:
    """``svledger_stored_versions_unsafe_prunes``: CRDs pruned without the ledger's proof."""
    return [
        ((crd.cluster, resource_name(crd.group, crd.resource)), int(crd.prune_alarm is not None))
        for state in states
        for crd in state.custom_resources.values()
    ]


def pollution_samples(states: Iterable[State]) -> list[tuple[tuple[str, str], int]]:
    """``svledger_storage_polluted_objects``: per audited resource, from its last audit."""
    samples = []
    for state in states:
        for audit in state.audits.values():
            counts = dict(zip(audit.versions, audit.version_counts, strict=True))
            polluted = sum(counts[version] for version in audit.polluted_versions)
            samples.append(((audit.cluster, resource_name(audit.group, audit.resource)), polluted))
    return samples


async def _react(folded: Folded, failed: dict[int, set[ResourceKey]], backoff: Backoff) -> None:
    log = folded.log
    backing_off = failed.setdefault(log.partition, set())
    if log.resumed:
        # Rebuilt from a fold snapshot: the events before it, and what the migrator
        # would have decided on them (a request it missed while down, a failure to
        # back off from), were not seen one by one. So every resource of the state
        # is decided as a backing-off one is: at the time of its cluster's next event.
        log.resumed = False
        backing_off |= touched_resources(log.state, Changes.everything(log.state))
    for event, changes in folded.events:
        for key in touched_resources(log.state, changes):
            log.touched[key] = event.meta
        if isinstance(event, MigrationFailed):
            migration = log.state.migrations.get((event.meta.cluster, event.migration_id))
            if migration is not None:
                backing_off.add(migration.resource_key)
    if backing_off:
        # Time moved: every resource backing off in a cluster that had an event is
        # decided again at that event's time.
        latest = folded.latest()
        for key in backing_off:
            if key[0] in latest:
                log.touched.setdefault(key, latest[key[0]])
    if not log.caught_up or not log.touched:
        return
    touched, log.touched = log.touched, {}
    events: list[Event] = []
    for key in sorted(touched):
        decided = decide(log.state, key, touched[key], backoff)
        events.extend(decided)
        if key in backing_off and (
            any(isinstance(e, MigrationRequested) for e in decided)
            or not any(m.phase == "Failed" for m in _latest(log.state, key))
        ):
            backing_off.discard(key)
    # A lost partition is rebuilt from the log on the next poll, where every resource
    # is decided again.
    with contextlib.suppress(PartitionLost):
        await log.commit(events)
        committed = datetime.now(UTC)
        for event in events:
            if isinstance(event, MigrationRequested):
                # Its time is its cause's (time is an event): the reaction is the rest.
                reaction = (committed - event.meta.occurred_at).total_seconds()
                metrics.REACTION_SECONDS.observe(max(0.0, reaction))


def _latest(state: State, key: ResourceKey) -> list[Migration]:
    """The resource's most recently requested migration, as a list of zero or one."""
    migrations = [m for m in state.migrations.values() if m.resource_key == key]
    return sorted(migrations, key=lambda m: m.requested_at)[-1:]
