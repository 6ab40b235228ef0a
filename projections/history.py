"""What happened to one resource, and why it is as it is: ``svledger history`` and ``explain``.

Both read the projection database only. ``ledger_events`` holds every folded event
with its log position (plain lease renewals, which change no resource, are only
counted, in ``lease_renewals``), so a resource's story is a query away:

* the events about the resource itself (reports, withdrawals, resets), by subject;
* the events of its migrations, by migration ID;
* the lease events that moved its StorageVersion while it had one: a member joining
  (its first heartbeat: agreement is unknown until it reports) and a lease ending (it
  drops that apiserver's entries from every StorageVersion, and one member fewer may
  complete the membership of a resource it never reported). Their subject is the
  apiserver, not the resource. Which of them moved the resource is decided by walking
  the resource's applied events and the cluster's lease events in log order
  (:func:`with_membership`), not guessed from apiserver names alone.

The SQL (:func:`history`, :func:`gather`) is kept apart from the words
(:func:`format_history`, :func:`explanation`) and from name resolution
(:func:`resolve`): those are pure and are tested without a database.

A resource is named as the user knows it: ``<group>.<resource>`` (the
StorageVersion's name, ``core.pods`` for the core group), ``<resource>.<group>`` (the
StorageState's name) or the bare ``<resource>`` of the core group. A name that fits
several known resources, or one resource in several clusters without ``--cluster``,
is an error listing the candidates.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, select, union

from ledger.errors import UsageError
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    CustomResourceDefinitionObserved,
    MigrationRequested,
    MigrationStatusEvent,
    MigrationSucceeded,
    Position,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
)
from ledger.hashing import UNNAMED_VERSION, hash_of_report, hash_of_stored
from ledger.names import resource_name, storage_state_name
from projections.agreement import agreement, transitions
from projections.audits import removable_keys
from projections.crds import VersionVerdict, stored_version_verdicts
from projections.fold import STALE_SUCCESS
from projections.schema import (
    custom_resource_definitions,
    ledger_events,
    rejected_events,
    storage_states,
    storage_version_migrations,
    storage_versions,
)
from projections.state import (
    UNKNOWN_HASH,
    CustomResourceDefinition,
    Migration,
    ResourceKey,
    ServerStorageVersion,
    StorageAudit,
    StorageState,
    StorageVersion,
)
from projections.store import history_starts, load_state

HEARTBEAT: Final = ApiserverHeartbeat.__name__
REPORTED: Final = StorageVersionReported.__name__
WITHDRAWN: Final = StorageVersionWithdrawn.__name__
RESET: Final = StorageStateReset.__name__
RELEASED: Final = ApiserverLeaseReleased.__name__
EXPIRED: Final = ApiserverLeaseExpired.__name__
REQUESTED: Final = MigrationRequested.__name__
SUCCEEDED: Final = MigrationSucceeded.__name__
OBSERVED: Final = CustomResourceDefinitionObserved.__name__
PRUNED: Final = StoredVersionsPruned.__name__
PRUNE_REFUSED: Final = StoredVersionsPruneRefused.__name__
_RESOURCE_EVENTS: Final = (REPORTED, WITHDRAWN, RESET, OBSERVED, PRUNED, PRUNE_REFUSED)
_LEASE_ENDS: Final = (RELEASED, EXPIRED)
_MIGRATION_EVENTS: Final = (
    REQUESTED,
    *(cls.__name__ for cls in typing.get_args(MigrationStatusEvent)),
)


class ResourceNameError(UsageError):
    """A resource name that names no known resource, or more than one."""


@dataclasses.dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One event of a resource's history, as ``ledger_events`` holds it."""

    position: Position
    cluster: str
    event_type: str
    subject: str
    occurred_at: datetime
    source: str
    payload: Mapping[str, Any]
    rejection: str | None  # why the fold did not apply it; None when applied

    @property
    def applied(self) -> bool:
        return self.rejection is None

    @property
    def applied_in_part(self) -> bool:
        """A stale success: it moved its migration to Succeeded, but the fold kept the
        persisted hashes (recorded as a rejection, with why)."""
        return self.rejection is not None and self.rejection.startswith(STALE_SUCCESS)

    @property
    def outcome(self) -> str:
        """What the fold did with it, unless it applied it whole: '' then."""
        if self.applied:
            return ""
        return f"{'applied in part' if self.applied_in_part else 'rejected'}: {self.rejection}"


