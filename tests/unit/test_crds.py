"""When a CustomResourceDefinition's old version can go (:mod:`projections.crds`), as the fold
keeps it and ``explain`` says it: each case folded from a readable history of a custom
resource moving from v1 to v2 under two apiservers."""

from __future__ import annotations

from typing import TypeVar

from ledger.events import (
    CustomResourceDefinitionObserved,
    MigrationCancelled,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    Position,
    StorageVersionReported,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
)
from projections.crds import removable_versions, stored_version_verdicts
from projections.history import explanation
from projections.state import ResourceKey
from tests.histories import storage_version_hash
from tests.unit.test_explain import Scenario

GROUP, RESOURCE, KIND = "example.com", "widgets", "Widget"
KEY: ResourceKey = ("prod", GROUP, RESOURCE)
H1 = storage_version_hash(GROUP, "v1", KIND)
H2 = storage_version_hash(GROUP, "v2", KIND)


class Widgets(Scenario):
    def report(self, apiserver: str, version: str) -> Position:
        versions = (f"{GROUP}/v1", f"{GROUP}/v2")
        return self.add(
            StorageVersionReported(
                self.meta(apiserver), apiserver, GROUP, RESOURCE, KIND, f"{GROUP}/{version}",
                versions, versions, source="discovery",
            )
        )  # fmt: skip

    def crd(
        self,
        storage: str,
        stored: tuple[str, ...],
        *,
        generation: int = 1,
        uid: str = "uid-1",
        deleted: bool = False,
    ) -> Position:
        return self.add(
            CustomResourceDefinitionObserved(
                self.meta("svledger-collector"), GROUP, RESOURCE, KIND, f"{RESOURCE}.{GROUP}",
                uid, generation, str(len(self.entries)), ("v1", "v2"), ("v1", "v2"), storage,
                stored, deleted=deleted,
            )
        )  # fmt: skip

    def migrate(self, migration_id: str, *, end: str = "Succeeded") -> dict[str, Position]:
        """A migration to v2 for the StorageVersion as it is, run to ``end``."""
        revision = self.state.storage_versions[KEY].revision
        at = {
            "request": self.add(
                MigrationRequested(
                    self.meta("migrator"),
                    migration_id,
                    GROUP,
                    RESOURCE,
                    f"{GROUP}/v2",
                    H2,
                    revision,
                )
            ),
            "start": self.add(MigrationStarted(self.meta("worker"), migration_id)),
        }
        if end == "Succeeded":
            at["end"] = self.add(MigrationSucceeded(self.meta("worker"), migration_id, 30))
        elif end == "Cancelled":
            at["end"] = self.add(
                MigrationCancelled(
                    self.meta("migrator"), migration_id, reason="EncodingVersionsDisagree"
                )
            )
        return at


_Scenario = TypeVar("_Scenario", bound="Widgets")


def switched(scenario: type[_Scenario] = Widgets) -> _Scenario:  # type: ignore[assignment]  (mypy: a TypeVar default)
    """v1 was the storage version; the CRD now stores v2 and both apiservers encode v2."""
    s = scenario()
    s.heartbeat("a")
    s.heartbeat("b")
    s.crd("v1", ("v1",))
    s.report("a", "v1")
    s.report("b", "v1")
    s.crd("v2", ("v1", "v2"), generation=2)
    s.report("a", "v2")
    s.report("b", "v2")
    return s


def verdicts(s: Widgets) -> dict[str, tuple[bool, str]]:
    return {v.version: (v.removable, v.why) for v in stored_version_verdicts(s.state, KEY)}


def test_no_version_can_go_before_a_migration_ran_under_agreement() -> None:
    s = switched()
    found = verdicts(s)
    assert found["v2"] == (False, "the storage version: every write stores it")
    assert not found["v1"][0] and "any version" in found["v1"][1]
    assert removable_versions(s.state, KEY) == ()


def test_v1_can_go_after_a_migration_that_succeeded_under_agreement() -> None:
    s = switched()
    at = s.migrate("m1")
    removable, why = verdicts(s)["v1"]
    assert removable
    assert f"migration m1 rewrote every object to {GROUP}/v2 (succeeded at {at['end']})" in why
    text = explanation(s.facts(KEY))
    assert "v1 can be removed from status.storedVersions now" in text
    assert "v2 stays: the storage version" in text
    assert "v1 can be removed from spec.versions once it has left status.storedVersions" in text


