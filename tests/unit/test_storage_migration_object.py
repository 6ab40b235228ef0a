"""The StorageVersionMigration the in-tree executor creates, in each version of its API."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kube.client import ApiError
from kube.executor import ALPHA, GROUP, migration_object
from ledger.codec import decode, encode
from ledger.events import Meta, MigrationFailed
from projections.state import Migration

START = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
MIGRATION = Migration(
    "east", "0b7c", "apps", "deployments", "apps/v2", "h2", "0:7", "Pending", 0, None, None,
    None, START, START, "0:8", "0:8", START,
)  # fmt: skip


@pytest.mark.parametrize("group_version", [f"{GROUP}/v1", f"{GROUP}/v1beta1"])
def test_v1_and_v1beta1_name_the_group_and_resource_only(group_version: str) -> None:
    obj = migration_object(MIGRATION, group_version, None)
    assert obj["apiVersion"] == group_version
    assert obj["metadata"]["name"] == "svledger-0b7c"
    assert obj["spec"] == {"resource": {"group": "apps", "resource": "deployments"}}
    assert obj["metadata"]["annotations"]["svledger.io/target-version"] == "apps/v2"


def test_v1alpha1_names_the_version_discovery_prefers_not_the_target() -> None:
    # v1alpha1 (Kubernetes 1.30 to 1.34) refuses a spec.resource without a version.
    obj = migration_object(MIGRATION, ALPHA, "v1")
    assert obj["spec"] == {
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"}
    }


def test_a_refusal_quoting_a_nul_character_can_still_fail_its_migration() -> None:
    """An API server's Status may quote the value it refused; the MigrationFailed that
    carries its words must still encode (the codec refuses NUL)."""
    refused = ApiError(422, 'ConfigMap "a" is invalid: data[k]: Invalid value: "x\x00y"')
    failed = MigrationFailed(
        Meta.new("east", "svledger-worker", START), "0b7c", 0, None, "Invalid", str(refused)
    )
    assert decode(encode(failed)) == failed
    assert "x\\u0000y" in str(refused)
