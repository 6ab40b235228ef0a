"""A CustomResourceDefinition's ``status.storedVersions``, marked and pruned around a migration.

``status.storedVersions`` lists every version objects of a custom resource may be
stored in; a version can be removed from the CustomResourceDefinition's
``spec.versions`` only once it has left that list, and only a client may take it out.
kube-controller-manager's in-tree migrator (v1.36+, ``migrationrunner.go``) does so for
the migrations it runs: when one starts it sets the CRD's ``StorageMigrating``
condition (``True``, reason ``MigrationRunning``, message ``Migration <name> is
running``, ``observedGeneration`` the CRD's ``metadata.generation``); when it ends,
``False`` with reason ``MigrationSucceeded`` or ``MigrationFailed``; and after a success
it sets ``storedVersions`` to the spec's storage version alone, if the condition's
``observedGeneration`` is still the CRD's generation (nobody changed the spec
meanwhile). It asks no apiserver whether they all stored in that version meanwhile.

:class:`StoredVersionsPruner` does the same for the migrations the ``rewrite``
executor runs (``svledger worker --prune-stored-versions``), guarded further: it
prunes only versions the ledger proves no object is stored in
(:func:`projections.crds.stored_version_verdicts`), and records its outcome in the
ledger, ``StoredVersionsPruned`` or ``StoredVersionsPruneRefused`` with a reason:

* ``StorageVersionChanged``: the CRD's spec storage version is not the migration's
  target version;
* ``GenerationChanged``: the CRD's generation is not the ``observedGeneration`` of the
  ``StorageMigrating`` condition the migration started under (or that condition is
  gone, so the generation it started under is not known);
* ``NotProven``: the ledger does not prove a version other than the storage version
  empty; the message gives the ledger's reasons. Nothing is written then, not even the
  versions it does prove empty;
* ``Forbidden``, ``Conflict``, ``NotFound``: the write was refused (403), the CRD kept
  changing under it (409 after :data:`CONFLICT_RETRIES` re-reads), or the CRD is gone.

A migration whose CRD already lists only its storage version has nothing to prune: no
event. A resource without a CRD (a built-in one) is left alone.

**How it writes.** Every write is an update of the ``status`` subresource carrying the
object as read, ``metadata.resourceVersion`` included, so the apiserver refuses it with
409 if the CRD changed since (a storage version switched, a generation bumped): the
CRD is then read again and the decision taken again on what it says now. The condition
and the pruned list go in one write, so neither lands without the other. Upstream
applies (server-side apply, ``force``) where this updates: :class:`kube.client.Kube`
sends JSON only, which an apiserver takes as an update, not a patch. The permissions
are then ``get`` on ``customresourcedefinitions`` and ``update`` on
``customresourcedefinitions/status`` (:meth:`StoredVersionsPruner.check_access`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from consumers.worker import SOURCE, Append
from kube.client import ApiError, Kube
from ledger.clock import Clock
from ledger.errors import AccessDenied
from ledger.events import Meta, StoredVersionsPruned, StoredVersionsPruneRefused
from projections.crds import VersionVerdict, stored_version_verdicts
from projections.state import Migration, MigrationKey, State

log = logging.getLogger(__name__)

GROUP: Final = "apiextensions.k8s.io"
CRDS: Final = f"/apis/{GROUP}/v1/customresourcedefinitions"
CONDITION: Final = "StorageMigrating"
RUNNING: Final = "MigrationRunning"
FIELD_MANAGER: Final = SOURCE
CONFLICT_RETRIES: Final = 3  # re-reads after a 409 before the prune is refused as Conflict
FORBIDDEN: Final = 403
NOT_FOUND: Final = 404
CONFLICT: Final = 409
# What --prune-stored-versions needs of the worker's ClusterRole, as (verb, resource).
NEEDED: Final = (
    ("get", "customresourcedefinitions"),
    ("update", "customresourcedefinitions/status"),
)
RULE: Final = (
    f'{{apiGroups: ["{GROUP}"], resources: ["customresourcedefinitions",'
    ' "customresourcedefinitions/status"], verbs: ["get", "update"]}'
)


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """Why ``status.storedVersions`` is left as it is: a reason word and the words."""

    reason: str
    message: str


def crd_name(group: str, resource: str) -> str:
    """The CustomResourceDefinition of a custom resource: ``<resource>.<group>``."""
    return f"{resource}.{group}"


def storage_version(crd: Mapping[str, Any]) -> str | None:
    """The version of ``spec.versions`` marked ``storage``, bare (``v2``)."""
    for version in (crd.get("spec") or {}).get("versions") or ():
        if version.get("storage"):
            return str(version.get("name"))
    return None


def stored_versions(crd: Mapping[str, Any]) -> tuple[str, ...]:
    """The CRD's ``status.storedVersions``."""
    return tuple((crd.get("status") or {}).get("storedVersions") or ())


