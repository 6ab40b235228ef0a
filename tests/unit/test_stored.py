"""The etcd value decoder (:mod:`kube.stored`) on values captured from a real cluster.

``data/etcd/stored_values.json`` holds values kube-apiserver v1.37.2 wrote to etcd, with
what its API returned for each object and the ``storageVersionHash`` its discovery showed
for the resource; ``tests/capture_stored_values.py`` captures them again.
"""

from __future__ import annotations

import base64
import collections
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube.protobuf import MAGIC
from kube.stored import (
    ENCRYPTED,
    EncryptedValue,
    Provider,
    ProviderVersion,
    Reason,
    Stored,
    StoredObject,
    Undecodable,
    decode,
)
from ledger.hashing import hash_of_stored

CAPTURED: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "etcd" / "stored_values.json").read_text()
)
VALUES = {entry["key"]: base64.b64decode(entry["value"]) for entry in CAPTURED}
IN_THE_CLEAR = [entry for entry in CAPTURED if entry["encoding"] != "encrypted"]
ENCRYPTED_AT_REST = [entry for entry in CAPTURED if entry["encoding"] == "encrypted"]
PROTOBUF = [entry["key"] for entry in CAPTURED if entry["encoding"] == "protobuf"]
JSON = [entry["key"] for entry in CAPTURED if entry["encoding"] == "json"]
CONFIGMAP = "/registry/configmaps/default/cm"
WIDGET = "/registry/capture.svledger.io/widgets/default/w"
CRD = "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.capture.svledger.io"


def decoded_object(key: str, value: bytes) -> StoredObject:
    result = decode(key, value)
    assert isinstance(result, StoredObject), result
    return result


def undecodable(key: str, value: bytes) -> Undecodable:
    result = decode(key, value)
    assert isinstance(result, Undecodable), result
    return result


def test_the_captures_hold_every_encoding() -> None:
    assert collections.Counter(entry["encoding"] for entry in CAPTURED) == {
        "protobuf": 5,
        "json": 2,
        "encrypted": 3,
    }
    assert VALUES[CONFIGMAP].startswith(MAGIC)  # the harness's JSON flag was overridden


@pytest.mark.parametrize("entry", IN_THE_CLEAR, ids=lambda entry: entry["key"])
def test_a_value_decodes_to_the_version_discovery_says_it_is_stored_in(
    entry: dict[str, Any],
) -> None:
    found = decoded_object(entry["key"], VALUES[entry["key"]])
    assert found.key == entry["key"]
    assert found.encoding == entry["encoding"]
    assert hash_of_stored(found.api_version, found.kind) == entry["storageVersionHash"]
    returned = entry["returned"]
    if hash_of_stored(returned["apiVersion"], returned["kind"]) == entry["storageVersionHash"]:
        # Read in the version it is stored in, the API returns what the value holds.
        assert (found.api_version, found.kind) == (returned["apiVersion"], returned["kind"])


def test_an_object_can_be_stored_in_another_group_and_in_a_version_no_longer_served() -> None:
    event = decoded_object(
        "/registry/events/default/event", VALUES["/registry/events/default/event"]
    )
    # created through events.k8s.io/v1, stored as a core Event
    assert (event.group, event.version, event.kind) == ("", "v1", "Event")
    crd = decoded_object(CRD, VALUES[CRD])
    # kube-apiserver keeps CRDs in JSON, as v1beta1, which it has not served since 1.22
    assert (crd.encoding, crd.api_version) == ("json", "apiextensions.k8s.io/v1beta1")
    assert next(e for e in CAPTURED if e["key"] == CRD)["returned"] == {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
    }
    widget = decoded_object(WIDGET, VALUES[WIDGET])
    # created through v1beta1, stored in the CRD's storage version
    assert (widget.encoding, widget.group, widget.version) == ("json", "capture.svledger.io", "v1")


@pytest.mark.parametrize("entry", ENCRYPTED_AT_REST, ids=lambda entry: entry["key"])
def test_an_encrypted_value_names_its_provider_and_key(entry: dict[str, Any]) -> None:
    expected = entry["encryption"]
    assert decode(entry["key"], VALUES[entry["key"]]) == EncryptedValue(
        entry["key"], expected["provider"], expected["providerVersion"], expected["keyName"]
    )
    assert EncryptedValue.encoding == "encrypted"


