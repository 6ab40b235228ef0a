"""What an object or a list is converted to when the ``Accept`` header asks for a
``meta.k8s.io`` kind (``as=``, :mod:`readapi.negotiation`), as upstream converts it.

* ``Table``: the kind's columns (:attr:`readapi.kinds.Kind.columns`) and a row of cells
  per object, as ``kubectl get`` prints it; each row's object in full, as
  ``PartialObjectMetadata`` or left out (``includeObject``). A watch bookmark in a Table
  watch is a Table of one row of an empty object's cells.
* ``PartialObjectMetadata``: an object's kind and metadata alone;
  ``PartialObjectMetadataList`` a list of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from readapi.gojson import JSON
from readapi.kinds import CUSTOM_GROUPS, Kind, View
from readapi.lists import list_metadata


def bookmark_table(
    kind: Kind,
    bookmark: JSON,
    *,
    api_version: str = "meta.k8s.io/v1",
    include_object: str = "Metadata",
    with_columns: bool = True,
) -> JSON:
    """A watch bookmark's object (:meth:`Kind.bookmark`) as upstream converts it for a
    Table watch: one row, of an empty object's cells (a built-in kind's printer's; null
    but the name for a custom resource's), the bookmark as its object."""
    if kind.group in CUSTOM_GROUPS:
        # A custom resource's converter writes null for a column its object lacks.
        cells = ["" if column.format == "name" else None for column in kind.columns]
    else:
        cells = [column.empty_cell for column in kind.columns]
    row: JSON = {"cells": cells, "object": None}
    if include_object == "Object":
        row["object"] = bookmark
    elif include_object == "Metadata":
        row["object"] = partial_metadata(bookmark, api_version)
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": {"resourceVersion": bookmark["metadata"]["resourceVersion"]},
        "columnDefinitions": _column_definitions(kind) if with_columns else None,
        "rows": [row],
    }


def _column_definitions(kind: Kind) -> list[JSON]:
    return [
        {
            "name": column.name,
            "type": column.type,
            "format": column.format,
            "description": column.description,
            "priority": column.priority,
        }
        for column in kind.columns
    ]


def table(
    kind: Kind,
    rows: Iterable[tuple[Any, JSON]],
    view: View,
    *,
    api_version: str = "meta.k8s.io/v1",
    include_object: str = "Metadata",
    token: str = "",
    remaining: int | None = None,
    with_columns: bool = True,
) -> JSON:
    """A ``meta.k8s.io`` Table of ``rows`` (fold row, object), as ``kubectl get`` prints;
    each row's object in full, as ``PartialObjectMetadata`` or left out (``include_object``
    ``Object``, ``Metadata`` or ``None``: null, as upstream's empty ``RawExtension``
    encodes)."""
    table_rows = []
    for row, obj in rows:
        table_row: JSON = {"cells": kind.cells(row, view), "object": None}
        if include_object == "Object":
            table_row["object"] = obj
        elif include_object == "Metadata":
            table_row["object"] = partial_metadata(obj, api_version)
        table_rows.append(table_row)
    metadata = list_metadata(view.offset, token, remaining)
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": metadata,
        # upstream's NoHeaders: no definitions, encoded as null
        "columnDefinitions": _column_definitions(kind) if with_columns else None,
        "rows": table_rows,
    }


def partial_metadata(obj: JSON, api_version: str) -> JSON:
    """``obj`` as upstream's ``PartialObjectMetadata``: its kind and its metadata alone."""
    return {"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": obj["metadata"]}


def partial_metadata_list(
    items: Sequence[JSON],
    api_version: str,
    resource_version: int,
    token: str,
    remaining: int | None,
) -> JSON:
    """A list as upstream's ``PartialObjectMetadataList``; each item keeps its kind, as
    upstream's do."""
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": api_version,
        "metadata": list_metadata(resource_version, token, remaining),
        "items": [partial_metadata(obj, api_version) for obj in items],
    }
