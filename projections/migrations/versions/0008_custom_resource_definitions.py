"""CustomResourceDefinitions (their versions, status.storedVersions and what can leave it)
and each resource's last audit of the store.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "custom_resource_definitions",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("api_group", sa.String(), nullable=False),
        sa.Column("resource", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("uid", sa.String(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("resource_version", sa.String(), nullable=False),
        sa.Column("versions", JSON_DOCUMENT, nullable=False),
        sa.Column("served_versions", JSON_DOCUMENT, nullable=False),
        sa.Column("storage_version", sa.String(), nullable=False),
        sa.Column("stored_versions", JSON_DOCUMENT, nullable=False),
        sa.Column("storage_migrating_status", sa.String()),
        sa.Column("storage_migrating_reason", sa.String()),
        sa.Column("storage_migrating_message", sa.Text()),
        sa.Column("storage_migrating_observed_generation", sa.BigInteger()),
        sa.Column("revision", sa.String(), nullable=False),
        sa.Column("prune_outcome", sa.String()),
        sa.Column("prune_message", sa.Text()),
        sa.Column("prune_revision", sa.String()),
        sa.Column("pending_prune", JSON_DOCUMENT, nullable=False),
        sa.Column("prune_alarm", sa.Text()),
        sa.Column("stored_version_verdicts", JSON_DOCUMENT, nullable=False),
        sa.PrimaryKeyConstraint("cluster", "api_group", "resource"),
    )
    op.create_table(
        "storage_audits",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("api_group", sa.String(), nullable=False),
        sa.Column("resource", sa.String(), nullable=False),
        sa.Column("audit_id", sa.String(), nullable=False),
        sa.Column("etcd_revision", sa.BigInteger(), nullable=False),
        sa.Column("ledger_offset", sa.BigInteger(), nullable=False),
        sa.Column("objects", sa.BigInteger(), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("versions", JSON_DOCUMENT, nullable=False),
        sa.Column("version_hashes", JSON_DOCUMENT, nullable=False),
        sa.Column("version_counts", JSON_DOCUMENT, nullable=False),
        sa.Column("encryption_keys", JSON_DOCUMENT, nullable=False),
        sa.Column("encryption_counts", JSON_DOCUMENT, nullable=False),
        sa.Column("undecodable", sa.BigInteger(), nullable=False),
        sa.Column("undecodable_keys", JSON_DOCUMENT, nullable=False),
        sa.Column("polluted_versions", JSON_DOCUMENT, nullable=False),
        sa.Column("pollution", sa.Text()),
        sa.Column("audited_at", UTC_DATETIME, nullable=False),
        sa.Column("revision", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "api_group", "resource"),
    )


def downgrade() -> None:
    op.drop_table("storage_audits")
    op.drop_table("custom_resource_definitions")
