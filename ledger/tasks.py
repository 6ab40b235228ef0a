"""Where a running service waits: every asyncio task's chain of awaits, on SIGUSR1.

A service that has stopped moving (no progress, no error) is waiting on something:
a broker's answer, a lock, a future no one completes. A thread dump does not show it,
since every task waits in the one event loop; asyncio's own ``Task.print_stack`` shows
only a suspended task's outermost coroutine. :func:`describe_tasks` follows each task's
awaits down to the future it waits on, frame by frame, so ``kill -USR1 <pid>`` logs
where each task of a long-running command is (:func:`log_tasks_on_signal`).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


def _first(thing: Any, names: tuple[str, ...]) -> Any:
    return next(
        (value for name in names if (value := getattr(thing, name, None)) is not None), None
    )


def _frames(awaitable: Any) -> Iterator[FrameType]:
    """The frames of ``awaitable``'s chain of awaits (coroutines, generators, async
    generators), outermost first."""
    while (frame := _first(awaitable, ("cr_frame", "gi_frame", "ag_frame"))) is not None:
        yield frame
        awaitable = _first(awaitable, ("cr_await", "gi_yieldfrom", "ag_await"))
        if awaitable is not None and _first(awaitable, ("cr_frame", "gi_frame")) is None:
            # ``async for`` awaits the async generator's step (its ``asend``), which
            # names the generator only to the garbage collector.
            awaitable = next(
                (r for r in gc.get_referents(awaitable) if inspect.isasyncgen(r)), awaitable
            )


def describe_tasks(tasks: set[asyncio.Task[Any]]) -> str:
    """Each task's name, then where its awaits are, one line per frame, then the future
    it is suspended on."""
    lines = [f"{len(tasks)} asyncio tasks:"]
    for task in sorted(tasks, key=lambda t: t.get_name()):
        lines.append(f"task {task.get_name()} ({'done' if task.done() else 'pending'}):")
        for frame in _frames(task.get_coro()):
            code = frame.f_code
            lines.append(f"    {code.co_filename}:{frame.f_lineno} in {code.co_name}")
        # The future the task is suspended on: asyncio keeps it in a private attribute.
        waiter = getattr(task, "_fut_waiter", None)
        if waiter is not None:
            lines.append(f"    awaiting {waiter!r}")
    return "\n".join(lines)


def log_tasks_on_signal(loop: asyncio.AbstractEventLoop, signum: int = signal.SIGUSR1) -> None:
    """Log :func:`describe_tasks` of all of ``loop``'s tasks whenever ``signum`` arrives."""
    loop.add_signal_handler(
        signum, lambda: log.warning("%s", describe_tasks(asyncio.all_tasks(loop)))
    )
