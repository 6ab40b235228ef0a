"""What the worker writes to a CustomResourceDefinition's ``status.storedVersions`` after a
migration, and why it refuses (:func:`kube.stored_versions.prune_decision`); how it writes
(:class:`kube.stored_versions.StoredVersionsPruner`, against a stub of the Kube client)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from kube import stored_versions
from kube.client import ApiError, Kube
from kube.stored_versions import (
    CONFLICT_RETRIES,
    CRDS,
    RULE,
    Refusal,
    StoredVersionsPruner,
    ended_condition,
    prune_decision,
    with_condition,
)
from ledger.clock import SystemClock
from ledger.events import Event, StoredVersionsPruneRefused
from projections.crds import VersionVerdict
from projections.state import Migration, Phase, ResourceKey, State

GROUP = "stable.example.com"
NAME = f"crontabs.{GROUP}"
AT = datetime(2026, 1, 2, tzinfo=UTC)
PROVEN = VersionVerdict("v1", True, "no object can be stored in v1: (0:41)")
STORAGE = VersionVerdict("v2", False, "the storage version: every write stores it")


def migration(phase: Phase = "Succeeded", target: str = f"{GROUP}/v2") -> Migration:
    return Migration(
        cluster="c",
        migration_id="m-1",
        group=GROUP,
        resource="crontabs",
        target_version=target,
        target_hash="h2",
        storage_version_revision="0:7",
        phase=phase,
        objects_migrated=3,
        continue_token=None,
        reason=None,
        message=None,
        requested_at=AT,
        updated_at=AT,
        revision="0:40",
        created_revision="0:8",
        created_at=AT,
    )


def crd(
    *,
    storage: str = "v2",
    stored: tuple[str, ...] = ("v1", "v2"),
    generation: int = 2,
    condition: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A CRD serving v1 and v2, read after a migration that started under generation 2."""
    if condition is None:
        condition = {
            "type": "StorageMigrating",
            "status": "True",
            "lastTransitionTime": "2026-01-02T00:00:00Z",
            "reason": "MigrationRunning",
            "message": "Migration m-1 is running",
            "observedGeneration": 2,
        }
    return {
        "metadata": {"name": NAME, "generation": generation, "resourceVersion": "812"},
        "spec": {
            "group": GROUP,
            "versions": [
                {"name": v, "served": True, "storage": v == storage} for v in ("v1", "v2", "v3")
            ],
        },
        "status": {
            "storedVersions": list(stored),
            "conditions": [{"type": "Established", "status": "True"}, condition],
        },
    }


def test_versions_the_ledger_proves_empty_leave_and_the_storage_version_stays() -> None:
    assert prune_decision(crd(), migration(), [PROVEN, STORAGE]) == ("v2",)


def test_several_proven_versions_leave_together() -> None:
    v3 = VersionVerdict("v3", True, "no object can be stored in v3: (0:42)")
    decided = prune_decision(crd(stored=("v1", "v3", "v2")), migration(), [PROVEN, v3, STORAGE])
    assert decided == ("v2",)


def test_nothing_to_do_when_the_storage_version_is_listed_alone_already() -> None:
    # The same answer as the list it has: no write, no event, whatever else changed.
    assert prune_decision(crd(stored=("v2",), generation=5), migration(), [STORAGE]) == ("v2",)


def test_a_generation_bumped_since_the_migration_started_is_refused() -> None:
    decided = prune_decision(crd(generation=3), migration(), [PROVEN, STORAGE])
    assert isinstance(decided, Refusal)
    assert decided.reason == "GenerationChanged"
    assert "generation 3" in decided.message and "generation 2" in decided.message


