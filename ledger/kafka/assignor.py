"""The partition assignor aiokafka calls when a group deals partitions by backlog.

:mod:`ledger.assignment` decides, without Kafka, how a group's partitions are dealt by
the records each member has left to read; :class:`BacklogAssignor` is what aiokafka
asks as the member joins (its report) and as the group's leader deals (the deal). An
:class:`~ledger.kafka.readers.EventConsumer` given a ``backlog`` uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from ledger import assignment


class BacklogAssignor:
    """aiokafka's side of :mod:`ledger.assignment`: offers this member's backlog (what
    ``backlog()`` returns each time the member joins) and, as the group's leader, deals
    the partitions by every member's report."""

    name: Final = assignment.NAME
    version: Final = 0

    def __init__(self, backlog: Callable[[], Mapping[int, int]]) -> None:
        self._backlog = backlog

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(
            self.version, sorted(topics), assignment.report(self._backlog())
        )

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        backlog = assignment.merged(member.user_data for member in members.values())
        # A ledger reader subscribes to the events topic alone, whose partitions the
        # backlog numbers; each topic is dealt among its subscribers.
        topics = sorted({topic for member in members.values() for topic in member.subscription})
        dealt: dict[str, list[tuple[str, list[int]]]] = {member: [] for member in members}
        for topic in topics:
            subscribers = [m for m, member in members.items() if topic in member.subscription]
            partitions = cluster.partitions_for_topic(topic) or set()
            for member, held in assignment.deal(partitions, backlog, subscribers).items():
                if held:
                    dealt[member].append((topic, held))
        return {
            member: ConsumerProtocolMemberAssignment(self.version, held, b"")
            for member, held in dealt.items()
        }

    def on_assignment(self, assigned: ConsumerProtocolMemberAssignment) -> None:
        pass
