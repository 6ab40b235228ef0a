"""Plain lease renewals counted per holder instead of a ``ledger_events`` row each.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lease_renewals",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("apiserver_id", sa.String(), nullable=False),
        sa.Column("holder_identity", sa.String(), nullable=False),
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("log_partition", sa.Integer(), nullable=False),
        sa.Column("first_offset", sa.BigInteger(), nullable=False),
        sa.Column("last_offset", sa.BigInteger(), nullable=False),
        sa.Column("renewals", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "cluster", "apiserver_id", "holder_identity", name="pk_lease_renewals"
        ),
    )


def downgrade() -> None:
    op.drop_table("lease_renewals")
