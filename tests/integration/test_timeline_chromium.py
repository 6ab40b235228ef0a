"""The timeline page in headless Chromium: the rows and bars are on the screen.

A history of three apiservers upgraded one by one, two migrations and a lease expiry
is drawn, and the page is screenshot by the ``chromium`` these machines install
(Debian's package, ``make setup``). Where each apiserver's version segments and lease,
and each migration's phases, should be by the page's own layout constants, the pixels
have their colours. Once from :func:`readapi.timeline.render`, once from the file
``svledger timeline`` writes after the history went through a real broker.

Without chromium the tests are skipped, unless ``CI`` is set: there a missing browser
fails them, so the acceptance check cannot pass by not running.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from PIL import Image

from ledger.events import (
    MigrationCancelled,
    MigrationStarted,
    MigrationSucceeded,
)
from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from readapi import timeline
from svledger.cli import USAGE_ERROR, main
from tests.unit.test_timeline import History

RGB = tuple[int, int, int]
WINDOW = (1400, 700)  # wider than the page (LEFT + PLOT_WIDTH + RIGHT and the margins)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("chromium is missing: `make setup` installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium, or make setup)")
    return found


def rgb(colour: str) -> RGB:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def screenshot(page: Path) -> Image.Image:
    png = page.with_suffix(".png")
    subprocess.run(
        [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--screenshot={png}", page.as_uri(),
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
            bar_top = timeline.row_top(timeline.AGREEMENT_ROW) + timeline.BAR_TOP
            return run[0] - timeline.LEFT, y - bar_top
    raise AssertionError("the agreement band is not on the screen")


def three_apiservers() -> History:
    """Three apiservers on apps/v1 upgrade one by one; a migration requested while they
    disagree is cancelled, one requested once they agree succeeds; a's lease expires."""
    h = History()
    for host in ("a", "b", "c"):
        h.join(0, host)
        h.report(0, host, "apps/v1")
    h.report(5, "a", "apps/v2")
    h.request(6, "m1")
    h.add(MigrationCancelled(h.meta(8), "m1", reason="EncodingVersionsDisagree"))
    h.report(10, "b", "apps/v2")
    h.report(15, "c", "apps/v2")
    h.request(16, "m2")
    h.add(MigrationStarted(h.meta(18), "m2"))
    h.add(MigrationSucceeded(h.meta(40), "m2", objects_migrated=7))
    h.expire(60, "a", 0)
    return h


def assert_drawn(picture: timeline.Timeline, image: Image.Image) -> None:
    """Each version segment, lease and migration phase of ``picture`` is on ``image``."""
    left, top = svg_origin(image)
    seconds = (picture.end - picture.start).total_seconds()

    def at(time: datetime, row: int, y: int) -> RGB:
        fraction = (time - picture.start).total_seconds() / seconds
        x = left + timeline.LEFT + int(timeline.PLOT_WIDTH * fraction)
        pixel = image.getpixel((x, top + timeline.row_top(row) + y))
        assert isinstance(pixel, tuple)
        return (pixel[0], pixel[1], pixel[2])

    def middle(span: timeline.Span) -> datetime:
        return span.start + ((span.end or picture.end) - span.start) / 2

    bar = timeline.BAR_TOP + timeline.BAR_HEIGHT // 2
    colours = timeline.version_colours(picture)
    assert len(colours) == 2
    for row_index, row in enumerate(picture.apiservers, start=timeline.AGREEMENT_ROW + 1):
        for span in row.versions:
            assert at(middle(span), row_index, bar) == rgb(colours[span.label]), (row, span)
        for lease in row.leases:
            assert at(middle(lease), row_index, timeline.LEASE_Y) == rgb(timeline.LEASE_COLOUR)
            if lease.ended_by is not None:  # a's expiry: a red tick at its end
                assert lease.end is not None
                expired = at(lease.end, row_index, timeline.LEASE_Y)
                assert expired == rgb(timeline.EXPIRED_COLOUR), (row, lease)
    first = timeline.AGREEMENT_ROW + 1 + len(picture.apiservers)
    for row_index, migration in enumerate(picture.migrations, start=first):
        *steps, ended = migration.phases
        widest = max(steps, key=lambda s: (s.end or picture.end) - s.start)
        assert at(middle(widest), row_index, bar) == rgb(timeline.PHASE_COLOURS[widest.label])
        # the mark of how it ended, drawn END_MARK pixels wide from when it did
        fraction = (ended.start - picture.start).total_seconds() / seconds
        x = left + timeline.LEFT + int(timeline.PLOT_WIDTH * fraction) + timeline.END_MARK // 2
        pixel = image.getpixel((x, top + timeline.row_top(row_index) + bar))
        assert pixel == rgb(timeline.PHASE_COLOURS[ended.label]), migration


def picture_of(history: History) -> timeline.Timeline:
    picture = timeline.timeline("east", "apps", "deployments", history.records)
    assert [row.hostname for row in picture.apiservers] == ["a", "b", "c"]
    assert [[s.label for s in m.phases] for m in picture.migrations] == [
        ["Pending", "Cancelled"],
        ["Pending", "Running", "Succeeded"],
    ]
    return picture


def test_chromium_draws_the_apiserver_rows_and_the_migration_bars(tmp_path: Path) -> None:
    picture = picture_of(three_apiservers())
    page = tmp_path / "timeline.html"
    page.write_text(timeline.draw(picture), encoding="utf-8")
    assert_drawn(picture, screenshot(page))


def test_svledger_timeline_writes_the_page_of_the_log(
    kafka_bootstrap: str, unique_topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=3)
    history = three_apiservers()

    async def append() -> None:
        await create_topics(settings)
        async with EventProducer(settings) as producer:
            positions = await producer.send_many(event for event, _ in history.records)
        history.records = [
            (event, p) for (event, _), p in zip(history.records, positions, strict=True)
        ]

    asyncio.run(append())
    kafka = ["--bootstrap", kafka_bootstrap, "--topic", unique_topic]
    page = tmp_path / "deployments.html"
    command = ["timeline", "deployments.apps", "--cluster", "east", *kafka]
    assert main([*command, "--html", str(page)]) == 0
    # the page of the records as the log holds them, at the positions they landed at
    assert page.read_text(encoding="utf-8") == timeline.draw(picture_of(history))
    assert_drawn(picture_of(history), screenshot(page))

    assert main([*command, "--html", "-"]) == 0
    assert capsys.readouterr().out == page.read_text(encoding="utf-8")

    assert main(["timeline", "pods", "--cluster", "east", "--html", "-", *kafka]) == USAGE_ERROR
    error = capsys.readouterr().err
    assert f"no resource 'pods' in cluster 'east' in topic {unique_topic}" in error
    assert "pick one the cluster has events of: apps.deployments" in error

    assert main(["timeline", "pods", "--cluster", "west", "--html", "-", *kafka]) == USAGE_ERROR
    assert f"cluster 'west' has no events in topic {unique_topic}" in capsys.readouterr().err
