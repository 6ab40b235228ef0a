"""Properties of the fold over random coherent histories (:mod:`tests.histories`).

Batching must not matter: the projector folds the log in batches and restarts from a
State rebuilt from the database rows, so folding a history in two parts, the second
from the rows alone, must equal folding it at once. The fold must be deterministic,
report exactly the rows it changed, and keep the views' invariants after every event.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ledger.events import Event, MigrationSucceeded, Position, StorageStateReset
from projections.fold import apply, fold
from projections.state import Changes, State, seen_by_cluster
from tests.histories import histories, storage_version_hash

TABLES = (
    "leases",
    "storage_versions",
    "storage_states",
    "migrations",
    "custom_resources",
    "audits",
)
# The views: the tables of rows with a revision, and each cluster's latest event time.
VIEWS = (*TABLES, "clusters")
# The tables of the rows the read API serves, which record their creation.
SERVED = ("leases", "storage_versions", "storage_states", "migrations")


def rows(state: State) -> dict[str, dict[Any, Any]]:
    """A copy of every view's rows (the rows themselves are immutable)."""
    return {table: dict(getattr(state, table)) for table in VIEWS}


def reloaded(state: State) -> State:
    """A State built from the rows alone, as the projector loads it from the database:
    the views' rows and the event IDs it remembers (``ledger_events`` holds those)."""
    seen = (row for cluster in state.seen.values() for row in cluster.rows())
    return State(**rows(state), seen=seen_by_cluster(seen))


def fold_with_changes(history: list[tuple[Event, Position]], state: State) -> Changes:
    changes = Changes()
    for event, position in history:
        apply(state, event, position, changes)
    return changes


def assert_changes_are_the_differences(
    before: dict[str, dict[Any, Any]], after: State, changes: Changes
) -> None:
    """Changed keys are exactly the rows that differ, or rows created and deleted since."""
    for table in VIEWS:
        old, new = before[table], getattr(after, table)
        differ = {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}
        touched = getattr(changes, table)
        assert differ <= touched, table
        assert all(key not in old and key not in new for key in touched - differ), table


@given(histories(), st.data())
def test_folding_in_two_batches_equals_folding_at_once(
    history: list[tuple[Event, Position]], data: st.DataObject
) -> None:
    split = data.draw(st.integers(0, len(history)), label="split")
    whole = State()
    whole_changes = fold_with_changes(history, whole)

    first = State()
    first_changes = fold_with_changes(history[:split], first)
    at_split = rows(first)
    second = reloaded(first)
    second_changes = fold_with_changes(history[split:], second)

    assert second == whole
    assert second.resources_by_apiserver == whole.resources_by_apiserver
    assert second.active_migrations_by_resource == whole.active_migrations_by_resource
    assert second.inactive_migrations_by_resource == whole.inactive_migrations_by_resource
    assert_changes_are_the_differences(rows(State()), first, first_changes)
    assert_changes_are_the_differences(at_split, second, second_changes)
    assert first_changes.rejections + second_changes.rejections == whole_changes.rejections


@given(histories())
def test_a_repeated_event_changes_no_view(history: list[tuple[Event, Position]]) -> None:
    """Records that repeat an event (its ``event_id``, the idempotency key) leave every
    view as the log without them would."""
    ids: set[str] = set()
    without_repeats = []
    for event, position in history:
        if event.meta.event_id not in ids:
            ids.add(event.meta.event_id)
            without_repeats.append((event, position))

    assert rows(fold(history)) == rows(fold(without_repeats))


@given(histories())
def test_folding_is_deterministic(history: list[tuple[Event, Position]]) -> None:
    once, twice = fold(history), fold(history)

    assert once == twice
    assert repr(once) == repr(twice)


@given(histories())
def test_invariants_hold_after_every_event(history: list[tuple[Event, Position]]) -> None:
    state = State()
    for event, position in history:
        before = rows(state)
        changes = apply(state, event, position)

        assert_changes_are_the_differences(before, state, changes)
        for table in TABLES:
            for key in getattr(changes, table) & getattr(state, table).keys():
                assert getattr(state, table)[key].revision == str(position)
        for table in SERVED:
            for key, row in getattr(state, table).items():
                was = before[table].get(key)
                created = (
                    (str(position), event.meta.occurred_at)
                    if was is None
                    else (was.created_revision, was.created_at)
                )
                assert (row.created_revision, row.created_at) == created, table
        earlier = before["clusters"].get(event.meta.cluster)
        assert state.clusters[event.meta.cluster].latest_occurred_at == max(
            event.meta.occurred_at,
            event.meta.occurred_at if earlier is None else earlier.latest_occurred_at,
        )
        if changes.rejections and not isinstance(event, MigrationSucceeded):
            views = rows(state)
            assert all(views[t] == before[t] for t in TABLES), "a rejected event changed a view"
        rebuilt = reloaded(state)
        assert state.resources_by_apiserver == rebuilt.resources_by_apiserver
        assert state.active_migrations_by_resource == rebuilt.active_migrations_by_resource
        assert state.inactive_migrations_by_resource == rebuilt.inactive_migrations_by_resource
        assert_storage_versions_consistent(state)
        assert_entries_keep_their_order(before, state)
        assert_persisted_hashes_only_grow(before, state, event, changes)


