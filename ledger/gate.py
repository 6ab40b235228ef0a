"""The write barrier: no write to a resource before its storage version is on record.

KEP-2339 makes an API server refuse writes to a resource until its storage version
for that resource is registered, so no object is ever persisted in a version the
cluster does not know about. Upstream's ``WithStorageVersionPrecondition`` filter
lets reads (get, list, watch) and non-resource requests through and answers
``503 ServiceUnavailable`` with

    wait for storage version registration to complete for resource: <gr>, last seen error: <err>

to writes of a resource whose registration is pending, ``<gr>`` being the
GroupResource (``deployments.apps``, or ``pods`` for the core group) and ``<err>``
the last error met while registering (``<nil>`` if none). Resources the server never
reports (not persisted) are not pending and pass.

:class:`WriteGate` is that decision as a plain predicate; the reporter marks
resources pending and registered. It is read from request-handling threads and
written from the reporter's event loop, so its state is an immutable mapping
replaced whole on every change. :class:`WriteGateMiddleware` puts it in front of
an ASGI application, resolving the resource from the request path the way the API
server's request-info resolver does.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Final, TypeAlias

from ledger.names import group_resource_string

GroupResource: TypeAlias = tuple[str, str]  # (group, resource), group "" for core

READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


class WriteGate:
    """Which resources are closed to writes, and why."""

    def __init__(self, pending: Iterable[GroupResource] = ()) -> None:
        # Pending resource -> last error met registering it (None: no error yet).
        self._pending: Mapping[GroupResource, str | None] = dict.fromkeys(pending)

    def close(self, resources: Iterable[GroupResource]) -> None:
        """Mark resources pending: their (new) storage version is not on record yet."""
        self._pending = {**self._pending, **{r: self._pending.get(r) for r in resources}}

    def open(self, resources: Iterable[GroupResource]) -> None:
        """Mark resources registered (or no longer served): writes pass."""
        done = set(resources)
        self._pending = {r: e for r, e in self._pending.items() if r not in done}

    def fail(self, resources: Iterable[GroupResource], error: str) -> None:
        """Remember why registering pending resources failed, for the 503 message."""
        pending = self._pending
        self._pending = {**pending, **{r: error for r in resources if r in pending}}

    @property
    def pending(self) -> frozenset[GroupResource]:
        return frozenset(self._pending)

    @property
    def completed(self) -> bool:
        return not self._pending

    def allows(self, method: str, group: str, resource: str) -> bool:
        """Reads always pass; a write passes unless its resource is pending."""
        return method.upper() in READ_METHODS or (group, resource) not in self._pending

    def reason(self, group: str, resource: str) -> str:
        """The message a refused write gets, as upstream words it."""
        error = self._pending.get((group, resource))
        return (
            "wait for storage version registration to complete for resource: "
            f"{group_resource_string(group, resource)}, "
            f"last seen error: {'<nil>' if error is None else error}"
        )


def resource_of(path: str) -> GroupResource | None:
    """The (group, resource) a request path addresses, None for non-resource paths.

    Handles ``/api/v1/...`` (core) and ``/apis/<group>/<version>/...``, with the
    legacy ``watch/`` prefix, namespaced paths and subresources::

        /api/v1/namespaces/ns/pods/p/status -> ("", "pods")
        /apis/apps/v1/deployments           -> ("apps", "deployments")
        /api/v1/namespaces/ns/status        -> ("", "namespaces")
        /apis/apps/v1                       -> None (discovery)
    """
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[:1] == ["watch"]:
        rest = rest[1:]
    # /namespaces/<ns>/<resource>/... addresses a namespaced resource, except the
    # namespace's own subresources status and finalize.
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        rest = rest[2:]
    return (group, rest[0]) if rest else None


Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]


class WriteGateMiddleware:
    """ASGI middleware answering 503 (a Kubernetes ``Status``) to writes the gate refuses."""

    def __init__(
        self,
        app: ASGIApp,
        gate: WriteGate,
        resolve: Callable[[str], GroupResource | None] = resource_of,
    ) -> None:
        self.app = app
        self.gate = gate
        self.resolve = resolve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            target = self.resolve(scope["path"])
            if target is not None and not self.gate.allows(scope["method"], *target):
                await _service_unavailable(send, self.gate.reason(*target))
                return
        await self.app(scope, receive, send)


async def _service_unavailable(send: Send, message: str) -> None:
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "ServiceUnavailable",
            "code": 503,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
