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
from readapi.ledger import LedgerViews
from readapi.resources import JSON, KINDS, Kind, View
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
    view = View("east", len(history), datetime(2030, 1, 1, tzinfo=UTC), state, {})
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