@pytest.mark.parametrize(
    ("value", "provider", "version", "name"),
    [
        (b"k8s:enc:kms:v1:vault:\x00\x01", "kms", "v1", "vault"),
        (b"k8s:enc:kms:v2:cloud-kms:\n\x10ciphertext", "kms", "v2", "cloud-kms"),
        (b"k8s:enc:aesgcm:v1:key2:", "aesgcm", "v1", "key2"),  # nothing after: still read
        # upstream allows ':' in this name; the bytes alone cannot tell where it ends
        (b"k8s:enc:secretbox:v1:a:b:\xff", "secretbox", "v1", "a"),
    ],
)
def test_every_upstream_encryption_prefix_is_read(
    value: bytes, provider: Provider, version: ProviderVersion, name: str
) -> None:
    assert decode("/registry/secrets/ns/s", value) == EncryptedValue(
        "/registry/secrets/ns/s", provider, version, name
    )


@pytest.mark.parametrize("key", PROTOBUF)
def test_a_protobuf_value_cut_anywhere_is_undecodable(key: str) -> None:
    value = VALUES[key]
    for length in range(len(value)):
        result = undecodable(key, value[:length])
        assert result.key == key
        assert result.reason in {
            Reason.EMPTY,
            Reason.UNKNOWN_ENCODING,  # cut inside the magic
            Reason.CORRUPT_PROTOBUF,
        }, (length, result)


@pytest.mark.parametrize("key", JSON)
def test_a_json_value_cut_anywhere_is_undecodable(key: str) -> None:
    value = VALUES[key]
    assert value.endswith(b"}\n")
    for length in range(1, len(value) - 1):  # all but the final newline
        assert undecodable(key, value[:length]).reason == Reason.CORRUPT_JSON, length


def test_an_encrypted_value_cut_in_its_prefix_is_undecodable() -> None:
    key = "/registry/secrets/default/secret"
    value = VALUES[key]
    assert value.startswith(b"k8s:enc:aescbc:v1:key1:")
    for length in range(len(ENCRYPTED), len(b"k8s:enc:aescbc:v1:key1")):
        assert undecodable(key, value[:length]).reason == Reason.UNKNOWN_ENCRYPTION, length


def test_corrupt_protobuf_values_say_why() -> None:
    value = VALUES[CONFIGMAP]
    # k8s\0, then field 1 (typeMeta): tag 0x0a, its length, "\n\x02v1" (apiVersion), ...,
    # and last fields 3 and 4 (contentEncoding, contentType), empty
    assert (value[4:8], value[-4:]) == (b"\x0a\x0f\x0a\x02", b"\x1a\x00\x22\x00")
    cases = {
        b"k8z\x00" + value[4:]: (Reason.UNKNOWN_ENCODING, "starts with none of"),
        value[:5] + b"\x7f" + value[6:]: (Reason.CORRUPT_PROTOBUF, "truncated or corrupt"),
        value.replace(b"ConfigMap", b"Config\xffap"): (Reason.CORRUPT_PROTOBUF, "not UTF-8"),
        value.replace(b"\x0a\x02v1", b"\x0a\x02/1"): (Reason.MISSING_TYPE, "apiVersion"),
        # cut between two fields: valid protobuf, but kube-apiserver ends with contentType
        value[:-2]: (Reason.CORRUPT_PROTOBUF, "ends before its contentType"),
        MAGIC + value[4:21]: (Reason.CORRUPT_PROTOBUF, "ends before its contentType"),
        MAGIC + b"\x12\x02\x0a\x00\x1a\x00\x22\x00": (
            Reason.MISSING_TYPE,
            "typeMeta has no apiVersion",
        ),
    }
    for broken, (reason, why) in cases.items():
        result = undecodable(CONFIGMAP, broken)
        assert (result.reason, result.key) == (reason, CONFIGMAP)
        assert why in result.detail, result.detail
        assert str(result).startswith(f"{CONFIGMAP}: {reason}: ")


