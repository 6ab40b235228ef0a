"""A picture of one resource's history in one cluster: a self-contained HTML page.

On one time axis (UTC):

* a band where the apiservers agree (the StorageVersion's common encoding version is
  set), labelled with that version;
* one row per apiserver that reported on the resource: its lease (a thin line from
  join to expiry or release, with a marker at each end) and, over it, segments
  coloured by the version it encodes;
* one row per migration of the resource: a bar from its request to its last phase,
  in parts coloured by phase (Pending, Running, and how it ended).

Every element has an SVG ``<title>``, which a browser shows on hover: the event that
caused it, its log position (``partition:offset``, the revision the views cite) and
its time. The data come from folding the records with the projector's own fold
(:func:`projections.fold.apply`), so the picture shows what the views showed.

Pure: :func:`render` folds the records and returns the page (:func:`timeline` builds
the data, :func:`draw` the page from them); the command line (``svledger timeline``)
and the read API (``/clusters/CLUSTER/timeline/RESOURCE``) read the records and write
the page.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    Event,
    Position,
    type_name,
)
from ledger.names import resource_name
from projections.fold import apply
from projections.state import ResourceKey, State, StorageVersion

# Layout, in CSS pixels; exported so a test can find what is drawn where.
LEFT: Final = 230  # the label column
PLOT_WIDTH: Final = 1000
RIGHT: Final = 40  # room for the last axis label, centred on the plot's right edge
TOP: Final = 50  # the axis labels
ROW_HEIGHT: Final = 30
BAR_HEIGHT: Final = 16
AGREEMENT_ROW: Final = 0  # row index of the agreement band; apiservers follow
PHASE_COLOURS: Final = {
    "Pending": "#9e9e9e",
    "Running": "#1f77b4",
    "Succeeded": "#2ca02c",
    "Failed": "#d62728",
    "Cancelled": "#ff7f0e",
}
AGREEMENT_COLOUR: Final = "#7b3fa0"
LEASE_COLOUR: Final = "#555555"
VERSION_COLOURS: Final = ("#17becf", "#e377c2", "#bcbd22", "#8c564b", "#7f7f7f", "#aec7e8")


@dataclasses.dataclass(frozen=True, slots=True)
class Cause:
    """The event behind something drawn."""

    event_type: str
    position: str
    time: datetime

    @classmethod
    def of(cls, event: Event, position: Position) -> Cause:
        return cls(type_name(event), str(position), event.meta.occurred_at)

    def __str__(self) -> str:
        return f"{self.event_type} at {self.position}, {self.time:%Y-%m-%d %H:%M:%S} UTC"


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """Something that lasts from ``start`` (caused by ``cause``) to ``end`` (None: still)."""

    label: str
    start: datetime
    end: datetime | None
    cause: Cause
    ended_by: Cause | None = None


@dataclasses.dataclass
class Row:
    """One apiserver: its lease spans and its encoding version spans."""

    apiserver_id: str
    hostname: str
    leases: list[Span] = dataclasses.field(default_factory=list)
    versions: list[Span] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class MigrationRow:
    migration_id: str
    target_version: str
    phases: list[Span] = dataclasses.field(default_factory=list)  # label: the phase


@dataclasses.dataclass
class Timeline:
    cluster: str
    resource: ResourceKey
    start: datetime
    end: datetime
    agreement: list[Span]
    apiservers: list[Row]
    migrations: list[MigrationRow]


def timeline(
    cluster: str, group: str, resource: str, records: Sequence[tuple[Event, Position]]
) -> Timeline:
    """Fold ``records`` (one cluster's, in log order) and collect what the page draws."""
    key: ResourceKey = (cluster, group, resource)
    state = State()
    rows: dict[str, Row] = {}
    agreement: list[Span] = []
    migrations: dict[str, MigrationRow] = {}
    times = [event.meta.occurred_at for event, _ in records if event.meta.cluster == cluster]
    start = min(times) if times else datetime.min
    end = max(times) if times else datetime.min
    for event, position in records:
        if event.meta.cluster != cluster:
            continue
        before = state.storage_versions.get(key)
        apply(state, event, position)
        cause = Cause.of(event, position)
        now = event.meta.occurred_at
        _leases(state, rows, event, cause, now)
        after = state.storage_versions.get(key)
        if after is not before:
            _versions(rows, after, cause, now)
            _agreement(agreement, after.common_encoding_version if after else None, cause, now)
        for migration in state.migrations.values():
            if migration.resource_key == key:
                _migration(migrations, migration.migration_id, migration.target_version,
                           migration.phase, cause, migration.updated_at)  # fmt: skip
    return Timeline(
        cluster=cluster,
        resource=key,
        start=start,
        end=end,
        agreement=agreement,
        apiservers=sorted(
            (row for row in rows.values() if row.versions),
            key=lambda r: (r.hostname, r.apiserver_id),
        ),
        migrations=list(migrations.values()),
    )


def _leases(state: State, rows: dict[str, Row], event: Event, cause: Cause, now: datetime) -> None:
    """A heartbeat opens a lease span if none is open; an applied expiry or release ends it."""
    if isinstance(event, ApiserverHeartbeat):
        row = rows.setdefault(event.apiserver_id, Row(event.apiserver_id, event.hostname))
        row.hostname = event.hostname
        if not row.leases or row.leases[-1].end is not None:
            row.leases.append(Span("lease held", now, None, cause))
    elif isinstance(event, ApiserverLeaseReleased | ApiserverLeaseExpired):
        ended = rows.get(event.apiserver_id)
        if ended is not None and (event.meta.cluster, event.apiserver_id) not in state.leases:
            _close(ended.leases, now, cause)


def _versions(
    rows: dict[str, Row], storage_version: StorageVersion | None, cause: Cause, now: datetime
) -> None:
    entries = {e.apiserver_id: e.encoding_version for e in getattr(storage_version, "entries", ())}
    for apiserver_id, version in entries.items():
        row = rows.setdefault(apiserver_id, Row(apiserver_id, apiserver_id))
        current = row.versions[-1] if row.versions and row.versions[-1].end is None else None
        if current is not None and current.label == version:
            continue
        _close(row.versions, now, cause)
        row.versions.append(Span(version, now, None, cause))
    for apiserver_id, row in rows.items():
        if apiserver_id not in entries:
            _close(row.versions, now, cause)


def _agreement(spans: list[Span], common: str | None, cause: Cause, now: datetime) -> None:
    current = spans[-1] if spans and spans[-1].end is None else None
    if current is not None and current.label == common:
        return
    _close(spans, now, cause)
    if common is not None:
        spans.append(Span(common, now, None, cause))


def _migration(
    rows: dict[str, MigrationRow],
    migration_id: str,
    target: str,
    phase: str,
    cause: Cause,
    updated_at: datetime,
) -> None:
    row = rows.setdefault(migration_id, MigrationRow(migration_id, target))
    current = row.phases[-1] if row.phases else None
    if current is not None and current.label == phase:
        return
    if current is not None:
        row.phases[-1] = dataclasses.replace(current, end=updated_at, ended_by=cause)
    final = phase in ("Succeeded", "Cancelled")
    row.phases.append(Span(phase, updated_at, updated_at if final else None, cause, cause))


def _close(spans: list[Span], now: datetime, cause: Cause) -> None:
    if spans and spans[-1].end is None:
        spans[-1] = dataclasses.replace(spans[-1], end=now, ended_by=cause)


# --------------------------------------------------------------------------- drawing


def row_top(index: int) -> int:
    """The y of row ``index``'s top edge (row 0 is the agreement band)."""
    return TOP + index * ROW_HEIGHT


def version_colours(picture: Timeline) -> dict[str, str]:
    """A colour per encoding version, in order of first appearance."""
    versions: list[str] = []
    for row in picture.apiservers:
        for span in row.versions:
            if span.label not in versions:
                versions.append(span.label)
    return {v: VERSION_COLOURS[i % len(VERSION_COLOURS)] for i, v in enumerate(versions)}


def render(
    cluster: str, group: str, resource: str, records: Sequence[tuple[Event, Position]]
) -> str:
    """The page of ``group``/``resource`` in ``cluster``, from ``records`` in log order."""
    return draw(timeline(cluster, group, resource, records))


def draw(picture: Timeline) -> str:
    """The page: a legend and one SVG, no external assets."""
    scale = _Scale(picture.start, picture.end)
    colours = version_colours(picture)
    rows = 1 + len(picture.apiservers) + len(picture.migrations)
    height = row_top(rows) + 20
    parts: list[str] = [_axis(scale, height)]
    parts += _agreement_row(picture, scale)
    for index, row in enumerate(picture.apiservers, start=1):
        parts += _apiserver_row(row, row_top(index), scale, colours)
    for index, migration in enumerate(picture.migrations, start=1 + len(picture.apiservers)):
        parts += _migration_row(migration, row_top(index), scale)
    name = resource_name(picture.resource[1], picture.resource[2])
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + PLOT_WIDTH + RIGHT}" '
        f'height="{height}" font-family="sans-serif" font-size="12">' + "".join(parts) + "</svg>"
    )
    legend = "".join(
        f'<span class="key"><i style="background:{colour}"></i>encodes {_e(version)}</span>'
        for version, colour in colours.items()
    ) + "".join(
        f'<span class="key"><i style="background:{colour}"></i>migration {phase}</span>'
        for phase, colour in PHASE_COLOURS.items()
    )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{_e(name)} in {_e(picture.cluster)}</title><style>"
        "body{font-family:sans-serif;margin:16px;color:#222}"
        ".key{margin-right:14px;white-space:nowrap}"
        ".key i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}"
        "svg rect:hover,svg circle:hover{stroke:#000;stroke-width:1}"
        "</style></head><body>"
        f"<h1>{_e(name)} in cluster {_e(picture.cluster)}</h1>"
        f"<p>{_e(_when(picture.start))} to {_e(_when(picture.end))}. "
        "Hover over anything for the event that caused it and its log position.</p>"
        f'<p class="legend"><span class="key"><i style="background:{AGREEMENT_COLOUR}"></i>'
        f"apiservers agree</span>{legend}</p>{svg}</body></html>\n"
    )


