"""Dealing partitions by backlog (:mod:`ledger.assignment`), without a broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledger import assignment

backlogs = st.dictionaries(st.integers(0, 40), st.integers(0, 10**7), max_size=40)
member_ids = st.lists(
    st.text("abcdef", min_size=1, max_size=6), min_size=1, max_size=8, unique=True
)


@given(backlog=backlogs, members=member_ids, extra=st.sets(st.integers(0, 40)))
def test_every_partition_goes_to_one_member_and_no_member_carries_a_partition_more_than_another(
    backlog: dict[int, int], members: list[str], extra: set[int]
) -> None:
    partitions = set(backlog) | extra  # some without a report: no backlog known
    dealt = assignment.deal(partitions, backlog, members)
    assert sorted(dealt) == sorted(members)
    held = [p for ps in dealt.values() for p in ps]
    assert sorted(held) == sorted(partitions)
    loads = [sum(backlog.get(p, 0) for p in ps) for ps in dealt.values()]
    # Each partition went to the lightest member: none is heavier than another by more
    # than the heaviest partition.
    assert max(loads) - min(loads) <= max(backlog.values(), default=0)
    assert dealt == assignment.deal(sorted(partitions, reverse=True), backlog, members[::-1])


@given(partitions=st.sets(st.integers(0, 40)), members=member_ids)
def test_without_backlog_the_partitions_are_dealt_by_count(
    partitions: set[int], members: list[str]
) -> None:
    counts = [len(ps) for ps in assignment.deal(partitions, {}, members).values()]
    assert max(counts) - min(counts) <= 1


def test_two_projectors_of_the_benchs_log_split_it_near_half() -> None:
    # The bench's 50 clusters over 6 partitions, by the records each held: round robin
    # deals 0, 2, 4 and 1, 3, 5, which is 281k against 719k.
    backlog = {0: 59516, 1: 119863, 2: 80743, 3: 259758, 4: 140480, 5: 339640}
    dealt = assignment.deal(backlog, backlog, ["a", "b"])
    assert dealt == {"a": [0, 1, 5], "b": [2, 3, 4]}


@given(backlog=backlogs, other=backlogs)
def test_the_leader_takes_each_partitions_smallest_report(
    backlog: dict[int, int], other: dict[int, int]
) -> None:
    merged = assignment.merged([assignment.report(backlog), assignment.report(other)])
    assert set(merged) == set(backlog) | set(other)
    for partition, records in merged.items():
        reported = [r[partition] for r in (backlog, other) if partition in r]
        assert records == min(reported)


def test_a_report_that_is_not_a_backlog_says_nothing() -> None:
    # A member of an earlier release offers round robin with empty user data.
    junk = [b"", b"\x00\x01", b"[1, 2]", b'{"x": 1}', b'{"1": "many"}', b'{"2": -5}']
    assert assignment.merged([*junk, assignment.report({3: 7})]) == {3: 7}