@pytest.mark.parametrize(
    ("value", "reason", "why"),
    [
        (b"", Reason.EMPTY, "empty"),
        (b'{"kind": "Widget", "metadata": {}}', Reason.MISSING_TYPE, "no apiVersion"),
        (b'{"apiVersion": "v1", "kind": ""}', Reason.MISSING_TYPE, "no kind"),
        (b'{"apiVersion": 1, "kind": "Pod"}', Reason.MISSING_TYPE, "holds 1"),
        (b'{"apiVersion": "a/b/c", "kind": "Pod"}', Reason.MISSING_TYPE, "'a/b/c'"),
        (b'{"apiVersion": "v1", "kind": "a/Pod"}', Reason.MISSING_TYPE, "contains '/'"),
        (b'{"apiVersion": "v1"', Reason.CORRUPT_JSON, "not JSON"),
        (b'{"apiVersion": "v\xff1"}', Reason.CORRUPT_JSON, "not JSON"),
        (b"{" * 100_000, Reason.CORRUPT_JSON, "not JSON"),
        (b"[1]", Reason.UNKNOWN_ENCODING, "b'[1]'"),
        (b"apiVersion: v1\nkind: Pod\n", Reason.UNKNOWN_ENCODING, "(protobuf)"),
        (b"\xd9\xd9\xf7\xa1", Reason.UNSUPPORTED_ENCODING, "CBOR"),
        (b"k8s:enc:aescbc:v2:key1:x", Reason.UNKNOWN_ENCRYPTION, "none of upstream's"),
        (b"k8s:enc:identity:v1:x:", Reason.UNKNOWN_ENCRYPTION, "b'identity'"),
        (b"k8s:enc:aescbc:v1::x", Reason.UNKNOWN_ENCRYPTION, "<provider>:<version>:<name>:"),
    ],
)
def test_values_that_are_no_stored_object_say_why(value: bytes, reason: Reason, why: str) -> None:
    result = undecodable("/registry/k", value)
    assert result.reason == reason
    assert why in result.detail, result.detail
    assert len(result.detail) < 300  # a huge value is not copied into the message


def test_a_scan_reports_each_undecodable_value_by_key_and_counts_the_rest() -> None:
    store = dict(VALUES)
    store["/registry/configmaps/default/cut"] = VALUES[CONFIGMAP][:-10]
    store["/registry/widgets/default/cut"] = VALUES[WIDGET][:-10]
    store["/registry/configmaps/default/empty"] = b""
    counts: collections.Counter[str] = collections.Counter()
    problems = []
    for key, value in store.items():
        match decode(key, value):
            case StoredObject(api_version=version, kind=kind):
                counts[f"{version} {kind}"] += 1
            case EncryptedValue(provider=provider, key_name=name):
                counts[f"{provider} {name}"] += 1
            case Undecodable() as bad:
                problems.append(bad.key)
    assert sorted(problems) == [
        "/registry/configmaps/default/cut",
        "/registry/configmaps/default/empty",
        "/registry/widgets/default/cut",
    ]
    assert counts.total() == len(VALUES)
    assert counts["aescbc key1"] == 1


def decodes_or_reports(value: bytes) -> Stored:
    result = decode("/registry/k", value)
    assert isinstance(result, StoredObject | EncryptedValue | Undecodable)
    assert result.key == "/registry/k"
    return result


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(value: bytes) -> None:
    decodes_or_reports(value)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([MAGIC, b"{", ENCRYPTED, b"k8s:enc:kms:v2:", *VALUES.values()]),
    st.binary(max_size=200),
    st.integers(min_value=0, max_value=2000),
)
def test_arbitrary_bytes_after_or_inside_a_real_start_never_raise(
    start: bytes, tail: bytes, cut: int
) -> None:
    decodes_or_reports(start[:cut] + tail)
    decodes_or_reports(start + tail)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(), st.lists, max_leaves=20))
def test_arbitrary_json_never_raises(document: Any) -> None:
    decodes_or_reports(json.dumps({"apiVersion": document, "kind": document}).encode())
