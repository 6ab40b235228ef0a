"""The migration trigger's rules (DESIGN.md, "Migrator (trigger) rules"), without Kafka."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings

from consumers.migrator import REASON_CHANGED, REASON_DISAGREE, REASON_UNKNOWN, Backoff, decide
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
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
    StorageVersionReported,
)
from projections.fold import REASON_RESET, active_migrations, apply
from projections.state import ResourceKey, State
from tests.histories import histories

CLUSTER = "east"
PODS: ResourceKey = (CLUSTER, "", "pods")
START = datetime(2024, 1, 1, tzinfo=UTC)


def pods_hash(version: str) -> str:
    digest = hashlib.sha256(f"/{version}/Pod".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


class Ledger:
    """A one-partition log folded as it grows; the trigger's output is appended to it."""

    def __init__(self) -> None:
        self.state = State()
        self.offset = 0
        self.renewals: dict[str, datetime] = {}

    def meta(self, source: str) -> Meta:
        return Meta.new(CLUSTER, source, START + timedelta(seconds=self.offset))

    def append(self, event: Event) -> None:
        apply(self.state, event, Position(0, self.offset))
        self.offset += 1

    def heartbeat(self, apiserver: str) -> None:
        renew = START + timedelta(seconds=self.offset)
        self.renewals[apiserver] = renew
        self.append(
            ApiserverHeartbeat(
                self.meta(apiserver), apiserver, f"{apiserver}_x", apiserver, 3600, renew
            )
        )

    def join(self, apiserver: str) -> list[Event]:
        """A heartbeat of a new member, then what the trigger decides on it."""
        renew = START + timedelta(seconds=self.offset)
        self.renewals[apiserver] = renew
        heartbeat = ApiserverHeartbeat(
            self.meta(apiserver), apiserver, f"{apiserver}_x", apiserver, 3600, renew
        )
        return self.react(heartbeat)

    def reported(self, apiserver: str, version: str) -> StorageVersionReported:
        """``apiserver`` encodes pods in ``version``, decoding and serving v1 and v2."""
        return StorageVersionReported(
            self.meta(apiserver), apiserver, "", "pods", "Pod", version, ("v1", "v2"), ("v1", "v2")
        )

    def report(self, apiserver: str, version: str) -> list[Event]:
        """Append a report and then what the trigger decides on it; return the decision."""
        return self.react(self.reported(apiserver, version))

    def react(self, event: Event) -> list[Event]:
        self.append(event)
        decided = decide(self.state, PODS, event.meta)
        for output in decided:
            self.append(output)
        return decided

    def expire(self, apiserver: str) -> list[Event]:
        return self.react(
            ApiserverLeaseExpired(self.meta("gc"), apiserver, self.renewals[apiserver], 3600)
        )

    def active(self) -> list[tuple[str, str]]:
        return [(m.target_version, m.phase) for m in active_migrations(self.state, PODS)]


def three_on_v1() -> Ledger:
    ledger = Ledger()
    for apiserver in ("a1", "a2", "a3"):
        ledger.heartbeat(apiserver)
    for apiserver in ("a1", "a2", "a3"):
        ledger.report(apiserver, "v1")
    return ledger


def kinds(events: list[Event]) -> list[str]:
    return [
        type(e).__name__ + (f"({e.reason})" if isinstance(e, MigrationCancelled) else "")
        for e in events
    ]


