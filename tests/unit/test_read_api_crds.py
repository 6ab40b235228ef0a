"""What ``svledger serve`` and the timeline show of a custom resource's
CustomResourceDefinition: its StorageState's ``storedVersions``, the versions the ledger
proves empty and the conditions on them, watched as they change; and the marks of its
storage versions, prunes and alarms on the timeline. Folded from the history of
``widgets.example.com`` moving from v1 to v2 (:mod:`tests.unit.test_crds`)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings

from ledger.events import (
    Event,
    Position,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
)
from projections.crds import stored_version_verdicts
from projections.state import UNKNOWN_HASH, State, StorageState
from readapi import conversions, timeline
from readapi.kinds import (
    STORAGE_STATES,
    ServedStorageState,
    View,
    row_kind,
    served_storage_state,
)
from readapi.ledger import ClusterFold
from tests.histories import histories
from tests.unit import test_crds
from tests.unit.test_crds import GROUP, KEY, RESOURCE, Widgets
from tests.unit.test_openapi import _document_of, _schema_of, violations
from tests.unit.test_timeline import SVG, by_class, upgrade_history

NAME = f"{RESOURCE}.{GROUP}"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


class Recorded(Widgets):
    """A history of widgets, its records kept for the read API's fold and the timeline."""

    def served(self) -> dict[str, Any]:
        """The widgets' StorageState as the read API serves it now."""
        view = View("prod", len(self.records), NOW, self.state)
        return STORAGE_STATES.object(served_storage_state(self.state, self.storage_state), view)

    @property
    def storage_state(self) -> StorageState:
        return self.state.storage_states[KEY]

    def why(self, version: str) -> str:
        (verdict,) = (v for v in stored_version_verdicts(self.state, KEY) if v.version == version)
        return verdict.why

    def prune(self, before: tuple[str, ...], after: tuple[str, ...]) -> Position:
        return self.add(
            StoredVersionsPruned(
                self.meta("svledger-worker"), "m1", GROUP, RESOURCE, NAME, 2, "17", before, after
            )
        )

    def refuse(self) -> Position:
        return self.add(
            StoredVersionsPruneRefused(
                self.meta("svledger-worker"), "m2", GROUP, RESOURCE, NAME, ("v2",),
                "GenerationChanged", "generation 3, not 2",
            )
        )  # fmt: skip


@pytest.fixture
def widgets() -> Recorded:
    """:func:`tests.unit.test_crds.switched`, recorded: the CRD stores v2 and lists v1 and
    v2 in storedVersions, both apiservers encode v2, and no migration ran yet."""
    switched = test_crds.switched(Recorded)
    return switched


# --------------------------------------------------------------------------- serve


def test_before_a_migration_every_stored_version_is_held(widgets: Recorded) -> None:
    status = widgets.served()["status"]
    assert status["storedVersions"] == ["v1", "v2"]
    assert status["removableStoredVersions"] == []
    assert status["conditions"] == [
        {
            "type": "StoredVersionsRemovable",
            "status": "False",
            "reason": "ObjectsMayBeStoredIn",
            "message": f"v1 stays: {widgets.why('v1')}",
        }
    ]
    assert "objects may be stored in any version" in status["conditions"][0]["message"]


def test_after_a_migration_under_agreement_v1_can_go(widgets: Recorded) -> None:
    at = widgets.migrate("m1")
    status = widgets.served()["status"]
    assert status["removableStoredVersions"] == ["v1"]
    (condition,) = status["conditions"]
    message = f"v1 can be removed from status.storedVersions now: {widgets.why('v1')}"
    assert condition == {
        "type": "StoredVersionsRemovable",
        "status": "True",
        "reason": "NoObjectStoredIn",
        "message": message,
    }
    assert f"migration m1 rewrote every object to {GROUP}/v2 (succeeded at {at['end']})" in message
    served = served_storage_state(widgets.state, widgets.storage_state)
    view = View("prod", 0, NOW, widgets.state)
    table = conversions.table(STORAGE_STATES, [(served, {"metadata": {}})], view)
    names = [column["name"] for column in table["columnDefinitions"]]
    assert table["rows"][0]["cells"][names.index("Removable")] == "v1"