class _Scale:
    def __init__(self, start: datetime, end: datetime) -> None:
        self.start = start
        self.seconds = max((end - start).total_seconds(), 1.0)
        self.end = end

    def x(self, time: datetime | None) -> float:
        offset = ((time or self.end) - self.start).total_seconds()
        return round(LEFT + PLOT_WIDTH * min(max(offset / self.seconds, 0.0), 1.0), 1)


def _axis(scale: _Scale, height: int) -> str:
    ticks = []
    for i in range(6):
        time = scale.start + timedelta(seconds=scale.seconds * i / 5)
        x = scale.x(time)
        ticks.append(
            f'<line x1="{x}" y1="{TOP - 6}" x2="{x}" y2="{height - 14}" stroke="#e0e0e0"/>'
            f'<text x="{x}" y="{TOP - 10}" text-anchor="middle">{time:%H:%M:%S}</text>'
        )
    return '<g class="axis">' + "".join(ticks) + "</g>"


def _label(y: int, text: str, title: str) -> str:
    return (
        f'<text x="{LEFT - 8}" y="{y + ROW_HEIGHT / 2 + 4}" text-anchor="end">'
        f"<title>{_e(title)}</title>{_e(text)}</text>"
    )


def _bar(css: str, x1: float, x2: float, y: int, colour: str, title: str, extra: str = "") -> str:
    width = max(x2 - x1, 2.0)
    top = y + (ROW_HEIGHT - BAR_HEIGHT) / 2
    return (
        f'<rect class="{css}" x="{x1}" y="{top}" width="{width}" height="{BAR_HEIGHT}" '
        f'fill="{colour}"{extra}><title>{_e(title)}</title></rect>'
    )


