"""A picture of one resource's history in one cluster: a self-contained HTML page.

On one time axis (UTC, tick labels at round times, the date wherever it changes):

* the agreement row: a band where the apiservers agree (the StorageVersion's common
  encoding version is set), labelled with that version, a grey band where they
  disagree, a sand one where agreement is unknown (an apiserver holding a live lease has
  not reported), nothing where no apiserver reports on the resource;
* one row per apiserver that reported on the resource, labelled with its hostname:
  bars coloured by the version it encodes and, under them, its lease: a line while it
  is held, a dot where the apiserver joined (its first heartbeat, or the first under a
  new holder identity, which is a restart) and a tick where the lease was released
  (grey) or expired (red);
* one row per migration of the resource: a bar from its request, in parts coloured by
  phase (Pending, Running), ending in a short mark of the phase it ended in
  (Succeeded, Failed, Cancelled), which the row's label names too;
* for a custom resource, its CustomResourceDefinition's row: a mark where the collector
  saw its storage version or ``status.storedVersions`` change (``storage v2``,
  ``storedVersions [v1, v2]``), where svledger's worker pruned ``storedVersions``
  (``pruned v1``) or refused to (``prune refused: GenerationChanged``), and a red line
  while the CustomResourceDefinition carries an alarm: a version left
  ``storedVersions`` while the ledger held that objects may still be stored in it
  (:mod:`projections.crds`).

Every drawn element has an SVG ``<title>``, which a browser shows on hover: the event
that caused it, its log position (``partition:offset``, the revision the views cite)
and its time. The data come from folding the records with the projector's own fold
(:func:`projections.fold.apply`) and looking at what each event changed, so the
picture shows what the views showed, rejected events included (they change nothing).

Pure: :func:`timeline` folds the records into a :class:`Timeline`, :func:`draw` draws
the page from one, :func:`render` does both. The command line (``svledger timeline``)
and the read API (``/clusters/CLUSTER/timeline/RESOURCE``) read the records and write
the page. The layout constants are exported so that a test can find on a screenshot
what is drawn where.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    CustomResourceDefinitionObserved,
    Event,
    Position,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
    type_name,
)
from ledger.names import resource_name
from projections.crds import dropped
from projections.fold import apply
from projections.state import (
    ACTIVE_PHASES,
    CustomResourceDefinition,
    ResourceKey,
    State,
    StorageVersion,
)

# Layout, in CSS pixels.
LEFT: Final = 230  # the label column
PLOT_WIDTH: Final = 1000
RIGHT: Final = 40  # room for the last axis label and a final phase's mark
TOP: Final = 64  # the axis labels: the date where it changes, above the time
ROW_HEIGHT: Final = 36
BAR_TOP: Final = 6  # a bar's top edge, below its row's top edge
BAR_HEIGHT: Final = 16
LEASE_Y: Final = 29  # an apiserver's lease line, below its row's top edge
END_MARK: Final = 8  # the width of the mark of the phase a migration ended in
AGREEMENT_ROW: Final = 0  # row index of the agreement band; apiservers, migrations, CRD follow
MAX_TICKS: Final = 8

AGREEMENT_COLOUR: Final = "#7b3fa0"
DISAGREEMENT_COLOUR: Final = "#d9d9d9"
UNKNOWN_COLOUR: Final = "#f2e6c9"  # agreement unknown: a live apiserver has not reported
LEASE_COLOUR: Final = "#555555"
EXPIRED_COLOUR: Final = "#b00020"
VERSION_COLOURS: Final = ("#17becf", "#e377c2", "#bcbd22", "#8c564b", "#7f7f7f", "#aec7e8")
PHASE_COLOURS: Final = {
    "Pending": "#9e9e9e",
    "Running": "#1f77b4",
    "Succeeded": "#2ca02c",
    "Failed": "#d62728",
    "Cancelled": "#ff7f0e",
}
# A CustomResourceDefinition's marks, by what happened (Mark.kind); its alarm's line.
CRD_COLOURS: Final = {"changed": "#4c4c4c", "pruned": "#2ca02c", "refused": "#ff7f0e"}
ALARM_COLOUR: Final = EXPIRED_COLOUR
CRD_MARK: Final = 3  # the width of a CustomResourceDefinition's mark
DISAGREE: Final = "versions differ"  # the label of a disagreement window
UNKNOWN: Final = "not every apiserver reported"  # the label of an unknown window

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_HEARTBEAT: Final = ApiserverHeartbeat.__name__
_EXPIRED: Final = ApiserverLeaseExpired.__name__
_MINUTE: Final = timedelta(minutes=1)
_DAY: Final = timedelta(days=1)
# Tick intervals, each a round number in its unit; the first that gives at most
# MAX_TICKS ticks is used, and beyond a week a whole number of days.
_TICK_STEPS: Final = tuple(
    timedelta(seconds=seconds) for seconds in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800)
) + tuple(timedelta(hours=hours) for hours in (1, 2, 3, 6, 12, 24, 48, 168))


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
        return f"{self.event_type} at {self.position}, {_when(self.time)}"


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """Something that lasts from ``start`` (caused by ``cause``) to ``end`` (None: still)."""

    label: str
    start: datetime
    end: datetime | None
    cause: Cause
    ended_by: Cause | None = None
    detail: str | None = None  # a migration's reason and message


@dataclasses.dataclass
class ApiserverRow:
    """One apiserver: its leases (labelled by holder identity) and the versions it encoded."""

    apiserver_id: str
    hostname: str
    leases: list[Span] = dataclasses.field(default_factory=list)
    versions: list[Span] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class MigrationRow:
    """One migration: its phases, the last one the phase it is in (or ended in)."""

    migration_id: str
    target_version: str
    phases: list[Span] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    """Something that happened to a CustomResourceDefinition at one moment."""

    label: str
    kind: Literal["changed", "pruned", "refused"]  # its colour in CRD_COLOURS
    cause: Cause
    detail: str | None = None  # the worker's words on a prune, or a refusal's


@dataclasses.dataclass
class CrdRow:
    """The resource's CustomResourceDefinition: the changes of its storage version and
    ``storedVersions``, the worker's prunes, and its alarms (each labelled with its words)."""

    name: str
    marks: list[Mark] = dataclasses.field(default_factory=list)
    alarms: list[Span] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Timeline:
    """What the page draws: a resource's history from the cluster's first event to its last."""

    cluster: str
    resource: ResourceKey
    start: datetime
    end: datetime
    agreement: list[Span]  # labelled with the common encoding version
    disagreement: list[Span]  # labelled DISAGREE
    unknown: list[Span]  # labelled UNKNOWN
    apiservers: list[ApiserverRow]
    migrations: list[MigrationRow]
    crd: CrdRow | None = None  # None: the ledger never held a CRD of the resource


