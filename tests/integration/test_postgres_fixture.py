"""The database fixtures give each test a real, empty, private database on every backend."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

_ITEMS = sa.Table(
    "items",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
)


def test_database_is_empty_and_round_trips_a_row(
    database_url: str, request: pytest.FixtureRequest
) -> None:
    engine = sa.create_engine(database_url)
    try:
        # Each parameter must really run on its own backend, not on a default one.
        assert engine.dialect.name == request.node.callspec.params["database_url"]
        assert sa.inspect(engine).get_table_names() == []
        _ITEMS.metadata.create_all(engine)
        with engine.begin() as connection:
            connection.execute(_ITEMS.insert(), [{"id": 1, "name": "storageversions"}])
        with engine.connect() as connection:
            rows = connection.execute(sa.select(_ITEMS.c.id, _ITEMS.c.name)).all()
        assert [tuple(row) for row in rows] == [(1, "storageversions")]
    finally:
        engine.dispose()
