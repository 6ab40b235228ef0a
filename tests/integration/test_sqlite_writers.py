"""Writers of one SQLite file take turns instead of failing each other.

SQLite lets one connection write at a time. A transaction that reads before it writes
(each of svledger's writers does) and finds another writer's commit since its read
cannot wait its turn: it has to begin as a writer (``BEGIN IMMEDIATE``) to wait.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from projections import database


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
