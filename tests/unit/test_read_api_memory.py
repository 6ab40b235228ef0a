"""What the read API keeps in memory beside the live folds, bounded on a fleet: each
cluster's changes for watches (its latest ``--watch-window``, or on a fleet its share of
``--watch-budget``, never fewer than 100), and the checkpoints of the past (the newest of
each partition alone when the projector's fold snapshots serve the older points)."""

from __future__ import annotations

from ledger.events import Event, Position
from ledger.kafka import Record
from ledger.settings import KafkaSettings
from projections.projector import DEFAULT_PROJECTION
from projections.snapshots import SnapshotSource
from readapi import WATCH_FLOOR, WATCH_WINDOW
from readapi.ledger import Change, LedgerViews
from tests.workloads import mixed_events

EVENTS = list(mixed_events(30_000, clusters=50))


def folded(events: list[Event], **window: int) -> dict[str, list[Change]]:
    """Each cluster's changes kept, after folding ``events`` one by one."""
    views = LedgerViews(KafkaSettings(), **window)
    views._fold([Record(Position(0, i), event, b"") for i, event in enumerate(events)])
    return {name: list(fold.changes) for name, fold in views.clusters.items()}


def test_a_fleet_keeps_each_clusters_share_of_the_budget_a_few_clusters_their_window() -> None:
    every = folded(EVENTS, watch_window=len(EVENTS), watch_budget=50 * len(EVENTS))
    assert min(map(len, every.values())) > WATCH_WINDOW // 10, "each cluster changes often"
    fleet = folded(EVENTS, watch_budget=50 * 150)
    few = folded(EVENTS)  # the default budget: every cluster keeps its window
    tiny = folded(EVENTS, watch_budget=1_000)  # a share of 20: the floor holds
    for cluster, changes in every.items():
        assert fleet[cluster] == changes[-150:]
        assert few[cluster] == changes[-WATCH_WINDOW:]
        assert tiny[cluster] == changes[-WATCH_FLOOR:]
    assert sum(map(len, fleet.values())) <= 50 * 150


def test_a_window_below_the_floor_is_kept_to() -> None:
    assert all(len(changes) == 5 for changes in folded(EVENTS[:5_000], watch_window=5).values())


def test_with_the_projectors_snapshots_a_partition_keeps_its_newest_checkpoint_alone() -> None:
    records = [Record(Position(0, i), event, b"") for i, event in enumerate(EVENTS[:10_000])]
    alone = LedgerViews(KafkaSettings(), checkpoint_every=1_000)
    alone._fold(records)
    assert [c.next_offset for c in alone._checkpoints[0]] == list(range(1_000, 10_001, 1_000))
    snapshots = SnapshotSource("sqlite:///never-read.db", DEFAULT_PROJECTION)
    beside = LedgerViews(KafkaSettings(), checkpoint_every=1_000, snapshots=snapshots)
    beside._fold(records)
    [newest] = beside._checkpoints[0]
    assert newest.next_offset == 10_000
    assert newest.folds.keys() == alone._checkpoints[0][-1].folds.keys()