@pytest.mark.parametrize(
    "condition",
    [
        {"type": "StorageMigrating", "status": "False", "reason": "MigrationSucceeded"},
        {"type": "Other", "status": "True"},  # none of its own: the generation is not known
    ],
)
def test_without_the_condition_a_migration_started_under_the_prune_is_refused(
    condition: dict[str, Any],
) -> None:
    decided = prune_decision(crd(condition=condition), migration(), [PROVEN, STORAGE])
    assert isinstance(decided, Refusal)
    assert decided.reason == "GenerationChanged"
    assert "not known" in decided.message


def test_a_storage_version_other_than_the_migrations_target_is_refused() -> None:
    decided = prune_decision(crd(storage="v3"), migration(), [PROVEN, STORAGE])
    assert isinstance(decided, Refusal)
    assert decided.reason == "StorageVersionChanged"
    assert f"{GROUP}/v3" in decided.message and f"{GROUP}/v2" in decided.message


def test_a_version_the_ledger_does_not_prove_empty_keeps_the_list_whole() -> None:
    unproven = VersionVerdict("v3", False, "objects may still be stored in v3: (0:39)")
    decided = prune_decision(crd(stored=("v1", "v3", "v2")), migration(), [PROVEN, unproven])
    # v1 is proven, but nothing is written: the refusal gives the ledger's reasons.
    assert decided == Refusal("NotProven", "objects may still be stored in v3: (0:39)")


def test_a_version_the_ledger_has_no_verdict_on_is_not_proven() -> None:
    decided = prune_decision(crd(stored=("v1", "v3", "v2")), migration(), [PROVEN, STORAGE])
    assert isinstance(decided, Refusal)
    assert decided.reason == "NotProven"
    assert decided.message == (
        "v3: not in storedVersions as the ledger last observed them (v1, v2), so it has no"
        " verdict on it"
    )


def test_a_crd_the_ledger_has_not_observed_is_not_proven() -> None:
    decided = prune_decision(crd(), migration(), [])
    assert isinstance(decided, Refusal)
    assert decided.reason == "NotProven"
    assert f"the ledger has observed no CustomResourceDefinition {NAME}" in decided.message


def test_the_condition_is_set_as_upstream_sets_it_and_the_others_are_kept() -> None:
    running = crd(condition={"type": "StorageMigrating", "status": "False", "reason": "X"})
    marked = with_condition(running, "True", "MigrationRunning", "Migration m-1 is running", "T1")
    assert marked["status"]["conditions"] == [
        {"type": "Established", "status": "True"},
        {
            "type": "StorageMigrating",
            "status": "True",
            "lastTransitionTime": "T1",
            "reason": "MigrationRunning",
            "message": "Migration m-1 is running",
            "observedGeneration": 2,
        },
    ]
    assert marked["status"]["storedVersions"] == ["v1", "v2"]
    assert marked["metadata"]["resourceVersion"] == "812"  # the write's precondition
    ended = with_condition(marked, "False", "MigrationSucceeded", "done", "T2", ("v2",))
    assert ended["status"]["conditions"][1]["lastTransitionTime"] == "T2"
    assert ended["status"]["storedVersions"] == ["v2"]
    again = with_condition(marked, "True", "MigrationRunning", "Migration m-2 is running", "T3")
    assert again["status"]["conditions"][1]["lastTransitionTime"] == "T1"  # no transition


@pytest.mark.parametrize(
    ("phase", "decision", "reason", "said"),
    [
        ("Succeeded", ("v2",), "MigrationSucceeded", "stored versions have been updated"),
        ("Succeeded", Refusal("NotProven", "..."), "MigrationSucceeded", "left as they were"),
        ("Failed", None, "MigrationFailed", "m-1 has failed: Forbidden: rewriting a/b"),
        ("Cancelled", None, "MigrationFailed", "m-1 was cancelled: Forbidden: rewriting a/b"),
    ],
)
def test_the_end_of_a_migration_is_said_in_the_condition(
    phase: Phase, decision: tuple[str, ...] | Refusal | None, reason: str, said: str
) -> None:
    ended = migration(phase)
    if phase != "Succeeded":
        ended = dataclasses.replace(ended, reason="Forbidden", message="rewriting a/b")
    got_reason, message = ended_condition(ended, decision, ("v1", "v2"))
    assert got_reason == reason
    assert said in message