@dataclasses.dataclass(frozen=True, slots=True)
class Facts:
    """Everything :func:`explanation` puts into words about one resource."""

    key: ResourceKey
    storage_version: StorageVersion | None
    storage_state: StorageState | None
    migrations: tuple[Migration, ...]  # of this resource, oldest request first
    history: tuple[HistoryEntry, ...]
    # The StorageVersion as the history begins, where it begins at a fold snapshot (a
    # replay started from one); None where it begins with the log, or had none then.
    start: StorageVersion | None = None
    # The cluster's applied joins and lease ends, in log order, all of them (``history``
    # holds those that moved the resource), and its members as the history begins.
    membership: tuple[HistoryEntry, ...] = ()
    members_at_start: frozenset[str] = frozenset()
    # A custom resource's CustomResourceDefinition, and what can leave its storedVersions.
    crd: CustomResourceDefinition | None = None
    verdicts: tuple[VersionVerdict, ...] = ()
    audit: StorageAudit | None = None  # the resource's last audit of the store


# ---------------------------------------------------------------- resolution


def resolve(
    name: str,
    cluster: str | None,
    known: Iterable[ResourceKey],
    *,
    source: str = "the projection",
    advice: str = "check the cluster and that the projector has caught up",
) -> ResourceKey:
    """The one known resource ``name`` (and ``cluster``, if given) designates.

    ``source`` says where ``known`` comes from and ``advice`` what to do when nothing
    there fits, for the error message.
    """
    candidates = sorted(
        {
            key
            for key in known
            if (cluster is None or key[0] == cluster)
            and name in (resource_name(key[1], key[2]), storage_state_name(key[1], key[2]))
        }
    )
    where = "" if cluster is None else f" in cluster {cluster!r}"
    if not candidates:
        raise ResourceNameError(
            f"no resource {name!r}{where} in {source}; name it as <group>.<resource>"
            " (core.<resource> for the core group), <resource>.<group> or <resource>, and"
            f" {advice}"
        )
    if len(candidates) > 1:
        listed = ", ".join(
            f"{resource_name(group, resource)} in cluster {c!r}"
            for c, group, resource in candidates
        )
        advice = (
            "pass --cluster NAME"
            if len({group_resource[1:] for group_resource in candidates}) == 1
            else "name it as <group>.<resource>"
        )
        raise ResourceNameError(f"{name!r}{where} is ambiguous: {listed}; {advice}")
    return candidates[0]


def known_resources(connection: Connection) -> set[ResourceKey]:
    """Every resource the views know of, current or past (StorageStates are never deleted)."""
    query = union(
        *(
            select(table.c.cluster, table.c.api_group, table.c.resource)
            for table in (
                storage_versions,
                storage_states,
                storage_version_migrations,
                custom_resource_definitions,
            )
        )
    )
    return {(cluster, group, resource) for cluster, group, resource in connection.execute(query)}


# ------------------------------------------------------------------- history


def history(
    connection: Connection, resource: str, cluster: str | None = None
) -> list[HistoryEntry]:
    """The events that touched ``resource``, in log order (see the module docstring)."""
    key = resolve(resource, cluster, known_resources(connection))
    start, members = _start(connection, key)
    return _history(connection, key, start, members)[0]


def _start(
    connection: Connection, key: ResourceKey
) -> tuple[StorageVersion | None, frozenset[str]]:
    """``key``'s StorageVersion and its cluster's members (apiservers with a lease) in the
    fold snapshot its history begins at, if any: only its cluster's partition's snapshot
    is read (a cluster's events are in one)."""
    events = ledger_events.c
    partition = connection.scalar(
        select(events.log_partition).where(events.cluster == key[0]).limit(1)
    )
    if partition is None:
        return None, frozenset()
    for rows in history_starts(connection, partition):
        members = frozenset(lease.apiserver_id for lease in rows[0] if lease.cluster == key[0])
        found = (storage_version for storage_version in rows[1] if storage_version.key == key)
        return next(found, None), members
    return None, frozenset()


