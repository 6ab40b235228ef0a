"""The responses every handler of the read API writes, as kube-apiserver writes them.

A body in plain JSON (:func:`json_response`) or in the representation negotiated from
the ``Accept`` header (:func:`respond`, :mod:`readapi.negotiation`); an error as a
``Status`` in the media type negotiated for errors (:func:`status_response`), with
upstream's ``Retry-After`` when a 429 or 5xx says how long to wait; and upstream's
generic 404 and 405, whose details name nothing.
"""

from __future__ import annotations

from aiohttp import web

from readapi import negotiation
from readapi.gojson import JSON, go_json_body
from readapi.status import ApiError, status


def json_response(body: JSON) -> web.Response:
    """A JSON response typed ``application/json`` as upstream's (no charset parameter)."""
    return web.Response(body=go_json_body(body), content_type="application/json")


def respond(output: negotiation.Output, body: JSON) -> web.Response:
    return web.Response(body=output.encode(body), content_type=output.media_type)


def status_response(
    request: web.Request, code: int, reason: str, message: str, details: JSON | None = None
) -> web.Response:
    """The ``Status`` response, in the media type negotiated for errors; with upstream's
    ``Retry-After`` header when a 429 or 5xx says how long to wait
    (``details.retryAfterSeconds``)."""
    output = negotiation.for_errors(request.headers.get("Accept", ""))
    response = web.Response(
        body=output.encode(status(code, reason, message, details)),
        status=code,
        content_type=output.media_type,
    )
    retry = (details or {}).get("retryAfterSeconds")
    if retry and (code == 429 or code >= 500):
        response.headers["Retry-After"] = str(retry)
    return response


def method_not_allowed(request: web.Request) -> web.Response:
    """Upstream's generic 405, in its words, whose details name no resource: ``{}``."""
    return status_response(
        request,
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


def no_such_path(request: web.Request) -> ApiError:
    """The 404 for a path nothing is served at: upstream's generic one, whose details
    name nothing (``{}``); outside ``/clusters/`` it says where clusters are, as
    ``kubectl get --raw`` replaces the whole path of ``--server``."""
    message = "the server could not find the requested resource"
    if not request.path.startswith("/clusters/"):
        message += (
            f": {request.path} (every cluster is served under /clusters/CLUSTER,"
            " e.g. /clusters/NAME/api)"
        )
    return ApiError(404, "NotFound", message, {})
