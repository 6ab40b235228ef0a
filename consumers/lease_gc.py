"""The lease GC: append ``ApiserverLeaseExpired`` for every lease past its duration.

Upstream's apiserver lease GC deletes a Lease once ``renewTime + leaseDurationSeconds``
has passed, checking every hour. Here the deletion is an event, so the fold (and
every replay) drops the lease and its StorageVersion entries at the same position.

The GC follows the log with :class:`consumers.partitions.PartitionFollower` (group
``svledger-lease-gc``): each partition has its own fold of the leases and a
transactional producer ``svledger-lease-gc-<topic>-<partition>``. It reads the folded
state alone, so its fold thins plain renewals as the projector's does, and rebuilding a
partition decodes only the records that are not plain renewals. As soon as it holds
partitions, and then every ``check_period`` (upstream's ``wait.Until`` checks at start
too, so a GC restarted more often than its period still expires), it checks each
followed partition:

1. read the partition's last stable offset **now**, and wait until the fold has read
   up to it: every heartbeat appended before the check has been seen;
2. :func:`expired` lists each lease with ``renew_time + duration < now``, citing the
   renew time it saw (``last_renew_time``);
3. append those expiries in one transaction.

Why this never expires a renewed lease, nor expires one twice:

* A heartbeat appended before the check is folded before step 2, so its lease is
  not expired. A heartbeat racing the check (appended between steps 1 and 3) cannot
  be seen by anyone deciding now; the expiry then cites an older renew time and the
  fold ignores it as stale (DESIGN.md rule 2). The window is the few milliseconds of
  one check, against lease durations of an hour.
* Two GCs (a restart overlapping its predecessor, two replicas in one group during
  a rebalance, or two groups) share the transactional ID of a partition. Starting a
  producer fences every earlier one, so a GC's transaction commits only if no other
  GC started a producer for the partition since this one did - and this one's fold
  was read, after its own start, up to an end that included every transaction
  committed before that start, expiries of the other GC included. A GC whose commit
  is fenced drops the partition and rebuilds it from the log, expiries of the other
  GC included, before it decides again.
* An expiry's ``event_id`` is a UUIDv5 of (cluster, apiserver, last renew time), so
  even a duplicate that slipped through every barrier names itself as one, and the
  fold folds it once (:class:`~projections.state.SeenEvents`).

The metric ``svledger_heartbeat_age_seconds`` (:mod:`ledger.metrics`) is the age of
every lease in the GC's folds, computed when scraped: it grows between heartbeats
and between checks, and a lease leaves it when the fold drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from datetime import datetime
from typing import Final

from consumers.partitions import PartitionFollower, PartitionLog, PartitionLost
from ledger import metrics
from ledger.clock import Clock
from ledger.events import ApiserverLeaseExpired, Meta
from ledger.kafka import BROKER_ERRORS
from ledger.settings import KafkaSettings
from projections.snapshots import SnapshotSource
from projections.state import State, lease_expired

log = logging.getLogger(__name__)

SOURCE: Final = "svledger-lease-gc"
GROUP_ID: Final = "svledger-lease-gc"
DEFAULT_CHECK_PERIOD: Final = 3600.0
_ASSIGNMENT_POLL_SECONDS: Final = 1.0  # how often a GC with no partitions yet looks again

_NAMESPACE: Final = uuid.UUID("0f5e2a4c-8b1d-4f63-9a27-3c6d8e1b7f90")


def expired(state: State, now: datetime) -> list[ApiserverLeaseExpired]:
    """An expiry for every lease in ``state`` whose renew time + duration is before ``now``."""
    expiries = []
    for lease in sorted(state.leases.values(), key=lambda lease: lease.key):
        if not lease_expired(lease.renew_time, lease.lease_duration_seconds, now):
            continue
        name = f"{lease.cluster}/{lease.apiserver_id}/{lease.renew_time.isoformat()}"
        expiries.append(
            ApiserverLeaseExpired(
                meta=Meta(
                    event_id=str(uuid.uuid5(_NAMESPACE, name)),
                    cluster=lease.cluster,
                    occurred_at=now,
                    source=SOURCE,
                ),
                apiserver_id=lease.apiserver_id,
                last_renew_time=lease.renew_time,
                lease_duration_seconds=lease.lease_duration_seconds,
            )
        )
    return expiries


def heartbeat_ages(state: State, now: datetime) -> dict[tuple[str, str], float]:
    """Seconds from each live lease's last renewal to ``now``, by (cluster, apiserver)."""
    return {
        (lease.cluster, lease.apiserver_id): (now - lease.renew_time).total_seconds()
        for lease in state.leases.values()
    }


async def run_lease_gc(
    settings: KafkaSettings,
    *,
    stop: asyncio.Event,
    clock: Clock,
    check_period: float = DEFAULT_CHECK_PERIOD,
    group_id: str = GROUP_ID,
    snapshots: SnapshotSource | None = None,
) -> None:
    """Follow the log and expire leases every ``check_period`` seconds until ``stop`` is set.

    ``snapshots``: the projector's database, to rebuild partitions from their latest
    fold snapshots instead of the log's beginning (:mod:`consumers.partitions`).
    """
    if check_period <= 0:
        raise ValueError(f"check period {check_period!r} s must be positive, e.g. 3600")
    follower = PartitionFollower(
        settings,
        group_id=group_id,
        transactional_prefix=f"svledger-lease-gc-{settings.topic}",
        events=False,  # it decides on the leases' state alone
        snapshots=snapshots,
    )

    def ages() -> list[tuple[tuple[str, str], float]]:
        # Partitions still being rebuilt would show renewals long since superseded.
        logs = [log for log in follower.logs.values() if log.caught_up]
        now = clock.now()
        for partition_log in logs:
            partition_log.settle()  # the renew times
        return [sample for log in logs for sample in heartbeat_ages(log.state, now).items()]

    async with follower:
        checks = asyncio.create_task(_check_periodically(follower, stop, clock, check_period))
        try:
            with metrics.HEARTBEAT_AGE_SECONDS.sampling(ages):
                async for _ in follower.batches(stop):
                    if checks.done():
                        checks.result()  # a failed check loop fails the GC
        finally:
            checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checks


async def _check_periodically(
    follower: PartitionFollower, stop: asyncio.Event, clock: Clock, check_period: float
) -> None:
    while not stop.is_set() and not follower.logs:  # the first check once assigned
        await clock.sleep(min(check_period, _ASSIGNMENT_POLL_SECONDS))
    while not stop.is_set():
        for partition_log in list(follower.logs.values()):
            try:
                await _check(follower, partition_log, clock)
            except PartitionLost:
                pass  # checked again once rebuilt
            except BROKER_ERRORS as error:
                log.warning(
                    "partition %d: lease check failed, tried again in %g s: %s",
                    partition_log.partition,
                    check_period,
                    error,
                )
        await clock.sleep(check_period)


async def _check(follower: PartitionFollower, partition_log: PartitionLog, clock: Clock) -> None:
    end = await follower.end_offset(partition_log.partition)
    await partition_log.wait_folded(end)
    partition_log.settle()  # every renewal read is in the renew times compared
    expiries = expired(partition_log.state, clock.now())
    if expiries:
        await partition_log.commit(expiries)
