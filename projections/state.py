"""What the fold knows: the rows of every view, keyed as the SQL tables are.

Rows are frozen dataclasses; :class:`State` is the one mutable container that holds
them, so folding a million events does not copy the world per event. The fold
(:mod:`projections.fold`) is the only writer; :class:`Changes` tells the SQL writer
and the consumers which keys an event touched (a key missing from the state after
the event means the row was deleted).

Every row carries ``revision``: the log position (``"partition:offset"``) of the
last event that changed it, the ledger's resourceVersion. The rows the read API serves
as objects (leases, StorageVersions, StorageStates, migrations) carry their creation
too: ``created_revision`` and ``created_at``, the position and time of the event that
made the row (set when it first appears, carried over as it changes; a row deleted and
made again is created again), from which ``metadata.uid`` and ``creationTimestamp``
follow. :class:`Cluster` is each cluster the fold met an event of, with the latest time
one occurred at: what the views of a cluster measure ages to.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, TypeAlias, TypeVar, get_args

from ledger.names import resource_name, storage_state_name

UNKNOWN_HASH: Final = "Unknown"

CONDITION_TYPE: Final = "AllEncodingVersionsEqual"
REASON_SET: Final = "CommonEncodingVersionSet"
REASON_UNSET: Final = "CommonEncodingVersionUnset"
MESSAGE_SET: Final = "Common encoding version set"
MESSAGE_UNSET: Final = "Common encoding version unset"
# Not upstream's: an apiserver holding a live lease has not reported the resource (from
# any source), so no one knows what it writes (projections.fold).
REASON_UNKNOWN: Final = "CommonEncodingVersionUnknown"

ConditionStatus: TypeAlias = Literal["True", "False", "Unknown"]

Phase: TypeAlias = Literal["Pending", "Running", "Succeeded", "Failed", "Cancelled"]
ACTIVE_PHASES: Final[frozenset[str]] = frozenset({"Pending", "Running"})
PHASES: Final[tuple[Phase, ...]] = get_args(Phase)

LeaseKey: TypeAlias = tuple[str, str]  # (cluster, apiserver_id)
ResourceKey: TypeAlias = tuple[str, str, str]  # (cluster, group, resource)
MigrationKey: TypeAlias = tuple[str, str]  # (cluster, migration_id)


# (cluster, apiserver ID, holder identity): whose plain lease renewals a count is.
HolderKey: TypeAlias = tuple[str, str, str]

_Row = TypeVar("_Row")


def _pickled_as_fields(cls: type[_Row]) -> type[_Row]:
    """Pickle rows of ``cls`` as the class and its field values.

    Batches of rows cross to the writer process by pickle (:mod:`projections.writer`),
    and a slotted dataclass pickles by its generated ``__getstate__``/``__setstate__``,
    Python code that walks its fields: about 4 µs each way per row, where this takes
    1 and 2.5. Rows pickled before still load (``__setstate__`` is kept).
    """
    values = operator.attrgetter(*(field.name for field in dataclasses.fields(cls)))  # type: ignore[arg-type]

    def reduce(row: Any) -> tuple[type[_Row], tuple[Any, ...]]:
        return cls, values(row)

    setattr(cls, "__reduce__", reduce)  # noqa: B010 (mypy refuses a method assigned)
    return cls


@_pickled_as_fields
@dataclasses.dataclass(slots=True)
class RenewalCount:
    """The plain lease renewals of one holder in a batch (:mod:`projections.thinning`):
    where they are and how many."""

    partition: int
    first_offset: int
    last_offset: int
    renewals: int


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    cluster: str
    apiserver_id: str
    holder_identity: str
    hostname: str
    lease_duration_seconds: int
    renew_time: datetime
    binary_version: str | None
    revision: str
    created_revision: str
    created_at: datetime
    # Last, with a default: rows pickled before it existed (fold snapshots) load as None.
    peer_advertise_address: str | None = None

    @property
    def key(self) -> LeaseKey:
        return (self.cluster, self.apiserver_id)


_MICROSECOND: Final = timedelta(microseconds=1)


def lease_expired(renew_time: datetime | None, duration_seconds: int | None, now: datetime) -> bool:
    """Upstream's ``isLeaseExpired``: renewed longer than its duration before ``now``, or
    without a renew time or a duration (a Lease object may lack either; the ledger's
    leases never do).

    The one expiry rule: the lease GC expires such a lease, the collector neither
    admits it nor calls its disappearance a release.
    """
    if renew_time is None or duration_seconds is None:
        return True
    # In whole microseconds: a renew time near the calendar's end plus a duration, or a
    # duration past what a timedelta holds, would overflow.
    return (now - renew_time) // _MICROSECOND > duration_seconds * 1_000_000


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class ServerStorageVersion:
    """One apiserver's report for one resource (``status.storageVersions[]``), as read from
    one source (``StorageVersionReported.source``; "" for the apiserver's own report)."""

    apiserver_id: str
    encoding_version: str
    decodable_versions: tuple[str, ...]
    served_versions: tuple[str, ...]
    # Last, with a default: rows pickled before it existed (fold snapshots) load as "".
    source: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.apiserver_id, self.source)


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: ConditionStatus
    reason: str
    message: str
    last_transition_time: datetime


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class StorageVersion:
    cluster: str
    group: str
    resource: str
    kind: str
    entries: tuple[ServerStorageVersion, ...]  # upstream's order (see projections.fold)
    common_encoding_version: str | None
    condition: Condition
    revision: str
    created_revision: str
    created_at: datetime

    @property
    def key(self) -> ResourceKey:
        return (self.cluster, self.group, self.resource)

    @property
    def name(self) -> str:
        return resource_name(self.group, self.resource)


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class StorageState:
    cluster: str
    group: str
    resource: str
    persisted_storage_version_hashes: tuple[str, ...]
    current_storage_version_hash: str | None
    revision: str
    created_revision: str
    created_at: datetime

    @property
    def key(self) -> ResourceKey:
        return (self.cluster, self.group, self.resource)

    @property
    def name(self) -> str:
        return storage_state_name(self.group, self.resource)


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    cluster: str
    migration_id: str
    group: str
    resource: str
    target_version: str
    target_hash: str
    storage_version_revision: str
    phase: Phase
    objects_migrated: int
    continue_token: str | None
    reason: str | None
    message: str | None
    requested_at: datetime
    updated_at: datetime
    revision: str
    created_revision: str
    created_at: datetime

    @property
    def key(self) -> MigrationKey:
        return (self.cluster, self.migration_id)

    @property
    def resource_key(self) -> ResourceKey:
        return (self.cluster, self.group, self.resource)

    @property
    def active(self) -> bool:
        return self.phase in ACTIVE_PHASES

    def retries(self, earlier: Migration) -> bool:
        """Whether this migration is another attempt at the request ``earlier`` failed:
        the same target and StorageVersion revision (the migrator's back-off counts those
        attempts, and the worker resumes where the last one failed)."""
        return earlier.phase == "Failed" and (
            earlier.target_hash,
            earlier.storage_version_revision,
        ) == (self.target_hash, self.storage_version_revision)


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class CustomResourceDefinition:
    """A CustomResourceDefinition's versions as last observed
    (``CustomResourceDefinitionObserved``), with what svledger made of its
    ``status.storedVersions`` (:mod:`projections.crds`).

    Versions are bare, as the CustomResourceDefinition names them (``v2``).
    ``prune_*``: the last prune svledger's worker made or refused (``prune_outcome`` is
    ``Pruned`` or the refusal's reason), at ``prune_revision``. ``pending_prune``: versions
    that left ``storedVersions`` while a migration to the storage version was still
    running (the in-tree migrator prunes as it ends), judged when the migration ends.
    ``prune_alarm``: a version left ``storedVersions`` while the ledger held that objects
    may still be stored in it; cleared by the next migration that proves the store clean.
    """

    cluster: str
    group: str
    resource: str
    kind: str
    name: str
    uid: str
    generation: int
    resource_version: str
    versions: tuple[str, ...]
    served_versions: tuple[str, ...]
    storage_version: str
    stored_versions: tuple[str, ...]
    storage_migrating_status: str | None
    storage_migrating_reason: str | None
    storage_migrating_message: str | None
    storage_migrating_observed_generation: int | None
    revision: str
    prune_outcome: str | None = None
    prune_message: str | None = None
    prune_revision: str | None = None
    pending_prune: tuple[str, ...] = ()
    prune_alarm: str | None = None

    @property
    def key(self) -> ResourceKey:
        return (self.cluster, self.group, self.resource)


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class StorageAudit:
    """A resource's last audit (``StorageAudited``): what etcd held of it at
    ``etcd_revision``, and the pollution the audit found, if any. ``audited_at`` is the
    event's time; ``revision`` its log position, as every row's."""

    cluster: str
    group: str
    resource: str
    audit_id: str
    etcd_revision: int
    ledger_offset: int
    objects: int
    total_bytes: int
    versions: tuple[str, ...]
    version_hashes: tuple[str, ...]
    version_counts: tuple[int, ...]
    encryption_keys: tuple[str, ...]
    encryption_counts: tuple[int, ...]
    undecodable: int
    undecodable_keys: tuple[str, ...]
    polluted_versions: tuple[str, ...]
    pollution: str | None
    audited_at: datetime
    revision: str

    @property
    def key(self) -> ResourceKey:
        return (self.cluster, self.group, self.resource)


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """A cluster the fold has met an event of: its partition (every event of a cluster
    is in one) and the latest time one of its events occurred at, whatever the fold made
    of it (applied, rejected, a repeat; a plain lease renewal too). It is what the read
    API measures a view's ages to, and a cluster with no other row is still listed."""

    cluster: str
    partition: int
    latest_occurred_at: datetime

    @property
    def key(self) -> str:
        return self.cluster


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
    """An event the fold did not apply, and why; never silently dropped."""

    cluster: str
    revision: str
    event_id: str
    event_type: str
    subject: str
    reason: str