def _span_title(what: str, span: Span) -> str:
    text = f"{what}\nfrom {span.cause}"
    if span.ended_by is not None and span.end is not None:
        text += f"\nuntil {span.ended_by}"
    return text


def _agreement_row(picture: Timeline, scale: _Scale) -> list[str]:
    y = row_top(AGREEMENT_ROW)
    parts = ['<g class="agreement-row">', _label(y, "agreement", "common encoding version set")]
    for span in picture.agreement:
        x1, x2 = scale.x(span.start), scale.x(span.end)
        parts.append(
            _bar(
                "agreement",
                x1,
                x2,
                y,
                AGREEMENT_COLOUR,
                _span_title(f"all apiservers encode {span.label}", span),
            )
        )
        parts.append(
            f'<text x="{x1 + 4}" y="{y + ROW_HEIGHT / 2 + 4}" fill="#fff">{_e(span.label)}</text>'
        )
    parts.append("</g>")
    return parts


def _apiserver_row(row: Row, y: int, scale: _Scale, colours: dict[str, str]) -> list[str]:
    parts = [
        f'<g class="apiserver-row" data-apiserver="{_e(row.apiserver_id)}">',
        _label(y, row.hostname, row.apiserver_id),
    ]
    middle = y + ROW_HEIGHT / 2
    for lease in row.leases:
        x1, x2 = scale.x(lease.start), scale.x(lease.end)
        parts.append(
            f'<line class="lease" x1="{x1}" y1="{middle}" x2="{x2}" y2="{middle}" '
            f'stroke="{LEASE_COLOUR}" stroke-width="2"><title>'
            f"{_e(_span_title('lease held', lease))}</title></line>"
            f'<circle class="lease-join" cx="{x1}" cy="{middle}" r="4" fill="{LEASE_COLOUR}">'
            f"<title>{_e(f'joined: {lease.cause}')}</title></circle>"
        )
        if lease.end is not None and lease.ended_by is not None:
            parts.append(
                f'<circle class="lease-end" cx="{x2}" cy="{middle}" r="4" fill="#fff" '
                f'stroke="{LEASE_COLOUR}" stroke-width="2">'
                f"<title>{_e(f'lease ended: {lease.ended_by}')}</title></circle>"
            )
    for span in row.versions:
        parts.append(
            _bar(
                "version-segment",
                scale.x(span.start),
                scale.x(span.end),
                y,
                colours[span.label],
                _span_title(f"{row.hostname} encodes {span.label}", span),
                f' data-version="{_e(span.label)}"',
            )
        )
    parts.append("</g>")
    return parts


def _migration_row(row: MigrationRow, y: int, scale: _Scale) -> list[str]:
    final = row.phases[-1].label if row.phases else "Pending"
    parts = [
        f'<g class="migration-row" data-migration="{_e(row.migration_id)}" data-phase="{final}">',
        _label(y, f"migration to {row.target_version}", row.migration_id),
    ]
    for span in row.phases:
        parts.append(
            _bar(
                "migration-bar",
                scale.x(span.start),
                scale.x(span.end),
                y,
                PHASE_COLOURS[span.label],
                _span_title(f"migration {row.migration_id} {span.label}", span),
                f' data-phase="{span.label}"',
            )
        )
    parts.append("</g>")
    return parts


def _when(time: datetime) -> str:
    return f"{time:%Y-%m-%d %H:%M:%S} UTC"


def _e(text: str) -> str:
    return html.escape(text, quote=True)
