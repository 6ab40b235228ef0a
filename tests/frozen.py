"""A PostgreSQL database that takes connections and answers nothing, as when its host
stalls: its server processes stopped with SIGSTOP (the ``frozen`` fixture of
``tests/conftest.py`` lets them go on when the test ends, however it ends)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine, text


def parent_of(pid: int) -> int:
    """The parent process of ``pid`` (``/proc``): a backend's is PostgreSQL's postmaster."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


def freeze_database(db: Engine, frozen: list[int]) -> None:
    """Stop (SIGSTOP) every server process of ``db`` and its postmaster, adding their
    PIDs to ``frozen``; skip the test unless the server is the tests' own (a server
    named by ``SVLEDGER_TEST_DATABASE_URL`` may serve others, or run elsewhere)."""
    if os.environ.get("SVLEDGER_TEST_DATABASE_URL"):
        pytest.skip("PostgreSQL is not the tests' own: it is not frozen")
    with db.connect() as connection:
        mine = connection.scalar(text("SELECT pg_backend_pid()"))
        if not Path(f"/proc/{mine}").exists():
            pytest.skip("PostgreSQL runs on another host: its processes cannot be frozen")
        postmaster = parent_of(mine)
        backends = connection.scalars(
            text(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).all()
    db.dispose()
    for pid in [postmaster, *backends]:
        with contextlib.suppress(ProcessLookupError):  # a backend ended meanwhile
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)


def asked(frozen: list[int]) -> bool:
    """Whether a client has sent the frozen processes what they have not read (a query, a
    connection waiting to be accepted): the Recv-Q of their sockets, as ``ss`` lists it."""
    listing = subprocess.run(["ss", "-xpH"], capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        fields = line.split()
        if int(fields[2]) > 0 and any(f"pid={pid}," in line for pid in frozen):
            return True
    return False
