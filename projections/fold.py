"""The fold: how one event changes the views, as a pure function of the log.

:func:`apply` takes the :class:`~projections.state.State`, one event and its log
position, replaces the rows the event changes and returns the keys it touched
(:class:`~projections.state.Changes`). It reads no clock, draws no random number and
does no I/O: the only "now" it knows is the event's own ``meta.occurred_at``, so a
replay of the same log yields the same rows, bit for bit. Every key includes the
cluster (``meta.cluster``); clusters never see each other's rows.

A row's ``revision`` is the position of the last event that changed its content. An
event that leaves a row as it was does not touch it: an apiserver re-reporting the
identical entry after every restart must not move the StorageVersion's revision,
because a migration is valid only for the revision it was requested at.

A row the read API serves as an object (a lease, StorageVersion, StorageState or
migration) records its creation: ``created_revision`` and ``created_at`` are the
position and time of the event that made it, carried over as the row changes
(:func:`_created`), so a row deleted and made again is created again. Every event, even
one rejected, moves its cluster's :class:`~projections.state.Cluster` to the latest time
one occurred at (:func:`occurred`).

Events are never dropped silently. One the fold cannot apply (a report from an
apiserver without a lease, an expiry of a lease renewed since, a step of an unknown
migration, ...) leaves the views as they were and adds a
:class:`~projections.state.Rejection` saying why.

Decisions taken here, beyond DESIGN.md's fold rules:

* Liveness is membership in ``State.leases``: only heartbeats add a lease and only
  applied releases and expiries remove one; the fold never compares renew times
  with its own notion of now (it has none).
* An event other than a heartbeat whose ``event_id`` (its idempotency key) the fold has
  seen in its cluster within the last hour of that cluster's event time is rejected as
  a repeat, citing the earlier one; :class:`~projections.state.SeenEvents` says why the
  window and why not heartbeats.
* A heartbeat is rejected (:func:`heartbeat_refusal`) for what upstream's
  ``ValidateLease`` refuses in a Lease: an apiserver ID (the Lease's name) that is not
  a DNS-1123 subdomain, as upstream refuses it in a StorageVersion too, and a lease
  duration that is not positive. svledger's reporter and collector never write one; a
  hand-made event could.
* A release names the holder identity (``<apiserver ID>_<uuid>``, new on every
  start) that is shutting down. The apiserver ID is stable across restarts, so a
  release sent by an old process after its successor's first heartbeat would drop
  the successor's lease; a release therefore applies only while its holder still
  holds the lease. An expiry applies only if the lease was not renewed after the
  expiry's ``last_renew_time``, the renewal the lease GC saw when it decided.
* A StorageVersion's entries are in upstream's order: as its updater does, a known
  apiserver's report replaces its entry in place and a new apiserver's is appended;
  dropping an apiserver's entries keeps the others' order. The views keep the order
  in each entry row's ``ordinal``. Agreement does not depend on the order.
* **Membership is complete or there is no agreement.** Every apiserver holding a lease
  in the cluster must report for a StorageVersion's common encoding version to be set:
  while one reports nothing at all (it just joined and has not reported yet, or the
  collector cannot read it: its entries were withdrawn, or has no address for it), the
  condition of every StorageVersion it has no entry in is ``Unknown`` (reason
  ``CommonEncodingVersionUnknown``, naming it) and no migration starts or goes on
  (:mod:`projections.agreement`). One that reports other resources but not this
  one does not serve it (an apiserver's resources are reported, and withdrawn, as a
  whole set), so it cannot write it. A heartbeat that adds a member, an end of a lease,
  and a member's first or last entry recompute the agreement of every StorageVersion of
  the cluster; plain renewals touch none. Upstream sets ``commonEncodingVersion`` from
  the entries present alone, whoever holds a lease.
* **An apiserver may be read from several sources** (``StorageVersionReported.source``:
  its own discovery, its StorageVersion entry, or its own report): it holds one entry
  per source, and the entries of every source must name one encoding version, so two
  sources contradicting each other are a disagreement (the condition's message names
  them). A withdrawal removes the entry of its source only; the end of a lease removes
  all of the apiserver's.
* ``current_storage_version_hash`` is the hash of the common encoding version and
  is null while the apiservers disagree or none reports the resource: the KEP
  defines it as the hash of *the* current storage version, and while servers
  disagree there is none (each writes its own). Persisted hashes never lose a
  version except by a fresh migration success or a reset.
* A MigrationSucceeded whose StorageVersion changed since the migration was
  requested (another revision, or a common version that no longer hashes to the
  target) is stale: objects may have been written in another version after the
  worker rewrote them. The migration still becomes Succeeded (its work did finish),
  but the persisted hashes stay as they were and a Rejection records why; the
  migrator then requests a migration for the current revision. :func:`stale_reason`
  is that rule; the worker asks it too, and does not start or go on with a migration
  that is stale already in its own fold.
* A MigrationRequested drops the resource's Succeeded and Cancelled migrations from
  the views (their events stay in the log and in ``ledger_events``), as upstream's
  storage version migrator deletes a resource's migrations before it creates a new
  one. The fold's memory then grows with the resources, not with the log. A
  migration that Failed stays while it is an attempt of the same request (the same
  target hash and StorageVersion revision): the migrator's back-off counts those
  attempts, and the worker's next attempt resumes at its continue token
  (:func:`consumers.worker.resumed`); a request for anything else drops it too. A
  fresh success (one that sets the persisted hashes) drops the resource's Failed
  migrations as well: every object is stored in the target, so nothing is left to
  resume or to back off from. Where upstream ends, the views end: once every
  resource is migrated, each one's migrations are its last success (its e2e tests
  assert "all migrations completed").
* A StorageStateReset also cancels the resource's Pending and Running migrations
  (reason ``StorageStateReset``), as upstream's trigger deletes a resource's
  migrations when it finds its StorageState stale and starts afresh. Objects may be
  stored in any version again (a restored backup), so work requested before the reset
  proves nothing, and its success must not set the persisted hashes back to the
  target; the migrator then requests a migration on the reset state. The fold, not
  the migrator, cancels them: the reset and its consequence are one event, so no
  success can come between them.
* Migration phases move Pending -> Running -> Succeeded, with Failed from Pending or
  Running, Cancelled from Pending, Running or Failed, and Started again from Failed
  (resuming from the last continue token). Any other step is rejected, so a worker's
  progress that arrives after a cancellation cannot revive the migration.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Final, TypeVar

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    CustomResourceDefinitionObserved,
    Event,
    MigrationCancelled,
    MigrationFailed,
    MigrationProgressed,
    MigrationRequested,
    MigrationStarted,
    MigrationStatusEvent,
    MigrationSucceeded,
    Position,
    StorageAudited,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
    type_name,
)
from ledger.hashing import hash_of_report, hash_of_stored
from ledger.names import resource_name, storage_state_name
from ledger.validation import (
    LEASE_DURATION_MAX,
    InvalidReport,
    check_apiserver_id,
    check_report,
)
from projections.agreement import agreement, unreported
from projections.crds import dropped, verdict
from projections.state import (
    UNKNOWN_HASH,
    Changes,
    Cluster,
    CustomResourceDefinition,
    Lease,
    LeaseKey,
    Migration,
    Phase,
    Rejection,
    ResourceKey,
    SeenEvent,
    SeenEvents,
    ServerStorageVersion,
    State,
    StorageAudit,
    StorageState,
    StorageVersion,
)

# The phases each migration step may start from, and the phase it leads to.
_STEPS: Final[dict[type[MigrationStatusEvent], tuple[frozenset[Phase], Phase]]] = {
    MigrationStarted: (frozenset({"Pending", "Failed"}), "Running"),
    MigrationProgressed: (frozenset({"Running"}), "Running"),
    MigrationSucceeded: (frozenset({"Running"}), "Succeeded"),
    MigrationFailed: (frozenset({"Pending", "Running"}), "Failed"),
    MigrationCancelled: (frozenset({"Pending", "Running", "Failed"}), "Cancelled"),
}

REASON_RESET: Final = "StorageStateReset"  # a migration cancelled by a reset
# How the rejection of a stale success begins: it moved its migration, not the hashes.
STALE_SUCCESS: Final = "stale success"

_Key = TypeVar("_Key")
_Row = TypeVar(
    "_Row", Lease, StorageVersion, StorageState, Migration, CustomResourceDefinition, StorageAudit
)

# Each row type's content: every field but ``revision``, as one tuple. Comparing these
# is what ``_store`` needs, without building a copy of the old row to compare with.
_CONTENT: Final[dict[type[Any], Callable[[Any], tuple[object, ...]]]] = {
    row_type: operator.attrgetter(
        *(field.name for field in dataclasses.fields(row_type) if field.name != "revision")
    )
    for row_type in (
        Lease,
        StorageVersion,
        StorageState,
        Migration,
        CustomResourceDefinition,
        StorageAudit,
    )
}


# Every report is checked; reports repeat (each apiserver, each start): a valid one is
# remembered (an invalid one raises, and is not).
_check_report = functools.lru_cache(maxsize=4096)(check_report)
_check_apiserver_id = functools.lru_cache(maxsize=4096)(check_apiserver_id)


def apply(
    state: State, event: Event, position: Position, changes: Changes | None = None
) -> Changes:
    """Fold one event into ``state`` in place; return the keys of the rows it changed.

    A key in the result that is missing from ``state`` afterwards names a deleted row.
    With ``changes`` (a batch's so far), the keys are added to it and it is returned.
    """
    if changes is None:
        changes = Changes()
    meta = event.meta
    occurred(state, meta.cluster, position.partition, meta.occurred_at, changes)
    revision = str(position)
    if type(event) is not ApiserverHeartbeat and (earlier := _seen(state, event, revision)):
        _reject(
            changes,
            event,
            revision,
            f"a repeat of the event at {earlier.revision} (event_id {earlier.event_id}, the"
            " idempotency key): an event is folded once",
        )
        return changes
    match event:
        case ApiserverHeartbeat():
            _heartbeat(state, event, revision, changes)
        case ApiserverLeaseReleased() | ApiserverLeaseExpired():
            _lease_ended(state, event, revision, changes)
        case StorageVersionReported():
            _reported(state, event, revision, changes)
        case StorageVersionWithdrawn():
            _withdrawn(state, event, revision, changes)
        case StorageStateReset():
            _reset(state, event, revision, changes)
        case MigrationRequested():
            _migration_requested(state, event, revision, changes)
        case CustomResourceDefinitionObserved():
            _crd_observed(state, event, revision, changes)
        case StoredVersionsPruned() | StoredVersionsPruneRefused():
            _prune_recorded(state, event, revision, changes)
        case StorageAudited():
            _audited(state, event, revision, changes)
        case _:
            _migration_step(state, event, revision, changes)
    return changes


def fold(records: Iterable[tuple[Event, Position]], state: State | None = None) -> State:
    """Fold ``records`` in order into ``state`` (a new, empty one by default) and return it."""
    state = State() if state is None else state
    for event, position in records:
        apply(state, event, position)
    return state


def subject(event: Event) -> str:
    """The name of what an event is about: an apiserver ID, a resource or a migration ID."""
    match event:
        case ApiserverHeartbeat() | ApiserverLeaseReleased() | ApiserverLeaseExpired():
            return event.apiserver_id
        case (
            StorageVersionReported()
            | StorageVersionWithdrawn()
            | StorageStateReset()
            | CustomResourceDefinitionObserved()
            | StoredVersionsPruned()
            | StoredVersionsPruneRefused()
            | StorageAudited()
        ):
            return resource_name(event.group, event.resource)
        case _:
            return event.migration_id


def live_leases(state: State, cluster: str) -> list[Lease]:
    """The leases held in ``cluster``, by apiserver ID."""
    return sorted(
        (lease for lease in state.leases.values() if lease.cluster == cluster),
        key=lambda lease: lease.apiserver_id,
    )


def active_migrations(state: State, resource_key: ResourceKey) -> list[Migration]:
    """The Pending or Running migrations of a resource, oldest request first."""
    migrations = (
        state.migrations[key] for key in state.active_migrations_by_resource.get(resource_key, ())
    )
    return sorted(migrations, key=lambda m: (m.requested_at, m.migration_id))


def occurred(state: State, cluster: str, partition: int, time: datetime, changes: Changes) -> None:
    """An event of ``cluster`` (in ``partition``) occurred at ``time``: its
    :class:`~projections.state.Cluster` moves to it if it is the latest."""
    known = state.clusters.get(cluster)
    if known is None or time > known.latest_occurred_at:
        state.clusters[cluster] = Cluster(cluster, partition, time)
        changes.clusters.add(cluster)


def _created(
    previous: Lease | StorageVersion | StorageState | None, revision: str, now: datetime
) -> tuple[str, datetime]:
    """The creation of a row replacing ``previous`` (None: it first appears now, at
    ``revision``): the earlier row's, carried over."""
    if previous is None:
        return revision, now
    return previous.created_revision, previous.created_at


def _seen(state: State, event: Event, revision: str) -> SeenEvent | None:
    """The earlier occurrence of ``event``'s ID in its cluster, if one is remembered."""
    meta = event.meta
    seen = state.seen.get(meta.cluster)
    if seen is None:
        seen = state.seen[meta.cluster] = SeenEvents()
    return seen.see(SeenEvent(meta.cluster, meta.event_id, meta.occurred_at, revision))


def heartbeat_refusal(event: ApiserverHeartbeat) -> str | None:
    """Why the fold rejects ``event``, if it does: what upstream refuses in a Lease."""
    try:
        _check_apiserver_id(event.apiserver_id)  # the Lease's name, as in a report
    except InvalidReport as error:
        return str(error)
    if event.lease_duration_seconds <= 0:
        return (
            f"lease_duration_seconds {event.lease_duration_seconds} is not positive; a"
            " Lease's duration must be greater than 0"
        )
    if event.lease_duration_seconds > LEASE_DURATION_MAX:
        return (
            f"lease_duration_seconds {event.lease_duration_seconds} is more than a Lease"
            f" can hold (an int32: {LEASE_DURATION_MAX} at most)"
        )
    return None


def _heartbeat(state: State, event: ApiserverHeartbeat, revision: str, changes: Changes) -> None:
    refusal = heartbeat_refusal(event)
    if refusal is not None:
        _reject(changes, event, revision, f"{refusal}; the lease stays as it was")
        return
    cluster = event.meta.cluster
    previous = state.leases.get((cluster, event.apiserver_id))
    created_revision, created_at = _created(previous, revision, event.meta.occurred_at)
    lease = Lease(
        cluster=cluster,
        apiserver_id=event.apiserver_id,
        holder_identity=event.holder_identity,
        hostname=event.hostname,
        lease_duration_seconds=event.lease_duration_seconds,
        renew_time=event.renew_time,
        binary_version=event.binary_version,
        revision=revision,
        created_revision=created_revision,
        created_at=created_at,
        peer_advertise_address=event.peer_advertise_address,
    )
    joins = previous is None
    _store(state.leases, lease.key, lease, changes.leases)
    if joins:
        # A new member: nothing it writes is known until it reports, resource by resource.
        state.members_by_cluster.setdefault(cluster, set()).add(event.apiserver_id)
        _refresh_agreement(state, cluster, event.meta.occurred_at, revision, changes)


def _lease_ended(
    state: State,
    event: ApiserverLeaseReleased | ApiserverLeaseExpired,
    revision: str,
    changes: Changes,
) -> None:
    cluster = event.meta.cluster
    lease_key: LeaseKey = (cluster, event.apiserver_id)
    lease = state.leases.get(lease_key)
    if lease is None:
        _reject(
            changes,
            event,
            revision,
            f"apiserver {event.apiserver_id!r} holds no lease in cluster {cluster!r}"
            " (already released or expired); nothing to end",
        )
        return
    if isinstance(event, ApiserverLeaseReleased) and lease.holder_identity != event.holder_identity:
        _reject(
            changes,
            event,
            revision,
            f"release by {event.holder_identity!r} ignored: the lease of"
            f" {event.apiserver_id!r} is now held by {lease.holder_identity!r},"
            " a later start of the same apiserver",
        )
        return
    if isinstance(event, ApiserverLeaseExpired) and lease.renew_time > event.last_renew_time:
        _reject(
            changes,
            event,
            revision,
            f"stale expiry ignored: the lease of {event.apiserver_id!r} was renewed at"
            f" {lease.renew_time.isoformat()}, after the expiry's last renew time"
            f" {event.last_renew_time.isoformat()}",
        )
        return
    _delete(state.leases, lease_key, changes.leases)
    _discard(state.members_by_cluster, cluster, event.apiserver_id)
    # StorageVersion GC: the apiserver's entries go with its lease; and one member fewer
    # may complete the membership of a resource it never reported.
    _refresh_agreement(
        state, cluster, event.meta.occurred_at, revision, changes, leaving=event.apiserver_id
    )


def _refresh_agreement(
    state: State,
    cluster: str,
    now: datetime,
    revision: str,
    changes: Changes,
    leaving: str | None = None,
) -> None:
    """Recompute every StorageVersion of ``cluster`` after its membership changed,
    without the entries of ``leaving`` (an apiserver whose lease ended)."""
    for key in sorted(state.resources_by_cluster.get(cluster, ())):
        storage_version = state.storage_versions[key]
        entries = tuple(e for e in storage_version.entries if e.apiserver_id != leaving)
        _set_entries(state, key, entries, storage_version.kind, now, revision, changes)


def _reported(state: State, event: StorageVersionReported, revision: str, changes: Changes) -> None:
    cluster = event.meta.cluster
    try:
        _check_report(
            event.group,
            event.resource,
            event.kind,
            event.encoding_version,
            event.decodable_versions,
            event.served_versions,
            event.apiserver_id,
            event.storage_version_hash,
        )
    except InvalidReport as error:
        _reject(changes, event, revision, str(error))
        return
    if (cluster, event.apiserver_id) not in state.leases:
        _reject(
            changes,
            event,
            revision,
            f"apiserver {event.apiserver_id!r} holds no lease in cluster {cluster!r};"
            " it must send a heartbeat before reporting storage versions",
        )
        return
    key: ResourceKey = (cluster, event.group, event.resource)
    entry = ServerStorageVersion(
        apiserver_id=event.apiserver_id,
        encoding_version=event.encoding_version,
        decodable_versions=event.decodable_versions,
        served_versions=event.served_versions,
        source=event.source or "",
    )
    previous = state.storage_versions.get(key)
    others = () if previous is None else previous.entries
    if any(e.key == entry.key for e in others):
        entries = tuple(entry if e.key == entry.key else e for e in others)
    else:
        entries = (*others, entry)
    reported_hash = hash_of_report(event.encoding_version, event.kind, event.storage_version_hash)
    if event.storage_version_hash is not None and event.storage_version_hash != reported_hash:
        _reject(
            changes,
            event,
            revision,
            f"storage_version_hash {event.storage_version_hash!r} is not the hash"
            f" {reported_hash!r} of {event.encoding_version} {event.kind}; the kind or the"
            " encoding version is not what the apiserver stores",
        )
        return
    _set_entries(
        state, key, entries, event.kind, event.meta.occurred_at, revision, changes, reported_hash
    )


def _withdrawn(
    state: State, event: StorageVersionWithdrawn, revision: str, changes: Changes
) -> None:
    key: ResourceKey = (event.meta.cluster, event.group, event.resource)
    entry_key = (event.apiserver_id, event.source or "")
    storage_version = state.storage_versions.get(key)
    if storage_version is None or all(entry.key != entry_key for entry in storage_version.entries):
        read = f" read from {event.source}" if event.source else ""
        _reject(
            changes,
            event,
            revision,
            f"apiserver {event.apiserver_id!r} has no entry{read} in StorageVersion"
            f" {resource_name(event.group, event.resource)!r} of cluster"
            f" {event.meta.cluster!r}; nothing to withdraw",
        )
        return
    entries = tuple(e for e in storage_version.entries if e.key != entry_key)
    _set_entries(
        state, key, entries, storage_version.kind, event.meta.occurred_at, revision, changes
    )


def _set_entries(
    state: State,
    key: ResourceKey,
    entries: tuple[ServerStorageVersion, ...],
    kind: str,
    now: datetime,
    revision: str,
    changes: Changes,
    reported_hash: str | None = None,
) -> None:
    """Give a StorageVersion these entries (none: delete it), then refresh its StorageState.

    ``reported_hash`` is the hash of a version just reported, appended to the persisted
    hashes if absent: an apiserver may already have written objects in it.
    """
    previous = state.storage_versions.get(key)
    cluster = key[0]
    # The index first: whether an apiserver reports anything is part of the agreement.
    before = set() if previous is None else {e.apiserver_id for e in previous.entries}
    after = {e.apiserver_id for e in entries}
    silent = {a for a in before ^ after if (cluster, a) not in state.resources_by_apiserver}
    for apiserver_id in after - before:
        state.resources_by_apiserver.setdefault((cluster, apiserver_id), set()).add(key)
    for apiserver_id in before - after:
        _discard(state.resources_by_apiserver, (cluster, apiserver_id), key)
    silent ^= {a for a in before ^ after if (cluster, a) not in state.resources_by_apiserver}
    # Only members count: the end of a lease refreshes the cluster once, by itself.
    silent &= state.members_by_cluster.get(cluster, set())

    storage_version: StorageVersion | None = None
    if entries:
        common, condition = agreement(
            entries,
            None if previous is None else previous.common_encoding_version,
            None if previous is None else previous.condition,
            now,
            unreported(state, key, entries),
        )
        created_revision, created_at = _created(previous, revision, now)
        storage_version = StorageVersion(
            cluster=key[0],
            group=key[1],
            resource=key[2],
            kind=kind,
            entries=entries,
            common_encoding_version=common,
            condition=condition,
            revision=revision,
            created_revision=created_revision,
            created_at=created_at,
        )
        _store(state.storage_versions, key, storage_version, changes.storage_versions)
        state.resources_by_cluster.setdefault(key[0], set()).add(key)
    elif previous is not None:
        _delete(state.storage_versions, key, changes.storage_versions)
        _discard(state.resources_by_cluster, key[0], key)

    before = set() if previous is None else {e.apiserver_id for e in previous.entries}
    after = {e.apiserver_id for e in entries}
    storage_state = state.storage_states.get(key)
    persisted = (
        (UNKNOWN_HASH,) if storage_state is None else storage_state.persisted_storage_version_hashes
    )
    if reported_hash is not None and reported_hash not in persisted:
        persisted = (*persisted, reported_hash)
    current = None
    if storage_version is not None and storage_version.common_encoding_version is not None:
        current = hash_of_stored(storage_version.common_encoding_version, storage_version.kind)
    created_revision, created_at = _created(storage_state, revision, now)
    _store(
        state.storage_states,
        key,
        StorageState(
            cluster=key[0],
            group=key[1],
            resource=key[2],
            persisted_storage_version_hashes=persisted,
            current_storage_version_hash=current,
            revision=revision,
            created_revision=created_revision,
            created_at=created_at,
        ),
        changes.storage_states,
    )
    if silent:
        # An apiserver began or ceased to report anything: every StorageVersion of the
        # cluster may now be agreed on, or unknown (:func:`projections.agreement.unreported`).
        _refresh_agreement(state, cluster, now, revision, changes)


def _reset(state: State, event: StorageStateReset, revision: str, changes: Changes) -> None:
    key: ResourceKey = (event.meta.cluster, event.group, event.resource)
    storage_state = state.storage_states.get(key)
    if storage_state is None:
        _reject(
            changes,
            event,
            revision,
            f"no StorageState {storage_state_name(event.group, event.resource)!r} in cluster"
            f" {event.meta.cluster!r} to reset; check the group and resource names",
        )
        return
    # Stored even when the hashes are ["Unknown"] already: the reset cancels the
    # resource's migrations below, and the trigger names its migrations by the
    # StorageState's revision, so a revision left behind would have it take the
    # migration just cancelled for its decision on this state and request none.
    state.storage_states[key] = dataclasses.replace(
        storage_state, persisted_storage_version_hashes=(UNKNOWN_HASH,), revision=revision
    )
    changes.storage_states.add(key)
    name = resource_name(event.group, event.resource)
    for migration_key in sorted(state.active_migrations_by_resource.get(key, ())):
        cancelled = dataclasses.replace(
            state.migrations[migration_key],
            phase="Cancelled",
            reason=REASON_RESET,
            message=f"the StorageState of {name!r} was reset ({event.reason}): objects may be"
            " stored in any version again, so this migration no longer proves where they"
            " are; a new one is requested",
            updated_at=event.meta.occurred_at,
            revision=revision,
        )
        _store_migration(state, cancelled, changes)


def _migration_requested(
    state: State, event: MigrationRequested, revision: str, changes: Changes
) -> None:
    key = (event.meta.cluster, event.migration_id)
    if key in state.migrations:
        _reject(
            changes,
            event,
            revision,
            f"migration ID {event.migration_id!r} is already taken in cluster"
            f" {event.meta.cluster!r}; request a migration under a new ID",
        )
        return
    migration = Migration(
        cluster=event.meta.cluster,
        migration_id=event.migration_id,
        group=event.group,
        resource=event.resource,
        target_version=event.target_version,
        target_hash=event.target_hash,
        storage_version_revision=event.storage_version_revision,
        phase="Pending",
        objects_migrated=0,
        continue_token=None,
        reason=None,
        message=None,
        requested_at=event.meta.occurred_at,
        updated_at=event.meta.occurred_at,
        revision=revision,
        created_revision=revision,
        created_at=event.meta.occurred_at,
    )
    _store_migration(state, migration, changes)
    _drop_inactive(state, migration.resource_key, changes, keep=migration.retries)


def _migration_step(
    state: State, event: MigrationStatusEvent, revision: str, changes: Changes
) -> None:
    migration = state.migrations.get((event.meta.cluster, event.migration_id))
    if migration is None:
        _reject(
            changes,
            event,
            revision,
            f"no migration {event.migration_id!r} in cluster {event.meta.cluster!r};"
            " a migration must be requested before it can move",
        )
        return
    sources, phase = _STEPS[type(event)]
    if migration.phase not in sources:
        _reject(
            changes,
            event,
            revision,
            f"migration {event.migration_id!r} is {migration.phase}; {type_name(event)}"
            f" applies only to a migration that is {' or '.join(sorted(sources))}",
        )
        return
    # Every step says how far the migration is: a resumed attempt starts at its
    # predecessor's count and continue token, and fails or is cancelled where it was.
    fields: dict[str, Any] = {
        "phase": phase,
        "objects_migrated": event.objects_migrated,
        "continue_token": event.continue_token,
        "updated_at": event.meta.occurred_at,
        "revision": revision,
    }
    match event:
        case MigrationStarted() | MigrationFailed() | MigrationCancelled():
            fields.update(reason=event.reason, message=event.message)
        case MigrationSucceeded():
            fields.update(continue_token=None, reason=event.reason, message=event.message)
            _refine_persisted_hashes(state, migration, event, revision, changes)
    moved = dataclasses.replace(migration, **fields)  # one copy: it is the costly part
    _store_migration(state, moved, changes)
    if not moved.active and moved.resource_key in state.custom_resources:
        _judge_prunes(state, moved, revision, changes)


def stale_reason(state: State, migration: Migration) -> str | None:
    """Why work done for ``migration`` would no longer count in ``state``, or None.

    A migration is valid for the StorageVersion revision it was requested at, and only
    while the common encoding version still hashes to its target: after any other
    change an apiserver may have written objects in another version meanwhile.
    """
    key = migration.resource_key
    name = resource_name(migration.group, migration.resource)
    storage_version = state.storage_versions.get(key)
    storage_state = state.storage_states.get(key)
    if storage_version is None or storage_state is None:
        return f"StorageVersion {name!r} no longer exists (no apiserver reports it)"
    if storage_version.revision != migration.storage_version_revision:
        return (
            f"StorageVersion {name!r} changed at revision {storage_version.revision} after"
            f" the migration was requested for revision {migration.storage_version_revision}"
        )
    if storage_state.current_storage_version_hash != migration.target_hash:
        return (
            f"the common encoding version of {name!r} is"
            f" {storage_version.common_encoding_version!r}, not the migration's target"
            f" {migration.target_version!r} (hash {migration.target_hash!r})"
        )
    return None


def _refine_persisted_hashes(
    state: State,
    migration: Migration,
    event: MigrationSucceeded,
    revision: str,
    changes: Changes,
) -> None:
    """After a fresh success every stored object is in the target version: persisted = [it]."""
    stale = stale_reason(state, migration)
    if stale is None:
        key = migration.resource_key
        refined = dataclasses.replace(
            state.storage_states[key],
            persisted_storage_version_hashes=(migration.target_hash,),
            revision=revision,
        )
        _store(state.storage_states, key, refined, changes.storage_states)
        _drop_inactive(state, key, changes)  # nothing left to resume or to back off from
        return
    _reject(
        changes,
        event,
        revision,
        f"{STALE_SUCCESS} of migration {migration.migration_id!r}: {stale}; objects may have"
        " been written in another version meanwhile, so the persisted hashes are kept",
    )


def _store_migration(state: State, migration: Migration, changes: Changes) -> None:
    _store(state.migrations, migration.key, migration, changes.migrations)
    into, out_of = (
        (state.active_migrations_by_resource, state.inactive_migrations_by_resource)
        if migration.active
        else (state.inactive_migrations_by_resource, state.active_migrations_by_resource)
    )
    _discard(out_of, migration.resource_key, migration.key)  # a Failed one resumes
    into.setdefault(migration.resource_key, set()).add(migration.key)


def _drop_inactive(
    state: State,
    resource_key: ResourceKey,
    changes: Changes,
    keep: Callable[[Migration], bool] = lambda migration: False,
) -> None:
    """Drop the resource's migrations that are neither Pending nor Running, but ``keep``'s."""
    for key in list(state.inactive_migrations_by_resource.get(resource_key, ())):
        if not keep(state.migrations[key]):
            _discard(state.inactive_migrations_by_resource, resource_key, key)
            _delete(state.migrations, key, changes.migrations)


def _store(rows: dict[_Key, _Row], key: _Key, row: _Row, touched: set[_Key]) -> None:
    """Put ``row`` under ``key`` unless only its revision would differ from the row there."""
    previous = rows.get(key)
    if previous is not None:
        content = _CONTENT[type(row)]
        if content(previous) == content(row):
            return
    rows[key] = row
    touched.add(key)


def _delete(rows: dict[_Key, _Row], key: _Key, touched: set[_Key]) -> None:
    del rows[key]
    touched.add(key)


_Member = TypeVar("_Member")


def _discard(index: dict[_Key, set[_Member]], key: _Key, member: _Member) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


def _reject(changes: Changes, event: Event, revision: str, reason: str) -> None:
    changes.rejections.append(
        Rejection(
            cluster=event.meta.cluster,
            revision=revision,
            event_id=event.meta.event_id,
            event_type=type_name(event),
            subject=subject(event),
            reason=reason,
        )
    )


def _crd_observed(
    state: State, event: CustomResourceDefinitionObserved, revision: str, changes: Changes
) -> None:
    """Keep the CustomResourceDefinition's state; judge each version it dropped from
    ``storedVersions`` (the in-tree migrator's prune, or anyone's) against the ledger."""
    key: ResourceKey = (event.meta.cluster, event.group, event.resource)
    previous = state.custom_resources.get(key)
    if event.deleted:
        if previous is None:
            _reject(
                changes,
                event,
                revision,
                f"no CustomResourceDefinition {event.name!r} in cluster {event.meta.cluster!r}"
                " to delete",
            )
            return
        _delete(state.custom_resources, key, changes.custom_resources)
        return
    # A CustomResourceDefinition deleted and created again (another uid) starts afresh.
    same = previous is not None and previous.uid == event.uid
    row = CustomResourceDefinition(
        cluster=event.meta.cluster,
        group=event.group,
        resource=event.resource,
        kind=event.kind,
        name=event.name,
        uid=event.uid,
        generation=event.generation,
        resource_version=event.resource_version,
        versions=event.versions,
        served_versions=event.served_versions,
        storage_version=event.storage_version,
        stored_versions=event.stored_versions,
        storage_migrating_status=event.storage_migrating_status,
        storage_migrating_reason=event.storage_migrating_reason,
        storage_migrating_message=event.storage_migrating_message,
        storage_migrating_observed_generation=event.storage_migrating_observed_generation,
        revision=revision,
    )
    if previous is not None and same:
        row = dataclasses.replace(
            row,
            prune_outcome=previous.prune_outcome,
            prune_message=previous.prune_message,
            prune_revision=previous.prune_revision,
            pending_prune=previous.pending_prune,
            prune_alarm=previous.prune_alarm,
        )
        unproven = tuple(
            version
            for version in dropped(previous.stored_versions, event.stored_versions)
            if not verdict(state, previous, version).removable
        )
        if unproven:
            target = f"{event.group}/{event.storage_version}"
            if any(
                state.migrations[k].target_version == target
                for k in state.active_migrations_by_resource.get(key, ())
            ):
                # The in-tree migrator prunes as its migration ends, before svledger's
                # worker has seen the end: judged once the migration's end is folded.
                row = dataclasses.replace(
                    row, pending_prune=tuple(dict.fromkeys(row.pending_prune + unproven))
                )
            else:
                row = dataclasses.replace(
                    row, prune_alarm=_alarm(state, previous, unproven, revision)
                )
    _store(state.custom_resources, key, row, changes.custom_resources)


def _alarm(
    state: State, crd: CustomResourceDefinition, versions: tuple[str, ...], revision: str
) -> str:
    """The words of a prune the ledger does not back: ``versions`` left ``storedVersions``
    of ``crd`` at ``revision`` while objects may still be stored in them."""
    return "; ".join(
        f"{version} left status.storedVersions at {revision} but {verdict(state, crd, version).why}"
        for version in versions
    )


def _judge_prunes(state: State, migration: Migration, revision: str, changes: Changes) -> None:
    """At the end of ``migration``: judge the versions that left ``storedVersions`` while it
    ran; after a fresh success, lift the alarm (every object is in the target now)."""
    key = migration.resource_key
    crd = state.custom_resources[key]
    alarm = crd.prune_alarm
    storage_state = state.storage_states.get(key)
    fresh = (
        migration.phase == "Succeeded"
        and storage_state is not None
        and storage_state.revision == revision
        and storage_state.persisted_storage_version_hashes == (migration.target_hash,)
    )
    if fresh:
        alarm = None
    unproven = tuple(v for v in crd.pending_prune if not verdict(state, crd, v).removable)
    if unproven:
        judged = _alarm(state, crd, unproven, crd.revision)
        ended = f"migration {migration.migration_id} ended {migration.phase} at {revision}"
        alarm = f"{judged} ({ended})" if alarm is None else f"{alarm}; {judged} ({ended})"
    if crd.pending_prune or alarm != crd.prune_alarm:
        judged_row = dataclasses.replace(
            crd, pending_prune=(), prune_alarm=alarm, revision=revision
        )
        _store(state.custom_resources, key, judged_row, changes.custom_resources)


def _prune_recorded(
    state: State,
    event: StoredVersionsPruned | StoredVersionsPruneRefused,
    revision: str,
    changes: Changes,
) -> None:
    key: ResourceKey = (event.meta.cluster, event.group, event.resource)
    crd = state.custom_resources.get(key)
    if crd is None:
        _reject(
            changes,
            event,
            revision,
            f"no CustomResourceDefinition {event.name!r} in cluster {event.meta.cluster!r};"
            " the collector records it before its storedVersions can be pruned",
        )
        return
    if isinstance(event, StoredVersionsPruned):
        outcome = "Pruned"
        removed = dropped(event.stored_versions_before, event.stored_versions_after)
        message = (
            f"removed {', '.join(removed)}"
            f" from status.storedVersions after migration {event.migration_id} (generation"
            f" {event.generation}, resourceVersion {event.resource_version})"
        )
    else:
        outcome, message = event.reason, event.message
    recorded = dataclasses.replace(
        crd,
        prune_outcome=outcome,
        prune_message=message,
        prune_revision=revision,
        revision=revision,
    )
    _store(state.custom_resources, key, recorded, changes.custom_resources)


def _audited(state: State, event: StorageAudited, revision: str, changes: Changes) -> None:
    """Keep the resource's last audit; the auditor judged it against the ledger already."""
    audit = StorageAudit(
        cluster=event.meta.cluster,
        group=event.group,
        resource=event.resource,
        audit_id=event.audit_id,
        etcd_revision=event.etcd_revision,
        ledger_offset=event.ledger_offset,
        objects=event.objects,
        total_bytes=event.total_bytes,
        versions=event.versions,
        version_hashes=event.version_hashes,
        version_counts=event.version_counts,
        encryption_keys=event.encryption_keys,
        encryption_counts=event.encryption_counts,
        undecodable=event.undecodable,
        undecodable_keys=event.undecodable_keys,
        polluted_versions=event.polluted_versions,
        pollution=event.pollution,
        audited_at=event.meta.occurred_at,
        revision=revision,
    )
    _store(state.audits, audit.key, audit, changes.audits)
