"""Which of a partition's checkpoints the read API keeps: few, and near every point."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from readapi.ledger import kept


def _pruned(taken: int, recent: int) -> list[int]:
    """The checkpoints kept as the server keeps them: each new one prunes the list."""
    numbers: list[int] = []
    for number in range(1, taken + 1):
        numbers = [n for n in numbers if kept(n, number, recent)]
        numbers.append(number)
    return numbers


@given(taken=st.integers(1, 1500), recent=st.integers(1, 40))
def test_pruning_as_they_come_keeps_what_the_rule_keeps_for_the_last(
    taken: int, recent: int
) -> None:
    assert _pruned(taken, recent) == [n for n in range(1, taken + 1) if kept(n, taken, recent)]


@given(taken=st.integers(1, 100_000), recent=st.integers(1, 40))
def test_few_are_kept_the_newest_all_and_each_point_has_one_near_before_it(
    taken: int, recent: int
) -> None:
    numbers = [n for n in range(1, taken + 1) if kept(n, taken, recent)]
    assert len(numbers) <= recent * (math.log2(taken / recent + 1) + 1)
    newest = range(max(1, taken - recent + 1), taken + 1)
    assert set(newest) <= set(numbers)
    before = 0  # the fold before the first checkpoint: the empty one, at offset 0
    kept_numbers = iter(numbers)
    upcoming = next(kept_numbers, None)
    for number in range(1, taken + 1):
        if number == upcoming:
            before, upcoming = number, next(kept_numbers, None)
        assert number - before < 2 * ((taken - number) // recent + 1), (number, before)