def _history(
    connection: Connection,
    key: ResourceKey,
    start: StorageVersion | None,
    members: frozenset[str],
) -> tuple[list[HistoryEntry], list[HistoryEntry]]:
    """The resource's history, and its cluster's applied joins and lease ends."""
    cluster, group, resource = key
    own = _entries(
        connection,
        cluster,
        _RESOURCE_EVENTS,
        [resource_name(group, resource)],
    )
    # The migrations in the view and those requested in the log: a new request drops
    # ended migrations from the view, and a replay from a snapshot begins its log there.
    payload = ledger_events.c.payload
    table = storage_version_migrations
    migration_ids = sorted(
        set(
            connection.scalars(
                select(ledger_events.c.subject).where(
                    ledger_events.c.cluster == cluster,
                    ledger_events.c.event_type == REQUESTED,
                    payload["group"].as_string() == group,
                    payload["resource"].as_string() == resource,
                )
            )
        )
        | set(
            connection.scalars(
                select(table.c.migration_id).where(
                    table.c.cluster == cluster,
                    table.c.api_group == group,
                    table.c.resource == resource,
                )
            )
        )
    )
    migrations = _entries(connection, cluster, _MIGRATION_EVENTS, migration_ids)
    holders = () if start is None else tuple(entry.key for entry in start.entries)
    lease_events = [
        entry
        for entry in _cluster_entries(connection, cluster, (HEARTBEAT, *_LEASE_ENDS))
        if entry.applied
    ]
    kept, membership = with_membership(own, lease_events, holders, members)
    return sorted([*kept, *migrations], key=lambda entry: entry.position), membership


def with_membership(
    resource_events: Iterable[HistoryEntry],
    lease_events: Iterable[HistoryEntry],
    holders_at_start: Iterable[tuple[str, str]] = (),
    members_at_start: Iterable[str] = (),
) -> tuple[list[HistoryEntry], list[HistoryEntry]]:
    """A resource's own events plus the lease events that moved its StorageVersion, and
    the cluster's joins and lease ends (every applied one, in log order).

    Walks both in log order, tracking the cluster's members (from ``members_at_start``:
    a heartbeat of an apiserver that holds no lease adds one, an applied lease end
    removes it) and the resource's entries by (apiserver, source) (from
    ``holders_at_start``, those of a history that begins at a fold snapshot: an applied
    report adds one, an applied withdrawal removes its source's, a lease end all of its
    apiserver's). A join or a lease end is kept while the resource has an entry: it
    moved the resource's agreement (:func:`projections.agreement.agreement`).
    """
    holders = set(holders_at_start)
    members = set(members_at_start)
    kept: list[HistoryEntry] = []
    membership: list[HistoryEntry] = []
    for entry in sorted([*resource_events, *lease_events], key=lambda e: e.position):
        apiserver: str = entry.payload.get("apiserver_id", "")
        source: str = entry.payload.get("source") or ""
        if entry.event_type in (HEARTBEAT, *_LEASE_ENDS):
            joins = entry.event_type == HEARTBEAT
            if entry.applied and (apiserver in members) != joins:
                (members.add if joins else members.discard)(apiserver)
                membership.append(entry)
                if holders:
                    kept.append(entry)
                holders = {held for held in holders if joins or held[0] != apiserver}
            continue
        if entry.applied and entry.event_type == REPORTED:
            holders.add((apiserver, source))
        elif entry.applied and entry.event_type == WITHDRAWN:
            holders.discard((apiserver, source))
        kept.append(entry)
    return kept, membership


def _cluster_entries(
    connection: Connection, cluster: str, event_types: Sequence[str]
) -> list[HistoryEntry]:
    """Every event of ``event_types`` in ``cluster``, whatever its subject."""
    return _entries(connection, cluster, event_types, None)


def _entries(
    connection: Connection,
    cluster: str,
    event_types: Sequence[str],
    subjects: Sequence[str] | None,
) -> list[HistoryEntry]:
    """The events of ``event_types`` about ``subjects`` (None: any) in ``cluster``."""
    if subjects is not None and not subjects:
        return []
    events, rejected = ledger_events, rejected_events
    query = (
        select(
            events.c.log_partition,
            events.c.log_offset,
            events.c.cluster,
            events.c.event_type,
            events.c.subject,
            events.c.occurred_at,
            events.c.source,
            events.c.payload,
            rejected.c.reason,
        )
        .outerjoin(
            rejected,
            (rejected.c.topic == events.c.topic)
            & (rejected.c.log_partition == events.c.log_partition)
            & (rejected.c.log_offset == events.c.log_offset),
        )
        .where(events.c.cluster == cluster, events.c.event_type.in_(event_types))
    )
    if subjects is not None:
        query = query.where(events.c.subject.in_(subjects))
    return [
        HistoryEntry(
            position=Position(row.log_partition, row.log_offset),
            cluster=row.cluster,
            event_type=row.event_type,
            subject=row.subject,
            occurred_at=row.occurred_at,
            source=row.source,
            payload=row.payload,
            rejection=row.reason,
        )
        for row in connection.execute(query)
    ]


