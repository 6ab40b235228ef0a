"""Log growth: the bytes a heartbeat adds to the broker's disk, and what that makes a year.

The log is kept for ever (``retention.ms=-1``), and nearly all of it is heartbeats: every
apiserver renews its lease every 10 s, 8,640 times a day. This starts its own broker
(``deploy/kafka/broker.py``: the measure is the size of the partition's segment files, so
the broker must be local), creates a one-partition topic and measures:

* ``live``: ``--live`` heartbeats appended one at a time, each acknowledged before the
  next, as a reporter sends them: each is a record batch of its own on disk;
* ``batched``: ``--batched`` heartbeats appended in one burst (``send_many``), as when
  many apiservers share a producer or a collector catches up: records share batches.

Prints one JSON object: bytes on disk per heartbeat in each case, the Avro value's size,
and, from the live figure, the growth per apiserver per day and per year.

    python -m bench.log_growth [--live 3000] [--batched 30000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from deploy.kafka.broker import LocalKafka
from ledger.codec import encode
from ledger.events import ApiserverHeartbeat, Event, Meta
from ledger.identity import apiserver_id, holder_identity
from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings

START = datetime(2030, 1, 1, tzinfo=UTC)
HEARTBEATS_PER_DAY = 24 * 3600 // 10


def heartbeats(count: int, first: int = 0) -> list[Event]:
    """One apiserver's heartbeats, 10 s apart, as its reporter writes them."""
    hostname = "master-1.prod-eu-1.example.com"
    server = apiserver_id(hostname)
    holder = holder_identity(server, uuid.UUID(int=1))
    events: list[Event] = []
    for n in range(first, first + count):
        at = START + timedelta(seconds=10 * n)
        events.append(
            ApiserverHeartbeat(
                meta=Meta.new("prod-eu-1", server, at),
                apiserver_id=server,
                holder_identity=holder,
                hostname=hostname,
                lease_duration_seconds=3600,
                renew_time=at,
                binary_version="v1.31.2",
            )
        )
    return events


def segment_bytes(partition_dir: Path) -> int:
    """Bytes of the partition's record segments (the sparse index files do not count)."""
    return sum(path.stat().st_size for path in partition_dir.glob("*.log"))


async def measure(broker: LocalKafka, live: int, batched: int) -> dict[str, Any]:
    settings = KafkaSettings(
        bootstrap_servers=broker.bootstrap,
        topic=f"svledger-bench.growth.{uuid.uuid4().hex[:8]}",
        partitions=1,
    )
    await create_topics(settings)
    partition_dir = broker.data_dir / f"{settings.topic}-0"
    async with EventProducer(settings) as producer:
        for event in heartbeats(live):
            await producer.send(event)
        after_live = segment_bytes(partition_dir)
        await producer.send_many(heartbeats(batched, first=live))
        after_batched = segment_bytes(partition_dir)
    per_live = after_live / live
    return {
        "avro_value_bytes": len(encode(heartbeats(1)[0])),
        "live_heartbeats": live,
        "live_bytes_per_heartbeat": round(per_live, 1),
        "batched_heartbeats": batched,
        "batched_bytes_per_heartbeat": round((after_batched - after_live) / batched, 1),
        "live_mib_per_apiserver_day": round(per_live * HEARTBEATS_PER_DAY / 2**20, 2),
        "live_mib_per_apiserver_year": round(per_live * HEARTBEATS_PER_DAY * 365 / 2**20),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", type=int, default=3000)
    parser.add_argument("--batched", type=int, default=30_000)
    args = parser.parse_args()
    with LocalKafka() as broker:
        result = asyncio.run(measure(broker, args.live, args.batched))
    print(json.dumps({"benchmark": "log_growth", **result}))


if __name__ == "__main__":
    main()
