"""The migration target of a real cluster: the Kubernetes REST API.

:class:`KubernetesTarget` does what upstream's kube-storage-version-migrator does for
one migration, over plain HTTPS with the standard library:

* ``list`` is ``GET /apis/{group}/{version}/{resource}?limit=N&continue=TOKEN``
  (``/api/{version}/{resource}`` for the core group), across all namespaces; each
  item becomes an :class:`~consumers.targets.ObjectRef` and ``metadata.continue`` the
  next token. When the apiserver answers 410 Gone because the token outlived etcd's
  compaction, it offers an *inconsistent* continue token in the error's
  ``metadata.continue``; the list goes on from there, as upstream's migrator does
  (objects created meanwhile are written in the new version anyway).
* ``rewrite`` GETs the object and PUTs the very bytes back. The body carries
  ``metadata.resourceVersion``, so the write is conditional: an object changed in
  between is answered with 409 Conflict, and the worker reads it again.

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
``Conflict``, 429 -> ``TooManyRequests`` with the ``Retry-After`` seconds, 5xx,
timeouts and unreachable servers -> ``Transient``.
401 and 403 are :class:`Unauthorized` and :class:`Forbidden`, and any other refusal
(a TLS certificate that does not verify, an unexpected status) is
:class:`RequestFailed`; the worker does not retry those and fails the migration with
the message, which names the URL, the verb and what to check.

**Connections.** Requests run in a worker thread (:func:`asyncio.to_thread`) on
keep-alive :mod:`http.client` connections kept in a small pool (a worker runs one
cluster's migrations one at a time, so it mostly holds one connection). A pooled
connection the server has meanwhile closed is replaced once, transparently. The
bearer token is read from its file at every request, because service-account tokens
are rotated on disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from consumers.targets import (
    Conflict,
    NotFound,
    ObjectRef,
    Page,
    TargetError,
    TooManyRequests,
    Transient,
)
from ledger.errors import UsageError
from ledger.names import group_resource_string

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigurationError(UsageError):
    """The target cannot be set up as given (server URL, token or CA file, environment)."""


class Unauthorized(TargetError):
    """HTTP 401: the apiserver does not accept the credentials."""


class Forbidden(TargetError):
    """HTTP 403: the credentials are not allowed this verb on this resource."""


class RequestFailed(TargetError):
    """Any other refusal that retrying will not cure (TLS, unexpected status or body)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Response:
    status: int
    retry_after: str | None
    body: bytes


