"""A topic that does not exist is reported at once, once, in the ledger's own words.

Every reader checks for the topic before its Kafka client would wait for it: a client
asked for an unknown topic retries for its whole request timeout (40 s), logging an
error per metadata attempt, before it gives up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from deploy.kafka.broker import LocalKafka
from ledger.events import Meta, StorageStateReset
from ledger.kafka import (
    TOPIC_CONFIG,
    EventProducer,
    TopicMissing,
    create_topics,
    topic_partitions,
)
from ledger.reporter import Reporter, ResourceReport
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
        ["collect", "--fleet", "{tmp}/fleet.yaml"],
    ],
    ids=["replay", "replay-cluster", "project", "migrator", "lease-gc", "collect-fleet"],
)
def test_a_missing_topic_is_one_clear_line(
    command: list[str], kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    # A fleet of one cluster that is never reached: the topic is missed first.
    (tmp_path / "fleet.yaml").write_text(
        "contexts: [{name: prod-eu-1, context: {cluster: prod-eu-1, user: admin}}]\n"
    )
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


async def test_a_fleet_collector_without_the_placement_topic_stops_saying_how_to_make_it(
    kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    """A ledger from before placements: the collector would write a cluster's first event
    unplaced, so it stops at once rather than collect nothing for ever."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(unique_topic, 3, 1, topic_configs=TOPIC_CONFIG)])
    finally:
        await admin.close()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("contexts: [{name: prod-eu-1, context: {cluster: c, user: u}}]\n")
    argv = ["collect", "--fleet", str(fleet), "--bootstrap", kafka_bootstrap]
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "svledger", *argv, "--topic", unique_topic],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 69, done.stderr
    assert f"{unique_topic}.placement" in done.stderr
    assert "svledger topics create" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize("reader", ["topic_partitions", "create_topics"])
async def test_an_unreachable_broker_is_broker_unavailable_naming_it(
    reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens on port 1; connect's patience is cut to a second for the test
    # (in the module that calls it).
    from ledger import kafka
    from ledger.kafka import topics

    patient = topics.connect

    async def impatient(make, settings, *, timeout=30.0):  # type: ignore[no-untyped-def]
        return await patient(make, settings, timeout=1.0)

    monkeypatch.setattr(topics, "connect", impatient)
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic="svledger.events")
    with pytest.raises(kafka.BrokerUnavailable, match=r"cannot reach Kafka at '127\.0\.0\.1:1'"):
        await getattr(kafka, reader)(settings)


def topics_create(
    bootstrap: str, topic: str, **environment: str
) -> subprocess.CompletedProcess[str]:
    """``svledger topics create`` of ``topic``, with ``environment`` set too."""
    argv = ["topics", "create", "--bootstrap", bootstrap, "--topic", topic]
    return subprocess.run(
        [sys.executable, "-m", "svledger", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **environment},
    )


async def test_a_producer_asks_for_its_topic_and_never_has_it_created() -> None:
    # Kafka's default broker creates a topic a client asks metadata of, with the broker's
    # defaults (one partition, seven days' retention): history would silently expire.
    broker = LocalKafka(overrides={"auto.create.topics.enable": "true"}).start()
    try:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic="svledger.events")
        event = StorageStateReset(Meta.new("prod", "test", datetime.now(UTC)), "", "pods", "r")
        async with EventProducer(settings) as producer:
            with pytest.raises(TopicMissing, match="svledger topics create"):
                await producer.send(event)
        with pytest.raises(TopicMissing):
            await topic_partitions(settings)
        guarded = dataclasses.replace(settings, inbox=True)  # its inbox, as admission guards
        async with EventProducer(guarded) as producer:
            with pytest.raises(TopicMissing, match=r"`svledger topics create --inbox prod`"):
                await producer.send(event)
    finally:
        broker.stop()


@pytest.mark.parametrize(
    "config",
    [{"cleanup.policy": "compact"}, {"retention.ms": "604800000"}, {"retention.bytes": "1000000"}],
    ids=["compacted", "seven-days", "a-megabyte"],
)
async def test_topics_create_refuses_an_events_topic_that_does_not_keep_its_records(
    config: dict[str, str], kafka_bootstrap: str, unique_topic: str
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        kept_but = {**TOPIC_CONFIG, **config}
        await admin.create_topics([NewTopic(unique_topic, 3, 1, topic_configs=kept_but)])
    finally:
        await admin.close()
    done = topics_create(kafka_bootstrap, unique_topic)
    assert done.returncode == 69, done.stderr
    [(name, value)] = config.items()
    assert f"does not keep its records for ever ({name}={value})" in done.stderr
    assert "--add-config cleanup.policy=delete,retention.ms=-1,retention.bytes=-1" in done.stderr


async def test_a_reporter_started_before_its_topic_exists_opens_its_gate_once_it_does(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    pods = [ResourceReport("", "pods", "Pod", "v1", ["v1"], ["v1"])]
    async with EventProducer(settings) as producer:
        reporter = Reporter("east", "a1", pods, producer, heartbeat_interval=1.0, jitter=0)
        starting = asyncio.create_task(reporter.start())
        async with asyncio.timeout(30):  # the 503 names the topic once it is found missing
            while unique_topic not in reporter.gate.reason("", "pods"):
                await asyncio.sleep(0.05)
        assert not starting.done()
        # One stopped before the topic is made: its lease release is given up, not raised.
        stopped = Reporter("east", "a2", pods, producer, heartbeat_interval=1.0, jitter=0)
        stopping = asyncio.create_task(stopped.start())
        async with asyncio.timeout(30):  # it has tried to register
            while unique_topic not in stopped.gate.reason("", "pods"):
                await asyncio.sleep(0.05)
        await stopped.stop(shutdown_timeout=2.0)
        await asyncio.wait_for(stopping, 10)
        assert not stopped.ready
        await create_topics(settings)
        await asyncio.wait_for(starting, 30)
        assert reporter.ready and reporter.gate.allows("POST", "", "pods")
        await reporter.stop()


def test_a_topic_the_broker_cannot_hold_is_refused_naming_the_setting(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    done = topics_create(kafka_bootstrap, unique_topic, SVLEDGER_KAFKA_REPLICATION_FACTOR="3")
    assert done.returncode == 2, done.stderr  # the broker is one
    assert "Traceback" not in done.stderr
    assert "SVLEDGER_KAFKA_REPLICATION_FACTOR=3: the cluster at" in done.stderr
    assert "has 1 broker(s)" in done.stderr
    assert "set SVLEDGER_KAFKA_PARTITIONS and SVLEDGER_KAFKA_REPLICATION_FACTOR" in done.stderr
