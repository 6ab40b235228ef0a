"""A follower that reads the state alone (the lease GC) folds what one that reads every
event folds (:class:`consumers.partitions.PartitionFollower`, ``events=False``)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.partitions import PartitionFollower, PartitionLog
from ledger.events import Event, Position
from projections import fold
from projections.state import State
from tests.consumed import by_partition, consumed
from tests.histories import histories


def partition_log(partition: int) -> PartitionLog:
    # The fold touches neither the follower nor the producer.
    return PartitionLog(None, partition, None, 0)  # type: ignore[arg-type]


def polled(
    history: list[tuple[Event, Position]], cuts: list[int], *, events: bool
) -> dict[int, PartitionLog]:
    """Each partition's log after folding ``history`` in polls cut at ``cuts``, each poll
    handed over as the consumer would, with what was folded before delivered again."""
    logs: dict[int, PartitionLog] = {}
    messages = [consumed(event, position) for event, position in history]
    for start, end in itertools.pairwise([0, *cuts, len(messages)]):
        for partition, batch in by_partition(messages[max(0, start - 2) : end]).items():
            log = logs.setdefault(partition, partition_log(partition))
            if events:
                PartitionFollower._fold(log, batch)
            else:
                PartitionFollower._fold_state(log, batch)
            log._advance(batch[-1].offset + 1)
    return logs


def merged(logs: dict[int, PartitionLog]) -> State:
    state = State()
    for log in logs.values():
        for name in ("leases", "storage_versions", "storage_states", "migrations"):
            getattr(state, name).update(getattr(log.state, name))
    return state


@settings(max_examples=200, deadline=None)
@given(history=histories(), data=st.data())
def test_the_state_alone_is_the_state_of_every_event(
    history: list[tuple[Event, Position]], data: Any
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(history) - 1, 1)), max_size=6)))
    thinned = polled(history, cuts, events=False)
    assert merged(thinned) == fold.fold(history)
    assert merged(thinned) == merged(polled(history, cuts, events=True))