def render(
    cluster: str, group: str, resource: str, records: Sequence[tuple[Event, Position]]
) -> str:
    """The page of ``group``/``resource`` in ``cluster``, from ``records`` in log order."""
    return draw(timeline(cluster, group, resource, records))


def timeline(
    cluster: str, group: str, resource: str, records: Sequence[tuple[Event, Position]]
) -> Timeline:
    """Fold ``records`` (in log order; other clusters' are passed over) and collect the picture."""
    key: ResourceKey = (cluster, group, resource)
    state = State()
    apiservers: dict[str, ApiserverRow] = {}
    migrations: dict[str, MigrationRow] = {}
    agreement: list[Span] = []
    disagreement: list[Span] = []
    unknown: list[Span] = []
    crd_row: CrdRow | None = None
    crd: CustomResourceDefinition | None = None  # as the last event left it
    start = end = None
    for event, position in records:
        if event.meta.cluster != cluster:
            continue
        now = event.meta.occurred_at
        start = now if start is None else min(start, now)
        end = now if end is None else max(end, now)
        changes = apply(state, event, position)
        cause = Cause.of(event, position)
        if changes.leases:
            _lease(apiservers, state, event, cause)
        if key in changes.storage_versions:
            storage_version = state.storage_versions.get(key)  # None: deleted (no entries left)
            _versions(apiservers, storage_version, cause)
            common = storage_version.common_encoding_version if storage_version else None
            _window(agreement, common, cause)
            status = storage_version.condition.status if storage_version else None
            _window(disagreement, DISAGREE if status == "False" else None, cause)
            _window(unknown, UNKNOWN if status == "Unknown" else None, cause)
        for migration_key in changes.migrations:
            migration = state.migrations.get(migration_key)
            if migration is not None and migration.resource_key == key:
                row = migrations.setdefault(
                    migration.migration_id,
                    MigrationRow(migration.migration_id, migration.target_version),
                )
                detail = ": ".join(filter(None, (migration.reason, migration.message)))
                _phase(row.phases, migration.phase, detail or None, cause)
        if key in changes.custom_resources:
            after = state.custom_resources.get(key)
            if crd_row is None:
                crd_row = CrdRow(f"{resource}.{group}")  # as every CRD's name is
            _crd(crd_row, crd, after, event, cause)
            crd = after
    return Timeline(
        cluster=cluster,
        resource=key,
        start=start or EPOCH,
        end=end or EPOCH,
        agreement=agreement,
        disagreement=disagreement,
        unknown=unknown,
        apiservers=sorted(
            (row for row in apiservers.values() if row.versions),
            key=lambda row: (row.hostname, row.apiserver_id),
        ),
        migrations=list(migrations.values()),
        crd=crd_row,
    )


