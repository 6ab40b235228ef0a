"""Which representation a request's ``Accept`` header asks for, as kube-apiserver decides.

Upstream's content negotiation (``apiserver/pkg/endpoints/handlers/negotiation``):

* The header's clauses are taken best first: by ``q`` (1 when absent), and at equal
  ``q`` a concrete type before ``*`` and a concrete subtype before ``*``. An empty
  header asks for JSON.
* Each clause is tried against the media types served, in the server's order
  (``application/json``, then ``application/yaml``; there is no protobuf here): it
  matches one with the same type and subtype, the same type and subtype ``*``, or
  ``*/*``.
* A match is refused when its parameters ask for what the endpoint cannot give:
  ``stream`` other than ``watch`` (or any ``stream`` on YAML, which has no stream
  form), ``sv`` other than ``v1``, or a conversion (``as``, ``g``, ``v``) to anything
  but ``Table``, ``PartialObjectMetadata`` or ``PartialObjectMetadataList`` of
  ``meta.k8s.io`` ``v1`` or ``v1beta1``. Other parameters are ignored.
* The first match that is not refused wins; none is 406 NotAcceptable, naming the
  media types served. A watch takes the same winner and is refused when it has no
  stream form (YAML), naming the stream media types.

Whether the winner fits the request (a ``PartialObjectMetadata`` of a list, a
``PartialObjectMetadataList`` of one object) is the handler's question:
:func:`not_acceptable` is the error either way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Final

import yaml

from readapi import protobuf
from readapi.gojson import JSON, go_json_body
from readapi.status import ApiError

JSON_TYPE: Final = "application/json"
YAML_TYPE: Final = "application/yaml"
SERVED: Final = (JSON_TYPE, YAML_TYPE)
STREAMED: Final = (f"{JSON_TYPE};stream=watch",)
META_GROUP: Final = "meta.k8s.io"
META_VERSIONS: Final = frozenset({"v1", "v1beta1"})
CONVERSIONS: Final = frozenset({"Table", "PartialObjectMetadata", "PartialObjectMetadataList"})


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    """The negotiated representation: a media type, and a ``meta.k8s.io`` kind to
    convert the answer to (``as``) in ``version``, or none."""

    media_type: str = JSON_TYPE
    convert: str | None = None
    version: str = "v1"

    @property
    def api_version(self) -> str:
        return f"{META_GROUP}/{self.version}"

    def encode(self, body: JSON) -> bytes:
        if self.media_type == YAML_TYPE:
            return yaml.safe_dump(body, default_flow_style=False).encode()
        return go_json_body(body)


def negotiate(accept: str, *, convert: bool = True) -> Output:
    """The representation ``accept`` asks for; :class:`ApiError` 406 if none is served.

    Without ``convert``, a clause that asks for a conversion is refused, as upstream's
    default endpoint restrictions refuse it (an error is a ``Status``, never a Table).
    """
    if not accept:
        return Output()
    for media_type, subtype, params in clauses(accept):
        if media_type == "*" and subtype != "*":
            continue
        for served in SERVED:
            served_type, served_subtype = served.split("/")
            if media_type not in (served_type, "*") or subtype not in (served_subtype, "*"):
                continue
            output = _accepted(served, params)
            if output is not None and (convert or output.convert is None):
                return output
    raise not_acceptable(_served_message(SERVED))


def for_errors(accept: str) -> Output:
    """How an error's ``Status`` is written, as upstream's ``ErrorNegotiated`` writes it:
    in the media type ``accept`` asks for without a conversion, JSON if it asks for none
    that is served."""
    try:
        return negotiate(accept, convert=False)
    except ApiError:
        return Output()


def read_body(content_type: str, data: bytes) -> Any:
    """A request body in a served media type (``Content-Type``; JSON when it has none), or
    a review in protobuf (:mod:`readapi.protobuf`): 415 UnsupportedMediaType for another,
    as upstream's, and 400 if it does not parse."""
    load: Callable[[bytes], Any]
    if content_type in ("", "application/octet-stream", JSON_TYPE):
        load, form = json.loads, "JSON"
    elif content_type == YAML_TYPE:
        load, form = yaml.safe_load, "YAML"
    elif content_type == protobuf.MEDIA_TYPE:
        return protobuf.decode(data)
    else:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include:"
            f" {', '.join((*SERVED, protobuf.MEDIA_TYPE))}",
        )
    try:
        return load(data)
    except (ValueError, yaml.YAMLError) as error:
        raise ApiError(
            400, "BadRequest", f"the body of the request is not valid {form}: {error}"
        ) from None


def check_stream(output: Output) -> None:
    """Refuse a watch in ``output``'s media type when it has no stream form: upstream
    negotiates a watch as any request, then refuses a winner that cannot stream."""
    if output.media_type != JSON_TYPE:
        raise not_acceptable(_served_message(STREAMED))


def check_route(accept: str, produces: tuple[str, ...]) -> None:
    """Refuse ``accept`` as upstream's router (go-restful) does before any handler
    negotiates: when none of its clauses, parameters dropped, is ``*/*`` or one of the
    media types the route ``produces`` (exactly: ``application/*`` is none), a 406 in
    the router's words, naming them."""
    if not accept.strip():
        return
    for clause in accept.split(","):
        media_type = clause.split(";", 1)[0].strip()
        if media_type == "*/*" or media_type in produces:
            return
    message = "406: Not Acceptable\n\nAvailable representations: " + ", ".join(produces)
    raise ApiError(406, "NotAcceptable", message, {})


def not_acceptable(message: str) -> ApiError:
    return ApiError(406, "NotAcceptable", message)


def _served_message(media_types: tuple[str, ...]) -> str:
    return f"only the following media types are accepted: {', '.join(media_types)}"


def clauses(accept: str) -> list[tuple[str, str, dict[str, str]]]:
    """The header's clauses (type, subtype, parameters), best first, as upstream's
    ``goautoneg.ParseAccept`` orders them; a clause without a subtype but ``*`` is
    skipped, and an unreadable ``q`` counts as 0."""
    ranked: list[tuple[float, bool, bool, int, tuple[str, str, dict[str, str]]]] = []
    for index, part in enumerate(accept.split(",")):
        media_range, *fields = part.strip().split(";")
        pieces = media_range.split("/")
        media_type = pieces[0].strip()
        if len(pieces) == 1 and media_type == "*":
            subtype = "*"
        elif len(pieces) == 2:
            subtype = pieces[1].strip()
        else:
            continue
        quality = 1.0
        params: dict[str, str] = {}
        for field in fields:
            key, equals, value = field.partition("=")
            if not equals:
                continue
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
            else:
                params[key.strip()] = value.strip()
        clause = (media_type, subtype, params)
        ranked.append((-quality, media_type == "*", subtype == "*", index, clause))
    return [clause for *_, clause in sorted(ranked, key=lambda r: r[:4])]


def _accepted(served: str, params: dict[str, str]) -> Output | None:
    """``served`` with ``params``, or None when the parameters ask for what this
    endpoint cannot give (upstream's ``acceptMediaTypeOptions``)."""
    stream = params.get("stream", "")
    if stream and (served != JSON_TYPE or stream != "watch"):
        return None
    server_version = params.get("sv", "")
    if server_version and server_version != "v1":
        return None
    if not {"as", "g", "v"} & params.keys():
        return Output(served)
    kind, group, version = params.get("as", ""), params.get("g", ""), params.get("v", "")
    if group != META_GROUP or version not in META_VERSIONS or kind not in CONVERSIONS:
        return None
    return Output(served, kind, version)
