"""Reaching a Kubernetes cluster as kubectl does: the one module that holds the client library.

:func:`connect` resolves credentials in kubectl's order: ``--kubeconfig`` (else the
``KUBECONFIG`` variable, else ``~/.kube/config``) with ``--context`` (else the file's
current context); when there is no kubeconfig at all, the pod's service account
(in-cluster). Everything kubeconfig can say works, because the client library
(``kubernetes_asyncio``) reads it: bearer tokens, client certificates, exec credential
plugins, CA bundles, ``insecure-skip-tls-verify``.

:class:`Kube` is what the rest of svledger sees of the library: JSON objects as plain
dicts (lists, watches and discovery of any group, built-in or not, through the
generic REST paths), errors as :class:`ApiError` with the HTTP status. Nothing else
imports ``kubernetes_asyncio`` (checked by ``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from ledger import metrics
from ledger.errors import Unavailable, UsageError
from ledger.names import group_resource_string

WATCH_SECONDS: Final = 290  # the server ends a watch after this; it is then resumed
# A request is given up as unanswered (ClusterUnreachable, to be retried) when the
# connection cannot be made within CONNECT_SECONDS, or the apiserver sends nothing for
# SILENCE_SECONDS: kube-apiserver answers a request it has not finished within its
# --request-timeout (60 s by default) with 504, so one silent 15 s longer is hung, or
# its host gone (a frozen process keeps the connection open). A long answer that keeps
# coming (a large list) is not cut off.
CONNECT_SECONDS: Final = 30.0
SILENCE_SECONDS: Final = 75.0


class ConfigurationError(UsageError):
    """The cluster cannot be addressed as given (kubeconfig, context, service account)."""


class ApiError(Exception):
    """A request the API server refused; ``status`` is its HTTP code, ``body`` its Status."""

    def __init__(
        self,
        status: int,
        message: str,
        body: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        # The server's words may quote what a request held, NUL included, which no event
        # may carry (ledger.codec): shown escaped, as JSON writes it.
        super().__init__(message.replace("\x00", "\\u0000"))
        self.status = status
        self.body: Mapping[str, Any] = body or {}
        self.retry_after = retry_after


class ClusterUnreachable(Unavailable):
    """The API server did not answer at all."""


class CertificateError(ConfigurationError):
    """The API server's TLS certificate does not verify against the kubeconfig's CA."""


class RateLimit:
    """client-go's client-side rate limit (``rest.Config``'s ``QPS`` and ``Burst``): a
    token bucket of ``burst`` tokens that refills at ``qps`` a second. Each request
    takes a token, and one that finds none waits for its own, in the order asked."""

    def __init__(self, qps: float, burst: int, now: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = burst
        self._now = now
        self._tokens = float(burst)
        self._at = now()

    def take(self) -> float:
        """Take a token: the seconds to wait before the request it is for."""
        now = self._now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps) - 1
        self._at = now
        return max(0.0, -self._tokens / self.qps)

    async def wait(self) -> None:
        if (delay := self.take()) > 0:
            await asyncio.sleep(delay)


async def connect(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    rate_limit: RateLimit | None = None,
    slots: asyncio.Semaphore | None = None,
) -> Kube:
    """A client for the cluster kubectl would use with the same ``--kubeconfig``/``--context``.

    As kubectl: ``--kubeconfig``, else the first file of ``KUBECONFIG`` that exists, else
    ``~/.kube/config``, else (none of them) the in-cluster service account. With
    ``rate_limit``, every request but a watch waits for it; with ``slots``, every request
    but a watch holds one while it runs (clients of many clusters sharing them: at most
    as many requests in flight as there are slots).
    """
    configuration = client.Configuration()
    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise ConfigurationError(
            f"--kubeconfig {kubeconfig} is not a file; give the path of a kubeconfig file"
        )
    path = kubeconfig or _default_kubeconfig()
    if path is not None:
        try:
            await config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration
            )
        # Not only ConfigException: YAML that does not parse, an exec plugin that is
        # not installed, an unreadable certificate file all stop the load as well.
        except Exception as error:
            # The loader indexes what it read as a kubeconfig's mappings; another YAML
            # document (a list, a string, nothing) fails it with Python's own words.
            reason = (
                "it is not a kubeconfig (a YAML mapping of clusters, users and contexts)"
                if isinstance(error, TypeError | AttributeError)
                else _reason(error)
            )
            raise ConfigurationError(
                f"cannot use kubeconfig {path}: {reason}; fix it, or give "
                "--kubeconfig PATH (and --context NAME)"
            ) from error
        return Kube(configuration, rate_limit, slots)
    if context is not None:
        raise ConfigurationError(
            f"--context {context!r} needs a kubeconfig: none given (--kubeconfig),"
            " none in KUBECONFIG, none at ~/.kube/config"
        )
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as error:
        listed = os.environ.get("KUBECONFIG", "")
        raise ConfigurationError(
            "no kubeconfig found ("
            + (f"none of KUBECONFIG={listed!r} exists, " if listed else "")
            + f"no ~/.kube/config) and not in a pod ({_reason(error)}); give --kubeconfig PATH"
        ) from error
    return Kube(configuration, rate_limit, slots)


def _timeouts(silence: float | None = None) -> aiohttp.ClientTimeout:
    """A request's timeouts: no total, so a long answer that keeps coming (a large list,
    a watch) is not cut off; ``silence`` defaults to :data:`SILENCE_SECONDS`."""
    return aiohttp.ClientTimeout(
        connect=CONNECT_SECONDS,
        sock_connect=CONNECT_SECONDS,
        sock_read=SILENCE_SECONDS if silence is None else silence,
    )


def _reason(error: Exception) -> str:
    return " ".join(str(error).split()).rstrip(".;") or type(error).__name__


def _default_kubeconfig() -> str | None:
    from_env = os.environ.get("KUBECONFIG", "")
    # kubectl merges a KUBECONFIG list; the first file that exists is the one we use.
    for candidate in from_env.split(os.pathsep):
        if candidate and Path(candidate).expanduser().is_file():
            return str(Path(candidate).expanduser())
    home = Path.home() / ".kube" / "config"
    return str(home) if home.is_file() else None


class Kube:
    """Plain-JSON access to one API server (or, :meth:`at`, one of its peers)."""

    def __init__(
        self,
        configuration: client.Configuration,
        rate_limit: RateLimit | None = None,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        self._configuration = configuration
        self._rate_limit = rate_limit
        self._slots = slots
        self._api = client.ApiClient(configuration)
        self._objects = client.CustomObjectsApi(self._api)

    @property
    def host(self) -> str:
        return str(self._configuration.host)

    def at(self, host: str) -> Kube:
        """The same credentials, addressed to ``host`` (e.g. one apiserver of several)."""
        configuration = copy.copy(self._configuration)
        configuration.host = host
        return Kube(configuration, self._rate_limit, self._slots)

    async def close(self) -> None:
        await self._api.close()

    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        """GET ``path`` (e.g. ``/apis/apps/v1``) as JSON."""
        return await self.request("GET", path, query=query)

    async def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One request to ``path`` (any group, built-in or not), JSON in and out.

        Raises :class:`ApiError` (with the status and, for 429, ``retry_after``) when
        the server refuses, :class:`ClusterUnreachable` when it does not answer
        (:data:`SILENCE_SECONDS`).
        """
        async with self._turn():
            with _counted(*request_labels(method, path)) as outcome:
                try:
                    response, status, _ = await self._api.call_api(
                        path,
                        method,
                        query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                        header_params={
                            "Accept": "application/json",
                            "Content-Type": "application/json",
                        },
                        body=body,
                        auth_settings=["BearerToken"],
                        response_types_map={200: "object", 201: "object", 202: "object"},
                        _return_http_data_only=False,
                        _request_timeout=_timeouts(),
                    )
                except ApiException as error:
                    raise _api_error(error, f"{method} {path}") from error
                except aiohttp.ClientSSLError as error:
                    raise self._untrusted(error) from error
                except (aiohttp.ClientError, TimeoutError) as error:
                    raise self._unreachable(error) from error
                outcome.code = str(status)
        result: dict[str, Any] = response or {}
        return result

    async def list(
        self, group: str, version: str, plural: str, namespace: str | None, **query: Any
    ) -> dict[str, Any]:
        """One page of a list (``limit``/``_continue``/``label_selector`` as query)."""
        async with self._turn():
            with _counted("list", group_resource_string(group, plural)) as outcome:
                try:
                    if namespace is None:
                        page = await self._objects.list_cluster_custom_object(
                            group, version, plural, _request_timeout=_timeouts(), **query
                        )
                    else:
                        page = await self._objects.list_namespaced_custom_object(
                            group,
                            version,
                            namespace,
                            plural,
                            _request_timeout=_timeouts(),
                            **query,
                        )
                except ApiException as error:
                    raise _api_error(error, f"{plural}.{group}") from error
                except (aiohttp.ClientError, TimeoutError) as error:
                    raise self._unreachable(error) from error
                outcome.code = "200"
        result: dict[str, Any] = page
        return result

    async def watch(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        resource_version: str,
        **query: Any,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) from ``resource_version`` on, bookmarks included, until the
        server ends the watch; ``ApiError(410)`` when the version is too old."""
        if namespace is None:
            method: Any = self._objects.list_cluster_custom_object
            args: tuple[str, ...] = (group, version, plural)
        else:
            method = self._objects.list_namespaced_custom_object
            args = (group, version, namespace, plural)
        stream = watch.Watch()
        # Counted once, when it ends: by its error, else as answered (200) if the server
        # sent anything or ended it; a watch its caller dropped before that is not.
        with _counted("watch", group_resource_string(group, plural)) as outcome:
            try:
                async with stream.stream(
                    method,
                    *args,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_SECONDS,
                    # The server ends the watch after WATCH_SECONDS: silent for longer,
                    # it is hung or gone, and the watch is given up as unreachable.
                    _request_timeout=_timeouts(WATCH_SECONDS + SILENCE_SECONDS),
                    **query,
                ) as events:
                    async for event in events:
                        if not isinstance(event, dict):
                            raise _watch_refused(stream.resp, event, f"watch of {plural}.{group}")
                        outcome.code = "200"
                        yield event["type"], event["raw_object"]
                outcome.code = "200"
            except ApiException as error:
                raise _api_error(error, f"watch of {plural}.{group}") from error
            except aiohttp.ClientError as error:
                raise self._unreachable(error) from error

    def _untrusted(self, error: Exception) -> CertificateError:
        return CertificateError(
            f"the API server at {self.host} is not trusted: {error}; give its CA in the"
            " kubeconfig (certificate-authority or certificate-authority-data)"
        )

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """Wait for the rate limit, if there is one, then hold a slot, if there are any,
        for the request (a watch does neither)."""
        if self._rate_limit is not None:
            await self._rate_limit.wait()
        async with self._slots or contextlib.nullcontext():
            yield

    def _unreachable(self, error: Exception) -> ClusterUnreachable:
        reason = str(error)
        if isinstance(error, TimeoutError):  # aiohttp's timeouts, with their own words
            reason = f"no answer ({reason or 'timed out'}): is it hung, or its host gone?"
        return ClusterUnreachable(
            f"cannot reach the Kubernetes API server at {self.host}: {reason}; check that it"
            " runs and that the kubeconfig's server address is right"
        )


@dataclasses.dataclass
class _Outcome:
    code: str | None = None  # the HTTP status, "0" for no answer, None if not known


@contextlib.contextmanager
def _counted(verb: str, resource: str) -> Iterator[_Outcome]:
    """Count one request in ``svledger_kube_requests_total`` once its outcome is known.

    The block sets ``code`` when the server answers; a refusal (:class:`ApiError`) is
    counted with its status, no answer (:class:`ClusterUnreachable`, an untrusted
    certificate) as ``0``. A request cancelled before either is not counted.
    """
    outcome = _Outcome()
    try:
        yield outcome
    except ApiError as error:
        outcome.code = str(error.status)
        raise
    except (ClusterUnreachable, CertificateError):
        outcome.code = "0"
        raise
    finally:
        if outcome.code is not None:
            metrics.KUBE_REQUESTS.labels(verb, resource, outcome.code).inc()


# The namespace's own subresources: /api/v1/namespaces/NAME/status is not a resource
# "status" in namespace NAME (as the apiserver's RequestInfoFactory reads paths).
_NAMESPACE_SUBRESOURCES: Final = frozenset({"status", "finalize"})
_WRITE_VERBS: Final = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def request_labels(method: str, path: str) -> tuple[str, str]:
    """The verb and resource of a request, named as the apiserver's own metrics name them.

    ``GET /apis/apps/v1/namespaces/N/deployments`` is ``("list", "deployments.apps")``,
    with a name after it ``get``; ``DELETE`` without a name is ``deletecollection``; a
    subresource follows its resource (``("update", "deployments.apps/status")``).
    Discovery (``/api``, ``/apis/apps/v1``) is ``get`` of resource ``""``.
    """
    parts = [part for part in path.partition("?")[0].split("/") if part]
    rest: list[str] = []
    group = ""
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        group, rest = (parts[1] if len(parts) > 1 else ""), parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _NAMESPACE_SUBRESOURCES:
        rest = rest[2:]
    method = method.upper()
    named = len(rest) > 1
    if method == "GET":
        verb = "get" if named or not rest else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = _WRITE_VERBS.get(method, method.lower())
    if not rest:
        return verb, ""
    resource = group_resource_string(group, rest[0])
    return verb, f"{resource}/{rest[2]}" if len(rest) > 2 else resource


def _api_error(error: ApiException, what: str) -> ApiError:
    status = int(error.status or 0)
    reason = error.reason or ""
    body = _status_body(error.body)
    message = str(body.get("message", "")) or reason
    retry_after = _retry_after(error.headers or {}, body)
    return ApiError(status, f"{what}: HTTP {status} {reason}: {message}", body, retry_after)


def _watch_refused(response: Any, line: object, what: str) -> ApiError:
    """The refusal of a watch the server answered with no stream of events.

    The client library reads a watch's answer line by line whatever its status, and
    hands back a line that is not JSON as a string: kube-apiserver's plain
    ``404 page not found`` for an API group it does not serve (a StorageVersion watch
    after the API was switched off), or a proxy's error page. The status is the
    answer's own (a 200 that streams something else is a 500, a broken server).
    """
    status = int(getattr(response, "status", 0) or 0)
    if 200 <= status < 300:
        status = 500
    reason = str(getattr(response, "reason", "") or "")
    text = " ".join(str(line).split())[:200]
    return ApiError(status, f"{what}: HTTP {status} {reason}: {text}")


def _retry_after(headers: Mapping[str, str], body: Mapping[str, Any]) -> float | None:
    """How long the server asks the client to wait before trying again, if it does.

    The ``Retry-After`` header (seconds), else the ``Status``'s
    ``details.retryAfterSeconds`` when positive, whatever the code: upstream's
    ``SuggestsClientDelay``, which its migrator honours on every failed request (a 429,
    a 503, a 500 ``ServerTimeout``).
    """
    if headers.get("Retry-After"):
        with contextlib.suppress(ValueError):
            return max(0.0, float(headers["Retry-After"]))
    details = body.get("details")
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        return float(seconds)
    return None


def _status_body(body: object) -> dict[str, Any]:
    """The Kubernetes ``Status`` in an error response, or {} if it holds none."""
    if isinstance(body, bytes | str):
        try:
            parsed = json.loads(body)
        except ValueError:
            return {}
        if isinstance(parsed, dict):
            return parsed
    return {}
