"""The worker's client-side rate limit (:class:`kube.client.RateLimit`), on a clock of its own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kube.client import RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_goes_at_once_and_the_rest_one_per_token_in_the_order_asked() -> None:
    clock = Clock()
    limit = RateLimit(qps=4, burst=3, now=clock)
    assert [limit.take() for _ in range(6)] == [0, 0, 0, 0.25, 0.5, 0.75]


def test_the_bucket_refills_at_qps_up_to_the_burst() -> None:
    clock = Clock()
    limit = RateLimit(qps=2, burst=2, now=clock)
    assert [limit.take() for _ in range(2)] == [0, 0]
    clock.now = 0.5  # one token back
    assert limit.take() == 0
    assert limit.take() == pytest.approx(0.5)
    clock.now = 100.0  # idle for long: the burst, no more
    assert [limit.take() for _ in range(3)] == [0, 0, pytest.approx(0.5)]


@given(
    qps=st.floats(0.5, 100),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=60),
)
def test_no_more_than_the_burst_plus_qps_a_second_start_and_none_overtakes(
    qps: float, burst: int, gaps: list[float]
) -> None:
    clock = Clock()
    limit = RateLimit(qps=qps, burst=burst, now=clock)
    starts = []
    for gap in gaps:
        clock.now += gap
        starts.append(clock.now + limit.take())
    assert starts == sorted(starts)
    for index, start in enumerate(starts):  # the requests up to this one, since time 0
        assert index + 1 <= burst + start * qps + 1e-6
