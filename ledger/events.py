"""The ledger's event types: the contract between every producer and every fold.

Each class is a frozen dataclass whose name is the Avro record name and the value of
the ``svledger-type`` header. Field names and order match the current schema in
``schemas/<Type>/``; the codec maps between the two by name, so a new field is added
here and in a new schema version together (see ``schemas/README.md``).

Times are timezone-aware UTC datetimes (Avro ``timestamp-micros``); sequences are
tuples so events stay hashable and immutable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Final, NamedTuple, TypeAlias

# Where a report was read (``StorageVersionReported.source``); None: the apiserver said it
# itself (the embedded reporter). An apiserver holds an entry per source it was read from.
SOURCE_DISCOVERY: Final = "discovery"  # the storageVersionHash in its own discovery
SOURCE_STORAGE_VERSION: Final = "storageversion"  # its entry in a StorageVersion object
SOURCES: Final = (SOURCE_DISCOVERY, SOURCE_STORAGE_VERSION)


class Position(NamedTuple):
    """Where an event sits in the log. Its string form is a view row's ``revision``."""

    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.partition}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Position:
        partition, _, offset = text.partition(":")
        try:
            return cls(int(partition), int(offset))
        except ValueError:
            raise ValueError(
                f"log position {text!r} is not PARTITION:OFFSET, e.g. '0:1234'"
            ) from None


