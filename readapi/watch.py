"""Watches: a kind's changes streamed as kube-apiserver's watch cache streams them.

* ``watch=true``: ADDED, MODIFIED and DELETED from ``resourceVersion`` on (from the
  current objects when it is absent or ``0``), a deletion at its own resourceVersion;
  of a collection (one object by a ``metadata.name`` field selector, as client-go
  watches one); the deprecated ``/apis/GROUP/VERSION/watch/...`` paths alike, of one
  object too (a GET naming an object is a get, ``watch`` or not, as upstream's).
* BOOKMARK events with ``allowWatchBookmarks`` (after a quiet spell, and once 2 s before
  ``timeoutSeconds`` ends, as upstream's watch cache, each only once the position is
  past the resourceVersion the watch started from, and holding the kind's empty object
  as upstream's, in a Table watch a Table of one row of that object's cells).
* An ERROR event with a 410 Expired Status for a resourceVersion older than the changes
  kept; ``timeoutSeconds`` (none or 0: 30 to 60 minutes).
* ``sendInitialEvents`` with ``resourceVersionMatch=NotOlderThan`` (client-go's watch
  list), or a watch from no resourceVersion (or ``0``), which upstream's default
  WatchList makes one: the current objects, then, with bookmarks, one annotated
  ``k8s.io/initial-events-end``. A watch list from a resourceVersion the fold has not
  reached after 3 s is a 200, then that 504 Status in an ERROR event, as upstream's
  watch cache (:mod:`readapi.clusters`).
* JSON only; a ``Table`` or ``PartialObjectMetadata`` event in the conversion asked for
  (:mod:`readapi.conversions`). A view of the past (``/at/``) cannot be watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any, Final

from aiohttp import web

from readapi import clusters, conversions, negotiation, parameters
from readapi.gojson import JSON, go_json_body
from readapi.kinds import Kind, View, row_kind
from readapi.ledger import Change, ClusterFold
from readapi.selectors import Selection
from readapi.status import ApiError, status

BOOKMARK_SECONDS: Final = 10.0
PRE_TIMEOUT_BOOKMARK_SECONDS: Final = 2.0  # upstream's cacheWatcher.nextBookmarkTime
WATCH_TIMEOUT_SECONDS: Final = 1800.0  # upstream's --min-request-timeout
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"  # the bookmark after initial events
BOOKMARK_INTERVAL: Final = web.AppKey("bookmark_seconds", float)  # a quiet spell's length
STOP: Final = web.AppKey("stop", asyncio.Event)  # set, it ends every watch


async def run(
    request: web.Request, kind: Kind, selection: Selection, output: negotiation.Output
) -> web.StreamResponse:
    """Stream the changes of ``kind``'s objects ``selection`` matches, in ``output``,
    until the watch times out, the server stops or the client goes."""
    negotiation.check_stream(output)
    if "point" in request.match_info:
        raise ApiError(
            400,
            "BadRequest",
            "a view of the past cannot be watched: watch the live path with "
            "?watch=true&resourceVersion=OFFSET to stream the changes after OFFSET",
        )
    views = request.app[clusters.VIEWS]
    fold = views.fold(request.match_info["cluster"])
    start = parameters.resource_version(request, listing=False)
    initial = parameters.flag(request, "sendInitialEvents")
    # Upstream: without sendInitialEvents, initial events only when no resourceVersion
    # (or "0") is given; with it, exactly as it says.
    send_initial = start is None if initial is None else initial
    behind: ApiError | None = None
    if start is not None and send_initial:
        try:
            await clusters.fresh(request, start)  # the initial state is not older than ``start``
        except ApiError as error:
            behind = error  # upstream's watch cache says so inside the stream
    # Upstream: none or 0 is between one and two minimum request timeouts.
    timeout = parameters.int_parameter(request, "timeoutSeconds") or WATCH_TIMEOUT_SECONDS * (
        1.0 + random.random()
    )
    bookmarks = bool(parameters.flag(request, "allowWatchBookmarks"))
    include = parameters.include_object(request) if output.convert == "Table" else "Object"

    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    stream = _WatchStream(response, kind, selection, output, include)
    deadline = asyncio.get_running_loop().time() + timeout
    stop = request.app[STOP]
    with contextlib.suppress(ConnectionResetError):
        if behind is not None:
            await stream.error(behind)
            return response
        if send_initial:
            view = fold.view(time=clusters.now())
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
            due = now - quiet_since >= request.app[BOOKMARK_INTERVAL]
            if bookmarks and (due or (now >= pre_timeout and not pre_timeout_sent)):
                if cursor > origin:
                    await stream.bookmark(cursor)
                quiet_since = now
                pre_timeout_sent = pre_timeout_sent or now >= pre_timeout
            wake = deadline - now
            if bookmarks and not pre_timeout_sent:
                wake = pre_timeout - now
            wait = min(request.app[BOOKMARK_INTERVAL], max(0.0, wake))
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
            if row_kind(change.row) is not self.kind:
                continue
            view = View(
                cluster=fold.cluster,
                offset=change.offset,
                time=clusters.now(),
                state=fold.state,
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
            body: JSON = conversions.table(
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
            body = conversions.partial_metadata(obj, self.output.api_version)
        else:
            # Upstream sends the object as it is when it cannot convert it, as for a
            # PartialObjectMetadataList asked of a watch.
            body = obj
        await self._write({"type": event_type, "object": body})
        return True

    async def bookmark(self, offset: int, annotations: dict[str, str] | None = None) -> None:
        body = self.kind.bookmark(offset, annotations)
        if self.output.convert == "PartialObjectMetadata":
            body = conversions.partial_metadata(body, self.output.api_version)
        elif self.output.convert == "Table":
            body = conversions.bookmark_table(
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
        body = status(error.code, error.reason, str(error), error.details)
        await self._write({"type": "ERROR", "object": body})

    async def _write(self, event: JSON) -> None:
        await self.response.write(go_json_body(event))
