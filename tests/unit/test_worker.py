"""The migration worker's semantics, against an in-process target (no process boundary)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.migrator import decide
from consumers.targets import (
    Conflict,
    NotFound,
    ObjectRef,
    Page,
    TargetError,
    TooManyRequests,
    Transient,
)
from consumers.worker import (
    RetryPolicy,
    migrate,
    migration_cancelled,
    next_migration,
    resumed,
)
from ledger.events import (
    Event,
    Meta,
    MigrationCancelled,
    MigrationFailed,
    MigrationProgressed,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    Position,
    StorageStateReset,
)
from projections import fold
from projections.fold import active_migrations
from projections.state import Migration, MigrationKey, Phase, State
from tests.unit.test_migrator_rules import PODS, Ledger, three_on_v1

START = datetime(2024, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(max_retries=3, backoff=1.0)


class StepClock:
    """Time that moves exactly by what is slept; remembers every sleep."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def now(self) -> datetime:
        return START + timedelta(seconds=sum(self.slept))

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


class FakeTarget:
    """Objects ``obj-0 .. obj-(n-1)``; the continue token is the index to go on from."""

    def __init__(self, count: int, failures: dict[int, list[Exception]] | None = None) -> None:
        self.refs = [ObjectRef("default", f"obj-{i}") for i in range(count)]
        self.failures = failures or {}
        self.rewrites: list[ObjectRef] = []
        self.attempts: list[ObjectRef] = []
        self.listed_from: list[str | None] = []

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        self.listed_from.append(continue_token)
        start = int(continue_token) if continue_token else 0
        end = min(start + limit, len(self.refs))
        return Page(tuple(self.refs[start:end]), str(end) if end < len(self.refs) else None)

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        self.attempts.append(ref)
        pending = self.failures.get(int(ref.name.split("-")[1]))
        if pending:
            raise pending.pop(0)
        self.rewrites.append(ref)


def migration(phase: Phase = "Pending", done: int = 0, token: str | None = None) -> Migration:
    return Migration(
        cluster="east",
        migration_id="m-1",
        group="apps",
        resource="deployments",
        target_version="v1",
        target_hash="h",
        storage_version_revision="0:1",
        phase=phase,
        objects_migrated=done,
        continue_token=token,
        reason=None,
        message=None,
        requested_at=START,
        updated_at=START,
        revision="0:2",
        created_revision="0:2",
        created_at=START,
    )


@dataclasses.dataclass
class Run:
    events: list[Event] = dataclasses.field(default_factory=list)
    clock: StepClock = dataclasses.field(default_factory=StepClock)

    async def append(self, events: Sequence[Event]) -> None:
        self.events.extend(events)

    def steps(self) -> list[tuple[str, int, str | None]]:
        return [
            (type(e).__name__, e.objects_migrated, e.continue_token)  # type: ignore[union-attr]
            for e in self.events
        ]


async def run(
    target: FakeTarget,
    the_migration: Migration,
    *,
    chunk_size: int = 500,
    cancel_after: int | None = None,
    policy: RetryPolicy = POLICY,
) -> Run:
    result = Run()

    def cancelled() -> bool:
        return cancel_after is not None and len(target.rewrites) >= cancel_after

    await migrate(
        the_migration,
        target,
        append=result.append,
        cancelled=cancelled,
        clock=result.clock,
        chunk_size=chunk_size,
        policy=policy,
    )
    return result


