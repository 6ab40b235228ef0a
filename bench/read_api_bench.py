"""The read API over a long log: catch-up, then views of the past, cold and warm.

Fills a fresh topic with N mixed events of many clusters (``--events``, default
1,000,000; the workload of :mod:`bench.projector_bench`), starts ``svledger serve`` as
its own process on it and measures:

* ``catch_up``: seconds from start until ``/readyz`` (the whole log folded), events/s,
  and the server's RSS then;
* ``at_cold`` / ``at_warm``: ``kubectl get storageversions``'s request under
  ``/clusters/CLUSTER/at/POINT`` for ``--points`` points spread over the log (half
  offsets, half times), first when nothing about the point is cached, then again;
  seconds per request (min, median, max);
* ``live``: the same request on the live view.

``--checkpoint-every`` and ``--recent-checkpoints`` are passed to the server: a small
``--checkpoint-every`` takes as many checkpoints on this log as the default takes on a
log that many times longer, so how many the server keeps, and its memory, can be seen
without that log.

Prints one JSON object. Kafka: ``SVLEDGER_KAFKA_BOOTSTRAP`` or a local broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.projector_bench import fill
from deploy.kafka.broker import free_port, kafka_bootstrap
from ledger.kafka import EventConsumer, end_offsets, partition_of
from ledger.settings import KafkaSettings
from readapi import CHECKPOINT_EVERY, RECENT_CHECKPOINTS

ROOT = Path(__file__).resolve().parents[1]
LIST = "apis/internal.apiserver.k8s.io/v1alpha1/storageversions"


def _get(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        response.read()
    return time.perf_counter() - started


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _summary(seconds: list[float]) -> dict[str, float]:
    return {
        "min": round(min(seconds), 4),
        "median": round(statistics.median(seconds), 4),
        "max": round(max(seconds), 4),
    }


async def _points(settings: KafkaSettings, cluster: str, count: int) -> list[str]:
    """Offsets and times of the cluster's events, spread over its partition."""
    ends = await end_offsets(settings)
    partition = partition_of(cluster, sorted(ends))
    rng = random.Random(7)
    offsets = sorted(rng.randrange(ends[partition]) for _ in range(count))
    points: list[str] = []
    async with EventConsumer(
        settings, partitions=[partition], until="end", dead_letters=False
    ) as consumer:
        wanted = iter(offsets)
        target = next(wanted, None)
        async for batch in consumer.batches():
            for record in batch:
                while target is not None and record.position.offset >= target:
                    if len(points) % 2:
                        points.append(record.event.meta.occurred_at.isoformat())
                    else:
                        points.append(str(record.position.offset))
                    target = next(wanted, None)
    return points


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with kafka_bootstrap() as bootstrap:
        settings = KafkaSettings(
            bootstrap_servers=bootstrap,
            topic=f"svledger-bench.{uuid.uuid4().hex[:8]}",
            partitions=args.partitions,
        )
        report: dict[str, Any] = {
            "events": args.events,
            "clusters": args.clusters,
            "checkpoint_every": args.checkpoint_every,
            "recent_checkpoints": args.recent_checkpoints,
        }
        report["produce"] = await fill(settings, args.events, args.clusters)
        cluster = "cluster-000"
        points = await _points(settings, cluster, args.points)
        port = free_port()
        started = time.perf_counter()
        server = subprocess.Popen(
            [
                sys.executable, "-m", "svledger", "serve", "--bootstrap", bootstrap,
                "--topic", settings.topic, "--address", f"127.0.0.1:{port}",
                "--checkpoint-every", str(args.checkpoint_every),
                "--recent-checkpoints", str(args.recent_checkpoints),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            while True:
                try:
                    if _get(f"{base}/readyz") >= 0:
                        break
                except OSError:
                    time.sleep(0.2)
            seconds = time.perf_counter() - started
            report["catch_up"] = {
                "seconds": round(seconds, 2),
                "events_per_second": round(args.events / seconds),
                "rss_mib": round(_rss_mib(server.pid), 1),
            }
            urls = [f"{base}/clusters/{cluster}/at/{point}/{LIST}" for point in points]
            report["at_cold"] = _summary([_get(url) for url in urls])
            report["at_warm"] = _summary([_get(url) for url in urls])
            report["live"] = _summary([_get(f"{base}/clusters/{cluster}/{LIST}") for _ in urls])
            report["rss_mib_after"] = round(_rss_mib(server.pid), 1)
        finally:
            server.terminate()
            server.wait(timeout=60)
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY)
    parser.add_argument("--recent-checkpoints", type=int, default=RECENT_CHECKPOINTS)
    report = asyncio.run(_main(parser.parse_args()))
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