def test_storage_version_alone_in_stored_versions_has_no_condition(widgets: Recorded) -> None:
    widgets.migrate("m1")
    widgets.crd("v2", ("v2",), generation=2)  # pruned
    status = widgets.served()["status"]
    assert (status["storedVersions"], status["removableStoredVersions"]) == (["v2"], [])
    assert "conditions" not in status


def test_an_unsafe_prune_is_a_condition_carrying_the_alarm(widgets: Recorded) -> None:
    widgets.report("b", "v1")  # b writes v1 again
    widgets.crd("v2", ("v2",), generation=2)  # and someone prunes v1 anyway
    alarm = widgets.state.custom_resources[KEY].prune_alarm
    assert alarm is not None
    assert widgets.served()["status"]["conditions"] == [
        {
            "type": "StoredVersionsPrunedUnsafely",
            "status": "True",
            "reason": "PrunedWithoutProof",
            "message": alarm,
        }
    ]


def test_both_conditions_are_as_the_schema_says(widgets: Recorded) -> None:
    widgets.report("b", "v1")
    widgets.crd("v2", ("v0", "v2"), generation=2)  # v1 pruned unsafely; v0 listed besides v2
    served = widgets.served()
    assert [c["type"] for c in served["status"]["conditions"]] == [
        "StoredVersionsRemovable",
        "StoredVersionsPrunedUnsafely",
    ]
    document = _document_of(STORAGE_STATES)
    assert violations(served, _schema_of(STORAGE_STATES, document), document) == []


def test_a_resource_of_no_crd_shows_none_of_it() -> None:
    row = StorageState("prod", "apps", "deployments", (UNKNOWN_HASH,), None, "0:3", "0:3", NOW)
    served = served_storage_state(State(storage_states={row.key: row}), row)
    view = View("prod", 3, NOW, State())
    assert STORAGE_STATES.object(served, view)["status"] == {
        "persistedStorageVersionHashes": [UNKNOWN_HASH]
    }
    assert STORAGE_STATES.cells(served, view)[-1] == ""


def storage_state_changes(fold: ClusterFold, since: int = -1) -> list[tuple[str, int, Any]]:
    """The StorageState's watch events after offset ``since``: type, offset, object."""
    return [
        (change.type, change.offset, STORAGE_STATES.object(change.row, fold.view()))
        for change in fold.changes
        if row_kind(change.row) is STORAGE_STATES and change.offset > since
    ]


def test_a_crd_change_is_a_modified_storage_state_at_its_offset(widgets: Recorded) -> None:
    widgets.migrate("m1")
    fold = ClusterFold("prod", 0)
    for event, position in widgets.records:
        fold.apply(event, position, window=1000)
    before = fold.offset
    pruned = widgets.prune(("v1", "v2"), ("v2",))  # the prune: the CRD's row alone changes
    observed = widgets.crd("v2", ("v2",), generation=2)  # the CRD as pruned
    for event, position in widgets.records[-2:]:
        fold.apply(event, position, window=1000)
    changes = storage_state_changes(fold, before)
    assert [(kind, offset) for kind, offset, _ in changes] == [
        ("MODIFIED", pruned.offset),
        ("MODIFIED", observed.offset),
    ]
    (_, _, last) = changes[-1]
    assert last["metadata"]["resourceVersion"] == str(observed.offset)
    assert last["status"]["storedVersions"] == ["v2"]
    # The same content after an event that changes nothing served: no event.
    widgets.report("a", "v2")
    fold.apply(*widgets.records[-1], window=1000)
    assert storage_state_changes(fold, observed.offset) == []


