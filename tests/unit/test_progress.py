"""A reader catching up with the log says how far it is, how fast, and when it is there."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.progress import CatchUp


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    found = [r.getMessage() for r in caplog.records if r.name == "ledger.progress"]
    caplog.clear()
    return found


def test_a_line_every_interval_with_the_rate_and_the_time_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ledger.progress")
    clock = Clock()
    catch_up = CatchUp("serve", {0: 1_000, 1: 1_000}, {0: 0, 1: 200}, interval=10, clock=clock)
    assert catch_up.total == 1_800

    clock.now += 5
    catch_up.update({0: 300, 1: 200})
    assert lines(caplog) == []  # not yet: one line per interval

    clock.now += 5
    catch_up.update({0: 400, 1: 300})  # 500 read in 10 s: 50/s, 1,300 left
    assert lines(caplog) == [
        "serve: catching up with the log: 500 of 1800 records read (28%), 50 records/s,"
        " about 26 s left"
    ]

    clock.now += 10
    catch_up.update({0: 400, 1: 300})  # the rate is of the last interval alone
    assert lines(caplog) == [
        "serve: catching up with the log: 500 of 1800 records read (28%), 0 records/s,"
        " no progress since the last line"
    ]

    clock.now += 4
    catch_up.update({0: 1_000, 1: 1_500})  # the log grew meanwhile: the target is its end then
    assert lines(caplog) == ["serve: caught up with the log: 1800 records read in 24.0 s"]
    assert catch_up.done

    clock.now += 60
    catch_up.update({0: 2_000, 1: 2_000})
    assert lines(caplog) == []  # said once


def test_nothing_to_read_is_caught_up_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ledger.progress")
    catch_up = CatchUp("svledger-lease-gc: partition 3", {3: 50}, {3: 50}, clock=Clock())
    catch_up.update({})
    assert catch_up.done
    assert lines(caplog) == [
        "svledger-lease-gc: partition 3: caught up with the log: 0 records read in 0.0 s"
    ]


spans = st.dictionaries(
    st.integers(0, 5), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=6
)


@given(spans=spans, data=st.data())
def test_read_counts_each_record_of_the_spans_once(
    spans: dict[int, tuple[int, int]], data: st.DataObject
) -> None:
    starts = {p: min(a, b) for p, (a, b) in spans.items()}
    targets = {p: max(a, b) for p, (a, b) in spans.items()}
    catch_up = CatchUp("r", targets, starts, clock=Clock())
    positions = {
        p: data.draw(st.integers(starts[p], targets[p] + 10))
        for p in data.draw(st.permutations(list(spans)))
    }
    read = catch_up.read(positions)
    assert read == sum(min(positions[p], targets[p]) - starts[p] for p in positions)
    assert 0 <= read <= catch_up.total == sum(targets[p] - starts[p] for p in spans)
    assert catch_up.read(targets) == catch_up.total
    assert catch_up.read({}) == 0
