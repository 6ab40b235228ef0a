"""Dealing a topic's partitions to the members of a consumer group by their backlog.

A projector that catches up is limited by the records it has to fold, not by how many
partitions it holds. Kafka's own assignors deal partitions by count (aiokafka's default
deals them round robin), and the partitions of a ledger are seldom equally full: a
cluster is one partition, and a few busy clusters can fill one partition with three
times what another holds. Two projectors sharing such a log by count may split it
three to one, so that the second process saves a quarter of the time, not half
(``bench/projector_bench.py``'s ``processes_postgresql``).

So each member says, in the user data of its join request, how many records it knows
each partition still has to be folded (the log's end less the views' checkpoint), and
the group's leader deals the partitions by that backlog (:func:`deal`): the heaviest
first, each to the member with the least backlog so far. Greedy dealing ends with no
member more than one partition's backlog above another (it gives each partition to the
lightest), and within 4/3 of the best split. Once caught up every backlog is nought
and the partitions are dealt by count, as round robin deals them.

A member knows the backlog of the partitions it folds as of now and of the others as of
its last load, so the leader takes each partition's smallest report: the views' newest
checkpoint. The backlog is a weight, never a promise: whoever holds a partition, the
SQL checkpoint says where it resumes.

The protocol is offered under the name of aiokafka's default, ``roundrobin``, and alone.
Only the leader's assignor deals, and the protocol's name is all the members must agree
on: in a group that still has a member of an earlier release (which offers round robin
alone), whichever member leads deals the partitions, its way, and each member reads
what it is given (an earlier leader ignores the backlog reports). Offering a second
protocol beside it would not do: aiokafka (0.14) sends one join request per protocol
it offers, each with one more, and the broker takes each as a member whose metadata
changed, so it rebalances again; two members joining at once on a loaded machine then
never settle (seen: generation 95 within a minute).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

NAME: Final = "roundrobin"
"""The assignment protocol's name in the group: round robin's, so that members of
earlier releases, which offer only that, share the group (see the module docstring)."""


def deal(
    partitions: Iterable[int], backlog: Mapping[int, int], members: Sequence[str]
) -> dict[str, list[int]]:
    """Each of ``members`` (IDs) and the ``partitions`` it is to read.

    Heaviest ``backlog`` first (then lowest number), each partition goes to the member
    with the least backlog dealt so far, then with the fewest partitions, then the first
    by ID: deterministic, and by count alone when no partition has a backlog.
    """
    dealt: dict[str, list[int]] = {member: [] for member in sorted(members)}
    if not dealt:
        return {}
    loads = {member: 0 for member in dealt}
    for partition in sorted(set(partitions), key=lambda p: (-backlog.get(p, 0), p)):
        member = min(dealt, key=lambda m: (loads[m], len(dealt[m]), m))
        dealt[member].append(partition)
        loads[member] += backlog.get(partition, 0)
    return {member: sorted(held) for member, held in dealt.items()}


def report(backlog: Mapping[int, int]) -> bytes:
    """A member's backlog as its join request's user data."""
    return json.dumps(
        {str(p): n for p, n in sorted(backlog.items())}, separators=(",", ":")
    ).encode()


def merged(reports: Iterable[bytes]) -> dict[int, int]:
    """Each partition's smallest reported backlog. A report that is not one of
    :func:`report`'s (a member of another release, say) says nothing."""
    found: dict[int, int] = {}
    for data in reports:
        try:
            read = json.loads(data) if data else {}
            backlog = {int(p): int(n) for p, n in read.items()}
        except (ValueError, TypeError, AttributeError):
            continue
        for partition, records in backlog.items():
            if records >= 0:
                found[partition] = min(records, found.get(partition, records))
    return found
