"""The SQL views, as SQLAlchemy Core tables: one schema for PostgreSQL and SQLite.

The tables mirror :mod:`projections.state` row for row; :mod:`projections.store`
is the only code that maps between the two. Alembic owns the schema in a database
(``projections/migrations``); this module is what the code reads and writes, and a
test checks that the migrations build exactly these tables.

Portability decisions, made once:

* Lists (versions, hashes) and event payloads are JSON: ``JSONB`` on PostgreSQL
  (containment operators, GIN-indexable), SQLite's JSON text elsewhere. Both read
  back as Python lists and dicts.
* Times are :class:`UTCDateTime`: ``timestamptz`` on PostgreSQL, ISO text on
  SQLite, and always a timezone-aware UTC ``datetime`` in Python on both.
* Column names avoid SQL reserved words so example queries need no quoting: an API
  group is ``api_group``, a log position is ``log_partition`` / ``log_offset``.
* A view row's ``revision`` is the ``"partition:offset"`` string of the last event
  that changed it, as in the state; ``created_revision`` and ``created_at`` (leases,
  StorageVersions, StorageStates, migrations) the position and time of the event that
  created it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects.postgresql import JSONB


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC ``datetime`` on every backend.

    SQLite has no time zone type: values are stored as naive UTC text and given
    their zone back when read. A naive ``datetime`` on the way in is a bug in the
    caller (its zone is unknowable), so it is refused rather than guessed.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} has no time zone; give it UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


JSONDocument: Final = JSON().with_variant(JSONB(), "postgresql")
# JSON as it is stored: compact, without spaces. PostgreSQL's jsonb keeps its own form;
# SQLite keeps the text, written by this whether the store encodes a value itself (for
# speed) or the JSON type does (projections.database gives it to the SQLite engine).
json_text: Final = json.JSONEncoder(separators=(",", ":")).encode

PHASES: Final = ("Pending", "Running", "Succeeded", "Failed", "Cancelled")
OUTCOMES: Final = ("applied", "rejected")

metadata: Final = MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "fk": "fk_%(table_name)s_%(referred_table_name)s",
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)


def _one_of(column: str, values: tuple[str, ...], name: str) -> CheckConstraint:
    allowed = ", ".join(f"'{value}'" for value in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=name)


def _log_position() -> list[Column[Any]]:
    """The columns that name an event in the log; the key of every per-event table."""
    return [
        Column("topic", String, nullable=False),
        Column("log_partition", Integer, nullable=False),
        Column("log_offset", BigInteger, nullable=False),
    ]


apiserver_leases: Final = Table(
    "apiserver_leases",
    metadata,
    Column("cluster", String, nullable=False),
    Column("apiserver_id", String, nullable=False),
    Column("holder_identity", String, nullable=False),
    Column("hostname", String, nullable=False),
    Column("lease_duration_seconds", Integer, nullable=False),
    Column("renew_time", UTCDateTime, nullable=False),
    Column("binary_version", String),
    Column("revision", String, nullable=False),
    Column("peer_advertise_address", String),
    Column("created_revision", String, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("cluster", "apiserver_id"),
)

storage_versions: Final = Table(
    "storage_versions",
    metadata,
    Column("cluster", String, nullable=False),
    Column("api_group", String, nullable=False),
    Column("resource", String, nullable=False),
    Column("name", String, nullable=False),
    Column("kind", String, nullable=False),
    Column("common_encoding_version", String),
    Column("condition_type", String, nullable=False),
    Column("condition_status", String, nullable=False),
    Column("condition_reason", String, nullable=False),
    Column("condition_message", Text, nullable=False),
    Column("condition_last_transition_time", UTCDateTime, nullable=False),
    Column("revision", String, nullable=False),
    Column("created_revision", String, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("cluster", "api_group", "resource"),
    _one_of("condition_status", ("True", "False", "Unknown"), "condition_status"),
    Index(None, "cluster", "name", unique=True),
)

server_storage_versions: Final = Table(
    "server_storage_versions",
    metadata,
    Column("cluster", String, nullable=False),
    Column("api_group", String, nullable=False),
    Column("resource", String, nullable=False),
    Column("apiserver_id", String, nullable=False),
    Column("encoding_version", String, nullable=False),
    Column("decodable_versions", JSONDocument, nullable=False),
    Column("served_versions", JSONDocument, nullable=False),
    # The entry's place in status.storageVersions: upstream's order (projections.fold).
    Column("ordinal", Integer, nullable=False),
    # Where it was read (StorageVersionReported.source); "" for the apiserver's own report.
    Column("source", String, nullable=False, server_default=""),
    PrimaryKeyConstraint("cluster", "api_group", "resource", "apiserver_id", "source"),
    ForeignKeyConstraint(
        ["cluster", "api_group", "resource"],
        [storage_versions.c.cluster, storage_versions.c.api_group, storage_versions.c.resource],
        ondelete="CASCADE",
    ),
    Index(None, "cluster", "apiserver_id"),
)

storage_states: Final = Table(
    "storage_states",
    metadata,
    Column("cluster", String, nullable=False),
    Column("api_group", String, nullable=False),
    Column("resource", String, nullable=False),
    Column("name", String, nullable=False),
    Column("persisted_storage_version_hashes", JSONDocument, nullable=False),
    Column("current_storage_version_hash", String),
    Column("revision", String, nullable=False),
    Column("created_revision", String, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("cluster", "api_group", "resource"),
    Index(None, "cluster", "name", unique=True),
)

storage_version_migrations: Final = Table(
    "storage_version_migrations",
    metadata,
    Column("cluster", String, nullable=False),
    Column("migration_id", String, nullable=False),
    Column("api_group", String, nullable=False),
    Column("resource", String, nullable=False),
    Column("target_version", String, nullable=False),
    Column("target_hash", String, nullable=False),
    Column("storage_version_revision", String, nullable=False),
    Column("phase", String, nullable=False),
    Column("objects_migrated", BigInteger, nullable=False),
    Column("continue_token", Text),
    Column("reason", String),
    Column("message", Text),
    Column("requested_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("revision", String, nullable=False),
    Column("created_revision", String, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("cluster", "migration_id"),
    _one_of("phase", PHASES, "phase"),
    Index(None, "cluster", "api_group", "resource"),
    Index(None, "phase"),
)

# Every cluster the fold met an event of: its partition and the latest time one of its
# events occurred at (projections.state.Cluster).
clusters: Final = Table(
    "clusters",
    metadata,
    Column("cluster", String, nullable=False),
    Column("log_partition", Integer, nullable=False),
    Column("latest_occurred_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("cluster"),
)

# A CustomResourceDefinition's versions as last observed, and what the ledger makes of its
# status.storedVersions: ``stored_version_verdicts`` holds, per version of it, whether it
# can go and why (projections.crds), rewritten whenever the resource's StorageState or
# migrations move.
custom_resource_definitions: Final = Table(
    "custom_resource_definitions",
    metadata,
    Column("cluster", String, nullable=False),
    Column("api_group", String, nullable=False),
    Column("resource", String, nullable=False),
    Column("kind", String, nullable=False),
    Column("name", String, nullable=False),
    Column("uid", String, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("resource_version", String, nullable=False),
    Column("versions", JSONDocument, nullable=False),
    Column("served_versions", JSONDocument, nullable=False),
    Column("storage_version", String, nullable=False),
    Column("stored_versions", JSONDocument, nullable=False),
    Column("storage_migrating_status", String),
    Column("storage_migrating_reason", String),
    Column("storage_migrating_message", Text),
    Column("storage_migrating_observed_generation", BigInteger),
    Column("revision", String, nullable=False),
    Column("prune_outcome", String),
    Column("prune_message", Text),
    Column("prune_revision", String),
    Column("pending_prune", JSONDocument, nullable=False),
    Column("prune_alarm", Text),
    Column("stored_version_verdicts", JSONDocument, nullable=False),
    PrimaryKeyConstraint("cluster", "api_group", "resource"),
)

# Each resource's last audit of the store (svledger audit): what etcd held of it at one
# revision, as parallel lists (a version, its hash, its count), and any pollution found.
storage_audits: Final = Table(
    "storage_audits",
    metadata,
    Column("cluster", String, nullable=False),
    Column("api_group", String, nullable=False),
    Column("resource", String, nullable=False),
    Column("audit_id", String, nullable=False),
    Column("etcd_revision", BigInteger, nullable=False),
    Column("ledger_offset", BigInteger, nullable=False),
    Column("objects", BigInteger, nullable=False),
    Column("total_bytes", BigInteger, nullable=False),
    Column("versions", JSONDocument, nullable=False),
    Column("version_hashes", JSONDocument, nullable=False),
    Column("version_counts", JSONDocument, nullable=False),
    Column("encryption_keys", JSONDocument, nullable=False),
    Column("encryption_counts", JSONDocument, nullable=False),
    Column("undecodable", BigInteger, nullable=False),
    Column("undecodable_keys", JSONDocument, nullable=False),
    Column("polluted_versions", JSONDocument, nullable=False),
    Column("pollution", Text),
    Column("audited_at", UTCDateTime, nullable=False),
    Column("revision", String, nullable=False),
    PrimaryKeyConstraint("cluster", "api_group", "resource"),
)

ledger_events: Final = Table(
    "ledger_events",
    metadata,
    *_log_position(),
    Column("cluster", String, nullable=False),
    Column("event_id", String, nullable=False),
    Column("event_type", String, nullable=False),
    Column("subject", String, nullable=False),
    Column("occurred_at", UTCDateTime, nullable=False),
    Column("source", String, nullable=False),
    Column("causation_id", String),
    Column("correlation_id", String),
    Column("payload", JSONDocument, nullable=False),
    Column("outcome", String, nullable=False),
    # The log position is the key, so an event folded twice cannot be written twice:
    # the second insert fails and takes its whole transaction with it.
    PrimaryKeyConstraint("topic", "log_partition", "log_offset"),
    _one_of("outcome", OUTCOMES, "outcome"),
    # Every index here is paid for by every event the projector writes, so there are
    # only the two that queries use: events by time per cluster, and the history's
    # lookup by subject and event type (which skips an apiserver's heartbeats when
    # only its lease ends are asked for). Its many equal keys keep it small on
    # PostgreSQL, which stores duplicates once.
    Index(None, "cluster", "occurred_at"),
    Index(None, "cluster", "subject", "event_type"),
)

rejected_events: Final = Table(
    "rejected_events",
    metadata,
    *_log_position(),
    Column("cluster", String, nullable=False),
    Column("event_id", String, nullable=False),
    Column("event_type", String, nullable=False),
    Column("subject", String, nullable=False),
    Column("occurred_at", UTCDateTime, nullable=False),
    Column("reason", Text, nullable=False),
    PrimaryKeyConstraint("topic", "log_partition", "log_offset"),
    ForeignKeyConstraint(
        ["topic", "log_partition", "log_offset"],
        [ledger_events.c.topic, ledger_events.c.log_partition, ledger_events.c.log_offset],
        ondelete="CASCADE",
    ),
    Index(None, "cluster", "occurred_at"),
)

# The plain renewals the projector thins (projections.projector): heartbeats that change
# nothing but a lease's renew time have no ledger_events row; each holder's are counted
# here, with the first and last of them, and the lease row has the last one's time and
# position. Every other heartbeat (the first of a holder, one after its lease ended, any
# that changes more) is a ledger_events row.
lease_renewals: Final = Table(
    "lease_renewals",
    metadata,
    Column("cluster", String, nullable=False),
    Column("apiserver_id", String, nullable=False),
    Column("holder_identity", String, nullable=False),
    Column("topic", String, nullable=False),
    Column("log_partition", Integer, nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("renewals", BigInteger, nullable=False),
    PrimaryKeyConstraint("cluster", "apiserver_id", "holder_identity"),
)

projection_checkpoints: Final = Table(
    "projection_checkpoints",
    metadata,
    Column("projection", String, nullable=False),
    Column("topic", String, nullable=False),
    Column("log_partition", Integer, nullable=False),
    Column("next_offset", BigInteger, nullable=False),
    # The latest occurred_at of the partition's events before next_offset; NULL where
    # it is not known (a checkpoint from before it was kept).
    Column("log_time", UTCDateTime),
    PrimaryKeyConstraint("projection", "topic", "log_partition"),
)

# One row: the database's random ID (made by its migration 0006), which names the
# consumer group of the projectors writing it, so that projectors of two databases
# never split the partitions between them.
database_identity: Final = Table(
    "database_identity",
    metadata,
    Column("singleton", Integer, nullable=False),  # always 1: one row
    Column("database_id", String, nullable=False),
    PrimaryKeyConstraint("singleton"),
)

# The projector's fold snapshots (projections.snapshots): one partition's view rows as
# of next_offset, which a replay may start from instead of the log's beginning.
fold_snapshots: Final = Table(
    "fold_snapshots",
    metadata,
    Column("projection", String, nullable=False),
    Column("topic", String, nullable=False),
    Column("log_partition", Integer, nullable=False),
    Column("next_offset", BigInteger, nullable=False),
    Column("log_time", UTCDateTime),
    Column("format", Integer, nullable=False),
    Column("row_count", Integer, nullable=False),
    Column("digest", String, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    PrimaryKeyConstraint("projection", "topic", "log_partition", "next_offset"),
)
