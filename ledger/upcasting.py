"""Upcasters: what Avro schema resolution cannot do when an event type changes meaning.

Avro resolution reads an old record with the newest schema: it fills new fields with
their defaults and drops removed ones. It cannot change what a value *means*. Where a
new schema version does, an upcaster here rewrites the record read with an old writer
schema into the new meaning, so folds, views and history only ever see the newest.

Each upcaster is keyed by event type and the writer schema version it upgrades from,
and turns the record as read (a dict, after resolution) into the record of the next
version; the codec applies them in order for every record whose writer schema is
older. They are pure and total: every record an old svledger could write upcasts.

* ``StorageVersionReported`` v1 -> v2: v1 wrote bare versions (``v1``), meaning the
  resource's own group; v2 writes them as upstream does, group-qualified (``apps/v1``;
  ``v1`` for the core group). A v1 record's versions are qualified with its ``group``,
  so its storage version hash, and every view derived from it, stays what it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeAlias

from ledger.names import group_version

Upcaster: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]


def _qualify_reported_versions(record: dict[str, Any]) -> dict[str, Any]:
    group = record["group"]
    return {
        **record,
        "encoding_version": group_version(group, record["encoding_version"]),
        "decodable_versions": [group_version(group, v) for v in record["decodable_versions"]],
        "served_versions": [group_version(group, v) for v in record["served_versions"]],
    }


# (event type, writer version it upgrades from) -> upcaster to the next version.
UPCASTERS: Final[dict[tuple[str, int], Upcaster]] = {
    ("StorageVersionReported", 1): _qualify_reported_versions,
}


def upcast(type_name: str, version: int, newest: int, record: dict[str, Any]) -> dict[str, Any]:
    """``record``, written with ``version`` of ``type_name``'s schema, in ``newest``'s meaning."""
    for step in range(version, newest):
        upcaster = UPCASTERS.get((type_name, step))
        if upcaster is not None:
            record = upcaster(record)
    return record