def assert_entries_keep_their_order(before: dict[str, dict[Any, Any]], state: State) -> None:
    """As upstream's updater and GC: the entries that stay keep their order, and a new
    one comes after them."""
    for key, storage_version in state.storage_versions.items():
        ids = [entry.apiserver_id for entry in storage_version.entries]
        previous = before["storage_versions"].get(key)
        kept = [e.apiserver_id for e in previous.entries] if previous is not None else []
        kept = [apiserver_id for apiserver_id in kept if apiserver_id in ids]
        assert ids[: len(kept)] == kept
        assert len(ids) - len(kept) <= 1, "one event adds at most one entry"


def assert_storage_versions_consistent(state: State) -> None:
    for key, storage_version in state.storage_versions.items():
        cluster = key[0]
        ids = [entry.apiserver_id for entry in storage_version.entries]
        assert ids, "a StorageVersion without entries must have been deleted"
        keys = [entry.key for entry in storage_version.entries]
        assert len(keys) == len(set(keys)), "one entry per apiserver and source"
        assert all((cluster, apiserver) in state.leases for apiserver in ids)
        members = {a for c, a in state.leases if c == cluster}
        assert state.members_by_cluster.get(cluster, set()) == members
        versions = {entry.encoding_version for entry in storage_version.entries}
        reporting = {a for c, a in state.resources_by_apiserver if c == cluster}
        assert reporting == {
            e.apiserver_id
            for k, sv in state.storage_versions.items()
            if k[0] == cluster
            for e in sv.entries
        }
        unreported = members - reporting
        common = storage_version.common_encoding_version
        agreed = len(versions) == 1 and not unreported
        assert common == (versions.pop() if agreed else None)
        condition = storage_version.condition
        if len(versions) > 1:
            assert (condition.status, condition.reason) == ("False", "CommonEncodingVersionUnset")
            assert condition.message.startswith("Common encoding version unset")
        elif unreported:
            assert condition.status == "Unknown"
            assert condition.reason == "CommonEncodingVersionUnknown"
            assert all(apiserver in condition.message for apiserver in unreported)
        else:
            assert (condition.status, condition.reason, condition.message) == (
                "True",
                "CommonEncodingVersionSet",
                "Common encoding version set",
            )
        assert key in state.storage_states
    for key, storage_state in state.storage_states.items():
        reported = state.storage_versions.get(key)
        common = None if reported is None else reported.common_encoding_version
        expected = (
            None
            if reported is None or common is None
            else storage_version_hash(*common.rpartition("/")[::2], reported.kind)
        )
        assert storage_state.current_storage_version_hash == expected
        assert storage_state.persisted_storage_version_hashes


def assert_persisted_hashes_only_grow(
    before: dict[str, dict[Any, Any]], after: State, event: Event, changes: Changes
) -> None:
    """Persisted hashes only grow, but for a reset (to Unknown) or a fresh success (to target)."""
    replaced: dict[tuple[str, str, str], tuple[str, ...]] = {}
    if isinstance(event, StorageStateReset) and not changes.rejections:
        replaced[(event.meta.cluster, event.group, event.resource)] = ("Unknown",)
    if isinstance(event, MigrationSucceeded) and not changes.rejections:
        migration = after.migrations[(event.meta.cluster, event.migration_id)]
        replaced[migration.resource_key] = (migration.target_hash,)
    for key, old in before["storage_states"].items():
        hashes = after.storage_states[key].persisted_storage_version_hashes
        if key in replaced:
            assert hashes == replaced[key]
        else:
            assert hashes[: len(old.persisted_storage_version_hashes)] == (
                old.persisted_storage_version_hashes
            )


_FOLD_IN_A_PROCESS = """
import hashlib
from ledger.events import Position
from projections.fold import apply
from projections.state import State
from tests.workloads import mixed_events

state = State()
for offset, event in enumerate(mixed_events(3_000, clusters=4, seed=3)):
    apply(state, event, Position(0, offset))
print(hashlib.sha256(repr(state).encode()).hexdigest())
"""


def test_folding_is_deterministic_across_processes_and_hash_seeds() -> None:
    # A fold that iterated a set or a dict of strings in hash order would give other
    # views in another process (PYTHONHASHSEED is random per process by default).
    root = Path(__file__).resolve().parents[2]
    digests = {
        subprocess.run(
            [sys.executable, "-c", _FOLD_IN_A_PROCESS],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(digests) == 1
