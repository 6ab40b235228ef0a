"""The timeline picture: what it draws for a history, and that any history draws."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    Event,
    Meta,
    MigrationCancelled,
    MigrationFailed,
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
DRAWN = ("rect", "circle", "line")


class History:
    """One cluster's records, built by minute of event time, at offsets 10, 11, ..."""

    def __init__(self) -> None:
        self.records: list[tuple[Event, Position]] = []

    def meta(self, minute: float) -> Meta:
        return Meta(f"e{len(self.records)}", "east", T0 + timedelta(minutes=minute), "test")

    def add(self, event: Event) -> None:
        self.records.append((event, Position(0, len(self.records) + 10)))

    def join(self, minute: float, host: str, start: int = 1) -> None:
        """A heartbeat of ``host``'s ``start``-th process (holder identity ``id-HOST_START``)."""
        self.add(
            ApiserverHeartbeat(
                self.meta(minute),
                f"id-{host}",
                f"id-{host}_{start}",
                host,
                3600,
                T0 + timedelta(minutes=minute),
            )
        )

    def report(self, minute: float, host: str, version: str) -> None:
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

    def release(self, minute: float, host: str, start: int = 1) -> None:
        self.add(ApiserverLeaseReleased(self.meta(minute), f"id-{host}", f"id-{host}_{start}"))

    def expire(self, minute: float, host: str, last_renewed_minute: float) -> None:
        renewed = T0 + timedelta(minutes=last_renewed_minute)
        self.add(ApiserverLeaseExpired(self.meta(minute), f"id-{host}", renewed, 3600))

    def request(self, minute: float, migration_id: str) -> None:
        self.add(
            MigrationRequested(
                self.meta(minute), migration_id, "apps", "deployments", "apps/v2", "h2", "0:1"
            )
        )


def upgrade_history() -> History:
    """Two apiservers on apps/v1; one upgrades, a migration is cancelled, the other
    follows, a migration succeeds, and the first one's lease expires."""
    h = History()
    for host in ("a", "b"):
        h.join(0, host)
    for host in ("a", "b"):
        h.report(0, host, "apps/v1")
    h.report(5, "a", "apps/v2")
    h.request(6, "m1")
    h.add(MigrationCancelled(h.meta(7), "m1", reason="EncodingVersionsDisagree"))
    h.report(10, "b", "apps/v2")
    h.request(11, "m2")
    h.add(MigrationStarted(h.meta(12), "m2"))
    h.add(MigrationSucceeded(h.meta(20), "m2", objects_migrated=7))
    h.expire(90, "a", 0)
    return h


def page_of(history: History) -> ET.Element:
    """The page, read as XML (it is well-formed), and its timeline SVG."""
    page = ET.fromstring(timeline.render("east", "apps", "deployments", history.records))
    svg = page.find(f".//{SVG}svg[@id='timeline']")
    assert svg is not None
    return svg


def by_class(svg: ET.Element) -> dict[str, list[ET.Element]]:
    drawn: dict[str, list[ET.Element]] = {}
    for element in svg.iter():
        for css in (element.get("class") or "").split():
            drawn.setdefault(css, []).append(element)
    return drawn


def label(row: ET.Element) -> str:
    """A row's label: the text after the title its hover shows."""
    title = row.find(f"{SVG}text/{SVG}title")
    assert title is not None
    return title.tail or ""


def minutes(time: datetime | None) -> float | None:
    return None if time is None else (time - T0) / timedelta(minutes=1)


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


def test_agreement_and_disagreement_windows_follow_the_common_version() -> None:
    picture = timeline.timeline("east", "apps", "deployments", upgrade_history().records)

    def windows(spans: list[timeline.Span]) -> list[tuple[str, int, int | None]]:
        return [(s.label, s.start.minute, s.end.minute if s.end else None) for s in spans]

    # they agree on v1, disagree from minute 5, agree on v2 from 10; a's expiry at 90
    # leaves b alone, still on v2: the window goes on
    assert windows(picture.agreement) == [("apps/v1", 0, 5), ("apps/v2", 10, None)]
    assert windows(picture.disagreement) == [(timeline.DISAGREE, 5, 10)]


