"""The timeline picture: what it draws for a history, and that any history draws."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    Event,
    Meta,
    MigrationCancelled,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    Position,
    StorageVersionReported,
)
from readapi import timeline
from tests.histories import histories

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


class History:
    def __init__(self) -> None:
        self.records: list[tuple[Event, Position]] = []

    def meta(self, minute: int) -> Meta:
        return Meta(f"e{len(self.records)}", "east", T0 + timedelta(minutes=minute), "test")

    def add(self, event: Event) -> None:
        self.records.append((event, Position(0, len(self.records) + 10)))

    def join(self, minute: int, host: str) -> None:
        self.add(
            ApiserverHeartbeat(
                self.meta(minute),
                f"id-{host}",
                f"id-{host}_1",
                host,
                3600,
                T0 + timedelta(minutes=minute),
            )
        )

    def report(self, minute: int, host: str, version: str) -> None:
        self.add(
            StorageVersionReported(
                self.meta(minute),
                f"id-{host}",
                "apps",
                "deployments",
                "Deployment",
                version,
                ("apps/v1", "apps/v2"),
                ("apps/v1",),
            )
        )


def upgrade_history() -> History:
    """Two apiservers on apps/v1; one upgrades, a migration is cancelled, the other
    follows, a migration succeeds, and the first one's lease expires."""
    h = History()
    for host in ("a", "b"):
        h.join(0, host)
        h.report(0, host, "apps/v1")
    h.report(5, "a", "apps/v2")
    h.add(MigrationRequested(h.meta(6), "m1", "apps", "deployments", "apps/v2", "h2", "0:1"))
    h.add(MigrationCancelled(h.meta(7), "m1", reason="EncodingVersionsDisagree"))
    h.report(10, "b", "apps/v2")
    h.add(MigrationRequested(h.meta(11), "m2", "apps", "deployments", "apps/v2", "h2", "0:2"))
    h.add(MigrationStarted(h.meta(12), "m2"))
    h.add(MigrationSucceeded(h.meta(20), "m2", objects_migrated=7))
    h.add(ApiserverLeaseExpired(h.meta(90), "id-a", T0, 3600))
    return h


def test_each_apiserver_gets_a_row_of_the_versions_it_encoded() -> None:
    picture = timeline.timeline("east", "apps", "deployments", upgrade_history().records)
    rows = {
        row.hostname: [(s.label, s.start.minute) for s in row.versions]
        for row in picture.apiservers
    }
    assert rows == {"a": [("apps/v1", 0), ("apps/v2", 5)], "b": [("apps/v1", 0), ("apps/v2", 10)]}
    (a, b) = picture.apiservers
    assert a.versions[-1].end == T0 + timedelta(minutes=90)  # its lease expired
    assert a.leases[-1].ended_by is not None
    assert a.leases[-1].ended_by.event_type == "ApiserverLeaseExpired"
    assert b.versions[-1].end is None


def test_agreement_windows_follow_the_common_version() -> None:
    picture = timeline.timeline("east", "apps", "deployments", upgrade_history().records)
    windows = [
        (s.label, s.start.minute, s.end.minute if s.end else None) for s in picture.agreement
    ]
    # they agree on v1, disagree from minute 5, agree on v2 from 10; a's expiry at 90
    # leaves b alone, still on v2: the window goes on
    assert windows == [("apps/v1", 0, 5), ("apps/v2", 10, None)]


def test_each_migration_is_a_bar_of_its_phases() -> None:
    picture = timeline.timeline("east", "apps", "deployments", upgrade_history().records)
    bars = {m.migration_id: [s.label for s in m.phases] for m in picture.migrations}
    assert bars == {"m1": ["Pending", "Cancelled"], "m2": ["Pending", "Running", "Succeeded"]}


def test_the_page_draws_rows_and_bars_with_their_causes() -> None:
    history = upgrade_history()
    page = timeline.render("east", "apps", "deployments", history.records)
    svg = ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])
    groups = {g.get("class"): [] for g in svg.iter(f"{SVG}g")}
    for g in svg.iter(f"{SVG}g"):
        groups[g.get("class")].append(g)
    assert [g.get("data-apiserver") for g in groups["apiserver-row"]] == ["id-a", "id-b"]
    assert [g.get("data-phase") for g in groups["migration-row"]] == ["Cancelled", "Succeeded"]
    titles = [t.text or "" for t in svg.iter(f"{SVG}title")]
    # hovering shows the event and its log position
    assert any("MigrationSucceeded at 0:" in t for t in titles)
    assert any("StorageVersionReported at 0:14" in t for t in titles)  # b's v1 report
    assert any("lease ended: ApiserverLeaseExpired at 0:" in t for t in titles)


@settings(max_examples=60, deadline=None)
@given(histories())
def test_any_history_draws_a_well_formed_page(records: list[tuple[Event, Position]]) -> None:
    clusters = {event.meta.cluster for event, _ in records} or {"east"}
    cluster = sorted(clusters)[0]
    resources = {
        (e.group, e.resource) for e, _ in records if isinstance(e, StorageVersionReported)
    } or {("apps", "deployments")}
    for group, resource in sorted(resources):
        page = timeline.render(cluster, group, resource, records)
        ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])


def test_every_drawn_element_has_a_title_with_event_position_and_time() -> None:
    page = timeline.render("east", "apps", "deployments", upgrade_history().records)
    svg = ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])
    drawn: dict[str, list[ET.Element]] = {}
    for element in svg.iter():
        for css in (element.get("class") or "").split():
            drawn.setdefault(css, []).append(element)
    rows = {g.get("data-apiserver"): g for g in drawn["apiserver-row"]}
    segments = {
        apiserver: [
            s.get("data-version") for s in row.iter() if s.get("class") == "version-segment"
        ]
        for apiserver, row in rows.items()
    }
    assert segments == {"id-a": ["apps/v1", "apps/v2"], "id-b": ["apps/v1", "apps/v2"]}
    assert [b.get("data-phase") for b in drawn["migration-bar"]] == [
        "Pending", "Cancelled", "Pending", "Running", "Succeeded",
    ]  # fmt: skip
    assert len(drawn["lease-join"]) == 2
    assert len(drawn["lease-end"]) == 1
    assert len(drawn["agreement"]) == 2
    for css in ("version-segment", "migration-bar", "lease-join", "lease-end", "agreement"):
        for element in drawn[css]:
            title = element.find(f"{SVG}title")
            assert title is not None and title.text, (css, element.attrib)
            # e.g. "MigrationStarted at 0:18, 2026-11-02 10:12:00 UTC"
            assert re.search(r"\b[A-Z]\w+ at 0:\d+, 2026-11-02 \d\d:\d\d:\d\d UTC", title.text), (
                css,
                title.text,
            )
    # the migration's Running phase is caused by MigrationStarted, at its position
    (running,) = (b for b in drawn["migration-bar"] if b.get("data-phase") == "Running")
    assert "from MigrationStarted at 0:19, 2026-11-02 10:12:00 UTC" in (
        running.findtext(f"{SVG}title") or ""
    )
