"""Reaction latency of the trigger: agreeing report appended -> MigrationRequested committed.

Runs ``svledger migrator`` as its own process against ``SVLEDGER_KAFKA_BOOTSTRAP`` (or
a local broker from ``deploy/kafka/broker.py``), a background load of heartbeats from many
apiservers across several clusters, and a series of probes: each appends the first
report of a new resource from an apiserver that is alone in its cluster (so the
report is an agreement and persisted hashes are ``["Unknown"]``: a migration is
due). The latency of a probe runs from the report's acknowledgement to the moment a
``read_committed`` consumer sees the ``MigrationRequested`` for that resource.

    python -m bench.reaction_latency [--probes 200] [--load 1000] [--warmup-seconds 30]
                                     [--load-seconds 90]

The load is encoded before the measurement starts (``--load-seconds`` of it, every
heartbeat its own event with its own ID): it stands for reporters on other machines,
and encoding it meanwhile would take most of a core from the migrator and the broker.

The measured probes run in the steady state: first, for ``--warmup-seconds``, probes
run under the full load and are reported apart (``warmup``), not counted. A broker
just started (as this bench starts one when no bootstrap is given) is slower at
first: on a 2-core machine its first minute under this load had a p99 up to nearly
twice that of later probes, which is the broker's start, not the migrator's
reaction. The warm-up's own p99 is printed, so the difference stays visible.

Prints one JSON object: p50 and p99 in milliseconds, the probes and the load achieved,
and the warm-up's probes and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from deploy.kafka.broker import kafka_bootstrap
from ledger.codec import decode
from ledger.events import ApiserverHeartbeat, Meta, MigrationRequested, StorageVersionReported
from ledger.kafka import TYPE_HEADER, EventProducer, OutgoingRecord, create_topics, to_record
from ledger.settings import KafkaSettings

ROOT = Path(__file__).resolve().parent.parent
LOAD_CLUSTERS = 12
LOAD_APISERVERS = 50  # per cluster
PROBE_CLUSTER = "probe"


def heartbeat(cluster: str, apiserver: str) -> ApiserverHeartbeat:
    now = datetime.now(UTC)
    return ApiserverHeartbeat(
        Meta.new(cluster, apiserver, now), apiserver, f"{apiserver}_1", apiserver, 3600, now
    )


def encoded_load(count: int) -> list[OutgoingRecord]:
    """``count`` heartbeats of the load's apiservers, each its own event, encoded ahead.

    The load stands for other machines' reporters: encoding it while measuring would
    take most of a core of the two the migrator and the broker run on.
    """
    return [
        to_record(heartbeat(f"load-{i % LOAD_CLUSTERS}", f"apiserver-{i % LOAD_APISERVERS}"))
        for i in range(count)
    ]


async def load(
    producer: EventProducer,
    records: list[OutgoingRecord],
    rate: int,
    stop: asyncio.Event,
    acked: list[int],
) -> None:
    """Append ``rate`` of ``records`` per second in 10 ms ticks until ``stop`` (from the
    first again once all are sent); ``acked[0]`` counts those the broker acknowledged."""
    loop = asyncio.get_running_loop()
    per_tick = max(1, rate // 100)
    sent = 0
    next_tick = loop.time()
    pending: set[asyncio.Task[object]] = set()
    topic = producer.settings.topic

    async def send(batch: list[OutgoingRecord]) -> None:
        futures = [
            await producer.producer.send(topic, value=value, key=key, headers=headers)
            for key, value, headers in batch
        ]
        await asyncio.gather(*futures)
        acked[0] += len(batch)

    while not stop.is_set():
        start = sent % len(records)
        events = records[start : start + per_tick]
        task = asyncio.create_task(send(events))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += per_tick
        next_tick += 0.01
        await asyncio.sleep(max(0.0, next_tick - loop.time()))
    await asyncio.gather(*pending)


async def watch(settings: KafkaSettings, seen: dict[str, float], ready: asyncio.Event) -> None:
    """Record when each probe resource's MigrationRequested becomes visible (read_committed)."""
    consumer = AIOKafkaConsumer(
        **settings.client_kwargs(),
        enable_auto_commit=False,
        isolation_level="read_committed",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(settings.topic, p) for p in range(settings.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        ready.set()
        loop = asyncio.get_running_loop()
        while True:
            fetched = await consumer.getmany(timeout_ms=100)
            now = loop.time()
            for messages in fetched.values():
                for message in messages:
                    # Only the type header is read of the load: decoding it all here
                    # would take a core from the migrator under measurement.
                    if dict(message.headers).get(TYPE_HEADER) != b"MigrationRequested":
                        continue
                    event = decode(message.value)
                    if (
                        isinstance(event, MigrationRequested)
                        and event.meta.cluster == PROBE_CLUSTER
                    ):
                        seen.setdefault(event.resource, now)
    finally:
        await consumer.stop()


async def bench(
    bootstrap: str, probes: int, rate: int, warmup_seconds: float, load_seconds: int
) -> dict[str, object]:
    records = encoded_load(rate * load_seconds)
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic=f"bench.{uuid.uuid4().hex[:8]}")
    topics = await create_topics(settings)
    migrator = subprocess.Popen(
        [
            sys.executable, "-m", "svledger", "migrator",
            "--bootstrap", bootstrap, "--topic", settings.topic,
        ],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    seen: dict[str, float] = {}
    ready = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, ready))
    stop_load = asyncio.Event()
    try:
        async with EventProducer(settings, linger_ms=0) as producer:
            await ready.wait()
            acked = [0]
            loader = asyncio.create_task(load(producer, records, rate, stop_load, acked))
            await producer.send(heartbeat(PROBE_CLUSTER, "apiserver-probe"))
            # Warm up: the migrator must have joined its group and caught up.
            await probe(producer, "warmup", seen, loop)
            warmup = await probes_for(producer, warmup_seconds, seen, loop)
            started, before = loop.time(), acked[0]
            latencies = [await probe(producer, f"r{i}", seen, loop) for i in range(probes)]
            elapsed, sent = loop.time() - started, acked[0] - before
            stop_load.set()
            await loader
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        migrator.terminate()
        migrator.wait(60)
    return {
        "topic": str(topics.layout),  # its replication: every commit waits for the replicas
        "probes": probes,
        **percentiles(latencies),
        "background_events_per_s": round(sent / elapsed),
        # More than encoded: the load sent some heartbeats twice (raise --load-seconds).
        "load_repeated": acked[0] > len(records),
        "warmup": {"seconds": warmup_seconds, "probes": len(warmup), **percentiles(warmup)},
    }