# How far back in its cluster's event time an event's ID is remembered (SeenEvents).
SEEN_EVENT_WINDOW: Final = timedelta(hours=1)
_EARLIEST: Final = datetime.min.replace(tzinfo=UTC)


def seen_horizon(latest: datetime) -> datetime:
    """The earliest time an event ID is remembered at, when a cluster's latest is ``latest``
    (no earlier than the first representable time: an event may claim year 1)."""
    return latest - SEEN_EVENT_WINDOW if latest - _EARLIEST > SEEN_EVENT_WINDOW else _EARLIEST


@_pickled_as_fields
@dataclasses.dataclass(frozen=True, slots=True)
class SeenEvent:
    """An event ID the fold has seen in a cluster, not a heartbeat's: when it last
    occurred, by event time, and where that occurrence is in the log."""

    cluster: str
    event_id: str
    occurred_at: datetime
    revision: str


class SeenEvents:
    """One cluster's event IDs of the last :data:`SEEN_EVENT_WINDOW` of its event time.

    ``meta.event_id`` is an event's idempotency key (DESIGN.md): a record that repeats
    an event (a producer's retry of a send it could not see acknowledged, a record
    copied by hand) must not be folded twice, or a report folded again after a later
    one would undo it. Remembering every ID of a log is unbounded, so an ID is
    remembered while the latest time it occurred at is within the window of the latest
    event time of its cluster (:attr:`latest`); a repeat later than that is folded as a
    new event. Heartbeats are left out: most are plain renewals, which the projector
    counts without decoding (:mod:`projections.thinning`), so their IDs are never read,
    and a repeated heartbeat only says again what its lease said.

    All of it follows from the cluster's events in log order, so the projector, a
    replay, a snapshot (:meth:`rows`) and the views (``ledger_events``,
    :func:`projections.store.load_state`) agree on it exactly.
    """

    __slots__ = ("_events", "_kept", "latest")

    def __init__(self, rows: Iterable[SeenEvent] = ()) -> None:
        self._events = {row.event_id: row for row in rows}
        self._kept = len(self._events)
        self.latest: datetime | None = max(
            (row.occurred_at for row in self._events.values()), default=None
        )

    def see(self, row: SeenEvent) -> SeenEvent | None:
        """Remember ``row``; return the earlier occurrence of its ID still remembered."""
        if self.latest is None or row.occurred_at > self.latest:
            self.latest = row.occurred_at
        horizon = seen_horizon(self.latest)
        earlier = self._events.get(row.event_id)
        if earlier is not None and earlier.occurred_at < horizon:
            earlier = None
        if earlier is None or row.occurred_at >= earlier.occurred_at:
            self._events[row.event_id] = row
        if len(self._events) > 2 * self._kept + 64:  # forget the old ones now and then
            self._events = {k: r for k, r in self._events.items() if r.occurred_at >= horizon}
            self._kept = len(self._events)
        return earlier

    def rows(self) -> list[SeenEvent]:
        """What it remembers, by event ID: only what a later event may still find."""
        if self.latest is None:
            return []
        horizon = seen_horizon(self.latest)
        return sorted(
            (row for row in self._events.values() if row.occurred_at >= horizon),
            key=operator.attrgetter("event_id"),
        )

    def copy(self) -> SeenEvents:
        return SeenEvents(self.rows())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SeenEvents) and self.rows() == other.rows()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SeenEvents({self.rows()!r})"


