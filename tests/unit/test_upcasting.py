"""An old log still reads: StorageVersionReported v1 records (bare versions) upcast to v2."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from datetime import UTC, datetime, timedelta

from ledger.codec import decode, encode
from ledger.events import ApiserverHeartbeat, Event, Meta, Position, StorageVersionReported
from ledger.hashing import storage_version_hash
from projections import store
from projections.fold import apply
from projections.state import State
from tests.unit.test_codec import read_schema, single_object, with_meta

SCHEMAS = pathlib.Path(__file__).parents[2] / "schemas"
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def as_v1(event: StorageVersionReported) -> bytes:
    """``event`` as an svledger before v2 wrote it: with the v1 schema."""
    schema = with_meta(
        read_schema(SCHEMAS / "StorageVersionReported", 1), read_schema(SCHEMAS / "Meta", 1)
    )
    record = dataclasses.asdict(event)
    del record["storage_version_hash"]
    record["meta"]["occurred_at"] = event.meta.occurred_at
    return single_object(schema, record)


def old_report(host: str, group: str, encoding: str, at: int) -> StorageVersionReported:
    return StorageVersionReported(
        Meta(f"r-{host}-{at}", "east", T0 + timedelta(seconds=at), host),
        host,
        group,
        "deployments" if group else "pods",
        "Deployment" if group else "Pod",
        encoding,
        ("v1", "v2"),
        ("v1",),
    )


def test_a_v1_record_reads_with_versions_qualified_by_its_group() -> None:
    old = old_report("apiserver-a", "apps", "v2", 1)
    decoded = decode(as_v1(old))
    assert isinstance(decoded, StorageVersionReported)
    assert decoded == dataclasses.replace(
        old,
        encoding_version="apps/v2",
        decodable_versions=("apps/v1", "apps/v2"),
        served_versions=("apps/v1",),
    )
    # Its ledger_events row is built from the event decoded: the same upcast.
    payload = json.loads(store.logged(decoded, Position(0, 0))[-1])
    assert payload["encoding_version"] == "apps/v2"
    # Core versions are the same in both forms.
    core = old_report("apiserver-a", "", "v1", 2)
    assert decode(as_v1(core)) == core


def test_an_old_log_folds_into_the_same_hashes_and_agreement_as_before() -> None:
    heartbeats: list[Event] = [
        ApiserverHeartbeat(Meta(f"h-{h}", "east", T0, h), h, f"{h}_1", h, 3600, T0)
        for h in ("apiserver-a", "apiserver-b")
    ]
    reports = [
        old_report("apiserver-a", "apps", "v1", 1),
        old_report("apiserver-b", "apps", "v1", 2),
        old_report("apiserver-a", "apps", "v2", 3),
        old_report("apiserver-b", "apps", "v2", 4),
        old_report("apiserver-a", "", "v1", 5),
        old_report("apiserver-b", "", "v1", 6),
    ]
    old_log = [*heartbeats, *(decode(as_v1(r)) for r in reports)]
    new_log = [decode(encode(e)) for e in old_log]  # as written today: v2 records
    folded = []
    for log in (old_log, new_log):
        state = State()
        for offset, event in enumerate(log):
            apply(state, event, Position(0, offset))
        folded.append(state)
    old, new = folded
    assert old == new
    deployments = old.storage_states["east", "apps", "deployments"]
    # What the fold gave before v2, when bare versions meant the resource's own group.
    assert deployments.persisted_storage_version_hashes == (
        "Unknown",
        storage_version_hash("apps", "v1", "Deployment"),
        storage_version_hash("apps", "v2", "Deployment"),
    )
    assert deployments.current_storage_version_hash == storage_version_hash(
        "apps", "v2", "Deployment"
    )
    assert old.storage_versions["east", "apps", "deployments"].common_encoding_version == "apps/v2"
    assert old.storage_states["east", "", "pods"].current_storage_version_hash == (
        storage_version_hash("", "v1", "Pod")
    )
