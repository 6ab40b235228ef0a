"""How long-running svledger processes use memory."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the garbage collector's young generation every 100,000 allocations, not 700.

    Folding allocates a few objects per record (the consumer's record, positions, rows),
    nearly all short-lived, while the fold's state is many long-lived ones. At Python's
    default thresholds a young collection runs every few hundred records and a full one
    (which walks the whole state) every few hundred thousand: together half the cost of
    reading a record (``bench/projector_bench.py``). The fold makes no reference
    cycles; collecting less often only frees the few others later.
    """
    before = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)
