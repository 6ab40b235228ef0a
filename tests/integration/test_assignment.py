"""Projectors in one group deal the partitions by backlog, on a real broker
(:mod:`ledger.assignment`): the heaviest partition alone to one member, and a member
of an earlier release, which deals round robin, in the same group."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping

from ledger.kafka import EventConsumer, create_topics
from ledger.settings import KafkaSettings

BACKLOG: Mapping[int, int] = {0: 100_000, 1: 10, 2: 10, 3: 10}


async def _dealt(*members: EventConsumer) -> list[list[int]]:
    """Each member's partitions once the group has dealt all of them, polled as a
    projector polls (aiokafka joins and syncs while its consumer fetches)."""

    async def settled() -> list[list[int]]:
        while True:
            await asyncio.gather(*(m.fetch_for_fold(100, 200) for m in members))
            held = [sorted(m.assignment()) for m in members]
            if sorted(p for ps in held for p in ps) == sorted(BACKLOG) and all(held):
                return held

    return await asyncio.wait_for(settled(), 120)


async def test_the_heaviest_partition_is_dealt_alone_and_an_earlier_member_shares_the_group(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=4)
    await create_topics(settings)

    def backlog() -> Mapping[int, int]:
        return BACKLOG

    group = f"{unique_topic}.backlog"
    async with contextlib.AsyncExitStack() as stack:
        members = [
            await stack.enter_async_context(
                EventConsumer(settings, group_id=group, backlog=backlog)
            )
            for _ in range(2)
        ]
        # By count (round robin) each would hold two partitions, one with 0.
        assert sorted(await _dealt(*members)) == [[0], [1, 2, 3]]

    # A member that offers round robin alone (an earlier release, during an upgrade)
    # joins the same group, whichever of the two leads.
    mixed = f"{unique_topic}.mixed.{uuid.uuid4().hex[:6]}"
    async with (
        EventConsumer(settings, group_id=mixed, backlog=backlog) as new,
        EventConsumer(settings, group_id=mixed) as earlier,
    ):
        held = await _dealt(new, earlier)
    assert not set(held[0]) & set(held[1])