def test_walkthrough_of_the_kep() -> None:
    ledger = three_on_v1()
    # The first agreement on v1 already asks for a migration: persisted is ["Unknown"].
    assert ledger.active() == [("v1", "Pending")]

    assert kinds(ledger.report("a1", "v2")) == [f"MigrationCancelled({REASON_DISAGREE})"]
    assert kinds(ledger.report("a2", "v2")) == []  # still no agreement: nothing to do
    decided = ledger.report("a3", "v2")
    assert kinds(decided) == ["MigrationRequested"]
    request = decided[0]
    assert isinstance(request, MigrationRequested)
    assert request.target_version == "v2"
    assert request.target_hash == pods_hash("v2")
    assert request.storage_version_revision == ledger.state.storage_versions[PODS].revision
    ledger.append(MigrationStarted(ledger.meta("worker"), request.migration_id))

    # Apiserver 3 is rolled back: the running migration is cancelled.
    assert kinds(ledger.report("a3", "v1")) == [f"MigrationCancelled({REASON_DISAGREE})"]
    assert ledger.active() == []
    # Upgraded again: a new migration at the new revision.
    decided = ledger.report("a3", "v2")
    assert kinds(decided) == ["MigrationRequested"]
    second = decided[0]
    assert isinstance(second, MigrationRequested)
    assert second.migration_id != request.migration_id
    ledger.append(MigrationStarted(ledger.meta("worker"), second.migration_id))
    assert kinds(ledger.react(MigrationSucceeded(ledger.meta("worker"), second.migration_id))) == []
    assert ledger.state.storage_states[PODS].persisted_storage_version_hashes == (pods_hash("v2"),)
    assert ledger.active() == []


def test_storage_version_change_under_a_running_migration_cancels_and_requests_again() -> None:
    ledger = three_on_v1()
    (first,) = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    ledger.heartbeat("a4")
    decided = ledger.report("a4", "v1")  # agreement kept, but the StorageVersion changed
    assert kinds(decided) == [f"MigrationCancelled({REASON_CHANGED})", "MigrationRequested"]
    assert decided[0].migration_id == first.migration_id  # type: ignore[union-attr]
    assert ledger.active() == [("v1", "Pending")]


def test_a_report_that_changes_nothing_leaves_a_running_migration_alone() -> None:
    # What the reporter relies on to re-report a whole server after a long gap.
    ledger = three_on_v1()
    (first,) = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    before = ledger.state.storage_versions[PODS], ledger.state.storage_states[PODS]
    assert kinds(ledger.report("a2", "v1")) == []
    assert (ledger.state.storage_versions[PODS], ledger.state.storage_states[PODS]) == before
    assert ledger.active() == [("v1", "Running")]


def test_no_request_when_persisted_is_already_the_common_version() -> None:
    ledger = three_on_v1()
    (first,) = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    ledger.react(MigrationSucceeded(ledger.meta("worker"), first.migration_id))
    # An apiserver leaving changes the StorageVersion, but everything is stored in v1.
    assert kinds(ledger.expire("a3")) == []
    # A reset says nothing is known about what is stored: migrate again.
    decided = ledger.react(StorageStateReset(ledger.meta("ops"), "", "pods", "etcd restored"))
    assert kinds(decided) == ["MigrationRequested"]


def test_a_reset_under_a_running_migration_cancels_it_and_a_new_one_is_requested() -> None:
    # Upstream's trigger deletes a stale StorageState's migrations and launches anew.
    ledger = three_on_v1()
    (first,) = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    ledger.append(MigrationProgressed(ledger.meta("worker"), first.migration_id, 500, "c1"))

    reset = StorageStateReset(ledger.meta("ops"), "", "pods", "etcd restored")
    ledger.append(reset)

    cancelled = ledger.state.migrations[CLUSTER, first.migration_id]
    assert (cancelled.phase, cancelled.reason) == ("Cancelled", REASON_RESET)
    assert (cancelled.objects_migrated, cancelled.continue_token) == (500, "c1")
    decided = decide(ledger.state, PODS, reset.meta)
    for output in decided:
        ledger.append(output)
    assert kinds(decided) == ["MigrationRequested"]
    assert decided[0].migration_id != first.migration_id  # type: ignore[union-attr]
    assert ledger.active() == [("v1", "Pending")]
    # The old migration's late success is refused: it cannot undo the reset.
    ledger.append(MigrationSucceeded(ledger.meta("worker"), first.migration_id, 1000))
    assert ledger.state.storage_states[PODS].persisted_storage_version_hashes == ("Unknown",)


