"""The migration target of a real cluster: the Kubernetes REST API.

:class:`KubernetesTarget` does what upstream's kube-storage-version-migrator does for
one migration, through :class:`kube.client.Kube`:

* ``list`` is ``GET /apis/{group}/{version}/{resource}?limit=N&continue=TOKEN``
  (``/api/{version}/{resource}`` for the core group), across all namespaces; each
  item becomes an :class:`~consumers.targets.ObjectRef` and ``metadata.continue`` the
  next token. When the apiserver answers 410 Gone because the token outlived etcd's
  compaction, it offers an *inconsistent* continue token in the error's
  ``metadata.continue``; the list goes on from there, as upstream's migrator does
  (objects created meanwhile are written in the new version anyway).
* ``rewrite`` GETs the object and PUTs the very bytes back. The body carries
  ``metadata.resourceVersion``, so the write is conditional: an object changed in
  between is answered with 409 Conflict, and the worker reads it again. Upstream's
  migrator PUTs the item as listed, one request an object, and reads only after a
  conflict; reading first costs a GET per object but keeps conflicts rare, as a
  chunk's list is as old as the chunk's rewrites have taken.

**Which version to address.** Any version the apiserver serves will do: whichever
version a write comes in, the apiserver stores it in its own encoding version, which
is the point of the no-op update. So the target does not take the migration's target
version (which, for a custom resource, need not even be served); it asks discovery,
as upstream's trigger did: the group's versions in preference order
(``GET /apis/{group}``, or ``GET /api`` for the core group), then the first of them
whose resource list (``GET /apis/{group}/{version}``) has the resource. Discovery is
asked again at every ``list``, i.e. once a chunk, so a worker that outlives an upgrade
follows the versions the cluster serves now; the chunk's rewrites use that answer.

**Failures** map to the errors the worker interprets (:mod:`consumers.targets`):
404 naming the object -> ``NotFound`` (any other 404 while rewriting means the
version is no longer served: ``Transient``, and discovery runs again), 409 ->
``Conflict``, 429 -> ``TooManyRequests``, 5xx, timeouts and unreachable servers ->
``Transient``; both carry the wait the server asks for, if it does (the
``Retry-After`` header, else the ``Status``'s ``details.retryAfterSeconds``, as
upstream's ``SuggestsClientDelay`` reads it).
A resource no served version has (discovery, at a list or after such a 404) is
:class:`NotServed`, which fails the migration: an object is ``NotFound`` only by name.
401 and 403 are :class:`Unauthorized` and :class:`Forbidden`, and any other refusal
(a TLS certificate that does not verify, an unexpected status) is
:class:`RequestFailed`; the worker does not retry those and fails the migration with
the message, which names the URL, the verb and what to check.

**Connections and credentials** are the client library's (:mod:`kube.client`): the
kubeconfig or the pod's service account, with tokens, client certificates and exec
credential plugins, as kubectl reads them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from consumers.targets import (
    Conflict,
    NotFound,
    ObjectRef,
    Page,
    TargetError,
    TooManyRequests,
    Transient,
)
from kube.client import ApiError, CertificateError, ClusterUnreachable, Kube
from ledger.names import group_resource_string


class Unauthorized(TargetError):
    """HTTP 401: the apiserver does not accept the credentials."""


class Forbidden(TargetError):
    """HTTP 403: the credentials are not allowed this verb on this resource."""


class RequestFailed(TargetError):
    """Any other refusal that retrying will not cure (an unexpected status, a denial)."""


class NotServed(TargetError):
    """No version the apiserver serves has the resource (discovery): not a deleted
    object, which would count as migrated, but a migration that cannot go on."""


class KubernetesTarget:
    """A :class:`~consumers.targets.Target` that rewrites objects through an apiserver."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._versions: dict[tuple[str, str], str] = {}

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        version = self._versions[group, resource] = await served_version(self.kube, group, resource)
        collection = f"{_group_path(group, version)}/{resource}"
        what = group_resource_string(group, resource)
        while True:
            try:
                body = await self.kube.request(
                    "GET", collection, query={"limit": limit, "continue": continue_token}
                )
            except ApiError as error:
                token = (error.body.get("metadata") or {}).get("continue")
                if error.status == GONE and token and token != continue_token:
                    continue_token = token  # resume past compaction; see the module docstring
                    continue
                raise _target_error(error, "list", what) from error
            except ClusterUnreachable as error:
                raise Transient(f"list {what}: {error}") from error
            except CertificateError as error:
                raise RequestFailed(f"list {what}: {error}") from error
            refs = tuple(
                ObjectRef(item["metadata"].get("namespace"), item["metadata"]["name"])
                for item in body.get("items") or ()
            )
            return Page(refs, (body.get("metadata") or {}).get("continue") or None)

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        version = self._versions.get((group, resource))
        if version is None:
            version = await served_version(self.kube, group, resource)
            self._versions[group, resource] = version
        path = _group_path(group, version)
        # A name is one path segment, escaped as client-go escapes it: some kinds (RBAC's
        # roles, say) allow names with '?', '#' or spaces, which would otherwise
        # address another object or none.
        if ref.namespace is not None:
            path += f"/namespaces/{quote(ref.namespace, safe='')}"
        path += f"/{resource}/{quote(ref.name, safe='')}"
        what = f"{group_resource_string(group, resource)} {ref.name!r}" + (
            f" in namespace {ref.namespace!r}" if ref.namespace is not None else ""
        )
        obj = await self._object_request("GET", path, what, (group, resource), ref.name)
        # The object as read, resourceVersion included: a write that lands only if
        # nobody changed the object in between (409 otherwise).
        await self._object_request("PUT", path, what, (group, resource), ref.name, obj)

    async def _object_request(
        self,
        method: str,
        path: str,
        what: str,
        group_resource: tuple[str, str],
        name: str,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One request on an object, telling a deleted object from a version no longer served.

        The apiserver names a missing object in its 404 Status; a 404 that does not
        means the path itself is gone (an upgrade stopped serving the version found
        by discovery). Counting that as a deleted object would skip it unmigrated, so
        it is :class:`Transient`, and the version is discovered again on the retry.
        """
        verb = "get" if method == "GET" else "update"
        try:
            return await self.kube.request(method, path, body)
        except ApiError as error:
            if error.status == NOT_FOUND and (error.body.get("details") or {}).get("name") != name:
                self._versions.pop(group_resource, None)
                raise Transient(
                    f"{verb} {what}: {path} answered 404 without naming the object: the API"
                    " server no longer serves that version; discovering it again"
                ) from error
            raise _target_error(error, verb, what) from error
        except ClusterUnreachable as error:
            raise Transient(f"{verb} {what}: {error}") from error
        except CertificateError as error:
            raise RequestFailed(f"{verb} {what}: {error}") from error


async def served_version(kube: Kube, group: str, resource: str) -> str:
    """The most preferred version in which the apiserver serves ``resource`` (discovery:
    the group's versions in preference order, the first whose list has the resource);
    raises the worker's errors (:func:`_target_error`), :class:`NotServed` if none has it."""
    what = f"API group {group!r}" if group else "the core API group"
    if group:
        body = await _get(kube, f"/apis/{group}", what)
        versions = [v["version"] for v in body.get("versions") or ()]
        preferred = (body.get("preferredVersion") or {}).get("version")
        if preferred in versions:
            versions.remove(preferred)
            versions.insert(0, preferred)
    else:
        versions = list((await _get(kube, "/api", what)).get("versions") or ())
    for version in versions:
        listing = await _get(kube, _group_path(group, version), what)
        if any(r.get("name") == resource for r in listing.get("resources") or ()):
            return str(version)
    raise NotServed(
        f"the API server at {kube.host} serves no resource "
        f"{group_resource_string(group, resource)!r} "
        f"(versions asked: {', '.join(versions) or 'none'}); check the resource name"
    )


async def _get(kube: Kube, path: str, what: str) -> dict[str, Any]:
    try:
        return await kube.get(path)
    except ApiError as error:
        raise _target_error(error, "get", what) from error
    except ClusterUnreachable as error:
        raise Transient(f"get {what}: {error}") from error
    except CertificateError as error:
        raise RequestFailed(f"get {what}: {error}") from error


GONE = 410
NOT_FOUND = 404


def _target_error(error: ApiError, verb: str, what: str) -> TargetError:
    """The worker's error for a refused request (see the module docstring)."""
    status = error.status
    detail = f"{verb} {what}: {error}"
    if status == NOT_FOUND:
        return NotFound(detail)
    if status == 409:
        return Conflict(detail)
    if status == 429:
        return TooManyRequests(detail, error.retry_after)
    if status >= 500 or status == 0:
        return Transient(detail, error.retry_after)
    if status == 401:
        return Unauthorized(
            f"{detail}; the API server does not accept the credentials; check the"
            " kubeconfig's user (or the service account token) is current and for this cluster"
        )
    if status == 403:
        return Forbidden(
            f"{detail}; the worker may not {verb} {what}: grant it list, get and update on"
            " the resource (a ClusterRole, see deploy/kubernetes/svledger.yaml)"
        )
    return RequestFailed(detail)


def _group_path(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"
