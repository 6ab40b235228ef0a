"""``svledger serve``: the ledger's views as a read-only Kubernetes API, on aiohttp.

Every cluster is a Kubernetes API server of its own under ``/clusters/CLUSTER``, and as
it stood at a point of its log under ``/clusters/CLUSTER/at/POINT``
(:mod:`readapi.clusters`). This module is the application: its routes, its middlewares
and the paths that are the server's own. What it speaks as kube-apiserver does is served
by

* :mod:`readapi.discovery`: ``/version``, ``/api``, ``/apis`` and below them;
* :mod:`readapi.openapi`: ``/openapi/v3`` and a document per group version, which
  ``kubectl explain`` reads;
* :mod:`readapi.objects`: get and list of a kind's objects, and :mod:`readapi.watch`
  their watches;
* :mod:`readapi.access`: ``SelfSubjectAccessReview`` and ``SelfSubjectRulesReview``
  (``authorization.k8s.io/v1``) and ``SelfSubjectReview`` (``authentication.k8s.io/v1``):
  ``kubectl auth can-i`` is told every read is allowed and nothing else, ``kubectl auth
  whoami`` the token file's user.

Here:

* errors as a ``Status`` (:mod:`readapi.status`), written as upstream's encoder writes
  it (compact, its field order, a newline at the end), in JSON or YAML as the ``Accept``
  header asks: 404 for unknown paths (whatever the method), names and clusters, 405 for
  every method but GET (HEAD among them) on a kind's objects, on ``/version``, ``/api``,
  ``/api/v1`` and a group version's discovery, as upstream's routes (nothing is written
  through this API: the ledger is appended to only by its producers; the migrator's
  kinds too, whose custom resources' handler upstream answers HEAD on as GET, and any
  method on their group version's discovery), while ``/apis`` and ``/apis/GROUP`` answer
  any method as GET, as upstream's handlers do, 401 without a valid bearer token when
  ``--token-file`` is given (``/healthz``, ``/livez`` and ``/readyz`` stay open), 400 for
  bad parameters (label selectors whose keys or values are not label names among them);
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
import dataclasses
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from aiohttp import web

from ledger.errors import UsageError
from ledger.identity import LEASE_NAMESPACE
from ledger.metrics import format_address
from projections.history import ResourceNameError
from readapi import access, discovery, objects, openapi, watch
from readapi.clusters import VIEWS, check_cluster
from readapi.kinds import kind_of
from readapi.ledger import (
    LedgerViews,
    NotCaughtUp,
    PointOutOfRange,
    UnknownCluster,
    timeline_page,
)
from readapi.responses import json_response, method_not_allowed, no_such_path, status_response
from readapi.status import ApiError

log = logging.getLogger(__name__)

_OPEN_PATHS: Final = frozenset({"/healthz", "/livez", "/readyz"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True, slots=True)
class ServeOptions:
    """How ``serve`` listens; TLS when both files are given, bearer tokens when a file is."""

    host: str = "127.0.0.1"
    port: int = 8080
    token_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    bookmark_seconds: float = watch.BOOKMARK_SECONDS


def app(
    views: LedgerViews, options: ServeOptions = ServeOptions(), stop: asyncio.Event | None = None
) -> web.Application:
    """The aiohttp application over ``views``; setting ``stop`` ends its watches."""
    application = web.Application(middlewares=[_errors, _authenticate])
    application[VIEWS] = views
    application[watch.STOP] = stop or asyncio.Event()
    application[access.TOKENS] = (
        access.read_tokens(options.token_file) if options.token_file else {}
    )
    application[watch.BOOKMARK_INTERVAL] = options.bookmark_seconds
    application.on_response_prepare.append(_no_cache)
    application.router.add_get("/healthz", _healthz)
    application.router.add_get("/livez", _healthz)
    application.router.add_get("/readyz", _readyz)
    application.router.add_get("/clusters/{cluster}/timeline/{resource}", _timeline)
    # Upstream's API paths answer GET only (HEAD too is 405, see _not_found), but for
    # /apis and /apis/GROUP, which its handlers answer whatever the method.
    get = functools.partial(application.router.add_get, allow_head=False)
    for prefix in ("/clusters/{cluster}", "/clusters/{cluster}/at/{point}"):
        get(prefix + "/version", discovery.handle_version)
        get(prefix + "/api", discovery.handle_api)
        get(prefix + "/api/v1", discovery.handle_core)
        get(prefix + "/api/v1/namespaces/{namespace}", _namespace)
        application.router.add_route("*", prefix + "/apis", discovery.handle_apis)
        application.router.add_route("*", prefix + "/apis/{group}", discovery.handle_group)
        get(prefix + "/apis/{group}/{version}", discovery.handle_group_version)
        application.router.add_get(prefix + "/openapi/v3", openapi.handle_index)
        application.router.add_get(prefix + "/openapi/v3/{path:.+}", openapi.handle_document)
        reviews = prefix + "/apis/authorization.k8s.io/v1/"
        application.router.add_route(
            "*", reviews + "selfsubjectaccessreviews", access.handle_access_review
        )
        application.router.add_route(
            "*", reviews + "selfsubjectrulesreviews", access.handle_rules_review
        )
        whoami = prefix + "/apis/authentication.k8s.io/v1/selfsubjectreviews"
        application.router.add_route("*", whoami, access.handle_self_review)
        # Upstream's deprecated watch paths: .../{version}/watch/..., as ?watch=true.
        watched = prefix + "/apis/{group}/{version}/{watch:watch}"
        get(watched + "/namespaces/{namespace}/{resource}", objects.handle_collection)
        get(watched + "/namespaces/{namespace}/{resource}/{name}", objects.handle_member)
        get(watched + "/{resource}", objects.handle_collection)
        get(watched + "/{resource}/{name}", objects.handle_member)
        get(prefix + "/apis/{group}/{version}/{resource}", objects.handle_collection)
        get(prefix + "/apis/{group}/{version}/{resource}/{name}", objects.handle_member)
        namespaced = prefix + "/apis/{group}/{version}/namespaces/{namespace}/{resource}"
        get(namespaced, objects.handle_collection)
        get(namespaced + "/{name}", objects.handle_member)
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
        return status_response(request, error.code, error.reason, str(error), error.details)
    except UnknownCluster as error:
        return status_response(request, 404, "NotFound", str(error))
    except NotCaughtUp as error:
        return status_response(
            request, 503, "ServiceUnavailable", str(error), {"retryAfterSeconds": 1}
        )
    except PointOutOfRange as error:
        return status_response(request, 400, "BadRequest", str(error))
    except web.HTTPMethodNotAllowed:
        return method_not_allowed(request)


@web.middleware
async def _authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    tokens = request.app[access.TOKENS]
    request[access.USER] = access.ANONYMOUS
    if tokens and request.path not in _OPEN_PATHS:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        user = tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            return status_response(
                request, 401, "Unauthorized", "Unauthorized: give a valid bearer token"
            )
        request[access.USER] = user
    return await handler(request)


# --------------------------------------------------------------------------- routing


async def _not_found(request: web.Request) -> web.StreamResponse:
    """404 for a path nothing is served at, whatever the method, as upstream; 405 for
    another method than GET (HEAD among them) on a path GET answers at: a served kind's
    objects, the version, the core discovery paths, a served group version's, and a
    namespace (nothing is written through this API: the ledger is appended to only by
    its producers)."""
    if request.method != "GET":
        served = await request.app.router.resolve(request.clone(method="GET"))
        handler = getattr(served, "handler", None)
        if handler in (objects.handle_collection, objects.handle_member):
            kind = kind_of(served["group"], served["version"], served["resource"])
            # Only where upstream registers a route: a kind in its own scope.
            allowed = kind is not None and (
                kind.namespaced == ("namespace" in served)
                or (handler is objects.handle_collection and kind.namespaced)
            )
        elif handler is discovery.handle_group_version:
            allowed = discovery.resource_list(served["group"], served["version"]) is not None
        else:
            allowed = handler in (
                discovery.handle_version,
                discovery.handle_api,
                discovery.handle_core,
                _namespace,
            )
        if allowed:
            return method_not_allowed(request)
    raise no_such_path(request)


# --------------------------------------------------------------------------- the server's own paths


async def _namespace(request: web.Request) -> web.StreamResponse:
    """``/api/v1/namespaces/NAME``, which kubectl reads to tell a missing object from a
    missing namespace: ``kube-system``, where the leases are, exists; no other does.
    (Not in discovery: the API serves no namespace objects beyond this answer.)"""
    check_cluster(request)
    name = request.match_info["namespace"]
    if name != LEASE_NAMESPACE:
        raise ApiError(
            404,
            "NotFound",
            f'namespaces "{name}" not found',
            {"name": name, "kind": "namespaces"},
        )
    return json_response(
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
    if request.app[VIEWS].ready.is_set():
        return web.Response(text="ok")
    return web.Response(text="catching up with the log", status=503)


async def _timeline(request: web.Request) -> web.StreamResponse:
    """The page of ``svledger timeline``, from the cluster's log as it is now."""
    views = request.app[VIEWS]
    views.fold(request.match_info["cluster"])
    try:
        page = await timeline_page(
            views.settings, request.match_info["cluster"], request.match_info["resource"]
        )
    except ResourceNameError as error:
        raise ApiError(404, "NotFound", str(error)) from error
    return web.Response(text=page, content_type="text/html")
