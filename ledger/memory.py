"""How long-running svledger processes use memory."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Final

# Net new GC-tracked objects (allocations less deallocations) between two collections of
# the young generation: above what a fold holds alive at once, two batches of 20,000
# records at about seven tracked objects each (the consumer's record, its headers, the
# reader's record and position, rows).
YOUNG_OBJECTS: Final = 500_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect the garbage collector's young generation only once half a million more
    objects are alive than at the last collection, not 700.

    Python counts a young generation's objects as allocations less deallocations, and
    collects it when the count passes the threshold. Folding allocates a few objects
    per record, nearly all freed once their batch is folded and written, while the fold
    holds its state and the batch in hand. Under a threshold smaller than a batch, every
    young collection finds the batch being read alive, walks it and moves it to an
    older generation, which is walked again later: at the default threshold that is
    half the cost of reading a record, and at 100,000 still a fifth of the projector's
    time (``bench/projector_bench.py``: 75k against 90k events/s). Above what a fold
    holds at once, the count returns near zero after each batch and a collection runs
    only when objects stay alive. The reference cycles the libraries make (about one
    object in a hundred records) would then wait for half a million of them: the
    projector and replay, which read millions of records an hour, also sweep them
    between batches (:class:`Sweeper`); the services, which read the live log, let them
    wait, and hold at most that many more objects.
    """
    before = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)


SWEEP_EVERY: Final = 1_000_000  # records


class Sweeper:
    """Collects the young generations every ``every`` records, between two batches.

    Under :func:`fewer_collections` a fold's reference cycles (aiokafka's and asyncio's
    futures, 5,000 to 14,000 objects per million records) would pile up until half a
    million of them force a collection, and the process would grow by their memory
    meanwhile. Called after each batch, a sweep walks the young objects once: 80 to
    110 ms per million records, under 1% of folding them
    (``bench/projector_bench.py``: 10M events, RSS 179, 176, 178, 179 MiB by quarter).
    """

    def __init__(self, every: int = SWEEP_EVERY) -> None:
        self.every = every
        self._since = 0

    def folded(self, records: int) -> None:
        """Count ``records`` more; sweep once ``every`` have been folded since the last."""
        self._since += records
        if self._since >= self.every:
            self._since = 0
            gc.collect(1)
