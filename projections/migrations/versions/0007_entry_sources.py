"""Each StorageVersion entry's source, and agreement that is unknown.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06 00:00:00

Reports say where they were read since StorageVersionReported v3 (an apiserver's own
discovery, its StorageVersion entry, or its own report), and an apiserver holds one
entry per source, so the source joins the entries' key; entries folded before are the
apiservers' own (""). A StorageVersion's condition may be ``Unknown``: an apiserver
holding a live lease has not reported the resource.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_ENTRY_KEY = ("cluster", "api_group", "resource", "apiserver_id")


def upgrade() -> None:
    with op.batch_alter_table("server_storage_versions") as table:
        table.add_column(sa.Column("source", sa.String(), nullable=False, server_default=""))
        table.drop_constraint("pk_server_storage_versions", type_="primary")
        table.create_primary_key("pk_server_storage_versions", [*_ENTRY_KEY, "source"])
    _condition_statuses(("True", "False", "Unknown"))


def downgrade() -> None:
    _condition_statuses(("True", "False"))
    with op.batch_alter_table("server_storage_versions") as table:
        table.drop_constraint("pk_server_storage_versions", type_="primary")
        table.create_primary_key("pk_server_storage_versions", list(_ENTRY_KEY))
        table.drop_column("source")


def _condition_statuses(statuses: tuple[str, ...]) -> None:
    """Allow ``statuses`` in ``storage_versions.condition_status``, keeping every entry.

    SQLite changes a constraint by copying the table into a new one and dropping the old,
    and dropping it deletes its entries (their foreign key cascades, and SQLite cannot
    switch foreign keys off inside the migration's transaction): they are kept aside and
    put back.
    """
    entries = sa.table(
        "server_storage_versions",
        *(sa.column(c.name) for c in _entry_columns()),
    )
    connection = op.get_bind()
    copied = connection.dialect.name == "sqlite"  # PostgreSQL alters the table in place
    kept = (
        [dict(row) for row in connection.execute(sa.select(entries)).mappings()] if copied else []
    )
    allowed = ", ".join(f"'{status}'" for status in statuses)
    with op.batch_alter_table("storage_versions") as table:
        table.drop_constraint("ck_storage_versions_condition_status", type_="check")
        table.create_check_constraint(
            "ck_storage_versions_condition_status", f"condition_status IN ({allowed})"
        )
    if kept:
        connection.execute(sa.delete(entries))
        connection.execute(sa.insert(entries), kept)


def _entry_columns() -> list[sa.Column[object]]:
    """The columns ``server_storage_versions`` has now (with or without ``source``)."""
    inspector = sa.inspect(op.get_bind())
    return [sa.Column(c["name"]) for c in inspector.get_columns("server_storage_versions")]
