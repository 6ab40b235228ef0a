"""A kind's list, and its pages, as kube-apiserver answers a list request.

A list's ``metadata.resourceVersion`` is the offset the view is folded up to. A page
(``limit``) ends with an opaque ``continue`` token holding that resourceVersion and the
last name returned, so a later page reads the snapshot of the first; and, as upstream's
watch cache pages a list with a selector, a page filled under one continues while any
object, selected or not, remains after it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Final

from readapi.gojson import JSON
from readapi.kinds import CUSTOM_GROUPS, Kind
from readapi.status import ApiError


def object_list(
    kind: Kind, items: Sequence[JSON], resource_version: int, token: str, remaining: int | None
) -> JSON:
    """A ``<Kind>List``. As upstream encodes a built-in kind's list, its items carry no
    ``kind`` and ``apiVersion`` (the list says them once); a custom resource's carry them."""
    if kind.group not in CUSTOM_GROUPS:
        items = [{k: v for k, v in item.items() if k not in _TYPE_META} for item in items]
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": list_metadata(resource_version, token, remaining),
        "items": list(items),
    }


_TYPE_META: Final = frozenset({"kind", "apiVersion"})


def list_metadata(resource_version: int, token: str, remaining: int | None = None) -> JSON:
    """``ListMeta``; ``remaining`` is upstream's ``remainingItemCount``, which it gives
    for a page with more after it when no selector makes the count uncertain."""
    metadata: JSON = {"resourceVersion": str(resource_version)}
    if token:
        metadata["continue"] = token
    if remaining is not None:
        metadata["remainingItemCount"] = remaining
    return metadata


# --------------------------------------------------------------------------- paging


def continue_token(resource_version: int, after: str) -> str:
    """An opaque ``continue``: the list's resourceVersion and the last name returned."""
    raw = json.dumps({"rv": resource_version, "after": after}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def parse_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), str(data["after"])
    except (ValueError, KeyError, TypeError, binascii.Error) as error:
        raise ApiError(
            400,
            "BadRequest",
            f"continue token {token[:40]!r} is not one this server gave; "
            "start the list again without it",
        ) from error


def page(
    items: Sequence[JSON],
    after: str,
    limit: int | None,
    selected: Callable[[JSON], bool] = lambda obj: True,
) -> tuple[list[JSON], str | None]:
    """The ``selected`` of ``items`` after the name ``after``, at most ``limit``; and the
    last one's name if any item, selected or not, remains after the one that filled the
    page (as upstream's watch cache pages a list with a selector: the next page may be
    empty)."""
    rest = [obj for obj in items if obj["metadata"]["name"] > after] if after else list(items)
    chosen = []
    for index, obj in enumerate(rest):
        if selected(obj):
            chosen.append(obj)
        if limit is not None and len(chosen) >= limit:
            more = index < len(rest) - 1
            return chosen, str(chosen[-1]["metadata"]["name"]) if more else None
    return chosen, None
