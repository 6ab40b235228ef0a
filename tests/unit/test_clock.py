"""VirtualClock: time moves only when advanced; sleepers wake in deadline order, on time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.clock import SystemClock, VirtualClock

START = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)


async def test_time_stands_still_until_advanced() -> None:
    clock = VirtualClock(START)
    await asyncio.sleep(0.01)
    assert clock.now() == START
    await clock.advance(90)
    assert clock.now() == START + timedelta(seconds=90)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=12))
def test_sleepers_wake_in_deadline_order_at_their_deadline(delays: list[int]) -> None:
    async def scenario() -> list[tuple[int, datetime]]:
        clock = VirtualClock(START)
        woken: list[tuple[int, datetime]] = []

        async def sleeper(index: int, delay: int) -> None:
            await clock.sleep(delay)
            woken.append((index, clock.now()))

        tasks = [asyncio.create_task(sleeper(i, d)) for i, d in enumerate(delays)]
        await clock.advance(max(delays))
        assert all(task.done() for task in tasks)
        return woken

    woken = asyncio.run(scenario())
    # Ties wake in the order the tasks went to sleep: a stable sort by deadline.
    expected = sorted(range(len(delays)), key=lambda i: delays[i])
    assert [index for index, _ in woken] == expected
    assert [at for _, at in woken] == [START + timedelta(seconds=delays[i]) for i in expected]


async def test_periodic_task_ticks_exactly_over_a_long_advance() -> None:
    clock = VirtualClock(START)
    ticks: list[datetime] = []

    async def every_ten_seconds() -> None:
        while True:
            await clock.sleep(10)
            ticks.append(clock.now())

    task = asyncio.create_task(every_ten_seconds())
    await clock.advance(3600)
    task.cancel()
    assert ticks == [START + timedelta(seconds=10 * n) for n in range(1, 361)]


async def test_advance_waits_for_woken_task_doing_other_awaits_before_sleeping_again() -> None:
    clock = VirtualClock(START)
    seen: list[datetime] = []

    async def beat() -> None:
        while True:
            await clock.sleep(10)
            await asyncio.sleep(0.001)  # stands for real I/O between two sleeps
            seen.append(clock.now())

    task = asyncio.create_task(beat())
    await clock.advance(35)
    task.cancel()
    assert seen == [START + timedelta(seconds=s) for s in (10, 20, 30)]


async def test_cancelled_sleeper_is_skipped() -> None:
    clock = VirtualClock(START)
    woken: list[str] = []

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        woken.append(name)

    first = asyncio.create_task(sleeper("first", 5))
    second = asyncio.create_task(sleeper("second", 6))
    await asyncio.sleep(0)
    first.cancel()
    await clock.advance(10)
    assert woken == ["second"]
    assert second.done()


async def test_time_cannot_move_back() -> None:
    clock = VirtualClock(START)
    with pytest.raises(ValueError, match="back"):
        await clock.advance_to(START - timedelta(seconds=1))
    with pytest.raises(ValueError, match="forward"):
        await clock.advance(-1)


def test_naive_start_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        VirtualClock(datetime(2030, 1, 1))


def test_system_clock_is_utc_aware() -> None:
    assert SystemClock().now().utcoffset() == timedelta(0)