def seen_by_cluster(rows: Iterable[SeenEvent]) -> dict[str, SeenEvents]:
    """``rows`` (of any clusters) as each cluster's :class:`SeenEvents`."""
    by_cluster: dict[str, list[SeenEvent]] = {}
    for row in rows:
        by_cluster.setdefault(row.cluster, []).append(row)
    return {cluster: SeenEvents(cluster_rows) for cluster, cluster_rows in by_cluster.items()}


@dataclasses.dataclass
class State:
    """Every view's rows, the event IDs a repeated event is found by (``seen``), and
    indexes derived from the rows (not views, not stored).

    The indexes keep the fold's work per event proportional to what it touches:
    ``members_by_cluster`` holds the apiserver IDs with a lease in each cluster (every
    one must report a resource for agreement), ``resources_by_cluster`` the
    StorageVersions of each cluster (a member joining or leaving moves the agreement of
    each), ``resources_by_apiserver`` finds the StorageVersions holding an entry of
    an apiserver whose lease ends, ``active_migrations_by_resource`` the Pending or
    Running migrations of a resource, ``inactive_migrations_by_resource`` its other ones
    (Succeeded, Failed, Cancelled). They are built from the rows given to the
    constructor, so a State loaded from the database is created with its rows, and
    the fold keeps the indexes in step from then on.
    """

    leases: dict[LeaseKey, Lease] = dataclasses.field(default_factory=dict)
    storage_versions: dict[ResourceKey, StorageVersion] = dataclasses.field(default_factory=dict)
    storage_states: dict[ResourceKey, StorageState] = dataclasses.field(default_factory=dict)
    migrations: dict[MigrationKey, Migration] = dataclasses.field(default_factory=dict)
    # Per cluster, the event IDs a repeat of an event would be found by.
    seen: dict[str, SeenEvents] = dataclasses.field(default_factory=dict)
    custom_resources: dict[ResourceKey, CustomResourceDefinition] = dataclasses.field(
        default_factory=dict
    )
    audits: dict[ResourceKey, StorageAudit] = dataclasses.field(default_factory=dict)
    clusters: dict[str, Cluster] = dataclasses.field(default_factory=dict)
    resources_by_apiserver: dict[LeaseKey, set[ResourceKey]] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    active_migrations_by_resource: dict[ResourceKey, set[MigrationKey]] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    inactive_migrations_by_resource: dict[ResourceKey, set[MigrationKey]] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    members_by_cluster: dict[str, set[str]] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    resources_by_cluster: dict[str, set[ResourceKey]] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        by_apiserver: dict[LeaseKey, set[ResourceKey]] = {}
        by_cluster: dict[str, set[ResourceKey]] = {}
        for key, storage_version in self.storage_versions.items():
            by_cluster.setdefault(key[0], set()).add(key)
            for entry in storage_version.entries:
                by_apiserver.setdefault((key[0], entry.apiserver_id), set()).add(key)
        members: dict[str, set[str]] = {}
        for cluster, apiserver_id in self.leases:
            members.setdefault(cluster, set()).add(apiserver_id)
        self.members_by_cluster = members
        self.resources_by_cluster = by_cluster
        active: dict[ResourceKey, set[MigrationKey]] = {}
        inactive: dict[ResourceKey, set[MigrationKey]] = {}
        for migration_key, migration in self.migrations.items():
            index = active if migration.active else inactive
            index.setdefault(migration.resource_key, set()).add(migration_key)
        self.resources_by_apiserver = by_apiserver
        self.active_migrations_by_resource = active
        self.inactive_migrations_by_resource = inactive