def test_a_reset_of_a_state_reset_already_cancels_and_a_new_migration_is_requested() -> None:
    # The second reset finds the hashes ["Unknown"] already; it still cancels the
    # migration the first one led to, and the trigger must not take that cancelled
    # migration for its decision on the state: it requests a new one.
    ledger = three_on_v1()
    requested = []
    for reason in ("etcd restored", "etcd restored again"):
        reset = StorageStateReset(ledger.meta("ops"), "", "pods", reason)
        ledger.append(reset)
        assert ledger.state.storage_states[PODS].persisted_storage_version_hashes == ("Unknown",)
        decided = decide(ledger.state, PODS, reset.meta)
        for output in decided:
            ledger.append(output)
        assert kinds(decided) == ["MigrationRequested"]
        requested.append(decided[0].migration_id)  # type: ignore[union-attr]
    assert len(set(requested)) == 2
    assert ledger.active() == [("v1", "Pending")]


def test_a_forced_migration_the_storage_version_moved_under_is_cancelled() -> None:
    """Everything is stored in v1 and an operator forces a migration anyway; an apiserver
    leaving moves the StorageVersion. That migration can no longer count (the worker
    does not run a stale one), so it is cancelled; nothing new is requested."""
    ledger = three_on_v1()
    (first,) = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    ledger.react(MigrationSucceeded(ledger.meta("worker"), first.migration_id))
    storage_version = ledger.state.storage_versions[PODS]
    forced = MigrationRequested(
        ledger.meta("ops"), "forced", "", "pods", "v1", pods_hash("v1"), storage_version.revision
    )
    assert kinds(ledger.react(forced)) == []  # current: it stands
    assert kinds(ledger.expire("a3")) == [f"MigrationCancelled({REASON_CHANGED})"]
    assert ledger.active() == []
    assert decide(ledger.state, PODS, ledger.meta("gc")) == []


def test_a_failed_migration_is_not_requested_again_until_the_resource_changes() -> None:
    ledger = three_on_v1()
    (first,) = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    assert kinds(ledger.react(MigrationFailed(ledger.meta("worker"), first.migration_id))) == []
    decided = ledger.react(StorageStateReset(ledger.meta("ops"), "", "pods", "retry"))
    assert kinds(decided) == ["MigrationRequested"]


def test_a_member_that_has_not_reported_cancels_and_blocks_requests_until_it_does() -> None:
    ledger = three_on_v1()
    assert ledger.active() == [("v1", "Pending")]

    joined = ledger.join("a4")

    assert kinds(joined) == [f"MigrationCancelled({REASON_UNKNOWN})"]
    cancelled = joined[0]
    assert isinstance(cancelled, MigrationCancelled) and "a4" in (cancelled.message or "")
    assert kinds(ledger.report("a1", "v1")) == []  # still unknown: nothing requested
    assert kinds(ledger.report("a4", "v1")) == ["MigrationRequested"]
    # And the end of an unreported member's lease completes the membership.
    assert kinds(ledger.join("a5")) == [f"MigrationCancelled({REASON_UNKNOWN})"]
    assert kinds(ledger.expire("a5")) == ["MigrationRequested"]


def test_losing_every_apiserver_cancels() -> None:
    ledger = three_on_v1()
    ledger.expire("a1")
    ledger.expire("a2")
    assert kinds(ledger.expire("a3")) == [f"MigrationCancelled({REASON_DISAGREE})"]
    assert PODS not in ledger.state.storage_versions


# --------------------------------------------------------------------------- properties


def _resources(state: State) -> set[ResourceKey]:
    return (
        set(state.storage_versions)
        | set(state.storage_states)
        | {m.resource_key for m in state.migrations.values()}
    )


