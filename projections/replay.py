"""Replay: rebuild every view from the log, into a fresh database or on from a snapshot.

``svledger replay --db URL`` reads the topic from the beginning to the end it has
when the replay starts and folds it with the projector's own steps
(:func:`projections.projector.fold_batch`, then :func:`projections.store.commit` in
the writer process, overlapping the fold of the next batch), so a replayed database
is what the projector would have written, row for row, checkpoints included: a
projector pointed at it afterwards carries on from where the replay stopped.

* ``until``: an offset (replay each partition up to and including it) or a time
  (each partition stops at its first event, of any cluster, that occurred after it:
  a cut of the log, so the database is a projection at a checkpoint; the read API's
  ``/at/TIME`` cuts the same way); the views then show the ledger as it stood at that
  point.
* ``cluster``: only that cluster's events, read from the one partition it is placed
  in (:mod:`ledger.kafka.placement`). Its dead letters are logged, not sent: readers of
  whole partitions send them (:class:`ledger.kafka.DeadLetters`).
* ``from_snapshot``: the database already holds a projection (a copy of a live
  projection database, or an earlier replay): load it and continue from its
  checkpoint. Without it a database holding any event is refused, so a replay never
  mixes with views it did not write.
* ``snapshots_from``: a projection database the projector writes fold snapshots to
  (:mod:`projections.snapshots`). Each partition starts from its latest sound
  snapshot at or before ``until``, instead of from the log's beginning; its rows are
  written first, with the snapshot itself, so the database says where it began. The
  views come out as a replay from the beginning writes them. ``ledger_events``,
  ``rejected_events`` and ``lease_renewals`` hold what the log has from the
  snapshot on: their rows before it are the history a snapshot skips (the source
  database has them, and so does the log).

* ``processes``: fold the partitions in that many processes at once (PostgreSQL
  only), each with its own consumer and writer: partitions hold whole clusters, so
  their folds, rows and checkpoints are independent, and a machine's cores add up.
  The partitions are dealt out by how many records each has to read. Each process
  is ``python -m projections.replay``; it reads its share from stdin and reports its
  progress, its log records and its result on stdout. If one fails, the others are
  stopped and the replay fails: replay into a fresh database again. SQLite takes one
  writer at a time, so there it stays one process.

Progress goes to stderr: a bar with percentage of the offsets to read, events/s
and ETA when stderr is a terminal (or ``progress=True``), else a log line every few
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import time
import traceback
from collections.abc import Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import IO, Any, Protocol, TypeAlias

from sqlalchemy import Engine, exists, select

from ledger import assignment
from ledger.errors import UsageError
from ledger.events import micros
from ledger.kafka import (
    EventConsumer,
    Messages,
    Placements,
    Record,
    end_offsets,
    message_time,
)
from ledger.memory import Sweeper, fewer_collections
from ledger.progress import REDRAW_SECONDS, ProgressBar
from ledger.settings import KafkaSettings
from projections import snapshots, store
from projections.database import engine, parse_url, shown, upgrade
from projections.fold import apply
from projections.projector import (
    DEFAULT_PROJECTION,
    MAX_BATCH,
    Projection,
    fold_batch,
)
from projections.schema import ledger_events, projection_checkpoints
from projections.state import State
from projections.writer import BatchWriter, frame, read_frame, read_frame_async

log = logging.getLogger(__name__)

Until: TypeAlias = int | datetime | None


class ReplayError(UsageError):
    """The replay cannot run as asked; the message says why and what to do."""


class Progress(Protocol):
    """Where a replay reports how far it is: offsets read of its total, events folded."""

    def update(self, done: int, events: int) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """What a replay reads: per partition, the offset it starts at and the one it stops
    before (``until`` an offset, else the log's end as the replay starts)."""

    starts: dict[int, int]
    limits: dict[int, int]

    @classmethod
    def of(
        cls,
        ends: Mapping[int, int],
        next_offsets: Mapping[int, int],
        until: Until,
        wanted: Sequence[int],
    ) -> Span:
        """The span of the partitions ``wanted`` (all, or one cluster's)."""
        limits = {p: ends[p] for p in wanted}
        if isinstance(until, int):
            limits = {p: min(end, until + 1) for p, end in limits.items()}
        return cls({p: next_offsets.get(p, 0) for p in wanted}, limits)

    def records(self, partition: int) -> int:
        return max(0, self.limits[partition] - self.starts[partition])

    @property
    def total(self) -> int:
        return sum(map(self.records, self.limits))

    def split(self, parts: int) -> list[Span]:
        """At most ``parts`` spans of whole partitions, as even in records as dealing the
        largest partition to the least loaded span first makes them (as a projectors'
        group deals them: :func:`ledger.assignment.deal`)."""
        backlog = {p: self.records(p) for p in self.limits}
        members = [f"{index:04d}" for index in range(parts)]
        shares = assignment.deal(self.limits, backlog, members).values()
        return [
            Span({p: self.starts[p] for p in share}, {p: self.limits[p] for p in share})
            for share in shares
            if share
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayResult:
    events: int
    rejected: int
    seconds: float  # the whole replay: upgrading the database, snapshots, helpers and all
    next_offsets: dict[int, int]  # the checkpoint the database ends at


async def home_of(settings: KafkaSettings, cluster: str) -> int:
    """The partition of ``cluster``'s events (:mod:`ledger.kafka.placement`)."""
    return (await Placements(settings).where([cluster], place=False))[cluster]


async def cluster_log(settings: KafkaSettings, cluster: str) -> tuple[State, list[Record]]:
    """One cluster's records in the log up to its end now, and their fold, in memory.

    For a decision on the cluster as the log stands (an operator's action), a picture
    of its history and checks that compare the ledger with the world. Only the
    cluster's partition is read, and the records are held in memory: it is for one
    cluster's log, not for replay.
    """
    state = State()
    records: list[Record] = []
    partition = await home_of(settings, cluster)
    async with EventConsumer(
        settings, until="end", partitions=[partition], dead_letters=False
    ) as consumer:
        async for batch in consumer.batches(key=cluster.encode()):
            for record in batch:
                apply(state, record.event, record.position)
            records.extend(batch)
    return state, records


def parse_until(text: str) -> int | datetime:
    """``--until``: a log offset (``12345``) or an ISO 8601 time with a zone (``...Z``)."""
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ReplayError(
            f"--until {text!r} is neither an offset (a whole number) nor an ISO 8601 time"
            " such as 2024-05-01T12:00:00Z"
        ) from None
    if moment.tzinfo is None:
        raise ReplayError(
            f"--until {text!r} has no time zone; add one, e.g. {moment.isoformat()}Z for UTC"
        )
    return moment.astimezone(UTC)


async def replay(
    settings: KafkaSettings,
    db_url: str,
    *,
    until: Until = None,
    cluster: str | None = None,
    from_snapshot: bool = False,
    snapshots_from: str | None = None,
    progress: bool | None = None,
    max_batch: int = MAX_BATCH,
    processes: int = 1,
) -> ReplayResult:
    """``svledger replay``: rebuild the views in ``db_url`` from the log (module docstring)."""
    if from_snapshot and snapshots_from is not None:
        raise ReplayError(
            "--from-snapshot continues a database and --snapshots-from starts a fresh one"
            " from fold snapshots; pass one of them"
        )
    if processes < 1:
        raise ReplayError(f"--processes {processes} must be at least 1, e.g. 2 on two cores")
    started = time.monotonic()
    # SQLite takes one writer at a time, and one cluster is one partition: one process.
    alone = cluster is not None or parse_url(db_url).get_backend_name() == "sqlite"
    if alone and processes > 1:
        log.warning(
            "--processes %d: replaying in one process, as %s",
            processes,
            "one cluster is one partition" if cluster is not None else "SQLite takes one writer",
        )
    # Started first, so that their start-up overlaps this process's.
    async with _Helpers(0 if alone else processes - 1) as helpers:
        upgrade(db_url)
        db = engine(db_url)
        try:
            projection = _starting_point(db, settings.topic, db_url, from_snapshot, until)
            with fewer_collections():
                async with BatchWriter(db_url) as writer:
                    ends = await end_offsets(settings)  # where the log ends as replay starts
                    projection.check_within(ends, shown(db.url))
                    wanted = sorted(ends) if cluster is None else [await home_of(settings, cluster)]
                    if snapshots_from is not None:
                        start = _from_snapshots(
                            settings.topic, ends, snapshots_from, projection, until, wanted, cluster
                        )
                        if start is not None:
                            await writer.commit(start)
                    span = Span.of(ends, projection.next_offsets, until, wanted)
                    _warn_past_the_end(until, ends, span)
                    bar = _ReplayBar(
                        "replay",
                        "records",
                        tty=sys.stderr.isatty() if progress is None else progress,
                        stream=sys.stderr,
                        total=span.total,
                    )
                    own, *shares = span.split(1 + len(helpers.children))
                    bars = _Shares(bar, 1 + len(shares))
                    result = await helpers.replay(
                        _replay(
                            settings,
                            own,
                            writer,
                            projection,
                            until,
                            cluster,
                            bars.of(0),
                            max_batch,
                        ),
                        _Job(settings, db_url, own, until, max_batch, log.getEffectiveLevel()),
                        shares,
                        bars,
                    )
        finally:
            db.dispose()
    bar.finish(span.total, result.events)
    return dataclasses.replace(result, seconds=time.monotonic() - started)


def _from_snapshots(
    topic: str,
    ends: Mapping[int, int],
    source_url: str,
    projection: Projection,
    until: Until,
    wanted: Sequence[int],
    cluster: str | None,
) -> store.Batch | None:
    """Start ``projection`` from the latest usable snapshot of each partition ``wanted``
    in ``source_url`` that is before ``ends`` (``cluster``: of that cluster only); the
    batch that writes that start, or None if none is usable."""
    source = engine(source_url)
    source_shown = shown(source.url)
    chosen: dict[int, tuple[snapshots.Snapshot, snapshots.Rows]] = {}
    try:
        with source.connect() as connection:
            for partition in wanted:
                limit = ends[partition]
                if isinstance(until, int):
                    limit = min(limit, until + 1)
                found = snapshots.latest(
                    connection,
                    DEFAULT_PROJECTION,
                    topic,
                    partition,
                    limit=limit,
                    until_time=until if isinstance(until, datetime) else None,
                    source=source_shown,
                )
                if found is not None:
                    chosen[partition] = found
    finally:
        source.dispose()
    log.info(
        "replay starts from fold snapshots in %s: %s",
        source_shown,
        ", ".join(f"{p}@{s.next_offset}" for p, (s, _) in sorted(chosen.items())) or "none",
    )
    if not chosen:
        return None
    state = snapshots.state_of((rows for _, rows in chosen.values()), cluster)
    projection.state = state
    projection.terms = None
    projection.next_offsets = {p: s.next_offset for p, (s, _) in chosen.items()}
    projection.log_times = {
        p: None if s.log_time is None else micros(s.log_time) for p, (s, _) in chosen.items()
    }
    return store.Batch.whole(
        state,
        projection.topic,
        projection.name,
        projection.next_offsets,
        {p: s.log_time for p, (s, _) in chosen.items()},
        [s for s, _ in chosen.values()],
    )


def _starting_point(
    db: Engine, topic: str, db_url: str, from_snapshot: bool, until: Until
) -> Projection:
    with db.connect() as connection:
        projection = Projection.load(connection, topic, DEFAULT_PROJECTION)
        holds_events = connection.scalar(select(exists().select_from(ledger_events)))
        holds_checkpoints = connection.scalar(select(exists().select_from(projection_checkpoints)))
    db_shown = shown(db.url)
    if not from_snapshot and (holds_events or holds_checkpoints):
        raise ReplayError(
            f"database {db_shown} already holds a projection; replay into a fresh database,"
            " or pass --from-snapshot to continue this one from its checkpoint"
        )
    if holds_events and not projection.next_offsets:
        raise ReplayError(
            f"database {db_shown} holds no checkpoint of projection {DEFAULT_PROJECTION!r} on"
            f" topic {topic!r}; it is a projection of another topic, so it cannot continue"
            " from this one"
        )
    if isinstance(until, int):
        past = sorted(p for p, o in projection.next_offsets.items() if o > until + 1)
        shown_until = str(until)
    elif isinstance(until, datetime):  # an event before the checkpoint occurred after it
        unknown = sorted(p for p, t in projection.log_times.items() if t is None)
        if unknown:
            raise ReplayError(
                f"snapshot {db_shown} does not know when the events before its checkpoint"
                f" occurred in partitions {unknown} (it was projected by an svledger that did"
                " not record it), so whether it is past --until"
                f" {until.isoformat()} cannot be told: replay into a fresh database, or give"
                " --until an offset"
            )
        limit = micros(until)
        past = sorted(p for p, t in projection.log_times.items() if t is not None and t > limit)
        shown_until = until.isoformat()
    else:
        return projection
    if past:
        raise ReplayError(
            f"snapshot {db_shown} is already past --until {shown_until} in partitions {past};"
            " a replay cannot go back, replay into a fresh database"
        )
    return projection


async def _replay(
    settings: KafkaSettings,
    span: Span,
    writer: BatchWriter,
    projection: Projection,
    until: Until,
    cluster: str | None,
    bar: Progress,
    max_batch: int,
) -> ReplayResult:
    """Fold ``span`` of the log into ``projection`` and commit it batch by batch; the
    result's ``seconds`` are left to :func:`replay`, which times the whole of it."""
    starts, limits = span.starts, span.limits
    reached = dict(starts)
    open_partitions = {p for p in limits if reached[p] < limits[p]}
    until_time = micros(until) if isinstance(until, datetime) else None
    only = None if cluster is None else cluster.encode()
    seen: set[bytes | None] = set()  # with ``cluster``: the clusters read
    events = rejected = 0
    sweeper = Sweeper()
    writing: asyncio.Future[None] | None = None  # the batch being committed
    if open_partitions:
        begin = dict(reached)
        async with (
            EventConsumer(
                settings,
                partitions=sorted(open_partitions),
                start_offsets=lambda partitions: {p: begin[p] for p in partitions},
                until={p: limits[p] for p in open_partitions},  # where it stops reading each
                # Dead letters are known sent by the highest source offset sent: one
                # cluster's reader, passing over the others' records, sends none.
                dead_letters=cluster is None,
            ) as consumer,
            contextlib.aclosing(consumer.batches_for_fold(max_batch)) as batches,
        ):
            async for batch in batches:
                kept = batch  # up to the limits: nothing to sort out
                if until_time is not None or cluster is not None:
                    kept = _sorted_out(batch, reached, limits, open_partitions, until_time)
                if only is not None:
                    seen.update(m.key for ms in kept.values() for m in ms)
                folded = fold_batch(projection, kept, only)
                for partition, offset in folded.batch.next_offsets.items():
                    reached[partition] = max(reached[partition], offset)
                sweeper.folded(sum(map(len, batch.values())))
                await consumer.send_dead_letters(folded.dead)
                if folded.batch.next_offsets:
                    if writing is not None:
                        await writing
                    writing = writer.commit(folded.batch)
                    events += folded.result.folded
                    rejected += folded.result.rejected
                bar.update(_done(reached, limits, starts), events)
                if not open_partitions:
                    break
    if writing is not None:
        await writing
    if only is not None and only not in seen and not _holds_rows(projection.state):
        known = ", ".join(sorted(k.decode(errors="replace") for k in seen if k)[:10])
        unknown = (
            f"cluster {cluster!r} has no events in topic {settings.topic}"
            f"{'' if until is None else ' up to --until'}: check its name, as its reporters"
            f" or collector give it (clusters in its partition: {known or 'none'})"
        )
        if until is None:  # a typo, most likely; as of a time, none may be the answer
            raise ReplayError(
                f"{unknown}; the database holds its partition's checkpoint alone: replay into"
                " a fresh database"
            )
        log.warning("%s", unknown)
    bar.update(span.total, events)
    return ReplayResult(events, rejected, 0.0, dict(projection.next_offsets))


def _warn_past_the_end(until: Until, ends: Mapping[int, int], span: Span) -> None:
    """An offset ``until`` at or past the end of every partition read reaches no point
    in the log: the replay goes to its end, which the user may not have meant (an
    offset of another partition, or of a longer log)."""
    if not isinstance(until, int) or any(until < ends[p] for p in span.limits):
        return
    log.warning(
        "--until %d is past the end of every partition read (%s): the replay goes to the"
        " end of the log; an offset counts within each partition (svledger history shows"
        " events with their partition:offset)",
        until,
        ", ".join(f"{p} ends at {ends[p]}" for p in sorted(span.limits)),
    )


def _holds_rows(state: State) -> bool:
    return bool(
        state.leases
        or state.storage_versions
        or state.storage_states
        or state.migrations
        or state.custom_resources
        or state.audits
    )


def _done(reached: Mapping[int, int], limits: Mapping[int, int], starts: Mapping[int, int]) -> int:
    return sum(max(0, min(reached[p], limits[p]) - starts[p]) for p in reached)


class _ReplayBar(ProgressBar):
    """The replay's bar: records read of the span, and the events folded."""

    def update(self, done: int, events: int = 0) -> None:
        self.show(done, self.total, f"{events:,} events folded")

    def finish(self, done: int = 0, events: int = 0) -> None:
        self.show(done, self.total, f"{events:,} events folded", final=True)


class _Shares:
    """The progress of the shares of a replay, shown as one."""

    def __init__(self, bar: Progress, count: int) -> None:
        self.bar = bar
        self.done = [0] * count
        self.events = [0] * count

    def of(self, index: int) -> _Share:
        return _Share(self, index)

    def update(self, index: int, done: int, events: int) -> None:
        self.done[index], self.events[index] = done, events
        self.bar.update(sum(self.done), sum(self.events))


@dataclasses.dataclass(frozen=True, slots=True)
class _Share:
    """One share's :class:`Progress`."""

    shares: _Shares
    index: int

    def update(self, done: int, events: int) -> None:
        self.shares.update(self.index, done, events)


class _Helpers:
    """Replay processes (``python -m projections.replay``), each to replay a share of the
    partitions beside this one; leaving the ``async with`` ends any still running."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.children: list[asyncio.subprocess.Process] = []

    async def __aenter__(self) -> _Helpers:
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
        for _ in range(self.count):
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                __name__,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=environment,
                # Out of the terminal's process group: a Ctrl-C reaches this process
                # alone, which stops its helpers (they would print its traceback each).
                start_new_session=True,
            )
            self.children.append(child)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for child in self.children:
            if child.returncode is None:
                assert child.stdin is not None
                if exc_info[0] is None:
                    child.stdin.close()  # given no share: it reads the end and exits
                else:
                    child.kill()
                await child.wait()

    async def replay(
        self,
        own: Coroutine[Any, Any, ReplayResult],
        job: _Job,
        shares: list[Span],
        shown: _Shares,
    ) -> ReplayResult:
        """``own`` (this process's share) and, in helpers, the other ``shares`` as ``job``
        says, at once; one result for all of them."""
        helped = zip(self.children, shares, strict=False)  # a helper may get no share
        tasks = [
            asyncio.create_task(own),
            *(
                asyncio.create_task(
                    self._helped(child, dataclasses.replace(job, span=share), shown.of(index))
                )
                for index, (child, share) in enumerate(helped, 1)
            ),
        ]
        try:
            mine, *theirs = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        next_offsets = dict(mine.next_offsets)
        for share, result in zip(shares, theirs, strict=True):
            next_offsets.update({p: o for p, o in result.next_offsets.items() if p in share.limits})
        return ReplayResult(
            mine.events + sum(result.events for result in theirs),
            mine.rejected + sum(result.rejected for result in theirs),
            0.0,
            next_offsets,
        )

    @staticmethod
    async def _helped(
        child: asyncio.subprocess.Process, job: _Job, progress: Progress
    ) -> ReplayResult:
        partitions = sorted(job.span.limits)
        assert child.stdin is not None and child.stdout is not None
        # The job goes through the pipe, not the command line: it holds the secrets.
        child.stdin.write(frame(job))
        await child.stdin.drain()
        child.stdin.close()
        while True:
            try:
                message = await read_frame_async(child.stdout)
            except EOFError:
                code = await child.wait()
                raise ReplayError(
                    f"the replay process of partitions {partitions} exited ({code}) before it"
                    " finished; see its log above, then replay into a fresh database again"
                ) from None
            if isinstance(message, ReplayResult):
                await child.wait()
                return message
            if isinstance(message, str):
                raise ReplayError(
                    f"the replay of partitions {partitions} failed: {message}; replay into a"
                    " fresh database again"
                )
            if isinstance(message, dict):  # a log record of the helper's
                record = logging.makeLogRecord(message)
                logging.getLogger(record.name).handle(record)
                continue
            progress.update(*message)


def _sorted_out(
    batch: Messages,
    reached: dict[int, int],
    limits: Mapping[int, int],
    open_partitions: set[int],
    until_time: int | None,
) -> Messages:
    """The records of ``batch`` to fold: each partition's up to its first event that
    occurred after ``until_time`` (microseconds; None: all). Moves ``reached`` and
    closes the partitions that are done. A record that does not decode is kept, for
    the fold to send to the dead-letter topic."""
    kept: Messages = {}
    for partition, messages in batch.items():
        if partition not in open_partitions:
            continue
        count = len(messages)
        if until_time is not None:
            for index, message in enumerate(messages):
                moment = message_time(message)
                if moment is not None and moment > until_time:
                    open_partitions.discard(partition)
                    count = index
                    break
        if count:
            kept[partition] = messages[:count]
            reached[partition] = messages[count - 1].offset + 1
            if reached[partition] >= limits[partition]:
                open_partitions.discard(partition)
    return kept


# ---------------------------------------------------------------- in a replay process


@dataclasses.dataclass(frozen=True, slots=True)
class _Job:
    """One replay process's share: its span of the log, into the database."""

    settings: KafkaSettings
    db_url: str
    span: Span
    until: Until
    max_batch: int
    log_level: int  # the parent's: its handlers write what the helper logs


class _Reports:
    """A replay process's progress, sent to its parent every :data:`REDRAW_SECONDS`."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.shown = 0.0

    def update(self, done: int, events: int) -> None:
        now = time.monotonic()
        if now - self.shown >= REDRAW_SECONDS:
            self.shown = now
            self.send((done, events))

    def send(self, message: Any) -> None:
        self.out.write(frame(message))
        self.out.flush()


class _Forward(logging.Handler):
    """Sends each log record to the parent, which hands it to its own handlers: a helper's
    logs come out as the parent's do (JSON lines or text), in its stream."""

    def __init__(self, reports: _Reports) -> None:
        super().__init__()
        self.reports = reports

    def emit(self, record: logging.LogRecord) -> None:
        entry = dict(record.__dict__, msg=record.getMessage(), args=None, exc_info=None)
        if record.exc_info:
            entry["exc_text"] = logging.Formatter().formatException(record.exc_info)
        try:
            self.reports.send(entry)
        except BrokenPipeError:
            os._exit(1)  # the parent is gone (stopped)
        except Exception:
            self.handleError(record)


async def _replay_share(job: _Job, reports: _Reports) -> ReplayResult:
    """Replay the job's partitions from the checkpoints the database holds for them."""
    db = engine(job.db_url)
    try:
        with db.connect() as connection:
            projection = Projection.load(connection, job.settings.topic, DEFAULT_PROJECTION)
    finally:
        db.dispose()
    with fewer_collections():
        async with BatchWriter(job.db_url) as writer:
            return await _replay(
                job.settings, job.span, writer, projection, job.until, None, reports, job.max_batch
            )


def main() -> None:
    """Replay the share read from stdin; progress, then the result (or why it failed) on stdout."""
    # The reports own the real stdout; anything printed goes to stderr instead.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    reports = _Reports(out)
    try:
        try:
            job = read_frame(sys.stdin.buffer)
        except EOFError:
            return  # started for a share there was none of
        logging.getLogger().addHandler(_Forward(reports))
        logging.getLogger().setLevel(job.log_level)
        reports.send(asyncio.run(_replay_share(job, reports)))
    except BrokenPipeError:
        os._exit(1)  # the parent is gone (stopped): no one to report to, nor to flush for
    except Exception as error:
        traceback.print_exc()
        with contextlib.suppress(BrokenPipeError):
            reports.send(f"{type(error).__name__}: {error}")
        sys.exit(1)


if __name__ == "__main__":
    # Run as the module, not as __main__, so what it pickles names this module's classes.
    from projections.replay import main as replay_process

    replay_process()