def _lease(rows: dict[str, ApiserverRow], state: State, event: Event, cause: Cause) -> None:
    """A heartbeat under a holder identity not seen holding the lease joins; an end ends.

    Called only when the event changed a lease: a release by an earlier holder or a
    stale expiry is rejected by the fold and changes none, so it ends nothing here.
    """
    if isinstance(event, ApiserverHeartbeat):
        row = rows.setdefault(event.apiserver_id, ApiserverRow(event.apiserver_id, event.hostname))
        row.hostname = event.hostname
        held = row.leases[-1] if row.leases and row.leases[-1].end is None else None
        if held is None or held.label != event.holder_identity:
            # A new holder identity is a new start of the apiserver (upstream makes one
            # per process), whether or not the previous start released the lease.
            _close(row.leases, cause)
            row.leases.append(Span(event.holder_identity, cause.time, None, cause))
    elif isinstance(event, ApiserverLeaseReleased | ApiserverLeaseExpired):
        ended = rows.get(event.apiserver_id)
        if ended is not None and (event.meta.cluster, event.apiserver_id) not in state.leases:
            _close(ended.leases, cause)


def _versions(
    rows: dict[str, ApiserverRow], storage_version: StorageVersion | None, cause: Cause
) -> None:
    """Each apiserver's version as the StorageVersion's entries now say."""
    entries = {
        entry.apiserver_id: entry.encoding_version
        for entry in (storage_version.entries if storage_version else ())
    }
    for apiserver_id, version in entries.items():
        row = rows.setdefault(apiserver_id, ApiserverRow(apiserver_id, apiserver_id))
        current = row.versions[-1] if row.versions and row.versions[-1].end is None else None
        if current is None or current.label != version:
            _close(row.versions, cause)
            row.versions.append(Span(version, cause.time, None, cause))
    for apiserver_id, row in rows.items():
        if apiserver_id not in entries:
            _close(row.versions, cause)


def _crd(
    row: CrdRow,
    before: CustomResourceDefinition | None,
    after: CustomResourceDefinition | None,
    event: Event,
    cause: Cause,
) -> None:
    """Mark what ``event`` did to the CustomResourceDefinition (``before`` it, ``after``
    it; None: none held); open or close its alarm's window.

    Called only when the event changed the CustomResourceDefinition's row: a prune of a
    CustomResourceDefinition the ledger does not hold is rejected and marks nothing, and a
    migration's end may raise or lift an alarm (:func:`projections.fold._judge_prunes`).
    """
    match event:
        case CustomResourceDefinitionObserved() if after is None:
            row.marks.append(Mark("deleted", "changed", cause))
        case CustomResourceDefinitionObserved() if after is not None:
            words = []
            if before is None or before.storage_version != after.storage_version:
                words.append(f"storage {after.storage_version}")
            if before is None or before.stored_versions != after.stored_versions:
                words.append(f"storedVersions [{', '.join(after.stored_versions)}]")
            if words:
                row.marks.append(Mark(", ".join(words), "changed", cause))
        case StoredVersionsPruned():
            removed = dropped(event.stored_versions_before, event.stored_versions_after)
            detail = after.prune_message if after is not None else None
            row.marks.append(Mark(f"pruned {', '.join(removed)}", "pruned", cause, detail))
        case StoredVersionsPruneRefused():
            label = f"prune refused: {event.reason}"
            row.marks.append(Mark(label, "refused", cause, event.message))
    _window(row.alarms, after.prune_alarm if after is not None else None, cause)