def test_a_report_of_v1_after_the_migration_keeps_v1() -> None:
    s = switched()
    s.migrate("m1")
    late = s.report("b", "v1")  # a lagging or restarted apiserver writes v1 again
    removable, why = verdicts(s)["v1"]
    assert not removable
    assert f"StorageState at {late}" in why
    assert f"last reported by StorageVersionReported at {late}" in explanation(s.facts(KEY))


def test_a_cancelled_migration_proves_nothing() -> None:
    s = switched()
    at = s.migrate("m1", end="Cancelled")
    assert not verdicts(s)["v1"][0]
    assert s.state.migrations["prod", "m1"].revision == str(at["end"])


def test_a_prune_while_the_migration_runs_is_judged_by_its_end() -> None:
    s = switched()
    s.migrate("m1", end="running")
    s.crd("v2", ("v2",), generation=2)  # the in-tree migrator prunes as its migration ends
    assert s.state.custom_resources[KEY].pending_prune == ("v1",)
    s.add(MigrationSucceeded(s.meta("worker"), "m1", 30))
    crd = s.state.custom_resources[KEY]
    assert crd.pending_prune == () and crd.prune_alarm is None


def test_a_prune_of_a_migration_that_then_fails_raises_the_alarm() -> None:
    s = switched()
    s.migrate("m1", end="running")
    pruned = s.crd("v2", ("v2",), generation=2)
    cancelled = s.add(MigrationCancelled(s.meta("migrator"), "m1", reason="x"))
    alarm = s.state.custom_resources[KEY].prune_alarm
    assert alarm is not None
    assert f"v1 left status.storedVersions at {pruned}" in alarm
    assert f"migration m1 ended Cancelled at {cancelled}" in alarm
    assert "ALARM" in explanation(s.facts(KEY))


def test_a_prune_under_disagreement_raises_the_alarm_until_a_migration_proves_the_store() -> None:
    s = switched()
    s.report("b", "v1")  # b still writes v1
    pruned = s.crd("v2", ("v2",), generation=2)  # someone prunes by hand anyway
    alarm = s.state.custom_resources[KEY].prune_alarm
    assert alarm is not None and f"at {pruned}" in alarm and "objects may" in alarm
    s.report("b", "v2")
    s.migrate("m1")
    assert s.state.custom_resources[KEY].prune_alarm is None


def test_the_workers_prunes_and_refusals_are_kept_with_their_positions() -> None:
    s = switched()
    s.migrate("m1")
    pruned = s.add(
        StoredVersionsPruned(
            s.meta("svledger-worker"), "m1", GROUP, RESOURCE, f"{RESOURCE}.{GROUP}", 2, "17",
            ("v1", "v2"), ("v2",),
        )
    )  # fmt: skip
    crd = s.state.custom_resources[KEY]
    assert (crd.prune_outcome, crd.prune_revision) == ("Pruned", str(pruned))
    assert crd.prune_message is not None and "removed v1" in crd.prune_message
    refused = s.add(
        StoredVersionsPruneRefused(
            s.meta("svledger-worker"), "m1", GROUP, RESOURCE, f"{RESOURCE}.{GROUP}",
            ("v1", "v2"), "GenerationChanged", "generation 3, not 2",
        )
    )  # fmt: skip
    text = explanation(s.facts(KEY))
    assert f"refused (GenerationChanged) at {refused}: generation 3, not 2" in text


def test_a_prune_of_an_unknown_definition_is_rejected() -> None:
    s = Widgets()
    s.add(
        StoredVersionsPruneRefused(
            s.meta("svledger-worker"), "m1", GROUP, RESOURCE, f"{RESOURCE}.{GROUP}", ("v1",),
            "NotFound", "gone",
        )
    )  # fmt: skip
    assert s.entries[-1].rejection is not None
    assert "no CustomResourceDefinition" in s.entries[-1].rejection


def test_a_definition_deleted_and_created_again_starts_afresh() -> None:
    s = switched()
    s.report("b", "v1")
    s.crd("v2", ("v2",), generation=2)
    assert s.state.custom_resources[KEY].prune_alarm is not None
    s.crd("v2", ("v2",), generation=2, deleted=True)
    assert KEY not in s.state.custom_resources
    s.crd("v1", ("v1",), uid="uid-2")
    assert s.state.custom_resources[KEY].prune_alarm is None
