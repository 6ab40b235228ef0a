"""Thinning plain lease renewals (:mod:`projections.thinning`) changes no view.

The reference is folding every event one by one (:func:`projections.fold.fold`) and
classifying each heartbeat by reading the lease before it, written out here without
the product's term digests. Whatever the batches, and whatever each record's headers
(as every writer lays them out, so a plain renewal is counted undecoded; as written
before the time and lease headers existed; in another order, with one more), the state
after the batches is the reference's, row and revision alike;
the logged events are exactly the others; the counts per holder add up to the
reference's.
"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    Event,
    Meta,
    Position,
    StorageVersionReported,
    micros,
)
from ledger.kafka import LEASE_HEADER, TIME_HEADER, Message, Record, decode_message
from projections import fold
from projections.projector import Projection, fold_batch
from projections.state import HolderKey, State
from tests.consumed import LAYOUTS, TOPIC, Layout, by_partition, consumed
from tests.histories import histories, plain_renewals

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def handed_over(event: Event, position: Position, headers: Layout = "written") -> Message:
    return consumed(event, position, headers=headers)


def in_batches(
    records: list[Message], cuts: list[int]
) -> tuple[State, list[Position], dict[HolderKey, tuple[int, int, int, int]], int]:
    projection = Projection("views", TOPIC, State(), {})
    logged: list[Position] = []
    counts: dict[HolderKey, tuple[int, int, int, int]] = {}
    folded = 0
    for start, end in itertools.pairwise([0, *cuts, len(records)]):
        batch = fold_batch(projection, by_partition(records[start:end]))
        assert not batch.dead
        folded += batch.result.folded
        logged += [Position(partition, offset) for partition, offset, *_ in batch.batch.events]
        for holder, count in batch.batch.renewals.items():
            _, first, _, renewals = counts.get(holder, (0, count.first_offset, 0, 0))
            counts[holder] = (
                count.partition,
                first,
                count.last_offset,
                renewals + count.renewals,
            )
    return projection.state, logged, counts, folded


@settings(max_examples=300)
@given(history=histories(), data=st.data())
def test_any_batching_of_thinned_renewals_folds_as_one_by_one(
    history: list[tuple[Event, Position]], data: st.DataObject
) -> None:
    layouts = st.sampled_from(LAYOUTS)
    headers = data.draw(st.lists(layouts, min_size=len(history), max_size=len(history)))
    records = [
        handed_over(event, position, layout)
        for (event, position), layout in zip(history, headers, strict=True)
    ]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(history) - 1, 1)), max_size=8)))
    state, logged, counts, folded = in_batches(records, cuts)
    plain, expected_counts = plain_renewals(history)
    assert state == fold.fold(history)
    assert sorted(logged) == sorted(position for _, position in history if position not in plain)
    assert counts == expected_counts
    assert folded == len(history)


def heartbeat(offset: int, renewed: datetime, holder: str = "a1_1") -> tuple[Event, Position]:
    meta = Meta(f"e{offset}", "east", renewed, "a1")
    return ApiserverHeartbeat(meta, "a1", holder, "cp-0", 60, renewed, "1.31"), Position(0, offset)


def test_a_renew_time_that_goes_back_and_forth_gets_the_revision_one_by_one_gives() -> None:
    t1 = T0 + timedelta(seconds=10)
    history = [heartbeat(0, T0), heartbeat(1, t1), heartbeat(2, T0), heartbeat(3, T0)]
    records = [handed_over(event, position) for event, position in history]
    state, logged, counts, _ = in_batches(records, [1])
    assert state == fold.fold(history)
    assert state.leases["east", "a1"].revision == "0:2"
    assert logged == [Position(0, 0)]
    assert counts == {("east", "a1", "a1_1"): (0, 1, 3, 3)}


def test_an_expiry_between_renewals_reads_the_renew_time_before_it() -> None:
    t1, t2 = T0 + timedelta(seconds=10), T0 + timedelta(seconds=20)
    for last_renew, applied in ((t1, True), (T0, False)):
        meta = Meta("x", "east", t2, "lease-gc")
        expiry = (ApiserverLeaseExpired(meta, "a1", last_renew, 60), Position(0, 2))
        history = [heartbeat(0, T0), heartbeat(1, t1), expiry, heartbeat(3, t2)]
        records = [handed_over(event, position) for event, position in history]
        state, logged, _, _ = in_batches(records, [])
        assert state == fold.fold(history)
        # Applied, the expiry ends the lease and the next heartbeat starts it again.
        assert logged == [Position(0, 0), Position(0, 2)] + [Position(0, 3)] * applied


def test_a_rejected_heartbeat_leaves_the_lease_as_its_renewals_left_it() -> None:
    # A lease duration of 0 is refused (upstream's ValidateLease): unlike an accepted
    # heartbeat, which overwrites the lease, it leaves the renewals before it in force.
    t1, t2 = T0 + timedelta(seconds=10), T0 + timedelta(seconds=20)
    refused, _ = heartbeat(3, t2 + timedelta(seconds=10))
    assert isinstance(refused, ApiserverHeartbeat)
    history = [
        heartbeat(0, T0),
        heartbeat(1, t1),
        heartbeat(2, t2),
        (dataclasses.replace(refused, lease_duration_seconds=0), Position(0, 3)),
    ]
    records = [handed_over(event, position) for event, position in history]
    state, logged, counts, _ = in_batches(records, [])
    assert state == fold.fold(history)
    lease = state.leases["east", "a1"]
    assert (lease.renew_time, lease.revision, lease.lease_duration_seconds) == (t2, "0:2", 60)
    assert logged == [Position(0, 0), Position(0, 3)]
    assert counts == {("east", "a1", "a1_1"): (0, 1, 2, 2)}


def test_an_unreadable_last_renewal_is_a_dead_letter_neither_counted_nor_folded() -> None:
    t1, t2 = T0 + timedelta(seconds=10), T0 + timedelta(seconds=20)
    history = [heartbeat(0, T0), heartbeat(1, t1), heartbeat(2, t2)]
    records = [handed_over(event, position) for event, position in history]
    broken = consumed(*history[2], value=b"\xc3\x01garbage")
    assert any(name == LEASE_HEADER for name, _ in broken.headers)
    records[2] = broken
    projection = Projection("views", TOPIC, State(), {})
    folded = fold_batch(projection, by_partition(records))
    assert projection.state == fold.fold(history[:2])  # as if it were not in the log
    [(dead, reason)] = folded.dead
    assert dead is broken and "truncated record" in reason
    [count] = folded.batch.renewals.values()
    assert (count.first_offset, count.last_offset, count.renewals) == (1, 1, 1)


def test_a_renewal_whose_value_is_no_heartbeat_is_a_dead_letter_wherever_it_stands() -> None:
    # Early in a run, where only its headers would be read: folding the run reads the
    # last renewal and the one before it.
    history = [heartbeat(i, T0 + timedelta(seconds=10 * i)) for i in range(5)]
    records = [handed_over(event, position) for event, position in history]
    for value in (b"", b"\x00not avro", b"\xc3\x01" + bytes(8) + b"body"):
        records[1] = consumed(*history[1], value=value)
        projection = Projection("views", TOPIC, State(), {})
        folded = fold_batch(projection, by_partition(records))
        [(dead, _)] = folded.dead
        assert dead is records[1]
        assert projection.state == fold.fold([history[0], *history[2:]])
        [count] = folded.batch.renewals.values()
        assert (count.first_offset, count.renewals) == (2, 3)


def lying(event: Event, position: Position, headers_of: Event) -> Message:
    """The record of ``event`` under the headers a writer would give ``headers_of``."""
    return dataclasses.replace(
        consumed(event, position), headers=consumed(headers_of, position).headers
    )


def test_a_record_under_another_events_headers_is_a_dead_letter_for_every_reader() -> None:
    # A report, and a heartbeat of a new holder, each under a plain renewal's headers,
    # then a plain renewal: the fold reads the lying ones when it folds the run, and
    # a reader that decodes every record refuses them the same way.
    t1, t2, t3 = (T0 + timedelta(seconds=s) for s in (10, 20, 30))
    renewal = heartbeat(1, t1)[0]
    report = StorageVersionReported(
        Meta("r", "east", t1, "a1"), "a1", "apps", "deployments", "Deployment",
        "apps/v1", ("apps/v1",), ("apps/v1",),
    )  # fmt: skip
    new_holder = heartbeat(3, t2, holder="a1_2")[0]
    history = [heartbeat(0, T0), (renewal, Position(0, 1)), heartbeat(4, t3)]
    liars = [lying(report, Position(0, 2), renewal), lying(new_holder, Position(0, 3), renewal)]
    for liar in liars:
        records = [handed_over(*history[0]), handed_over(*history[1]), liar]
        records += [handed_over(*history[2])] * (liar is liars[0])
        projection = Projection("views", TOPIC, State(), {})
        folded = fold_batch(projection, by_partition(records))
        [(dead, reason)] = folded.dead
        assert dead is liar and "a writer must build the headers from the event" in reason
        assert decode_message(liar) == reason
        assert projection.state == fold.fold(history[: 2 + (liar is liars[0])])


def test_a_record_whose_time_header_is_not_its_events_time_is_a_dead_letter() -> None:
    event, position = heartbeat(0, T0)
    other_time = consumed(heartbeat(0, T0 + timedelta(seconds=1))[0], position).headers
    record = dataclasses.replace(consumed(event, position), headers=other_time)
    reason = decode_message(record)
    assert isinstance(reason, str) and "header svledger-time" in reason
    assert isinstance(decode_message(consumed(event, position)), Record)


def test_a_heartbeat_written_before_the_time_header_is_decoded_and_its_time_counts() -> None:
    history = [heartbeat(0, T0), heartbeat(1, T0 + timedelta(seconds=10))]
    old = consumed(*history[1])
    old = dataclasses.replace(old, headers=tuple(h for h in old.headers if h[0] != TIME_HEADER))
    assert any(name == LEASE_HEADER for name, _ in old.headers)
    projection = Projection("views", TOPIC, State(), {})
    fold_batch(projection, by_partition([handed_over(*history[0]), old]))
    assert projection.state == fold.fold(history)
    assert projection.log_times == {0: micros(T0 + timedelta(seconds=10))}


def test_a_heartbeat_of_a_new_holder_is_logged_and_ends_the_renewals() -> None:
    history = [
        heartbeat(0, T0),
        heartbeat(1, T0 + timedelta(seconds=10)),
        heartbeat(2, T0 + timedelta(seconds=20), holder="a1_2"),
        heartbeat(3, T0 + timedelta(seconds=30), holder="a1_2"),
    ]
    records = [handed_over(event, position) for event, position in history]
    state, logged, counts, _ = in_batches(records, [])
    assert state == fold.fold(history)
    assert logged == [Position(0, 0), Position(0, 2)]
    assert counts == {
        ("east", "a1", "a1_1"): (0, 1, 1, 1),
        ("east", "a1", "a1_2"): (0, 3, 3, 1),
    }
    assert dataclasses.asdict(state.leases["east", "a1"])["holder_identity"] == "a1_2"
