"""Alembic's entry point, run inside :func:`projections.database.upgrade`.

The caller hands over an open connection (``config.attributes["connection"]``)
inside its transaction, so no ``alembic.ini`` or URL is read here.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from projections.schema import metadata

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError(
        "the projection migrations run through `svledger db upgrade --db URL` "
        "(projections.database.upgrade), which passes the connection"
    )
# render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table.
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