class KubernetesTarget:
    """A :class:`~consumers.targets.Target` that rewrites objects through an apiserver."""

    def __init__(
        self,
        server: str,
        token_file: str | os.PathLike[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        insecure_skip_tls_verify: bool = False,
        timeout: float = 30,
    ) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigurationError(
                f"API server URL {server!r} is not an http(s) URL; give e.g. https://10.0.0.1:6443"
            )
        self.server = server.rstrip("/")
        self._host = url.hostname
        self._port = url.port
        self._prefix = url.path.rstrip("/")  # e.g. an apiserver behind a path-routing proxy
        self._timeout = timeout
        self._token_file = Path(token_file) if token_file is not None else None
        if self._token_file is not None:
            self._read_token()  # a missing token file is a setup error, not a failed migration
        self._tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            self._tls = _tls_context(ca_file, insecure_skip_tls_verify)
        self._idle: list[http.client.HTTPConnection] = []
        self._versions: dict[tuple[str, str], str] = {}

    @classmethod
    def in_cluster(
        cls,
        environ: Mapping[str, str] = os.environ,
        account: Path = SERVICE_ACCOUNT,
        timeout: float = 30,
    ) -> KubernetesTarget:
        """The apiserver of the cluster this process runs in, as its service account."""
        host = environ.get("KUBERNETES_SERVICE_HOST")
        port = environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ConfigurationError(
                "not running in a Kubernetes cluster: KUBERNETES_SERVICE_HOST and "
                "KUBERNETES_SERVICE_PORT are not set"
            )
        for name in ("token", "ca.crt"):
            if not (account / name).is_file():
                raise ConfigurationError(
                    f"no service account credentials: {account / name} does not exist; "
                    "check that the pod mounts its service account token "
                    "(automountServiceAccountToken)"
                )
        netloc = f"[{host}]" if ":" in host else host  # an IPv6 service address
        return cls(
            f"https://{netloc}:{port}",
            token_file=account / "token",
            ca_file=account / "ca.crt",
            timeout=timeout,
        )

    def close(self) -> None:
        """Close the idle connections."""
        while self._idle:
            self._idle.pop().close()

    # --- the Target protocol --------------------------------------------------------

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        version = await self._discover(group, resource)
        self._versions[group, resource] = version
        collection = f"{_group_path(group, version)}/{resource}"
        while True:
            query = {"limit": str(limit)}
            if continue_token is not None:
                query["continue"] = continue_token
            path = f"{collection}?{urllib.parse.urlencode(query)}"
            response = await self._request("GET", path)
            if response.status == 410:
                token = _json(response.body, self._url(path)).get("metadata", {}).get("continue")
                if token and token != continue_token:
                    continue_token = token  # resume past compaction; see the module docstring
                    continue
            self._check(response, "list", path, group_resource_string(group, resource))
            body = _json(response.body, self._url(path))
            refs = tuple(
                ObjectRef(item["metadata"].get("namespace"), item["metadata"]["name"])
                for item in body.get("items") or ()
            )
            return Page(refs, body.get("metadata", {}).get("continue") or None)

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        version = self._versions.get((group, resource))
        if version is None:
            version = self._versions[group, resource] = await self._discover(group, resource)
        path = _group_path(group, version)
        if ref.namespace is not None:
            path += f"/namespaces/{_quote(ref.namespace)}"
        path += f"/{resource}/{_quote(ref.name)}"
        what = f"{group_resource_string(group, resource)} {ref.name!r}" + (
            f" in namespace {ref.namespace!r}" if ref.namespace is not None else ""
        )
        response = await self._request("GET", path)
        self._check_object(response, "get", path, what, (group, resource), ref.name)
        # The bytes as read, resourceVersion included: a write that lands only if
        # nobody changed the object in between (409 otherwise).
        response = await self._request("PUT", path, response.body)
        self._check_object(response, "update", path, what, (group, resource), ref.name)

    def _check_object(
        self,
        response: _Response,
        verb: str,
        path: str,
        what: str,
        group_resource: tuple[str, str],
        name: str,
    ) -> None:
        """:meth:`_check`, telling a deleted object from a version no longer served.

        The apiserver names a missing object in its 404 Status; a 404 that does not
        means the path itself is gone (an upgrade stopped serving the version found
        by discovery). Counting that as a deleted object would skip it unmigrated, so
        it is :class:`Transient`, and the version is discovered again on the retry.
        """
        if response.status == 404 and _status_name(response.body) != name:
            del self._versions[group_resource]
            raise Transient(
                f"{verb} {what}: {self._url(path)} answered 404 without naming the object:"
                " the API server no longer serves that version; discovering it again"
            )
        self._check(response, verb, path, what)

    # --- discovery --------------------------------------------------------------------

    async def _discover(self, group: str, resource: str) -> str:
        """The most preferred version in which the apiserver serves ``resource``."""
        what = f"API group {group!r}" if group else "the core API group"
        if group:
            path = f"/apis/{_quote(group)}"
            body = await self._get_json(path, what)
            versions = [v["version"] for v in body.get("versions") or ()]
            preferred = (body.get("preferredVersion") or {}).get("version")
            if preferred in versions:
                versions.remove(preferred)
                versions.insert(0, preferred)
        else:
            versions = list((await self._get_json("/api", what)).get("versions") or ())
        for version in versions:
            listing = await self._get_json(_group_path(group, version), what)
            if any(r.get("name") == resource for r in listing.get("resources") or ()):
                return str(version)
        raise NotFound(
            f"the API server at {self.server} serves no resource "
            f"{group_resource_string(group, resource)!r} "
            f"(versions asked: {', '.join(versions) or 'none'}); check the resource name"
        )

    async def _get_json(self, path: str, what: str) -> dict[str, Any]:
        response = await self._request("GET", path)
        self._check(response, "get", path, what)
        return _json(response.body, self._url(path))

    # --- HTTP -------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.server}{path}"

    def _check(self, response: _Response, verb: str, path: str, what: str) -> None:
        """Raise the worker's error for a response that is not a success."""
        status = response.status
        if 200 <= status < 300:
            return
        url = self._url(path)
        detail = f"{verb} {what}: {url} answered {status}: {_status_message(response.body)}"
        if status == 404:
            raise NotFound(detail)
        if status == 409:
            raise Conflict(detail)
        if status == 429:
            raise TooManyRequests(detail, _seconds(response.retry_after))
        if status >= 500:
            raise Transient(detail)
        if status == 401:
            token = self._token_file or "none given"
            raise Unauthorized(
                f"{detail}; the API server does not accept the bearer token "
                f"(token file: {token}); check that it is current and for this cluster"
            )
        if status == 403:
            raise Forbidden(
                f"{detail}; the worker may not {verb} {what}: grant its service account "
                "list, get and update on the resource (a ClusterRole, see "
                "deploy/kubernetes/svledger.yaml)"
            )
        raise RequestFailed(detail)

    async def _request(self, method: str, path: str, body: bytes | None = None) -> _Response:
        url = self._url(path)
        pooled = self._idle.pop() if self._idle else None
        try:
            connection, response = await asyncio.to_thread(
                self._exchange, pooled, method, self._prefix + path, body
            )
        except ConfigurationError as error:  # the token file went away
            raise RequestFailed(f"{method} {url}: {error}") from error
        except TimeoutError as error:
            raise Transient(f"{method} {url} timed out after {self._timeout} s") from error
        except ssl.SSLCertVerificationError as error:
            raise RequestFailed(
                f"{method} {url}: the API server's TLS certificate does not verify "
                f"({error.verify_message}); give its CA with --ca-file"
            ) from error
        except ssl.SSLError as error:
            raise RequestFailed(
                f"{method} {url}: TLS failed ({error}); check that the URL's scheme and port "
                "are the API server's"
            ) from error
        except (OSError, http.client.HTTPException) as error:
            raise Transient(
                f"{method} {url}: cannot reach the API server ({error}); check the server URL "
                "and that the API server is up"
            ) from error
        if connection is not None:
            self._idle.append(connection)
        return response

    def _exchange(
        self, pooled: http.client.HTTPConnection | None, method: str, path: str, body: bytes | None
    ) -> tuple[http.client.HTTPConnection | None, _Response]:
        """One request, in a worker thread; returns the connection if it may be reused."""
        headers = {"Accept": "application/json", "User-Agent": "svledger-worker"}
        if self._token_file is not None:
            headers["Authorization"] = f"Bearer {self._read_token()}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        connection = pooled or self._connect()
        try:
            try:
                connection.request(method, path, body, headers)
                response = connection.getresponse()
            except ConnectionError:
                if pooled is None:
                    raise
                # The server closed the idle connection; nothing was processed.
                connection.close()
                connection = self._connect()
                connection.request(method, path, body, headers)
                response = connection.getresponse()
            data = response.read()
        except BaseException:
            connection.close()
            raise
        if response.will_close:
            connection.close()
            return None, _Response(response.status, response.getheader("Retry-After"), data)
        return connection, _Response(response.status, response.getheader("Retry-After"), data)

    def _connect(self) -> http.client.HTTPConnection:
        if self._tls is None:
            return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return http.client.HTTPSConnection(
            self._host, self._port, timeout=self._timeout, context=self._tls
        )

    def _read_token(self) -> str:
        assert self._token_file is not None
        try:
            return self._token_file.read_text().strip()
        except OSError as error:
            raise ConfigurationError(
                f"cannot read the bearer token file {self._token_file}: {error.strerror}; "
                "check the path given with --token-file"
            ) from error


def _tls_context(ca_file: str | os.PathLike[str] | None, insecure: bool) -> ssl.SSLContext:
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigurationError(
            f"cannot load the CA file {ca_file}: {error}; give a PEM file of the API server's "
            "CA with --ca-file"
        ) from error


def _group_path(group: str, version: str) -> str:
    return f"/apis/{_quote(group)}/{_quote(version)}" if group else f"/api/{_quote(version)}"


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _json(body: bytes, url: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RequestFailed(
            f"{url} answered with no JSON object ({body[:80]!r}); check that the URL is the "
            "API server's"
        )
    return value


def _status_message(body: bytes) -> str:
    """The message of a Kubernetes Status body, or the start of whatever came back."""
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return str(status["message"])
    return repr(body[:200])


def _status_name(body: bytes) -> str | None:
    """The object a Kubernetes Status body names (``details.name``), if any."""
    try:
        status = json.loads(body)
    except ValueError:
        return None
    details = status.get("details") if isinstance(status, dict) else None
    name = details.get("name") if isinstance(details, dict) else None
    return name if isinstance(name, str) else None


def _seconds(retry_after: str | None) -> float | None:
    try:
        return float(retry_after) if retry_after is not None else None
    except ValueError:
        return None  # an HTTP date; the apiserver sends seconds
