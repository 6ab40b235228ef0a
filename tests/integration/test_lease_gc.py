"""Two lease GCs at once on the real broker: every lapsed lease expired once, no renewed one."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest

from consumers.lease_gc import run_lease_gc
from ledger.clock import SystemClock
from ledger.events import ApiserverHeartbeat, ApiserverLeaseExpired, Event, Meta, Position
from ledger.kafka import EventProducer, create_topics, partition_of
from ledger.settings import KafkaSettings
from projections.fold import apply
from projections.state import State
from tests.integration.test_migrator import DEADLINE, read_log, wait_for

# Long enough that a loaded machine's stall between a renewal and a GC's check (the
# renewals come every 0.2 s) does not expire a renewed lease.
LEASE_SECONDS = 5


def heartbeat(cluster: str, apiserver: str) -> ApiserverHeartbeat:
    now = datetime.now(UTC)
    return ApiserverHeartbeat(
        Meta.new(cluster, apiserver, now),
        apiserver,
        f"{apiserver}_1",
        apiserver,
        LEASE_SECONDS,
        now,
    )


async def test_two_gcs_expire_each_lapsed_lease_once_and_never_a_renewed_one(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    stop = asyncio.Event()
    # Two groups: both GCs follow every partition and check it, racing each other.
    gcs = [
        asyncio.create_task(
            run_lease_gc(
                settings,
                stop=stop,
                clock=SystemClock(),
                check_period=0.2,
                group_id=f"{unique_topic}.gc-{i}",
            )
        )
        for i in range(2)
    ]
    last_renewal: dict[str, datetime] = {}
    try:
        async with EventProducer(settings) as producer:
            for cluster in ("east", "west"):
                event = heartbeat(cluster, f"{cluster}-crashed")
                await producer.send(event)
                last_renewal[f"{cluster}-crashed"] = event.renew_time
            # Renewed well within the lease for 3 lease durations, then stopped.
            loop = asyncio.get_running_loop()
            until = loop.time() + 3 * LEASE_SECONDS
            while loop.time() < until:
                for cluster in ("east", "west"):
                    event = heartbeat(cluster, f"{cluster}-alive")
                    await producer.send(event)
                    last_renewal[f"{cluster}-alive"] = event.renew_time
                await asyncio.sleep(0.2)

        def expiries(events: list[Event]) -> list[ApiserverLeaseExpired]:
            return [e for e in events if isinstance(e, ApiserverLeaseExpired)]

        events = await wait_for(settings, lambda es: len(expiries(es)) >= 4)
        # Let both GCs run a few more checks: nothing more may come.
        await asyncio.sleep(1.0)
        events = await read_log(settings)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*gcs), DEADLINE)

    cited = sorted((e.apiserver_id, e.last_renew_time) for e in expiries(events))
    assert cited == sorted(last_renewal.items())
    # Folded, no expiry is stale: none came after a renewal it had not seen.
    state = State()
    for offset, logged in enumerate(events):
        changes = apply(state, logged, Position(0, offset))
        assert changes.rejections == []
    assert state.leases == {}


async def test_a_gc_checks_as_soon_as_it_starts_not_a_period_later(
    kafka_bootstrap: str, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # As upstream's wait.Until: a GC restarted more often than its period still expires.
    caplog.set_level(logging.INFO, logger="ledger.progress")
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    lapsed = heartbeat("east", "east-crashed")
    async with EventProducer(settings) as producer:
        await producer.send(lapsed)
    await asyncio.sleep(LEASE_SECONDS + 0.5)
    stop = asyncio.Event()
    gc = asyncio.create_task(
        run_lease_gc(settings, stop=stop, clock=SystemClock(), check_period=3600)
    )
    try:
        events = await wait_for(
            settings, lambda es: any(isinstance(e, ApiserverLeaseExpired) for e in es)
        )
    finally:
        stop.set()
        await asyncio.wait_for(gc, DEADLINE)
    [expiry] = [e for e in events if isinstance(e, ApiserverLeaseExpired)]
    assert (expiry.apiserver_id, expiry.last_renew_time) == ("east-crashed", lapsed.renew_time)
    # Each partition's rebuild said when it was done, and what it read.
    caught_up = sorted(
        r.getMessage() for r in caplog.records if "caught up with the log" in r.getMessage()
    )
    east = partition_of("east", [0, 1])
    assert [line.split(" records read")[0] for line in caught_up] == [
        f"svledger-lease-gc: partition {p}: caught up with the log: {int(p == east)}"
        for p in (0, 1)
    ]
