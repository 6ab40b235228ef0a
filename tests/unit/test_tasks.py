"""The task dump names every frame a waiting task is in, down to the future it awaits."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from ledger.tasks import describe_tasks, in_daemon_thread, log_tasks_on_signal


async def _innermost(future: asyncio.Future[None]) -> None:
    await future


async def _middle(future: asyncio.Future[None]) -> None:
    await _innermost(future)


async def _outer(future: asyncio.Future[None]) -> None:
    await _middle(future)


async def _described(
    waiter: Callable[[asyncio.Future[None]], Coroutine[Any, Any, None]],
) -> list[str]:
    """The lines describing a task ``waiter`` that is waiting on a future."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(waiter(future), name="waiter")
    await asyncio.sleep(0)
    try:
        return describe_tasks({task}).splitlines()
    finally:
        future.set_result(None)
        await task


async def test_a_waiting_task_is_described_through_every_await_to_its_future() -> None:
    lines = await _described(_outer)
    assert lines[0] == "1 asyncio tasks:"
    assert lines[1] == "task waiter (pending):"
    assert [line.rsplit(" in ", 1)[-1] for line in lines[2:5]] == [
        "_outer",
        "_middle",
        "_innermost",
    ]
    assert all(line.strip().startswith(f"{__file__}:") for line in lines[2:5])
    assert lines[5].startswith("    awaiting <Future pending")
    assert len(lines) == 6


async def test_sigusr1_logs_the_tasks(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    task = asyncio.create_task(_outer(future), name="waiter")
    log_tasks_on_signal(loop)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(100):
            if caplog.records:
                break
            await asyncio.sleep(0.01)
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        future.set_result(None)
        await task
    (record,) = caplog.records
    assert "task waiter (pending):" in record.getMessage()
    assert "in _innermost" in record.getMessage()


async def _steps(future: asyncio.Future[None]) -> AsyncIterator[int]:
    yield 1
    await _innermost(future)
    yield 2


async def _follows(future: asyncio.Future[None]) -> None:
    async for _ in _steps(future):
        pass


async def test_a_task_in_an_async_for_is_described_into_the_generator() -> None:
    lines = await _described(_follows)
    functions = [line.rsplit(" in ", 1)[-1] for line in lines[2:-1]]
    assert functions == ["_follows", "_steps", "_innermost"]


async def test_work_in_a_daemon_thread_gives_its_result_or_its_error() -> None:
    assert await in_daemon_thread(lambda: threading.current_thread().daemon, "t") is True

    def fails() -> None:
        raise ValueError("no answer")

    with pytest.raises(ValueError, match="no answer"):
        await in_daemon_thread(fails, "t")


def test_work_given_up_on_holds_up_neither_the_loop_nor_its_end() -> None:
    # A read from a database that never answers: the service stops without it.
    answered = threading.Event()

    async def service() -> None:
        reading = in_daemon_thread(answered.wait, "t")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reading, 0.1)
        assert reading.cancelled()

    ended = threading.Thread(target=asyncio.run, args=(service(),))
    try:
        ended.start()
        ended.join(5)  # asyncio.run would wait for its executor's threads for ever
        assert not ended.is_alive()
    finally:
        answered.set()  # lets the thread end
