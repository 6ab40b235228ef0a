"""When each served row was created, and every cluster's latest event time.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07 00:00:00

Leases, StorageVersions, StorageStates and migrations record the position and time of
the event that created them (``created_revision``, ``created_at``), and ``clusters``
holds every cluster the fold met an event of, with its partition and the latest time
one of its events occurred at: the read API serves ``metadata.uid``,
``creationTimestamp`` and ages from them, and fold snapshots carry them.

The ledger cannot tell more of rows folded before without folding the log again, so
they are given what the database holds: a row is taken as created by its last change
(its ``revision``), at the time ``ledger_events`` logs for that event, else (a lease last
renewed by a plain renewal, which is not logged; a history that begins at a fold
snapshot) the lease's renew time, else 1970-01-01; a cluster's latest time is that of
its latest event in ``ledger_events``, and a cluster with none is not listed until its
next event. ``svledger replay`` into a fresh database gives the exact ones.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UTC_DATETIME = sa.DateTime(timezone=True)
# The tables of the rows the read API serves, and their key columns.
SERVED = {
    "apiserver_leases": ("cluster", "apiserver_id"),
    "storage_versions": ("cluster", "api_group", "resource"),
    "storage_states": ("cluster", "api_group", "resource"),
    "storage_version_migrations": ("cluster", "migration_id"),
}
_UNKNOWN = datetime(1970, 1, 1, tzinfo=UTC)


def upgrade() -> None:
    # Added with a default, which a NOT NULL column added to a table with rows needs;
    # every row is then given its value. PostgreSQL drops the defaults again; SQLite
    # could only by copying each table, and copying storage_versions would delete its
    # entries (their foreign key cascades), so they stay there, never used.
    for name in SERVED:
        op.add_column(
            name, sa.Column("created_revision", sa.String(), nullable=False, server_default="")
        )
        op.add_column(
            name,
            sa.Column(
                "created_at", UTC_DATETIME, nullable=False, server_default="1970-01-01 00:00:00"
            ),
        )
    connection = op.get_bind()
    for name, key in SERVED.items():
        _backfill(connection, name, key)
    if connection.dialect.name == "postgresql":
        for name in SERVED:
            for column in ("created_revision", "created_at"):
                op.alter_column(name, column, server_default=None)
    clusters = op.create_table(
        "clusters",
        sa.Column("cluster", sa.String(), nullable=False),
        sa.Column("log_partition", sa.Integer(), nullable=False),
        sa.Column("latest_occurred_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )
    events = sa.table(
        "ledger_events",
        sa.column("cluster"),
        sa.column("log_partition"),
        sa.column("occurred_at", UTC_DATETIME),
    )
    latest = connection.execute(
        sa.select(
            events.c.cluster, sa.func.min(events.c.log_partition), sa.func.max(events.c.occurred_at)
        ).group_by(events.c.cluster)
    ).all()
    if latest:
        op.bulk_insert(
            clusters,
            [
                {"cluster": c, "log_partition": p, "latest_occurred_at": _utc(t)}
                for c, p, t in latest
            ],
        )


def downgrade() -> None:
    op.drop_table("clusters")
    for name in SERVED:
        with op.batch_alter_table(name) as table:
            table.drop_column("created_at")
            table.drop_column("created_revision")


def _backfill(connection: sa.Connection, name: str, key: tuple[str, ...]) -> None:
    """Give each row of table ``name`` the creation of its last change."""
    renewed = name == "apiserver_leases"
    rows = sa.table(
        name,
        *(sa.column(c) for c in key),
        sa.column("revision"),
        *([sa.column("renew_time", UTC_DATETIME)] if renewed else []),
        sa.column("created_revision"),
        sa.column("created_at", UTC_DATETIME),
    )
    events = sa.table(
        "ledger_events",
        sa.column("log_partition"),
        sa.column("log_offset"),
        sa.column("occurred_at", UTC_DATETIME),
    )
    created = []
    for row in connection.execute(sa.select(rows)).mappings():
        partition, _, offset = row["revision"].partition(":")
        time = connection.scalar(
            sa.select(sa.func.min(events.c.occurred_at)).where(
                events.c.log_partition == int(partition), events.c.log_offset == int(offset)
            )
        )
        if time is None:
            time = row["renew_time"] if renewed else _UNKNOWN
        created.append(
            {
                **{f"match_{c}": row[c] for c in key},
                "revision_now": row["revision"],
                "time": _utc(time),
            }
        )
    if created:  # one statement, executed for every row
        connection.execute(
            rows.update()
            # Parameters named apart from the columns, which name the SET clause's.
            .where(*(rows.c[c] == sa.bindparam(f"match_{c}") for c in key))
            .values(created_revision=sa.bindparam("revision_now"), created_at=sa.bindparam("time")),
            created,
        )


def _utc(time: datetime) -> datetime:
    """A time read back as UTC (SQLite gives it without its zone)."""
    return time.replace(tzinfo=UTC) if time.tzinfo is None else time.astimezone(UTC)
