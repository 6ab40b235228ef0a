"""The batch writer: commits the projector's batches beside the fold.

Folding is CPU-bound Python (decoding, the fold itself), and so is writing a large
batch (formatting tens of thousands of rows for ``COPY``, the upserts). In one
process the two would share one interpreter lock and their costs would add up. So a
:class:`BatchWriter` commits large batches (:data:`PROCESS_AT` events or more, as
when catching up) in a child process (``python -m projections.writer``) with its own
engine, while the parent folds the next batch: the two run on two cores. A batch
crosses the child's stdin as its events' rows plus the view rows it changed
(:class:`projections.store.Batch`), pickled; the outcome comes back on its stdout.
The child is a plain subprocess rather than a :mod:`multiprocessing` one so that it
never re-imports the parent's main module, and it starts with the first large batch,
so a projector that only ever sees a few live events at a time has none. Small
batches are committed in the parent (in the writer's thread): for them a round trip
to another process costs more than it saves.

Either way batches are committed one at a time, in the order they are submitted,
by :func:`projections.store.commit`. A failed commit reaches the caller as one of:

* :class:`~projections.store.StaleProjection`: the batch was refused, because the
  database is not at the batch's start checkpoint or already holds one of its
  events (another projector wrote meanwhile);
* :class:`~projections.database.DatabaseUnreachable`: the database is down or the
  connection broke;
* :class:`WriterLost`: the child died (killed, out of memory). The next large
  batch starts a new one;
* :class:`~projections.database.DatabaseNotMigrated`: a constraint refused the batch
  and the schema is no longer the one this code writes (``svledger db upgrade`` of a
  newer release ran under it): reloading cannot help, the caller stops.

After any of them the caller must reload its state from the database: the batch
may have committed or not (a child that died after its commit could not say so),
and only the database knows.

The child runs in a session of its own, so a terminal's Ctrl-C, which reaches the
whole foreground process group, stops the parent alone; the parent decides when
to stop, and the batch in hand still commits first. When the parent goes, even by
``kill -9``, the child reads the end of its stdin, finishes the commit in hand and
exits. A projector restarted meanwhile cannot be confused by that last commit:
each commit locks and checks the checkpoints it starts from.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Final

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from projections import store
from projections.database import (
    DatabaseNotMigrated,
    DatabaseUnreachable,
    check_schema,
    engine,
    writing,
)

PROCESS_AT: Final = 1_000  # events: batches at least this large go to the child
_LENGTH: Final = 8  # bytes of the big-endian length before each pickled frame


class WriterLost(Exception):
    """The writer process died; the batch it held may or may not have committed."""


class BatchWriter:
    """Commits :class:`~projections.store.Batch` es to ``db_url``; see the module docstring.

    ``async with BatchWriter(url) as writer: await writer.commit(batch)``; leaving
    the block waits for the batch in hand, then ends the child.

    Each commit runs in the writer's one thread, so it never blocks the event loop,
    and for the child, pipe I/O there releases the interpreter lock: megabytes of
    records reach the child while the event loop folds the next batch. Work once
    started always finishes in that thread, even if nobody awaits it any more, so
    the next exchange with the child always reads its own reply.
    """

    def __init__(self, db_url: str, *, process_at: int = PROCESS_AT) -> None:
        self.db_url = db_url
        self.process_at = process_at
        self._here = _Committer(db_url)
        self._child: subprocess.Popen[bytes] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="svledger-writer")
        self._abandoned = False

    async def __aenter__(self) -> BatchWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def commit(self, batch: store.Batch) -> asyncio.Future[None]:
        """Start committing ``batch`` and its checkpoint in one transaction, at once.

        The returned future says how it went. The work starts before the caller
        next yields to the event loop, so whatever the caller does meanwhile (fetch,
        decode and fold the next batch) overlaps it.
        """
        work = self._exchange if len(batch.events) >= self.process_at else self._here.commit
        return asyncio.wrap_future(self._thread.submit(_raise_failure, work, batch))

    async def aclose(self) -> None:
        """Wait for the batch in hand, then let the child exit and release the engine;
        after :meth:`abandon`, nothing: the batch in hand is not waited for."""
        if self._abandoned:
            return
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown()

    def abandon(self) -> None:
        """Stop waiting for the batch in hand (a database that does not answer): end the
        child, whose transaction the database then rolls back, and leave the thread.

        A batch committed in this process (a small one) may keep the thread waiting on
        the database until the process ends: its process must then exit without
        joining it (``os._exit``), as ``svledger project`` does.
        """
        self._abandoned = True
        child = self._child
        if child is not None:
            child.kill()
        self._thread.shutdown(wait=False, cancel_futures=True)

    def _exchange(self, batch: store.Batch) -> BaseException | None:
        child = self._child or self._start()
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(frame(batch))
            child.stdin.flush()
            failure: BaseException | None = read_frame(child.stdout)
        except (OSError, EOFError) as error:
            self._stop_child(kill=True)
            return WriterLost(
                f"the writer process died while committing a batch ({error or 'no reply'});"
                " it is restarted for the next one"
            )
        return failure

    def _start(self) -> subprocess.Popen[bytes]:
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
        self._child = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
            start_new_session=True,
        )
        # The URL goes through the pipe, not the command line, which anyone may read.
        assert self._child.stdin is not None
        self._child.stdin.write(frame(self.db_url))
        return self._child

    def _close(self) -> None:
        self._stop_child()
        self._here.dispose()

    def _stop_child(self, kill: bool = False) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if kill:
            child.kill()
        with contextlib.suppress(OSError):
            assert child.stdin is not None
            child.stdin.close()
        child.wait()


def _raise_failure(work: Callable[[store.Batch], BaseException | None], batch: store.Batch) -> None:
    failure = work(batch)
    if failure is not None:
        raise failure


class _Committer:
    """Commits batches on an engine of its own, opened at the first batch."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self._db: Engine | None = None
        self._writes: Engine | None = None  # the same, for the transactions that write

    def commit(self, batch: store.Batch) -> BaseException | None:
        """Commit ``batch``; a failure is returned as one the module docstring lists."""
        try:
            if self._db is None or self._writes is None:
                self._db = engine(self.db_url)
                self._writes = writing(self._db)
            db = self._db
            store.commit(self._writes, batch)
        except store.StaleProjection as refused:
            return refused
        except IntegrityError as error:
            try:  # a constraint of another schema (upgraded under a running projector)?
                check_schema(db)
            except DatabaseNotMigrated as changed:
                return changed
            except (OperationalError, InterfaceError, DatabaseUnreachable):
                pass
            return store.StaleProjection(
                f"the database already holds events of this batch: {_first_line(error)}"
            )
        except (OperationalError, InterfaceError, DatabaseUnreachable) as error:
            return DatabaseUnreachable(_first_line(error))
        return None

    def dispose(self) -> None:
        if self._db is not None:
            self._db.dispose()
            self._db = self._writes = None


