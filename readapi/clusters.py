"""Which cluster a request reads, and which view of it: live, past, or at a resourceVersion.

Every cluster is a Kubernetes API server of its own under ``/clusters/CLUSTER``, so
``kubectl --server http://HOST:PORT/clusters/CLUSTER get storageversions`` and the
``kubernetes`` client (``host`` set to that URL) read it unchanged; under
``/clusters/CLUSTER/at/POINT`` it answers as the cluster stood at ``POINT`` (an offset
in the cluster's partition, the resourceVersion the API shows, or an RFC 3339 time).
A cluster the log holds no event of is a 404.

A resourceVersion is "not older than", served at the latest, unless
``resourceVersionMatch=Exact`` asks for it (the past, as under ``/at``) or, as upstream's
legacy exact rule, a list has a ``limit`` and a resourceVersion but no match: it is then
served at that resourceVersion. Either way only once the fold has reached it: a
resourceVersion the fold has not reached after 3 s is answered 504 with ``Retry-After``
(a watch list: 200, then that Status in an ERROR event, as upstream's watch cache,
:mod:`readapi.watch`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Final

from aiohttp import web

from readapi import parameters
from readapi.kinds import View
from readapi.ledger import LedgerViews
from readapi.status import ApiError

FRESHNESS_WAIT_SECONDS: Final = 3.0  # upstream's watch cache waits as long to catch up
VIEWS: Final = web.AppKey("views", LedgerViews)


def check_cluster(request: web.Request) -> None:
    """Refuse a request for a cluster the views do not hold (a 404, or a 503 while they
    have not read the log up to where it ended at their start)."""
    request.app[VIEWS].fold(request.match_info["cluster"])


async def view(request: web.Request, resource_version: int | None = None) -> View:
    """The view a request reads: at its ``/at/`` point or resourceVersion, else live."""
    views = request.app[VIEWS]
    cluster = request.match_info["cluster"]
    point = request.match_info.get("point")
    if point is not None:
        at = parse_point(point)
        if resource_version is None:
            return await views.view_at(cluster, at)
        # A later page under /at/: timed as the first page was.
        page = await views.view_at(cluster, resource_version)
        return page if isinstance(at, int) else dataclasses.replace(page, time=at)
    if resource_version is not None:
        # An exact resourceVersion or a later page: its objects are of then, their ages
        # of now, as upstream's Table cells are computed when the request is served.
        return dataclasses.replace(await views.view_at(cluster, resource_version), time=now())
    return views.fold(cluster).view(time=now())


def now() -> datetime:
    """The time of a live view (and the ages its cells show)."""
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


async def exact_resource_version(
    request: web.Request, *, listing: bool = True, limit: int | None = None
) -> int | None:
    """A resourceVersion the request must be served at, else None (the latest).

    ``resourceVersionMatch=Exact``, or, as upstream's legacy rule, a list with a
    ``limit`` and a resourceVersion but no match, is served at that offset. Otherwise
    a resourceVersion is "not older than": served at the latest. Either way only once
    the fold has reached it; a fold still behind after :data:`FRESHNESS_WAIT_SECONDS`
    answers upstream's 504 "Too large resource version", which tells clients to retry.
    """
    value = parameters.resource_version(request, listing=listing)
    if value is None:
        return None
    match = request.query.get("resourceVersionMatch", "")
    await fresh(request, value)  # upstream waits for an exact snapshot too
    if match == "Exact" or (match == "" and limit):
        return value
    return None


async def fresh(request: web.Request, offset: int) -> None:
    """Return once the cluster's fold has reached ``offset``; else upstream's 504."""
    views = request.app[VIEWS]
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
