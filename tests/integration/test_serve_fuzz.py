"""Hostile requests to the read API: paths, query parameters, headers and methods.

Whatever arrives, the answer is never a 500: a Kubernetes ``Status`` with a 4xx code
that says what was wrong, or the data. The server runs in process (aiohttp's test
server) over a real topic on the real broker, and keeps serving after every request.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Iterator
from datetime import UTC

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from yarl import URL

from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from readapi.ledger import LedgerViews
from readapi.server import ServeOptions, app
from tests.workloads import mixed_events

CLUSTERS = ("cluster-000", "cluster-001")
API_PATHS = (
    "api",
    "api/v1",
    "apis",
    "apis/migration.k8s.io",
    "apis/migration.k8s.io/v1alpha1",
    "apis/internal.apiserver.k8s.io/v1alpha1/storageversions",
    "apis/internal.apiserver.k8s.io/v1alpha1/storageversions/apps.deployments",
    "apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
    "apis/coordination.k8s.io/v1/leases",
    "apis/migration.k8s.io/v1alpha1/storagestates",
    "apis/migration.k8s.io/v1alpha1/namespaces/x/storagestates",
    "apis/migration.k8s.io/v1alpha1/storageversionmigrations",
    "version",
)
PARAMETERS = (
    "watch",
    "resourceVersion",
    "resourceVersionMatch",
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "timeoutSeconds",
    "includeObject",
    "allowWatchBookmarks",
)
ACCEPTS = (
    "application/json",
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
    "application/json;g=apidiscovery.k8s.io;v=v9;as=APIGroupDiscoveryList",
    "*/*",
)

texts = st.text(min_size=0, max_size=20)
header_texts = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
points = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.datetimes(timezones=st.just(UTC)).map(lambda t: t.isoformat()),
    texts,
)
paths = st.builds(
    lambda cluster, point, rest: (
        "/clusters/" + cluster + (f"/at/{point}" if point is not None else "") + "/" + rest
    ),
    st.one_of(st.sampled_from(CLUSTERS), texts),
    st.one_of(st.none(), points),
    st.one_of(st.sampled_from(API_PATHS), texts),
) | st.one_of(
    st.sampled_from(["/healthz", "/readyz", "/", "/clusters", "/metrics"]),
    # A request's path starts with "/": without it a client cannot send it ("0:" is a URL
    # with a scheme), so a bare text would test the client, not the server.
    texts.map(lambda text: "/" + text),
)
queries = st.dictionaries(
    st.one_of(st.sampled_from(PARAMETERS), texts),
    st.one_of(
        st.sampled_from(["true", "0", "1", "5", "Exact", "NotOlderThan", "Object", "a=b"]), texts
    ),
    max_size=4,
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "Accept": st.one_of(st.sampled_from(ACCEPTS), header_texts),
        "Authorization": st.one_of(st.just("Bearer x"), header_texts),
    },
)
methods = st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"])


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def views(kafka_bootstrap: str, loop: asyncio.AbstractEventLoop) -> Iterator[LedgerViews]:
    settings = KafkaSettings(
        bootstrap_servers=kafka_bootstrap, topic=f"svledger-test.fuzz.{id(loop)}", partitions=2
    )

    async def start() -> tuple[LedgerViews, asyncio.Event, asyncio.Task[None]]:
        await create_topics(settings)
        async with EventProducer(settings) as producer:
            await producer.send_many(mixed_events(600, clusters=len(CLUSTERS)))
        views = LedgerViews(settings, checkpoint_every=50)
        stop = asyncio.Event()
        follower = asyncio.create_task(views.follow(stop))
        await asyncio.wait_for(views.ready.wait(), 60)
        return views, stop, follower

    ledger_views, stop, follower = loop.run_until_complete(start())
    yield ledger_views
    stop.set()
    loop.run_until_complete(follower)


@pytest.fixture(scope="module")
def client(views: LedgerViews, loop: asyncio.AbstractEventLoop) -> Iterator[TestClient]:
    async def start() -> TestClient:
        test_client = TestClient(TestServer(app(views, ServeOptions(bookmark_seconds=0.3))))
        await test_client.start_server()
        return test_client

    test_client = loop.run_until_complete(start())
    yield test_client
    loop.run_until_complete(test_client.close())


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(method=methods, path=paths, query=queries, header=headers)
@example(method="GET", path="//0", query={}, header={})  # a path that begins "//"
def test_no_request_gets_a_500(
    client: TestClient,
    loop: asyncio.AbstractEventLoop,
    method: str,
    path: str,
    query: dict[str, str],
    header: dict[str, str],
) -> None:
    if "watch" in query:
        query["timeoutSeconds"] = "0"  # a watch that ends, so the test does
    target = urllib.parse.quote(path, safe="/:") + "?" + urllib.parse.urlencode(query)
    # Sent as it is: the test client's own URL joining takes a path starting "//" for a host.
    url = URL(f"http://{client.host}:{client.port}{target}", encoded=True)

    async def request() -> tuple[int, bytes, str]:
        async with client.session.request(method, url, headers=header) as response:
            return response.status, await response.read(), response.content_type

    code, body, content_type = loop.run_until_complete(asyncio.wait_for(request(), 30))
    assert code < 500 or (code == 503 and path == "/readyz"), (code, body[:300])
    if code >= 400 and content_type == "application/json" and method != "HEAD":
        status = json.loads(body)
        assert status["kind"] == "Status" and status["code"] == code
        assert status["message"]


def test_an_idle_watch_gets_bookmarks_at_the_position_folded(
    client: TestClient, views: LedgerViews, loop: asyncio.AbstractEventLoop
) -> None:
    cluster = CLUSTERS[0]
    offset = views.fold(cluster).offset
    url = (
        f"/clusters/{cluster}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
        f"?watch=true&allowWatchBookmarks=true&resourceVersion={offset}&timeoutSeconds=2"
    )

    async def watch() -> list[dict[str, object]]:
        async with client.get(url) as response:
            return [json.loads(line) async for line in response.content]

    events = loop.run_until_complete(watch())
    # As upstream's watch cache: no bookmark at the resourceVersion a watch started from.
    assert events == []
    url = url.replace(f"resourceVersion={offset}", f"resourceVersion={offset - 1}")
    events = [event for event in loop.run_until_complete(watch()) if event["type"] == "BOOKMARK"]
    assert len(events) >= 2, "bookmarks every 0.3 s, once the position moved past the start"
    assert {event["object"]["metadata"]["resourceVersion"] for event in events} == {str(offset)}  # type: ignore[index]


def test_a_limited_list_at_a_resource_version_is_served_at_it(
    client: TestClient, views: LedgerViews, loop: asyncio.AbstractEventLoop
) -> None:
    # Upstream's legacy rule: limit and resourceVersion without resourceVersionMatch is Exact.
    cluster = CLUSTERS[0]
    past = views.fold(cluster).offset // 2
    url = (
        f"/clusters/{cluster}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
        f"?limit=1&resourceVersion={past}"
    )

    async def get() -> dict[str, object]:
        async with client.get(url) as response:
            assert response.status == 200
            return await response.json()  # type: ignore[no-any-return]

    page = loop.run_until_complete(get())
    assert page["metadata"]["resourceVersion"] == str(past)  # type: ignore[index]
