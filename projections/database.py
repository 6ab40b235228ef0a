"""Connecting to the projection database and bringing its schema up to date.

Two backends, chosen by the URL: PostgreSQL (``postgresql://...``, driven by
psycopg 3) in production, SQLite (``sqlite:///path.db``) as the embedded default.
Alembic owns the schema; :func:`upgrade` applies its migrations without an
``alembic.ini`` and :func:`engine` refuses a database that is unreachable or not at
the schema this code expects, with an error that says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from ledger.errors import SvledgerError, Unavailable, UsageError
from projections.schema import json_text

MIGRATIONS: Final = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS: Final = 30_000

# Any constant works; it only has to be the same in every process that upgrades.
_UPGRADE_LOCK_ID: Final = 0x5_1ED6E5


class DatabaseNotReady(SvledgerError):
    """The projection database cannot be used as it is."""


class DatabaseUnreachable(DatabaseNotReady, Unavailable):
    pass


class DatabaseNotMigrated(DatabaseNotReady, UsageError):
    pass


# What SQLite says of a path that is no database file (a directory, a missing folder, a
# text file); waiting will not change it, unlike a server that is down or a lock.
_NOT_SQLITE_FILE: Final = ("unable to open database file", "file is not a database")


def upgrade(url: str) -> None:
    """Apply every migration the database lacks (``svledger db upgrade --db URL``).

    Idempotent; on PostgreSQL concurrent upgrades of one database queue on an
    advisory lock instead of racing to create the same tables.
    """
    db = _create_engine(url)
    try:
        try:  # read first: a database at the head needs no write lock (a writer may hold it)
            check_schema(db)
            return
        except DatabaseNotMigrated:
            pass
        with _connect(writing(db)) as connection, connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:id)"), {"id": _UPGRADE_LOCK_ID}
                )
            _refuse_newer(db.url, MigrationContext.configure(connection).get_current_heads())
            config = _alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        db.dispose()


def engine(url: str) -> Engine:
    """An engine on a reachable database whose schema is at this code's head revision."""
    db = _create_engine(url)
    if _missing_sqlite_file(db.url):
        # Connecting would create an empty file where the user mistyped a path.
        raise DatabaseNotMigrated(
            f"database file {db.url.database} does not exist: check the path, or create"
            " the database with `svledger db upgrade --db URL`"
        )
    try:
        check_schema(db)
    except BaseException:
        db.dispose()
        raise
    return db


def check_schema(db: Engine) -> None:
    """Raise :class:`DatabaseNotMigrated` unless ``db``'s schema is at this code's head
    revision (an older one, or a newer svledger's)."""
    with _connect(db) as connection:
        current = set(MigrationContext.configure(connection).get_current_heads())
    expected = set(ScriptDirectory.from_config(_alembic_config()).get_heads())
    if current != expected:
        _refuse_newer(db.url, current)
        found = ", ".join(sorted(current)) or "no schema"
        raise DatabaseNotMigrated(
            f"database {shown(db.url)} is at {found}, this svledger needs revision "
            f"{', '.join(sorted(expected))}; run `svledger db upgrade --db URL` first"
        )


def _refuse_newer(url: URL, current: Iterable[str]) -> None:
    """Refuse a schema at a revision this svledger does not know: a newer one wrote it,
    and neither upgrading it nor reading it here can be right."""
    scripts = ScriptDirectory.from_config(_alembic_config())
    known = {script.revision for script in scripts.walk_revisions()}
    unknown = sorted(set(current) - known)
    if unknown:
        raise DatabaseNotMigrated(
            f"database {shown(url)} is at revision {', '.join(unknown)}, which this "
            f"svledger does not know (its newest is {', '.join(sorted(scripts.get_heads()))}): "
            "a newer svledger wrote it; run that version, or upgrade this one"
        )


def _create_engine(url: str) -> Engine:
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = create_engine(parsed, json_serializer=json_text)
        event.listen(db, "connect", _configure_sqlite)
        event.listen(db, "begin", _begin_sqlite)
        return db
    return create_engine(parsed, pool_pre_ping=True)


