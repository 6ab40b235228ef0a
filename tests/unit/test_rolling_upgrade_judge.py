"""The rolling upgrade's judge of migrations while the apiservers disagreed
(:func:`deploy.kube.rolling_upgrade.while_disagreeing`), on logs written out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deploy.kube.rolling_upgrade import CLUSTER, GROUP, NEW_VERSION, OLD_VERSION, while_disagreeing
from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Meta,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    Position,
    StorageVersionReported,
)
from ledger.hashing import storage_version_hash
from ledger.kafka import Record

START = datetime(2026, 1, 1, tzinfo=UTC)
RESOURCE = "mutatingadmissionpolicies"
KIND = "MutatingAdmissionPolicy"


def _log(events: list[Event]) -> list[Record]:
    return [Record(Position(0, offset), event, b"") for offset, event in enumerate(events)]


def _meta(source: str, second: int) -> Meta:
    return Meta.new(CLUSTER, source, START + timedelta(seconds=second))


def _joined(apiserver: str, second: int) -> ApiserverHeartbeat:
    when = START + timedelta(seconds=second)
    return ApiserverHeartbeat(_meta(apiserver, second), apiserver, apiserver, apiserver, 3600, when)


def _reported(apiserver: str, version: str, second: int) -> StorageVersionReported:
    versions = (OLD_VERSION, NEW_VERSION)
    return StorageVersionReported(
        _meta(apiserver, second), apiserver, GROUP, RESOURCE, KIND, version, versions, versions
    )


def _requested(revision: str, second: int) -> MigrationRequested:
    target = storage_version_hash(GROUP, NEW_VERSION.split("/")[1], KIND)
    return MigrationRequested(
        _meta("migrator", second), "m1", GROUP, RESOURCE, NEW_VERSION, target, revision
    )


AGREED = [  # offsets 0 to 3: both apiservers encode the new version; revision 0:3
    _joined("a1", 0),
    _joined("a2", 0),
    _reported("a1", NEW_VERSION, 1),
    _reported("a2", NEW_VERSION, 1),
]


def test_a_success_the_fold_rejects_as_stale_is_not_counted() -> None:
    # The worker rewrote on agreement and appended its success, but a report that
    # broke the agreement landed first: the fold keeps the persisted hashes.
    log = _log(
        [
            *AGREED,
            _requested("0:3", 2),
            MigrationStarted(_meta("worker", 3), "m1"),
            _reported("a2", OLD_VERSION, 4),
            MigrationSucceeded(_meta("worker", 5), "m1", objects_migrated=10),
        ]
    )
    assert while_disagreeing(log) == []


def test_a_request_decided_on_a_disagreement_is_counted() -> None:
    log = _log([*AGREED, _reported("a2", OLD_VERSION, 2), _requested("0:4", 3)])
    (bad,) = while_disagreeing(log)
    assert bad.startswith(f"MigrationRequested m1 of {RESOURCE} at 0:5")
    assert "decided at revision '0:4' on common None" in bad
