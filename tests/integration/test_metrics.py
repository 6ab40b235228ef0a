"""``--metrics-address``: a long-running command's /metrics, scraped and parsed as Prometheus does.

The projector and the read API run as processes over a real topic, their endpoints on
a port the system picks (found in the JSON log); their metrics are read over HTTP with
prometheus_client's own parser. Every partition of the log ends in a transaction's
commit marker, as it does once any consumer has appended: lag must still fall to 0.
The projector is kept from committing at first (another connection holds SQLite's
write lock), so its lag is seen above 0 and nothing is counted as folded until its
batches commit. The consumers run in this process and are scraped from another
thread, as the exposition server scrapes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumers.lease_gc import run_lease_gc
from consumers.migrator import run_migrator
from ledger.clock import SystemClock
from ledger.events import ApiserverHeartbeat, Meta, Position
from ledger.identity import apiserver_id
from ledger.kafka import EventProducer, PartitionProducer, create_topics, partition_of
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings
from projections import database
from projections.projector import Projection, fold_batch
from projections.state import State
from tests.consumed import consumed_log
from tests.integration.test_projector import CATCH_UP_DEADLINE_SECONDS
from tests.workloads import START, mixed_events

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parsed(text: str) -> tuple[set[str], Samples]:
    """The metric families and the samples of an exposition."""
    families = list(text_string_to_metric_families(text))
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }
    return {family.name for family in families}, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def lags(samples: Samples, reader: str) -> dict[str, float]:
    return {
        dict(labels)["partition"]: value
        for (name, labels), value in samples.items()
        if name == "svledger_consumer_lag_records" and dict(labels)["reader"] == reader
    }


# --------------------------------------------------------------------------- the log


async def fill(settings: KafkaSettings, count: int, seed: int) -> tuple[int, int]:
    """Append ``count`` events, one undecodable record, and a transaction per partition.

    Returns the events the projector folds and how many of them its fold rejects.
    """
    events = list(mixed_events(count, clusters=4, seed=seed))
    async with EventProducer(settings) as producer:
        await producer.send_many(events)
    raw = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await raw.start()
    try:
        await raw.send_and_wait(settings.topic, b"garbage", key=events[0].meta.cluster.encode())
    finally:
        await raw.stop()
    transactional = await end_in_transactions(settings, f"s{seed}")
    records = consumed_log((e, Position(0, i)) for i, e in enumerate(events))
    rejected = fold_batch(Projection("views", settings.topic, State(), {}), records).result.rejected
    return len(events) + transactional, rejected


async def end_in_transactions(settings: KafkaSettings, name: str) -> int:
    """Append a heartbeat to every partition in a transaction, as consumers append."""
    appended = 0
    for partition in range(PARTITIONS):
        cluster = next(
            f"{name}-{i}"
            for i in range(1000)
            if partition_of(f"{name}-{i}", range(PARTITIONS)) == partition
        )
        apiserver = apiserver_id(f"{cluster}-host")
        heartbeat = ApiserverHeartbeat(
            Meta.new(cluster, apiserver, START), apiserver, f"{apiserver}_1", "host", 3600, START
        )
        producer = PartitionProducer(
            settings, partition, f"{settings.topic}.test-{partition}", f"{settings.topic}.test"
        )
        await producer.start()
        try:
            await producer.append([heartbeat], consumed=0)
        finally:
            await producer.stop()
        appended += 1
    return appended


@pytest.fixture
def topic(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=PARTITIONS
    )


# --------------------------------------------------------------------------- a command


class Command:
    """``svledger ARGS --metrics-address 127.0.0.1:0`` in a process of its own."""

    def __init__(self, arguments: list[str], settings: KafkaSettings, log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "svledger", *arguments,
                "--bootstrap", settings.bootstrap_servers, "--topic", settings.topic,
                "--metrics-address", "127.0.0.1:0",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
        )  # fmt: skip
        self.url = f"http://{self._bound_address()}/metrics"

    def _bound_address(self) -> str:
        """The address the endpoint listens on, from the command's JSON log."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    address: str | None = json.loads(line).get("metrics_address")
                    if address:
                        return address
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.05)
        raise AssertionError(f"no metrics address logged: {self.log.read_text()[-3000:]}")

    def scrape(self) -> tuple[set[str], Samples]:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            return parsed(response.read().decode())

    def wait_for(self, what: str, done: Callable[[Samples], bool]) -> Samples:
        deadline = time.monotonic() + CATCH_UP_DEADLINE_SECONDS
        samples: Samples = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, ConnectionError):
                _, samples = self.scrape()
            if done(samples):
                return samples
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.1)
        svledger = {k: v for k, v in samples.items() if k[0].startswith("svledger_")}
        raise AssertionError(f"not {what}: {svledger}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(60) == 0, self.log.read_text()[-3000:]


@contextlib.contextmanager
def running(arguments: list[str], settings: KafkaSettings, log: Path) -> Iterator[Command]:
    command = Command(arguments, settings, log)
    try:
        yield command
    finally:
        if command.process.poll() is None:
            command.stop()


def caught_up(reader: str, folded: int) -> Callable[[Samples], bool]:
    def done(samples: Samples) -> bool:
        partitions = lags(samples, reader)
        return (
            value(samples, "svledger_events_folded_total", reader=reader) == folded
            and len(partitions) == PARTITIONS
            and not any(partitions.values())
        )

    return done


# --------------------------------------------------------------------------- the tests


def lock_for_writing(db_file: Path) -> sqlite3.Connection:
    """SQLite's write lock, held by another connection until it is closed: readers go
    on, writers wait (up to the projector's busy timeout of 30 s)."""
    connection = sqlite3.connect(db_file, isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    return connection


async def test_the_projectors_lag_falls_to_zero_once_its_batches_commit(
    topic: KafkaSettings, tmp_path: Path
) -> None:
    await create_topics(topic)
    # More than one poll's worth (20000 records), so the first poll leaves some unread.
    folded, rejected = await fill(topic, 25_000, seed=1)
    db_url = f"sqlite:///{tmp_path / 'views.db'}"
    database.upgrade(db_url)
    lock = lock_for_writing(tmp_path / "views.db")
    with running(["project", "--db", db_url], topic, tmp_path / "project.log") as projector:
        try:
            families, _ = projector.scrape()
            assert {
                "svledger_consumer_lag_records",
                "svledger_events_folded",
                "svledger_events_rejected",
                "svledger_records_dead_lettered",
                "svledger_kube_requests",
            } <= families
            samples = projector.wait_for(
                "lagging", lambda samples: sum(lags(samples, "projector").values()) > 0
            )
            # Read, but not in the views: not counted as folded.
            assert not value(samples, "svledger_events_folded_total", reader="projector")
        finally:
            lock.close()
        samples = projector.wait_for("caught up", caught_up("projector", folded))
        assert value(samples, "svledger_events_rejected_total", reader="projector") == rejected
        assert value(samples, "svledger_records_dead_lettered_total", topic=topic.topic) == 1

        # Live: more events, and a consumer's transaction after them.
        more = list(mixed_events(500, clusters=4, seed=2))
        async with EventProducer(topic) as producer:
            await producer.send_many(more)
        folded += len(more) + await end_in_transactions(topic, "live")
        projector.wait_for("caught up again", caught_up("projector", folded))


async def test_the_read_apis_lag_falls_to_zero_and_it_counts_every_event(
    topic: KafkaSettings, tmp_path: Path
) -> None:
    await create_topics(topic)
    folded, _ = await fill(topic, 3_000, seed=3)
    arguments = ["serve", "--address", "127.0.0.1:0"]
    with running(arguments, topic, tmp_path / "serve.log") as serve:
        serve.wait_for("caught up", caught_up("serve", folded))


def scraped_from_another_thread() -> Samples:
    return parsed(generate_latest(REGISTRY).decode())[1]


async def wait_until(what: str, done: Callable[[Samples], bool]) -> Samples:
    deadline = asyncio.get_running_loop().time() + CATCH_UP_DEADLINE_SECONDS
    while True:
        samples = await asyncio.to_thread(scraped_from_another_thread)
        if done(samples):
            return samples
        svledger = {k: v for k, v in samples.items() if k[0].startswith("svledger_")}
        assert asyncio.get_running_loop().time() < deadline, f"not {what}: {svledger}"
        await asyncio.sleep(0.1)


def pods(version: str) -> ResourceReport:
    return ResourceReport("", "pods", "Pod", version, ("v1", "v2"), ("v1", "v2"))


async def test_the_migrator_and_lease_gc_show_migrations_reactions_and_heartbeats(
    topic: KafkaSettings, unique_topic: str
) -> None:
    await create_topics(topic)
    migrator, gc = f"{unique_topic}.migrator", f"{unique_topic}.gc"
    reactions = REGISTRY.get_sample_value("svledger_reaction_seconds_count") or 0.0
    apiservers = {apiserver_id(f"cp-{i}") for i in range(2)}
    stop = asyncio.Event()
    consumers: list[asyncio.Task[None]] = []
    try:
        async with EventProducer(topic) as producer:
            reporters = [Reporter("east", f"cp-{i}", [pods("v1")], producer) for i in range(2)]
            # Both report before the migrator starts, so it requests one migration, not
            # one per apiserver joining (each join is a new StorageVersion revision).
            for reporter in reporters:
                await reporter.start()
            consumers += [
                asyncio.create_task(run_migrator(topic, stop=stop, group_id=migrator)),
                asyncio.create_task(
                    run_lease_gc(topic, stop=stop, clock=SystemClock(), group_id=gc)
                ),
            ]

            def requested(samples: Samples) -> bool:
                # The lag is measured against the end the last fetch saw, which may
                # precede the migrator's own transaction: its fold has read the request
                # back once the gauge counts the cluster's migrations at all.
                partitions = lags(samples, migrator)
                appended = value(
                    samples,
                    "svledger_events_appended_total",
                    reader=migrator,
                    type="MigrationRequested",
                )
                read_back = value(samples, "svledger_migrations", cluster="east", phase="Failed")
                return (
                    appended == 1
                    and read_back is not None
                    and bool(partitions)
                    and not any(partitions.values())
                )

            samples = await wait_until("requested", requested)
            assert value(samples, "svledger_migrations", cluster="east", phase="Pending") == 1
            assert value(samples, "svledger_migrations", cluster="east", phase="Failed") == 0
            assert samples[("svledger_reaction_seconds_count", ())] == reactions + 1
            ages = {
                labels: age
                for (name, labels), age in samples.items()
                if name == "svledger_heartbeat_age_seconds"
            }
            assert {dict(labels)["apiserver"] for labels in ages} == apiservers
            assert all(0 <= age < 60 for age in ages.values())

            # Released leases leave the fold, and the metric.
            for reporter in reporters:
                await reporter.stop()
            await wait_until(
                "released",
                lambda samples: (
                    not any(name == "svledger_heartbeat_age_seconds" for name, _ in samples)
                ),
            )
    finally:
        stop.set()
        await asyncio.gather(*consumers)
    # A consumer that stopped shows no lag any more.
    assert lags(await asyncio.to_thread(scraped_from_another_thread), migrator) == {}


async def test_a_service_logs_where_its_tasks_wait_on_sigusr1_and_goes_on(
    topic: KafkaSettings, tmp_path: Path
) -> None:
    await create_topics(topic)
    log = tmp_path / "lease-gc.log"
    with running(["lease-gc"], topic, log) as gc:
        gc.wait_for(
            "following", lambda samples: len(lags(samples, "svledger-lease-gc")) == PARTITIONS
        )
        gc.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        dumps: list[str] = []
        while not dumps and time.monotonic() < deadline:
            time.sleep(0.1)
            lines = [json.loads(line) for line in log.read_text().splitlines() if line]
            dumps = [line["message"] for line in lines if line["logger"] == "ledger.tasks"]
        assert dumps, log.read_text()[-3000:]
        (dump,) = dumps
        assert "asyncio tasks:" in dump.splitlines()[0]
        # The service's own task, down through the lease GC into the follower's poll.
        assert "consumers/lease_gc.py:" in dump, dump
        assert "consumers/partitions.py:" in dump, dump
        gc.stop()  # SIGTERM still stops it cleanly (exit 0)