@dataclasses.dataclass(frozen=True, slots=True)
class Meta:
    """Carried by every event."""

    event_id: str
    cluster: str
    occurred_at: datetime
    source: str
    causation_id: str | None = None
    correlation_id: str | None = None

    @classmethod
    def new(
        cls,
        cluster: str,
        source: str,
        occurred_at: datetime,
        *,
        causation_id: str | None = None,
        correlation_id: str | None = None,
    ) -> Meta:
        return cls(
            event_id=str(uuid.uuid4()),
            cluster=cluster,
            occurred_at=occurred_at,
            source=source,
            causation_id=causation_id,
            correlation_id=correlation_id,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ApiserverHeartbeat:
    meta: Meta
    apiserver_id: str
    holder_identity: str
    hostname: str
    lease_duration_seconds: int
    renew_time: datetime
    binary_version: str | None = None
    peer_advertise_address: str | None = None


def lease_term(
    cluster: str,
    apiserver_id: str,
    holder_identity: str,
    hostname: str,
    lease_duration_seconds: int,
    binary_version: str | None,
    peer_advertise_address: str | None = None,
) -> bytes:
    """What a heartbeat says of its lease besides the renew time, as a 16-byte digest.

    Two heartbeats with the same term differ in their renew time only: the later one
    is a plain renewal of the lease the earlier one left (see the ``svledger-lease``
    record header, :func:`ledger.kafka.to_record`, and the projector's thinning).
    """
    fields = (
        cluster,
        apiserver_id,
        holder_identity,
        hostname,
        str(lease_duration_seconds),
        "-" if binary_version is None else f"+{binary_version}",
        # Only where there is one, so the terms written before the field existed stand.
        *(() if peer_advertise_address is None else (f"+{peer_advertise_address}",)),
    )
    return hashlib.blake2b("\0".join(fields).encode(), digest_size=16).digest()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    """A timezone-aware time as microseconds since 1970-01-01 UTC, exactly."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """The UTC time ``value`` microseconds after 1970-01-01 UTC (:func:`micros` inverted)."""
    return _EPOCH + value * _MICROSECOND


def heartbeat_term(event: ApiserverHeartbeat) -> bytes:
    """:func:`lease_term` of a heartbeat."""
    return lease_term(
        event.meta.cluster,
        event.apiserver_id,
        event.holder_identity,
        event.hostname,
        event.lease_duration_seconds,
        event.binary_version,
        event.peer_advertise_address,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ApiserverLeaseReleased:
    meta: Meta
    apiserver_id: str
    holder_identity: str


@dataclasses.dataclass(frozen=True, slots=True)
class ApiserverLeaseExpired:
    meta: Meta
    apiserver_id: str
    last_renew_time: datetime
    lease_duration_seconds: int


@dataclasses.dataclass(frozen=True, slots=True)
class StorageVersionReported:
    meta: Meta
    apiserver_id: str
    group: str
    resource: str
    kind: str
    encoding_version: str
    decodable_versions: tuple[str, ...]
    served_versions: tuple[str, ...]
    storage_version_hash: str | None = None
    source: str | None = None  # SOURCES: where it was read; None: the apiserver itself


@dataclasses.dataclass(frozen=True, slots=True)
class StorageVersionWithdrawn:
    meta: Meta
    apiserver_id: str
    group: str
    resource: str
    source: str | None = None  # the withdrawn entry's, as in StorageVersionReported
    reason: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class StorageStateReset:
    meta: Meta
    group: str
    resource: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class CustomResourceDefinitionObserved:
    """A CustomResourceDefinition's versions as the collector read them (``deleted``: gone).

    Versions are bare, as the CustomResourceDefinition names them (``v2``); the stored
    version of the resource is ``<group>/<storage_version>``. Of its conditions, only
    ``StorageMigrating`` (the in-tree migrator's, and svledger's worker's) is kept.
    """

    meta: Meta
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
    storage_migrating_status: str | None = None
    storage_migrating_reason: str | None = None
    storage_migrating_message: str | None = None
    storage_migrating_observed_generation: int | None = None
    deleted: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class StoredVersionsPruned:
    meta: Meta
    migration_id: str
    group: str
    resource: str
    name: str
    generation: int
    resource_version: str
    stored_versions_before: tuple[str, ...]
    stored_versions_after: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class StoredVersionsPruneRefused:
    meta: Meta
    migration_id: str
    group: str
    resource: str
    name: str
    stored_versions: tuple[str, ...]
    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class StorageAudited:
    """What etcd held of one resource at ``etcd_revision`` (``svledger audit``); lists are
    parallel (a version, its hash, its count) and sorted."""

    meta: Meta
    audit_id: str
    group: str
    resource: str
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
    polluted_versions: tuple[str, ...] = ()
    pollution: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationRequested:
    meta: Meta
    migration_id: str
    group: str
    resource: str
    target_version: str
    target_hash: str
    storage_version_revision: str


@dataclasses.dataclass(frozen=True, slots=True)
class _MigrationStatus:
    """Payload shared by every step of a migration after it was requested."""

    meta: Meta
    migration_id: str
    objects_migrated: int = 0
    continue_token: str | None = None
    reason: str | None = None
    message: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationStarted(_MigrationStatus):
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationProgressed(_MigrationStatus):
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationSucceeded(_MigrationStatus):
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationFailed(_MigrationStatus):
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationCancelled(_MigrationStatus):
    pass


MigrationStatusEvent: TypeAlias = (
    MigrationStarted
    | MigrationProgressed
    | MigrationSucceeded
    | MigrationFailed
    | MigrationCancelled
)

Event: TypeAlias = (
    ApiserverHeartbeat
    | ApiserverLeaseReleased
    | ApiserverLeaseExpired
    | StorageVersionReported
    | StorageVersionWithdrawn
    | StorageStateReset
    | MigrationRequested
    | MigrationStatusEvent
    | CustomResourceDefinitionObserved
    | StoredVersionsPruned
    | StoredVersionsPruneRefused
    | StorageAudited
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        ApiserverHeartbeat,
        ApiserverLeaseReleased,
        ApiserverLeaseExpired,
        StorageVersionReported,
        StorageVersionWithdrawn,
        StorageStateReset,
        MigrationRequested,
        MigrationStarted,
        MigrationProgressed,
        MigrationSucceeded,
        MigrationFailed,
        MigrationCancelled,
        CustomResourceDefinitionObserved,
        StoredVersionsPruned,
        StoredVersionsPruneRefused,
        StorageAudited,
    )
}


def type_name(event: Event) -> str:
    """The event's type name: Avro record name and ``svledger-type`` header value."""
    return type(event).__name__
