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
    only when objects stay alive: reference cycles (the fold makes none; the libraries
    make few) are still collected, after at most that many new objects.
    """
    before = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)
