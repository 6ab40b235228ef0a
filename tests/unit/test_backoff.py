"""The wait before rebuilding a partition whose transactions keep failing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumers.partitions import Backoff


@given(failures=st.integers(min_value=1, max_value=40), now=st.floats(0, 1e6))
def test_each_failure_in_a_row_doubles_the_wait_up_to_the_limit(failures: int, now: float) -> None:
    backoff = Backoff(base=0.5, limit=300.0)
    for n in range(1, failures + 1):
        wait = backoff.failed(7, now)
        ceiling = min(300.0, 0.5 * 2 ** (n - 1))
        assert ceiling / 2 <= wait <= ceiling
        assert backoff.waiting(7, now + wait / 2)
        assert not backoff.waiting(7, now + wait)
    assert not backoff.waiting(8, now)  # other partitions are not held back


def test_a_commit_that_succeeds_starts_the_count_again() -> None:
    backoff = Backoff(base=0.5, limit=300.0)
    for _ in range(6):
        backoff.failed(0, 0.0)
    backoff.succeeded(0)
    assert backoff.failed(0, 0.0) <= 0.5
