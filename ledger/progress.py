"""How far a reader that rebuilds its fold from the log has got, logged while it reads.

A reader that folds a long log before it serves or acts (``svledger serve``; the lease
GC, the migrator, the worker and the collector for each partition they are assigned)
can take minutes. :class:`CatchUp` tells the operator how far it is: every
``interval`` seconds, the records read of those between where it started and the end
of the log when it started, the rate since the last line, and the time left at that
rate; and once, when it is there, how long it took. The counts are log offsets, so
transaction markers count as records (they are a small part of a log).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Final

log = logging.getLogger(__name__)

INTERVAL_SECONDS: Final = 10.0


class CatchUp:
    """One reader's way from ``starts`` to ``targets`` (offsets per partition).

    Call :meth:`update` with the reader's positions (the next offset it will read, per
    partition) after every poll; it logs at most every ``interval`` seconds, and once
    when every partition has reached its target. ``what`` names the reader in each line.
    """

    def __init__(
        self,
        what: str,
        targets: Mapping[int, int],
        starts: Mapping[int, int] | None = None,
        *,
        interval: float = INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self._spans = {p: ((starts or {}).get(p, 0), end) for p, end in targets.items()}
        self.total = sum(max(0, end - start) for start, end in self._spans.values())
        self.interval = interval
        self._clock = clock
        self._began = self._since = clock()
        self._read_since = 0
        self.done = False

    def read(self, positions: Mapping[int, int]) -> int:
        """How many of the records to read ``positions`` have passed."""
        return sum(
            max(0, min(positions.get(p, start), end) - start)
            for p, (start, end) in self._spans.items()
        )

    def update(self, positions: Mapping[int, int]) -> None:
        if self.done:
            return
        now = self._clock()
        read = self.read(positions)
        if read >= self.total:
            self.done = True
            seconds = now - self._began
            log.info(
                "%s: caught up with the log: %d records read in %.1f s",
                self.what,
                read,
                seconds,
                extra={"records": read, "seconds": round(seconds, 3)},
            )
            return
        if now - self._since < self.interval:
            return
        rate = (read - self._read_since) / (now - self._since)
        left = (self.total - read) / rate if rate > 0 else None
        log.info(
            "%s: catching up with the log: %d of %d records read (%.0f%%), %.0f records/s, %s",
            self.what,
            read,
            self.total,
            100 * read / self.total,
            rate,
            "no progress since the last line" if left is None else f"about {left:.0f} s left",
            extra={
                "records": read,
                "total": self.total,
                "records_per_second": round(rate, 1),
                "seconds_left": None if left is None else round(left, 1),
            },
        )
        self._since, self._read_since = now, read
