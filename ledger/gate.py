"""The write barrier: no write to a resource before its storage version is on record.

KEP-2339 makes an API server refuse writes to a resource until its storage version
for that resource is registered, so no object is ever persisted in a version the
cluster does not know about. Upstream's ``WithStorageVersionPrecondition`` filter
lets through non-resource requests, reads (the verbs get, list and watch, as its
request-info resolver tells them from the method and path: a ``watch/`` path is a
watch whatever the method, a ``proxy/`` one or an unusual method such as OPTIONS is no
read), writes to the StorageVersion API itself and to leases in ``kube-system`` (the
identity leases it depends on), and answers ``503 ServiceUnavailable`` with

    wait for storage version registration to complete for resource: <gr>, last seen error: <err>

to writes of a resource whose registration is pending, ``<gr>`` being the
GroupResource (``deployments.apps``, or ``pods`` for the core group) and ``<err>``
the last error met while registering (``<nil>`` if none). Resources the server never
reports (not persisted) are not pending and pass. Upstream also passes namespace
creation by the API server's own user (``system:apiserver`` in ``system:masters``: its
bootstrap of ``kube-system``, where the identity leases live); so does the gate when it
is told who made the request (``RequestInfo.user``; the middleware's ``user``), since
only the embedding server authenticates requests.

:class:`WriteGate` is that decision as a plain predicate; the reporter marks
resources pending and registered. It is read from request-handling threads and
written from the reporter's event loop, so its state is an immutable mapping
replaced whole on every change. :class:`WriteGateMiddleware` puts it in front of
an ASGI application, resolving each request (:func:`request_info`) the way the API
server's request-info resolver does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Final, TypeAlias

from ledger.identity import LEASE_NAMESPACE
from ledger.names import group_resource_string

GroupResource: TypeAlias = tuple[str, str]  # (group, resource), group "" for core

# Upstream's verb of a request by method (requestinfo.go); any other method has none.
_VERBS: Final = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
_READS: Final = frozenset({"get", "list", "watch"})
_PATH_VERBS: Final = frozenset({"proxy", "watch"})  # a path prefix that sets the verb
_NAMESPACE_SUBRESOURCES: Final = frozenset({"status", "finalize"})
# Writes upstream passes before registration: the API it registers with, and the
# identity leases that API depends on (in kube-system only).
_STORAGE_VERSIONS: Final = ("internal.apiserver.k8s.io", "storageversions")
_LEASES: Final = ("coordination.k8s.io", "leases")
_NAMESPACES: Final = ("", "namespaces")
# The API server's own loopback identity (upstream's user.APIServerUser and
# user.SystemPrivilegedGroup): only it may create namespaces before registration.
APISERVER_USER: Final = "system:apiserver"
PRIVILEGED_GROUP: Final = "system:masters"


@dataclasses.dataclass(frozen=True, slots=True)
class RequestInfo:
    """What upstream's request-info resolver tells of a resource request."""

    verb: str  # get (list, watch: reads alike here), create, update, patch, delete, proxy or ""
    group: str
    resource: str
    namespace: str = ""
    user: str | None = None  # who made it, if the server authenticated it
    groups: tuple[str, ...] = ()  # the user's groups


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

    @property
    def error(self) -> str | None:
        """The last error met registering a pending resource, if any."""
        return next((e for e in self._pending.values() if e is not None), None)

    def admits(self, request: RequestInfo) -> bool:
        """Upstream's precondition: reads pass, and so do writes to the StorageVersion
        API, the API server's own creation of namespaces and writes to leases in
        ``kube-system``; another write passes unless its resource is pending."""
        target = (request.group, request.resource)
        if request.verb in _READS or target == _STORAGE_VERSIONS:
            return True
        if (
            target == _NAMESPACES
            and request.verb == "create"
            and request.user == APISERVER_USER
            and PRIVILEGED_GROUP in request.groups
        ):
            return True
        if target == _LEASES and request.namespace == LEASE_NAMESPACE:
            return True
        return target not in self._pending

    def allows(self, method: str, group: str, resource: str, namespace: str = "") -> bool:
        """:meth:`admits` for a request by HTTP ``method`` on the resource's own path."""
        verb = _VERBS.get(method.upper(), "")
        return self.admits(RequestInfo(verb, group, resource, namespace))

    def reason(self, group: str, resource: str) -> str:
        """The message a refused write gets, as upstream words it."""
        error = self._pending.get((group, resource))
        return (
            "wait for storage version registration to complete for resource: "
            f"{group_resource_string(group, resource)}, "
            f"last seen error: {'<nil>' if error is None else error}"
        )


def request_info(method: str, path: str) -> RequestInfo | None:
    """The resource request ``method`` on ``path`` is, as upstream's resolver reads it;
    None for a non-resource request.

    Handles ``/api/v1/...`` (core) and ``/apis/<group>/<version>/...``, the ``watch/``
    and ``proxy/`` prefixes, namespaced paths and subresources::

        GET  /api/v1/namespaces/ns/pods/p/status -> get ("", "pods") in ns
        POST /apis/apps/v1/deployments           -> create ("apps", "deployments")
        PUT  /api/v1/namespaces/ns/status        -> update ("", "namespaces") of ns
        GET  /apis/apps/v1                       -> None (discovery)
    """
    parts = [p for p in path.split("/") if p]
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return None
    if parts[0] == "apis":
        if len(parts) < 4:
            return None
        group, rest = parts[1], parts[3:]
    else:
        group, rest = "", parts[2:]
    verb = _VERBS.get(method.upper(), "")
    if rest[0] in _PATH_VERBS:
        if len(rest) < 2:
            return None  # upstream cannot tell the resource either
        verb, rest = rest[0], rest[1:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        # /namespaces/<ns>/<resource>/... addresses a namespaced resource, except the
        # namespace's own subresources status and finalize.
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    return RequestInfo(verb, group, rest[0], namespace)


Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]


class WriteGateMiddleware:
    """ASGI middleware answering 503 (a Kubernetes ``Status``) to writes the gate refuses.

    ``user``: who made a request, as the embedding server authenticated it (its name and
    groups, or None), so that the API server's own namespace creation passes as
    upstream's does; without it no request has a user.
    """

    def __init__(
        self,
        app: ASGIApp,
        gate: WriteGate,
        resolve: Callable[[str, str], RequestInfo | None] = request_info,
        user: Callable[[Scope], tuple[str, Sequence[str]] | None] | None = None,
    ) -> None:
        self.app = app
        self.gate = gate
        self.resolve = resolve
        self.user = user

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = self.resolve(scope["method"], scope["path"])
            if request is not None and self.user is not None:
                found = self.user(scope)
                if found is not None:
                    request = dataclasses.replace(request, user=found[0], groups=tuple(found[1]))
            if request is not None and not self.gate.admits(request):
                await _service_unavailable(send, self.gate.reason(request.group, request.resource))
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
