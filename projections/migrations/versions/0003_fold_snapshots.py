"""Fold snapshots, and each checkpoint's log time.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("projection_checkpoints") as table:
        table.add_column(sa.Column("log_time", UTC_DATETIME, nullable=True))
    op.create_table(
        "fold_snapshots",
        sa.Column("projection", sa.String(), nullable=False),
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("log_partition", sa.Integer(), nullable=False),
        sa.Column("next_offset", sa.BigInteger(), nullable=False),
        sa.Column("log_time", UTC_DATETIME, nullable=True),
        sa.Column("format", sa.Integer(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "projection", "topic", "log_partition", "next_offset", name="pk_fold_snapshots"
        ),
    )


def downgrade() -> None:
    op.drop_table("fold_snapshots")
    with op.batch_alter_table("projection_checkpoints") as table:
        table.drop_column("log_time")