def test_each_migration_is_a_bar_of_its_phases_and_its_label_says_how_it_ended() -> None:
    history = upgrade_history()
    picture = timeline.timeline("east", "apps", "deployments", history.records)
    bars = {m.migration_id: [s.label for s in m.phases] for m in picture.migrations}
    assert bars == {"m1": ["Pending", "Cancelled"], "m2": ["Pending", "Running", "Succeeded"]}
    labels = [label(row) for row in by_class(page_of(history))["migration-row"]]
    assert labels == ["migration to apps/v2: Cancelled", "migration to apps/v2: Succeeded"]


def test_the_page_draws_rows_and_bars_with_their_causes() -> None:
    drawn = by_class(page_of(upgrade_history()))
    assert [g.get("data-apiserver") for g in drawn["apiserver-row"]] == ["id-a", "id-b"]
    assert [label(g) for g in drawn["apiserver-row"]] == ["a", "b"]  # the hostnames
    assert [g.get("data-phase") for g in drawn["migration-row"]] == ["Cancelled", "Succeeded"]
    titles = [t.text or "" for g in drawn["apiserver-row"] for t in g.iter(f"{SVG}title")]
    # hovering shows the event and its log position
    assert any("StorageVersionReported at 0:13" in t for t in titles)  # b's v1 report
    assert any("lease ended: ApiserverLeaseExpired at 0:" in t for t in titles)
    (cancelled,) = (b for b in drawn["migration-bar"] if b.get("data-phase") == "Cancelled")
    assert "EncodingVersionsDisagree" in (cancelled.findtext(f"{SVG}title") or "")


def test_every_drawn_element_has_a_title_with_event_position_and_time() -> None:
    drawn = by_class(page_of(upgrade_history()))
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
    assert [e.get("data-end") for e in drawn["lease-end"]] == ["expired"]
    assert len(drawn["agreement"]) == 2
    assert len(drawn["disagreement"]) == 1
    for css in (
        "version-segment", "migration-bar", "lease", "lease-join", "lease-end", "agreement",
        "disagreement",
    ):  # fmt: skip
        for element in drawn[css]:
            title = element.find(f"{SVG}title")
            assert title is not None and title.text, (css, element.attrib)
            # e.g. "MigrationStarted at 0:19, 2026-11-02 10:12:00 UTC"
            assert re.search(r"\b[A-Z]\w+ at 0:\d+, 2026-11-02 \d\d:\d\d:\d\d UTC", title.text), (
                css,
                title.text,
            )
    # the migration's Running phase is caused by MigrationStarted, at its position
    (running,) = (b for b in drawn["migration-bar"] if b.get("data-phase") == "Running")
    assert "from MigrationStarted at 0:19, 2026-11-02 10:12:00 UTC" in (
        running.findtext(f"{SVG}title") or ""
    )


def test_a_restart_joins_again_and_only_an_applied_release_or_expiry_ends_a_lease() -> None:
    h = History()
    h.join(0, "a")
    h.report(0, "a", "apps/v1")
    h.join(10, "a", start=2)  # restarted without releasing: a new holder identity
    h.release(20, "a", start=1)  # the earlier start's release: rejected, changes nothing
    h.release(30, "a", start=2)
    h.join(40, "a", start=3)
    h.report(40, "a", "apps/v2")
    h.expire(50, "a", last_renewed_minute=30)  # stale: renewed at 40 since
    h.expire(60, "a", last_renewed_minute=40)
    (a,) = timeline.timeline("east", "apps", "deployments", h.records).apiservers
    assert [(s.label, minutes(s.start), minutes(s.end)) for s in a.leases] == [
        ("id-a_1", 0, 10),
        ("id-a_2", 10, 30),
        ("id-a_3", 40, 60),
    ]
    assert [(s.label, minutes(s.start), minutes(s.end)) for s in a.versions] == [
        ("apps/v1", 0, 30),
        ("apps/v2", 40, 60),
    ]
    drawn = by_class(page_of(h))
    assert len(drawn["lease-join"]) == 3
    assert [e.get("data-end") for e in drawn["lease-end"]] == ["released", "expired"]