def _window(spans: list[Span], label: str | None, cause: Cause) -> None:
    """Open a window labelled ``label`` (None: none), closing the open one if it differs."""
    current = spans[-1] if spans and spans[-1].end is None else None
    if current is not None and current.label == label:
        return
    _close(spans, cause)
    if label is not None:
        spans.append(Span(label, cause.time, None, cause))


def _phase(phases: list[Span], phase: str, detail: str | None, cause: Cause) -> None:
    """Move a migration to ``phase``; a phase it may end in lasts no time unless it moves on.

    A failed migration can be resumed: its Failed phase then lasts until it runs again.
    """
    current = phases[-1] if phases else None
    if current is not None and current.label == phase:
        return
    if current is not None:
        phases[-1] = dataclasses.replace(current, end=cause.time, ended_by=cause)
    final = phase not in ACTIVE_PHASES
    phases.append(Span(phase, cause.time, cause.time if final else None, cause, detail=detail))


def _close(spans: list[Span], cause: Cause) -> None:
    if spans and spans[-1].end is None:
        spans[-1] = dataclasses.replace(spans[-1], end=cause.time, ended_by=cause)


# --------------------------------------------------------------------------- drawing


def row_top(index: int) -> int:
    """The y of row ``index``'s top edge: the agreement row, the apiservers, the migrations,
    the CustomResourceDefinition."""
    return TOP + index * ROW_HEIGHT


def version_colours(picture: Timeline) -> dict[str, str]:
    """A colour per encoding version, in order of first appearance."""
    spans = sorted((s for row in picture.apiservers for s in row.versions), key=lambda s: s.start)
    versions = dict.fromkeys(span.label for span in spans)
    return {v: VERSION_COLOURS[i % len(VERSION_COLOURS)] for i, v in enumerate(versions)}


def ticks(start: datetime, end: datetime) -> tuple[timedelta, list[datetime]]:
    """The axis' tick interval and ticks: round UTC times from ``start`` to ``end``."""
    span = end - start
    step = next(
        (step for step in _TICK_STEPS if span <= step * MAX_TICKS),
        _DAY * math.ceil(span / _DAY / MAX_TICKS),
    )
    found = []
    with contextlib.suppress(OverflowError):  # past the year 9999: a reporter's wild clock
        tick = EPOCH + -((EPOCH - start) // step) * step  # the first multiple of step from start
        while tick <= end:
            found.append(tick)
            tick += step
    return step, found or [start]


def draw(picture: Timeline) -> str:
    """The page: a heading, a legend and one SVG; no scripts, no external assets.

    The page is well-formed XML as well as HTML, so a test can read it with an XML parser.
    """
    scale = _Scale(picture.start, picture.end)
    colours = version_colours(picture)
    first_migration = AGREEMENT_ROW + 1 + len(picture.apiservers)
    crd_index = first_migration + len(picture.migrations)
    rows = crd_index + (1 if picture.crd is not None else 0)
    height = row_top(rows) + 8
    parts: list[str] = [_axis(scale, height)]
    parts += _agreement_row(picture, scale)
    for index, row in enumerate(picture.apiservers, start=AGREEMENT_ROW + 1):
        parts += _apiserver_row(row, row_top(index), scale, colours)
    for index, migration in enumerate(picture.migrations, start=first_migration):
        parts += _migration_row(migration, row_top(index), scale)
    if picture.crd is not None:
        parts += _crd_row(picture.crd, row_top(crd_index), scale)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="{LEFT + PLOT_WIDTH + RIGHT}"'
        f' height="{height}" font-family="sans-serif" font-size="12">{"".join(parts)}</svg>'
    )
    name = resource_name(picture.resource[1], picture.resource[2])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        f"<title>{_e(name)} in {_e(picture.cluster)}</title><style>"
        "body{font-family:sans-serif;margin:16px;color:#222}"
        "h1{font-size:22px;margin:0 0 6px}p{margin:4px 0}"
        ".key{margin-right:14px;white-space:nowrap;display:inline-block}"
        ".key svg{vertical-align:-2px;margin-right:4px}"
        "svg rect:hover,svg circle:hover{stroke:#000;stroke-width:1}"
        "</style></head><body>"
        f"<h1>{_e(name)} in cluster {_e(picture.cluster)}</h1>"
        f"<p>From {_e(_when(picture.start))} to {_e(_when(picture.end))}: the cluster's "
        "first and last event in the log. Hover over anything for the event that caused it "
        "and its log position.</p>"
        f'<p class="legend">{_legend(colours, picture.crd is not None)}</p>{svg}</body></html>\n'
    )


