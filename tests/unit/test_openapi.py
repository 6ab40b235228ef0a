"""The OpenAPI v3 documents kubectl explain reads: found as kubectl finds them, and true
to every object the API serves."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from aiohttp.test_utils import TestClient
from hypothesis import given, settings

from ledger.events import Event, Position
from projections.fold import apply
from projections.state import State
from readapi import openapi
from readapi.gojson import JSON
from readapi.kinds import KINDS, Kind, View
from readapi.ledger import LedgerViews
from tests.histories import histories
from tests.served import CLUSTER

Served = tuple[TestClient[Any, Any], LedgerViews]
_PREFIX = "#/components/schemas/"


def _resolve(schema: JSON, document: JSON) -> JSON:
    """``schema`` with a ``$ref``, or upstream's one-element ``allOf`` around one, followed."""
    if "allOf" in schema:
        (schema,) = schema["allOf"]
    if "$ref" in schema:
        reference = schema["$ref"]
        assert reference.startswith(_PREFIX), reference
        return document["components"]["schemas"][reference.removeprefix(_PREFIX)]  # type: ignore[no-any-return]
    return schema


_TYPES = {"string": str, "integer": int, "array": list, "object": dict}


def violations(value: Any, schema: JSON, document: JSON, where: str = "") -> list[str]:
    """Where ``value`` is not what ``schema`` says: an undeclared field, a missing
    required one, a value of another type. (Not a general validator: the keywords the
    documents use.)"""
    schema = _resolve(schema, document)
    if value is None and schema.get("nullable"):
        return []
    kind = schema.get("type")
    if kind is not None and not isinstance(value, _TYPES[kind]):
        return [f"{where or '.'}: {value!r} is not of type {kind}"]
    if kind == "string" and schema.get("format") == "date-time":
        try:
            datetime.fromisoformat(value)
        except ValueError:
            return [f"{where}: {value!r} is not a date-time"]
    found: list[str] = []
    if isinstance(value, list):
        for index, item in enumerate(value):
            found += violations(item, schema["items"], document, f"{where}[{index}]")
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        found += [
            f"{where}.{name}: required" for name in schema.get("required", ()) if name not in value
        ]
        for name, item in value.items():
            if properties is not None and name in properties:
                found += violations(item, properties[name], document, f"{where}.{name}")
            elif isinstance(extra, dict):
                found += violations(item, extra, document, f"{where}.{name}")
            else:
                found.append(f"{where}.{name}: not in the schema")
    return found


def _document_of(kind: Kind) -> JSON:
    text = openapi.document(f"apis/{kind.group}/{kind.version}")
    assert text is not None
    return json.loads(text)  # type: ignore[no-any-return]


def _schema_of(kind: Kind, document: JSON, name: str | None = None) -> JSON:
    """The component kubectl explain takes for ``kind`` (or its list kind ``name``):
    the one marked with its group, version and kind."""
    mark = {"group": kind.group, "version": kind.version, "kind": name or kind.kind}
    (schema,) = [
        schema
        for schema in document["components"]["schemas"].values()
        if mark in schema.get("x-kubernetes-group-version-kind", [])
    ]
    return schema  # type: ignore[no-any-return]


async def test_kubectl_finds_each_kinds_schema_by_its_path(served: Served) -> None:
    client, _ = served
    for prefix in (CLUSTER, f"{CLUSTER}/at/10"):
        response = await client.get(f"{prefix}/openapi/v3")
        assert response.status == 200
        paths = (await response.json())["paths"]
        assert sorted(paths) == sorted({f"apis/{kind.group}/{kind.version}" for kind in KINDS})
        for kind in KINDS:
            url = paths[f"apis/{kind.group}/{kind.version}"]["serverRelativeURL"]
            # client-go requests the URL from the server's root, not below its own path
            assert url.startswith(f"{prefix}/openapi/v3/apis/{kind.group}/{kind.version}?hash=")
            response = await client.get(url)
            assert response.status == 200
            assert response.content_type == "application/json"
            document = await response.json()
            # As kubectl explain's template: the get operation of the resource's path
            # names the kind, whose schema is the one marked with it.
            scope = "/namespaces/{namespace}" if kind.namespaced else ""
            collection = f"/apis/{kind.group}/{kind.version}{scope}/{kind.resource}"
            for path in (collection, collection + "/{name}"):
                mark = document["paths"][path]["get"]["x-kubernetes-group-version-kind"]
                assert mark == {"group": kind.group, "version": kind.version, "kind": kind.kind}
            assert {"apiVersion", "kind", "metadata", "spec"} <= set(
                _schema_of(kind, document)["properties"]
            )


async def test_a_group_version_without_a_document_is_a_404_status(served: Served) -> None:
    client, _ = served
    response = await client.get(f"{CLUSTER}/openapi/v3/apis/apps/v1")
    assert response.status == 404
    assert (await response.json())["kind"] == "Status"
    assert (await client.get("/clusters/no-such-cluster/openapi/v3")).status == 404