def format_history(entries: Sequence[HistoryEntry]) -> str:
    """A table of ``entries``, one line each: position, time, event, source, what it did."""
    header = ("POSITION", "TIME", "EVENT", "SOURCE", "WHAT")
    rows = [
        (
            str(entry.position),
            entry.occurred_at.isoformat(timespec="seconds"),
            entry.event_type,
            entry.source,
            describe(entry) + (f" -- {entry.outcome}" if entry.outcome else ""),
        )
        for entry in entries
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
        for row in [header, *rows]
    )


def describe(entry: HistoryEntry) -> str:
    """What one event says, in a few words."""
    p = entry.payload
    event_type = entry.event_type
    if event_type == REPORTED:
        read = f", read from {p['source']}" if p.get("source") else ""
        if p["encoding_version"] == UNNAMED_VERSION:
            return (
                f"{p['apiserver_id']} stores it with storageVersionHash"
                f" {p['storage_version_hash']}, the hash of no version anyone serves or"
                f" upstream names{read}"
            )
        return (
            f"{p['apiserver_id']} encodes in {p['encoding_version']}"
            f" (decodes {', '.join(p['decodable_versions'])}{read})"
        )
    if event_type == WITHDRAWN:
        read = f" read from {p['source']}" if p.get("source") else ""
        why = f": {p['reason']}" if p.get("reason") else ""
        return f"{p['apiserver_id']}'s entry{read} withdrawn{why}"
    if event_type == HEARTBEAT:
        return (
            f"{p['apiserver_id']} joined (holder {p['holder_identity']}): agreement is unknown"
            " until it reports"
        )
    if event_type == RESET:
        return f"persisted hashes reset to [{UNKNOWN_HASH}]: {p['reason']}"
    if event_type == OBSERVED:
        if p["deleted"]:
            return f"CustomResourceDefinition {p['name']} deleted"
        migrating = (
            f"; StorageMigrating={p['storage_migrating_status']}"
            f" ({p['storage_migrating_reason']}, generation"
            f" {p['storage_migrating_observed_generation']})"
            if p.get("storage_migrating_status")
            else ""
        )
        return (
            f"CustomResourceDefinition {p['name']} generation {p['generation']}: storage"
            f" version {p['storage_version']}, storedVersions"
            f" [{', '.join(p['stored_versions'])}]{migrating}"
        )
    if event_type == PRUNED:
        return (
            f"storedVersions of {p['name']} set to [{', '.join(p['stored_versions_after'])}]"
            f" (was [{', '.join(p['stored_versions_before'])}]) after migration"
            f" {p['migration_id']}"
        )
    if event_type == PRUNE_REFUSED:
        return (
            f"storedVersions of {p['name']} left as [{', '.join(p['stored_versions'])}] after"
            f" migration {p['migration_id']}: {p['reason']}: {p['message']}"
        )
    if event_type == RELEASED:
        return f"{p['apiserver_id']} released its lease, dropping its entries"
    if event_type == EXPIRED:
        return (
            f"lease of {p['apiserver_id']} expired (last renewed {p['last_renew_time']}),"
            " dropping its entries"
        )
    if event_type == REQUESTED:
        return (
            f"migration {p['migration_id']} to {p['target_version']} (hash"
            f" {p['target_hash']}) for StorageVersion revision {p['storage_version_revision']}"
        )
    details = [f"{p['objects_migrated']} objects migrated"]
    details += [str(p[name]) for name in ("reason", "message") if p.get(name)]
    return f"migration {p['migration_id']}: {'; '.join(details)}"


# ------------------------------------------------------------------- explain


def explain(connection: Connection, resource: str, cluster: str | None = None) -> str:
    """Why ``resource`` is in its current state, in plain words citing log positions."""
    return explanation(gather(connection, resolve(resource, cluster, known_resources(connection))))


def gather(connection: Connection, key: ResourceKey) -> Facts:
    state = load_state(connection, key)
    start, members = _start(connection, key)
    history, membership = _history(connection, key, start, members)
    return Facts(
        key=key,
        storage_version=state.storage_versions.get(key),
        storage_state=state.storage_states.get(key),
        migrations=in_request_order(state.migrations.values(), history),
        history=tuple(history),
        start=start,
        membership=tuple(membership),
        members_at_start=members,
        crd=state.custom_resources.get(key),
        verdicts=stored_version_verdicts(state, key),
        audit=state.audits.get(key),
    )


