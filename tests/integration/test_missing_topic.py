"""A topic that does not exist is reported at once, once, in the ledger's own words.

Every reader checks for the topic before its Kafka client would wait for it: a client
asked for an unknown topic retries for its whole request timeout (40 s), logging an
error per metadata attempt, before it gives up.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger.settings import KafkaSettings

# Far below the client's 40 s request timeout, far above a normal start: a run past it
# waited for the topic instead of asking whether it exists.
_WAITED_FOR_THE_TOPIC = 25.0


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "--db", "sqlite:///{tmp}/replay.db"],
        ["replay", "--db", "sqlite:///{tmp}/replay.db", "--cluster", "prod-eu-1"],
        ["project", "--db", "sqlite:///{tmp}/project.db"],
        ["migrator"],
        ["lease-gc"],
    ],
    ids=["replay", "replay-cluster", "project", "migrator", "lease-gc"],
)
def test_a_missing_topic_is_one_clear_line(
    command: list[str], kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    argv = [part.format(tmp=tmp_path) for part in command]
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "svledger",
            *argv,
            "--bootstrap",
            kafka_bootstrap,
            "--topic",
            unique_topic,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    elapsed = time.monotonic() - started

    assert done.returncode == 69, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"svledger: error: topic {unique_topic!r} does not exist on {kafka_bootstrap!r}: "
        "create it first (`svledger topics create`) or check SVLEDGER_TOPIC"
    ]
    assert elapsed < _WAITED_FOR_THE_TOPIC


@pytest.mark.parametrize("reader", ["topic_partitions", "create_topics"])
async def test_an_unreachable_broker_is_broker_unavailable_naming_it(
    reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens on port 1; connect's patience is cut to a second for the test.
    from ledger import kafka

    patient = kafka.connect

    async def impatient(make, settings, *, timeout=30.0):  # type: ignore[no-untyped-def]
        return await patient(make, settings, timeout=1.0)

    monkeypatch.setattr(kafka, "connect", impatient)
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic="svledger.events")
    with pytest.raises(kafka.BrokerUnavailable, match=r"cannot reach Kafka at '127\.0\.0\.1:1'"):
        await getattr(kafka, reader)(settings)