def percentiles(latencies: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of ``latencies`` (seconds), in milliseconds; None if there are none."""
    if not latencies:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ms = sorted(1000 * latency for latency in latencies)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[max(0, int(len(ms) * 0.99) - 1)], 2),
        "max_ms": round(ms[-1], 2),
    }


async def probes_for(
    producer: EventProducer, seconds: float, seen: dict[str, float], loop: asyncio.AbstractEventLoop
) -> list[float]:
    """The latencies of probes run one after another for ``seconds``."""
    deadline = loop.time() + seconds
    latencies = []
    while loop.time() < deadline:
        latencies.append(await probe(producer, f"w{len(latencies)}", seen, loop))
    return latencies


async def probe(
    producer: EventProducer, resource: str, seen: dict[str, float], loop: asyncio.AbstractEventLoop
) -> float:
    report = StorageVersionReported(
        Meta.new(PROBE_CLUSTER, "apiserver-probe", datetime.now(UTC)),
        "apiserver-probe",
        "example.com",
        resource,
        "Widget",
        "v1",
        ("v1",),
        ("v1",),
    )
    await producer.send(report)
    acked = loop.time()
    async with asyncio.timeout(60):
        while resource not in seen:
            await asyncio.sleep(0.001)
    return seen[resource] - acked


def arguments(parser: argparse.ArgumentParser) -> None:
    """This bench's options (also :mod:`bench.replication_bench`'s)."""
    parser.add_argument(
        "--probes",
        type=int,
        default=200,
        help="probes measured after the warm-up (default %(default)s)",
    )
    parser.add_argument(
        "--load",
        type=int,
        default=1000,
        help="background events per second (default %(default)s)",
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=30.0,
        help="seconds of probes under the load before measuring, reported apart"
        " (default %(default)s)",
    )
    parser.add_argument(
        "--load-seconds",
        type=int,
        default=90,
        help="seconds of load encoded before measuring, each heartbeat its own event"
        " (default %(default)s)",
    )


def run(bootstrap: str, args: argparse.Namespace) -> dict[str, object]:
    """The report of one run on a fresh topic of the cluster at ``bootstrap``, with the
    options of :func:`arguments`."""
    return asyncio.run(
        bench(bootstrap, args.probes, args.load, args.warmup_seconds, args.load_seconds)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments(parser)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap:
        print(json.dumps(run(bootstrap, args)))


if __name__ == "__main__":
    main()
