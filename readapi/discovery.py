"""Discovery: what a client reads first to learn what the server serves, as
kube-apiserver 1.37 answers it.

* ``/version``: svledger's version, in the fields upstream's ``version.Info`` fills.
* ``/api`` and ``/api/v1``: the core group's ``v1``, which serves no kinds here;
  ``/apis`` the groups, ``/apis/GROUP`` one, and ``/apis/GROUP/VERSION`` its kinds, each
  with its ``storageVersionHash``.
* Aggregated discovery (``apidiscovery.k8s.io`` v2) at ``/api`` and ``/apis`` when the
  client asks for it first, as kubectl does, else the legacy lists; v2beta1 is not
  served, as upstream's from 1.35. As upstream's, it is cacheable: an ETag (304 to a
  client that has it), ``Vary: Accept`` and ``Cache-Control: public``.

The documents are pure functions of the served kinds (:mod:`readapi.kinds`); the
handlers below them serve them.
"""

from __future__ import annotations

import hashlib
from typing import Final

from aiohttp import web

from ledger.hashing import hash_of_stored
from readapi import negotiation
from readapi.clusters import check_cluster
from readapi.gojson import JSON, go_json_body
from readapi.kinds import CUSTOM_GROUPS, Kind, groups
from readapi.responses import json_response, no_such_path, respond

AGGREGATED_DISCOVERY: Final = "apidiscovery.k8s.io"
_VERBS: Final = ["get", "list", "watch"]


def api_versions(server_address: str) -> JSON:
    """``/api``: the legacy core group, which serves no kinds here, and where a client
    from anywhere reaches the server (``server_address``), as upstream's says."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def core_resources() -> JSON:
    """``/api/v1``: no core resources; without an ``apiVersion``, as upstream's."""
    return {"kind": "APIResourceList", "groupVersion": "v1", "resources": []}


def group_list() -> JSON:
    """``/apis`` in the legacy (unaggregated) format: its items carry no type, as
    kube-apiserver's do not."""
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(map(_group, groups()))}


def group_of(name: str) -> JSON:
    """``/apis/GROUP``."""
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}


def _group(name: str) -> JSON:
    version = groups()[name][0].version
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


def resource_list(group: str, version: str) -> JSON | None:
    """``/apis/GROUP/VERSION``, or None for a group version not served."""
    kinds = [kind for kind in groups().get(group, []) if kind.version == version]
    if not kinds:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}",
        "resources": [
            {
                "name": kind.resource,
                "singularName": kind.singular,
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": _VERBS,
                # As upstream's (and a CRD's) discovery: the hash of the version the
                # kind is stored in, the one it is served in here.
                "storageVersionHash": hash_of_stored(f"{kind.group}/{kind.version}", kind.kind),
            }
            for kind in kinds
        ],
    }


def aggregated_discovery(api_version: str, *, core: bool) -> JSON:
    """``APIGroupDiscoveryList`` (``apidiscovery.k8s.io`` v2 or v2beta1), which kubectl asks first.

    ``core`` is for ``/api``: its one version, ``v1``, with no kinds here (as the
    legacy ``/api`` and ``/api/v1`` say).
    """
    items: list[JSON]
    if core:
        version: JSON = {"version": "v1", "resources": [], "freshness": "Current"}
        items = [{"metadata": {}, "versions": [version]}]
    else:
        items = [
            {
                "metadata": {"name": name},
                "versions": [
                    {
                        "version": kinds[0].version,
                        "resources": [_discovered(kind) for kind in kinds],
                        "freshness": "Current",
                    }
                ],
            }
            for name, kinds in groups().items()
        ]
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": api_version,
        "metadata": {},
        "items": items,
    }


def _discovered(kind: Kind) -> JSON:
    # A built-in kind's response kind has an empty group and version (the resource's
    # own), as kube-apiserver writes them; a custom resource's names them.
    custom = kind.group in CUSTOM_GROUPS
    return {
        "resource": kind.resource,
        "responseKind": {
            "group": kind.group if custom else "",
            "version": kind.version if custom else "",
            "kind": kind.kind,
        },
        "scope": "Namespaced" if kind.namespaced else "Cluster",
        "singularResource": kind.singular,
        "verbs": _VERBS,
    }


# --------------------------------------------------------------------------- handlers


async def handle_version(request: web.Request) -> web.StreamResponse:
    """svledger's version, in the fields upstream's ``version.Info`` always fills."""
    from importlib.metadata import version

    release = version("svledger")
    major, minor, *_ = release.split(".")
    return json_response(
        {"major": major, "minor": minor, "gitVersion": f"v{release}", "platform": "svledger"}
    )


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
    check_cluster(request)
    if not _asks_aggregated(request):
        return respond(
            negotiation.negotiate(request.headers.get("Accept", ""), convert=False), legacy
        )
    body = go_json_body(aggregated_discovery(f"{AGGREGATED_DISCOVERY}/v2", core=core))
    # As upstream's ServeHTTPWithETag: cacheable, and 304 to a client that has it.
    etag = f'"{hashlib.sha512(body).hexdigest().upper()}"'
    headers = {"ETag": etag, "Vary": "Accept", "Cache-Control": "public"}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    content_type = f"application/json;g={AGGREGATED_DISCOVERY};v=v2;as=APIGroupDiscoveryList"
    return web.Response(body=body, headers={**headers, "Content-Type": content_type})


async def handle_api(request: web.Request) -> web.StreamResponse:
    return _discovery(request, api_versions(request.host), core=True)


async def handle_apis(request: web.Request) -> web.StreamResponse:
    return _discovery(request, group_list(), core=False)


async def handle_core(request: web.Request) -> web.StreamResponse:
    check_cluster(request)
    return json_response(core_resources())


async def handle_group(request: web.Request) -> web.StreamResponse:
    check_cluster(request)
    group = request.match_info["group"]
    if group not in groups():
        raise no_such_path(request)
    return json_response(group_of(group))


async def handle_group_version(request: web.Request) -> web.StreamResponse:
    check_cluster(request)
    found = resource_list(request.match_info["group"], request.match_info["version"])
    if found is None:
        raise no_such_path(request)
    return json_response(found)