@settings(max_examples=300, deadline=None)
@given(histories())
def test_decisions_follow_the_rules_and_are_idempotent(
    history: list[tuple[Event, Position]],
) -> None:
    state = State()
    for event, position in history:
        apply(state, event, position)
    if not history:
        return
    cause = history[-1][0].meta
    next_offset = {p.partition: p.offset + 1 for _, p in history}
    for key in sorted(_resources(state)):
        storage_version = state.storage_versions.get(key)
        storage_state = state.storage_states.get(key)
        common = storage_version.common_encoding_version if storage_version else None
        active_before = active_migrations(state, key)
        decided = decide(state, key, Meta.new(key[0], "test", cause.occurred_at))
        requests = [e for e in decided if isinstance(e, MigrationRequested)]
        cancels = [e for e in decided if isinstance(e, MigrationCancelled)]
        assert len(requests) <= 1
        assert len(cancels) + len(requests) == len(decided)
        if common is None:
            assert requests == []
            assert {c.migration_id for c in cancels} == {m.migration_id for m in active_before}
            unknown = storage_version is not None and storage_version.condition.status == "Unknown"
            reason = REASON_UNKNOWN if unknown else REASON_DISAGREE
            assert all(c.reason == reason for c in cancels)
        if requests:
            (request,) = requests
            assert storage_version is not None and storage_state is not None
            assert request.target_version == common
            assert request.target_hash == storage_state.current_storage_version_hash
            assert storage_state.persisted_storage_version_hashes != (request.target_hash,)
            assert request.storage_version_revision == storage_version.revision
            # Everything active before is cancelled: a request leaves one active migration.
            assert {c.migration_id for c in cancels} == {m.migration_id for m in active_before}
        # Apply the decision where it would land, then decide again: nothing more.
        partition = next(p.partition for e, p in history if e.meta.cluster == key[0])
        for output in decided:
            changes = apply(state, output, Position(partition, next_offset[partition]))
            next_offset[partition] += 1
            assert changes.rejections == [], changes.rejections
        after = active_migrations(state, key)
        if requests:
            assert [m.migration_id for m in after] == [requests[0].migration_id]
        if common is None:
            assert after == []
        assert decide(state, key, Meta.new(key[0], "test", cause.occurred_at)) == []


def test_a_failed_migration_is_requested_again_after_a_doubling_capped_backoff() -> None:
    ledger = three_on_v1()
    backoff = Backoff(seconds=60, max_seconds=200)
    [first] = active_migrations(ledger.state, PODS)
    waits = []
    migration_id = first.migration_id
    for _ in range(4):
        ledger.append(MigrationStarted(ledger.meta("worker"), migration_id))
        ledger.append(MigrationFailed(ledger.meta("worker"), migration_id, reason="Forbidden"))
        failed_at = ledger.state.migrations[CLUSTER, migration_id].updated_at
        # Every heartbeat moves event time; the trigger decides again at each.
        waited = 0
        while True:
            waited += 10
            at = failed_at + timedelta(seconds=waited)
            decided = decide(ledger.state, PODS, Meta.new(CLUSTER, "a1", at), backoff)
            if decided:
                break
        [request] = decided
        assert isinstance(request, MigrationRequested)
        assert request.migration_id != migration_id
        assert request.meta.occurred_at == at
        ledger.append(request)
        migration_id = request.migration_id
        waits.append(waited)
        # Decided once only: the new request is pending now.
        assert decide(ledger.state, PODS, Meta.new(CLUSTER, "a1", at), backoff) == []
    assert waits == [60, 120, 200, 200]


def test_a_change_of_the_resource_requests_at_once_after_a_failure() -> None:
    ledger = three_on_v1()
    [first] = active_migrations(ledger.state, PODS)
    ledger.append(MigrationStarted(ledger.meta("worker"), first.migration_id))
    ledger.append(MigrationFailed(ledger.meta("worker"), first.migration_id, reason="Forbidden"))
    for apiserver in ("a1", "a2"):
        ledger.report(apiserver, "v2")
    assert kinds(ledger.report("a3", "v2")) == ["MigrationRequested"]


def test_a_decision_on_one_resource_leaves_another_resources_migration_alone() -> None:
    # Upstream's TestProcessDiscoveryResource: relaunching one resource's migration does
    # not touch another's.
    ledger = three_on_v1()
    sets: ResourceKey = (CLUSTER, "apps", "statefulsets")
    for apiserver in ("a1", "a2", "a3"):
        event = StorageVersionReported(
            ledger.meta(apiserver),
            apiserver,
            "apps",
            "statefulsets",
            "StatefulSet",
            "apps/v1",
            ("apps/v1",),
            ("apps/v1",),
        )
        ledger.append(event)
        for output in decide(ledger.state, sets, event.meta):
            ledger.append(output)
    [statefulsets] = active_migrations(ledger.state, sets)
    assert statefulsets.target_version == "apps/v1"

    for apiserver in ("a1", "a2", "a3"):
        ledger.report(apiserver, "v2")

    assert ledger.active() == [("v2", "Pending")]
    assert active_migrations(ledger.state, sets) == [statefulsets]
