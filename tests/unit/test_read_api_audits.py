"""What ``svledger serve`` shows of a resource's last audit of the store: its StorageState's
``status.lastAudit`` next to what the ledger infers, the conditions an audit raises, and
the audit as a change a watch sees. Folded from the history of ``widgets.example.com``
moving from v1 to v2 (:mod:`tests.unit.test_crds`), audited as :mod:`tests.unit.test_audits`
audits it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ledger.events import Position, StorageAudited
from readapi import conversions
from readapi.kinds import STORAGE_STATES, View, served_storage_state
from readapi.ledger import ClusterFold
from tests.unit import test_crds
from tests.unit.test_audits import V1, V2, audited, judged
from tests.unit.test_crds import H1, H2
from tests.unit.test_openapi import _document_of, _schema_of, violations
from tests.unit.test_read_api_crds import NOW, Recorded, storage_state_changes


@pytest.fixture
def widgets() -> Recorded:
    """:func:`tests.unit.test_crds.switched`, recorded, after migration m1 rewrote every
    object to v2 under agreement: the ledger holds no object can be stored in v1."""
    switched = test_crds.switched(Recorded)
    switched.migrate("m1")
    return switched


def served(widgets: Recorded) -> dict[str, Any]:
    """The widgets' StorageState as served now, checked against its schema."""
    served = widgets.served()
    document = _document_of(STORAGE_STATES)
    assert violations(served, _schema_of(STORAGE_STATES, document), document) == []
    return served


def audit_conditions(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The status's conditions but the CustomResourceDefinition's."""
    return [c for c in status.get("conditions", ()) if not c["type"].startswith("StoredVersions")]


def wide_cells(widgets: Recorded) -> list[Any]:
    row = served_storage_state(widgets.state, widgets.storage_state)
    view = View("prod", 0, NOW, widgets.state)
    table = conversions.table(STORAGE_STATES, [(row, {"metadata": {}})], view)
    assert [c["name"] for c in table["columnDefinitions"]][-2:] == ["Removable", "Audited"]
    cells: list[Any] = table["rows"][0]["cells"]
    return cells


def test_a_resource_never_audited_is_served_as_before(widgets: Recorded) -> None:
    before = served(widgets)
    assert "lastAudit" not in before["status"]
    assert audit_conditions(before["status"]) == []
    assert wide_cells(widgets)[-1] == ""
    # An audit of another resource changes nothing of this one.
    other = test_crds.switched(Recorded)
    audited(other, {V2: 20})
    event, _ = other.records[-1]
    assert isinstance(event, StorageAudited)
    meta = widgets.meta("svledger-audit")
    widgets.add(dataclasses.replace(event, meta=meta, group="apps", resource="deployments"))
    assert ("prod", "apps", "deployments") in widgets.state.audits
    assert served(widgets) == before


def test_a_clean_audit_is_served_without_a_condition(widgets: Recorded) -> None:
    at = audited(widgets, {V2: 20})  # at offset 11: minute 11 of the history
    status = served(widgets)["status"]
    assert status["lastAudit"] == {
        "auditID": "audit-1",
        "etcdRevision": 42,
        "auditedAt": "2024-06-01T00:11:00Z",
        "objects": 20,
        "bytes": 1000,
        "versions": [{"version": V2, "storageVersionHash": H2, "objects": 20}],
        "encryptionKeys": [],
        "undecodable": 0,
        "pollutedVersions": [],
    }
    assert audit_conditions(status) == []
    assert wide_cells(widgets)[-1] == "20 at 42"
    assert served(widgets)["metadata"]["resourceVersion"] == str(at.offset)


def test_a_polluted_audit_is_a_condition_carrying_its_words(widgets: Recorded) -> None:
    found = {V1: 2, V2: 18}
    polluted, why = judged(widgets, widgets, found)
    assert why is not None
    audited(widgets, found, polluted=polluted, why=why)
    status = served(widgets)["status"]
    assert status["lastAudit"]["versions"] == [
        {"version": V1, "storageVersionHash": H1, "objects": 2},
        {"version": V2, "storageVersionHash": H2, "objects": 18},
    ]
    assert status["lastAudit"]["pollutedVersions"] == [V1]
    assert audit_conditions(status) == [
        {
            "type": "StorageContradictsLedger",
            "status": "True",
            "reason": "ObjectsWhereNoneCanBe",
            "message": why,
        }
    ]
    # It stands until the next audit, which finds the store clean.
    audited(widgets, {V2: 20})
    assert audit_conditions(served(widgets)["status"]) == []


def test_keys_that_encrypt_nothing_are_a_condition_naming_the_writing_one(
    widgets: Recorded,
) -> None:
    audited(widgets, {}, keys=(("aescbc:key2", 20), ("aescbc:key1", 0), ("identity", 0)))
    status = served(widgets)["status"]
    assert status["lastAudit"]["encryptionKeys"] == [
        {"key": "aescbc:key2", "objects": 20},
        {"key": "aescbc:key1", "objects": 0},
        {"key": "identity", "objects": 0},
    ]
    assert audit_conditions(status) == [
        {
            "type": "EncryptionKeysRemovable",
            "status": "True",
            "reason": "NoObjectEncryptedWith",
            "message": "no object of the resource is encrypted with aescbc:key1, identity at"
            " etcd revision 42 (audit audit-1): each can be removed from the"
            " EncryptionConfiguration's providers for it (aescbc:key2 writes), once every"
            " apiserver has read the configuration that writes with the new key",
        }
    ]
    # Before the rewrite: the old key still encrypts every object, so it stays.
    audited(widgets, {}, keys=(("aescbc:key2", 0), ("aescbc:key1", 20)))
    assert audit_conditions(served(widgets)["status"]) == []


def test_an_audit_is_a_modified_storage_state_at_its_offset(widgets: Recorded) -> None:
    fold = ClusterFold("prod", 0)
    for event, position in widgets.records:
        fold.apply(event, position, window=1000)
    before = fold.offset
    first = audited(widgets, {V2: 20})
    again = audited(widgets, {V2: 20})  # the same counts, a later audit
    for event, position in widgets.records[-2:]:
        fold.apply(event, position, window=1000)
    changes = storage_state_changes(fold, before)
    assert [(kind, offset) for kind, offset, _ in changes] == [
        ("MODIFIED", first.offset),
        ("MODIFIED", again.offset),
    ]
    (_, _, last) = changes[-1]
    assert last["metadata"]["resourceVersion"] == str(again.offset)
    assert last["status"]["lastAudit"]["objects"] == 20
    # An event that changes nothing served: no event.
    widgets.report("a", "v2")
    fold.apply(*widgets.records[-1], window=1000)
    assert storage_state_changes(fold, again.offset) == []


def test_the_resource_version_is_the_latest_of_the_state_and_its_audit() -> None:
    s = Recorded()  # no CustomResourceDefinition: the StorageState and the audit alone
    s.heartbeat("a")
    s.report("a", "v2")
    at = audited(s, {V2: 20})
    assert Position.parse(s.storage_state.revision).offset < at.offset
    assert served(s)["metadata"]["resourceVersion"] == str(at.offset)
    moved = s.report("a", "v1")  # the StorageState changes after the audit
    assert s.storage_state.revision == str(moved)
    after = served(s)
    assert after["metadata"]["resourceVersion"] == str(moved.offset)
    assert after["status"]["lastAudit"]["etcdRevision"] == 42
