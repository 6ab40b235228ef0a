"""``svledger serve --snapshots-from``: the read API's views started from the projector's
fold snapshots, on the real broker and SQLite.

The log and the source database are test_snapshots' (a real projector took a snapshot of
each of three partitions every 150 offsets). Views started from those snapshots must
serve what views that folded the log from its beginning serve: now, and at past points
(offsets and times) before the snapshots they started from (read from older snapshots)
and after them (from the views' own folds). A corrupt snapshot is passed over, with a
warning, for an older one; with none, the partition is folded from the log's beginning.

Served means every object as the API sends it, its ``uid`` and ``creationTimestamp``
included, and the Table of each kind, ages included (:func:`served`), byte for byte: a
snapshot holds when each row was created and each cluster's latest event time. A
cluster whose rows are all gone before the snapshot is served still, with no objects,
as the views that folded it serve it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from ledger.events import ApiserverHeartbeat, ApiserverLeaseReleased, Event, Meta, Position
from ledger.kafka import create_topics
from projections import database
from projections.schema import fold_snapshots
from projections.snapshots import SnapshotSource
from readapi import conversions
from readapi.gojson import go_json_body
from readapi.kinds import KINDS, View
from readapi.ledger import LedgerViews
from tests.integration.test_projector import (
    append,
    caught_up,
    kafka_settings,
    next_offsets,
    projecting,
)
from tests.integration.test_serve import running_server
from tests.integration.test_snapshots import Log, projected, snapshots_in
from tests.workloads import mixed_events

__all__ = ["projected"]  # the fixture, shared with test_snapshots

NOW = datetime(2030, 1, 1, tzinfo=UTC)  # the time of live views, the same for both
CHECKPOINTS: dict[str, Any] = {"checkpoint_every": 100, "recent_checkpoints": 2}


@asynccontextmanager
async def following(views: LedgerViews) -> AsyncIterator[LedgerViews]:
    stop = asyncio.Event()
    task = asyncio.create_task(views.follow(stop))
    try:
        await asyncio.wait_for(views.ready.wait(), 60)
        yield views
    finally:
        stop.set()
        await task


def served(view: View) -> list[bytes]:
    """What the API sends of the view: each kind's objects and its Table (with ages and
    every object's metadata), as the bytes of their JSON."""
    sent = []
    for kind in KINDS:
        pairs = kind.selected(view)
        sent += [go_json_body(obj) for _, obj in pairs]
        sent.append(go_json_body(conversions.table(kind, pairs, view)))
    return sent


def points(records: list[tuple[Event, Position]], partition: int) -> list[int | datetime]:
    """Offsets of ``partition`` from its beginning to its end, and with each the time
    that names the same prefix (the latest its events up to there occurred at)."""
    ordered = sorted((p.offset, e.meta.occurred_at) for e, p in records if p.partition == partition)
    found: list[int | datetime] = []
    for index in [*range(5, len(ordered), 97), len(ordered) - 1]:
        found += [ordered[index][0], max(t for _, t in ordered[: index + 1])]
    return found


async def assert_same(
    reference: LedgerViews,
    views: LedgerViews,
    records: list[tuple[Event, Position]],
    partition: int | None = None,
) -> None:
    """The views serve the same now and at past points (of ``partition``'s clusters)."""
    assert sorted(views.clusters) == sorted(reference.clusters)
    for cluster, live in reference.clusters.items():
        if partition is not None and live.partition != partition:
            continue
        started = views.fold(cluster)
        assert (started.offset, started.state) == (live.offset, live.state), cluster
        assert (started.time, started.rows) == (live.time, live.rows), cluster
        assert served(started.view(NOW)) == served(live.view(NOW)), cluster
        for point in points(records, live.partition):
            expected = await reference.view_at(cluster, point)
            found = await views.view_at(cluster, point)
            assert (found.state, found.offset) == (expected.state, expected.offset), (
                cluster,
                point,
            )
            if cluster in expected.state.clusters:  # else ages are measured to now
                assert found.time == expected.time, (cluster, point)
            assert served(found) == served(expected), (cluster, point)


def starts(views: LedgerViews) -> dict[int, int]:
    """Where each partition's folds started from a snapshot: the offset after the records
    passed over."""
    return {p: offset + 1 for p, offset in views._passed_over.items()}


async def test_views_from_snapshots_serve_what_views_from_the_beginning_serve(
    projected: Log, caplog: pytest.LogCaptureFixture
) -> None:
    settings, records, source_url = projected
    taken = snapshots_in(source_url)
    reference = LedgerViews(settings, **CHECKPOINTS)
    views = LedgerViews(settings, snapshots=SnapshotSource(source_url, "views"), **CHECKPOINTS)

    with caplog.at_level(logging.INFO, logger="readapi.ledger"):
        async with following(reference), following(views):
            latest = {p: max(o for q, o, _ in taken if q == p) for p in range(3)}
            assert starts(views) == latest
            assert views.events_folded < reference.events_folded / 2
            await assert_same(reference, views, records)

    assert caplog.text.count("starts from its fold snapshot") == 3


