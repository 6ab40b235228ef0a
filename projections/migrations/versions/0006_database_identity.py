"""The database's own identity, which names its projectors' consumer group.

Projectors of one database share a consumer group and split the partitions between
them; projectors of two databases must not share one, or each database misses the
partitions the other's projectors were given. A random ID, made once when the
database gets this revision, tells databases apart whatever URL reaches them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 00:00:00
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "database_identity",
        sa.Column("singleton", sa.Integer(), nullable=False),  # always 1: one row
        sa.Column("database_id", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("singleton"),
    )
    op.bulk_insert(table, [{"singleton": 1, "database_id": uuid.uuid4().hex[:12]}])


def downgrade() -> None:
    op.drop_table("database_identity")
