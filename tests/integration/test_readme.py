"""The README's reporter example runs, as written, against the real broker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ledger.events import type_name
from ledger.kafka import EventConsumer
from ledger.settings import KafkaSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


async def test_reporter_example_runs_against_the_broker(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    (example,) = python_blocks(README.read_text())
    # A process of its own, as a user runs it: asyncio.run at module level, env settings.
    result = subprocess.run(
        [sys.executable, "-c", example],
        env={"SVLEDGER_KAFKA_BOOTSTRAP": kafka_bootstrap, "SVLEDGER_TOPIC": unique_topic},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr

    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic)
    async with EventConsumer(settings, until="end") as consumer:
        types = [type_name(record.event) async for record in consumer]
    assert types == ["ApiserverHeartbeat", "StorageVersionReported", "ApiserverLeaseReleased"]