def parse_url(url: str) -> URL:
    """The SQLAlchemy URL of a PostgreSQL or SQLite database; ValueError saying what to give."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as error:  # ValueError: a port that is no number
        reason = "" if isinstance(error, ArgumentError) else " (its port is not a number)"
        raise ValueError(
            f"database URL {_redacted(url)!r} is not a URL{reason}; use"
            " postgresql://USER:PASSWORD@HOST[:PORT]/DB or sqlite:///PATH.db"
        ) from None
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        return parsed
    raise ValueError(
        f"database URL {shown(parsed)} is neither PostgreSQL nor SQLite; "
        "use postgresql://USER:PASSWORD@HOST/DB or sqlite:///PATH.db"
    )


@contextmanager
def _connect(db: Engine) -> Iterator[Connection]:
    try:
        connection = db.connect()
    except DBAPIError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else str(error)
        if db.url.get_backend_name() == "sqlite" and reason in _NOT_SQLITE_FILE:
            folder = Path(db.url.database or "").parent
            if not folder.is_dir():
                raise DatabaseNotMigrated(
                    f"cannot open {shown(db.url)}: there is no folder {folder}; create it,"
                    " or give a path in a folder that exists"
                ) from error
            raise DatabaseNotMigrated(
                f"cannot open {shown(db.url)}: {reason}; give the path of a database "
                "file that `svledger db upgrade --db URL` created (it creates one where "
                "the folder exists)"
            ) from error
        postgresql = db.url.get_backend_name() == "postgresql"
        role = re.search(r'role "(.+)" does not exist', reason) if postgresql else None
        if role is not None:
            password = " PASSWORD '...'" if db.url.password else ""
            raise DatabaseUnreachable(
                f"cannot connect to database {shown(db.url)}: {reason}; give the URL a user"
                f" the server has, or create it (`CREATE ROLE {_identifier(role.group(1))}"
                f" LOGIN{password}` as a user who may, or `createuser`)"
            ) from error
        if postgresql and f'database "{db.url.database}" does not exist' in reason:
            raise DatabaseUnreachable(
                f"cannot connect to database {shown(db.url)}: {reason}; create it (`CREATE"
                f" DATABASE {_identifier(db.url.database or '')}` as a user who may, or"
                " `createdb`), then run"
                " `svledger db upgrade --db URL`"
            ) from error
        raise DatabaseUnreachable(
            f"cannot connect to database {shown(db.url)}: {reason}; check that it is "
            "running and the URL is right, then run `svledger db upgrade --db URL` if "
            "it is new"
        ) from error
    with connection:
        yield connection


def _identifier(name: str) -> str:
    """``name`` as PostgreSQL's SQL quotes an identifier (any case, any character)."""
    return '"' + name.replace('"', '""') + '"'


def _missing_sqlite_file(url: URL) -> bool:
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return False
    return not Path(url.database).exists()


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


# Query parameters libpq takes a secret in (``?password=...``), masked as the password is.
_SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})
_SECRET_QUERY: Final = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)


def shown(url: URL | str) -> str:
    """A database URL fit for logs and messages: its password masked, in the URL's
    credentials or its query, also in a URL that does not parse (and so in an address
    that is no URL, which has none)."""
    if isinstance(url, str):
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError):
            return _redacted(url)
        if "@" in (parsed.host or ""):  # an '@' left unquoted in the password
            return _redacted(url)
        url = parsed
    secrets = {key: "***" for key in url.query if key.lower() in _SECRET_PARAMETERS}
    rendered = url.update_query_dict(secrets).render_as_string(hide_password=True)
    return rendered.replace("=%2A%2A%2A", "=***")  # as the password's mask reads


def _redacted(text: str) -> str:
    """A database URL that does not parse, fit to print: whatever stands where a
    password would (after the user's ``:``, before the last ``@``, and the value of a
    secret query parameter) masked, as :func:`shown` masks a parsed URL's."""
    text = _SECRET_QUERY.sub(r"\1***", text)
    credentials, at, rest = text.rpartition("@")
    if not at:
        return text
    scheme, separator, user_info = credentials.rpartition("://")
    user, colon, _ = user_info.partition(":")
    return f"{scheme}{separator}{user}{':***' if colon else ''}@{rest}"


def one_snapshot(connection: Connection) -> Connection:
    """``connection``, set to read one snapshot of the database in each transaction.

    For a command that reads in several statements (``explain``: the views, then the
    history that led to them) while a projector commits batches. PostgreSQL's default,
    READ COMMITTED, shows each statement the batches committed before it began, so the
    views could come from one batch and the history from the next; REPEATABLE READ
    shows the whole transaction what was committed before its first statement. SQLite's
    transactions (:func:`_begin_sqlite`) read one snapshot already.
    """
    if connection.dialect.name == "postgresql":
        return connection.execution_options(isolation_level="REPEATABLE READ")
    return connection


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite opens transactions implicitly, and only before writes, so a read
    # followed by a write would not be one transaction. Taking over BEGIN
    # (in _begin_sqlite) makes SQLAlchemy's transactions real transactions.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers (history, explain) run while the projector writes.
        # synchronous=NORMAL may lose the last commits on power loss, never on a
        # process crash, and a lost commit loses its checkpoint with it, so the
        # projector re-reads those events: nothing is applied twice or lost.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


# The execution option :func:`writing` sets.
_WRITES: Final = "svledger_writes"


def writing(db: Engine) -> Engine:
    """A copy of ``db`` (the same pool) for transactions that write: on SQLite they take
    the write lock as they begin, waiting for another writer's up to the busy timeout.

    A transaction begun deferred takes the lock at its first write; if another
    connection has written since its first read, SQLite fails that write at once with
    "database is locked" (waiting could not help: its snapshot is stale), busy timeout
    or not. Every writer here reads first (the checkpoints it checks, the schema's
    revision), so two of them (projectors starting together, an upgrade beside a
    projector) failed each other. Readers stay deferred: one holding the lock for the
    length of a long read would stall the projector.
    """
    return db.execution_options(**{_WRITES: True})


def _begin_sqlite(connection: Connection) -> None:
    writes = connection.get_execution_options().get(_WRITES, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")
