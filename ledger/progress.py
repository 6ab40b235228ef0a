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
from typing import Final, TextIO

log = logging.getLogger(__name__)

INTERVAL_SECONDS: Final = 10.0
REDRAW_SECONDS: Final = 0.2  # a bar on a terminal is redrawn this often at most
LOG_SECONDS: Final = 5.0  # elsewhere, a line is logged this often at most


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


class ProgressBar:
    """Long work's progress: a bar on a terminal, a log line every few seconds elsewhere.

    ``what`` names the work in log lines, ``unit`` what is counted (``keys``,
    ``records``). :meth:`update` with the count done and the count in all (which may
    grow, as a scan learns it); :meth:`finish` once, at the end.
    """

    WIDTH: Final = 30

    def __init__(self, what: str, unit: str, *, tty: bool, stream: TextIO, total: int = 0) -> None:
        self.what = what
        self.unit = unit
        self.tty = tty
        self.stream = stream
        self.total = total
        self.done = 0
        self.started = self.shown = time.monotonic()

    def update(self, done: int, total: int) -> None:
        self.show(done, total)

    def finish(self) -> None:
        self.show(self.done, self.total, final=True)

    def show(self, done: int, total: int, detail: str = "", *, final: bool = False) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if not final and now - self.shown < (REDRAW_SECONDS if self.tty else LOG_SECONDS):
            return
        self.shown = now
        line = self.line(done, total, now - self.started, detail)
        if self.tty:
            self.stream.write(f"\r{line}" + ("\n" if final else ""))
            self.stream.flush()
        else:
            log.info("%s: %s", self.what, line)

    def line(self, done: int, total: int, elapsed: float, detail: str = "") -> str:
        fraction = 1.0 if total == 0 else min(1.0, done / total)
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else None
        filled = round(fraction * self.WIDTH)
        return (
            f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {fraction:6.1%}"
            f"  {done:,}/{total:,} {self.unit}"
            + (f"  {detail}" if detail else "")
            + f"  {rate:,.0f}/s  ETA {_duration(eta)}"
        )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
