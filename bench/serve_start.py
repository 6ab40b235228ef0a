"""``svledger serve``'s start, folding the log from its beginning and from fold snapshots.

Fills a fresh topic with N mixed events of many clusters (``--events``, default
1,000,000; the workload of :mod:`bench.projector_bench`), projects it into a SQLite
database with fold snapshots every ``--snapshot-every`` offsets of a partition, then
starts ``svledger serve`` as its own process twice on it, with and without
``--snapshots-from`` (with only, given ``--no-from-log``), and measures for each:

* ``ready_seconds``: from start until ``/readyz`` (the log folded up to its end);
* ``first_answer_seconds``: from start until the first ``kubectl get storageversions``
  of a cluster answers (a cluster the views have met answers before ``/readyz``, with
  what they folded of it so far; one they have not met yet is 503);
* ``at_time``: ``/clusters/CLUSTER/at/TIME`` for ``--points`` times in the last 10% of
  the cluster's partition, each asked once (nothing cached), seconds per request;
* ``rss_mib`` once ready.

``same_bytes`` says whether both servers sent the same bytes for every cluster's
StorageVersions, Leases and StorageStates, as objects and as Tables, now and at the
points (the live ones at the same instant: ages are measured to the cluster's latest
event, not to now).

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
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.projector_bench import fill
from deploy.kafka.broker import free_port, kafka_bootstrap
from ledger.kafka import EndOffsets, EventConsumer, partition_of
from ledger.settings import KafkaSettings
from projections import database, store
from projections.projector import Projector

ROOT = Path(__file__).resolve().parents[1]
LISTS = (
    "apis/internal.apiserver.k8s.io/v1alpha1/storageversions",
    "apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
    "apis/migration.k8s.io/v1alpha1/storagestates",
)
TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"


def _get(url: str, accept: str = "application/json") -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=300) as response:
        body: bytes = response.read()
        return body


def _timed(url: str) -> float:
    started = time.perf_counter()
    _get(url)
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


async def caught_up(settings: KafkaSettings, url: str) -> dict[int, int]:
    """Wait until the projector's checkpoints in ``url`` reach the log's end as it is
    now; return that end per partition."""
    async with EndOffsets(settings) as ends_of:
        ends = await ends_of()
    engine = database.engine(url)
    try:
        while True:
            with engine.connect() as connection:
                done = store.load_checkpoints(connection, settings.topic, "views")
            if all(done.get(p, 0) >= end for p, end in ends.items()):
                return ends
            await asyncio.sleep(0.5)
    finally:
        engine.dispose()


async def _project(settings: KafkaSettings, url: str, every: int) -> dict[str, Any]:
    database.upgrade(url)
    projector = Projector(settings, url, group=False, log_interval=3600, snapshot_every=every)
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(projector.run(stop))
    try:
        ends = await caught_up(settings, url)
    finally:
        stop.set()
        await task
    return {"seconds": round(time.perf_counter() - started, 1), "ends": ends}


async def _late_times(settings: KafkaSettings, cluster: str, count: int) -> list[str]:
    """Times of ``cluster``'s events in the last 10% of its partition."""
    async with EndOffsets(settings) as ends_of:
        ends = await ends_of()
    partition = partition_of(cluster, sorted(ends))
    begin = ends[partition] - ends[partition] // 10
    times: list[datetime] = []
    async with EventConsumer(
        settings,
        partitions=[partition],
        start_offsets=lambda _: {partition: begin},
        until="end",
        dead_letters=False,
    ) as consumer:
        async for batch in consumer.batches():
            times += [r.event.meta.occurred_at for r in batch if r.event.meta.cluster == cluster]
    rng = random.Random(7)
    return [t.isoformat().replace("+00:00", "Z") for t in sorted(rng.sample(times, count))]


def wait_ready(base: str, cluster: str, started: float) -> dict[str, float]:
    """Wait until the server at ``base`` answers ``cluster``'s first list and then
    ``/readyz``; seconds from ``started`` (``time.perf_counter()``) to each."""
    first = None
    while True:
        try:  # refused (not listening yet) or 503 (not folded yet): both OSErrors
            if first is None:
                _get(f"{base}/clusters/{cluster}/{LISTS[0]}")
                first = time.perf_counter() - started
            _get(f"{base}/readyz")
            return {
                "first_answer_seconds": round(first, 2),
                "ready_seconds": round(time.perf_counter() - started, 2),
            }
        except OSError:
            time.sleep(0.1)


def _serve(settings: KafkaSettings, clusters: list[str], points: list[str], *extra: str) -> Any:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    server = subprocess.Popen(
        [
            sys.executable, "-m", "svledger", "serve", "--bootstrap", settings.bootstrap_servers,
            "--topic", settings.topic, "--address", f"127.0.0.1:{port}", *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        report: dict[str, Any] = wait_ready(base, clusters[0], started)
        report["rss_mib"] = round(_rss_mib(server.pid), 1)
        at = [f"{base}/clusters/{clusters[0]}/at/{point}/{LISTS[0]}" for point in points]
        report["at_time"] = _summary([_timed(url) for url in at])
        sent = [
            _get(f"{base}/clusters/{cluster}/{where}{kind}", accept)
            for cluster in clusters
            for where in ["", *(f"at/{point}/" for point in points)]
            for kind in LISTS
            for accept in ("application/json", TABLE)
        ]
        return report, sent
    finally:
        server.terminate()
        server.wait(timeout=60)


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as scratch:
        settings = KafkaSettings(
            bootstrap_servers=bootstrap,
            topic=f"svledger-bench.{uuid.uuid4().hex[:8]}",
            partitions=args.partitions,
        )
        report: dict[str, Any] = {
            "events": args.events,
            "clusters": args.clusters,
            "partitions": args.partitions,
            "snapshot_every": args.snapshot_every,
        }
        report["produce"] = await fill(settings, args.events, args.clusters)
        url = f"sqlite:///{Path(scratch) / 'views.db'}"
        report["project"] = await _project(settings, url, args.snapshot_every)
        clusters = [f"cluster-{n:03d}" for n in range(min(args.clusters, 5))]
        points = await _late_times(settings, clusters[0], args.points)
        from_snapshots, sent_from_snapshots = _serve(
            settings, clusters, points, "--snapshots-from", url
        )
        report["from_snapshots"] = from_snapshots
        if args.from_log:
            from_log, sent_from_log = _serve(settings, clusters, points)
            report["from_log"] = from_log
            report["same_bytes"] = sent_from_log == sent_from_snapshots
            report["responses_compared"] = len(sent_from_log)
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--snapshot-every", type=int, default=50_000)
    parser.add_argument("--points", type=int, default=5)
    parser.add_argument(
        "--no-from-log",
        dest="from_log",
        action="store_false",
        help="start serve from the snapshots only (on a long log, the start from offset 0"
        " takes minutes; tests/integration/test_serve_snapshots.py holds both equal)",
    )
    report = asyncio.run(_main(parser.parse_args()))
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