def test_a_failed_migration_resumed_shows_how_long_it_stood_failed() -> None:
    h = History()
    h.join(0, "a")
    h.report(0, "a", "apps/v2")
    h.request(1, "m")
    h.add(MigrationStarted(h.meta(2), "m"))
    h.add(MigrationFailed(h.meta(3), "m", reason="Conflict", message="too many conflicts"))
    h.add(MigrationStarted(h.meta(8), "m"))
    h.add(MigrationSucceeded(h.meta(9), "m", objects_migrated=3))
    (m,) = timeline.timeline("east", "apps", "deployments", h.records).migrations
    assert [(s.label, minutes(s.start), minutes(s.end)) for s in m.phases] == [
        ("Pending", 1, 2),
        ("Running", 2, 3),
        ("Failed", 3, 8),
        ("Running", 8, 9),
        ("Succeeded", 9, 9),
    ]
    assert m.phases[2].detail == "Conflict: too many conflicts"


def test_the_axis_ticks_at_round_utc_times_and_dates_them_where_the_day_changes() -> None:
    start = datetime(2026, 11, 2, 10, 0, 7, tzinfo=UTC)
    step, ticks = timeline.ticks(start, start + timedelta(minutes=49))
    assert step == timedelta(minutes=10)
    assert [f"{t:%H:%M:%S}" for t in ticks] == ["10:10:00", "10:20:00", "10:30:00", "10:40:00"]

    h = History()
    h.join(-60 * 4, "a")  # 06:00 on the 2nd ...
    h.report(60 * 30, "a", "apps/v1")  # ... to 16:00 on the 3rd: a tick every 6 hours
    axis = page_of(h).find(f"{SVG}g[@class='axis']")
    assert axis is not None
    labels = [text.text for text in axis.iter(f"{SVG}text")]
    assert labels == [
        "time (UTC)", "06:00", "2026-11-02", "12:00", "18:00", "00:00", "2026-11-03", "06:00",
        "12:00",
    ]  # fmt: skip


def test_a_reporter_whose_clock_is_near_the_end_of_time_still_draws_a_page() -> None:
    # The log keeps such an event for ever: the resource's page must still draw.
    h = upgrade_history()
    h.report((datetime(9999, 12, 31, 23, tzinfo=UTC) - T0) / timedelta(minutes=1), "b", "apps/v1")
    svg = page_of(h)
    assert len(by_class(svg)["apiserver-row"]) == 2
    last = datetime.max.replace(tzinfo=UTC)
    assert timeline.ticks(last - timedelta(seconds=1), last) == (
        timedelta(seconds=1),
        [datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)],
    )


def test_a_cluster_without_events_draws_an_empty_page() -> None:
    svg = page_of(History())
    assert not by_class(svg).get("apiserver-row")


@settings(max_examples=60, deadline=None)
@given(histories())
def test_any_history_draws_a_well_formed_page(records: list[tuple[Event, Position]]) -> None:
    clusters = {event.meta.cluster for event, _ in records} or {"east"}
    cluster = sorted(clusters)[0]
    resources = {
        (e.group, e.resource) for e, _ in records if isinstance(e, StorageVersionReported)
    } or {("apps", "deployments")}
    for group, resource in sorted(resources):
        page = ET.fromstring(timeline.render(cluster, group, resource, records))
        svg = page.find(f".//{SVG}svg[@id='timeline']")
        assert svg is not None
        for row in svg:
            if row.get("class") == "axis":
                continue
            for element in row.iter():
                if element.tag.removeprefix(SVG) in DRAWN:
                    assert element.findtext(f"{SVG}title"), element.attrib


def test_an_unknown_window_lasts_while_a_live_apiserver_has_not_reported() -> None:
    h = History()
    h.join(0, "a")
    h.report(0, "a", "apps/v1")
    h.join(2, "b")  # a new member: what it writes is unknown until it reports
    h.report(5, "b", "apps/v1")
    picture = timeline.timeline("east", "apps", "deployments", h.records)

    def windows(spans: list[timeline.Span]) -> list[tuple[str, float | None, float | None]]:
        return [(s.label, minutes(s.start), minutes(s.end)) for s in spans]

    assert windows(picture.unknown) == [(timeline.UNKNOWN, 2, 5)]
    assert windows(picture.agreement) == [("apps/v1", 0, 2), ("apps/v1", 5, None)]
    assert picture.disagreement == []
    (band,) = by_class(page_of(h))["unknown"]
    assert "has not reported" in (band.findtext(f"{SVG}title") or "")