def in_request_order(
    migrations: Iterable[Migration], history: Sequence[HistoryEntry]
) -> tuple[Migration, ...]:
    """``migrations`` in the log order of their requests, the latest last.

    Not by request time alone: the migrator often requests, cancels and requests again
    within one event time (the storage version changed again under the request), and
    the latest of those is the one the log put last.
    """
    requested = {
        entry.payload["migration_id"]: entry.position
        for entry in history
        if entry.event_type == REQUESTED
    }
    return tuple(
        sorted(
            migrations,
            key=lambda m: (m.requested_at, requested.get(m.migration_id, Position(-1, -1))),
        )
    )


def explanation(facts: Facts) -> str:
    """The words of ``svledger explain``: agreement, removals, persisted hashes, migration."""
    cluster, group, resource = facts.key
    lines = [
        f"{resource_name(group, resource)} (StorageState {storage_state_name(group, resource)})"
        f" in cluster {cluster!r}",
        "",
        *_agreement_lines(facts),
        *_removal_lines(facts),
        "",
        *_hash_lines(facts),
        "",
        *_migration_lines(facts),
        *_crd_lines(facts),
        *_audit_lines(facts),
    ]
    return "\n".join(lines)


def _cite(entry: HistoryEntry | None) -> str:
    if entry is None:
        return (
            "(no event in this database's history accounts for it; a replay started from"
            " fold snapshots has no history before them)"
        )
    when = entry.occurred_at.isoformat(timespec="seconds")
    return f"{entry.event_type} at {entry.position} ({when})"


def _applied(facts: Facts, *event_types: str) -> list[HistoryEntry]:
    return [e for e in facts.history if e.applied and e.event_type in event_types]


def _agreement_lines(facts: Facts) -> list[str]:
    storage_version = facts.storage_version
    if storage_version is None:
        return [
            "No apiserver reports this resource now, so it has no StorageVersion"
            " (the last entry was removed; see below)."
        ]
    reports = _applied(facts, REPORTED)
    count = len(storage_version.entries)
    lines = [
        f"StorageVersion {storage_version.name} (revision {storage_version.revision}) has"
        f" {count} entr{'y' if count == 1 else 'ies'}:"
    ]
    for entry in storage_version.entries:
        report = next(
            (
                r
                for r in reversed(reports)
                if (r.payload["apiserver_id"], r.payload.get("source") or "") == entry.key
            ),
            None,
        )
        read = f" (read from {entry.source})" if entry.source else ""
        encodes = _version_words(entry.encoding_version)
        lines.append(
            f"  - {entry.apiserver_id}{read} encodes in {encodes}, decodes"
            f" {', '.join(entry.decodable_versions)}; last reported by {_cite(report)}"
        )
    condition = storage_version.condition
    since = (
        f"condition {condition.type}={condition.status} ({condition.reason}) since"
        f" {condition.last_transition_time.isoformat(timespec='seconds')}, set by"
        f" {_cite(transition_cause(facts))}."
    )
    common = storage_version.common_encoding_version
    if common is not None:
        lines.append(f"They agree: the common encoding version is {common}; {since}")
    elif condition.status == "Unknown":
        lines.append(
            "Agreement is unknown: an apiserver holding a live lease has said nothing about"
            " this resource, so it may write any version; no migration starts or goes on"
            f" until it reports or its lease ends; {since}"
        )
        lines += _unreported_lines(facts)
    else:
        by_version: dict[str, list[str]] = {}
        for entry in storage_version.entries:
            by_version.setdefault(entry.encoding_version, []).append(entry.apiserver_id)
        split = "; ".join(
            f"{version or 'an unnamed version'} by {', '.join(ids)}"
            for version, ids in sorted(by_version.items())
        )
        lines.append(f"They disagree ({split}): there is no common encoding version; {since}")
    return lines


def _version_words(version: str) -> str:
    """A reported encoding version in words: an unnamed one says why it has no name."""
    if version == UNNAMED_VERSION:
        return "an unnamed version (its discovery hash is that of no version served or known)"
    return version