@settings(max_examples=50, deadline=None)
@given(count=st.integers(0, 1300), chunk_size=st.integers(1, 600))
async def test_every_object_is_rewritten_once_chunk_by_chunk(count: int, chunk_size: int) -> None:
    target = FakeTarget(count)
    result = await run(target, migration(), chunk_size=chunk_size)
    assert target.rewrites == target.refs
    chunks = max(1, -(-count // chunk_size))
    expected_progress = [
        ("MigrationProgressed", (i + 1) * chunk_size, str((i + 1) * chunk_size))
        for i in range(chunks - 1)
    ]
    assert result.steps() == [
        ("MigrationStarted", 0, None),
        *expected_progress,
        ("MigrationSucceeded", count, None),
    ]


async def test_default_chunks_are_500_objects() -> None:
    target = FakeTarget(1234)
    await migrate(
        migration(), target, append=Run().append, cancelled=lambda: False, clock=StepClock()
    )
    assert target.listed_from == [None, "500", "1000"]


async def test_conflict_is_retried_at_once_by_reading_again() -> None:
    target = FakeTarget(3, {1: [Conflict("changed"), Conflict("changed again")]})
    result = await run(target, migration())
    assert target.rewrites == target.refs
    assert target.attempts.count(target.refs[1]) == 3
    assert result.clock.slept == [0.0, 0.0]
    assert isinstance(result.events[-1], MigrationSucceeded)


async def test_an_object_gone_counts_as_migrated() -> None:
    target = FakeTarget(3, {0: [NotFound("deleted")]})
    result = await run(target, migration())
    assert target.rewrites == target.refs[1:]
    assert result.steps()[-1] == ("MigrationSucceeded", 3, None)
    assert result.clock.slept == []


async def test_too_many_requests_honours_retry_after_else_backs_off() -> None:
    target = FakeTarget(
        2, {0: [TooManyRequests("slow down", retry_after=7.0)], 1: [Transient("timeout")] * 2}
    )
    result = await run(target, migration())
    assert result.clock.slept == [7.0, 1.0, 2.0]
    assert target.rewrites == target.refs


async def test_a_transient_error_waits_as_long_as_the_server_asks() -> None:
    target = FakeTarget(1, {0: [Transient("server timeout", retry_after=5.0), Transient("503")]})
    result = await run(target, migration())
    assert result.clock.slept == [5.0, 2.0]
    assert target.rewrites == target.refs


async def test_exhausted_retries_fail_with_the_last_continue_token() -> None:
    target = FakeTarget(7, {5: [TooManyRequests("busy")] * 10})
    result = await run(target, migration(), chunk_size=3)
    failed = result.events[-1]
    assert isinstance(failed, MigrationFailed)
    assert (failed.reason, failed.objects_migrated, failed.continue_token) == (
        "TooManyRequests",
        3,
        "3",
    )
    assert "obj-5" in (failed.message or "")
    assert len(result.clock.slept) == 3  # max_retries


class Forbidden(TargetError):
    """A refusal that retrying cannot cure, as a real target raises for HTTP 403."""


async def test_a_refused_object_does_not_stop_its_chunk_and_the_first_refusal_is_named() -> None:
    # obj-4 is refused for good (403, not retried), obj-5 exhausts its retries: the rest
    # of the chunk is still rewritten, then the migration fails naming obj-4.
    target = FakeTarget(9, {4: [Forbidden("no update on deployments")], 5: [Transient("x")] * 10})
    result = await run(target, migration(), chunk_size=3)

    assert [r.name for r in target.rewrites] == ["obj-0", "obj-1", "obj-2", "obj-3"]
    assert [r.name for r in target.attempts if r.name not in ("obj-4", "obj-5")] == [
        "obj-0", "obj-1", "obj-2", "obj-3",
    ]  # fmt: skip
    assert target.listed_from == [None, "3"]  # the failing chunk was the last one listed
    failed = result.events[-1]
    assert isinstance(failed, MigrationFailed)
    assert (failed.reason, failed.objects_migrated, failed.continue_token) == ("Forbidden", 3, "3")
    assert failed.message == "default/obj-4: no update on deployments"


async def test_an_exception_the_target_does_not_classify_fails_the_migration() -> None:
    # A bug in the target, or its client failing outside the target's errors: not
    # retried for ever with the migration left Running, but a failure the log records.
    target = FakeTarget(4, {1: [KeyError("metadata")]})
    result = await run(target, migration(), chunk_size=2)
    assert [r.name for r in target.rewrites] == ["obj-0"]
    failed = result.events[-1]
    assert isinstance(failed, MigrationFailed)
    assert (failed.reason, failed.objects_migrated, failed.continue_token) == (
        "TargetFailed",
        0,
        None,
    )
    assert failed.message == "default/obj-1: KeyError: 'metadata'"


async def test_every_object_of_a_chunk_gets_its_rewrite_despite_a_failure() -> None:
    target = FakeTarget(3, {0: [Forbidden("denied by webhook")]})
    result = await run(target, migration(), chunk_size=3)
    assert [r.name for r in target.rewrites] == ["obj-1", "obj-2"]
    assert isinstance(result.events[-1], MigrationFailed)


async def test_a_running_migration_resumes_from_its_continue_token() -> None:
    target = FakeTarget(10)
    result = await run(target, migration("Running", done=4, token="4"), chunk_size=4)
    assert target.listed_from[0] == "4"
    assert target.rewrites == target.refs[4:]
    assert not any(isinstance(e, MigrationStarted) for e in result.events)
    assert result.steps() == [
        ("MigrationProgressed", 8, "8"),
        ("MigrationSucceeded", 10, None),
    ]


async def test_a_cancelled_migration_stops_between_objects() -> None:
    target = FakeTarget(10)
    result = await run(target, migration(), chunk_size=4, cancel_after=6)
    assert target.rewrites == target.refs[:6]
    assert result.steps() == [("MigrationStarted", 0, None), ("MigrationProgressed", 4, "4")]
    assert not any(
        isinstance(e, MigrationProgressed | MigrationSucceeded) for e in result.events[2:]
    )


def test_next_migration_is_a_running_one_then_the_oldest_of_the_cluster_asked_for() -> None:
    def at(cluster: str, mid: str, minutes: int, phase: Phase = "Pending") -> Migration:
        return dataclasses.replace(
            migration(phase),
            cluster=cluster,
            migration_id=mid,
            requested_at=START + timedelta(minutes=minutes),
        )

    rows = [
        at("east", "e-done", 0, "Succeeded"),
        at("west", "w-old", 1),
        at("east", "e-old", 2, "Running"),
        at("east", "e-new", 3),
    ]
    state = State(migrations={m.key: m for m in rows})
    # No StorageVersions in this state, so every one is stale: order alone is tested here.
    # A running one first, though requested later (upstream's migrator does the same).
    assert next_migration(state, current_only=False) == rows[2]
    assert next_migration(state, "west", current_only=False) == rows[1]
    assert next_migration(state, "east", current_only=False) == rows[2]
    pending = State(migrations={m.key: m for m in rows if m.phase != "Running"})
    assert next_migration(pending, current_only=False) == rows[1]
    assert next_migration(state, "north", current_only=False) is None
    assert next_migration(state) is None


def test_a_migration_superseded_before_its_runner_looks_counts_as_cancelled() -> None:
    """The migrator cancels a migration and requests the resource's next one; a runner
    that looks only after both are folded finds its migration gone from the view."""
    state = State()
    first = migration()

    def meta() -> Meta:
        return Meta.new("east", "svledger-migrator", START)

    def requested(migration_id: str, offset: int) -> None:
        event = MigrationRequested(
            meta(), migration_id, first.group, first.resource, "v2", "h2", f"0:{offset}"
        )
        fold.apply(state, event, Position(0, offset))

    def cancelled(key: MigrationKey) -> bool:
        # No StorageVersion in this state (staleness is tested below).
        return migration_cancelled(state, key, current_only=False)

    requested("m-1", 1)
    fold.apply(state, MigrationStarted(meta(), "m-1"), Position(0, 2))
    assert not cancelled(first.key)
    fold.apply(state, MigrationCancelled(meta(), "m-1", reason="Changed"), Position(0, 3))
    assert cancelled(first.key)
    requested("m-2", 4)
    assert first.key not in state.migrations  # dropped: its resource's next one came
    assert cancelled(first.key)
    assert not cancelled(("east", "m-2"))


def agreeing_on_v1() -> tuple[Ledger, MigrationRequested]:
    """Two apiservers report pods in v1, and the request the migrator decides on that."""
    ledger = Ledger()
    for apiserver in ("a1", "a2"):
        ledger.heartbeat(apiserver)
    for apiserver in ("a1", "a2"):
        ledger.append(ledger.reported(apiserver, "v1"))  # no decision on each
    (request,) = decide(ledger.state, PODS, ledger.meta("a2"))
    assert isinstance(request, MigrationRequested)
    return ledger, request


def test_a_migration_made_stale_by_a_disagreement_is_not_run_on() -> None:
    ledger, request = agreeing_on_v1()
    key = ("east", request.migration_id)
    ledger.append(request)
    assert next_migration(ledger.state) == ledger.state.migrations[key]
    assert not migration_cancelled(ledger.state, key)
    ledger.append(MigrationStarted(ledger.meta("worker"), request.migration_id))
    ledger.append(ledger.reported("a1", "v2"))
    # Running and now stale: the runner stops before the migrator's cancellation lands.
    assert migration_cancelled(ledger.state, key)
    assert next_migration(ledger.state) is None
    # The baselines' worker runs on, as upstream's migrator would.
    assert not migration_cancelled(ledger.state, key, current_only=False)


def test_a_request_that_lands_after_a_disagreement_is_not_started() -> None:
    """The migrator decided on agreement, but a report it had not read yet landed first."""
    ledger, request = agreeing_on_v1()
    ledger.append(ledger.reported("a1", "v2"))
    ledger.append(request)
    key = ("east", request.migration_id)
    assert ledger.state.migrations[key].phase == "Pending"
    assert next_migration(ledger.state) is None
    assert migration_cancelled(ledger.state, key)
    assert next_migration(ledger.state, current_only=False) == ledger.state.migrations[key]
    # And the migrator, reading the same log, cancels it.
    (cancel,) = decide(ledger.state, PODS, ledger.meta("a1"))
    assert isinstance(cancel, MigrationCancelled)
    assert cancel.migration_id == request.migration_id


def failed_at_object_3(reset: bool = False) -> tuple[Ledger, Migration]:
    """Pods' first migration fails after 3 of 7 objects, and once the migrator's back-off
    has passed (``reset``: after an operator reset the StorageState) it requests pods
    again; the new request is returned."""
    ledger = three_on_v1()
    [first] = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    ledger.append(MigrationProgressed(ledger.meta("worker"), first.migration_id, 3, "3"))
    ledger.append(
        MigrationFailed(ledger.meta("worker"), first.migration_id, 3, "3", "Forbidden", "no")
    )
    if reset:
        ledger.append(StorageStateReset(ledger.meta("operator"), "", "pods", "restored etcd"))
    later = Meta.new(PODS[0], "a1", ledger.meta("a1").occurred_at + timedelta(hours=1))
    [request] = decide(ledger.state, PODS, later)
    assert isinstance(request, MigrationRequested)
    ledger.append(request)
    return ledger, ledger.state.migrations[PODS[0], request.migration_id]


async def test_the_next_attempt_of_a_failed_migration_resumes_at_its_continue_token() -> None:
    ledger, retry = failed_at_object_3()
    assert (retry.objects_migrated, retry.continue_token) == (0, None)
    target = FakeTarget(7)
    result = await run(target, resumed(ledger.state, retry), chunk_size=3)
    assert target.listed_from == ["3", "6"]
    assert target.rewrites == target.refs[3:]
    assert result.steps() == [
        ("MigrationStarted", 3, "3"),
        ("MigrationProgressed", 6, "6"),
        ("MigrationSucceeded", 7, None),
    ]


async def test_an_attempt_that_fails_before_its_first_chunk_hands_its_start_on() -> None:
    # Attempt 1 resumes at object 3 and fails there at once: attempt 2 resumes at 3
    # too, not at the beginning (the view of attempt 1 keeps where it started).
    ledger, retry = failed_at_object_3()
    target = FakeTarget(7, {3: [Forbidden("denied by webhook")]})
    result = await run(target, resumed(ledger.state, retry), chunk_size=3)
    assert result.steps() == [("MigrationStarted", 3, "3"), ("MigrationFailed", 3, "3")]
    for event in result.events:
        ledger.append(event)
    later = Meta.new(PODS[0], "a1", ledger.meta("a1").occurred_at + timedelta(hours=2))
    [request] = decide(ledger.state, PODS, later)
    assert isinstance(request, MigrationRequested)
    ledger.append(request)
    again = resumed(ledger.state, ledger.state.migrations[PODS[0], request.migration_id])
    assert (again.objects_migrated, again.continue_token) == (3, "3")


def test_a_new_decision_after_a_failure_starts_from_the_beginning() -> None:
    # After a StorageState reset objects may be stored in any version again (a restored
    # backup): the failed attempt's progress no longer counts.
    ledger, retry = failed_at_object_3(reset=True)
    assert resumed(ledger.state, retry) == retry
    # Nor is a migration that is not Pending, or the first attempt, moved.
    running = dataclasses.replace(retry, phase="Running")
    assert resumed(ledger.state, running) == running
    first = three_on_v1()
    [pending] = active_migrations(first.state, PODS)
    assert resumed(first.state, pending) == pending
