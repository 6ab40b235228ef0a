"""A follower that reads the state alone (the lease GC), or every event but plain lease
renewals (the migrator), folds what one that reads every event folds
(:class:`consumers.partitions.PartitionFollower`, ``events=False``, ``renewals=False``)."""

from __future__ import annotations

import copy
import itertools
from typing import Any, TypeAlias

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.partitions import PartitionFollower, PartitionLog
from ledger.events import ApiserverHeartbeat, Event, Meta, Position
from ledger.kafka import first_at
from projections import fold
from projections.state import Changes, State
from tests.consumed import by_partition, consumed
from tests.histories import histories


def partition_log(partition: int) -> PartitionLog:
    # The fold touches neither the follower nor the producer.
    return PartitionLog(None, partition, None, 0)  # type: ignore[arg-type]


Polls: TypeAlias = list[tuple[list[tuple[Event, Changes]], dict[str, Meta]]]


def polled(
    history: list[tuple[Event, Position]],
    cuts: list[int],
    *,
    mode: str,
    settles: frozenset[int] = frozenset(),
    settled: list[tuple[int, State]] | None = None,
) -> tuple[dict[int, PartitionLog], Polls]:
    """Each partition's log after folding ``history`` in polls cut at ``cuts``, each poll
    handed over as the consumer would, with what was folded before delivered again; and
    what each poll of each partition gave a consumer: its events and their changes, and
    each cluster's latest meta (``mode``: "every event", "state alone", "no renewals").

    A thinning follower folds its pending renewals after the polls ending at
    ``settles`` (appending to ``settled`` how far it had read and the state then), and
    at the end."""
    logs: dict[int, PartitionLog] = {}
    polls: Polls = []
    messages = [consumed(event, position) for event, position in history]
    for start, end in itertools.pairwise([0, *cuts, len(messages)]):
        if start in settles:
            for log in logs.values():
                log.settle()
            if settled is not None:
                settled.append((start, copy.deepcopy(merged(logs))))
        for partition, batch in by_partition(messages[max(0, start - 2) : end]).items():
            log = logs.setdefault(partition, partition_log(partition))
            events: list[tuple[Event, Changes]] = []
            if mode == "every event":
                events = PartitionFollower._fold(log, batch)
                polls.append((events, {e.meta.cluster: e.meta for e, _ in events}))
            elif mode == "state alone":
                PartitionFollower._fold_thinned(log, batch, None)
            else:
                latest = PartitionFollower._latest(batch[first_at(batch, log.position) :])
                PartitionFollower._fold_thinned(log, batch, events)
                polls.append((events, latest))
            log._advance(batch[-1].offset + 1)
    for log in logs.values():
        log.settle()
    return logs, polls


def merged(logs: dict[int, PartitionLog]) -> State:
    state = State()
    for log in logs.values():
        for name in (
            "leases",
            "storage_versions",
            "storage_states",
            "migrations",
            "seen",
            "custom_resources",
            "audits",
            "clusters",
        ):
            getattr(state, name).update(getattr(log.state, name))
    return state


@settings(max_examples=200, deadline=None)
@given(history=histories(), data=st.data())
def test_the_state_alone_is_the_state_of_every_event(
    history: list[tuple[Event, Position]], data: Any
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(history) - 1, 1)), max_size=6)))
    settles = frozenset(data.draw(st.sets(st.sampled_from(cuts)))) if cuts else frozenset()
    settled: list[tuple[int, State]] = []
    thinned, _ = polled(history, cuts, mode="state alone", settles=settles, settled=settled)
    assert merged(thinned) == fold.fold(history)
    # Renewals carried over polls: once folded, the state is that of what was read.
    assert [read for read, _ in settled] == sorted(settles)
    for read, state in settled:
        assert state == fold.fold(history[:read])
    every, _ = polled(history, cuts, mode="every event")
    assert merged(thinned) == merged(every)


@settings(max_examples=200, deadline=None)
@given(history=histories(), data=st.data())
def test_without_renewals_every_other_event_changes_what_it_changes_one_by_one(
    history: list[tuple[Event, Position]], data: Any
) -> None:
    """What the migrator reacts to: each event but heartbeats, in order, with the keys it
    changed, and each cluster's latest event (heartbeats included) per poll."""
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(history) - 1, 1)), max_size=6)))
    settles = frozenset(data.draw(st.sets(st.sampled_from(cuts)))) if cuts else frozenset()
    every, every_polls = polled(history, cuts, mode="every event")
    thinned, thinned_polls = polled(history, cuts, mode="no renewals", settles=settles)
    assert merged(thinned) == merged(every) == fold.fold(history)
    assert len(thinned_polls) == len(every_polls)
    for (events, latest), (all_events, all_latest) in zip(thinned_polls, every_polls, strict=True):
        assert latest == all_latest
        assert _but_heartbeats(events) == _but_heartbeats(all_events)
        # A heartbeat listed is one that is not a plain renewal: what it changed is as
        # one by one (its lease).
        assert all(item in all_events for item in events)


def _but_heartbeats(events: list[tuple[Event, Changes]]) -> list[tuple[Event, Changes]]:
    return [(e, c) for e, c in events if not isinstance(e, ApiserverHeartbeat)]
