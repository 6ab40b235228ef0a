"""``--metrics-address``: a long-running command's /metrics, scraped and parsed as Prometheus does.

The projector and the read API run as processes over a real topic; their metrics are
read with prometheus_client's own parser. Lag falls to 0 once they have caught up,
and the events folded are the events in the log, also after more are appended.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from tests.workloads import mixed_events

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def reader_values(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], reader: str
) -> tuple[float, dict[str, float]]:
    folded = samples.get(("svledger_events_folded_total", (("reader", reader),)), 0.0)
    lags = {
        dict(labels)["partition"]: value
        for (name, labels), value in samples.items()
        if name == "svledger_consumer_lag_records" and dict(labels)["reader"] == reader
    }
    return folded, lags


def wait_for(port: int, reader: str, folded: int, partitions: int) -> dict[str, float]:
    deadline = time.monotonic() + 90
    last: tuple[float, dict[str, float]] = (0.0, {})
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, ConnectionError):
            last = reader_values(scrape(port), reader)
        if last[0] == folded and len(last[1]) == partitions and not any(last[1].values()):
            return last[1]
        time.sleep(0.3)
    raise AssertionError(f"{reader}: folded {last[0]} of {folded}, lags {last[1]}")


async def append(settings: KafkaSettings, count: int, seed: int) -> None:
    async with EventProducer(settings) as producer:
        await producer.send_many(mixed_events(count, clusters=4, seed=seed))


@pytest.fixture
def topic(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)


@pytest.fixture(params=["project", "serve"])
def command(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[list[str], str]]:
    if request.param == "project":
        yield ["project", "--db", f"sqlite:///{tmp_path}/views.db"], "projector"
    else:
        yield ["serve", "--address", f"127.0.0.1:{free_port()}"], "serve"


async def test_lag_falls_to_zero_and_every_event_is_counted(
    topic: KafkaSettings, command: tuple[list[str], str]
) -> None:
    await create_topics(topic)
    await append(topic, 3000, seed=1)
    arguments, reader = command
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "svledger", *arguments,
            "--bootstrap", topic.bootstrap_servers, "--topic", topic.topic,
            "--metrics-address", f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        lags = wait_for(port, reader, 3000, partitions=2)
        assert set(lags) == {"0", "1"}
        await append(topic, 500, seed=2)
        wait_for(port, reader, 3500, partitions=2)
        if reader == "projector":
            phases = {
                dict(labels)["phase"]
                for (name, labels) in scrape(port)
                if name == "svledger_migrations"
            }
            assert phases == {"Pending", "Running", "Succeeded", "Failed", "Cancelled"}
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()[-2000:]
