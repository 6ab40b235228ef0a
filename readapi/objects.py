"""A kind's objects: get and list, as kube-apiserver serves them.

* get and list, with ``labelSelector``, ``fieldSelector`` (``metadata.name``,
  ``metadata.namespace``), ``limit`` and ``continue`` (a later page reads the snapshot
  of the first: its resourceVersion; ``remainingItemCount`` when no selector is given,
  as upstream), ``resourceVersion`` with ``resourceVersionMatch=Exact`` (the past, as
  under ``/at``, :mod:`readapi.clusters`); a page filled under a selector continues
  while any object, selected or not, remains (:mod:`readapi.lists`);
* a list of one key (its name pinned by a field selector, its namespace whole) ignores
  ``limit``, as upstream's store reads the one key;
* the list options checked first, then the field selector's fields, as upstream
  (:mod:`readapi.parameters`);
* the ``Accept`` header negotiated as upstream's (:mod:`readapi.negotiation`): JSON or
  YAML (watches JSON only); ``Table``, ``PartialObjectMetadata`` and
  ``PartialObjectMetadataList`` of ``meta.k8s.io`` ``v1`` or ``v1beta1`` in gets, lists
  and watches (:mod:`readapi.conversions`); 406 NotAcceptable for what is not served
  (protobuf among it), in the words of upstream's router when no media type asked for
  is one the route produces and of its negotiation when one is;
* ``watch=true`` (or a deprecated ``/watch/`` path) hands the request to
  :mod:`readapi.watch`.
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from readapi import clusters, conversions, lists, negotiation, parameters, watch
from readapi.kinds import Kind, check_field_selector, kind_of
from readapi.responses import no_such_path, respond
from readapi.selectors import Selection
from readapi.status import ApiError


async def handle_collection(request: web.Request) -> web.StreamResponse:
    kind = _kind(request)
    output = _output(request, streams=True)
    selection = parameters.selection(request)
    watching = parameters.watching(request)
    parameters.check_list_options(request, watching)
    _known_fields(selection, kind)
    if watching:
        return await watch.run(request, kind, selection, output)
    limit = parameters.limit(request)
    token = request.query.get("continue", "")
    after = ""
    resource_version: int | None = None
    if token:
        resource_version, after = lists.parse_continue(token)
    else:
        resource_version = await clusters.exact_resource_version(request, limit=limit)
    view = await clusters.view(request, resource_version)
    # Everything in the request's namespace, as upstream's list reads its key range; the
    # selectors choose among them.
    scope = kind.selected(view, Selection(namespace=selection.namespace))
    if not token and _one_key(kind, selection):
        limit = None  # upstream reads the one key, never a page of a range
    chosen, last = lists.page([obj for _, obj in scope], after, limit, selection.matches)
    names = {obj["metadata"]["name"] for obj in chosen}
    next_token = lists.continue_token(view.offset, last) if last else ""
    remaining = None
    if last and not selection.labels and not selection.fields:
        remaining = sum(1 for _, obj in scope if obj["metadata"]["name"] > last)
    if output.convert == "Table":
        pairs = [(row, obj) for row, obj in scope if obj["metadata"]["name"] in names]
        body = conversions.table(
            kind,
            pairs,
            view,
            api_version=output.api_version,
            include_object=parameters.include_object(request),
            token=next_token,
            remaining=remaining,
        )
    elif output.convert == "PartialObjectMetadataList":
        body = conversions.partial_metadata_list(
            chosen, output.api_version, view.offset, next_token, remaining
        )
    elif output.convert == "PartialObjectMetadata":
        raise negotiation.not_acceptable(
            "you requested PartialObjectMetadata, but the requested object is a list "
            f"({kind.kind}List)"
        )
    else:
        body = lists.object_list(kind, chosen, view.offset, next_token, remaining)
    return respond(output, body)


def _one_key(kind: Kind, selection: Selection) -> bool:
    """Whether upstream's store lists a single key for a first page of ``selection``:
    its field selector pins ``metadata.name`` and the key is whole (the kind is
    cluster-scoped, or the list is of one namespace, by its path or by a field selector
    that pins ``metadata.namespace``). It then ignores ``limit``: one object at most,
    no ``continue``."""

    def pins(field: str) -> bool:
        return any(
            r.key == field and r.operator == "=" and len(r.values) == 1 for r in selection.fields
        )

    one_namespace = selection.namespace is not None or pins("metadata.namespace")
    return pins("metadata.name") and (not kind.namespaced or one_namespace)


async def handle_member(request: web.Request) -> web.StreamResponse:
    kind = _kind(request)
    if kind.namespaced and "namespace" not in request.match_info:
        # Upstream registers a namespaced kind's objects under their namespace only.
        raise no_such_path(request)
    output = _output(request, streams="watch" in request.match_info)
    name = request.match_info["name"]
    # As upstream's request info: a GET that names an object is a get, ``watch=true``
    # or not; only the deprecated ``/watch/`` path watches one object.
    if "watch" in request.match_info:
        selection = dataclasses.replace(parameters.selection(request), name=name)
        # As upstream: a field selector on one object's watch must pin its name.
        if selection.fields and not any(
            r.key == "metadata.name" and r.operator == "=" and r.values == {name}
            for r in selection.fields
        ):
            raise ApiError(
                400, "BadRequest", "fieldSelector metadata.name doesn't match requested name"
            )
        parameters.check_list_options(request, watch=True)
        _known_fields(selection, kind)
        return await watch.run(request, kind, selection, output)
    view = await clusters.view(
        request, await clusters.exact_resource_version(request, listing=False)
    )
    selection = Selection(namespace=request.match_info.get("namespace"), name=name)
    for row, obj in kind.selected(view, selection):
        if output.convert == "Table":
            table = conversions.table(
                kind,
                [(row, obj)],
                view,
                api_version=output.api_version,
                include_object=parameters.include_object(request),
            )
            # One object's Table carries that object's resourceVersion, as upstream's.
            table["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            return respond(output, table)
        if output.convert == "PartialObjectMetadata":
            return respond(output, conversions.partial_metadata(obj, output.api_version))
        if output.convert == "PartialObjectMetadataList":
            raise negotiation.not_acceptable(
                "you requested PartialObjectMetadataList, but the requested object is not "
                f"a list ({kind.kind})"
            )
        return respond(output, obj)
    raise ApiError(
        404,
        "NotFound",
        f'{kind.resource}.{kind.group} "{name}" not found',
        {"name": name, "group": kind.group, "kind": kind.resource},
    )


def _kind(request: web.Request) -> Kind:
    info = request.match_info
    kind = kind_of(info["group"], info["version"], info["resource"])
    if kind is None:
        raise no_such_path(request)
    if "namespace" in info and not kind.namespaced:
        raise no_such_path(request)  # upstream registers no such route
    return kind


def _known_fields(selection: Selection, kind: Kind) -> None:
    check_field_selector(selection.fields, kind.group, kind.namespaced)


def _output(request: web.Request, *, streams: bool) -> negotiation.Output:
    """The representation a kind's route answers in: a get's, or (``streams``) a
    list's or a watch's, which may also be a stream."""
    accept = request.headers.get("Accept", "")
    produces = negotiation.SERVED + negotiation.STREAMED if streams else negotiation.SERVED
    negotiation.check_route(accept, produces)
    return negotiation.negotiate(accept)