class StubKube:
    """The CRD ``crd()`` read by GET, its resourceVersion one more at each read (someone
    keeps changing it); every PUT is recorded and refused with ``refusal``."""

    host = "https://stub"

    def __init__(self, refusal: ApiError) -> None:
        self.refusal = refusal
        self.read: list[str] = []  # the resourceVersion of each GET's answer
        self.written: list[tuple[str, dict[str, Any], Mapping[str, Any] | None]] = []

    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        assert path == f"{CRDS}/{NAME}"
        answer = crd()
        answer["metadata"]["resourceVersion"] = str(812 + len(self.read))
        self.read.append(answer["metadata"]["resourceVersion"])
        return answer

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        assert method == "PUT" and body is not None
        self.written.append((path, copy.deepcopy(dict(body)), query))
        raise self.refusal


async def ended_against(kube: StubKube, monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """What the pruner appends after migration m-1 succeeded, the ledger proving v1 empty."""

    def verdicts(state: State, key: ResourceKey) -> tuple[VersionVerdict, ...]:
        return (PROVEN, STORAGE)

    monkeypatch.setattr(stored_versions, "stored_version_verdicts", verdicts)
    appended: list[Event] = []

    async def append(events: Sequence[Event]) -> None:
        appended.extend(events)

    pruner = StoredVersionsPruner(cast(Kube, kube), SystemClock())
    await pruner.ended(State(), migration(), append)
    return appended


async def test_a_crd_changing_under_every_write_is_read_again_each_time_then_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = StubKube(ApiError(409, f"Operation cannot be fulfilled on {NAME}: conflict"))
    (refused,) = await ended_against(kube, monkeypatch)
    # One write, then CONFLICT_RETRIES re-reads, each followed by its write.
    assert len(kube.read) == len(kube.written) == CONFLICT_RETRIES + 1
    for version, (path, body, query) in zip(kube.read, kube.written, strict=True):
        assert path == f"{CRDS}/{NAME}/status"
        assert query == {"fieldManager": stored_versions.FIELD_MANAGER}
        # The precondition is the CRD as just read: the new resourceVersion each time.
        assert body["metadata"]["resourceVersion"] == version
        assert body["status"]["storedVersions"] == ["v2"]  # the condition and the prune
        assert body["status"]["conditions"][1]["reason"] == "MigrationSucceeded"
    assert len(set(kube.read)) == CONFLICT_RETRIES + 1
    assert isinstance(refused, StoredVersionsPruneRefused)
    assert (refused.migration_id, refused.name, refused.reason) == ("m-1", NAME, "Conflict")
    assert refused.stored_versions == ("v1", "v2")
    assert f"{CONFLICT_RETRIES + 1} writes (409 Conflict" in refused.message


async def test_a_write_refused_with_403_is_a_forbidden_refusal_naming_the_permission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    denied = (
        f'customresourcedefinitions.apiextensions.k8s.io "{NAME}" is forbidden: User'
        ' "worker" cannot update resource "customresourcedefinitions/status"'
    )
    kube = StubKube(ApiError(403, denied))
    (refused,) = await ended_against(kube, monkeypatch)
    assert len(kube.read) == len(kube.written) == 1  # no retry
    assert kube.written[0][1]["metadata"]["resourceVersion"] == "812"
    assert isinstance(refused, StoredVersionsPruneRefused)
    assert (refused.migration_id, refused.name, refused.reason) == ("m-1", NAME, "Forbidden")
    assert refused.stored_versions == ("v1", "v2")
    assert denied in refused.message
    assert f"add to the worker's ClusterRole the rule {RULE}" in refused.message
    assert '"customresourcedefinitions/status"' in RULE and '"update"' in RULE
