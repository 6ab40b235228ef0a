"""Where a running service waits: every asyncio task's chain of awaits, on SIGUSR1.

A service that has stopped moving (no progress, no error) is waiting on something:
a broker's answer, a lock, a future no one completes. A thread dump does not show it,
since every task waits in the one event loop; asyncio's own ``Task.print_stack`` shows
only a suspended task's outermost coroutine. :func:`describe_tasks` follows each task's
awaits down to the future it waits on, frame by frame, so ``kill -USR1 <pid>`` logs
where each task of a long-running command is (:func:`log_tasks_on_signal`).

A future whose failure nothing will await (work given up on) is marked seen by
:func:`retrieved`, so asyncio does not log it as never retrieved. Blocking work a
service may give up on runs in a thread of its own (:func:`in_daemon_thread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def retrieved(future: asyncio.Future[Any]) -> None:
    """Mark ``future``'s failure as seen, so asyncio does not log it again when it is
    collected ("Future exception was never retrieved"); its awaiter, if any, still gets
    it. A done callback: ``future.add_done_callback(retrieved)``."""
    if not future.cancelled():
        future.exception()


def in_daemon_thread(call: Callable[[], _T], name: str) -> asyncio.Future[_T]:
    """``call()`` in a daemon thread of its own, as a future of the running loop.

    For blocking work a service may give up on (a read from a database that takes the
    query and never answers): cancelling the future drops the outcome, and the thread,
    still waiting, holds up neither ``asyncio.run``'s end, which waits for the loop's
    executor, nor the interpreter's, which waits for a ThreadPoolExecutor's threads.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def settle(outcome: Callable[[], object]) -> None:
        if not future.done():  # given up on meanwhile
            outcome()

    def run() -> None:
        try:
            result = call()
        except BaseException as error:  # the awaiter's to see
            told: Callable[[], object] = functools.partial(future.set_exception, error)
        else:
            told = functools.partial(future.set_result, result)
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(settle, told)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


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
