"""What a user is told when the PostgreSQL database a command names cannot be used."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import URL

from svledger.cli import main


def test_a_database_the_server_does_not_have_is_named_with_how_to_create_it(
    postgres_server: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = postgres_server.set(database="svledger_never_created")
    url = missing.render_as_string(hide_password=False)
    assert main(["history", "core.pods", "--db", url]) == 69
    error = capsys.readouterr().err
    assert 'database "svledger_never_created" does not exist' in error
    assert 'CREATE DATABASE "svledger_never_created"' in error
    assert "svledger db upgrade" in error


def test_a_user_the_server_does_not_have_is_named_with_how_to_create_it(
    postgres_server: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    stranger = postgres_server.set(username="svledger_never_created", password="pw")
    url = stranger.render_as_string(hide_password=False)
    assert main(["history", "core.pods", "--db", url]) == 69
    error = capsys.readouterr().err
    assert 'role "svledger_never_created" does not exist' in error
    assert """CREATE ROLE "svledger_never_created" LOGIN PASSWORD '...'""" in error
    assert "CREATE DATABASE" not in error
