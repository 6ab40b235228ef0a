"""Each apiserver lease's peer advertise address.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 00:00:00

Heartbeats carry the address peers proxy requests to (the identity Lease's
``kubernetes.io/peer-advertise-address`` annotation) since ApiserverHeartbeat v2;
leases folded before have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("apiserver_leases") as table:
        table.add_column(sa.Column("peer_advertise_address", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("apiserver_leases") as table:
        table.drop_column("peer_advertise_address")
