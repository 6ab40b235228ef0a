"""Which resource an etcd key holds (:mod:`kube.store_layout`), on keys of real clusters.

``data/etcd/store_keys.json`` holds, per release (v1.36.3 and v1.37.2), keys a real
kube-apiserver wrote (etcd and one kube-apiserver of :class:`deploy.kube.cluster.LocalCluster`
with ``--endpoint-reconciler-type=lease``, an advertise address off loopback and a 5 s
``--etcd-compaction-interval``, and a kube-controller-manager running every default
controller), after objects of most kinds were created: deployments, services, endpoints,
an ingress, a node, a replication controller, events through both groups, two
CustomResourceDefinitions (one namespaced, one cluster-scoped) and their custom resources,
an APIService, and others. With each key, the resources whose list (through the API) holds
the object (empty for keys that hold none), the resources whose discovery shows a
``storageVersionHash`` (the ones the ledger knows) and the custom ones. Every key of those
clusters was checked so; the file keeps a few per resource, and every key holding no
object, ``compact_rev_key`` at the root included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kube.store_layout import (
    COMPACT_REV_KEY,
    GroupResource,
    Layout,
    Placed,
    Unplaced,
    prefix_end,
)

CAPTURED: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "etcd" / "store_keys.json").read_text()
)
EVENTS: GroupResource = ("", "events")
NEW_EVENTS: GroupResource = ("events.k8s.io", "events")
WIDGETS: GroupResource = ("example.com", "widgets")  # namespaced
GADGETS: GroupResource = ("example.com", "gadgets")  # cluster-scoped
BUILT_IN: list[GroupResource] = [
    ("", "pods"),
    ("", "nodes"),
    ("", "services"),
    ("", "endpoints"),
    ("", "replicationcontrollers"),
    ("", "namespaces"),
    EVENTS,
    NEW_EVENTS,
    ("apps", "deployments"),
    ("networking.k8s.io", "ingresses"),
    ("networking.k8s.io", "ingressclasses"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("apiregistration.k8s.io", "apiservices"),
]
LAYOUT = Layout.of(BUILT_IN, [WIDGETS, GADGETS])


def layout_of(version: str) -> Layout:
    captured = CAPTURED[version]
    return Layout.of(
        [tuple(pair) for pair in captured["resources"]],
        [tuple(pair) for pair in captured["custom"]],
    )


def key_of(layout: Layout, placed: Placed) -> str:
    """The key kube-apiserver stores ``placed`` under."""
    (prefix,) = layout.prefixes([(placed.group, placed.resource)])
    return prefix + (f"{placed.namespace}/" if placed.namespace else "") + placed.name


@pytest.mark.parametrize("version", sorted(CAPTURED))
def test_every_key_of_a_real_cluster_is_placed_as_its_api_lists_it(version: str) -> None:
    layout = layout_of(version)
    not_objects = []
    prefixes = set()
    for key, listed_as in CAPTURED[version]["keys"]:
        placed = layout.place(key)
        if not listed_as:
            assert isinstance(placed, Unplaced), key
            assert placed.reason.startswith("not an object: "), placed
            not_objects.append(key.rsplit("/", 1)[0] if "/" in key else key)
            continue
        assert isinstance(placed, Placed), placed
        # an Event is listed by both groups, and stored as the core group's
        owners = {tuple(pair) for pair in listed_as}
        assert (placed.group, placed.resource) == (EVENTS if len(owners) > 1 else owners.pop())
        assert key_of(layout, placed) == key
        prefixes.add(layout.prefixes_of[(placed.group, placed.resource)])
    assert prefixes >= {
        "controllers",
        "services/endpoints",
        "minions",
        "services/specs",
        "ingress",
        "events",
        "deployments",
        "apiextensions.k8s.io/customresourcedefinitions",
        "apiregistration.k8s.io/apiservices",
        "audit.svledger.io/widgets",  # namespaced
        "audit.svledger.io/gadgets",  # cluster-scoped
    }
    # the NodePort range only: the service IP range is an IPAddress object per address
    # since the MultiCIDRServiceAllocator (its dual write locked off on these releases)
    assert not_objects == [
        "/registry/masterleases",
        "/registry/peerserverleases",
        "/registry/ranges",
        COMPACT_REV_KEY,
    ]


@pytest.mark.parametrize(
    ("key", "placed"),
    [
        ("/registry/controllers/ns/rc", Placed("", "replicationcontrollers", "ns", "rc")),
        ("/registry/services/endpoints/ns/web", Placed("", "endpoints", "ns", "web")),
        ("/registry/minions/node-1", Placed("", "nodes", None, "node-1")),
        (
            "/registry/services/specs/default/kubernetes",
            Placed("", "services", "default", "kubernetes"),
        ),
        ("/registry/ingress/ns/ing", Placed("networking.k8s.io", "ingresses", "ns", "ing")),
        ("/registry/deployments/default/web", Placed("apps", "deployments", "default", "web")),
        ("/registry/pods/ns/p", Placed("", "pods", "ns", "p")),
        ("/registry/namespaces/kube-system", Placed("", "namespaces", None, "kube-system")),
        (
            "/registry/ingressclasses/nginx",
            Placed("networking.k8s.io", "ingressclasses", None, "nginx"),
        ),
        (
            "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com",
            Placed(
                "apiextensions.k8s.io", "customresourcedefinitions", None, "widgets.example.com"
            ),
        ),
        (
            "/registry/apiregistration.k8s.io/apiservices/v1.apps",
            Placed("apiregistration.k8s.io", "apiservices", None, "v1.apps"),
        ),
        ("/registry/example.com/widgets/ns/w", Placed("example.com", "widgets", "ns", "w")),
        ("/registry/example.com/gadgets/g", Placed("example.com", "gadgets", None, "g")),
    ],
)
def test_a_key_names_its_resource_namespace_and_name(key: str, placed: Placed) -> None:
    assert LAYOUT.place(key) == placed
    assert key_of(LAYOUT, placed) == key


def test_events_of_both_groups_are_placed_under_the_core_resource_that_stores_them() -> None:
    assert LAYOUT.place("/registry/events/ns/e") == Placed("", "events", "ns", "e")
    assert LAYOUT.prefixes([NEW_EVENTS]) == LAYOUT.prefixes([EVENTS]) == ("/registry/events/",)
    # known only as events.k8s.io, the key is still core's storage
    only_new = Layout.of([NEW_EVENTS])
    assert only_new.place("/registry/events/ns/e") == Placed("", "events", "ns", "e")
    assert only_new.prefixes([EVENTS]) == ("/registry/events/",)
    # the extensions group's copies of ingresses share the networking.k8s.io prefix
    ingresses = Layout.of([("extensions", "ingresses"), ("networking.k8s.io", "ingresses")])
    assert ingresses.place("/registry/ingress/ns/i") == Placed(
        "networking.k8s.io", "ingresses", "ns", "i"
    )


@pytest.mark.parametrize(
    ("key", "what"),
    [
        ("/registry/ranges/serviceips", "the service IP allocator's range"),
        ("/registry/ranges/secondaryserviceips", "dual-stack"),
        ("/registry/ranges/servicenodeports", "the NodePort allocator's range"),
        ("/registry/masterleases/10.0.0.1", "--endpoint-reconciler-type=lease"),
        ("/registry/peerserverleases/apiserver-g5kfpqajuockav766sai746cbm", "mixed-version proxy"),
        ("/registry/health", "health checks"),
        (COMPACT_REV_KEY, "compacted"),
    ],
)
def test_keys_kube_apiserver_keeps_beside_the_objects_are_named(key: str, what: str) -> None:
    why = reason(LAYOUT, key)
    assert why.startswith("not an object: ") and what in why, why


def reason(layout: Layout, key: str) -> str:
    placed = layout.place(key)
    assert isinstance(placed, Unplaced), placed
    assert placed.key == key
    return placed.reason


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("/registry/leases/ns/l", "under no resource the ledger knows (it knows a resource once"),
        ("/registry/other.io/things/t", "under no resource the ledger knows"),
        ("/registry/ranges/other", "under no resource the ledger knows"),
        ("/registry/masterleases/a/b", "under no resource the ledger knows"),
        ("/registry/", "under no resource the ledger knows"),
        ("/registryx/pods/ns/p", "outside the prefix /registry"),
        ("/other/pods/ns/p", "outside the prefix /registry"),
        ("registry/pods/ns/p", "outside the prefix /registry"),
        ("", "outside the prefix /registry"),
        ("/registry/pods/ns/p/extra", "under the prefix of pods, but not followed by"),
        ("/registry/pods/ns/", "under the prefix of pods, but not followed by"),
        ("/registry/pods//p", "under the prefix of pods, but not followed by"),
        ("/registry/pods", "under the prefix of pods, but not followed by"),
        ("/registry/services/specs", "under no resource the ledger knows"),
        ("/registry/example.com/widgets/ns/w/x", "under the prefix of widgets.example.com"),
    ],
)  # fmt: skip
def test_a_key_of_no_resource_the_layout_knows_says_why(key: str, why: str) -> None:
    assert reason(LAYOUT, key).startswith(why)


@pytest.mark.parametrize(
    "prefix", ["/kubernetes.io", "kubernetes.io", "/kubernetes.io/", "//kubernetes.io"]
)
def test_another_etcd_prefix_is_read_as_kube_apiserver_joins_it(prefix: str) -> None:
    layout = Layout.of([("", "pods")], prefix=prefix)
    assert (layout.root, layout.prefix) == ("/kubernetes.io/", "/kubernetes.io")
    assert layout.place("/kubernetes.io/pods/ns/p") == Placed("", "pods", "ns", "p")
    assert layout.place("/registry/pods/ns/p") == Unplaced(
        "/registry/pods/ns/p", "outside the prefix /kubernetes.io"
    )
    assert reason(layout, "/kubernetes.io/ranges/servicenodeports").startswith("not an object")
    assert layout.prefixes([("", "pods")]) == ("/kubernetes.io/pods/",)


def test_an_empty_etcd_prefix_is_the_root() -> None:
    layout = Layout.of([("", "pods")], prefix="")
    assert (layout.root, layout.prefix) == ("/", "/")
    assert layout.place("/pods/ns/p") == Placed("", "pods", "ns", "p")
    assert reason(layout, COMPACT_REV_KEY).startswith("not an object")


def test_the_prefixes_to_read_for_some_resources_end_in_a_slash_and_do_not_overlap() -> None:
    layout = Layout.of([("", "pods"), ("", "podtemplates"), ("", "services"), ("", "endpoints")])
    assert layout.prefixes() == ("/registry/",)
    assert layout.prefixes([("", "pods"), ("", "services"), ("", "endpoints"), ("", "pods")]) == (
        "/registry/pods/",
        "/registry/services/endpoints/",
        "/registry/services/specs/",
    )
    assert layout.prefixes([]) == ()
    # one resource's prefix inside another's (a custom group named like a built-in
    # resource): reading the outer one reads both
    nested = Layout.of([("", "things")], [("things", "parts")])
    assert nested.prefixes([("", "things"), ("things", "parts")]) == ("/registry/things/",)
    with pytest.raises(ValueError, match=r"'widgets.other.io' is none the ledger knows"):
        LAYOUT.prefixes([("other.io", "widgets")])


def test_resources_that_cannot_share_a_prefix_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"pods and pods.metrics.k8s.io would both be stored under /registry/pods/"
    ):
        Layout.of([("", "pods"), ("metrics.k8s.io", "pods")])
    # as a custom resource, it has a prefix of its own
    assert Layout.of([("", "pods")], [("metrics.k8s.io", "pods")]).prefixes(
        [("metrics.k8s.io", "pods")]
    ) == ("/registry/metrics.k8s.io/pods/",)
    for bad in [("", ""), ("", "a/b"), ("a/b", "c")]:
        with pytest.raises(ValueError, match="neither with '/'"):
            Layout.of([bad])
    with pytest.raises(ValueError, match="non-empty for a custom resource"):
        Layout.of([], [("", "widgets")])


SEGMENTS = st.sampled_from(
    [
        "registry", "pods", "services", "specs", "endpoints", "minions", "events", "ns", "p",
        "example.com", "widgets", "gadgets", "ranges", "serviceips", "masterleases",
        "compact_rev_key", "health", "", ".", "..",
    ]
) | st.text(max_size=8)  # fmt: skip


@given(st.lists(SEGMENTS, max_size=7), st.booleans())
def test_placing_any_key_never_raises_and_a_placed_key_is_where_its_object_is_stored(
    segments: list[str], rooted: bool
) -> None:
    key = ("/" if rooted else "") + "/".join(segments)
    placed = LAYOUT.place(key)
    if isinstance(placed, Placed):
        assert key_of(LAYOUT, placed) == key
    else:
        assert placed.key == key and placed.reason


NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)


@given(st.sampled_from([*BUILT_IN, WIDGETS, GADGETS]), st.none() | NAMES, NAMES)
def test_every_object_key_is_placed_back_to_its_object(
    group_resource: GroupResource, namespace: str | None, name: str
) -> None:
    owner = EVENTS if group_resource == NEW_EVENTS else group_resource
    placed = Placed(*owner, namespace, name)
    assert LAYOUT.place(key_of(LAYOUT, placed)) == placed


def test_the_end_of_a_prefix_is_the_first_key_after_every_key_under_it() -> None:
    assert prefix_end(b"/registry/pods/") == b"/registry/pods0"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"  # no key is after every one: read them all