def frame(value: Any) -> bytes:
    """``value`` pickled, after its length: what :func:`read_frame` reads."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_LENGTH, "big") + data


def read_frame(stream: IO[bytes]) -> Any:
    """The next frame's value; EOFError once the other end closed the pipe or died."""
    header = stream.read(_LENGTH)
    if len(header) < _LENGTH:
        raise EOFError
    length = int.from_bytes(header, "big")
    data = stream.read(length)
    if len(data) < length:
        raise EOFError
    return pickle.loads(data)


async def read_frame_async(stream: asyncio.StreamReader) -> Any:
    """:func:`read_frame` from an asyncio stream."""
    try:
        header = await stream.readexactly(_LENGTH)
        return pickle.loads(await stream.readexactly(int.from_bytes(header, "big")))
    except asyncio.IncompleteReadError:
        raise EOFError from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ---------------------------------------------------------------- in the child


def main() -> None:
    """Commit each batch read from stdin, answering each on stdout, until stdin ends.

    The first frame is the database URL, each next one a batch; each answer is None
    (committed) or the failure.
    """
    requests = sys.stdin.buffer
    # The answers own the real stdout; anything printed goes to stderr instead.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        committer = _Committer(read_frame(requests))
    except EOFError:
        return
    try:
        for batch in _batches(requests):
            try:
                failure = committer.commit(batch)
            except Exception as error:  # a bug: say so in the parent, keep serving
                traceback.print_exc()
                failure = RuntimeError(f"writer process: {type(error).__name__}: {error}")
            answers.write(frame(failure))
            answers.flush()
    except BrokenPipeError:
        os._exit(1)  # the parent is gone (stopped): no one to answer, nor to flush for
    finally:
        committer.dispose()


def _batches(requests: IO[bytes]) -> Iterator[store.Batch]:
    """The batches read from ``requests`` until the parent closes the pipe, or dies."""
    while True:
        try:
            yield read_frame(requests)
        except EOFError:
            return


if __name__ == "__main__":
    main()
