"""``svledger serve``: the ledger's views as a read-only Kubernetes API, on aiohttp.

Every cluster is a Kubernetes API server of its own under ``/clusters/CLUSTER``, so
``kubectl --server http://HOST:PORT/clusters/CLUSTER get storageversions`` and the
``kubernetes`` client (``host`` set to that URL) read it unchanged; under
``/clusters/CLUSTER/at/POINT`` it answers as the cluster stood at ``POINT`` (an offset
in the cluster's partition, the resourceVersion the API shows, or an RFC 3339 time).

What it speaks, as kube-apiserver does:

* discovery: ``/api``, ``/apis`` (aggregated ``apidiscovery.k8s.io`` v2 when the
  client asks for it first, as kubectl does, else the legacy lists; v2beta1 is not
  served, as upstream's from 1.35),
  ``/apis/GROUP`` and ``/apis/GROUP/VERSION`` (each kind with its ``storageVersionHash``);
* ``/openapi/v3`` and a document per group version, which ``kubectl explain`` reads
  (:mod:`readapi.openapi`; JSON only);
* get and list, with ``labelSelector``, ``fieldSelector`` (``metadata.name``,
  ``metadata.namespace``), ``limit`` and ``continue`` (a later page reads the
  snapshot of the first: its resourceVersion; ``remainingItemCount`` when no selector
  is given, as upstream), ``resourceVersion`` with
  ``resourceVersionMatch=Exact`` (the past, as under ``/at``);
* ``watch=true``: ADDED, MODIFIED and DELETED from ``resourceVersion`` on (from the
  current objects when it is absent or ``0``), a deletion at its own resourceVersion,
  BOOKMARK events with ``allowWatchBookmarks`` (after a quiet spell, and once 2 s
  before ``timeoutSeconds`` ends, as upstream's watch cache, each only once the
  position is past the resourceVersion the watch started from, and holding the kind's
  empty object as upstream's, in a Table watch a Table of one row of that object's
  cells), an ERROR event with a 410 Expired
  Status for a resourceVersion older than the changes kept, ``timeoutSeconds`` (none
  or 0: 30 to 60 minutes), of a collection (one object by a ``metadata.name`` field
  selector, as client-go watches one); the deprecated ``/apis/GROUP/VERSION/watch/...``
  paths alike, of one object too (a GET naming an object is a get, ``watch`` or not, as
  upstream's); ``sendInitialEvents`` with ``resourceVersionMatch=NotOlderThan`` (client-go's watch
  list), or a watch from no resourceVersion (or ``0``), which upstream's default WatchList
  makes one: the current objects, then, with bookmarks, one annotated
  ``k8s.io/initial-events-end``; boolean parameters read as upstream reads them (any value
  but ``0`` and ``false`` is true: Python clients send ``True``);
* list options checked as upstream's ``ValidateListOptions`` checks them (422
  Invalid), a list with a ``limit`` and a resourceVersion but no match served at that
  resourceVersion (upstream's legacy exact rule), and a resourceVersion the fold has
  not reached after 3 s answered 504 with ``Retry-After`` (a watch list: 200, then that
  Status in an ERROR event, as upstream's watch cache); a page filled under a selector
  continues while any object, selected or not, remains;
* the ``Accept`` header negotiated as upstream's (:mod:`readapi.negotiation`): JSON or
  YAML (watches JSON only); ``Table``, ``PartialObjectMetadata`` and
  ``PartialObjectMetadataList`` of ``meta.k8s.io`` ``v1`` or ``v1beta1`` in gets, lists
  and watches; 406 NotAcceptable for what is not served (protobuf among it), in the
  words of upstream's router when no media type asked for is one the route produces
  and of its negotiation when one is; errors in JSON or YAML as the header asks;
* errors as a ``Status``, written as upstream's encoder writes it (compact, its field
  order, a newline at the end): 404 for unknown paths (whatever the method), names and
  clusters, 405 for every method but GET (HEAD among them) on a kind's objects, on
  ``/version``, ``/api``, ``/api/v1`` and a group version's discovery, as upstream's
  routes (nothing is written through this API: the ledger is appended to only by its
  producers; the migrator's kinds too, whose custom resources' handler upstream answers
  HEAD on as GET, and any method on their group version's discovery), while
  ``/apis`` and ``/apis/GROUP`` answer any method as GET, as upstream's handlers do,
  401 without a valid bearer token when ``--token-file`` is given (``/healthz``, ``/livez`` and
  ``/readyz`` stay open), 400 for bad parameters (label selectors whose keys or values
  are not label names among them);
* ``SelfSubjectAccessReview`` and ``SelfSubjectRulesReview`` (``authorization.k8s.io/v1``)
  and ``SelfSubjectReview`` (``authentication.k8s.io/v1``), created only (405 for other
  methods), in JSON, YAML or kubectl's protobuf, not in discovery (kubectl needs none):
  ``kubectl auth can-i`` is told every read is allowed and nothing else, ``kubectl auth
  whoami`` the token file's user (:mod:`readapi.access`);
* ``/api/v1/namespaces/NAME``, which kubectl reads after a NotFound: ``kube-system``
  exists (the leases are there), no other namespace does;
* every response ``Cache-Control: no-cache, private``, as upstream's, but what upstream
  lets clients cache: aggregated discovery (an ETag, ``public``) and an OpenAPI document
  asked with its hash (``public, immutable``);
* ``/healthz`` and ``/livez`` (the process runs) and ``/readyz`` (the log is folded up
  to the end it had at start);
* ``/clusters/CLUSTER/timeline/RESOURCE``: the page ``svledger timeline`` draws
  (:mod:`readapi.timeline`), from the cluster's partition as it is now.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import functools
import hashlib
import json
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from ledger.errors import UsageError
from ledger.identity import LEASE_NAMESPACE
from ledger.metrics import format_address
from projections.history import ResourceNameError
from readapi import access, negotiation, openapi, resources
from readapi.ledger import (
    Change,
    ClusterFold,
    LedgerViews,
    NotCaughtUp,
    PointOutOfRange,
    UnknownCluster,
    timeline_page,
)
from readapi.resources import JSON, ApiError, Kind, Selection, View

log = logging.getLogger(__name__)

BOOKMARK_SECONDS: Final = 10.0
PRE_TIMEOUT_BOOKMARK_SECONDS: Final = 2.0  # upstream's cacheWatcher.nextBookmarkTime
WATCH_TIMEOUT_SECONDS: Final = 1800.0  # upstream's --min-request-timeout
FRESHNESS_WAIT_SECONDS: Final = 3.0  # upstream's watch cache waits as long to catch up
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"  # the bookmark after initial events
AGGREGATED_DISCOVERY: Final = "apidiscovery.k8s.io"
_OPEN_PATHS: Final = frozenset({"/healthz", "/livez", "/readyz"})
_VIEWS: Final = web.AppKey("views", LedgerViews)
_TOKENS: Final = web.AppKey("tokens", dict[str, access.User])
_USER: Final = web.RequestKey("user", access.User)  # whom the request authenticated as
_BOOKMARKS: Final = web.AppKey("bookmark_seconds", float)
_STOP: Final = web.AppKey("stop", asyncio.Event)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True, slots=True)
class ServeOptions:
    """How ``serve`` listens; TLS when both files are given, bearer tokens when a file is."""

    host: str = "127.0.0.1"
    port: int = 8080
    token_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    bookmark_seconds: float = BOOKMARK_SECONDS


def app(
    views: LedgerViews, options: ServeOptions = ServeOptions(), stop: asyncio.Event | None = None
) -> web.Application:
    """The aiohttp application over ``views``; setting ``stop`` ends its watches."""
    application = web.Application(middlewares=[_errors, _authenticate])
    application[_VIEWS] = views
    application[_STOP] = stop or asyncio.Event()
    application[_TOKENS] = access.read_tokens(options.token_file) if options.token_file else {}
    application[_BOOKMARKS] = options.bookmark_seconds
    application.on_response_prepare.append(_no_cache)
    application.router.add_get("/healthz", _healthz)
    application.router.add_get("/livez", _healthz)
    application.router.add_get("/readyz", _readyz)
    application.router.add_get("/clusters/{cluster}/timeline/{resource}", _timeline)
    # Upstream's API paths answer GET only (HEAD too is 405, see _not_found), but for
    # /apis and /apis/GROUP, which its handlers answer whatever the method.
    get = functools.partial(application.router.add_get, allow_head=False)
    for prefix in ("/clusters/{cluster}", "/clusters/{cluster}/at/{point}"):
        get(prefix + "/version", _version)
        get(prefix + "/api", _api)
        get(prefix + "/api/v1", _core)
        get(prefix + "/api/v1/namespaces/{namespace}", _namespace)
        application.router.add_route("*", prefix + "/apis", _apis)
        application.router.add_route("*", prefix + "/apis/{group}", _group)
        get(prefix + "/apis/{group}/{version}", _group_version)
        application.router.add_get(prefix + "/openapi/v3", _openapi_index)
        application.router.add_get(prefix + "/openapi/v3/{path:.+}", _openapi_document)
        reviews = prefix + "/apis/authorization.k8s.io/v1/"
        application.router.add_route("*", reviews + "selfsubjectaccessreviews", _access_review)
        application.router.add_route("*", reviews + "selfsubjectrulesreviews", _rules_review)
        whoami = prefix + "/apis/authentication.k8s.io/v1/selfsubjectreviews"
        application.router.add_route("*", whoami, _self_review)
        # Upstream's deprecated watch paths: .../{version}/watch/..., as ?watch=true.
        watched = prefix + "/apis/{group}/{version}/{watch:watch}"
        get(watched + "/namespaces/{namespace}/{resource}", _collection)
        get(watched + "/namespaces/{namespace}/{resource}/{name}", _member)
        get(watched + "/{resource}", _collection)
        get(watched + "/{resource}/{name}", _member)
        get(prefix + "/apis/{group}/{version}/{resource}", _collection)
        get(prefix + "/apis/{group}/{version}/{resource}/{name}", _member)
        namespaced = prefix + "/apis/{group}/{version}/namespaces/{namespace}/{resource}"
        get(namespaced, _collection)
        get(namespaced + "/{name}", _member)
    application.router.add_route("*", "/{path:.*}", _not_found)
    return application


async def _no_cache(request: web.Request, response: web.StreamResponse) -> None:
    """Upstream's ``WithCacheControl``: every response is ``no-cache, private`` unless
    its handler said otherwise (the views change with every event)."""
    response.headers.setdefault("Cache-Control", "no-cache, private")


async def serve(views: LedgerViews, options: ServeOptions, stop: asyncio.Event) -> None:
    """Fold the log and answer requests until ``stop`` is set (or the fold fails)."""
    context = None
    if options.tls_cert_file and options.tls_key_file:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(options.tls_cert_file, options.tls_key_file)
        except OSError as error:  # ssl.SSLError too: not PEM, or the key does not match
            raise UsageError(
                f"cannot serve TLS with --tls-cert-file {options.tls_cert_file} and "
                f"--tls-private-key-file {options.tls_key_file}: {error.strerror or error}; "
                "give a PEM certificate (chain) and its PEM private key"
            ) from error
    runner = web.AppRunner(app(views, options, stop), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port, ssl_context=context)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise UsageError(
            f"cannot listen on {options.host}:{options.port}: {error.strerror}; "
            "choose another --address"
        ) from error
    scheme = "https" if context else "http"
    port = runner.addresses[0][1]  # the bound one, when --address asked for any (0)
    address = format_address(options.host, port)
    log.info(
        "serving the ledger's views on %s://%s/clusters/CLUSTER",
        scheme,
        address,
        extra={"address": f"{scheme}://{address}"},
    )
    try:
        await views.follow(stop)
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------- middleware


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return _status(request, error.code, error.reason, str(error), error.details)
    except UnknownCluster as error:
        return _status(request, 404, "NotFound", str(error))
    except NotCaughtUp as error:
        return _status(request, 503, "ServiceUnavailable", str(error), {"retryAfterSeconds": 1})
    except PointOutOfRange as error:
        return _status(request, 400, "BadRequest", str(error))
    except web.HTTPMethodNotAllowed:
        return _method_not_allowed(request)


@web.middleware
async def _authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    tokens = request.app[_TOKENS]
    request[_USER] = access.ANONYMOUS
    if tokens and request.path not in _OPEN_PATHS:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        user = tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            return _status(request, 401, "Unauthorized", "Unauthorized: give a valid bearer token")
        request[_USER] = user
    return await handler(request)


def _status(
    request: web.Request, code: int, reason: str, message: str, details: JSON | None = None
) -> web.Response:
    """The ``Status`` response, in the media type negotiated for errors; with upstream's
    ``Retry-After`` header when a 429 or 5xx says how long to wait
    (``details.retryAfterSeconds``)."""
    output = negotiation.for_errors(request.headers.get("Accept", ""))
    response = web.Response(
        body=output.encode(resources.status(code, reason, message, details)),
        status=code,
        content_type=output.media_type,
    )
    retry = (details or {}).get("retryAfterSeconds")
    if retry and (code == 429 or code >= 500):
        response.headers["Retry-After"] = str(retry)
    return response


def _method_not_allowed(request: web.Request) -> web.Response:
    """Upstream's generic 405, in its words, whose details name no resource: ``{}``."""
    return _status(
        request,
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


async def _not_found(request: web.Request) -> web.StreamResponse:
    """404 for a path nothing is served at, whatever the method, as upstream; 405 for
    another method than GET (HEAD among them) on a path GET answers at: a served kind's
    objects, the version, the core discovery paths, a served group version's, and a
    namespace (nothing is written through this API: the ledger is appended to only by
    its producers)."""
    if request.method != "GET":
        served = await request.app.router.resolve(request.clone(method="GET"))
        handler = getattr(served, "handler", None)
        if handler in (_collection, _member):
            kind = resources.kind_of(served["group"], served["version"], served["resource"])
            # Only where upstream registers a route: a kind in its own scope.
            allowed = kind is not None and (
                kind.namespaced == ("namespace" in served)
                or (handler is _collection and kind.namespaced)
            )
        elif handler is _group_version:
            allowed = resources.resource_list(served["group"], served["version"]) is not None
        else:
            allowed = handler in (_version, _api, _core, _namespace)
        if allowed:
            return _method_not_allowed(request)
    raise _no_such_path(request)


def _no_such_path(request: web.Request) -> ApiError:
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


async def _namespace(request: web.Request) -> web.StreamResponse:
    """``/api/v1/namespaces/NAME``, which kubectl reads to tell a missing object from a
    missing namespace: ``kube-system``, where the leases are, exists; no other does.
    (Not in discovery: the API serves no namespace objects beyond this answer.)"""
    _cluster_view_check(request)
    name = request.match_info["namespace"]
    if name != LEASE_NAMESPACE:
        raise ApiError(
            404,
            "NotFound",
            f'namespaces "{name}" not found',
            {"name": name, "kind": "namespaces"},
        )
    return _json(
        {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
    )


async def _healthz(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.StreamResponse:
    if request.app[_VIEWS].ready.is_set():
        return web.Response(text="ok")
    return web.Response(text="catching up with the log", status=503)


async def _timeline(request: web.Request) -> web.StreamResponse:
    """The page of ``svledger timeline``, from the cluster's log as it is now."""
    views = request.app[_VIEWS]
    views.fold(request.match_info["cluster"])
    try:
        page = await timeline_page(
            views.settings, request.match_info["cluster"], request.match_info["resource"]
        )
    except ResourceNameError as error:
        raise ApiError(404, "NotFound", str(error)) from error
    return web.Response(text=page, content_type="text/html")


# --------------------------------------------------------------------------- discovery


async def _version(request: web.Request) -> web.StreamResponse:
    """svledger's version, in the fields upstream's ``version.Info`` always fills."""
    from importlib.metadata import version

    release = version("svledger")
    major, minor, *_ = release.split(".")
    return _json(
        {"major": major, "minor": minor, "gitVersion": f"v{release}", "platform": "svledger"}
    )


def _json(body: JSON) -> web.Response:
    """A JSON response typed ``application/json`` as upstream's (no charset parameter)."""
    return web.Response(body=resources.go_json_body(body), content_type="application/json")


def _asks_aggregated(request: web.Request) -> bool:
    """Whether the client asks for aggregated discovery (``apidiscovery.k8s.io`` v2)
    before plain JSON, its Accept header's clauses ranked as upstream ranks them. As
    upstream's from 1.35 (AggregatedDiscoveryRemoveBetaType, locked on), v2beta1 is
    not served: a clause asking for it is passed over."""
    for media_type, subtype, params in negotiation.clauses(request.headers.get("Accept", "")):
        if (
            params.get("as") == "APIGroupDiscoveryList"
            and params.get("g") == AGGREGATED_DISCOVERY
            and params.get("v") == "v2"
        ):
            return True
        if f"{media_type}/{subtype}" in ("application/json", "*/*") and not params:
            return False
    return False


def _discovery(request: web.Request, legacy: JSON, *, core: bool) -> web.Response:
    """The aggregated discovery document if the client asks for it first, else the
    legacy list in the media type it asks for (406 if none is served)."""
    _cluster_view_check(request)
    if not _asks_aggregated(request):
        return _respond(
            negotiation.negotiate(request.headers.get("Accept", ""), convert=False), legacy
        )
    body = resources.go_json_body(
        resources.aggregated_discovery(f"{AGGREGATED_DISCOVERY}/v2", core=core)
    )
    # As upstream's ServeHTTPWithETag: cacheable, and 304 to a client that has it.
    etag = f'"{hashlib.sha512(body).hexdigest().upper()}"'
    headers = {"ETag": etag, "Vary": "Accept", "Cache-Control": "public"}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    content_type = f"application/json;g={AGGREGATED_DISCOVERY};v=v2;as=APIGroupDiscoveryList"
    return web.Response(body=body, headers={**headers, "Content-Type": content_type})


async def _api(request: web.Request) -> web.StreamResponse:
    return _discovery(request, resources.api_versions(request.host), core=True)


async def _apis(request: web.Request) -> web.StreamResponse:
    return _discovery(request, resources.group_list(), core=False)


async def _core(request: web.Request) -> web.StreamResponse:
    _cluster_view_check(request)
    return _json(resources.core_resources())


async def _group(request: web.Request) -> web.StreamResponse:
    _cluster_view_check(request)
    group = request.match_info["group"]
    if group not in resources.groups():
        raise _no_such_path(request)
    return _json(resources.group_of(group))


async def _group_version(request: web.Request) -> web.StreamResponse:
    _cluster_view_check(request)
    found = resources.resource_list(request.match_info["group"], request.match_info["version"])
    if found is None:
        raise _no_such_path(request)
    return _json(found)


async def _openapi_index(request: web.Request) -> web.StreamResponse:
    _cluster_view_check(request)
    return _json(openapi.index(request.path.removesuffix("/openapi/v3")))


async def _openapi_document(request: web.Request) -> web.StreamResponse:
    """A group version's OpenAPI v3 document, as upstream's handler serves one: its
    ETag the document's hash, 304 to a client that has it; asked with the current
    ``hash`` (as the index links it), cacheable for a year; with another, a 301 to the
    current one's URL."""
    _cluster_view_check(request)
    path = request.match_info["path"]
    document = openapi.document(path)
    if document is None:
        raise _no_such_path(request)
    current = openapi.document_hash(path)
    headers = {"ETag": f'"{current}"', "Vary": "Accept"}
    if asked := request.query.get("hash"):
        if asked != current:
            prefix = request.path.removesuffix(f"/openapi/v3/{path}")
            raise web.HTTPMovedPermanently(openapi.document_url(prefix, path))
        headers["Cache-Control"] = "public, immutable"
        headers["Expires"] = email.utils.format_datetime(
            datetime.now(UTC) + timedelta(days=365), usegmt=True
        )
    # As Go's http.ServeContent reads it: a list, weak tags matching too.
    held = {
        tag.strip().removeprefix("W/")
        for tag in request.headers.get("If-None-Match", "").split(",")
    }
    if held & {headers["ETag"], "*"}:
        return web.Response(status=304, headers=headers)
    return web.Response(body=document, content_type="application/json", headers=headers)


def _cluster_view_check(request: web.Request) -> None:
    request.app[_VIEWS].fold(request.match_info["cluster"])


# --------------------------------------------------------------------------- access reviews


async def _access_review(request: web.Request) -> web.StreamResponse:
    return await _answer_review(request, access.access_review)


async def _rules_review(request: web.Request) -> web.StreamResponse:
    return await _answer_review(request, access.rules_review)


async def _self_review(request: web.Request) -> web.StreamResponse:
    return await _answer_review(request, lambda body: access.self_review(body, request[_USER]))


async def _answer_review(request: web.Request, answer: Callable[[Any], JSON]) -> web.Response:
    """Create a review (:mod:`readapi.access`): read the object posted, answer it with
    201 Created, as upstream does, in the media type the request accepts. Nothing is
    stored; a review is only created (405 for any other method)."""
    _cluster_view_check(request)
    if request.method != "POST":
        return _method_not_allowed(request)
    output = negotiation.negotiate(request.headers.get("Accept", ""), convert=False)
    body = negotiation.read_body(request.content_type, await request.read())
    response = _respond(output, answer(body))
    response.set_status(201)
    return response


# --------------------------------------------------------------------------- objects


def _kind(request: web.Request) -> Kind:
    info = request.match_info
    kind = resources.kind_of(info["group"], info["version"], info["resource"])
    if kind is None:
        raise _no_such_path(request)
    if "namespace" in info and not kind.namespaced:
        raise _no_such_path(request)  # upstream registers no such route
    return kind


async def _view(request: web.Request, resource_version: int | None = None) -> View:
    """The view a request reads: at its ``/at/`` point or resourceVersion, else live."""
    views = request.app[_VIEWS]
    cluster = request.match_info["cluster"]
    point = request.match_info.get("point")
    if point is not None:
        at = parse_point(point)
        if resource_version is None:
            return await views.view_at(cluster, at)
        # A later page under /at/: timed as the first page was.
        view = await views.view_at(cluster, resource_version)
        return view if isinstance(at, int) else dataclasses.replace(view, time=at)
    if resource_version is not None:
        # An exact resourceVersion or a later page: its objects are of then, their ages
        # of now, as upstream's Table cells are computed when the request is served.
        return dataclasses.replace(await views.view_at(cluster, resource_version), time=_now())
    return views.fold(cluster).view(time=_now())


def _now() -> datetime:
    return datetime.now(UTC)


def parse_point(text: str) -> int | datetime:
    """An ``/at/`` point: an offset (the resourceVersion shown) or an RFC 3339 time."""
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        time = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(
            400,
            "BadRequest",
            f"point {text!r} is neither an offset (a resourceVersion, e.g. 1234) nor an "
            "RFC 3339 time (e.g. 2026-11-02T10:00:00Z)",
        ) from None
    if time.tzinfo is None:
        raise ApiError(
            400,
            "BadRequest",
            f"time {text!r} has no zone; add one, e.g. {time.isoformat()}Z for UTC",
        )
    return time


def _selection(request: web.Request, kind: Kind) -> Selection:
    query = request.query
    return Selection(
        namespace=request.match_info.get("namespace"),
        labels=resources.parse_label_selector(query.get("labelSelector", "")),
        # Its fields are checked after the list options (_known_fields), as upstream.
        fields=resources.parse_field_selector(query.get("fieldSelector", "")),
    )


def _known_fields(selection: Selection, kind: Kind) -> None:
    resources.check_field_selector(selection.fields, kind.group, kind.namespaced)


def _int_parameter(request: web.Request, name: str) -> int | None:
    text = request.query.get(name, "")
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ApiError(400, "BadRequest", f"{name}={text!r} is not a non-negative integer")
    return int(text)


def _limit(request: web.Request) -> int | None:
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


def _flag(request: web.Request, name: str) -> bool | None:
    """A boolean query parameter as upstream decodes one (``Convert_Slice_string_To_bool``):
    absent is None; ``0`` and ``false`` (any case) are false; anything else, ``True`` as
    Python clients send it or an empty value, is true."""
    value = request.query.get(name)
    if value is None:
        return None
    return not (value == "0" or value.lower() == "false")


def _watching(request: web.Request) -> bool:
    """``watch`` set, or a path of upstream's deprecated ``/watch/`` form."""
    return "watch" in request.match_info or bool(_flag(request, "watch"))


async def _member(request: web.Request) -> web.StreamResponse:
    kind = _kind(request)
    if kind.namespaced and "namespace" not in request.match_info:
        # Upstream registers a namespaced kind's objects under their namespace only.
        raise _no_such_path(request)
    output = _output(request, streams="watch" in request.match_info)
    name = request.match_info["name"]
    # As upstream's request info: a GET that names an object is a get, ``watch=true``
    # or not; only the deprecated ``/watch/`` path watches one object.
    if "watch" in request.match_info:
        selection = dataclasses.replace(_selection(request, kind), name=name)
        # As upstream: a field selector on one object's watch must pin its name.
        if selection.fields and not any(
            r.key == "metadata.name" and r.operator == "=" and r.values == {name}
            for r in selection.fields
        ):
            raise ApiError(
                400, "BadRequest", "fieldSelector metadata.name doesn't match requested name"
            )
        _check_list_options(request, watch=True)
        _known_fields(selection, kind)
        return await _watch(request, kind, selection, output)
    view = await _view(request, await _exact_resource_version(request, listing=False))
    selection = Selection(namespace=request.match_info.get("namespace"), name=name)
    for row, obj in kind.selected(view, selection):
        if output.convert == "Table":
            table = resources.table(
                kind,
                [(row, obj)],
                view,
                api_version=output.api_version,
                include_object=_include_object(request),
            )
            # One object's Table carries that object's resourceVersion, as upstream's.
            table["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            return _respond(output, table)
        if output.convert == "PartialObjectMetadata":
            return _respond(output, resources.partial_metadata(obj, output.api_version))
        if output.convert == "PartialObjectMetadataList":
            raise negotiation.not_acceptable(
                "you requested PartialObjectMetadataList, but the requested object is not "
                f"a list ({kind.kind})"
            )
        return _respond(output, obj)
    raise ApiError(
        404,
        "NotFound",
        f'{kind.resource}.{kind.group} "{name}" not found',
        {"name": name, "group": kind.group, "kind": kind.resource},
    )


async def _exact_resource_version(
    request: web.Request, *, listing: bool = True, limit: int | None = None
) -> int | None:
    """A resourceVersion the request must be served at, else None (the latest).

    ``resourceVersionMatch=Exact``, or, as upstream's legacy rule, a list with a
    ``limit`` and a resourceVersion but no match, is served at that offset. Otherwise
    a resourceVersion is "not older than": served at the latest. Either way only once
    the fold has reached it; a fold still behind after :data:`FRESHNESS_WAIT_SECONDS`
    answers upstream's 504 "Too large resource version", which tells clients to retry.
    """
    value = _resource_version(request, listing=listing)
    if value is None:
        return None
    match = request.query.get("resourceVersionMatch", "")
    await _fresh(request, value)  # upstream waits for an exact snapshot too
    if match == "Exact" or (match == "" and limit):
        return value
    return None


def _resource_version(request: web.Request, *, listing: bool) -> int | None:
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


async def _fresh(request: web.Request, offset: int) -> None:
    """Return once the cluster's fold has reached ``offset``; else upstream's 504."""
    views = request.app[_VIEWS]
    live = views.fold(request.match_info["cluster"])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FRESHNESS_WAIT_SECONDS
    while offset > live.offset and loop.time() < deadline:
        await views.changed(deadline - loop.time())
    if offset > live.offset:
        raise ApiError(
            504,
            "Timeout",
            f"Timeout: Too large resource version: {offset}, current: {live.offset}",
            {
                "causes": [
                    {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                ],
                "retryAfterSeconds": 1,
            },
        )


def _check_list_options(request: web.Request, watch: bool) -> None:
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
        message = f"Unsupported value: {resources.go_json(match)}: supported values: {listed}"
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
        raise resources.invalid("ListOptions", "meta.k8s.io", causes)
    # Then, as upstream's storage layer, after the handler's validation:
    if query.get("continue") and version not in ("", "0") and not watch:
        raise ApiError(
            400, "BadRequest", "specifying resource version is not allowed when using continue"
        )


async def _collection(request: web.Request) -> web.StreamResponse:
    kind = _kind(request)
    output = _output(request, streams=True)
    selection = _selection(request, kind)
    watch = _watching(request)
    _check_list_options(request, watch)
    _known_fields(selection, kind)
    if watch:
        return await _watch(request, kind, selection, output)
    limit = _limit(request)
    token = request.query.get("continue", "")
    after = ""
    resource_version: int | None = None
    if token:
        resource_version, after = resources.parse_continue(token)
    else:
        resource_version = await _exact_resource_version(request, limit=limit)
    view = await _view(request, resource_version)
    # Everything in the request's namespace, as upstream's list reads its key range; the
    # selectors choose among them.
    scope = kind.selected(view, Selection(namespace=selection.namespace))
    if not token and _one_key(kind, selection):
        limit = None  # upstream reads the one key, never a page of a range
    chosen, last = resources.page([obj for _, obj in scope], after, limit, selection.matches)
    names = {obj["metadata"]["name"] for obj in chosen}
    next_token = resources.continue_token(view.offset, last) if last else ""
    remaining = None
    if last and not selection.labels and not selection.fields:
        remaining = sum(1 for _, obj in scope if obj["metadata"]["name"] > last)
    if output.convert == "Table":
        pairs = [(row, obj) for row, obj in scope if obj["metadata"]["name"] in names]
        body = resources.table(
            kind,
            pairs,
            view,
            api_version=output.api_version,
            include_object=_include_object(request),
            token=next_token,
            remaining=remaining,
        )
    elif output.convert == "PartialObjectMetadataList":
        body = resources.partial_metadata_list(
            chosen, output.api_version, view.offset, next_token, remaining
        )
    elif output.convert == "PartialObjectMetadata":
        raise negotiation.not_acceptable(
            "you requested PartialObjectMetadata, but the requested object is a list "
            f"({kind.kind}List)"
        )
    else:
        body = resources.object_list(kind, chosen, view.offset, next_token, remaining)
    return _respond(output, body)


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


# --------------------------------------------------------------------------- negotiation


def _output(request: web.Request, *, streams: bool) -> negotiation.Output:
    """The representation a kind's route answers in: a get's, or (``streams``) a
    list's or a watch's, which may also be a stream."""
    accept = request.headers.get("Accept", "")
    produces = negotiation.SERVED + negotiation.STREAMED if streams else negotiation.SERVED
    negotiation.check_route(accept, produces)
    return negotiation.negotiate(accept)


def _respond(output: negotiation.Output, body: JSON) -> web.Response:
    return web.Response(body=output.encode(body), content_type=output.media_type)


def _include_object(request: web.Request) -> str:
    """A Table's ``includeObject``, checked as upstream's ``ValidateTableOptions``."""
    value = request.query.get("includeObject", "")
    if value not in ("", "None", "Metadata", "Object"):
        raise ApiError(
            400,
            "BadRequest",
            "Unable to convert to Table as requested: "
            f"includeObject: Invalid value: {resources.go_json(value)}: "
            "must be 'Metadata', 'Object', 'None', or empty",
        )
    return value or "Metadata"


# --------------------------------------------------------------------------- watch


async def _watch(
    request: web.Request, kind: Kind, selection: Selection, output: negotiation.Output
) -> web.StreamResponse:
    negotiation.check_stream(output)
    if "point" in request.match_info:
        raise ApiError(
            400,
            "BadRequest",
            "a view of the past cannot be watched: watch the live path with "
            "?watch=true&resourceVersion=OFFSET to stream the changes after OFFSET",
        )
    views = request.app[_VIEWS]
    fold = views.fold(request.match_info["cluster"])
    start = _resource_version(request, listing=False)
    initial = _flag(request, "sendInitialEvents")
    # Upstream: without sendInitialEvents, initial events only when no resourceVersion
    # (or "0") is given; with it, exactly as it says.
    send_initial = start is None if initial is None else initial
    behind: ApiError | None = None
    if start is not None and send_initial:
        try:
            await _fresh(request, start)  # the initial state is not older than ``start``
        except ApiError as error:
            behind = error  # upstream's watch cache says so inside the stream
    # Upstream: none or 0 is between one and two minimum request timeouts.
    timeout = _int_parameter(request, "timeoutSeconds") or WATCH_TIMEOUT_SECONDS * (
        1.0 + random.random()
    )
    bookmarks = bool(_flag(request, "allowWatchBookmarks"))
    include = _include_object(request) if output.convert == "Table" else "Object"

    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    stream = _WatchStream(response, kind, selection, output, include)
    deadline = asyncio.get_running_loop().time() + timeout
    stop = request.app[_STOP]
    with contextlib.suppress(ConnectionResetError):
        if behind is not None:
            await stream.error(behind)
            return response
        if send_initial:
            view = fold.view(time=_now())
            for row, _ in kind.selected(view, selection):
                await stream.send("ADDED", row, view)
            # The view's offset, not the fold's: the fold may have moved on while the
            # events were sent, and what it folded meanwhile is sent next.
            cursor = view.offset
            # Upstream (WatchList on by default since 1.34) turns a watch from no
            # resourceVersion (or "0") into a watch list, so it too ends its initial
            # events with this bookmark when bookmarks are allowed.
            if bookmarks:
                await stream.bookmark(cursor, {INITIAL_EVENTS_END: "true"})
        else:
            cursor = fold.offset if start is None else start
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        # As upstream's watch cache, one bookmark right before the deadline, so that the
        # client resumes from as close to now as it can; none if that is already past.
        pre_timeout = deadline - PRE_TIMEOUT_BOOKMARK_SECONDS
        pre_timeout_sent = pre_timeout <= quiet_since
        # And, as its watchers, only a bookmark past the resourceVersion the watch
        # started from: a quiet watch gets none.
        origin = cursor
        while True:
            if cursor < fold.horizon:
                await stream.expired(cursor, fold.horizon)
                break
            sent, reached = await stream.changes(fold, cursor)
            if sent:
                quiet_since = loop.time()
            cursor = max(cursor, reached)  # a watch from ahead of the fold waits for it
            now = loop.time()
            if now >= deadline:
                break
            due = now - quiet_since >= request.app[_BOOKMARKS]
            if bookmarks and (due or (now >= pre_timeout and not pre_timeout_sent)):
                if cursor > origin:
                    await stream.bookmark(cursor)
                quiet_since = now
                pre_timeout_sent = pre_timeout_sent or now >= pre_timeout
            wake = deadline - now
            if bookmarks and not pre_timeout_sent:
                wake = pre_timeout - now
            wait = min(request.app[_BOOKMARKS], max(0.0, wake))
            await views.changed(wait)
            transport = request.transport
            if stop.is_set() or transport is None or transport.is_closing():
                break  # the server stops, or the client has gone
    return response


class _WatchStream:
    """One watch's response: encodes events as Kubernetes' watch stream does."""

    def __init__(
        self,
        response: web.StreamResponse,
        kind: Kind,
        selection: Selection,
        output: negotiation.Output,
        include: str,
    ) -> None:
        self.response = response
        self.kind = kind
        self.selection = selection
        self.output = output
        self.include = include
        self.first = True

    async def changes(self, fold: ClusterFold, cursor: int) -> tuple[bool, int]:
        """Send the fold's changes after ``cursor``; whether any was sent, and the offset
        the fold had reached when they were taken (it may move on while they are sent:
        what it folds meanwhile is for the next call)."""
        reached = fold.offset
        pending: list[Change] = []
        for change in reversed(fold.changes):
            if change.offset <= cursor:
                break
            pending.append(change)
        sent = False
        for change in reversed(pending):
            if resources.row_kind(change.row) is not self.kind:
                continue
            view = View(
                cluster=fold.cluster,
                offset=change.offset,
                time=_now(),
                state=fold.state,
                created={(self.kind.kind, tuple(change.row.key[1:])): change.created},
            )
            sent |= await self._change(change, view)
        return sent, reached

    async def _change(self, change: Change, view: View) -> bool:
        now = self.selection.matches(self.kind.object(change.row, view))
        before = change.previous is not None and self.selection.matches(
            self.kind.object(change.previous, view)
        )
        # A deletion, or a move out of the selection, sends the object's last content
        # at the change's resourceVersion, as upstream's watch does.
        if change.type == "DELETED":
            return await self.send("DELETED", change.row, view, change.offset) if now else False
        if now and (change.type == "ADDED" or before):
            return await self.send(change.type, change.row, view)
        if now:
            return await self.send("ADDED", change.row, view)  # moved into the selection
        if before:
            return await self.send("DELETED", change.previous, view, change.offset)
        return False

    async def send(self, event_type: str, row: Any, view: View, offset: int | None = None) -> bool:
        """Send ``row``; ``offset``, if given, is its resourceVersion (a deletion's)."""
        obj = self.kind.object(row, view)
        if not self.selection.matches(obj) and event_type != "DELETED":
            return False
        if offset is not None:
            obj["metadata"]["resourceVersion"] = str(offset)
        if self.output.convert == "Table":
            body: JSON = resources.table(
                self.kind,
                [(row, obj)],
                view,
                api_version=self.output.api_version,
                include_object=self.include,
                with_columns=self.first,
            )
            # Each event's Table carries its object's resourceVersion, as upstream's.
            body["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            self.first = False
        elif self.output.convert == "PartialObjectMetadata":
            body = resources.partial_metadata(obj, self.output.api_version)
        else:
            # Upstream sends the object as it is when it cannot convert it, as for a
            # PartialObjectMetadataList asked of a watch.
            body = obj
        await self._write({"type": event_type, "object": body})
        return True

    async def bookmark(self, offset: int, annotations: dict[str, str] | None = None) -> None:
        body = self.kind.bookmark(offset, annotations)
        if self.output.convert == "PartialObjectMetadata":
            body = resources.partial_metadata(body, self.output.api_version)
        elif self.output.convert == "Table":
            body = resources.bookmark_table(
                self.kind,
                body,
                api_version=self.output.api_version,
                include_object=self.include,
                with_columns=self.first,
            )
            self.first = False
        await self._write({"type": "BOOKMARK", "object": body})

    async def expired(self, cursor: int, horizon: int) -> None:
        # As upstream's watch cache: the oldest resourceVersion still accepted.
        message = f"too old resource version: {cursor} ({horizon})"
        await self.error(ApiError(410, "Expired", message))

    async def error(self, error: ApiError) -> None:
        """An ERROR event carrying ``error``'s Status; upstream's watch then ends."""
        status = resources.status(error.code, error.reason, str(error), error.details)
        await self._write({"type": "ERROR", "object": status})

    async def _write(self, event: JSON) -> None:
        await self.response.write(resources.go_json_body(event))
