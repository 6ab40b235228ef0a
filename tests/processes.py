"""svledger commands run as processes of their own, as an operator runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ledger.settings import KafkaSettings

ROOT = Path(__file__).resolve().parents[1]


def svledger(
    *arguments: str, settings: KafkaSettings, log: Path, log_format: str = "json"
) -> subprocess.Popen[bytes]:
    """``svledger ARGUMENTS`` on ``settings``' broker and topic (as their variables say),
    from this checkout; its logs appended to ``log``, in ``log_format``."""
    environment = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        SVLEDGER_KAFKA_BOOTSTRAP=settings.bootstrap_servers,
        SVLEDGER_TOPIC=settings.topic,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "svledger", "--log-format", log_format, *arguments],
        cwd=ROOT,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )
