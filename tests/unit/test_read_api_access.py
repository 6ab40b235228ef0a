"""Access reviews (:mod:`readapi.access`): what ``kubectl auth can-i`` is told, and how
the protobuf bodies kubectl posts them in are read (:mod:`readapi.protobuf`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from readapi import access, negotiation, protobuf
from readapi.status import ApiError

# The bodies kubectl (v1.32.4 and v1.37.2 alike) posts for `auth can-i watch leases -n
# kube-system`, `auth can-i get /healthz` and `auth can-i --list`, captured off the wire.
KUBECTL_WATCH_LEASES = bytes.fromhex(
    "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f7631121753656c665375626a6563"
    "7441636365737352657669657712440a100a0012001a0022002a0032003800420012260a240a0b6b756265"
    "2d73797374656d120577617463681a0022002a066c656173657332003a001a08080012001a0020001a0022"
    "00"
)
KUBECTL_GET_HEALTHZ = bytes.fromhex(
    "6b3873000a320a17617574686f72697a6174696f6e2e6b38732e696f2f7631121753656c665375626a6563"
    "74416363657373526576696577122f0a100a0012001a0022002a003200380042001211120f0a082f686561"
    "6c74687a12036765741a08080012001a0020001a002200"
)
KUBECTL_LIST = bytes.fromhex(
    "6b3873000a310a17617574686f72697a6174696f6e2e6b38732e696f2f7631121653656c665375626a6563"
    "7452756c657352657669657712230a100a0012001a0022002a0032003800420012090a0764656661756c74"
    "1a04180022001a002200"
)


KUBECTL_WHOAMI = bytes.fromhex(  # `auth whoami`
    "6b3873000a2d0a1861757468656e7469636174696f6e2e6b38732e696f2f7631121153656c665375626a6563"
    "74526576696577121a0a100a0012001a0022002a0032003800420012060a040a0012001a002200"
)


def resource_review(**attributes: Any) -> dict[str, Any]:
    return {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},  # as kubectl sends it
        "spec": {"resourceAttributes": attributes},
    }


@given(
    verb=st.one_of(
        st.sampled_from(["get", "list", "watch", "create", "delete", "*", "GET"]), st.text()
    ),
    namespace=st.sampled_from(["", "default", "kube-system"]),
    resource=st.sampled_from(["storageversions", "leases", "pods", "*"]),
)
def test_every_read_of_a_resource_is_allowed_and_nothing_else(
    verb: str, namespace: str, resource: str
) -> None:
    asked = resource_review(verb=verb, namespace=namespace, resource=resource, group="")
    answered = access.access_review(asked)
    allowed = verb in ("get", "list", "watch")
    assert answered["status"]["allowed"] is allowed
    assert answered["status"].get("denied", False) is not allowed
    assert answered["spec"] == asked["spec"]  # echoed, as upstream's
    assert (answered["kind"], answered["apiVersion"]) == (
        "SelfSubjectAccessReview",
        "authorization.k8s.io/v1",
    )


def test_a_denial_says_why() -> None:
    answered = access.access_review(resource_review(verb="delete", resource="leases"))
    assert "appended by their producers" in answered["status"]["reason"]


@pytest.mark.parametrize(("verb", "allowed"), [("get", True), ("post", False), ("list", False)])
def test_a_non_resource_path_may_be_got(verb: str, allowed: bool) -> None:
    asked = {"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": verb}}}
    assert access.access_review(asked)["status"]["allowed"] is allowed


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ({}, '"null"'),
        (
            {
                "resourceAttributes": {"verb": "get"},
                "nonResourceAttributes": {"path": "/", "verb": "get"},
            },
            '{"path": "/", "verb": "get"}',
        ),
    ],
)
def test_a_review_names_exactly_one_kind_of_attributes(spec: dict[str, Any], shown: str) -> None:
    with pytest.raises(ApiError) as raised:
        access.access_review({"spec": spec})
    error = raised.value
    assert (error.code, error.reason) == (422, "Invalid")
    detail = "exactly one of nonResourceAttributes or resourceAttributes must be specified"
    assert str(error).startswith(
        'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec:'
    )
    assert str(error).endswith(detail)
    assert f"Invalid value: {shown}: {detail}" in str(error)
    assert error.details is not None
    assert error.details["causes"][0]["field"] == "spec"


def test_a_review_with_metadata_is_invalid() -> None:
    asked = resource_review(verb="get", resource="leases")
    asked["metadata"] = {"name": "mine"}
    with pytest.raises(ApiError, match=r"metadata: Invalid value: .*must be empty") as raised:
        access.access_review(asked)
    assert raised.value.code == 422


def test_a_body_of_another_kind_is_a_bad_request() -> None:
    with pytest.raises(ApiError, match="must be of type SelfSubjectAccessReview") as raised:
        access.access_review({"kind": "Pod", "spec": {"resourceAttributes": {"verb": "get"}}})
    assert raised.value.code == 400
    with pytest.raises(ApiError, match="not an object"):
        access.access_review(["get"])


def test_a_rules_review_lists_reading_everything() -> None:
    answered = access.rules_review({"spec": {"namespace": "default"}})
    assert answered["status"] == {
        "resourceRules": [
            {"verbs": ["get", "list", "watch"], "apiGroups": ["*"], "resources": ["*"]}
        ],
        "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["*"]}],
        "incomplete": False,
    }
    with pytest.raises(ApiError, match=r"^no namespace on request$") as raised:
        access.rules_review({"spec": {}})
    assert raised.value.code == 400


def test_kubectls_protobuf_reviews_read_as_their_json() -> None:
    watch = protobuf.decode(KUBECTL_WATCH_LEASES)
    assert (watch["kind"], watch["apiVersion"]) == (
        "SelfSubjectAccessReview",
        "authorization.k8s.io/v1",
    )
    attributes = watch["spec"]["resourceAttributes"]
    assert {k: v for k, v in attributes.items() if v} == {
        "namespace": "kube-system",
        "verb": "watch",
        "resource": "leases",
    }
    assert access.access_review(watch)["status"]["allowed"] is True
    healthz = protobuf.decode(KUBECTL_GET_HEALTHZ)
    assert healthz["spec"] == {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}
    assert access.access_review(healthz)["status"]["allowed"] is True
    listed = protobuf.decode(KUBECTL_LIST)
    assert listed["kind"] == "SelfSubjectRulesReview"
    assert listed["spec"] == {"namespace": "default"}
    assert access.rules_review(listed)["status"]["incomplete"] is False


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"not protobuf", "does not start with the protobuf envelope"),
        (KUBECTL_WATCH_LEASES[:40], "Unknown"),  # cut inside the envelope
        (
            KUBECTL_WATCH_LEASES.replace(b"SelfSubjectAccessReview", b"SelfSubjectAccessReviex"),
            "kind",
        ),
    ],
)
def test_a_protobuf_body_that_is_no_review_is_a_bad_request(body: bytes, why: str) -> None:
    with pytest.raises(ApiError, match=why) as raised:
        protobuf.decode(body)
    assert raised.value.code == 400


def test_request_bodies_in_unserved_media_types_or_broken_are_refused() -> None:
    with pytest.raises(ApiError, match="unknown format - accepted media types include") as raised:
        negotiation.read_body("text/plain", b"{}")
    assert (raised.value.code, raised.value.reason) == (415, "UnsupportedMediaType")
    with pytest.raises(ApiError, match="not valid JSON") as raised:
        negotiation.read_body("application/json", b"{")
    assert raised.value.code == 400
    assert negotiation.read_body("application/yaml", b"spec: {}\n") == {"spec": {}}


def test_kubectls_protobuf_whoami_is_told_who_the_token_is() -> None:
    asked = protobuf.decode(KUBECTL_WHOAMI)
    assert (asked["kind"], asked["apiVersion"]) == ("SelfSubjectReview", "authentication.k8s.io/v1")
    alice = access.User("alice", "42", ("ops", "system:authenticated"))
    assert access.self_review(asked, alice) == {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {},
        "status": {
            "userInfo": {
                "username": "alice",
                "uid": "42",
                "groups": ["ops", "system:authenticated"],
            }
        },
    }
    with pytest.raises(ApiError, match="must be of type SelfSubjectReview"):
        access.self_review({"apiVersion": "authorization.k8s.io/v1"}, alice)
    assert access.self_review({}, access.ANONYMOUS)["status"]["userInfo"] == {
        "username": "system:anonymous",
        "groups": ["system:unauthenticated"],
    }


def test_a_token_file_names_each_tokens_user_as_kube_apiservers_does(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text('# readers\n\n  bare-token  \nt0k3n,alice,42\nt0k3n-2,bob,43,"ops,readers"\n')
    assert access.read_tokens(tokens) == {
        "bare-token": access.User("svledger-reader", "", ("system:authenticated",)),
        "t0k3n": access.User("alice", "42", ("system:authenticated",)),
        "t0k3n-2": access.User("bob", "43", ("ops", "readers", "system:authenticated")),
    }
    tokens.write_text("# nobody\n\n")
    with pytest.raises(ValueError, match="holds no token"):
        access.read_tokens(tokens)
    with pytest.raises(ValueError, match="cannot read token file"):
        access.read_tokens(tmp_path / "missing")
