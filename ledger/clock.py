"""Where "now" comes from for everything that acts on time.

Folds never read a clock (time is an event); the processes that *produce* events do:
the reporter stamps heartbeats and sleeps between them, the lease GC compares renew
times with now. They take a :class:`Clock`, so production runs on
:class:`SystemClock` while tests and simulations run on :class:`VirtualClock`, where
an hour of heartbeats takes as long as the work they do, not an hour.

:class:`VirtualClock` only moves when told to (:meth:`VirtualClock.advance`). Sleepers
wake one at a time in deadline order (ties in the order they went to sleep), each
with the clock set to its own deadline, and ``advance`` waits for the woken task to
get back to the clock (sleep again) or finish before it wakes the next one. That
makes a simulation deterministic even when the woken tasks await real I/O such as a
Kafka acknowledgement between two sleeps. A woken task that instead blocks on
something else (a queue, a consumer poll) holds ``advance`` for at most
``settle_timeout`` real seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock time and real sleeping."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclasses.dataclass(order=True)
class _Sleeper:
    deadline: datetime
    seq: int
    wakeup: asyncio.Future[None] = dataclasses.field(compare=False)
    task: asyncio.Task[Any] | None = dataclasses.field(compare=False)


class VirtualClock:
    """Simulated time that moves only by :meth:`advance` / :meth:`advance_to`."""

    def __init__(
        self,
        start: datetime = datetime(2024, 1, 1, tzinfo=UTC),
        *,
        settle_timeout: float = 5.0,
    ) -> None:
        if start.tzinfo is None:
            raise ValueError(f"VirtualClock start {start!r} must be timezone-aware (UTC)")
        self._now = start.astimezone(UTC)
        self._settle_timeout = settle_timeout
        self._sleepers: list[_Sleeper] = []
        self._seq = itertools.count()
        # Tasks woken by advance_to, each with the future resolved when it is back.
        self._awaited: dict[asyncio.Task[Any], asyncio.Future[None]] = {}

    def now(self) -> datetime:
        return self._now

    async def sleep(self, seconds: float) -> None:
        task = asyncio.current_task()
        returned = self._awaited.pop(task, None) if task is not None else None
        if returned is not None and not returned.done():
            returned.set_result(None)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wakeup: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sleeper = _Sleeper(self._now + timedelta(seconds=seconds), next(self._seq), wakeup, task)
        heapq.heappush(self._sleepers, sleeper)
        await wakeup

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking every sleeper due on the way."""
        if seconds < 0:
            raise ValueError(f"cannot advance a clock by {seconds} s: time only moves forward")
        await self.advance_to(self._now + timedelta(seconds=seconds))

    async def advance_to(self, when: datetime) -> None:
        """Move time forward to ``when``, waking every sleeper due by then."""
        if when < self._now:
            raise ValueError(
                f"cannot move the clock back from {self._now.isoformat()} to {when.isoformat()}"
            )
        await asyncio.sleep(0)  # let tasks created just before reach their first sleep
        while self._sleepers and self._sleepers[0].deadline <= when:
            sleeper = heapq.heappop(self._sleepers)
            if sleeper.wakeup.done():  # the sleeping task was cancelled
                continue
            self._now = sleeper.deadline
            sleeper.wakeup.set_result(None)
            await self._settle(sleeper.task)
        self._now = when
        await asyncio.sleep(0)

    async def _settle(self, task: asyncio.Task[Any] | None) -> None:
        if task is None:
            await asyncio.sleep(0)
            return
        returned: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._awaited[task] = returned
        try:
            await asyncio.wait(
                {returned, task}, timeout=self._settle_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            self._awaited.pop(task, None)
