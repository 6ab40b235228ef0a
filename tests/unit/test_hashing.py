"""The storage version hash agrees with Kubernetes."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.hashing import storage_version_hash

# Published by kubernetes/kubernetes in pkg/controlplane/storageversionhashdata
# (the hashes discovery must keep showing for the built-in storage versions).
UPSTREAM = [
    ("", "v1", "Pod", "xPOwRZ+Yhw8="),
    ("", "v1", "Event", "r2yiGXH7wu8="),
    ("apps", "v1", "Deployment", "8aSe+NMegvE="),
    ("batch", "v1", "Job", "mudhfqk/qZY="),
    ("coordination.k8s.io", "v1", "Lease", "gqkMMb/YqFM="),
]

PART = st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1)


@pytest.mark.parametrize(("group", "version", "kind", "expected"), UPSTREAM)
def test_agrees_with_the_hashes_kubernetes_publishes(
    group: str, version: str, kind: str, expected: str
) -> None:
    assert storage_version_hash(group, version, kind) == expected


@given(group=PART | st.just(""), version=PART, kind=PART)
def test_is_base64_of_the_first_8_bytes_of_sha256_of_group_version_kind(
    group: str, version: str, kind: str
) -> None:
    digest = hashlib.sha256((group + "/" + version + "/" + kind).encode("utf-8")).digest()
    assert storage_version_hash(group, version, kind) == base64.b64encode(digest[:8]).decode()


@given(version=PART, kind=PART)
def test_core_is_an_alias_for_the_empty_core_group(version: str, kind: str) -> None:
    assert storage_version_hash("core", version, kind) == storage_version_hash("", version, kind)


@pytest.mark.parametrize(
    ("group", "version", "kind", "named"),
    [
        ("apps/v1", "v1", "Deployment", "group 'apps/v1'"),
        ("apps", "v1/beta", "Deployment", "version 'v1/beta'"),
        ("apps", "v1", "", "kind is empty"),
        ("apps", "", "Deployment", "version is empty"),
    ],
)
def test_ambiguous_input_is_refused_with_the_value_named(
    group: str, version: str, kind: str, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        storage_version_hash(group, version, kind)
