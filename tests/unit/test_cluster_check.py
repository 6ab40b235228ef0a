"""The worker's identity check as a rule (on real Leases: tests/integration/test_collector.py)."""

from __future__ import annotations

from kube.cluster_check import mismatch

HOST = "https://127.0.0.1:6443"


def test_one_holder_in_common_is_the_same_cluster() -> None:
    ledger = {"kube-apiserver-a_1", "kube-apiserver-b_2"}
    target = {"kube-apiserver-a_1", "kube-apiserver-b_3"}  # b restarted: not recorded yet
    assert mismatch(ledger, target, "east", HOST) is None


def test_the_same_apiserver_ids_with_other_holders_are_another_cluster() -> None:
    reason = mismatch({"kube-apiserver-a_1"}, {"kube-apiserver-a_9"}, "east", HOST)
    assert reason is not None
    assert f"the kubeconfig's API server {HOST} may not be cluster 'east'" in reason
    assert (
        "held by kube-apiserver-a_9, the ledger's leases of 'east' by kube-apiserver-a_1" in reason
    )
    assert "--skip-identity-check" in reason


def test_leases_without_a_holder_prove_nothing() -> None:
    assert mismatch({""}, {""}, "east", HOST) is not None
    assert "by nobody" in (mismatch(set(), {"kube-apiserver-a_1"}, "east", HOST) or "")