@settings(max_examples=60, deadline=None)
@given(histories())
def test_every_storage_state_change_is_served_at_its_own_offset(
    history: list[tuple[Event, Position]],
) -> None:
    """Whatever changes the served object (its StorageState, its CRD, the migrations its
    verdicts cite) moves its resourceVersion to that event's offset, so a watch resumes
    from any event's without losing one. A deleted CRD takes its revision with it: the
    object then shows its StorageState's again."""
    folds: dict[str, ClusterFold] = {}
    for event, position in history:
        cluster = event.meta.cluster
        folds.setdefault(cluster, ClusterFold(cluster, position.partition))
        folds[cluster].apply(event, position, window=len(history))
    for fold in folds.values():
        for change in fold.changes:
            if row_kind(change.row) is not STORAGE_STATES:
                continue
            previous, served = change.previous, change.row
            assert isinstance(served, ServedStorageState)
            assert isinstance(previous, ServedStorageState | None)
            if served.crd is None and previous is not None and previous.crd is not None:
                continue  # the CRD deleted
            assert served.revision == f"{fold.partition}:{change.offset}", change


# --------------------------------------------------------------------------- timeline


def test_the_timeline_marks_the_crds_versions_prunes_and_refusals(widgets: Recorded) -> None:
    widgets.migrate("m1")
    pruned = widgets.prune(("v1", "v2"), ("v2",))
    widgets.crd("v2", ("v2",), generation=2)
    widgets.refuse()
    picture = timeline.timeline("prod", GROUP, RESOURCE, widgets.records)
    assert picture.crd is not None and picture.crd.name == NAME
    assert [(m.label, m.kind) for m in picture.crd.marks] == [
        ("storage v1, storedVersions [v1]", "changed"),
        ("storage v2, storedVersions [v1, v2]", "changed"),
        ("pruned v1", "pruned"),
        ("storedVersions [v2]", "changed"),
        ("prune refused: GenerationChanged", "refused"),
    ]
    assert picture.crd.alarms == []
    drawn = by_class(svg_of(widgets))
    (row,) = drawn["crd-row"]
    assert row.get("data-crd") == NAME
    marks = {m.get("data-label"): m.findtext(f"{SVG}title") or "" for m in drawn["crd-mark"]}
    assert f"StoredVersionsPruned at {pruned}" in marks["pruned v1"]
    assert "generation 3, not 2" in marks["prune refused: GenerationChanged"]


def test_the_timeline_draws_an_alarm_until_a_migration_proves_the_store(
    widgets: Recorded,
) -> None:
    widgets.report("b", "v1")
    pruned = widgets.crd("v2", ("v2",), generation=2)  # objects may still be in v1
    widgets.report("b", "v2")
    at = widgets.migrate("m1")
    picture = timeline.timeline("prod", GROUP, RESOURCE, widgets.records)
    assert picture.crd is not None
    (alarm,) = picture.crd.alarms
    assert alarm.cause.position == str(pruned)
    assert alarm.ended_by is not None
    assert (alarm.ended_by.event_type, alarm.ended_by.position) == (
        "MigrationSucceeded",
        str(at["end"]),
    )
    assert f"v1 left status.storedVersions at {pruned}" in alarm.label
    (line,) = by_class(svg_of(widgets))["crd-alarm"]
    assert (line.findtext(f"{SVG}title") or "").startswith("ALARM: a prune the ledger does not")


def test_a_resource_of_no_crd_has_no_crd_row() -> None:
    picture = timeline.timeline("east", "apps", "deployments", upgrade_history().records)
    assert picture.crd is None
    assert "crd-row" not in timeline.draw(picture)


def svg_of(widgets: Recorded) -> ET.Element:
    page = ET.fromstring(timeline.render("prod", GROUP, RESOURCE, widgets.records))
    svg = page.find(f".//{SVG}svg[@id='timeline']")
    assert svg is not None
    return svg
