"""The initial projection schema: every view of DESIGN.md "SQL views".

Written out in full rather than derived from ``projections.schema`` at run time:
a revision is a frozen record of what it did, whatever the schema module becomes.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "apiserver_leases",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("apiserver_id", sa.String(), nullable=False),
        sa.Column("holder_identity", sa.String(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("lease_duration_seconds", sa.Integer(), nullable=False),
        sa.Column("renew_time", UTC_DATETIME, nullable=False),
        sa.Column("binary_version", sa.String(), nullable=True),
        sa.Column("revision", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "apiserver_id", name="pk_apiserver_leases"),
    )

    op.create_table(
        "storage_versions",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("api_group", sa.String(), nullable=False),
        sa.Column("resource", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("common_encoding_version", sa.String(), nullable=True),
        sa.Column("condition_type", sa.String(), nullable=False),
        sa.Column("condition_status", sa.String(), nullable=False),
        sa.Column("condition_reason", sa.String(), nullable=False),
        sa.Column("condition_message", sa.Text(), nullable=False),
        sa.Column("condition_last_transition_time", UTC_DATETIME, nullable=False),
        sa.Column("revision", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "api_group", "resource", name="pk_storage_versions"),
        sa.CheckConstraint(
            "condition_status IN ('True', 'False')",
            name="ck_storage_versions_condition_status",
        ),
    )
    op.create_index(
        "ix_storage_versions_cluster_name", "storage_versions", ["cluster", "name"], unique=True
    )

    op.create_table(
        "server_storage_versions",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("api_group", sa.String(), nullable=False),
        sa.Column("resource", sa.String(), nullable=False),
        sa.Column("apiserver_id", sa.String(), nullable=False),
        sa.Column("encoding_version", sa.String(), nullable=False),
        sa.Column("decodable_versions", JSON_DOCUMENT, nullable=False),
        sa.Column("served_versions", JSON_DOCUMENT, nullable=False),
        sa.PrimaryKeyConstraint(
            "cluster", "api_group", "resource", "apiserver_id", name="pk_server_storage_versions"
        ),
        sa.ForeignKeyConstraint(
            ["cluster", "api_group", "resource"],
            [
                "storage_versions.cluster",
                "storage_versions.api_group",
                "storage_versions.resource",
            ],
            name="fk_server_storage_versions_storage_versions",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_server_storage_versions_cluster_apiserver_id",
        "server_storage_versions",
        ["cluster", "apiserver_id"],
    )

    op.create_table(
        "storage_states",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("api_group", sa.String(), nullable=False),
        sa.Column("resource", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("persisted_storage_version_hashes", JSON_DOCUMENT, nullable=False),
        sa.Column("current_storage_version_hash", sa.String(), nullable=True),
        sa.Column("revision", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "api_group", "resource", name="pk_storage_states"),
    )
    op.create_index(
        "ix_storage_states_cluster_name", "storage_states", ["cluster", "name"], unique=True
    )

    op.create_table(
        "storage_version_migrations",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("migration_id", sa.String(), nullable=False),
        sa.Column("api_group", sa.String(), nullable=False),
        sa.Column("resource", sa.String(), nullable=False),
        sa.Column("target_version", sa.String(), nullable=False),
        sa.Column("target_hash", sa.String(), nullable=False),
        sa.Column("storage_version_revision", sa.String(), nullable=False),
        sa.Column("phase", sa.String(), nullable=False),
        sa.Column("objects_migrated", sa.BigInteger(), nullable=False),
        sa.Column("continue_token", sa.Text(), nullable=True),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("requested_at", UTC_DATETIME, nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.Column("revision", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "migration_id", name="pk_storage_version_migrations"),
        sa.CheckConstraint(
            "phase IN ('Pending', 'Running', 'Succeeded', 'Failed', 'Cancelled')",
            name="ck_storage_version_migrations_phase",
        ),
    )
    op.create_index(
        "ix_storage_version_migrations_cluster_api_group_resource",
        "storage_version_migrations",
        ["cluster", "api_group", "resource"],
    )
    op.create_index("ix_storage_version_migrations_phase", "storage_version_migrations", ["phase"])

    op.create_table(
        "ledger_events",
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("log_partition", sa.Integer(), nullable=False),
        sa.Column("log_offset", sa.BigInteger(), nullable=False),
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("event_id", sa.String(), nullable=False),
        sa.Column("event_type", sa.String(), nullable=False),
        sa.Column("subject", sa.String(), nullable=False),
        sa.Column("occurred_at", UTC_DATETIME, nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("causation_id", sa.String(), nullable=True),
        sa.Column("correlation_id", sa.String(), nullable=True),
        sa.Column("payload", JSON_DOCUMENT, nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("topic", "log_partition", "log_offset", name="pk_ledger_events"),
        sa.CheckConstraint("outcome IN ('applied', 'rejected')", name="ck_ledger_events_outcome"),
    )
    op.create_index(
        "ix_ledger_events_cluster_occurred_at", "ledger_events", ["cluster", "occurred_at"]
    )
    op.create_index(
        "ix_ledger_events_cluster_subject_event_type",
        "ledger_events",
        ["cluster", "subject", "event_type"],
    )

    op.create_table(
        "rejected_events",
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("log_partition", sa.Integer(), nullable=False),
        sa.Column("log_offset", sa.BigInteger(), nullable=False),
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("event_id", sa.String(), nullable=False),
        sa.Column("event_type", sa.String(), nullable=False),
        sa.Column("subject", sa.String(), nullable=False),
        sa.Column("occurred_at", UTC_DATETIME, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("topic", "log_partition", "log_offset", name="pk_rejected_events"),
        sa.ForeignKeyConstraint(
            ["topic", "log_partition", "log_offset"],
            ["ledger_events.topic", "ledger_events.log_partition", "ledger_events.log_offset"],
            name="fk_rejected_events_ledger_events",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_rejected_events_cluster_occurred_at", "rejected_events", ["cluster", "occurred_at"]
    )

    op.create_table(
        "projection_checkpoints",
        sa.Column("projection", sa.String(), nullable=False),
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("log_partition", sa.Integer(), nullable=False),
        sa.Column("next_offset", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "projection", "topic", "log_partition", name="pk_projection_checkpoints"
        ),
    )


def downgrade() -> None:
    for table in (
        "projection_checkpoints",
        "rejected_events",
        "ledger_events",
        "storage_version_migrations",
        "storage_states",
        "server_storage_versions",
        "storage_versions",
        "apiserver_leases",
    ):
        op.drop_table(table)
