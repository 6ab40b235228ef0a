"""The Kubernetes REST target against a real HTTP server with Kubernetes semantics.

The target is addressed as every svledger command addresses a cluster: a kubeconfig,
read by the client library (bearer token, exec credential plugin, CA, insecure).

:class:`FakeApiserver` is a small apiserver on 127.0.0.1 (stdlib ``http.server`` in a
thread): discovery, list with ``limit``/``continue`` across namespaces, get, and a
PUT that is conditional on ``metadata.resourceVersion`` (409 otherwise) and
re-encodes the object in the server's storage version. Failures are injected per
object name (a concurrent writer, a 429 with Retry-After, a 403) and every request is
recorded, so the tests assert on what went over the wire.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from consumers.targets import Conflict, NotFound, ObjectRef, TooManyRequests, Transient
from consumers.worker import RetryPolicy, migrate
from kube import client as client_module
from kube.client import ClusterUnreachable, ConfigurationError, Kube, RateLimit, connect
from kube.target import Forbidden, KubernetesTarget, NotServed, RequestFailed, Unauthorized
from ledger.events import (
    Event,
    MigrationFailed,
    MigrationProgressed,
    MigrationStarted,
    MigrationSucceeded,
)
from svledger.cli import main
from tests.kube import kube_at
from tests.unit.test_worker import StepClock, migration

TOKEN = "token-1"
OLD, NEW = "v1beta1", "v1"  # encoding versions: as found, and the server's storage version

# group -> versions in preference order -> resource -> namespaced
API: dict[str, dict[str, dict[str, bool]]] = {
    "": {"v1": {"pods": True, "namespaces": False}},
    "apps": {
        "v1": {"deployments": True},
        "v1beta1": {"deployments": True, "legacythings": False},
    },
}

Key = tuple[str, str, str | None, str]  # group, resource, namespace, name


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str  # with the query string, as sent
    authorization: str | None
    status: int


def _token(position: Sequence[str], fresh: bool = False) -> str:
    raw = json.dumps([*position, fresh]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _position(token: str) -> tuple[str, str]:
    namespace, name, _ = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    return namespace, name


class FakeApiserver:
    """An apiserver with a handful of objects; see the module docstring."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.token = TOKEN
        self.objects: dict[Key, dict[str, Any]] = {}
        self.encoded: dict[Key, str] = {}
        self.requests: list[Request] = []
        self.concurrent_write_on: set[str] = set()  # names changed right after their GET
        self.throttle: dict[str, int] = {}  # name -> Retry-After seconds of one 429
        self.timeout: dict[str, int] = {}  # name -> retryAfterSeconds of one 500 ServerTimeout
        self.refuse_updates: tuple[int, str] | None = None  # (code, reason) for every PUT
        self.expire_next_continue = False
        self.offer_on_expiry = True  # a 410 for an expired token offers one to go on from
        self._revision = 0
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        if tls is not None:
            self._http.socket = tls.wrap_socket(self._http.socket, server_side=True)
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> FakeApiserver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create(self, group: str, resource: str, namespace: str | None, name: str) -> Key:
        key = (group, resource, namespace, name)
        metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
        if namespace is not None:
            metadata["namespace"] = namespace
        self.objects[key] = {"metadata": metadata, "spec": {"replicas": len(name)}}
        self.encoded[key] = OLD
        self._bump(key)
        return key

    def _bump(self, key: Key) -> None:
        self._revision += 1
        self.objects[key]["metadata"]["resourceVersion"] = str(self._revision)

    def puts(self, name: str) -> list[int]:
        """Statuses of the PUTs of object ``name``, in order."""
        return [
            r.status for r in self.requests if r.method == "PUT" and r.path.endswith(f"/{name}")
        ]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the apiserver
            disable_nagle_algorithm = True  # headers and body go out in two writes

            def do_GET(self) -> None:
                self._serve()

            def do_PUT(self) -> None:
                self._serve()

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server._lock:
                    status, payload, headers = server._answer(
                        self.command, self.path, self.headers.get("Authorization"), body
                    )
                    server.requests.append(
                        Request(self.command, self.path, self.headers.get("Authorization"), status)
                    )
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {**headers, "Content-Type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def _answer(
        self, method: str, target: str, authorization: str | None, body: bytes
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if authorization != f"Bearer {self.token}":
            return _status(401, "Unauthorized")
        path, _, query = target.partition("?")
        parts = path.strip("/").split("/")
        if parts[0] == "api":
            group, rest = "", parts[1:]
        elif parts[0] == "apis" and len(parts) > 1:
            group, rest = parts[1], parts[2:]
        else:
            return _status(404, "NotFound")
        versions = API.get(group)
        if versions is None:
            return _status(404, "NotFound")
        if not rest:  # group discovery
            if not group:
                return 200, {"kind": "APIVersions", "versions": list(versions)}, {}
            entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
            return (
                200,
                {"kind": "APIGroup", "versions": entries, "preferredVersion": entries[0]},
                {},
            )
        resources = versions.get(rest[0])
        if resources is None:
            return _status(404, "NotFound")
        if len(rest) == 1:  # version discovery
            listed = [{"name": r, "namespaced": n} for r, n in resources.items()]
            return 200, {"kind": "APIResourceList", "resources": listed}, {}
        namespace = None
        if len(rest) >= 4 and rest[1] == "namespaces" and rest[3] in resources:
            namespace, rest = rest[2], [rest[0], *rest[3:]]
        resource = rest[1]
        if resource not in resources:
            return _status(404, "NotFound")
        if len(rest) == 2 and method == "GET":
            return self._list(group, resource, query)
        if len(rest) == 3 and resources[resource] == (namespace is not None):
            return self._object(method, (group, resource, namespace, rest[2]), body)
        return _status(404, "NotFound")

    def _list(
        self, group: str, resource: str, query: str
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        params = dict(p.split("=", 1) for p in query.split("&") if p)
        keys = sorted(
            (k for k in self.objects if k[:2] == (group, resource)),
            key=lambda k: (k[2] or "", k[3]),
        )
        token = params.get("continue")
        if token is not None:
            if self.expire_next_continue:
                self.expire_next_continue = False
                status = _status(410, "Expired")
                if self.offer_on_expiry:
                    status[1]["metadata"] = {"continue": _token(_position(token), fresh=True)}
                return status
            after = _position(token)
            keys = [k for k in keys if (k[2] or "", k[3]) > after]
        limit = int(params.get("limit", "0")) or len(keys)
        page, more = keys[:limit], len(keys) > limit
        metadata = {"continue": _token((page[-1][2] or "", page[-1][3]))} if more else {}
        items = [self.objects[k] for k in page]
        return 200, {"kind": "List", "metadata": metadata, "items": items}, {}

    def _object(
        self, method: str, key: Key, body: bytes
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        name = key[3]
        if key not in self.objects:
            status = _status(404, "NotFound")
            status[1]["details"] = {"name": name, "group": key[0], "kind": key[1]}
            return status
        if method == "GET":
            if name in self.throttle:
                seconds = self.throttle.pop(name)
                status, payload, _ = _status(429, "TooManyRequests")
                return status, payload, {"Retry-After": str(seconds)}
            if name in self.timeout:
                status, payload, headers = _status(500, "ServerTimeout")
                payload["details"] = {"name": name, "retryAfterSeconds": self.timeout.pop(name)}
                return status, payload, headers
            found = copy.deepcopy(self.objects[key])
            if name in self.concurrent_write_on:
                self.concurrent_write_on.discard(name)
                self._bump(key)
            return 200, found, {}
        if self.refuse_updates is not None:
            return _status(*self.refuse_updates)
        sent = json.loads(body)
        stored = self.objects[key]
        if sent["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
            return _status(409, "Conflict")
        self.objects[key] = sent
        if self.encoded[key] != NEW:  # same bytes would not be written again
            self.encoded[key] = NEW
            self._bump(key)
        return 200, self.objects[key], {}


def _status(code: int, reason: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    payload = {"kind": "Status", "status": "Failure", "reason": reason, "code": code}
    payload["message"] = f"fake apiserver says {reason}"
    return code, payload, {}


def write_kubeconfig(path: Path, server: str, user: dict[str, Any], **cluster: Any) -> str:
    """A kubeconfig for ``server`` (extra ``cluster`` fields: CA, insecure) as ``user``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(json.dumps(config))
    return str(path)


@contextlib.asynccontextmanager
async def target_for(kubeconfig: str) -> AsyncIterator[KubernetesTarget]:
    kube: Kube = await connect(kubeconfig)
    try:
        yield KubernetesTarget(kube)
    finally:
        await kube.close()


@pytest.fixture
def apiserver() -> Iterator[FakeApiserver]:
    with FakeApiserver() as server:
        yield server


@pytest.fixture
async def target(apiserver: FakeApiserver, tmp_path: Path) -> AsyncIterator[KubernetesTarget]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url, {"token": TOKEN})
    async with target_for(kubeconfig) as client:
        yield client


async def _list_all(
    target: KubernetesTarget, group: str, resource: str, limit: int
) -> list[ObjectRef]:
    refs: list[ObjectRef] = []
    token = None
    while True:
        page = await target.list(group, resource, token, limit)
        refs.extend(page.objects)
        token = page.continue_token
        if token is None:
            return refs


async def test_lists_and_rewrites_at_the_paths_kubernetes_serves(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    apiserver.create("", "pods", "ns-b", "web")
    apiserver.create("", "pods", "ns-a", "db")
    apiserver.create("apps", "deployments", "ns-a", "api")
    apiserver.create("apps", "deployments", "ns-a", "ui")
    apiserver.create("apps", "legacythings", None, "old")

    pods = await target.list("", "pods", None, 500)
    first = await target.list("apps", "deployments", None, 1)
    assert first.continue_token is not None
    second = await target.list("apps", "deployments", first.continue_token, 1)
    await target.rewrite("", "pods", ObjectRef("ns-a", "db"))
    legacy = await target.list("apps", "legacythings", None, 500)
    await target.rewrite("apps", "legacythings", ObjectRef(None, "old"))

    assert pods.objects == (ObjectRef("ns-a", "db"), ObjectRef("ns-b", "web"))
    assert pods.continue_token is None
    assert (first.objects, second.objects) == (
        (ObjectRef("ns-a", "api"),),
        (ObjectRef("ns-a", "ui"),),
    )
    assert second.continue_token is None
    assert legacy.objects == (ObjectRef(None, "old"),)
    assert [(r.method, r.path) for r in apiserver.requests] == [
        ("GET", "/api"),
        ("GET", "/api/v1"),
        ("GET", "/api/v1/pods?limit=500"),
        ("GET", "/apis/apps"),
        ("GET", "/apis/apps/v1"),
        ("GET", "/apis/apps/v1/deployments?limit=1"),
        ("GET", "/apis/apps"),
        ("GET", "/apis/apps/v1"),
        ("GET", f"/apis/apps/v1/deployments?limit=1&continue={first.continue_token}"),
        ("GET", "/api/v1/namespaces/ns-a/pods/db"),
        ("PUT", "/api/v1/namespaces/ns-a/pods/db"),
        # served only in the group's less preferred version
        ("GET", "/apis/apps"),
        ("GET", "/apis/apps/v1"),
        ("GET", "/apis/apps/v1beta1"),
        ("GET", "/apis/apps/v1beta1/legacythings?limit=500"),
        ("GET", "/apis/apps/v1beta1/legacythings/old"),
        ("PUT", "/apis/apps/v1beta1/legacythings/old"),
    ]
    assert {r.authorization for r in apiserver.requests} == {f"Bearer {TOKEN}"}
    assert {r.status for r in apiserver.requests} == {200}


async def test_an_object_whose_name_needs_escaping_is_the_one_rewritten(kubeconfig: str) -> None:
    # RBAC allows '?', '#' and spaces in a name. Unescaped, the first two would end the
    # path early, addressing another object (here none: a NotFound); the apiserver
    # refuses a PUT whose body names another object than its path.
    group, resource = "rbac.authorization.k8s.io", "clusterroles"
    path = f"/apis/{group}/v1/{resource}"
    prefix = f"svledger-{uuid.uuid4().hex[:8]}"
    names = sorted([f"{prefix}?x=1", f"{prefix}#frag", f"{prefix} y"])
    async with target_for(kubeconfig) as target:
        for name in names:
            role = {"apiVersion": f"{group}/v1", "kind": "ClusterRole", "metadata": {"name": name}}
            await target.kube.request("POST", path, role)
        try:
            listed = await _list_all(target, group, resource, 500)
            refs = [ref for ref in listed if ref.name.startswith(prefix)]
            assert sorted(ref.name for ref in refs) == names
            for ref in refs:
                await target.rewrite(group, resource, ref)
        finally:
            for name in names:
                await target.kube.request("DELETE", f"{path}/{quote(name, safe='')}")


async def test_every_get_and_list_takes_a_token_of_the_rate_limit(kubeconfig: str) -> None:
    # A clock that stands still: each token taken makes the next request wait 1 ms more.
    limit = RateLimit(qps=1000, burst=1, now=lambda: 0.0)
    kube = await connect(kubeconfig, rate_limit=limit)
    peer = kube.at(kube.host)  # the same limit for an apiserver addressed directly
    try:
        await kube.get("/api/v1/namespaces/default")
        await kube.list("coordination.k8s.io", "v1", "leases", "kube-system")
        await peer.get("/version")
    finally:
        await peer.close()
        await kube.close()
    assert limit.take() == pytest.approx(3 / 1000)


async def test_an_exec_credential_plugin_supplies_the_token(
    apiserver: FakeApiserver, tmp_path: Path
) -> None:
    plugin = tmp_path / "credential.py"
    plugin.write_text(
        "import json\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
        f" 'kind': 'ExecCredential', 'status': {{'token': '{TOKEN}'}}}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin)],
            "interactiveMode": "Never",
        }
    }
    apiserver.create("", "pods", "ns", "p")
    async with target_for(write_kubeconfig(tmp_path / "kc", apiserver.url, user)) as target:
        await target.rewrite("", "pods", ObjectRef("ns", "p"))
    assert {r.authorization for r in apiserver.requests} == {f"Bearer {TOKEN}"}
    assert {r.status for r in apiserver.requests} == {200}


@settings(max_examples=25, deadline=None)
@given(
    names=st.sets(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.text("xyz", min_size=1, max_size=4)),
        max_size=25,
    ),
    limit=st.integers(1, 8),
)
async def test_chunks_with_continue_tokens_cover_every_object_once(
    names: set[tuple[str, str]], limit: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with FakeApiserver() as apiserver:
        for namespace, name in names:
            apiserver.create("apps", "deployments", namespace, name)
        path = tmp_path_factory.mktemp("kube") / "kubeconfig"
        async with target_for(write_kubeconfig(path, apiserver.url, {"token": TOKEN})) as target:
            refs = await _list_all(target, "apps", "deployments", limit)
        lists = [r for r in apiserver.requests if r.path.startswith("/apis/apps/v1/deployments")]
    assert sorted(refs, key=lambda r: (r.namespace or "", r.name)) == refs
    assert {(r.namespace, r.name) for r in refs} == names
    assert len(refs) == len(names)
    assert len(lists) == max(1, -(-len(names) // limit))


async def test_a_continue_token_that_expired_goes_on_from_the_offered_one(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    names = [f"d{i}" for i in range(5)]
    for name in names:
        apiserver.create("apps", "deployments", "ns", name)
    first = await target.list("apps", "deployments", None, 2)
    assert first.continue_token is not None
    apiserver.expire_next_continue = True
    rest = await _list_all_from(target, first.continue_token)
    assert [r.name for r in (*first.objects, *rest)] == names
    assert [r.status for r in apiserver.requests].count(410) == 1


async def test_an_expired_continue_token_with_none_offered_is_a_failure_not_a_loop(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    # Upstream's migrator: a 410 without an inconsistent token to go on from ends it.
    for name in ("d0", "d1", "d2"):
        apiserver.create("apps", "deployments", "ns", name)
    first = await target.list("apps", "deployments", None, 2)
    assert first.continue_token is not None
    apiserver.expire_next_continue, apiserver.offer_on_expiry = True, False
    with pytest.raises(RequestFailed, match="410"):
        await target.list("apps", "deployments", first.continue_token, 2)


async def test_a_method_not_allowed_fails_the_migration_without_a_retry(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    # Upstream's migrator gives up at once on a 405 (TestMigrateList), and so does the worker.
    apiserver.create("apps", "deployments", "ns", "d")
    apiserver.refuse_updates = (405, "MethodNotAllowed")
    appended: list[Event] = []

    async def append(events: Sequence[Event]) -> None:
        appended.extend(events)

    await migrate(migration(), target, append=append, cancelled=lambda: False, clock=StepClock())
    assert apiserver.puts("d") == [405]
    failed = appended[-1]
    assert isinstance(failed, MigrationFailed)
    assert failed.reason == "RequestFailed" and "405" in failed.message


async def _list_all_from(target: KubernetesTarget, token: str) -> list[ObjectRef]:
    refs: list[ObjectRef] = []
    next_token: str | None = token
    while next_token is not None:
        page = await target.list("apps", "deployments", next_token, 2)
        refs.extend(page.objects)
        next_token = page.continue_token
    return refs


async def test_a_concurrent_write_is_a_conflict_and_the_next_rewrite_reads_again(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    key = apiserver.create("apps", "deployments", "ns", "d")
    apiserver.concurrent_write_on.add("d")
    with pytest.raises(Conflict, match="409"):
        await target.rewrite("apps", "deployments", ObjectRef("ns", "d"))
    assert apiserver.encoded[key] == OLD
    await target.rewrite("apps", "deployments", ObjectRef("ns", "d"))
    assert apiserver.puts("d") == [409, 200]
    assert apiserver.encoded[key] == NEW


@pytest.mark.parametrize(
    ("delays", "error"),
    [
        ("throttle", TooManyRequests),  # a 429's Retry-After header
        # A 500 ServerTimeout's details.retryAfterSeconds: upstream's SuggestsClientDelay.
        ("timeout", Transient),
    ],
)
async def test_a_refusal_carries_the_wait_the_server_asks_for(
    apiserver: FakeApiserver, target: KubernetesTarget, delays: str, error: type[Exception]
) -> None:
    apiserver.create("", "pods", "ns", "p")
    getattr(apiserver, delays)["p"] = 7
    with pytest.raises(error) as raised:
        await target.rewrite("", "pods", ObjectRef("ns", "p"))
    assert raised.value.retry_after == 7.0  # type: ignore[attr-defined]
    await target.rewrite("", "pods", ObjectRef("ns", "p"))


async def test_a_deleted_object_is_not_found(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    key = apiserver.create("", "pods", "ns", "p")
    page = await target.list("", "pods", None, 500)
    del apiserver.objects[key]
    with pytest.raises(NotFound, match="'p'"):
        await target.rewrite("", "pods", page.objects[0])


async def test_a_version_no_longer_served_is_rediscovered_not_taken_for_a_deletion(
    apiserver: FakeApiserver, target: KubernetesTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.create("apps", "deployments", "ns", "d")
    page = await target.list("apps", "deployments", None, 500)  # discovers v1
    monkeypatch.setitem(API, "apps", {"v1beta1": API["apps"]["v1beta1"]})  # v1 is gone
    with pytest.raises(Transient, match="no longer serves"):
        await target.rewrite("apps", "deployments", page.objects[0])
    await target.rewrite("apps", "deployments", page.objects[0])
    assert [r.path for r in apiserver.requests if r.method == "PUT"] == [
        "/apis/apps/v1beta1/namespaces/ns/deployments/d"
    ]
    # No version left at all: not served, which fails the migration, not a deleted
    # object, which the worker would count as migrated.
    monkeypatch.setitem(API, "apps", {"v1": {"replicasets": True}})
    with pytest.raises(Transient, match="no longer serves"):
        await target.rewrite("apps", "deployments", page.objects[0])
    with pytest.raises(NotServed, match=r"serves no resource 'deployments\.apps'"):
        await target.rewrite("apps", "deployments", page.objects[0])


def kube_requests() -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["verb"], s.labels["resource"], s.labels["code"]): s.value
        for family in REGISTRY.collect()
        if family.name == "svledger_kube_requests"
        for s in family.samples
        if s.name == "svledger_kube_requests_total"
    }


async def test_every_request_is_counted_by_verb_resource_and_code(
    apiserver: FakeApiserver, target: KubernetesTarget, tmp_path: Path
) -> None:
    apiserver.create("apps", "deployments", "ns", "d")
    before = kube_requests()
    await target.list("apps", "deployments", None, 500)
    await target.rewrite("apps", "deployments", ObjectRef("ns", "d"))
    apiserver.refuse_updates = (403, "Forbidden")
    with pytest.raises(Forbidden):
        await target.rewrite("apps", "deployments", ObjectRef("ns", "d"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}", {"token": TOKEN})
    async with target_for(kubeconfig) as unreachable:
        with pytest.raises(Transient):
            await unreachable.list("", "pods", None, 500)
    after = kube_requests()
    counted = {key: after[key] - before.get(key, 0) for key in after}
    assert {key: n for key, n in counted.items() if n} == {
        ("get", "", "200"): 2,  # discovery: /apis/apps, /apis/apps/v1
        ("list", "deployments.apps", "200"): 1,
        ("get", "deployments.apps", "200"): 2,
        ("update", "deployments.apps", "200"): 1,
        ("update", "deployments.apps", "403"): 1,
        ("get", "", "0"): 1,  # /api, unanswered
    }


async def test_an_unknown_resource_is_not_served_by_name(target: KubernetesTarget) -> None:
    with pytest.raises(NotServed, match=r"'widgets\.apps'"):
        await target.list("apps", "widgets", None, 500)


async def test_a_forbidden_update_names_the_verb_and_the_resource(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    apiserver.create("apps", "deployments", "ns", "d")
    apiserver.refuse_updates = (403, "Forbidden")
    with pytest.raises(Forbidden, match=r"may not update deployments\.apps 'd' in namespace 'ns'"):
        await target.rewrite("apps", "deployments", ObjectRef("ns", "d"))


async def test_a_rejected_token_is_unauthorized_and_says_what_to_check(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    apiserver.token = "another"
    with pytest.raises(Unauthorized, match="does not accept the credentials"):
        await target.list("", "pods", None, 500)


async def test_an_unreachable_server_is_transient(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}", {"token": TOKEN})
    async with target_for(kubeconfig) as target:
        with pytest.raises(Transient, match=f"127.0.0.1:{port}"):
            await target.list("", "pods", None, 500)


async def test_a_server_that_takes_the_connection_and_never_answers_is_transient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A frozen apiserver: the connection is accepted (by the kernel) and nothing comes.
    monkeypatch.setattr(client_module, "SILENCE_SECONDS", 1.0)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        kubeconfig = write_kubeconfig(tmp_path / "kc", url, {"token": TOKEN})
        async with target_for(kubeconfig) as target:
            with pytest.raises(Transient, match="no answer"):
                await asyncio.wait_for(target.list("", "pods", None, 500), 30)
            with pytest.raises(ClusterUnreachable, match="no answer"):
                await asyncio.wait_for(target.kube.list("", "v1", "pods", None), 30)
            monkeypatch.setattr(client_module, "WATCH_SECONDS", 0)
            watch = target.kube.watch("", "v1", "pods", None, "1")
            with pytest.raises(ClusterUnreachable, match="no answer"):
                await asyncio.wait_for(anext(watch), 30)


async def test_a_long_answer_that_keeps_coming_is_not_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A large list streams for longer than the silence a request waits through (a stall
    # of this process short of that silence must not cut it off either).
    monkeypatch.setattr(client_module, "SILENCE_SECONDS", 3.0)

    async def slowly(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"items": [{}')
        for _ in range(40):  # 4 s in all, never silent for 3 s
            await asyncio.sleep(0.1)
            await response.write(b", {}")
        await response.write(b'], "metadata": {}}')
        return response

    application = web.Application()
    application.router.add_get("/api/v1/pods", slowly)
    async with TestServer(application) as server:
        kube = kube_at(str(server.make_url("")))
        try:
            assert len((await kube.get("/api/v1/pods"))["items"]) == 41
        finally:
            await kube.close()


async def test_a_missing_kubeconfig_is_named() -> None:
    with pytest.raises(ConfigurationError, match="/nonexistent/kubeconfig"):
        await connect("/nonexistent/kubeconfig")


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("clusters: [unclosed\n", "while parsing a flow sequence"),
        (
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
            "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1,"
            " command: /nonexistent/credential-plugin}}}]\n",
            "/nonexistent/credential-plugin",
        ),
        ("root:x:0:0:root:/root:/bin/bash\n", "it is not a kubeconfig (a YAML mapping"),
        ("", "it is not a kubeconfig (a YAML mapping"),
    ],
    ids=["not-yaml", "exec-plugin-missing", "another-file", "empty"],
)
async def test_a_kubeconfig_that_cannot_be_used_is_named_with_why(
    tmp_path: Path, content: str, named: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(content)
    with pytest.raises(ConfigurationError) as refused:
        await connect(str(kubeconfig))
    assert f"cannot use kubeconfig {kubeconfig}" in str(refused.value)
    assert named in str(refused.value)


async def test_a_kubeconfig_that_is_a_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=f"--kubeconfig {tmp_path} is not a file"):
        await connect(str(tmp_path))


async def test_a_kubeconfig_variable_naming_no_file_is_said_when_none_is_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/config")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    with pytest.raises(ConfigurationError, match="none of KUBECONFIG='/nonexistent/config'"):
        await connect()


async def test_outside_a_cluster_without_kubeconfig_it_asks_for_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    with pytest.raises(ConfigurationError, match="--kubeconfig"):
        await connect()


# --- TLS -----------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (also the CA file)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "ca.crt", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_apiserver(certificate: tuple[Path, Path]) -> Iterator[FakeApiserver]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    with FakeApiserver(tls=context) as server:
        yield server


async def test_tls_is_verified_against_the_kubeconfigs_ca(
    tls_apiserver: FakeApiserver, certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    tls_apiserver.create("", "pods", "ns", "p")
    url = f"https://127.0.0.1:{tls_apiserver.port}"
    user = {"token": TOKEN}
    trusted = write_kubeconfig(
        tmp_path / "ca", url, user, **{"certificate-authority": str(certificate[0])}
    )
    async with target_for(trusted) as target:
        assert (await target.list("", "pods", None, 500)).objects == (ObjectRef("ns", "p"),)
    untrusted = write_kubeconfig(tmp_path / "none", url, user)
    async with target_for(untrusted) as target:
        with pytest.raises(RequestFailed, match="certificate-authority"):
            await target.list("", "pods", None, 500)
    insecure = write_kubeconfig(
        tmp_path / "insecure", url, user, **{"insecure-skip-tls-verify": True}
    )
    async with target_for(insecure) as target:
        assert (await target.list("", "pods", None, 500)).objects == (ObjectRef("ns", "p"),)


# --- a whole migration -----------------------------------------------------------------


async def test_the_worker_migrates_every_object_through_the_api(
    apiserver: FakeApiserver, target: KubernetesTarget
) -> None:
    keys = [
        apiserver.create("apps", "deployments", namespace, f"d{i}")
        for i, namespace in enumerate(["ns-b", "ns-a", "ns-c", "ns-a", "ns-b", "ns-c", "ns-a"])
    ]
    before = {k: copy.deepcopy(apiserver.objects[k]) for k in keys}
    apiserver.concurrent_write_on.add("d2")
    apiserver.throttle["d4"] = 3
    events: list[Event] = []
    clock = StepClock()

    async def append(batch: Sequence[Event]) -> None:
        events.extend(batch)

    await migrate(
        migration(),
        target,
        append=append,
        cancelled=lambda: False,
        clock=clock,
        chunk_size=3,
        policy=RetryPolicy(max_retries=3),
    )

    steps = [(type(e), e.objects_migrated) for e in events]  # type: ignore[union-attr]
    assert steps == [
        (MigrationStarted, 0),
        (MigrationProgressed, 3),
        (MigrationProgressed, 6),
        (MigrationSucceeded, 7),
    ]
    assert {k: apiserver.encoded[k] for k in keys} == {k: NEW for k in keys}
    for key in keys:
        name = key[3]
        assert apiserver.puts(name) == ([409, 200] if name == "d2" else [200])
        unchanged = {**apiserver.objects[key], "metadata": {**apiserver.objects[key]["metadata"]}}
        unchanged["metadata"].pop("resourceVersion")
        before[key]["metadata"].pop("resourceVersion")
        assert unchanged == before[key]
    assert sorted(clock.slept) == [0.0, 3.0]  # the conflict re-reads at once; 429 waits


# --- the command -------------------------------------------------------------------------


def test_worker_names_a_kubeconfig_it_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--cluster", "east", "--kubeconfig", "/nonexistent/kc"]) == 2
    assert "/nonexistent/kc" in capsys.readouterr().err


def test_worker_refuses_an_unknown_executor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--cluster", "east", "--executor", "magic"]) == 2
    assert "'magic'" in capsys.readouterr().err
