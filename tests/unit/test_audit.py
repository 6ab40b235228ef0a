"""What etcd stores, counted per resource (:class:`kube.audit.Audit`), on values of a real
cluster (``data/etcd/stored_values.json``, see ``test_stored.py``): protobuf, JSON and
values encrypted at rest by three providers."""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kube.audit import KEPT, Audit, Tally
from kube.protobuf import MAGIC
from kube.store_layout import Layout, Placed, Unplaced
from kube.stored import Reason, StoredObject, Undecodable, decode

CAPTURED: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "etcd" / "stored_values.json").read_text()
)
VALUES = {entry["key"]: base64.b64decode(entry["value"]) for entry in CAPTURED}
CONFIGMAP = VALUES["/registry/configmaps/default/cm"]
WIDGET = VALUES["/registry/capture.svledger.io/widgets/default/w"]
SECRET = VALUES["/registry/secrets/default/secret"]
LAYOUT = Layout.of(
    [
        ("", "configmaps"),
        ("", "secrets"),
        ("", "serviceaccounts"),
        ("", "limitranges"),
        ("coordination.k8s.io", "leases"),
        ("events.k8s.io", "events"),
        ("admissionregistration.k8s.io", "mutatingadmissionpolicies"),
        ("admissionregistration.k8s.io", "mutatingadmissionpolicybindings"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    ],
    [("capture.svledger.io", "widgets")],
)


def audited(pairs: list[tuple[str, bytes]], page: int = 3, keep: int = KEPT) -> Audit:
    audit = Audit(LAYOUT, 42, keep=keep)
    for start in range(0, len(pairs), page):
        audit.add_page(pairs[start : start + page], bytes_read=100)
    return audit


def test_values_of_a_real_cluster_are_counted_by_stored_version_and_encryption_key() -> None:
    audit = audited(list(VALUES.items()))
    assert (audit.revision, audit.keys, audit.pages, audit.bytes_read) == (42, 10, 4, 400)
    assert (audit.unplaced, audit.unplaced_kept) == (0, ())

    def tally(group: str, resource: str, versions: Any = (), encryption: Any = ()) -> Tally:
        (key,) = [key for key in VALUES if f"/{resource}/" in key]
        stored = decode(key, VALUES[key])
        kind = stored.kind if isinstance(stored, StoredObject) else ""
        kinds = tuple((version, kind) for version, _ in versions)
        return Tally(group, resource, 1, len(VALUES[key]), versions, encryption, 0, (), kinds)

    assert audit.tallies == (
        tally("", "configmaps", (("v1", 1),)),
        # created through events.k8s.io/v1: core's storage, as a core Event
        tally("", "events", (("v1", 1),)),
        tally("", "limitranges", encryption=(("secretbox:v1:box-key", 1),)),
        tally("", "secrets", encryption=(("aescbc:v1:key1", 1),)),
        tally("", "serviceaccounts", encryption=(("aesgcm:v1:gcm-key", 1),)),
        tally(
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicies",
            (("admissionregistration.k8s.io/v1", 1),),
        ),
        tally(
            "admissionregistration.k8s.io",
            "mutatingadmissionpolicybindings",
            (("admissionregistration.k8s.io/v1", 1),),
        ),
        # kept as v1beta1, which kube-apiserver has not served since 1.22
        tally(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            (("apiextensions.k8s.io/v1beta1", 1),),
        ),
        tally("capture.svledger.io", "widgets", (("capture.svledger.io/v1", 1),)),
        tally("coordination.k8s.io", "leases", (("coordination.k8s.io/v1", 1),)),
    )


def test_undecodable_values_are_counted_by_key_with_their_reason_and_the_scan_goes_on() -> None:
    pairs = [
        ("/registry/configmaps/ns/a", CONFIGMAP),
        ("/registry/configmaps/ns/cut", CONFIGMAP[:-10]),
        ("/registry/configmaps/ns/empty", b""),
        ("/registry/configmaps/ns/z", CONFIGMAP),
        ("/registry/capture.svledger.io/widgets/ns/cut", WIDGET[: len(WIDGET) // 2]),
        ("/registry/capture.svledger.io/widgets/ns/w", WIDGET),
        ("/registry/secrets/ns/s", SECRET),
        ("/registry/secrets/ns/bad", b"k8s:enc:aescbc:v9:key1:x"),
    ]
    audit = audited(pairs)
    configmaps, secrets, widgets = audit.tallies
    assert (configmaps.objects, configmaps.versions, configmaps.undecodable) == (4, (("v1", 2),), 2)
    assert configmaps.bytes == 3 * len(CONFIGMAP) - 10
    assert [(bad.key, bad.reason) for bad in configmaps.undecodable_kept] == [
        ("/registry/configmaps/ns/cut", Reason.CORRUPT_PROTOBUF),
        ("/registry/configmaps/ns/empty", Reason.EMPTY),
    ]
    assert [(bad.key, bad.reason) for bad in widgets.undecodable_kept] == [
        ("/registry/capture.svledger.io/widgets/ns/cut", Reason.CORRUPT_JSON)
    ]
    assert (widgets.objects, widgets.versions) == (2, (("capture.svledger.io/v1", 1),))
    assert (secrets.objects, secrets.encryption, secrets.undecodable) == (
        2,
        (("aescbc:v1:key1", 1),),
        1,
    )
    assert secrets.undecodable_kept[0].reason == Reason.UNKNOWN_ENCRYPTION


def test_only_the_first_undecodable_values_and_unplaced_keys_by_key_are_kept() -> None:
    cut = CONFIGMAP[:10]
    pairs = [(f"/registry/configmaps/ns/{name}", cut) for name in "dbeac"]
    pairs += [(f"/registry/pods/ns/{name}", CONFIGMAP) for name in "dbeac"]
    audit = audited(pairs, page=2, keep=2)
    (configmaps,) = audit.tallies
    assert configmaps.undecodable == configmaps.objects == 5
    assert [bad.key for bad in configmaps.undecodable_kept] == [
        "/registry/configmaps/ns/a",
        "/registry/configmaps/ns/b",
    ]
    assert audit.unplaced == 5
    assert audit.unplaced_kept == (
        LAYOUT.place("/registry/pods/ns/a"),
        LAYOUT.place("/registry/pods/ns/b"),
    )
    assert all(isinstance(unplaced, Unplaced) for unplaced in audit.unplaced_kept)
    assert Audit(LAYOUT, 1, keep=0).unplaced_kept == ()


def test_keys_that_hold_no_object_are_counted_apart_with_why() -> None:
    audit = audited(
        [
            ("/registry/configmaps/ns/a", CONFIGMAP),
            ("/registry/masterleases/10.0.0.1", CONFIGMAP),
            ("/registry/ranges/servicenodeports", CONFIGMAP),
            ("/registry/configmaps/ns/a/b", CONFIGMAP),
            ("/registry/configmaps/ns/", CONFIGMAP),
            ("/elsewhere/configmaps/ns/a", CONFIGMAP),
        ]
    )
    assert [tally.objects for tally in audit.tallies] == [1]
    shape = "under the prefix of configmaps, but not followed by <namespace>/<name> or <name>"
    assert [(unplaced.key, unplaced.reason.split(":")[0]) for unplaced in audit.unplaced_kept] == [
        ("/elsewhere/configmaps/ns/a", "outside the prefix /registry"),
        ("/registry/configmaps/ns/", shape),
        ("/registry/configmaps/ns/a/b", shape),
        ("/registry/masterleases/10.0.0.1", "not an object"),
        ("/registry/ranges/servicenodeports", "not an object"),
    ]


def test_an_empty_page_is_a_request_too() -> None:
    audit = Audit(LAYOUT, 7)
    audit.add_page([], bytes_read=12)
    audit.add_page(iter([("/registry/configmaps/ns/a", CONFIGMAP)]), bytes_read=300)
    assert (audit.pages, audit.bytes_read, audit.keys) == (2, 312, 1)


KEYS = st.sampled_from(
    [
        "/registry/configmaps/ns/",
        "/registry/configmaps/",
        "/registry/capture.svledger.io/widgets/",
        "/registry/secrets/ns/",
        "/registry/events/ns/",
        "/registry/leases/ns/",
        "/registry/pods/ns/",
        "/registry/ranges/",
        "/registry/capture.svledger.io/",
        "/registry/",
        "/other/",
        "",
    ]
).flatmap(lambda folder: st.text("abc/", max_size=4).map(lambda name: folder + name))
BYTES = st.sampled_from([*VALUES.values(), b"", MAGIC, b"{", b"k8s:enc:"]).flatmap(
    lambda value: st.integers(0, len(value)).map(lambda cut: value[:cut])
) | st.binary(max_size=30)


@given(
    st.lists(st.tuples(KEYS, BYTES), max_size=40, unique_by=lambda pair: pair[0]),  # as in etcd
    st.integers(1, 8),
    st.randoms(),
)
def test_every_pair_is_counted_once_whatever_the_pages_and_their_order(
    pairs: list[tuple[str, bytes]], page: int, shuffle: random.Random
) -> None:
    audit = audited(pairs, page=page, keep=3)
    tallies = audit.tallies
    assert audit.keys == len(pairs) == audit.unplaced + sum(tally.objects for tally in tallies)
    for tally in tallies:
        counted = sum(n for _, n in tally.versions) + sum(n for _, n in tally.encryption)
        assert tally.objects == counted + tally.undecodable
        assert len(tally.undecodable_kept) == min(3, tally.undecodable)
        assert all(isinstance(bad, Undecodable) for bad in tally.undecodable_kept)
    # each key where the layout places it
    placed = Counter(
        (where.group, where.resource)
        for where in map(LAYOUT.place, (key for key, _ in pairs))
        if isinstance(where, Placed)
    )
    assert {(tally.group, tally.resource): tally.objects for tally in tallies} == placed
    # the same pairs, in another order and other pages: the same counts and kept keys
    shuffled = list(pairs)
    shuffle.shuffle(shuffled)
    again = audited(shuffled, page=page + 1, keep=3)
    assert (again.tallies, again.unplaced, again.unplaced_kept) == (
        tallies,
        audit.unplaced,
        audit.unplaced_kept,
    )
