"""The write gate: which requests pass before registration, and what a refused one is told."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.gate import RequestInfo, WriteGate, WriteGateMiddleware, request_info

labels = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True).filter(
    lambda label: label not in ("watch", "proxy")  # path prefixes, ambiguous upstream too
)
groups = st.one_of(st.just(""), st.lists(labels, min_size=1, max_size=3).map(".".join))
versions = st.sampled_from(["v1", "v1beta1", "v2alpha3"])
tails = st.sampled_from(["", "/obj", "/obj/status", "/obj/scale"])


def _resource_path(group: str, version: str, resource: str, namespace: str | None) -> str:
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{resource}"


@given(groups, versions, labels, st.one_of(st.none(), labels), tails, st.booleans())
def test_resource_paths_resolve_to_their_group_and_resource(
    group: str, version: str, resource: str, namespace: str | None, tail: str, watch: bool
) -> None:
    path = _resource_path(group, version, resource, namespace) + tail
    if watch:
        path = path.replace(f"/{version}/", f"/{version}/watch/", 1)
    expected = ("", "namespaces") if namespace and resource in ("status", "finalize") else None
    found = request_info("GET", path)
    assert found is not None
    assert (found.group, found.resource) == (expected or (group, resource))
    assert found.namespace == (namespace or "")
    assert found.verb == ("watch" if watch else "get")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/v1/namespaces", ("", "namespaces")),
        ("/api/v1/namespaces/kube-system", ("", "namespaces")),
        ("/api/v1/namespaces/kube-system/status", ("", "namespaces")),
        ("/api/v1/namespaces/kube-system/finalize", ("", "namespaces")),
        ("/api/v1/namespaces/kube-system/pods", ("", "pods")),
        ("/apis/apps/v1/namespaces/default/deployments/web/scale", ("apps", "deployments")),
        ("/api", None),
        ("/api/v1", None),
        ("/apis", None),
        ("/apis/apps", None),
        ("/apis/apps/v1", None),
        ("/healthz", None),
        ("/", None),
    ],
)
def test_namespace_subresources_and_non_resource_paths(
    path: str, expected: tuple[str, str] | None
) -> None:
    found = request_info("PUT", path)
    assert (found and (found.group, found.resource)) == expected


def test_writes_wait_for_registration_reads_never_do() -> None:
    gate = WriteGate([("apps", "deployments"), ("", "pods")])
    for method in ("GET", "HEAD", "get"):
        assert gate.allows(method, "apps", "deployments")
    for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        assert not gate.allows(method, "apps", "deployments")
        assert gate.allows(method, "batch", "jobs")  # never reported: not persisted here
    gate.open([("apps", "deployments")])
    assert gate.allows("POST", "apps", "deployments")
    assert not gate.allows("POST", "", "pods")
    assert not gate.completed
    gate.open([("", "pods")])
    assert gate.completed
    gate.close([("", "pods")])
    assert not gate.allows("DELETE", "", "pods")


@pytest.mark.parametrize(
    ("method", "path", "passes"),
    [
        # Upstream's precondition: reads by verb, not by method ...
        ("POST", "/api/v1/watch/pods", True),
        ("GET", "/api/v1/proxy/namespaces/ns/pods/foo", False),
        ("OPTIONS", "/api/v1/namespaces/ns/pods", False),
        # ... and the writes it lets through before registration.
        ("POST", "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions", True),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/a", True),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/a", False),
    ],
)
def test_the_gate_passes_what_upstreams_precondition_passes(
    method: str, path: str, passes: bool
) -> None:
    pending = [("", "pods"), ("internal.apiserver.k8s.io", "storageversions")]
    gate = WriteGate([*pending, ("coordination.k8s.io", "leases")])
    request = request_info(method, path)
    assert request is not None
    assert gate.admits(request) is passes


def test_the_apiserver_itself_may_create_namespaces_before_registration() -> None:
    """Upstream passes namespace creation by ``system:apiserver`` in ``system:masters``
    (its bootstrap of ``kube-system``), and no other write to namespaces."""
    gate = WriteGate([("", "namespaces"), ("", "configmaps")])
    apiserver = RequestInfo(
        "create", "", "namespaces", user="system:apiserver", groups=("system:masters",)
    )
    assert gate.admits(apiserver)
    assert not gate.admits(dataclasses.replace(apiserver, groups=("system:authenticated",)))
    assert not gate.admits(dataclasses.replace(apiserver, user="admin"))
    assert not gate.admits(dataclasses.replace(apiserver, user=None, groups=()))
    assert not gate.admits(dataclasses.replace(apiserver, verb="update", namespace="kube-system"))
    assert not gate.admits(dataclasses.replace(apiserver, resource="configmaps"))

    users = {"apiserver": ("system:apiserver", ["system:masters"]), "admin": ("admin", [])}
    app = WriteGateMiddleware(_hello, gate, user=lambda scope: users.get(scope["user"]))
    for user, status in (("apiserver", 201), ("admin", 503), ("anonymous", 503)):
        assert asyncio.run(_call(app, "POST", "/api/v1/namespaces", user=user))[0] == status
    assert asyncio.run(_call(app, "PUT", "/api/v1/namespaces/x", user="apiserver"))[0] == 503


def test_reason_is_upstreams_message_with_the_group_resource() -> None:
    gate = WriteGate([("apps", "deployments"), ("", "pods")])
    assert gate.reason("apps", "deployments") == (
        "wait for storage version registration to complete for resource: "
        "deployments.apps, last seen error: <nil>"
    )
    gate.fail([("", "pods")], "KafkaTimeoutError: no ack")
    assert gate.reason("", "pods") == (
        "wait for storage version registration to complete for resource: "
        "pods, last seen error: KafkaTimeoutError: no ack"
    )


async def _call(
    app: Any, method: str, path: str, user: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "user": user}
    await app(scope, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, body


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def test_middleware_answers_503_status_to_a_blocked_write_and_passes_the_rest() -> None:
    gate = WriteGate([("apps", "deployments")])
    app = WriteGateMiddleware(_hello, gate)
    path = "/apis/apps/v1/namespaces/default/deployments"

    status, headers, body = asyncio.run(_call(app, "POST", path))
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": gate.reason("apps", "deployments"),
        "reason": "ServiceUnavailable",
        "code": 503,
    }
    assert asyncio.run(_call(app, "GET", path))[0] == 201
    assert asyncio.run(_call(app, "POST", "/api/v1/namespaces/default/pods"))[0] == 201
    gate.open([("apps", "deployments")])
    assert asyncio.run(_call(app, "POST", path))[0] == 201
