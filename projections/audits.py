"""What an audit of the store says against the ledger: pollution, and keys that can go.

``svledger audit`` counts what etcd holds of each resource at one revision
(``StorageAudited``). The ledger holds, per resource, every storage version hash an
object may be stored in (the StorageState's persisted hashes). An object stored in a
version whose hash is not among them is **pollution**: it was written where the ledger
says none can be, by an apiserver the ledger did not know wrote that version (one
stopped and restarted on an old release before the collector read it, a writer outside
the apiservers, a restored backup).

The audit reads etcd between two readings of the ledger: ``before``, folded up to the
cluster's partition end when the audit began, and ``after``, folded up to its end when
the audit is appended. A version counts as pollution only if neither holds its hash:
one that ``before`` holds may have been rewritten by a migration that succeeded while
etcd was read (the audit predates the proof), and one that only ``after`` holds was
reported by an apiserver meanwhile (the ledger knows it now). A StorageState holding
``Unknown`` (no migration under agreement yet, or a reset) claims nothing, nor does a
resource without one. Encrypted values name no version (it is inside the ciphertext),
so they are never pollution; they are counted per key instead.

Encryption keys: with the apiservers' ``EncryptionConfiguration``, the audit counts every
key configured for a resource, 0 included. The first provider of a resource encrypts
every write; any other key that encrypts no object of the resource can be removed from
the configuration's list for it (:func:`removable_keys`), once every apiserver has read
the configuration that writes with the new key.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from ledger.names import resource_name
from projections.crds import last_success
from projections.state import UNKNOWN_HASH, ResourceKey, State, StorageAudit


def pollution(
    before: State,
    after: State,
    key: ResourceKey,
    versions: Sequence[str],
    hashes: Sequence[str],
    counts: Sequence[int],
    etcd_revision: int,
) -> tuple[tuple[str, ...], str | None]:
    """The versions found (``versions``, with their ``hashes`` and ``counts``) that the
    ledger holds no object can be stored in, and why in words; ``((), None)`` if none."""
    claims = [state.storage_states.get(key) for state in (before, after)]
    held: set[str] = set()
    for claim in claims:
        if claim is None or UNKNOWN_HASH in claim.persisted_storage_version_hashes:
            return (), None
        held.update(claim.persisted_storage_version_hashes)
    polluted = [
        (version, count)
        for version, found_hash, count in zip(versions, hashes, counts, strict=True)
        if found_hash not in held and count > 0
    ]
    if not polluted:
        return (), None
    storage_state = claims[1]
    assert storage_state is not None
    success = last_success(after, key)
    proof = (
        f"; migration {success.migration_id} rewrote every object to {success.target_version}"
        f" (succeeded at {success.revision})"
        if success is not None
        else ""
    )
    found = ", ".join(f"{count} in {version}" for version, count in polluted)
    message = (
        f"etcd holds objects of {resource_name(*key[1:])} in versions the ledger holds none can"
        f" be stored in ({found}, at etcd revision {etcd_revision}): the StorageState holds"
        f" [{', '.join(storage_state.persisted_storage_version_hashes)}] (at"
        f" {storage_state.revision}){proof}, and no apiserver reported writing them"
    )
    return tuple(version for version, _ in polluted), message


def removable_keys(audit: StorageAudit) -> tuple[str, ...]:
    """The encryption keys (``<provider>:<name>``) counted for the resource that encrypt
    none of its objects, but the first one listed: the writing key (see the module doc)."""
    keys = audit.encryption_keys
    return tuple(
        key for index, key in enumerate(keys) if index > 0 and audit.encryption_counts[index] == 0
    )