def storage_migrating(crd: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The CRD's ``StorageMigrating`` condition, if it has one."""
    for condition in (crd.get("status") or {}).get("conditions") or ():
        if condition.get("type") == CONDITION:
            found: Mapping[str, Any] = condition
            return found
    return None


def _running(condition: Mapping[str, Any] | None) -> bool:
    return (
        condition is not None
        and condition.get("status") == "True"
        and condition.get("reason") == RUNNING
    )


def prune_decision(
    crd: Mapping[str, Any], migration: Migration, verdicts: Sequence[VersionVerdict]
) -> tuple[str, ...] | Refusal:
    """The ``status.storedVersions`` to write after ``migration`` succeeded, or why none.

    ``crd`` is the CustomResourceDefinition as read after the migration ended (its
    ``StorageMigrating`` condition still the one the migration started under);
    ``verdicts``, the ledger's, one per version of its ``storedVersions`` as the ledger
    last observed them. The answer equals the CRD's ``storedVersions`` when it lists
    the storage version alone already: nothing to prune.
    """
    name = crd_name(migration.group, migration.resource)
    storage = storage_version(crd)
    stored = stored_versions(crd)
    if storage is not None and stored == (storage,):
        return stored
    if storage is None or f"{migration.group}/{storage}" != migration.target_version:
        return Refusal(
            "StorageVersionChanged",
            f"{name} stores {migration.group}/{storage} now, not {migration.target_version},"
            f" which migration {migration.migration_id} rewrote its objects to",
        )
    generation = (crd.get("metadata") or {}).get("generation")
    condition = storage_migrating(crd)
    if condition is None or not _running(condition):
        return Refusal(
            "GenerationChanged",
            f"{name} has no {CONDITION} condition of a running migration (it has"
            f" {_shown(condition)}): the generation migration {migration.migration_id}"
            " started under is not known",
        )
    started = condition.get("observedGeneration")
    if started != generation:
        return Refusal(
            "GenerationChanged",
            f"{name} is at generation {generation}, migration {migration.migration_id}"
            f" started under generation {started} (its {CONDITION} condition): its spec"
            " changed meanwhile",
        )
    if not verdicts:
        return Refusal(
            "NotProven",
            f"the ledger has observed no CustomResourceDefinition {name} (the collector"
            " records them), so it proves no version empty",
        )
    by_version = {verdict.version: verdict for verdict in verdicts}
    unproven = []
    for version in stored:
        if version == storage:
            continue
        verdict = by_version.get(version)
        if verdict is None:
            unproven.append(
                f"{version}: not in storedVersions as the ledger last observed them"
                f" ({', '.join(by_version)}), so it has no verdict on it"
            )
        elif not verdict.removable:
            unproven.append(verdict.why)
    if unproven:
        return Refusal("NotProven", "; ".join(unproven))
    return (storage,)


def _write_refusal(error: ApiError) -> Refusal:
    """The refusal of a prune whose write the apiserver refused (403 or 404)."""
    if error.status == NOT_FOUND:
        return Refusal("NotFound", str(error))
    return Refusal("Forbidden", f"{error}; add to the worker's ClusterRole the rule {RULE}")


def _shown(condition: Mapping[str, Any] | None) -> str:
    if condition is None:
        return "none"
    return f"status {condition.get('status')}, reason {condition.get('reason')}"


def with_condition(
    crd: Mapping[str, Any],
    status: str,
    reason: str,
    message: str,
    now: str,
    stored: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """``crd`` with its ``StorageMigrating`` condition holding the fields upstream sets
    (``observedGeneration`` the CRD's generation) and ``storedVersions`` set to
    ``stored``, if given; the other conditions as they were. ``lastTransitionTime`` is
    ``now`` when the status changes, else as it was (the API conventions' meaning)."""
    changed = copy.deepcopy(dict(crd))
    status_part = changed.setdefault("status", {})
    conditions = list(status_part.get("conditions") or ())
    old = storage_migrating(crd)
    condition = {
        "type": CONDITION,
        "status": status,
        "lastTransitionTime": (
            old["lastTransitionTime"]
            if old is not None and old.get("status") == status and old.get("lastTransitionTime")
            else now
        ),
        "reason": reason,
        "message": message,
        "observedGeneration": (crd.get("metadata") or {}).get("generation"),
    }
    index = next((i for i, c in enumerate(conditions) if c.get("type") == CONDITION), None)
    if index is None:
        conditions.append(condition)
    else:
        conditions[index] = condition
    status_part["conditions"] = conditions
    if stored is not None:
        status_part["storedVersions"] = list(stored)
    return changed


def ended_condition(
    migration: Migration, decision: tuple[str, ...] | Refusal | None, stored: tuple[str, ...]
) -> tuple[str, str]:
    """The reason and message of the ``False`` condition a migration ends with; after a
    success, ``decision`` is what was decided on ``storedVersions`` (now ``stored``)."""
    mid = migration.migration_id
    if migration.phase == "Succeeded":
        if isinstance(decision, Refusal):
            outcome = f"but the stored versions were left as they were: {decision.reason}"
        elif decision == stored:
            outcome = "and the stored versions were up to date already"
        else:
            outcome = "and the stored versions have been updated"
        return "MigrationSucceeded", f"Migration {mid} has succeeded {outcome}"
    ended = "was cancelled" if migration.phase == "Cancelled" else "has failed"
    why = ": ".join(part for part in (migration.reason, migration.message) if part)
    return "MigrationFailed", f"Migration {mid} {ended}" + (f": {why}" if why else "")


class StoredVersionsPruner:
    """Marks a custom resource's CRD while a migration runs, and prunes its
    ``status.storedVersions`` after a success the ledger proves (see the module doc)."""

    def __init__(self, kube: Kube, clock: Clock) -> None:
        self._kube = kube
        self._clock = clock
        # The migrations whose CRD started() found: one gone by their end is NotFound,
        # not a built-in resource.
        self._custom: set[MigrationKey] = set()

    async def check_access(self) -> None:
        """Raise :class:`~ledger.errors.AccessDenied`, naming what to grant, unless the
        credentials may read CRDs and update their status."""
        for verb, resource in NEEDED:
            plural, _, subresource = resource.partition("/")
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "group": GROUP,
                        "resource": plural,
                        "subresource": subresource,
                        "verb": verb,
                    }
                },
            }
            try:
                answer = await self._kube.request(
                    "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review
                )
            except ApiError as error:
                raise AccessDenied(
                    f"--prune-stored-versions: cannot ask {self._kube.host} whether the worker"
                    f" may {verb} {resource} ({error}); it needs the ClusterRole rule {RULE}"
                ) from error
            status = answer.get("status") or {}
            if not status.get("allowed"):
                why = status.get("reason") or status.get("evaluationError") or "no rule allows it"
                raise AccessDenied(
                    f"--prune-stored-versions: the worker's credentials may not {verb}"
                    f" {resource} (group {GROUP}) at {self._kube.host}: {why}; add to its"
                    f" ClusterRole the rule {RULE}"
                )

    async def started(self, migration: Migration) -> None:
        """Set the CRD's ``StorageMigrating`` condition ``True`` as upstream does, unless
        the migration resumes (``Running``) under that condition already: its
        ``observedGeneration`` is then the generation the migration started under."""
        message = f"Migration {migration.migration_id} is running"
        for _ in range(CONFLICT_RETRIES + 1):
            crd = await self._read(migration)
            if crd is None:
                return  # not a custom resource
            self._custom.add(migration.key)
            if migration.phase == "Running" and _running(storage_migrating(crd)):
                return
            body = with_condition(crd, "True", RUNNING, message, self._now())
            try:
                await self._write(body)
                return
            except ApiError as error:
                if error.status != CONFLICT:
                    raise
        log.warning(
            "migration %s: %s kept changing; its %s condition was not set after %d writes",
            migration.migration_id,
            crd_name(migration.group, migration.resource),
            CONDITION,
            CONFLICT_RETRIES + 1,
        )

    async def ended(self, state: State, migration: Migration, append: Append) -> None:
        """Set the CRD's ``StorageMigrating`` condition ``False`` after ``migration``
        ended (in ``state``, which holds its end); after a success, prune
        ``storedVersions`` if the ledger proves it may, and append what was done."""
        custom = migration.key in self._custom
        self._custom.discard(migration.key)
        verdicts: tuple[VersionVerdict, ...] = ()
        if migration.phase == "Succeeded":
            verdicts = stored_version_verdicts(state, migration.resource_key)
        # A CRD that started() found, or the ledger knows, is gone if not found now.
        outcome = await self._settle(migration, verdicts, known=custom or bool(verdicts))
        if outcome is None:
            return
        if isinstance(outcome, StoredVersionsPruneRefused):
            log.warning(
                "migration %s: status.storedVersions of %s left as they were (%s): %s",
                migration.migration_id,
                outcome.name,
                outcome.reason,
                outcome.message,
            )
        await append([outcome])

    async def _settle(
        self, migration: Migration, verdicts: Sequence[VersionVerdict], *, known: bool
    ) -> StoredVersionsPruned | StoredVersionsPruneRefused | None:
        """Write the ``False`` condition and, after a success, the pruned
        ``storedVersions`` (read again and decided again after a 409); what to record."""
        succeeded = migration.phase == "Succeeded"
        name = crd_name(migration.group, migration.resource)
        decision: tuple[str, ...] | Refusal | None = None
        before: tuple[str, ...] = ()

        def refused(refusal: Refusal) -> StoredVersionsPruneRefused:
            return StoredVersionsPruneRefused(
                self._meta(migration),
                migration.migration_id,
                migration.group,
                migration.resource,
                name,
                before,
                refusal.reason,
                refusal.message,
            )

        for _ in range(CONFLICT_RETRIES + 1):
            crd = await self._read(migration)
            if crd is None:
                return (
                    refused(Refusal("NotFound", f"{name} is gone")) if succeeded and known else None
                )
            before = stored_versions(crd)
            decision = prune_decision(crd, migration, verdicts) if succeeded else None
            reason, message = ended_condition(migration, decision, before)
            pruned = decision if isinstance(decision, tuple) and decision != before else None
            try:
                await self._write(
                    with_condition(crd, "False", reason, message, self._now(), pruned)
                )
            except ApiError as error:
                if error.status == CONFLICT:
                    continue
                if error.status not in (FORBIDDEN, NOT_FOUND):
                    raise
                if pruned is None:  # only the condition was to change
                    log.warning("migration %s: %s", migration.migration_id, error)
                else:
                    decision = _write_refusal(error)
            if isinstance(decision, Refusal):
                return refused(decision)
            if pruned is None:
                return None
            metadata = crd["metadata"]
            return StoredVersionsPruned(
                self._meta(migration),
                migration.migration_id,
                migration.group,
                migration.resource,
                name,
                int(metadata["generation"]),
                str(metadata["resourceVersion"]),
                before,
                pruned,
            )
        # The CRD changed under every write: a refusal decided stands, a prune did not happen.
        if isinstance(decision, Refusal):
            return refused(decision)
        if decision is None or decision == before:
            return None
        return refused(
            Refusal(
                "Conflict",
                f"{name} changed under each of {CONFLICT_RETRIES + 1} writes (409 Conflict on"
                " its resourceVersion): read again and decided again each time",
            )
        )

    def _meta(self, migration: Migration) -> Meta:
        return Meta.new(migration.cluster, SOURCE, self._clock.now())

    async def _read(self, migration: Migration) -> dict[str, Any] | None:
        """The resource's CRD, or None if it has none (a built-in resource, or gone)."""
        if not migration.group:
            return None  # the core group has built-in resources only
        try:
            return await self._kube.get(f"{CRDS}/{crd_name(migration.group, migration.resource)}")
        except ApiError as error:
            if error.status == NOT_FOUND:
                return None
            raise

    async def _write(self, crd: Mapping[str, Any]) -> None:
        """Update the CRD's status, on the condition that it is still as read."""
        await self._kube.request(
            "PUT",
            f"{CRDS}/{crd['metadata']['name']}/status",
            crd,
            query={"fieldManager": FIELD_MANAGER},
        )

    def _now(self) -> str:
        return self._clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
