"""A request's query parameters, read and checked as kube-apiserver reads them.

* Boolean parameters (``watch``, ``allowWatchBookmarks``, ``sendInitialEvents``) read
  as upstream reads them: any value but ``0`` and ``false`` is true (Python clients
  send ``True``).
* ``resourceVersion`` is a log offset; one that is not an unsigned 64-bit number is a
  400 in upstream's words. ``limit`` is taken as upstream's watch cache takes it.
* ``labelSelector`` and ``fieldSelector`` make the request's :class:`Selection`
  (:mod:`readapi.selectors`); a Table's ``includeObject`` is checked as upstream's
  ``ValidateTableOptions`` checks it.
* The list options are checked as upstream's ``ValidateListOptions`` checks them: a
  422 Invalid ``ListOptions`` for parameters that cannot go together; then, with
  ``continue``, a resourceVersion is a 400, as upstream's storage refuses it.
"""

from __future__ import annotations

import json

from aiohttp import web

from readapi.gojson import go_json
from readapi.selectors import Selection, parse_field_selector, parse_label_selector
from readapi.status import ApiError, invalid


def selection(request: web.Request) -> Selection:
    query = request.query
    return Selection(
        namespace=request.match_info.get("namespace"),
        labels=parse_label_selector(query.get("labelSelector", "")),
        # Its fields are checked after the list options
        # (readapi.kinds.check_field_selector), as upstream.
        fields=parse_field_selector(query.get("fieldSelector", "")),
    )


def int_parameter(request: web.Request, name: str) -> int | None:
    text = request.query.get(name, "")
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ApiError(400, "BadRequest", f"{name}={text!r} is not a non-negative integer")
    return int(text)


def limit(request: web.Request) -> int | None:
    """A list's page size, None for no limit: as upstream's watch cache, which serves
    ``resourceVersion=0`` whole and takes a limit of 0 or less as none (client-go's
    reflector relies on the first)."""
    text = request.query.get("limit", "")
    if not text:
        return None
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise ApiError(400, "BadRequest", f"limit={text!r} is not an integer")
    limit = int(text)
    if limit <= 0 or request.query.get("resourceVersion") == "0":
        return None
    return limit


def flag(request: web.Request, name: str) -> bool | None:
    """A boolean query parameter as upstream decodes one (``Convert_Slice_string_To_bool``):
    absent is None; ``0`` and ``false`` (any case) are false; anything else, ``True`` as
    Python clients send it or an empty value, is true."""
    value = request.query.get(name)
    if value is None:
        return None
    return not (value == "0" or value.lower() == "false")


def watching(request: web.Request) -> bool:
    """``watch`` set, or a path of upstream's deprecated ``/watch/`` form."""
    return "watch" in request.match_info or bool(flag(request, "watch"))


def resource_version(request: web.Request, *, listing: bool) -> int | None:
    """The request's resourceVersion, a log offset; None for none or ``0`` (any).

    One that is not an unsigned 64-bit number is a 400 in upstream's words: a list's
    as its storage refuses it, a get's or a watch's with the message of the error its
    watch cache returns. That error no handler of upstream's classifies, so it answers
    a 500 (with no reason); a client's bad value is a 400 here, as upstream's list's is.
    """
    text = request.query.get("resourceVersion", "")
    if text in ("", "0"):
        return None
    if text.isascii() and text.isdigit() and int(text) < 2**64:
        return int(text)
    quoted = json.dumps(text, ensure_ascii=False)  # as Go's %q writes a printable string
    why = "value out of range" if text.isascii() and text.isdigit() else "invalid syntax"
    message = (
        f"resourceVersion: Invalid value: {quoted}: strconv.ParseUint: parsing {quoted}: {why}"
    )
    if listing:
        message = f"invalid resource version: {message}"
    raise ApiError(400, "BadRequest", message)


def check_list_options(request: web.Request, watch: bool) -> None:
    """Upstream's ``ValidateListOptions``: a 422 Invalid ``ListOptions`` for parameters
    that cannot go together; then, with ``continue``, a resourceVersion is a 400."""
    query = request.query
    version, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    initial = "sendInitialEvents" in query
    causes: list[tuple[str, str, str]] = []  # (field, reason, message)

    # Each message as upstream's field.Error.ErrorBody writes it: "Forbidden: ..." and
    # 'Unsupported value: "x": supported values: ...', the value a ResourceVersionMatch,
    # so in JSON (a plain string would be Go-quoted).
    def forbid(message: str, field: str = "resourceVersionMatch") -> None:
        causes.append((field, "Forbidden", f"Forbidden: {message}"))

    def unsupported(*supported: str) -> None:
        listed = ", ".join(f'"{value}"' for value in supported)
        message = f"Unsupported value: {go_json(match)}: supported values: {listed}"
        causes.append(("resourceVersionMatch", "NotSupported", message))

    if watch:
        if initial and match != "NotOlderThan":
            forbid("sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")
        if match and not initial:
            forbid(
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
            )
        if match and match != "NotOlderThan":
            unsupported("NotOlderThan")
        if match and query.get("continue"):
            forbid("resourceVersionMatch is forbidden when continue is provided")
    else:
        if match and not version:
            forbid("resourceVersionMatch is forbidden unless resourceVersion is provided")
        if match and query.get("continue"):
            forbid("resourceVersionMatch is forbidden when continue is provided")
        if match and match not in ("Exact", "NotOlderThan"):
            unsupported("Exact", "NotOlderThan", "")
        if match == "Exact" and version == "0":
            forbid('resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
        if initial:
            forbid("sendInitialEvents is forbidden for list", "sendInitialEvents")
    if causes:
        raise invalid("ListOptions", "meta.k8s.io", causes)
    # Then, as upstream's storage layer, after the handler's validation:
    if query.get("continue") and version not in ("", "0") and not watch:
        raise ApiError(
            400, "BadRequest", "specifying resource version is not allowed when using continue"
        )


def include_object(request: web.Request) -> str:
    """A Table's ``includeObject``, checked as upstream's ``ValidateTableOptions``."""
    value = request.query.get("includeObject", "")
    if value not in ("", "None", "Metadata", "Object"):
        raise ApiError(
            400,
            "BadRequest",
            "Unable to convert to Table as requested: "
            f"includeObject: Invalid value: {go_json(value)}: "
            "must be 'Metadata', 'Object', 'None', or empty",
        )
    return value or "Metadata"
