"""What an operator may append by hand, decided on the folded log without Kafka."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumers.operator import OperatorError, decide_request, decide_reset
from ledger.events import (
    ApiserverHeartbeat,
    Meta,
    MigrationStarted,
    Position,
    StorageStateReset,
    StorageVersionReported,
)
from projections.fold import apply
from projections.state import State
from tests.unit.test_migrator_rules import CLUSTER, pods_hash

NOW = datetime(2024, 1, 1, tzinfo=UTC)


def meta(source: str = "alice") -> Meta:
    return Meta.new(CLUSTER, source, NOW)


def cluster(*encodings: str) -> State:
    """A cluster whose apiservers a, b, ... encode pods as ``encodings``."""
    state = State()
    offset = 0
    for index, version in enumerate(encodings):
        apiserver = f"apiserver-{'abcdefgh'[index]}"
        for event in (
            ApiserverHeartbeat(meta(apiserver), apiserver, f"{apiserver}_1", apiserver, 3600, NOW),
            StorageVersionReported(
                meta(apiserver), apiserver, "", "pods", "Pod", version, ("v1", "v2"), ("v1",)
            ),
        ):
            apply(state, event, Position(0, offset))
            offset += 1
    return state


def test_a_request_targets_the_common_version_at_the_current_revision() -> None:
    state = cluster("v2", "v2")
    event = decide_request(state, meta(), "", "pods", None, migration_id="m-1")
    assert (event.target_version, event.target_hash) == ("v2", pods_hash("v2"))
    assert event.storage_version_revision == state.storage_versions[CLUSTER, "", "pods"].revision
    assert event.meta.source == "alice"


def test_a_request_is_refused_while_the_apiservers_disagree() -> None:
    with pytest.raises(OperatorError, match=r"disagree .*\(v1, v2\).*finish the rollout"):
        decide_request(cluster("v1", "v2"), meta(), "", "pods", None, migration_id="m-1")


def test_a_request_for_another_version_than_the_common_one_is_refused() -> None:
    with pytest.raises(OperatorError, match=r"'v1' is not the common encoding version 'v2'"):
        decide_request(cluster("v2"), meta(), "", "pods", "v1", migration_id="m-1")


def test_a_second_request_is_refused_while_one_is_active() -> None:
    state = cluster("v2")
    first = decide_request(state, meta(), "", "pods", None, migration_id="m-1")
    apply(state, first, Position(0, 10))
    apply(state, MigrationStarted(meta("worker"), "m-1"), Position(0, 11))
    with pytest.raises(OperatorError, match=r"migration 'm-1' .* already Running"):
        decide_request(state, meta(), "", "pods", None, migration_id="m-2")


def test_an_unknown_resource_is_refused_with_a_hint() -> None:
    with pytest.raises(OperatorError, match=r"no live apiserver .* reports 'apps.pods'"):
        decide_request(cluster("v2"), meta(), "apps", "pods", None, migration_id="m-1")


@pytest.mark.parametrize(
    ("source", "group", "message"),
    [
        ("", "", "give the operator's name"),
        ("alice", "core", "the core group is written as the empty string"),
        ("alice", "Apps", "must be '' \\(core\\) or a DNS-1123 subdomain"),
    ],
)
def test_bad_names_are_refused_before_reading(source: str, group: str, message: str) -> None:
    with pytest.raises(OperatorError, match=message):
        decide_request(cluster("v2"), meta(source), group, "pods", None, migration_id="m-1")


def test_a_reset_needs_a_reason_and_a_storage_state() -> None:
    state = cluster("v2")
    by_alice = meta()
    reset = decide_reset(state, by_alice, "", "pods", "etcd restored")
    assert reset == StorageStateReset(by_alice, "", "pods", "etcd restored")
    with pytest.raises(OperatorError, match="give a reason"):
        decide_reset(state, meta(), "", "pods", "  ")
    with pytest.raises(OperatorError, match=r"no StorageState for 'core\.configmaps'"):
        decide_reset(state, meta(), "", "configmaps", "etcd restored")