class _Scale:
    """Times to x: the cluster's first event at LEFT, its last at LEFT + PLOT_WIDTH."""

    def __init__(self, start: datetime, end: datetime) -> None:
        self.start = start
        self.end = end
        self.seconds = max((end - start).total_seconds(), 1.0)

    def x(self, time: datetime | None) -> float:
        offset = ((self.end if time is None else time) - self.start).total_seconds()
        return round(LEFT + PLOT_WIDTH * min(max(offset / self.seconds, 0.0), 1.0), 1)


def _axis(scale: _Scale, height: int) -> str:
    step, times = ticks(scale.start, scale.end)
    clock = "" if step >= _DAY else "%H:%M:%S" if step < _MINUTE else "%H:%M"
    parts = [
        '<g class="axis">',
        # right-aligned clear of the first tick's label, centred on LEFT
        f'<text x="{LEFT - 32}" y="{TOP - 12}" text-anchor="end" fill="#666">time (UTC)</text>',
    ]
    previous_date = None
    for time in times:
        x = scale.x(time)
        parts.append(f'<line x1="{x}" y1="{TOP - 6}" x2="{x}" y2="{height}" stroke="#e0e0e0"/>')
        if clock:
            parts.append(f'<text x="{x}" y="{TOP - 12}" text-anchor="middle">{time:{clock}}</text>')
        if time.date() != previous_date:
            y = TOP - 28 if clock else TOP - 12
            parts.append(
                f'<text x="{x}" y="{y}" text-anchor="middle" fill="#666">{time:%Y-%m-%d}</text>'
            )
            previous_date = time.date()
    parts.append("</g>")
    return "".join(parts)


def _legend(colours: dict[str, str], crd: bool) -> str:
    def key(swatch: str, text: str) -> str:
        return f'<span class="key"><svg width="16" height="14">{swatch}</svg>{_e(text)}</span>'

    def square(colour: str) -> str:
        return f'<rect x="1" y="1" width="12" height="12" fill="{colour}"/>'

    def tick(colour: str) -> str:
        return f'<rect x="6" y="0" width="3" height="14" fill="{colour}"/>'

    lease = (
        f'<line x1="0" y1="7" x2="16" y2="7" stroke="{LEASE_COLOUR}" stroke-width="2"/>'
        f'<circle cx="5" cy="7" r="4" fill="{LEASE_COLOUR}"/>'
    )
    return "".join(
        [
            key(square(AGREEMENT_COLOUR), "apiservers agree"),
            key(square(DISAGREEMENT_COLOUR), "encoding versions differ"),
            key(square(UNKNOWN_COLOUR), "agreement unknown"),
            *(key(square(colour), f"encodes {version}") for version, colour in colours.items()),
            key(lease, "lease held (dot: joined)"),
            key(tick(LEASE_COLOUR), "lease released"),
            key(tick(EXPIRED_COLOUR), "lease expired"),
            *(key(square(colour), f"migration {phase}") for phase, colour in PHASE_COLOURS.items()),
            *(
                (
                    key(
                        tick(CRD_COLOURS["changed"]),
                        "CRD's storage version or storedVersions changed",
                    ),
                    key(tick(CRD_COLOURS["pruned"]), "storedVersions pruned"),
                    key(tick(CRD_COLOURS["refused"]), "prune refused"),
                    key(tick(ALARM_COLOUR), "pruned without proof (alarm)"),
                )
                if crd
                else ()
            ),
        ]
    )


