"""How many of each cluster's changes the read API keeps for watches: its latest
``--watch-window``, or on a fleet its share of ``--watch-budget``, never fewer than 100."""

from __future__ import annotations

from ledger.events import Event, Position
from ledger.kafka import Record
from ledger.settings import KafkaSettings
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
