"""Log throughput: producing events to Kafka, and consuming + decoding them back.

Creates a fresh topic, then measures on it:

* ``produce``: :meth:`EventProducer.send_many` of N events (``--events``, default
  200,000) over many clusters, in chunks of ``--chunk``, until every acknowledgement
  (``acks=all``, idempotent) is in;
* ``consume_decode``: :class:`EventConsumer` reading the whole topic back from the
  beginning to its end, decoding every record.

Prints one JSON object with events/s and seconds for each. Kafka:
``SVLEDGER_KAFKA_BOOTSTRAP`` or a local broker started from ``deploy/kafka/broker.py``.

    python -m bench.log_throughput --events 200000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from deploy.kafka.broker import kafka_bootstrap
from ledger.events import ApiserverHeartbeat, Event, Meta
from ledger.identity import apiserver_id
from ledger.kafka import EventConsumer, EventProducer, create_topics
from ledger.settings import KafkaSettings

ROOT = Path(__file__).resolve().parent.parent
START = datetime(2030, 1, 1, tzinfo=UTC)


def heartbeats(count: int, clusters: int) -> list[Event]:
    """``count`` heartbeats, three apiservers per cluster, ten seconds apart."""
    servers = [
        (f"cluster-{c}", apiserver_id(f"apiserver-{c}-{s}.example"), f"apiserver-{c}-{s}.example")
        for c in range(clusters)
        for s in range(3)
    ]
    events: list[Event] = []
    for n in range(count):
        cluster, server, hostname = servers[n % len(servers)]
        at = START + timedelta(seconds=10 * (n // len(servers)))
        events.append(
            ApiserverHeartbeat(
                meta=Meta.new(cluster, server, at),
                apiserver_id=server,
                holder_identity=f"{server}_{uuid.UUID(int=n % len(servers))}",
                hostname=hostname,
                lease_duration_seconds=3600,
                renew_time=at,
                binary_version="v1.31.0",
            )
        )
    return events


async def measure(settings: KafkaSettings, events: list[Event], chunk: int) -> dict[str, Any]:
    await create_topics(settings)
    async with EventProducer(settings) as producer:
        began = time.perf_counter()
        for first in range(0, len(events), chunk):
            await producer.send_many(events[first : first + chunk])
        produce = time.perf_counter() - began

    consumed = 0
    began = time.perf_counter()
    async with EventConsumer(settings, until="end") as consumer:
        async for batch in consumer.batches(max_records=20_000):
            consumed += len(batch)
    consume = time.perf_counter() - began
    if consumed != len(events):
        raise RuntimeError(f"produced {len(events)} events but consumed {consumed}")
    return {
        "events": len(events),
        "partitions": settings.partitions,
        "produce_seconds": round(produce, 3),
        "produce_events_per_s": round(len(events) / produce),
        "consume_decode_seconds": round(consume, 3),
        "consume_decode_events_per_s": round(consumed / consume),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--clusters", type=int, default=60)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--chunk", type=int, default=10_000, help="events per send_many")
    args = parser.parse_args()
    events = heartbeats(args.events, args.clusters)
    source = (
        "SVLEDGER_KAFKA_BOOTSTRAP"
        if os.environ.get("SVLEDGER_KAFKA_BOOTSTRAP")
        else "deploy/kafka/broker.py"
    )
    with kafka_bootstrap() as bootstrap:
        settings = KafkaSettings(
            bootstrap_servers=bootstrap,
            topic=f"svledger-bench.log.{uuid.uuid4().hex[:8]}",
            partitions=args.partitions,
        )
        result = asyncio.run(measure(settings, events, args.chunk))
    print(json.dumps({"benchmark": "log_throughput", "kafka": source, **result}))


if __name__ == "__main__":
    main()