async def test_a_watch_from_before_the_snapshot_is_gone(projected: Log) -> None:
    """The records before a snapshot are passed over as records folded thinned are: no
    change of them is kept, so a watch can start only after them."""
    settings, _, source_url = projected
    views = LedgerViews(settings, snapshots=SnapshotSource(source_url, "views"))
    async with following(views):
        begins = starts(views)
        for fold in views.clusters.values():
            assert fold.horizon >= begins[fold.partition] - 1
            assert all(change.offset >= begins[fold.partition] for change in fold.changes)


async def test_a_corrupt_snapshot_is_passed_over_with_a_warning_and_without_any_the_log_is_read(
    projected: Log, caplog: pytest.LogCaptureFixture
) -> None:
    settings, records, source_url = projected
    *_, older, latest = [o for p, o, _ in snapshots_in(source_url) if p == 0]
    source = database.engine(source_url)
    with source.begin() as connection:
        connection.execute(
            update(fold_snapshots)
            .where(fold_snapshots.c.log_partition == 0, fold_snapshots.c.next_offset == latest)
            .values(payload=b"not a snapshot")
        )
    reference = LedgerViews(settings, **CHECKPOINTS)
    views = LedgerViews(settings, snapshots=SnapshotSource(source_url, "views"), **CHECKPOINTS)
    with caplog.at_level(logging.WARNING):
        async with following(reference), following(views):
            assert starts(views)[0] == older
            await assert_same(reference, views, records, partition=0)
    assert f"snapshot of partition 0 at offset {latest}" in caplog.text
    assert "does not match its digest" in caplog.text

    with source.begin() as connection:
        connection.execute(fold_snapshots.delete().where(fold_snapshots.c.log_partition == 1))
    source.dispose()
    caplog.clear()
    reference = LedgerViews(settings, **CHECKPOINTS)
    views = LedgerViews(settings, snapshots=SnapshotSource(source_url, "views"), **CHECKPOINTS)
    with caplog.at_level(logging.WARNING, logger="readapi.ledger"):
        async with following(reference), following(views):
            assert views.events_folded > len([r for r in records if r[1].partition == 1])
            await assert_same(reference, views, records, partition=1)
    assert "partition 1 is folded from the log's beginning" in caplog.text


def test_svledger_serve_takes_snapshots_from_the_projectors_database(projected: Log) -> None:
    settings, _, source_url = projected
    with running_server(settings, "--snapshots-from", source_url) as server:
        pass
    said = [line["message"] for line in server.log]
    assert len([m for m in said if "starts from its fold snapshot" in m]) == 3, said


@pytest.fixture
async def emptied(kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> Log:
    """A log whose first cluster holds no row once its one apiserver has left (a
    heartbeat, then its release), and a projector's snapshots of every partition after."""
    settings = kafka_settings(kafka_bootstrap, unique_topic, partitions=3)
    await create_topics(settings)
    at = datetime(2020, 1, 1, tzinfo=UTC)  # before the other clusters' events
    holder = "apiserver-gone_1"
    left = [
        ApiserverHeartbeat(
            Meta.new("gone", "apiserver-gone", at), "apiserver-gone", holder, "gone-0", 3600, at
        ),
        ApiserverLeaseReleased(
            Meta.new("gone", "apiserver-gone", at + timedelta(seconds=5)),
            "apiserver-gone",
            holder,
        ),
    ]
    records = await append(settings, [*left, *mixed_events(600, clusters=6, seed=3)])
    source_url = f"sqlite:///{tmp_path / 'source.db'}"
    database.upgrade(source_url)
    source = database.engine(source_url)
    try:
        async with projecting(
            settings, source_url, group=False, max_batch=20, snapshot_every=40
        ) as projector:
            await caught_up(source, projector, next_offsets(records))
    finally:
        source.dispose()
    return settings, records, source_url


async def test_a_cluster_with_no_row_left_is_served_from_a_snapshot_as_from_the_log(
    emptied: Log,
) -> None:
    settings, records, source_url = emptied
    gone = next(p.partition for e, p in records if e.meta.cluster == "gone")
    after = [p.offset for e, p in records if p.partition == gone and e.meta.cluster != "gone"]
    reference = LedgerViews(settings, **CHECKPOINTS)
    views = LedgerViews(settings, snapshots=SnapshotSource(source_url, "views"), **CHECKPOINTS)
    async with following(reference), following(views):
        assert starts(views)[gone] > 2, "the snapshot comes after the cluster's events"
        assert not views.fold("gone").rows
        assert views.fold("gone").time == datetime(2020, 1, 1, 0, 0, 5, tzinfo=UTC)
        await assert_same(reference, views, records)
        # A past view by offset, with no event of the cluster since the snapshot: its
        # time is the cluster's latest event's, as the views folded from 0 show it.
        point = after[len(after) // 2]
        assert (await views.view_at("gone", point)).time == (
            await reference.view_at("gone", point)
        ).time
