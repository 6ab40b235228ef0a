"""Each StorageVersion entry's place in status.storageVersions.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 00:00:00

Entries were kept sorted by apiserver ID; they are now in upstream's order (a new
apiserver's entry appended, a known one replaced in place). Existing rows keep the
order they had: their ordinals number each StorageVersion's entries by apiserver ID,
sorted as the fold sorted them (in Python, whatever the database's collation).
"""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

KEY = ("cluster", "api_group", "resource")


def upgrade() -> None:
    with op.batch_alter_table("server_storage_versions") as table:
        table.add_column(sa.Column("ordinal", sa.Integer(), nullable=False, server_default="0"))
    entries = sa.table(
        "server_storage_versions",
        *(sa.column(name) for name in (*KEY, "apiserver_id", "ordinal")),
    )
    connection = op.get_bind()
    by_resource: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for row in connection.execute(sa.select(entries)).mappings():
        by_resource[tuple(row[name] for name in KEY)].append(row["apiserver_id"])
    numbered = [
        {
            **{f"match_{name}": value for name, value in zip(KEY, key, strict=True)},
            "match_apiserver_id": apiserver_id,
            "number": ordinal,
        }
        for key, apiserver_ids in by_resource.items()
        for ordinal, apiserver_id in enumerate(sorted(apiserver_ids))
    ]
    if numbered:  # one statement, executed for every entry
        connection.execute(
            entries.update()
            # Parameters named apart from the columns, which name the SET clause's.
            .where(*(entries.c[name] == sa.bindparam(f"match_{name}") for name in KEY))
            .where(entries.c.apiserver_id == sa.bindparam("match_apiserver_id"))
            .values(ordinal=sa.bindparam("number")),
            numbered,
        )
    with op.batch_alter_table("server_storage_versions") as table:
        table.alter_column("ordinal", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("server_storage_versions") as table:
        table.drop_column("ordinal")
