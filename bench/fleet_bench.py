"""A fleet on one ledger: clusters x apiservers reporting for a week, compressed.

Every apiserver of ``--clusters`` clusters (``--apiservers`` each) is a
:class:`~ledger.reporter.Reporter`, all in this process on one producer, as a provider's
reporters would be spread over its clusters: each joins, reports its resources and
heartbeats every ``--heartbeat-seconds`` for ``--days`` days of its clock, which runs
``--speedup`` times faster than the wall clock (a week in minutes). Meanwhile
``svledger project`` and ``svledger serve --snapshots-from`` follow the log as their
own processes, as they run in production.

Printed as one JSON object:

* ``append``: events the reporters appended and the rate the broker acknowledged them
  at, against the events their schedule plans (``planned``: each apiserver's join,
  reports and a heartbeat per interval, and its lease's release): fewer appended means
  the reporters or the broker could not keep up with the speed-up;
* ``projector``: how long the live projector took to reach the log's end after the last
  append, and the rate of a fresh projector folding the whole log from offset 0 (its
  catch-up rate, with snapshots written as in production);
* ``serve``: a fresh ``serve --snapshots-from`` started on the whole log: seconds to its
  first answer and to ``/readyz``; ``/clusters/C/at/TIME`` for ``--points`` random points
  of random clusters (seconds per request); ``kubectl get storageversions`` of every
  cluster through the HTTP API, and through kubectl itself for ``--kubectl-sample`` of
  them (seconds per cluster);
* ``rss_mib``: the resident memory of each process (this one with the reporters, the
  live projector, the live serve) at the end of each quarter of the week: flat from the
  first quarter to the last if nothing grows with the log but the log.

Kafka: ``SVLEDGER_KAFKA_BOOTSTRAP`` or a local broker. The defaults (1,000 clusters x 3
apiservers, a heartbeat every 30 minutes, a week in 17 minutes) append about a
million events. A faster clock magnifies every stall of an append: one of more than half
a lease duration on the fleet's clock (3 s of the wall clock at the defaults) has a
reporter take its lease for lost and report every resource again, as it would in a
real outage, and ``append.events`` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.serve_start import (
    LISTS,
    _project,
    _rss_mib,
    _summary,
    _timed,
    caught_up,
    wait_ready,
)
from deploy.kafka.broker import free_port, kafka_bootstrap
from ledger.events import Event, Position
from ledger.kafka import EventProducer, create_topics
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings
from readapi import WATCH_BUDGET, WATCH_WINDOW

ROOT = Path(__file__).resolve().parents[1]
START = datetime(2026, 1, 5, tzinfo=UTC)
RESOURCES = (
    ResourceReport("", "pods", "Pod", "v1", ("v1",), ("v1",)),
    ResourceReport("", "configmaps", "ConfigMap", "v1", ("v1",), ("v1",)),
    ResourceReport("", "secrets", "Secret", "v1", ("v1",), ("v1",)),
    ResourceReport("apps", "deployments", "Deployment", "v1", ("v1",), ("v1",)),
    ResourceReport("batch", "cronjobs", "CronJob", "v1", ("v1",), ("v1",)),
)


class FastClock:
    """The fleet's clock: :data:`START` plus the wall time since it began, ``speedup``
    times over; its sleeps last ``1 / speedup`` of what they ask."""

    def __init__(self, speedup: float) -> None:
        self.speedup = speedup
        self._began = time.monotonic()

    def now(self) -> datetime:
        return START + timedelta(seconds=(time.monotonic() - self._began) * self.speedup)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds / self.speedup)


class CountingProducer(EventProducer):
    """An :class:`EventProducer` counting the events the broker acknowledged."""

    acknowledged = 0

    async def send_many(self, events: Iterable[Event]) -> list[Position]:
        positions = await super().send_many(events)  # send() too comes here
        self.acknowledged += len(positions)
        return positions


def _svledger(command: str, settings: KafkaSettings, *arguments: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "svledger", command, "--bootstrap", settings.bootstrap_servers,
            "--topic", settings.topic, "--log-level", "WARNING", *arguments,
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=120)


def _kubectl_get(server: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["kubectl", "--server", server, "get", "storageversions", "--no-headers"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return time.perf_counter() - started


def _quarters(seconds: float) -> Iterator[float]:
    for quarter in range(1, 5):
        yield seconds * quarter / 4


async def _week(
    args: argparse.Namespace, settings: KafkaSettings, processes: dict[str, int]
) -> dict[str, Any]:
    """Run the reporters for the fleet's week; the append figures and the RSS per quarter."""
    clock = FastClock(args.speedup)
    rng = random.Random(5)
    rss: dict[str, list[float]] = {name: [] for name in processes}
    async with CountingProducer(settings, linger_ms=20) as producer:
        reporters = [
            Reporter(
                f"cluster-{c:04d}", f"apiserver-{a}.cluster-{c:04d}", RESOURCES, producer, clock,
                heartbeat_interval=args.heartbeat_seconds, jitter=0.04,
                lease_duration_seconds=args.lease_seconds, rng=random.Random(rng.random()),
            )
            for c in range(args.clusters)
            for a in range(args.apiservers)
        ]  # fmt: skip
        started = time.perf_counter()
        await asyncio.gather(*(reporter.start() for reporter in reporters))
        week = timedelta(days=args.days).total_seconds() / args.speedup
        for at in _quarters(week):
            await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
            for name, pid in processes.items():
                rss[name].append(round(_rss_mib(pid), 1))
        await asyncio.gather(*(reporter.stop(shutdown_timeout=30) for reporter in reporters))
        seconds = time.perf_counter() - started
        appended = producer.acknowledged
    heartbeats = int(timedelta(days=args.days).total_seconds() / args.heartbeat_seconds)
    planned = len(reporters) * (1 + len(RESOURCES) + heartbeats + 1)
    return {
        "append": {
            "events": appended,
            "seconds": round(seconds, 1),
            "events_per_second": round(appended / seconds),
            "planned": planned,
        },
        "rss_mib": rss,
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as scratch:
        settings = KafkaSettings(
            bootstrap_servers=bootstrap,
            topic=f"svledger-fleet.{uuid.uuid4().hex[:8]}",
            partitions=args.partitions,
        )
        await create_topics(settings)
        live_url = f"sqlite:///{Path(scratch) / 'live.db'}"
        every = str(args.snapshot_every)
        projector = _svledger("project", settings, "--db", live_url, "--snapshot-every", every)
        port = free_port()
        live_serve = _svledger(
            "serve", settings, "--address", f"127.0.0.1:{port}", "--snapshots-from", live_url,
            "--watch-window", str(args.watch_window), "--watch-budget", str(args.watch_budget),
        )  # fmt: skip
        report: dict[str, Any] = {
            "clusters": args.clusters,
            "apiservers": args.clusters * args.apiservers,
            "days": args.days,
            "heartbeat_seconds": args.heartbeat_seconds,
            "speedup": args.speedup,
            "partitions": args.partitions,
            "watch_window": args.watch_window,
            "watch_budget": args.watch_budget,
            "cpus": os.cpu_count(),
        }
        try:
            processes = {
                "reporters": os.getpid(),
                "projector": projector.pid,
                "serve": live_serve.pid,
            }
            report.update(await _week(args, settings, processes))
            appended_at = time.perf_counter()
            await caught_up(settings, live_url)
            live = {
                "caught_up_after_last_append_seconds": round(time.perf_counter() - appended_at, 1)
            }
        finally:
            _stop(live_serve)
            _stop(projector)
        fresh_url = f"sqlite:///{Path(scratch) / 'fresh.db'}"
        fresh = await _project(settings, fresh_url, args.snapshot_every)
        events = sum(fresh["ends"].values())
        report["projector"] = {
            **live,
            "from_zero_seconds": fresh["seconds"],
            "from_zero_events_per_second": round(events / fresh["seconds"]),
        }
        report["serve"] = _serve(settings, live_url, args)
        return report


def _serve(settings: KafkaSettings, url: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    server = _svledger("serve", settings, "--address", f"127.0.0.1:{port}", "--snapshots-from", url)
    rng = random.Random(9)
    clusters = [f"cluster-{c:04d}" for c in range(args.clusters)]
    try:
        report: dict[str, Any] = wait_ready(base, clusters[0], started)
        report["rss_mib"] = round(_rss_mib(server.pid), 1)
        span = timedelta(days=args.days).total_seconds()
        points = [
            (rng.choice(clusters), START + timedelta(seconds=rng.uniform(0, span)))
            for _ in range(args.points)
        ]
        report["at_time"] = _summary(
            [
                _timed(f"{base}/clusters/{c}/at/{t.isoformat().replace('+00:00', 'Z')}/{LISTS[0]}")
                for c, t in points
            ]
        )
        every = [_timed(f"{base}/clusters/{c}/{LISTS[0]}") for c in clusters]
        report["get_storageversions_http"] = {
            **_summary(every),
            "all_seconds": round(sum(every), 2),
        }
        if shutil.which("kubectl"):
            sample = rng.sample(clusters, min(args.kubectl_sample, len(clusters)))
            report["kubectl_get_storageversions"] = _summary(
                [_kubectl_get(f"{base}/clusters/{c}") for c in sample]
            )
        return report
    finally:
        _stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--apiservers", type=int, default=3, help="per cluster")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--heartbeat-seconds", type=float, default=1800.0)
    parser.add_argument("--lease-seconds", type=int, default=3600)
    parser.add_argument("--speedup", type=float, default=600.0, help="fleet seconds per second")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--snapshot-every", type=int, default=20_000)
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--kubectl-sample", type=int, default=20)
    parser.add_argument(
        "--watch-window",
        type=int,
        default=WATCH_WINDOW,
        help=f"the live serve's changes kept per cluster for watches ({WATCH_WINDOW})",
    )
    parser.add_argument(
        "--watch-budget",
        type=int,
        default=WATCH_BUDGET,
        help=f"the live serve's changes kept for watches in all ({WATCH_BUDGET})",
    )
    report = asyncio.run(_main(parser.parse_args()))
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