def _unreported_lines(facts: Facts) -> list[str]:
    """Why each member without an entry has none: when it joined, and the withdrawal
    (with its reason) that took its last entry, if one did."""
    storage_version = facts.storage_version
    assert storage_version is not None
    members: dict[str, HistoryEntry | None] = dict.fromkeys(facts.members_at_start)
    for entry in facts.membership:
        apiserver = entry.payload["apiserver_id"]
        if entry.event_type == HEARTBEAT:
            members[apiserver] = entry
        else:
            members.pop(apiserver, None)
    reporting = {entry.apiserver_id for entry in storage_version.entries}
    lines = []
    for apiserver, joined in sorted(members.items()):
        if apiserver in reporting:
            continue
        withdrawn = next(
            (
                e
                for e in reversed(_applied(facts, WITHDRAWN))
                if e.payload["apiserver_id"] == apiserver
            ),
            None,
        )
        peer = None if joined is None else joined.payload.get("peer_advertise_address")
        address = f"its lease names peer address {peer}" if peer else "its lease names no address"
        line = f"  - {apiserver} joined at {_cite(joined)} ({address}) and has no entry"
        if withdrawn is not None:
            reason = withdrawn.payload.get("reason")
            line += f"; its last was withdrawn at {_cite(withdrawn)}" + (
                f": {reason}" if reason else ""
            )
        lines.append(line)
    return lines


def transition_cause(facts: Facts) -> HistoryEntry | None:
    """The event whose fold last moved the condition: found by folding agreement along
    the history, as the fold does (:func:`projections.agreement.transitions`), not by the
    transition's time, which several events may share."""
    start = facts.start
    encodings = {} if start is None else {e.key: e.encoding_version for e in start.entries}
    members = set(facts.members_at_start)
    common = None if start is None else start.common_encoding_version
    condition = None if start is None else start.condition
    cause = None
    walk = sorted(
        [*_applied(facts, REPORTED, WITHDRAWN), *facts.membership], key=lambda e: e.position
    )
    for entry in walk:
        apiserver = entry.payload["apiserver_id"]
        source = entry.payload.get("source") or ""
        if entry.event_type == REPORTED:
            encodings[apiserver, source] = entry.payload["encoding_version"]
        elif entry.event_type == WITHDRAWN:
            encodings.pop((apiserver, source), None)
        elif entry.event_type == HEARTBEAT:
            members.add(apiserver)
        else:
            members.discard(apiserver)
            encodings = {key: v for key, v in encodings.items() if key[0] != apiserver}
        if not encodings:  # no StorageVersion: deleted with its last entry, or none yet
            common = condition = None
            continue
        previous_common, previous = common, condition
        entries = [ServerStorageVersion(a, v, (), (), src) for (a, src), v in encodings.items()]
        unreported = members - {a for a, _ in encodings}
        common, condition = agreement(entries, common, condition, entry.occurred_at, unreported)
        if transitions(previous_common, previous, common, condition.status):
            cause = entry
    return cause


def _removal_lines(facts: Facts) -> list[str]:
    removals = _applied(facts, WITHDRAWN, *_LEASE_ENDS)
    if not removals:
        return []
    lines = ["Entries removed:"]
    for entry in removals:
        apiserver = entry.payload["apiserver_id"]
        how = {
            WITHDRAWN: "withdrew its entry",
            RELEASED: "released its lease on shutdown",
            EXPIRED: f"stopped renewing its lease; {entry.source} expired it",
        }[entry.event_type]
        lines.append(f"  - {apiserver} {how}: {_cite(entry)}")
    return lines


def hash_origins(facts: Facts) -> dict[str, HistoryEntry]:
    """For each persisted hash, the applied event that last put it in the list.

    Follows DESIGN.md's rules for the list: the first report creates it as
    ``[Unknown]``, every report appends its version's hash if absent, a reset sets
    it to ``[Unknown]`` and a fresh migration success to ``[target hash]``.
    """
    targets: dict[str, str] = {}  # from the requests: a new one drops ended migrations' rows
    origins: dict[str, HistoryEntry] = {}
    for entry in _applied(facts, REPORTED, RESET, REQUESTED, SUCCEEDED):
        p = entry.payload
        if entry.event_type == REQUESTED:
            targets[p["migration_id"]] = p["target_hash"]
        elif entry.event_type == REPORTED:
            origins.setdefault(UNKNOWN_HASH, entry)
            found = hash_of_report(p["encoding_version"], p["kind"], p.get("storage_version_hash"))
            origins.setdefault(found, entry)
        elif entry.event_type == RESET:
            origins = {UNKNOWN_HASH: entry}
        elif p["migration_id"] in targets:
            origins = {targets[p["migration_id"]]: entry}
    return origins


