"""The read API's fold of the log it finds at start-up, plain renewals thinned
(:meth:`readapi.ledger.LedgerViews._fold_thinned`), is the fold of every event one by one.

Whatever the polls' boundaries and the records' header layouts, with clusters sharing a
partition: the same clusters, each with the same rows, creations (so the same uids and
creationTimestamps), time and offset, and the same checkpoints (so the same views of the
past); the watch window starts after what was thinned.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.events import ApiserverHeartbeat, Event, Position
from ledger.kafka import Record
from ledger.settings import KafkaSettings
from readapi.ledger import ClusterFold, LedgerViews
from tests.consumed import LAYOUTS, consumed
from tests.histories import histories
from tests.workloads import mixed_events

SETTINGS = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic="t", partitions=1)


def views(checkpoint_every: int) -> LedgerViews:
    return LedgerViews(SETTINGS, checkpoint_every=checkpoint_every, recent_checkpoints=10_000)


def one_partition(events: list[Event]) -> list[tuple[Event, Position]]:
    """Every cluster's events in one partition, in the order given."""
    return [(event, Position(0, offset)) for offset, event in enumerate(events)]


def same_fold(thinned: ClusterFold, one_by_one: ClusterFold) -> None:
    assert thinned.state == one_by_one.state
    assert thinned.rows == one_by_one.rows
    assert (thinned.time, thinned.offset) == (one_by_one.time, one_by_one.offset)


def same_views(thinned: LedgerViews, one_by_one: LedgerViews) -> None:
    assert thinned.clusters.keys() == one_by_one.clusters.keys()
    for name, fold in one_by_one.clusters.items():
        same_fold(thinned.clusters[name], fold)
    assert thinned.events_folded == one_by_one.events_folded
    taken = one_by_one._checkpoints.get(0, [])
    assert [c.next_offset for c in thinned._checkpoints.get(0, [])] == [
        c.next_offset for c in taken
    ]
    for mine, theirs in zip(thinned._checkpoints.get(0, []), taken, strict=True):
        assert mine.folds.keys() == theirs.folds.keys()
        for name, fold in theirs.folds.items():
            same_fold(mine.folds[name], fold)


@settings(max_examples=200, deadline=None)
@given(history=histories(), data=st.data())
def test_any_polls_of_the_log_at_start_up_fold_as_one_by_one(
    history: list[tuple[Event, Position]], data: st.DataObject
) -> None:
    log = one_partition([event for event, _ in history])
    every = data.draw(st.integers(1, 25), label="checkpoint every")
    one_by_one = views(every)
    one_by_one._fold([Record(position, event, b"") for event, position in log])

    thinned = views(every)
    messages = [consumed(e, p, headers=data.draw(st.sampled_from(LAYOUTS))) for e, p in log]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(log) - 1)), max_size=5)))
    for start, end in itertools.pairwise([0, *cuts, len(log)]):
        assert thinned._fold_thinned(0, messages[start:end]) == []
    same_views(thinned, one_by_one)
    for name, fold in thinned.clusters.items():
        last = max(p.offset for e, p in log if e.meta.cluster == name)
        assert fold.horizon == last and not fold.changes  # a watch starts after them


def test_a_fleets_log_at_start_up_folds_as_one_by_one_with_most_renewals_undecoded() -> None:
    log = one_partition(list(mixed_events(6_000, clusters=7)))
    one_by_one = views(1_000)
    one_by_one._fold([Record(position, event, b"") for event, position in log])
    thinned = views(1_000)
    for start in range(0, len(log), 2_500):
        assert (
            thinned._fold_thinned(0, [consumed(e, p) for e, p in log[start : start + 2_500]]) == []
        )
    same_views(thinned, one_by_one)


def test_a_record_that_does_not_decode_is_handed_back_and_the_rest_folds() -> None:
    log = one_partition(list(mixed_events(300, clusters=2)))
    # Not a renewal: one would be counted by its headers and left out of the fold.
    bad = next(p.offset for e, p in log[100:] if not isinstance(e, ApiserverHeartbeat))
    corrupt = consumed(*log[bad], value=b"\xc3\x01 not an event")
    thinned = views(10_000)
    dead = thinned._fold_thinned(
        0, [corrupt if p.offset == bad else consumed(e, p) for e, p in log]
    )
    assert [(message.offset, "unknown writer schema" in reason) for message, reason in dead] == [
        (bad, True)
    ]
    one_by_one = views(10_000)
    one_by_one._fold([Record(p, e, b"") for e, p in log if p.offset != bad])
    for name, fold in one_by_one.clusters.items():
        same_fold(thinned.clusters[name], fold)


def test_a_key_whose_records_all_fail_to_decode_is_no_cluster() -> None:
    event, position = one_partition(list(mixed_events(1)))[0]
    thinned = views(10)
    dead = thinned._fold_thinned(0, [consumed(event, position, value=b"junk")])
    assert len(dead) == 1
    assert thinned.clusters == {}