async def test_a_document_is_cached_as_upstreams_handler_lets_clients_cache_it(
    served: Served,
) -> None:
    """kube-openapi's handler (kube-apiserver 1.37): the document's hash is its ETag and
    304 answers a client that has it; linked with the current hash, it is kept for a
    year; with another, a 301 sends the client to the current one."""
    client, _ = served
    paths = (await (await client.get(f"{CLUSTER}/openapi/v3")).json())["paths"]
    url = paths["apis/coordination.k8s.io/v1"]["serverRelativeURL"]
    current = url.partition("?hash=")[2]
    response = await client.get(url)
    assert (response.headers["ETag"], response.headers["Vary"]) == (f'"{current}"', "Accept")
    assert response.headers["Cache-Control"] == "public, immutable"
    assert "Expires" in response.headers
    plain = await client.get(url.partition("?")[0])
    assert plain.headers["Cache-Control"] == "no-cache, private"  # no hash: asked each time
    assert plain.headers["ETag"] == f'"{current}"'
    for held in (f'"{current}"', f'"other", W/"{current}"', "*"):  # as Go's ServeContent
        cached = await client.get(url, headers={"If-None-Match": held})
        assert (cached.status, await cached.read()) == (304, b""), held
    assert (await client.get(url, headers={"If-None-Match": '"other"'})).status == 200
    stale = await client.get(url.replace(current, "0" * 128), allow_redirects=False)
    assert (stale.status, stale.headers["Location"]) == (301, url)


async def test_aggregated_discovery_is_cached_as_upstreams(served: Served) -> None:
    """ServeHTTPWithETag: ETag, public, Vary: Accept, and 304 to a client that has it."""
    client, _ = served
    accept = {"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}
    for path in (f"{CLUSTER}/apis", f"{CLUSTER}/api"):
        response = await client.get(path, headers=accept)
        etag = response.headers["ETag"]
        assert (response.status, response.headers["Cache-Control"]) == (200, "public")
        assert response.headers["Vary"] == "Accept"
        cached = await client.get(path, headers={**accept, "If-None-Match": etag})
        assert (cached.status, await cached.read()) == (304, b"")
    legacy = await client.get(f"{CLUSTER}/apis")  # the legacy list: not cacheable
    assert "ETag" not in legacy.headers
    assert legacy.headers["Cache-Control"] == "no-cache, private"


async def test_every_listed_object_is_as_its_schema_says(served: Served) -> None:
    client, _ = served
    for kind in KINDS:
        document = _document_of(kind)
        scope = "/namespaces/kube-system" if kind.namespaced else ""
        response = await client.get(
            f"{CLUSTER}/apis/{kind.group}/{kind.version}{scope}/{kind.resource}"
        )
        listed = await response.json()
        assert listed["items"], f"the served views have no {kind.resource}"
        assert violations(listed, _schema_of(kind, document, f"{kind.kind}List"), document) == []


@settings(max_examples=60, deadline=None)
@given(histories())
def test_every_object_of_any_history_is_as_its_schema_says(
    history: list[tuple[Event, Position]],
) -> None:
    state = State()
    for event, position in history:
        apply(state, event, position)
    view = View("east", len(history), datetime(2030, 1, 1, tzinfo=UTC), state)
    for kind in KINDS:
        document = _document_of(kind)
        schema = _schema_of(kind, document)
        for row in kind.rows(state).values():
            served = kind.object(row, view)
            assert violations(served, schema, document) == [], served


def test_a_field_the_schema_does_not_declare_is_found() -> None:
    (kind,) = [kind for kind in KINDS if kind.kind == "StorageState"]
    document = _document_of(kind)
    schema = _schema_of(kind, document)
    good = {
        "kind": "StorageState",
        "apiVersion": kind.api_version,
        "metadata": {"name": "deployments.apps", "resourceVersion": "4"},
        "spec": {"resource": {"group": "apps", "resource": "deployments"}},
        "status": {"persistedStorageVersionHashes": ["Unknown"]},
    }
    assert violations(good, schema, document) == []
    assert violations({**good, "extra": 1}, schema, document) == [".extra: not in the schema"]
    assert violations(
        {**good, "status": {"persistedStorageVersionHashes": "Unknown"}}, schema, document
    ) == [".status.persistedStorageVersionHashes: 'Unknown' is not of type array"]


def test_required_fields_and_list_types_are_upstreams() -> None:
    """As kube-apiserver 1.37's document (and the migrator's CRD) marks them, which
    kubectl explain shows (-required-) and server-side apply reads (list types)."""
    [storage_versions] = [kind for kind in KINDS if kind.kind == "StorageVersion"]
    document = _document_of(storage_versions)
    schema = _schema_of(storage_versions, document)
    assert schema["required"] == ["metadata"]
    status = _resolve(schema["properties"]["status"], document)
    entries = status["properties"]["storageVersions"]
    assert (entries["x-kubernetes-list-type"], entries["x-kubernetes-list-map-keys"]) == (
        "map",
        ["apiServerID"],
    )
    entry = _resolve(entries["items"], document)
    assert entry["required"] == ["apiServerID", "encodingVersion", "decodableVersions"]
    assert entry["properties"]["decodableVersions"]["x-kubernetes-list-type"] == "set"
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    condition = _resolve(conditions["items"], document)
    assert condition["required"] == ["type", "status", "reason", "message"]
    [migrations] = [kind for kind in KINDS if kind.kind == "StorageVersionMigration"]
    document = _document_of(migrations)
    spec = _resolve(_schema_of(migrations, document)["properties"]["spec"], document)
    assert spec["required"] == ["resource"]
