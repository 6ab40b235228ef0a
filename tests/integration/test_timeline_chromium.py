"""The timeline page, rendered by headless Chromium: the rows and bars are on the screen.

The page of a history with three apiservers and two migrations is screenshot by the
``chromium`` these machines install (Debian's package); the pixels where each
apiserver's version segments and each migration's phases should be, by the page's own
layout, have their colours. The window is wider than the page (LEFT + PLOT_WIDTH plus
the body's margin), so nothing drawn is cut off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from PIL import Image

from ledger.events import (
    ApiserverLeaseExpired,
    MigrationCancelled,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
)
from readapi import timeline
from tests.unit.test_timeline import T0, History

RGB = tuple[int, int, int]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make setup` installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def rgb(colour: str) -> RGB:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def screenshot(page: str, tmp_path: Path) -> Image.Image:
    html, png = tmp_path / "timeline.html", tmp_path / "timeline.png"
    html.write_text(page)
    subprocess.run(
        [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", "--window-size=1400,700",
            f"--screenshot={png}", html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    return Image.open(png).convert("RGB")


def svg_origin(image: Image.Image) -> tuple[int, int]:
    """Where the SVG's (0, 0) is on the screen, found from the agreement band.

    The band's first window starts at the axis' start (x = LEFT); the legend's small
    square of the same colour is told apart by its width.
    """
    colour = rgb(timeline.AGREEMENT_COLOUR)
    width, height = image.size
    pixels = image.load()
    assert pixels is not None
    for y in range(height):
        run = [x for x in range(width) if pixels[x, y] == colour]
        if len(run) > 50:
            bar_top = (
                timeline.row_top(timeline.AGREEMENT_ROW)
                + (timeline.ROW_HEIGHT - timeline.BAR_HEIGHT) / 2
            )
            return run[0] - timeline.LEFT, y - int(bar_top)
    raise AssertionError("the agreement band is not on the screen")


def three_apiservers() -> History:
    """Three apiservers on apps/v1 upgrade one by one; a migration requested while they
    disagree is cancelled, one requested once they agree succeeds; a's lease expires."""
    h = History()
    for host in ("a", "b", "c"):
        h.join(0, host)
        h.report(0, host, "apps/v1")
    h.report(5, "a", "apps/v2")
    h.add(MigrationRequested(h.meta(6), "m1", "apps", "deployments", "apps/v2", "h2", "0:1"))
    h.add(MigrationCancelled(h.meta(8), "m1", reason="EncodingVersionsDisagree"))
    h.report(10, "b", "apps/v2")
    h.report(15, "c", "apps/v2")
    h.add(MigrationRequested(h.meta(16), "m2", "apps", "deployments", "apps/v2", "h2", "0:2"))
    h.add(MigrationStarted(h.meta(18), "m2"))
    h.add(MigrationSucceeded(h.meta(40), "m2", objects_migrated=7))
    h.add(ApiserverLeaseExpired(h.meta(60), "id-a", T0, 3600))
    return h


def test_chromium_draws_the_apiserver_rows_and_the_migration_bars(tmp_path: Path) -> None:
    picture = timeline.timeline("east", "apps", "deployments", three_apiservers().records)
    assert [row.hostname for row in picture.apiservers] == ["a", "b", "c"]
    assert [m.migration_id for m in picture.migrations] == ["m1", "m2"]
    image = screenshot(timeline.draw(picture), tmp_path)
    left, top = svg_origin(image)
    seconds = (picture.end - picture.start).total_seconds()

    def at(time: datetime, row: int) -> RGB:
        fraction = (time - picture.start).total_seconds() / seconds
        x = left + timeline.LEFT + int(timeline.PLOT_WIDTH * fraction)
        y = top + timeline.row_top(row) + timeline.ROW_HEIGHT // 2
        pixel = image.getpixel((x, y))
        assert isinstance(pixel, tuple)
        return (pixel[0], pixel[1], pixel[2])

    def middle(span: timeline.Span) -> datetime:
        return span.start + ((span.end or picture.end) - span.start) / 2

    colours = timeline.version_colours(picture)
    checked = 0
    for row_index, row in enumerate(picture.apiservers, start=1):
        for span in row.versions:
            assert at(middle(span), row_index) == rgb(colours[span.label]), (row.hostname, span)
            checked += 1
    first = 1 + len(picture.apiservers)
    for row_index, migration in enumerate(picture.migrations, start=first):
        widest = max(migration.phases, key=lambda s: (s.end or picture.end) - s.start)
        colour = rgb(timeline.PHASE_COLOURS[widest.label])
        assert at(middle(widest), row_index) == colour, (migration.migration_id, widest)
        checked += 1
    assert checked == 3 * 2 + 2
