"""The apiserver ID and lease holder identity agree with Kubernetes."""

from __future__ import annotations

import base64
import hashlib
import re
import typing
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.identity import apiserver_id, holder_identity
from ledger.kafka import EventProducer
from ledger.reporter import Reporter

HOSTNAMES = st.text(st.characters(codec="utf-8"), max_size=300)


def upstream_id(hostname: str) -> str:
    """The definition in kubernetes' NewConfig (k8s.io/apiserver/pkg/server/config.go)."""
    host = hostname.encode("utf-8")
    name = b"kube-apiserver"
    data = len(host).to_bytes(2, "big") + host + len(name).to_bytes(2, "big") + name
    encoded = base64.b32encode(hashlib.sha256(data).digest()[:16]).decode()
    return "apiserver-" + encoded.replace("=", "").lower()


def test_agrees_with_a_lease_seen_on_a_real_cluster() -> None:
    # `kubectl -n kube-system get leases` on a minikube node (hostname "minikube").
    assert apiserver_id("minikube") == "apiserver-eqt674mfxb4j56mrjjkoe7b7ii"


def test_the_empty_hostname_has_upstreams_id_too() -> None:
    # Computed by upstream's code (Go) for an empty hostname; a user who gives one is
    # refused by the reporter and the CLI, not by the definition.
    assert apiserver_id("") == "apiserver-2ikcnb3wory4bpirwz777r2iv4"


@given(HOSTNAMES)
def test_agrees_with_the_upstream_definition(hostname: str) -> None:
    assert apiserver_id(hostname) == upstream_id(hostname)


@given(HOSTNAMES)
def test_is_a_valid_lease_name(hostname: str) -> None:
    assert re.fullmatch(r"apiserver-[a-z2-7]{26}", apiserver_id(hostname))


@given(st.lists(HOSTNAMES, min_size=2, max_size=2, unique=True))
def test_different_hosts_get_different_ids(hostnames: list[str]) -> None:
    first, second = hostnames
    assert apiserver_id(first) != apiserver_id(second)


def test_the_holder_identity_is_the_id_and_the_instance_uuid() -> None:
    instance = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
    assert (
        holder_identity("apiserver-abc", instance)
        == "apiserver-abc_0f8fad5b-d9cb-469f-a165-70867728950e"
    )


def test_every_start_gets_a_new_holder_identity_of_the_same_id() -> None:
    first, second = holder_identity("apiserver-abc"), holder_identity("apiserver-abc")
    assert first != second
    for holder in (first, second):
        prefix, _, instance = holder.partition("_")
        assert prefix == "apiserver-abc"
        assert str(uuid.UUID(instance)) == instance


def test_a_hostname_upstream_cannot_hash_is_refused() -> None:
    # Go's cryptobyte cannot length-prefix it either.
    with pytest.raises(ValueError, match="70000 bytes"):
        apiserver_id("h" * 70_000)


def test_a_reporter_refuses_an_empty_hostname() -> None:
    with pytest.raises(ValueError, match="hostname is empty"):
        Reporter("east", "", [], producer=typing.cast(EventProducer, None))