def _label(y: int, text: str, title: str) -> str:
    return (
        f'<text x="{LEFT - 8}" y="{y + BAR_TOP + BAR_HEIGHT / 2 + 4}" text-anchor="end">'
        f"<title>{_e(title)}</title>{_e(text)}</text>"
    )


def _bar(css: str, x1: float, width: float, y: int, colour: str, title: str, data: str) -> str:
    return (
        f'<rect class="{css}"{data} x="{x1}" y="{y + BAR_TOP}" width="{max(width, 2.0)}" '
        f'height="{BAR_HEIGHT}" fill="{colour}"><title>{_e(title)}</title></rect>'
    )


def _span_title(what: str, span: Span) -> str:
    text = f"{what}\nfrom {span.cause}"
    if span.detail:
        text += f"\n{span.detail}"
    if span.end is not None and span.ended_by is not None:
        text += f"\nuntil {span.ended_by}"
    return text


def _agreement_row(picture: Timeline, scale: _Scale) -> list[str]:
    y = row_top(AGREEMENT_ROW)
    parts = [
        '<g class="agreement-row">',
        _label(y, "agreement", "the StorageVersion's common encoding version"),
    ]
    for span in picture.disagreement:
        x1, x2 = scale.x(span.start), scale.x(span.end)
        title = _span_title("the apiservers' encoding versions differ", span)
        parts.append(_bar("disagreement", x1, x2 - x1, y, DISAGREEMENT_COLOUR, title, ""))
    for span in picture.unknown:
        x1, x2 = scale.x(span.start), scale.x(span.end)
        title = _span_title(
            "agreement unknown: an apiserver holding a live lease has not reported", span
        )
        parts.append(_bar("unknown", x1, x2 - x1, y, UNKNOWN_COLOUR, title, ""))
    for span in picture.agreement:
        x1, x2 = scale.x(span.start), scale.x(span.end)
        title = _span_title(f"all apiservers encode {span.label}", span)
        data = f' data-version="{_e(span.label)}"'
        parts.append(_bar("agreement", x1, x2 - x1, y, AGREEMENT_COLOUR, title, data))
        if x2 - x1 >= 7 * len(span.label) + 8:  # the label fits in the band
            parts.append(
                f'<text x="{x1 + 4}" y="{y + BAR_TOP + BAR_HEIGHT / 2 + 4}" fill="#fff" '
                f'pointer-events="none">{_e(span.label)}</text>'
            )
    parts.append("</g>")
    return parts


def _apiserver_row(row: ApiserverRow, y: int, scale: _Scale, colours: dict[str, str]) -> list[str]:
    parts = [
        f'<g class="apiserver-row" data-apiserver="{_e(row.apiserver_id)}">',
        _label(y, row.hostname, f"apiserver {row.apiserver_id}"),
    ]
    for span in row.versions:
        x1, x2 = scale.x(span.start), scale.x(span.end)
        title = _span_title(f"{row.hostname} encodes {span.label}", span)
        data = f' data-version="{_e(span.label)}"'
        parts.append(_bar("version-segment", x1, x2 - x1, y, colours[span.label], title, data))
    line = y + LEASE_Y
    joins, ends = [], []
    for lease in row.leases:
        x1, x2 = scale.x(lease.start), scale.x(lease.end)
        title = _span_title(f"lease held by {lease.label}", lease)
        parts.append(
            f'<line class="lease" x1="{x1}" y1="{line}" x2="{x2}" y2="{line}" '
            f'stroke="{LEASE_COLOUR}" stroke-width="2"><title>{_e(title)}</title></line>'
        )
        joins.append(
            f'<circle class="lease-join" cx="{x1}" cy="{line}" r="4" fill="{LEASE_COLOUR}">'
            f"<title>{_e(f'joined as {lease.label}: {lease.cause}')}</title></circle>"
        )
        ended_by = lease.ended_by
        if ended_by is not None and ended_by.event_type != _HEARTBEAT:
            expired = ended_by.event_type == _EXPIRED
            ends.append(
                f'<rect class="lease-end" data-end="{"expired" if expired else "released"}" '
                f'x="{x2 - 1.5}" y="{line - 7}" width="3" height="14" '
                f'fill="{EXPIRED_COLOUR if expired else LEASE_COLOUR}">'
                f"<title>{_e(f'lease ended: {ended_by}')}</title></rect>"
            )
    # Ends under joins: a restart's release and rejoin at one moment show both.
    parts += ends + joins
    parts.append("</g>")
    return parts