def _hash_lines(facts: Facts) -> list[str]:
    storage_state = facts.storage_state
    if storage_state is None:
        return ["No StorageState: no report of this resource was ever applied."]
    origins = hash_origins(facts)
    lines = [
        f"StorageState {storage_state.name} (revision {storage_state.revision}): objects may be"
        f" stored with hashes [{', '.join(storage_state.persisted_storage_version_hashes)}]:"
    ]
    for persisted in storage_state.persisted_storage_version_hashes:
        origin = origins.get(persisted)
        if origin is None:
            why = _cite(None)
        elif origin.event_type == RESET:
            why = f"reset by {origin.source} ({origin.payload['reason']}): {_cite(origin)}"
        elif origin.event_type == SUCCEEDED:
            why = (
                f"migration {origin.payload['migration_id']} rewrote every object in it:"
                f" {_cite(origin)}"
            )
        elif persisted == UNKNOWN_HASH:
            why = (
                "objects written before the first report may be in any version;"
                f" the StorageState was created by {_cite(origin)}"
            )
        else:
            why = (
                f"{origin.payload['apiserver_id']} reported encoding version"
                f" {_version_words(origin.payload['encoding_version'])} and may have written"
                " with it:"
                f" {_cite(origin)}"
            )
        lines.append(f"  - {persisted}: {why}")
    current = storage_state.current_storage_version_hash
    lines.append(
        f"The current storage version hash is {current}."
        if current is not None
        else "There is no current storage version hash while the apiservers disagree."
        if facts.storage_version is not None
        else "There is no current storage version hash: no apiserver reports the resource."
    )
    return lines


def _migration_lines(facts: Facts) -> list[str]:
    if not facts.migrations:
        return ["No migration was ever requested for this resource."]
    latest = facts.migrations[-1]
    steps = [e for e in facts.history if e.payload.get("migration_id") == latest.migration_id]
    requested = next((e for e in steps if e.event_type == REQUESTED and e.applied), None)
    # The row's revision names the event that last changed it: a stale success too,
    # which moves the migration to Succeeded though its rejection keeps the hashes.
    moved = Position.parse(latest.revision)
    last = next((e for e in steps if e.position == moved), None)
    requests = len(_applied(facts, REQUESTED))  # ended ones leave the views on a new request
    lines = [
        f"Latest migration {latest.migration_id} (of {requests}): {latest.phase},"
        f" to {latest.target_version} (hash {latest.target_hash}) for StorageVersion revision"
        f" {latest.storage_version_revision}; {latest.objects_migrated} objects migrated.",
        f"  requested by {_cite(requested)}; last moved by {_cite(last)}"
        + (f"; reason {latest.reason}" if latest.reason else "")
        + (f": {latest.message}" if latest.message else ""),
    ]
    lines += [
        f"  {'applied in part' if e.applied_in_part else 'not applied'}: {e.event_type} at"
        f" {e.position}: {e.rejection}"
        for e in steps
        if not e.applied
    ]
    return lines


