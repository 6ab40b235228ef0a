"""Writers of one SQLite file take turns instead of failing each other.

SQLite lets one connection write at a time. A transaction that reads before it writes
(each of svledger's writers does) and finds another writer's commit since its read
cannot wait its turn: it has to begin as a writer (``BEGIN IMMEDIATE``) to wait.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import delete, select

from projections import database, store
from projections.schema import database_identity


def test_upgrades_of_one_file_at_once_all_succeed(tmp_path: Path) -> None:
    # As projectors started together do, each upgrading the schema first.
    url = f"sqlite:///{tmp_path / 'views.db'}"
    upgrades = [
        subprocess.Popen(
            [sys.executable, "-m", "svledger", "db", "upgrade", "--db", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    for upgrade in upgrades:
        _, stderr = upgrade.communicate(timeout=120)
        assert upgrade.returncode == 0, stderr
    database.engine(url).dispose()  # at the head revision, or this refuses it


def test_writers_that_read_first_wait_for_each_other(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'views.db'}"
    database.upgrade(url)
    db = database.engine(url)
    try:
        with db.begin() as connection:
            connection.execute(delete(database_identity))  # emptied by hand, say
        barrier = threading.Barrier(6)
        found: list[str] = []
        failed: list[BaseException] = []

        def start() -> None:  # as a projector starts: its database's ID, made if missing
            try:
                barrier.wait()
                with database.writing(db).connect() as connection:
                    found.append(store.database_id(connection))
            except BaseException as error:
                failed.append(error)

        threads = [threading.Thread(target=start) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not failed
        with db.connect() as connection:
            [(made,)] = connection.execute(select(database_identity.c.database_id)).all()
        assert found == [made] * 6
    finally:
        db.dispose()
