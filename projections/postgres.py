"""What only PostgreSQL does: streaming a batch's rows in by binary ``COPY``.

psycopg is in the ``postgres`` extra, not in the base install, so nothing imports
this module until a connection is on PostgreSQL: SQLite, the embedded default, works
from a base install.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import set_json_dumps
from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError


def copy_rows(connection: Connection, table: Table, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` (a value per column of ``table``, JSON as text) by binary ``COPY``.

    One statement streams the whole batch, where an executemany costs a statement per
    row, and the server parses no text. A row already present fails the COPY on the
    primary key exactly as an INSERT would; the driver's error is raised as
    SQLAlchemy's (:class:`sqlalchemy.exc.IntegrityError` for that case), so callers
    handle both backends alike.
    """
    statement = f"COPY {table.name} ({', '.join(table.columns.keys())}) FROM STDIN (FORMAT BINARY)"
    types = [column.type.compile(dialect=connection.dialect).lower() for column in table.columns]
    driver = typing.cast(psycopg.Connection[Any], connection.connection.driver_connection)
    cursor = driver.cursor()
    # The JSON is already text: the cursor's JSON "dumps" passes it through.
    set_json_dumps(_as_is, cursor)
    try:
        with cursor.copy(statement) as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)
    except psycopg.Error as error:
        raise DBAPIError.instance(
            statement, None, error, psycopg.Error, dialect=connection.dialect
        ) from error
    finally:
        cursor.close()


def _as_is(text: str) -> str:
    return text
