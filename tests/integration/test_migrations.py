"""The projection schema on a real database: what ``svledger db upgrade`` builds, and
how :func:`projections.database.engine` refuses a database it cannot use."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, insert, inspect, select, text
from sqlalchemy.engine import make_url

from projections import database
from projections.schema import metadata, projection_checkpoints, server_storage_versions
from projections.store import load_state


def test_upgrade_builds_exactly_the_schema_the_code_uses(database_url: str) -> None:
    database.upgrade(database_url)
    db = database.engine(database_url)
    try:
        with db.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, metadata) == []
            assert set(inspect(connection).get_table_names()) == {
                *metadata.tables,
                "alembic_version",
            }
    finally:
        db.dispose()


def test_upgrade_is_idempotent_and_keeps_the_data(database_url: str) -> None:
    database.upgrade(database_url)
    db = database.engine(database_url)
    checkpoint = {
        "projection": "p",
        "topic": "t",
        "log_partition": 0,
        "next_offset": 7,
        "log_time": None,  # as a checkpoint from before log times were kept: unknown
    }
    try:
        with db.begin() as connection:
            connection.execute(insert(projection_checkpoints), checkpoint)
        database.upgrade(database_url)
        with db.connect() as connection:
            rows = connection.execute(select(projection_checkpoints)).mappings().all()
            assert [dict(row) for row in rows] == [checkpoint]
    finally:
        db.dispose()


def test_entries_of_an_older_database_keep_their_order(database_url: str) -> None:
    # Before 0004 the entries had no ordinal and were listed by apiserver ID: the
    # upgrade numbers them in that order, so the views list them as before.
    db = create_engine(database_url)
    try:
        with db.begin() as connection:
            config = database._alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, "0003")
            connection.execute(
                text(
                    "INSERT INTO storage_versions (cluster, api_group, resource, name, kind,"
                    " common_encoding_version, condition_type, condition_status,"
                    " condition_reason, condition_message, condition_last_transition_time,"
                    " revision) VALUES ('c', 'apps', 'deployments', 'apps.deployments',"
                    " 'Deployment', NULL,"
                    " 'AllEncodingVersionsEqual', 'False', 'CommonEncodingVersionUnset',"
                    " 'Common encoding version unset', :now, '0:3')"
                ),
                {"now": datetime(2024, 1, 1, tzinfo=UTC)},
            )
            for apiserver_id in ("b", "c", "a"):
                connection.execute(
                    text(
                        "INSERT INTO server_storage_versions (cluster, api_group, resource,"
                        " apiserver_id, encoding_version, decodable_versions, served_versions)"
                        " VALUES ('c', 'apps', 'deployments', :id, 'apps/v1',"
                        " '[\"apps/v1\"]', '[\"apps/v1\"]')"
                    ),
                    {"id": apiserver_id},
                )
    finally:
        db.dispose()
    database.upgrade(database_url)
    db = database.engine(database_url)
    try:
        with db.connect() as connection:
            [storage_version] = load_state(connection).storage_versions.values()
            ordinals = connection.execute(
                select(server_storage_versions.c.apiserver_id, server_storage_versions.c.ordinal)
            ).all()
    finally:
        db.dispose()
    assert [entry.apiserver_id for entry in storage_version.entries] == ["a", "b", "c"]
    assert sorted(ordinals) == [("a", 0), ("b", 1), ("c", 2)]


def test_rows_of_an_older_database_are_created_by_their_last_change(database_url: str) -> None:
    # Before 0009 rows had no creation and there was no clusters table: the upgrade
    # gives a row its last change's position and logged time (a lease renewed by a plain
    # renewal, not logged: its renew time), and lists the clusters ledger_events has.
    logged = datetime(2024, 1, 1, 0, 0, 3, tzinfo=UTC)
    renewed = datetime(2024, 1, 1, 0, 0, 9, tzinfo=UTC)
    db = create_engine(database_url)
    try:
        with db.begin() as connection:
            config = database._alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, "0008")
            connection.execute(
                text(
                    "INSERT INTO storage_states (cluster, api_group, resource, name,"
                    " persisted_storage_version_hashes, current_storage_version_hash, revision)"
                    " VALUES ('c', 'apps', 'deployments', 'deployments.apps', '[\"Unknown\"]',"
                    " NULL, '0:3')"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO apiserver_leases (cluster, apiserver_id, holder_identity,"
                    " hostname, lease_duration_seconds, renew_time, revision) VALUES ('c',"
                    " 'apiserver-a', 'apiserver-a_1', 'host-a', 3600, :renewed, '0:9')"
                ),
                {"renewed": renewed},
            )
            connection.execute(
                text(
                    "INSERT INTO ledger_events (topic, log_partition, log_offset, cluster,"
                    " event_id, event_type, subject, occurred_at, source, payload, outcome)"
                    " VALUES ('t', 0, 3, 'c', 'e-3', 'StorageVersionReported',"
                    " 'apps.deployments', :logged, 'apiserver-a', '{}', 'applied')"
                ),
                {"logged": logged},
            )
    finally:
        db.dispose()
    database.upgrade(database_url)
    db = database.engine(database_url)
    try:
        with db.connect() as connection:
            state = load_state(connection)
    finally:
        db.dispose()
    [storage_state] = state.storage_states.values()
    [lease] = state.leases.values()
    assert (storage_state.created_revision, storage_state.created_at) == ("0:3", logged)
    assert (lease.created_revision, lease.created_at) == ("0:9", renewed)
    [cluster] = state.clusters.values()
    assert (cluster.cluster, cluster.partition, cluster.latest_occurred_at) == ("c", 0, logged)


def test_plain_postgresql_urls_are_driven_by_psycopg(postgres_url: str) -> None:
    plain = make_url(postgres_url).set(drivername="postgresql")
    database.upgrade(plain.render_as_string(hide_password=False))
    db = database.engine(plain.render_as_string(hide_password=False))
    try:
        assert db.dialect.driver == "psycopg"
    finally:
        db.dispose()


def test_engine_refuses_a_database_that_was_not_upgraded(database_url: str) -> None:
    if database_url.startswith("sqlite"):
        # An existing but empty SQLite file, as a reader opening it first would find it.
        path = make_url(database_url).database
        assert path is not None
        Path(path).touch()
    with pytest.raises(database.DatabaseNotMigrated) as raised:
        database.engine(database_url)
    message = str(raised.value)
    assert "svledger db upgrade" in message
    assert str(make_url(database_url).database) in message


def test_engine_does_not_create_a_mistyped_sqlite_file(sqlite_url: str) -> None:
    path = make_url(sqlite_url).database
    assert path is not None
    with pytest.raises(database.DatabaseNotMigrated, match="does not exist: check the path"):
        database.engine(sqlite_url)
    assert not Path(path).exists()


def test_engine_names_an_unreachable_server_without_its_password() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://svledger:s3cret@127.0.0.1:{port}/views"
    with pytest.raises(database.DatabaseUnreachable) as raised:
        database.engine(url)
    message = str(raised.value)
    assert f"127.0.0.1:{port}/views" in message
    assert "s3cret" not in message
    assert "svledger db upgrade" in message


def test_urls_of_other_databases_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="mysql://svledger:\\*\\*\\*@db/views"):
        database.engine("mysql://svledger:s3cret@db/views")


def test_sqlite_lets_a_writer_commit_under_an_open_read(sqlite_url: str) -> None:
    database.upgrade(sqlite_url)
    db = database.engine(sqlite_url)
    checkpoint = {"projection": "p", "topic": "t", "log_partition": 0, "next_offset": 1}
    try:
        with db.connect() as reader, db.connect() as writer:
            with reader.begin():
                assert reader.execute(select(projection_checkpoints)).all() == []
                # A rollback journal would make this commit wait for the reader.
                with writer.begin():
                    writer.execute(insert(projection_checkpoints), checkpoint)
                # The reader's transaction keeps the snapshot it started with.
                assert reader.execute(select(projection_checkpoints)).all() == []
            assert len(reader.execute(select(projection_checkpoints)).all()) == 1
    finally:
        db.dispose()