@dataclasses.dataclass
class Changes:
    """The keys one event (or a batch: see :func:`projections.fold.apply`) touched."""

    leases: set[LeaseKey] = dataclasses.field(default_factory=set)
    storage_versions: set[ResourceKey] = dataclasses.field(default_factory=set)
    storage_states: set[ResourceKey] = dataclasses.field(default_factory=set)
    migrations: set[MigrationKey] = dataclasses.field(default_factory=set)
    rejections: list[Rejection] = dataclasses.field(default_factory=list)
    custom_resources: set[ResourceKey] = dataclasses.field(default_factory=set)
    audits: set[ResourceKey] = dataclasses.field(default_factory=set)
    clusters: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def everything(cls, state: State) -> Changes:
        """Changes that touch every row of ``state``."""
        return cls(
            leases=set(state.leases),
            storage_versions=set(state.storage_versions),
            storage_states=set(state.storage_states),
            migrations=set(state.migrations),
            custom_resources=set(state.custom_resources),
            audits=set(state.audits),
            clusters=set(state.clusters),
        )

    @property
    def resources(self) -> set[ResourceKey]:
        """Resources whose agreement or storage state this touched."""
        return self.storage_versions | self.storage_states

    def add(self, other: Changes) -> None:
        """Take in what ``other`` touched too."""
        self.leases |= other.leases
        self.storage_versions |= other.storage_versions
        self.storage_states |= other.storage_states
        self.migrations |= other.migrations
        self.rejections += other.rejections
        self.custom_resources |= other.custom_resources
        self.audits |= other.audits
        self.clusters |= other.clusters