def _migration_row(row: MigrationRow, y: int, scale: _Scale) -> list[str]:
    last = row.phases[-1]
    parts = [
        f'<g class="migration-row" data-migration="{_e(row.migration_id)}" '
        f'data-phase="{last.label}">',
        _label(
            y,
            f"migration to {row.target_version}: {last.label}",
            f"migration {row.migration_id}" + (f"\n{last.detail}" if last.detail else ""),
        ),
    ]
    for span in row.phases:
        x1, x2 = scale.x(span.start), scale.x(span.end)
        ended = span.end == span.start and span.ended_by is None  # the phase it ended in
        parts.append(
            _bar(
                "migration-bar",
                x1,
                END_MARK if ended else x2 - x1,
                y,
                PHASE_COLOURS[span.label],
                _span_title(f"migration {row.migration_id} {span.label}", span),
                f' data-phase="{span.label}"',
            )
        )
    parts.append("</g>")
    return parts


def _crd_row(row: CrdRow, y: int, scale: _Scale) -> list[str]:
    parts = [
        f'<g class="crd-row" data-crd="{_e(row.name)}">',
        _label(y, f"CRD {row.name}", f"CustomResourceDefinition {row.name}"),
    ]
    line = y + LEASE_Y
    for alarm in row.alarms:
        x1, x2 = scale.x(alarm.start), scale.x(alarm.end)
        title = _e(_span_title(f"ALARM: a prune the ledger does not back: {alarm.label}", alarm))
        parts.append(
            f'<line class="crd-alarm" x1="{x1}" y1="{line}" x2="{x2}" y2="{line}" '
            f'stroke="{ALARM_COLOUR}" stroke-width="2"><title>{title}</title></line>'
            f'<rect class="crd-alarm-mark" x="{x1 - 1.5}" y="{line - 7}" width="3" height="14" '
            f'fill="{ALARM_COLOUR}"><title>{title}</title></rect>'
        )
    marks = sorted(row.marks, key=lambda mark: mark.cause.time)  # stable: log order at a time
    room = [scale.x(mark.cause.time) for mark in marks[1:]] + [LEFT + PLOT_WIDTH + RIGHT]
    for mark, next_x in zip(marks, room, strict=True):
        x = scale.x(mark.cause.time)
        title = f"{mark.label}\n{mark.cause}" + (f"\n{mark.detail}" if mark.detail else "")
        parts.append(
            f'<rect class="crd-mark" data-mark="{mark.kind}" data-label="{_e(mark.label)}" '
            f'x="{x - CRD_MARK / 2}" y="{y + BAR_TOP}" width="{CRD_MARK}" height="{BAR_HEIGHT}" '
            f'fill="{CRD_COLOURS[mark.kind]}"><title>{_e(title)}</title></rect>'
        )
        if next_x - x >= 7 * len(mark.label) + 8:  # the label fits before the next mark
            parts.append(
                f'<text x="{x + 4}" y="{y + BAR_TOP + BAR_HEIGHT / 2 + 4}" '
                f'pointer-events="none">{_e(mark.label)}</text>'
            )
    parts.append("</g>")
    return parts


def _when(time: datetime) -> str:
    return f"{time:%Y-%m-%d %H:%M:%S} UTC"


def _e(text: str) -> str:
    return html.escape(text, quote=True)
