"""Fold snapshots hold a partition's rows exactly, and refuse what they did not write."""

from __future__ import annotations

import dataclasses
import pickle
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.events import Event, Position
from projections.fold import fold
from projections.snapshots import CorruptSnapshot, Snapshot, state_of, take
from projections.state import State
from tests.histories import histories


def snapshots_of(state: State, history: list[tuple[Event, Position]]) -> list[Snapshot]:
    partitions = sorted({position.partition for _, position in history})
    return [take(state, "views", "t", p, 1, None) for p in partitions]


@given(histories())
def test_the_snapshots_of_every_partition_make_the_state_again(
    history: list[tuple[Event, Position]],
) -> None:
    state = fold(history)

    rebuilt = state_of(snapshot.state_rows() for snapshot in snapshots_of(state, history))

    assert rebuilt == state
    assert rebuilt.resources_by_apiserver == state.resources_by_apiserver
    assert rebuilt.active_migrations_by_resource == state.active_migrations_by_resource
    assert rebuilt.inactive_migrations_by_resource == state.inactive_migrations_by_resource


@given(histories(), st.data())
def test_a_partitions_snapshot_holds_its_own_rows_and_one_cluster_can_be_taken(
    history: list[tuple[Event, Position]], data: st.DataObject
) -> None:
    state = fold(history)
    snapshot = data.draw(st.sampled_from(snapshots_of(state, history) or [None]))
    if snapshot is None:
        return
    leases, versions, states, migrations, seen, crds, audits, known = snapshot.state_rows()
    rows = [*leases, *versions, *states, *migrations, *crds, *audits]
    assert all(row.revision.startswith(f"{snapshot.partition}:") for row in [*rows, *seen])
    assert all(row.partition == snapshot.partition for row in known)
    assert snapshot.rows == len(rows) + len(known)
    clusters = {row.cluster for row in [*rows, *seen]}
    # Every cluster with a row is listed, with its latest event time; and one with none.
    assert clusters <= {row.cluster for row in known}
    assert {row.cluster: row for row in known} == {
        name: row for name, row in state.clusters.items() if row.partition == snapshot.partition
    }
    cluster = data.draw(st.sampled_from(sorted(clusters) or ["none"]))
    alone = state_of([snapshot.state_rows()], cluster)
    assert set(alone.clusters) == {row.cluster for row in known} & {cluster}
    assert set(alone.leases) == {lease.key for lease in leases if lease.cluster == cluster}
    assert set(alone.migrations) == {m.key for m in migrations if m.cluster == cluster}
    assert set(alone.custom_resources) == {c.key for c in crds if c.cluster == cluster}
    assert set(alone.seen) == ({cluster} & {row.cluster for row in seen})


@given(histories(max_events=30), st.data())
def test_a_changed_byte_is_caught_by_the_digest(
    history: list[tuple[Event, Position]], data: st.DataObject
) -> None:
    snapshot = take(fold(history), "views", "t", 0, 1, None)
    index = data.draw(st.integers(0, len(snapshot.payload) - 1))
    flipped = bytearray(snapshot.payload)
    flipped[index] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptSnapshot, match="digest"):
        dataclasses.replace(snapshot, payload=bytes(flipped)).state_rows()


class _Touch:
    """Pickles as a call that creates a file: what a tampered payload could try."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(self.path),))


def test_a_payload_that_would_run_code_is_refused_even_with_a_right_digest(
    tmp_path: Path,
) -> None:
    target = tmp_path / "touched"
    payload = zlib.compress(pickle.dumps(((_Touch(target),), (), (), (), ())))
    unsigned = Snapshot("views", "t", 0, 1, None, 1, payload, "")
    forged = dataclasses.replace(unsigned, digest=unsigned.computed_digest())

    with pytest.raises(CorruptSnapshot, match="is not a fold row"):
        forged.state_rows()
    assert not target.exists()


def test_a_snapshot_of_another_format_or_shape_is_refused() -> None:
    snapshot = take(State(), "views", "t", 0, 1, None)
    with pytest.raises(CorruptSnapshot, match="format"):
        dataclasses.replace(snapshot, format=99).state_rows()
    payload = zlib.compress(pickle.dumps(("not", "rows")))
    shapeless = dataclasses.replace(snapshot, payload=payload)
    with pytest.raises(CorruptSnapshot, match="eight tuples"):
        dataclasses.replace(shapeless, digest=shapeless.computed_digest()).state_rows()


@pytest.mark.parametrize(
    "elsewhere",
    [
        {"next_offset": 2},
        {"partition": 1},
        {"log_time": datetime(2024, 1, 1, tzinfo=UTC)},
        {"topic": "other"},
        {"projection": "other"},
    ],
)
def test_a_sound_snapshot_filed_in_another_place_is_refused(elsewhere: dict[str, Any]) -> None:
    """A row's payload and digest copied over another row's (a restore gone wrong): the
    rows are sound, but of another point of the log."""
    snapshot = take(State(), "views", "t", 0, 1, None)
    snapshot.state_rows()
    with pytest.raises(CorruptSnapshot, match="digest"):
        dataclasses.replace(snapshot, **elsewhere).state_rows()
