"""Content negotiation in the read API, against upstream's ``TestTransform`` cases.

The first tests ask :func:`readapi.negotiation.negotiate` alone; the rest ask the
served API (:mod:`tests.served`) over HTTP: ``PartialObjectMetadata`` and its list,
Tables in ``v1beta1``, YAML, and the 406 and 400 answers upstream gives.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st

from readapi.ledger import LedgerViews
from readapi.negotiation import Output, negotiate
from readapi.status import ApiError
from tests.served import CLUSTER, LEASES, STORAGE_VERSIONS, watch

SERVED_TYPES = "only the following media types are accepted: application/json, application/yaml"
STREAMED_TYPES = "only the following media types are accepted: application/json;stream=watch"
TABLE_V1BETA1 = "application/json;as=Table;g=meta.k8s.io;v=v1beta1"
PARTIAL = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("", Output()),
        ("*/*", Output()),
        ("application/*", Output()),
        ("application/json;charset=utf-8", Output()),
        ("application/vnd.kubernetes.protobuf,application/json", Output()),
        ("application/yaml", Output("application/yaml")),
        ("application/yaml;q=0.5,application/json", Output()),
        ("application/json;q=0.1,application/yaml", Output("application/yaml")),
        ("*/*,application/yaml", Output("application/yaml")),  # the concrete type first
        ("application/json;stream=watch", Output()),
        ("application/yaml;stream=watch,application/json", Output()),  # YAML cannot stream
        ("application/json;sv=v2,application/yaml", Output("application/yaml")),
        (TABLE_V1BETA1, Output("application/json", "Table", "v1beta1")),
        ("application/yaml;as=Table;g=meta.k8s.io;v=v1", Output("application/yaml", "Table")),
        (PARTIAL_LIST, Output("application/json", "PartialObjectMetadataList", "v1beta1")),
        (
            # kubectl get: a Table, or plain JSON from a server without Tables.
            "application/json;as=Table;v=v1;g=meta.k8s.io,"
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            Output("application/json", "Table"),
        ),
    ],
)
def test_the_accept_header_chooses_as_upstreams_negotiation(accept: str, expected: Output) -> None:
    assert negotiate(accept) == expected


@pytest.mark.parametrize(
    "accept",
    [
        "application/vnd.kubernetes.protobuf",
        "application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1alpha1",  # bad version
        "application/json;as=PartialObjectMetadata;g=k8s.io;v=v1",  # bad group
        "application/json;as=PartialObject;g=meta.k8s.io;v=v1",  # bad kind
        "application/json;as=Service;g=;v=v1",  # only meta kinds
        "application/json;g=meta.k8s.io;v=v1",  # missing kind
        "text/html",
        "*/json",
    ],
)
def test_what_is_not_served_is_not_acceptable(accept: str) -> None:
    with pytest.raises(ApiError) as refused:
        negotiate(accept)
    assert (refused.value.code, refused.value.reason) == (406, "NotAcceptable")
    assert str(refused.value) == SERVED_TYPES


@given(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60))
def test_any_header_is_a_served_type_or_a_406(accept: str) -> None:
    try:
        output = negotiate(accept)
    except ApiError as refused:
        assert refused.code == 406
    else:
        assert output.media_type in ("application/json", "application/yaml")


async def test_partial_object_metadata_is_the_objects_metadata(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    async with client.get(STORAGE_VERSIONS) as response:
        full = await response.json()
    name = full["items"][0]["metadata"]["name"]
    async with client.get(f"{STORAGE_VERSIONS}/{name}", headers={"Accept": PARTIAL}) as response:
        assert response.content_type == "application/json"
        partial = await response.json()
    assert partial == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": full["items"][0]["metadata"],
    }
    async with client.get(STORAGE_VERSIONS, headers={"Accept": PARTIAL_LIST}) as response:
        listed = await response.json()
    assert (listed["kind"], listed["apiVersion"]) == (
        "PartialObjectMetadataList",
        "meta.k8s.io/v1beta1",
    )
    assert listed["metadata"] == full["metadata"]
    assert [item["metadata"] for item in listed["items"]] == [
        item["metadata"] for item in full["items"]
    ]
    assert {item["kind"] for item in listed["items"]} == {"PartialObjectMetadata"}


async def test_a_list_is_not_one_object_nor_one_object_a_list(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    async with client.get(STORAGE_VERSIONS, headers={"Accept": PARTIAL}) as response:
        status = await response.json()
    assert (response.status, status["reason"]) == (406, "NotAcceptable")
    assert status["message"].startswith("you requested PartialObjectMetadata, but the requested")
    async with client.get(STORAGE_VERSIONS) as response:
        name = (await response.json())["items"][0]["metadata"]["name"]
    one = f"{STORAGE_VERSIONS}/{name}"
    async with client.get(one, headers={"Accept": PARTIAL_LIST}) as response:
        status = await response.json()
    assert (response.status, status["reason"]) == (406, "NotAcceptable")
    assert "is not a list" in status["message"]


async def test_yaml_is_the_same_object(served: tuple[TestClient[Any, Any], LedgerViews]) -> None:
    client, _ = served
    async with client.get(LEASES) as response:
        as_json = await response.json()
    async with client.get(LEASES, headers={"Accept": "application/yaml"}) as response:
        assert response.content_type == "application/yaml"
        assert yaml.safe_load(await response.text()) == as_json


LEASES_OBJECT = f"{LEASES}/any-name"  # the route refuses before any object is looked up
ROUTE_REFUSAL = (
    "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml"
)


@pytest.mark.parametrize(
    ("accept", "path", "message"),
    [
        # As upstream's router (go-restful), before any handler: no clause's media type
        # is one the route produces, exactly (application/* is none); a list's and a
        # watch's routes produce the stream too, an object's not.
        ("application/foo", LEASES, f"{ROUTE_REFUSAL}, application/json;stream=watch"),
        ("application/*", LEASES, f"{ROUTE_REFUSAL}, application/json;stream=watch"),
        ("application/vnd.kubernetes.protobuf", LEASES_OBJECT, ROUTE_REFUSAL),
        # A media type the route produces, refused by the handler's negotiation.
        ("application/json;as=Service;g=;v=v1", LEASES, SERVED_TYPES),
        ("application/json;as=PartialObject;g=meta.k8s.io;v=v1", LEASES_OBJECT, SERVED_TYPES),
    ],
)
async def test_what_is_not_served_is_a_406_status_in_upstreams_words(
    served: tuple[TestClient[Any, Any], LedgerViews], accept: str, path: str, message: str
) -> None:
    client, _ = served
    async with client.get(path, headers={"Accept": accept}) as response:
        status = await response.json()
    assert (response.status, status["kind"], status["message"]) == (406, "Status", message)
    assert status.get("details") == ({} if message.startswith("406") else None)


async def test_a_watch_streams_json_only(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    for accept, content_type in (
        ("application/yaml", "application/yaml"),
        # An error is never converted: asked only for a Table, it is written in JSON.
        ("application/yaml;as=Table;g=meta.k8s.io;v=v1", "application/json"),
    ):
        async with client.get(f"{LEASES}?watch=true", headers={"Accept": accept}) as response:
            assert response.content_type == content_type
            status = yaml.safe_load(await response.text())  # JSON is YAML too
        assert (response.status, status["message"]) == (406, STREAMED_TYPES)


async def test_an_error_is_a_status_in_the_media_type_asked_for(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    missing = f"{LEASES}/no-such-apiserver"
    for accept, code, content_type in (
        ("application/yaml", 404, "application/yaml"),
        (f"{PARTIAL},application/yaml", 404, "application/yaml"),
        ("", 404, "application/json"),
        ("application/vnd.kubernetes.protobuf", 406, "application/json"),
    ):
        async with client.get(missing, headers={"Accept": accept}) as response:
            assert (response.status, response.content_type) == (code, content_type)
            status = yaml.safe_load(await response.text())  # JSON is YAML too
        assert (status["kind"], status["code"]) == ("Status", code)


async def test_a_watch_of_partial_object_metadata_sends_metadata_and_bookmarks(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    start = f"resourceVersion={views.clusters['cluster-000'].horizon}"
    full = await watch(client, LEASES, start)
    partial = await watch(
        client, LEASES, f"{start}&allowWatchBookmarks=true", headers={"Accept": PARTIAL}
    )
    changes = [e for e in partial if e["type"] != "BOOKMARK"]
    assert [(e["type"], e["object"]["metadata"]) for e in changes] == [
        (e["type"], e["object"]["metadata"]) for e in full
    ]
    assert {e["object"]["kind"] for e in partial} == {"PartialObjectMetadata"}
    assert any(e["type"] == "BOOKMARK" for e in partial), "an idle second has bookmarks"


async def test_a_table_watch_in_v1beta1_has_columns_first_and_v1beta1_rows(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    start = f"resourceVersion={views.clusters['cluster-000'].horizon}"
    events = await watch(client, LEASES, start, headers={"Accept": TABLE_V1BETA1})
    assert len(events) > 1
    tables = [e["object"] for e in events]
    assert {t["apiVersion"] for t in tables} == {"meta.k8s.io/v1beta1"}
    # Upstream's NoHeaders after the first: null definitions.
    assert tables[0]["columnDefinitions"] and all(
        t["columnDefinitions"] is None for t in tables[1:]
    )
    rows = [row for t in tables for row in t["rows"]]
    assert {row["object"]["apiVersion"] for row in rows} == {"meta.k8s.io/v1beta1"}
    # Each Table at its object's resourceVersion, the initial events' too.
    initial = await watch(client, LEASES, "", headers={"Accept": TABLE_V1BETA1})
    tables += [e["object"] for e in initial]
    assert all(
        t["metadata"]["resourceVersion"] == t["rows"][0]["object"]["metadata"]["resourceVersion"]
        for t in tables
    )
    assert len({t["metadata"]["resourceVersion"] for t in tables}) > 1


@pytest.mark.parametrize("watching", ["", "watch=true&"])
async def test_an_unknown_include_object_is_a_bad_request_for_tables_only(
    served: tuple[TestClient[Any, Any], LedgerViews], watching: str
) -> None:
    client, _ = served
    path = f"{LEASES}?{watching}timeoutSeconds=1&includeObject=unrecognized"
    async with client.get(path, headers={"Accept": TABLE_V1BETA1}) as response:
        status = await response.json()
    assert (response.status, status["reason"]) == (400, "BadRequest")
    assert status["message"] == (
        "Unable to convert to Table as requested: includeObject: Invalid value: "
        "\"unrecognized\": must be 'Metadata', 'Object', 'None', or empty"
    )
    async with client.get(path) as response:
        assert response.status == 200
    for policy, expected in (("None", None), ("Object", "Lease"), ("", "PartialObjectMetadata")):
        async with client.get(
            f"{LEASES}?includeObject={policy}", headers={"Accept": TABLE_V1BETA1}
        ) as response:
            rows = (await response.json())["rows"]
        assert rows
        assert {(row["object"] or {}).get("kind") for row in rows} == {expected}
        # None is upstream's empty RawExtension, which encodes as null, not left out.
        assert policy != "None" or all(row["object"] is None for row in rows)


async def test_aggregated_discovery_is_v2_if_ranked_first_and_v2beta1_is_not_served(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    """As upstream's discovery negotiates: its Accept clauses ranked by quality, and from
    1.35 (AggregatedDiscoveryRemoveBetaType) a v2beta1 clause passed over, so the
    legacy list answers, in the media type asked for, or 406."""
    client, _ = served
    v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
    for accept, kind in (
        (f"{v2},{beta},application/json", "APIGroupDiscoveryList"),  # kubectl's
        (f"{beta};q=0.9,{v2},application/json", "APIGroupDiscoveryList"),
        (f"{beta},{v2}", "APIGroupDiscoveryList"),
        (f"{v2};q=0.5,application/json", "APIGroupList"),
        (f"{beta},application/json", "APIGroupList"),
        ("application/json", "APIGroupList"),
    ):
        async with client.get(f"{CLUSTER}/apis", headers={"Accept": accept}) as response:
            assert (response.status, (await response.json())["kind"]) == (200, kind), accept
    async with client.get(f"{CLUSTER}/api", headers={"Accept": "application/yaml"}) as response:
        assert yaml.safe_load(await response.text())["kind"] == "APIVersions"
    for accept in (beta, "text/plain"):
        async with client.get(f"{CLUSTER}/api", headers={"Accept": accept}) as response:
            assert (response.status, (await response.json())["reason"]) == (406, "NotAcceptable")


async def test_the_version_fills_the_fields_of_upstreams_version_info(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    # Clients read major and minor as numbers (kubectl's version skew, say).
    client, _ = served
    async with client.get(f"{CLUSTER}/version") as response:
        info = await response.json()
    assert info["gitVersion"].startswith(f"v{info['major']}.{info['minor']}.")
    assert int(info["major"]) >= 0 and int(info["minor"]) >= 0
