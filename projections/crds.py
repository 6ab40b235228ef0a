"""When a CustomResourceDefinition's old version can go: its ``status.storedVersions`` judged
against the ledger.

A CustomResourceDefinition lists in ``status.storedVersions`` every version its objects
may have been stored in; the apiservers add the storage version when it changes and never
remove one. A version may leave that list (and then ``spec.versions``) only once no object
is stored in it, which no apiserver knows: upstream's in-tree migrator (1.36+) prunes the
list after its migration succeeds, checking no apiserver. The ledger knows: a resource's
StorageState holds the hash of every version objects may be stored in, reset to the
target's alone by a migration that succeeded while its StorageVersion stayed as it was
requested (every live apiserver agreeing on the target from request to success:
:func:`projections.fold.stale_reason`), and grown again by every report of another
encoding version since. So, for a version ``v`` of ``storedVersions``:

* the storage version stays: every write stores it;
* with no StorageState (no apiserver reported the resource) or one holding ``Unknown``
  (no such migration since the ledger began watching, or since a reset), every version
  stays: objects may be stored in any;
* ``v`` stays while its hash is among the persisted hashes;
* ``v`` stays while the resource's last audit of the store, begun after the migration
  that proved it empty, found objects stored in it (written behind the ledger's back:
  :mod:`projections.audits`);
* otherwise ``v`` can go: no object can be stored in it.

Every reason cites the ledger positions it rests on, so ``svledger explain`` can say it to
a CRD author and the worker can put it in a refused prune (:mod:`kube.stored_versions`).

Pure: no I/O, no clock; the verdicts are a function of the fold's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ledger.events import Position
from ledger.hashing import hash_of_stored
from ledger.names import resource_name
from projections.state import (
    UNKNOWN_HASH,
    CustomResourceDefinition,
    Migration,
    ResourceKey,
    State,
)


@dataclasses.dataclass(frozen=True, slots=True)
class VersionVerdict:
    """Whether ``version`` (bare, as ``storedVersions`` names it) can leave ``storedVersions``."""

    version: str
    removable: bool
    why: str  # in words, citing ledger positions ("partition:offset")


def stored_version_verdicts(state: State, key: ResourceKey) -> tuple[VersionVerdict, ...]:
    """One verdict per version of the CustomResourceDefinition's ``storedVersions``, as the
    ledger last observed it; ``()`` if the ledger holds no CustomResourceDefinition at ``key``."""
    crd = state.custom_resources.get(key)
    if crd is None:
        return ()
    return tuple(verdict(state, crd, version) for version in crd.stored_versions)


def removable_versions(state: State, key: ResourceKey) -> tuple[str, ...]:
    """The versions of ``storedVersions`` the ledger proves no object is stored in."""
    return tuple(v.version for v in stored_version_verdicts(state, key) if v.removable)


def last_success(state: State, key: ResourceKey) -> Migration | None:
    """The resource's most recent Succeeded migration the fold still holds, if any."""
    succeeded = [
        state.migrations[k]
        for k in state.inactive_migrations_by_resource.get(key, ())
        if state.migrations[k].phase == "Succeeded"
    ]
    return max(succeeded, key=lambda m: (m.updated_at, m.revision), default=None)


def verdict(state: State, crd: CustomResourceDefinition, version: str) -> VersionVerdict:
    """Whether ``version`` of ``crd``'s resource can leave (or could have left)
    ``storedVersions``."""
    name = resource_name(crd.group, crd.resource)
    if version == crd.storage_version:
        return VersionVerdict(version, False, "the storage version: every write stores it")
    storage_state = state.storage_states.get(crd.key)
    if storage_state is None:
        return VersionVerdict(
            version,
            False,
            f"no apiserver has reported {name} to the ledger yet, so nothing is known of the"
            " versions its objects are stored in",
        )
    persisted = storage_state.persisted_storage_version_hashes
    running = _running(state, crd.key)
    if UNKNOWN_HASH in persisted:
        return VersionVerdict(
            version,
            False,
            f"objects may be stored in any version: no migration of {name} has succeeded under"
            f" agreement since the ledger began watching it or since it was reset (StorageState"
            f" at {storage_state.revision} holds {UNKNOWN_HASH!r}){running}",
        )
    if hash_of_stored(f"{crd.group}/{version}", crd.kind) in persisted:
        return VersionVerdict(
            version,
            False,
            f"objects may still be stored in {version}: an apiserver encoded {name} in it and no"
            " migration has rewritten every object under agreement since (StorageState at"
            f" {storage_state.revision}){running}",
        )
    success = last_success(state, crd.key)
    found = _audited(state, crd, version, success)
    if found is not None:
        return VersionVerdict(version, False, found)
    proof = (
        f" migration {success.migration_id} rewrote every object to {success.target_version}"
        f" (succeeded at {success.revision}) while every apiserver encoded it, and"
        if success is not None and success.target_hash in persisted
        else ""
    )
    return VersionVerdict(
        version,
        True,
        f"no object can be stored in {version}:{proof} no apiserver has encoded {name} in"
        f" {version} since (StorageState at {storage_state.revision})",
    )


def _audited(
    state: State, crd: CustomResourceDefinition, version: str, success: Migration | None
) -> str | None:
    """Why ``version`` stays though the ledger holds it empty: the resource's last audit of
    the store found objects in it, and began after the migration that proved it empty
    (one that began before may have counted objects that migration then rewrote)."""
    audit = state.audits.get(crd.key)
    if audit is None:
        return None
    counts = dict(zip(audit.versions, audit.version_counts, strict=True))
    found = counts.get(f"{crd.group}/{version}", 0)
    if not found:
        return None
    if success is not None and Position.parse(success.revision).offset >= audit.ledger_offset:
        return None
    return (
        f"the audit of the store at etcd revision {audit.etcd_revision} (StorageAudited at"
        f" {audit.revision}) found {found} objects stored in {version}, though the ledger"
        " holds none can be: rewrite them (svledger migrations request) and audit again"
    )


def _running(state: State, key: ResourceKey) -> str:
    """Words on the resource's Pending or Running migration, if it has one."""
    active = sorted(
        (state.migrations[k] for k in state.active_migrations_by_resource.get(key, ())),
        key=lambda m: m.revision,
    )
    return "".join(
        f"; migration {m.migration_id} to {m.target_version} is {m.phase} ({m.revision})"
        for m in active
    )


def dropped(before: Iterable[str], after: Iterable[str]) -> tuple[str, ...]:
    """The versions of ``before`` that ``after`` lacks, in ``before``'s order."""
    kept = set(after)
    return tuple(v for v in before if v not in kept)
