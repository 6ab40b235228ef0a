"""The storage version hash, exactly as Kubernetes computes it.

Upstream (``k8s.io/apiserver/pkg/endpoints/discovery``, ``StorageVersionHash``) hashes
the string ``<group>/<version>/<kind>`` with SHA-256 and publishes the first 8 bytes
in standard, padded base64. The core group is the empty string, so a Pod stored as v1
hashes ``/v1/Pod``. Discovery shows this value per resource; the StorageState of the
migration KEP records which hashes objects may be persisted in.
"""

from __future__ import annotations

import base64
import functools
import hashlib

from ledger.names import parse_group, split_group_version


def storage_version_hash(group: str, version: str, kind: str) -> str:
    """The storageVersionHash of objects of ``kind`` encoded as ``group/version``.

    ``group`` is ``""`` for the core group; ``"core"`` is accepted as an alias.
    """
    group = parse_group(group)
    for what, value in (("group", group), ("version", version), ("kind", kind)):
        if "/" in value:
            raise ValueError(f"{what} {value!r} contains '/'; give group, version and kind apart")
    for what, value in (("version", version), ("kind", kind)):
        if not value:
            raise ValueError(f"the {what} is empty; give one, e.g. 'v1' and 'Pod'")
    digest = hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()
    return base64.standard_b64encode(digest[:8]).decode("ascii")


@functools.lru_cache(maxsize=4096)  # the fold asks it of every report; a fleet has few pairs
def hash_of_stored(version: str, kind: str) -> str:
    """The storageVersionHash of ``kind`` stored as ``version``, group-qualified as upstream
    writes it (``apps/v1``; ``v1`` for the core group)."""
    return storage_version_hash(*split_group_version(version), kind)


# A report's encoding version when the sender knows only the hash its apiserver stores a
# resource with (the collector found no group/version/kind that hashes to it): the
# report then carries that hash, and the version stays unnamed.
UNNAMED_VERSION = ""


def hash_of_report(encoding_version: str, kind: str, storage_version_hash: str | None) -> str:
    """The hash a report says its apiserver stores with: of ``encoding_version`` and
    ``kind``, or, for an :data:`UNNAMED_VERSION`, the reported ``storage_version_hash``."""
    if encoding_version == UNNAMED_VERSION and storage_version_hash:
        return storage_version_hash
    return hash_of_stored(encoding_version, kind)