def _crd_lines(facts: Facts) -> list[str]:
    """A custom resource's versions as a CRD author asks: which can go now, and what holds
    each other one (:mod:`projections.crds`)."""
    crd = facts.crd
    if crd is None:
        return []
    served = ", ".join(crd.served_versions) or "none"
    lines = [
        "",
        f"CustomResourceDefinition {crd.name} (generation {crd.generation}, revision"
        f" {crd.revision}): storage version {crd.storage_version}; serves {served};"
        f" status.storedVersions [{', '.join(crd.stored_versions)}].",
    ]
    origins = hash_origins(facts)
    for verdict in facts.verdicts:
        audited = _audited_words(facts.audit, f"{crd.group}/{verdict.version}")
        if verdict.removable:
            lines.append(
                f"  - {verdict.version} can be removed from status.storedVersions now:"
                f" {verdict.why}{audited}."
            )
            continue
        origin = origins.get(hash_of_stored(f"{crd.group}/{verdict.version}", crd.kind))
        since = (
            f"; it was last reported by {_cite(origin)}"
            if origin is not None and origin.event_type == REPORTED
            else ""
        )
        lines.append(f"  - {verdict.version} stays: {verdict.why}{since}{audited}.")
    removable = [v.version for v in facts.verdicts if v.removable]
    unlisted = [
        v for v in crd.versions if v not in crd.stored_versions and v != crd.storage_version
    ]
    if unlisted:
        lines.append(
            f"  {', '.join(unlisted)} can be removed from spec.versions now: no object is"
            " stored in it and status.storedVersions does not list it (stop serving it first"
            " if clients still ask for it)."
        )
    if removable:
        lines.append(
            f"  {', '.join(removable)} can be removed from spec.versions once it has left"
            " status.storedVersions (the apiserver refuses to drop a version it lists):"
            " svledger worker --prune-stored-versions does that after such a migration, or"
            " patch the CustomResourceDefinition's status yourself."
        )
    if crd.storage_migrating_status is not None:
        lines.append(
            f"  StorageMigrating={crd.storage_migrating_status}"
            f" ({crd.storage_migrating_reason}, observedGeneration"
            f" {crd.storage_migrating_observed_generation}): {crd.storage_migrating_message}"
        )
    if crd.prune_outcome is not None:
        done = "pruned" if crd.prune_outcome == "Pruned" else f"refused ({crd.prune_outcome})"
        lines.append(
            f"  Last prune by svledger's worker, {done} at {crd.prune_revision}:"
            f" {crd.prune_message}"
        )
    if crd.pending_prune:
        lines.append(
            f"  {', '.join(crd.pending_prune)} left status.storedVersions while a migration ran;"
            " judged when it ends."
        )
    if crd.prune_alarm is not None:
        lines.append(f"  ALARM: a prune the ledger does not back: {crd.prune_alarm}.")
    return lines


def _audit_lines(facts: Facts) -> list[str]:
    """The resource's last audit of the store (:mod:`projections.audits`): what etcd held,
    against what the ledger holds, and the encryption keys that can go."""
    audit = facts.audit
    if audit is None:
        return []
    when = audit.audited_at.isoformat(timespec="seconds")
    lines = [
        "",
        f"Last audit of the store {audit.audit_id}: etcd revision {audit.etcd_revision}"
        f" (StorageAudited at {audit.revision}, {when}): {audit.objects} objects,"
        f" {audit.total_bytes} bytes.",
    ]
    persisted = (
        set()
        if facts.storage_state is None
        else set(facts.storage_state.persisted_storage_version_hashes)
    )
    for version, found_hash, count in zip(
        audit.versions, audit.version_hashes, audit.version_counts, strict=True
    ):
        if version in audit.polluted_versions:
            held = "POLLUTION: the ledger holds no object can be stored in it"
        elif found_hash in persisted or UNKNOWN_HASH in persisted:
            held = "as the ledger holds"
        else:
            held = "not among the persisted hashes now (a migration since rewrote them?)"
        lines.append(f"  - {count} stored in {version} (hash {found_hash}): {held}")
    for key, count in zip(audit.encryption_keys, audit.encryption_counts, strict=True):
        lines.append(f"  - {count} encrypted with {key}")
    if audit.undecodable:
        shown = "; ".join(audit.undecodable_keys)
        lines.append(f"  - {audit.undecodable} values neither an object nor encrypted: {shown}")
    if audit.pollution is not None:
        lines.append(f"  ALARM: {audit.pollution}.")
    for key in removable_keys(audit):
        lines.append(
            f"  {key} encrypts no object of this resource at etcd revision"
            f" {audit.etcd_revision}: it can be removed from the EncryptionConfiguration's"
            f" providers for it ({audit.encryption_keys[0]} writes), once every apiserver"
            " has read the configuration that writes with the new key."
        )
    return lines


def _audited_words(audit: StorageAudit | None, version: str) -> str:
    """What the resource's last audit found stored in ``version``, if there was one."""
    if audit is None:
        return ""
    counts = dict(zip(audit.versions, audit.version_counts, strict=True))
    encrypted = sum(audit.encryption_counts) - _plain(audit)
    found = f"{counts.get(version, 0)} objects stored in it"
    if encrypted:
        found += f" ({encrypted} encrypted, their version unread)"
    return f"; the audit at etcd revision {audit.etcd_revision} ({audit.revision}) found {found}"


def _plain(audit: StorageAudit) -> int:
    """The values counted under the ``identity`` provider: stored in the clear."""
    return sum(
        count
        for key, count in zip(audit.encryption_keys, audit.encryption_counts, strict=True)
        if key.split(":")[0] == "identity"
    )
