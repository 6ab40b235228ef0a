"""How a replay deals the partitions out to its processes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from projections.replay import Span

sizes = st.dictionaries(st.integers(0, 63), st.integers(0, 10_000), min_size=1, max_size=24)


@given(sizes=sizes, starts=st.integers(0, 500), parts=st.integers(1, 8))
def test_every_partition_goes_to_one_process_with_its_offsets(
    sizes: dict[int, int], starts: int, parts: int
) -> None:
    span = Span({p: min(starts, n) for p, n in sizes.items()}, dict(sizes))
    shares = span.split(parts)
    assert 1 <= len(shares) <= parts
    dealt = [p for share in shares for p in share.limits]
    assert sorted(dealt) == sorted(sizes)
    for share in shares:
        assert share.starts == {p: span.starts[p] for p in share.limits}
        assert share.limits == {p: span.limits[p] for p in share.limits}
    assert sum(share.total for share in shares) == span.total


@given(sizes=sizes, parts=st.integers(2, 8))
def test_no_process_reads_more_than_its_fair_share_and_the_largest_partition(
    sizes: dict[int, int], parts: int
) -> None:
    span = Span(dict.fromkeys(sizes, 0), dict(sizes))
    shares = span.split(parts)
    largest = max(sizes.values())
    # Dealing largest first to the least loaded: within one partition of the mean.
    assert max(share.total for share in shares) <= span.total / parts + largest
