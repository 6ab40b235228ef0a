"""The embedded default from a base install: ``pip install svledger``, no extras, SQLite.

A fresh virtualenv gets the package without its ``postgres`` or ``test`` extras (so
without psycopg), and the commands a newcomer runs first work on SQLite against the
real broker: ``db upgrade``, ``project``, ``replay``, ``history``, ``explain``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from ledger.kafka import create_topics
from projections.schema import projection_checkpoints
from tests.integration.test_projector import append, kafka_settings
from tests.workloads import mixed_events

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 400


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv with ``pip install .`` and nothing else; its ``bin`` directory."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # A copy of the tree without build leftovers, so the install builds from the sources.
    source = tmp_path_factory.mktemp("src") / "svledger"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".venv*", ".git", "*.egg-info", "build", ".svledger", "lib"),
    )
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-input",
            str(source),
        ],
        check=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    yield venv / "bin"


def run(bin_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "svledger"), "--log-format", "text", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=bin_dir,
    )


async def test_the_sqlite_path_works_without_extras(
    base_venv: Path, kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    python = str(base_venv / "python")
    missing = subprocess.run([python, "-c", "import psycopg"], capture_output=True, text=True)
    assert missing.returncode != 0, "the base install must not bring psycopg"

    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=2)
    await create_topics(settings)
    await append(settings, mixed_events(EVENTS, clusters=2, seed=11))
    kafka = ["--bootstrap", kafka_bootstrap, "--topic", unique_topic]
    views = f"sqlite:///{tmp_path / 'views.db'}"

    upgraded = run(base_venv, "db", "upgrade", "--db", views)
    assert upgraded.returncode == 0, upgraded.stderr

    projector = subprocess.Popen(
        [str(base_venv / "svledger"), "project", "--db", views, *kafka],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    engine = create_engine(views)
    try:
        deadline = time.monotonic() + 120
        projected = 0
        while projected < EVENTS and time.monotonic() < deadline and projector.poll() is None:
            time.sleep(0.5)
            with engine.connect() as connection:
                # Every record read (plain renewals are counted, not logged one by one).
                projected = connection.execute(
                    select(func.coalesce(func.sum(projection_checkpoints.c.next_offset), 0))
                ).scalar_one()
    finally:
        projector.send_signal(signal.SIGTERM)
        _, projector_log = projector.communicate(timeout=60)
        engine.dispose()
    assert projector.returncode == 0, projector_log
    assert projected == EVENTS, projector_log

    replayed = run(base_venv, "replay", "--db", f"sqlite:///{tmp_path / 'replay.db'}", *kafka)
    assert replayed.returncode == 0, replayed.stderr
    assert f'"events": {EVENTS}' in replayed.stdout

    resource = ["apps.deployments", "--cluster", "cluster-000", "--db", views]
    told = run(base_venv, "history", *resource)
    assert told.returncode == 0, told.stderr
    assert "StorageVersionReported" in told.stdout
    explained = run(base_venv, "explain", *resource)
    assert explained.returncode == 0, explained.stderr
    assert "deployments" in explained.stdout
