"""The read API's list and watch semantics against upstream's, over HTTP in process
(:mod:`tests.served`)."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from readapi import clusters, server
from readapi.ledger import LedgerViews
from readapi.status import ApiError
from readapi.watch import INITIAL_EVENTS_END
from tests.served import CLUSTER, EVENTS, FOLDED, LEASES, STORAGE_VERSIONS, fold, lease_names, watch


def versions(events: list[dict[str, Any]]) -> list[int]:
    return [
        int(e["object"]["metadata"]["resourceVersion"])
        for e in events
        if e["type"] in ("ADDED", "MODIFIED", "DELETED")
    ]


JSON_BODY = {"Content-Type": "application/json"}


async def test_a_deletion_is_sent_at_its_own_resource_version(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    live = views.clusters["cluster-000"]
    deleted = {c.offset for c in live.changes if c.type == "DELETED" and c.row.key[1:] != ()}
    events = await watch(client, LEASES, f"resourceVersion={live.horizon}")
    sent = [e for e in events if e["type"] == "DELETED"]
    assert sent, "the log holds lease releases and expiries"
    assert {int(e["object"]["metadata"]["resourceVersion"]) for e in sent} <= deleted
    seen = versions(events)
    assert seen == sorted(seen)  # a client resuming from the last one loses nothing


async def test_a_watch_from_ahead_of_the_fold_gets_only_later_changes(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    ahead = views.clusters["cluster-000"].offset + 50

    async def append_later() -> None:
        await asyncio.sleep(0.3)
        fold(views, EVENTS[FOLDED:])

    appending = asyncio.create_task(append_later())
    events = await watch(client, LEASES, f"resourceVersion={ahead}")
    await appending
    assert versions(events), "the appended events renew leases"
    assert min(versions(events)) > ahead


async def test_a_watch_with_timeout_seconds_0_runs_for_the_default_timeout(
    served: tuple[TestClient[Any, Any], LedgerViews], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Upstream: 0, like none, is between one and two minimum request timeouts.
    monkeypatch.setattr("readapi.watch.WATCH_TIMEOUT_SECONDS", 1.0)
    client, views = served
    current = views.clusters["cluster-000"].offset
    folding = asyncio.get_running_loop().call_later(0.3, fold, views, EVENTS[FOLDED:])
    path = f"{LEASES}?watch=true&timeoutSeconds=0&resourceVersion={current}"
    async with client.get(path) as response:
        events = [json.loads(line) for line in (await response.text()).splitlines() if line]
    folding.cancel()
    assert versions(events), "the changes folded while the watch was open"
    assert min(versions(events)) > current


async def test_the_deprecated_watch_paths_watch_as_the_watch_parameter_does(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    start = f"resourceVersion={views.clusters['cluster-000'].horizon}"
    legacy = LEASES.replace("/v1/namespaces/", "/v1/watch/namespaces/")
    events = await watch(client, LEASES, start)
    assert versions(events), "the window holds lease changes"
    assert await watch(client, legacy, start, parameter=False) == events
    name = events[0]["object"]["metadata"]["name"]
    one = [e for e in events if e["object"]["metadata"]["name"] == name]
    assert await watch(client, f"{legacy}/{name}", start, parameter=False) == one
    cluster_scoped = STORAGE_VERSIONS.replace("/v1alpha1/", "/v1alpha1/watch/")
    assert await watch(client, cluster_scoped, start) == await watch(
        client, STORAGE_VERSIONS, start
    )


async def test_the_watch_parameter_on_one_objects_path_gets_the_object(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    # Upstream reads a GET that names an object as a get (its request info), so
    # client-go watches one object by a field selector on the collection instead.
    client, views = served
    [name, *_] = lease_names(views)
    async with client.get(f"{LEASES}/{name}") as plain:
        expected = await plain.json()
    async with client.get(f"{LEASES}/{name}?watch=true&timeoutSeconds=1") as response:
        assert response.status == 200
        assert await response.json() == expected


async def test_send_initial_events_ends_with_the_annotated_bookmark(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    live = views.clusters["cluster-000"]
    events = await watch(
        client,
        STORAGE_VERSIONS,
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
    )
    initial = [e for e in events if e["type"] == "ADDED"]
    assert len(initial) == len(live.state.storage_versions)
    end = events[len(initial)]
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {INITIAL_EVENTS_END: "true"}
    assert end["object"]["metadata"]["resourceVersion"] == str(live.offset)
    # Asked for none, none comes, whatever the resourceVersion.
    none = await watch(
        client,
        STORAGE_VERSIONS,
        "sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0",
    )
    assert [e for e in none if e["type"] != "BOOKMARK"] == []


async def test_a_watch_with_bookmarks_gets_one_right_before_its_timeout(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    """Upstream's watch cache sends a bookmark 2 s before the watch's deadline, so the
    client resumes from as close to now as it can; none if the watch is shorter, and
    none past no change: a watcher gets no bookmark at the resourceVersion it started
    from. The bookmark's object is the kind's empty object, as upstream's."""
    _, views = served
    offset = views.clusters["cluster-000"].offset
    quiet = f"{STORAGE_VERSIONS}?watch=true&resourceVersion={offset}&allowWatchBookmarks=true"
    moved = quiet.replace(f"resourceVersion={offset}", f"resourceVersion={offset - 1}")
    # The periodic bookmarks of quiet spells a minute apart, as upstream's.
    client = TestClient(TestServer(server.app(views, server.ServeOptions(bookmark_seconds=60))))
    await client.start_server()
    try:
        async with client.get(f"{moved}&timeoutSeconds=3") as response:
            lines = (await response.text()).splitlines()
        events = [json.loads(line) for line in lines if line]
        assert [e["type"] for e in events][-1:] == ["BOOKMARK"]
        assert events[-1]["object"] == {
            "kind": "StorageVersion",
            "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
            "metadata": {"resourceVersion": str(offset)},
            "spec": {},
            "status": {},
        }
        for path in (f"{moved}&timeoutSeconds=2", f"{quiet}&timeoutSeconds=3"):
            async with client.get(path) as response:
                lines = (await response.text()).splitlines()
            assert [json.loads(line)["type"] for line in lines if line].count("BOOKMARK") == 0
    finally:
        await client.close()


async def test_a_plain_watch_ends_its_initial_events_with_the_bookmark_too(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    # Upstream (WatchList on by default) turns a watch from no resourceVersion into a
    # watch list. Python clients send booleans as "True": any value but 0 and false is true.
    client, views = served
    live = views.clusters["cluster-000"]
    events = await watch(client, STORAGE_VERSIONS, "watch=True&allowWatchBookmarks=True")
    initial = [e for e in events if e["type"] == "ADDED"]
    assert len(initial) == len(live.state.storage_versions)
    end = events[len(initial)]
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {INITIAL_EVENTS_END: "true"}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("resourceVersionMatch=Exact", "resourceVersionMatch is forbidden unless"),
        ("resourceVersion=0&resourceVersionMatch=Exact", 'forbidden for resourceVersion "0"'),
        ("resourceVersion=5&resourceVersionMatch=Newest", 'Unsupported value: "Newest"'),
        # A ResourceVersionMatch is shown as Go's json.Marshal writes it.
        (
            "resourceVersion=5&resourceVersionMatch=a%22%3Cb%26%C3%A9",
            'Unsupported value: "a\\"\\u003cb\\u0026é": supported',
        ),
        ("sendInitialEvents=true", "sendInitialEvents is forbidden for list"),
        ("watch=true&resourceVersionMatch=NotOlderThan", "unless sendInitialEvents is provided"),
        ("watch=true&sendInitialEvents=true", "requires setting resourceVersionMatch"),
    ],
)
async def test_list_options_upstream_refuses_are_invalid(
    served: tuple[TestClient[Any, Any], LedgerViews], query: str, message: str
) -> None:
    client, _ = served
    async with client.get(f"{LEASES}?{query}") as response:
        status = await response.json()
    assert (response.status, status["reason"], status["details"]["kind"]) == (
        422,
        "Invalid",
        "ListOptions",
    )
    assert status["message"].startswith('ListOptions.meta.k8s.io "" is invalid: ')
    assert message in status["message"]


async def test_an_invalid_list_option_reads_as_upstreams_field_errors(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    async with client.get(f"{LEASES}?resourceVersion=1&resourceVersionMatch=foo") as response:
        status = await response.json()
    unsupported = 'Unsupported value: "foo": supported values: "Exact", "NotOlderThan", ""'
    assert status["message"] == (
        f'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: {unsupported}'
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueNotSupported",
            "message": unsupported,
            "field": "resourceVersionMatch",
        }
    ]
    async with client.get(f"{LEASES}?resourceVersionMatch=Exact") as response:
        [cause] = (await response.json())["details"]["causes"]
    assert cause["message"] == (
        "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
    )


@pytest.mark.parametrize("query", ["limit=%C2%B2", "limit=-%C2%B2"])
async def test_a_number_in_digits_int_does_not_read_is_a_bad_request(
    served: tuple[TestClient[Any, Any], LedgerViews], query: str
) -> None:
    """A superscript two is a digit to Python's isdigit(), not a number to int()."""
    client, _ = served
    async with client.get(f"{LEASES}?{query}") as response:
        status = await response.json()
    assert (response.status, status["reason"]) == (400, "BadRequest")
    assert "\u00b2'" in status["message"]  # the value, quoted


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("abc", "invalid syntax"),
        ("%C2%B2", "invalid syntax"),  # a digit to isdigit(), not to Go's ParseUint
        ("-1", "invalid syntax"),
        ("18446744073709551616", "value out of range"),  # 2**64
    ],
)
async def test_a_resource_version_not_a_number_is_refused_as_upstreams_storage_refuses_it(
    served: tuple[TestClient[Any, Any], LedgerViews], value: str, why: str
) -> None:
    """In kube-apiserver 1.37's words: a list's as its storage refuses it, a get's and a
    watch's as its watch cache does (which upstream answers with a 500, no handler
    classifying that error: a 400 here, as a client's bad value)."""
    client, views = served
    [name, *_] = lease_names(views)
    shown = '"\u00b2"' if value == "%C2%B2" else f'"{value}"'
    message = f"resourceVersion: Invalid value: {shown}: strconv.ParseUint: parsing {shown}: {why}"
    async with client.get(f"{LEASES}?resourceVersion={value}") as response:
        status = await response.json()
    assert (response.status, status["reason"]) == (400, "BadRequest")
    assert status["message"] == f"invalid resource version: {message}"
    for path in (f"{LEASES}/{name}?", f"{LEASES}?watch=1&"):
        async with client.get(f"{path}resourceVersion={value}") as response:
            status = await response.json()
        assert (response.status, status["reason"], status["message"]) == (
            400,
            "BadRequest",
            message,
        )


async def test_a_namespaced_object_is_found_under_its_namespace_only(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    [name, *_] = lease_names(views)
    async with client.get(f"{LEASES}/{name}") as found:
        assert found.status == 200
    clusterwide = LEASES.replace("/namespaces/kube-system", "")
    async with client.get(f"{clusterwide}/{name}") as response:
        assert (response.status, (await response.json())["reason"]) == (404, "NotFound")
    async with client.get(clusterwide) as listed:  # a list across namespaces is served
        assert listed.status == 200


async def test_a_cluster_not_folded_before_the_views_are_ready_is_unavailable_not_missing(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    # Views still reading the log up to its end (or waiting for the broker) cannot say a
    # cluster has no events: a client is told to try again, as upstream's 503s do.
    client, views = served
    other = STORAGE_VERSIONS.replace("cluster-000", "cluster-later")
    views.ready.clear()
    async with client.get(other) as response:
        status = await response.json()
        assert (response.status, status["reason"]) == (503, "ServiceUnavailable")
        assert response.headers["Retry-After"] == "1"
        assert "'cluster-later' is not folded yet" in status["message"]
    async with client.get(STORAGE_VERSIONS) as known:  # a cluster folded is served
        assert known.status == 200
    views.ready.set()
    async with client.get(other) as response:
        assert (response.status, (await response.json())["reason"]) == (404, "NotFound")


async def test_a_field_selector_on_one_objects_watch_must_pin_its_name(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    [name, other, *_] = lease_names(views)
    legacy = LEASES.replace("/v1/namespaces/", "/v1/watch/namespaces/")
    pinned = await watch(
        client, f"{legacy}/{name}", f"fieldSelector=metadata.name%3D{name}", parameter=False
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in pinned] == [("ADDED", name)]
    for selector in (f"metadata.name%3D{other}", "metadata.namespace%3Dkube-system"):
        async with client.get(f"{legacy}/{name}?fieldSelector={selector}") as refused:
            status = await refused.json()
        assert (refused.status, status["message"]) == (
            400,
            "fieldSelector metadata.name doesn't match requested name",
        )


async def test_every_page_of_a_table_gives_the_ages_one_page_gives(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    # kubectl pages (500 a page): later pages are of the first's resourceVersion, but
    # their ages are of now, as upstream's Table cells.
    client, _ = served
    table = {"Accept": "application/json;as=Table;g=meta.k8s.io;v=v1"}
    async with client.get(STORAGE_VERSIONS, headers=table) as response:
        whole = [row["cells"] for row in (await response.json())["rows"]]
    paged: list[Any] = []
    token = ""
    while True:
        async with client.get(
            f"{STORAGE_VERSIONS}?limit=1&continue={token}", headers=table
        ) as response:
            page = await response.json()
        paged += [row["cells"] for row in page["rows"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert len(whole) > 2
    assert paged == whole


async def test_kubectl_finds_kube_system_and_no_other_namespace(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    # kubectl reads the namespace after a NotFound, to say which of the two is missing.
    client, _ = served
    core = LEASES.split("/apis/")[0] + "/api/v1/namespaces"
    async with client.get(f"{core}/kube-system") as response:
        namespace = await response.json()
    assert (response.status, namespace["kind"], namespace["status"]) == (
        200,
        "Namespace",
        {"phase": "Active"},
    )
    async with client.get(f"{core}/default") as response:
        status = await response.json()
    assert (response.status, status["message"]) == (404, 'namespaces "default" not found')


async def test_an_unknown_path_is_404_whatever_the_method_and_a_write_405(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    review = LEASES.split("/apis/")[0] + "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    async with client.post(review) as response:
        assert response.status == 404  # as a server without that API: kubectl says so
    async with client.post(LEASES) as response:
        refused = await response.json()
        assert (response.status, refused["reason"]) == (405, "MethodNotAllowed")
        assert refused["details"] == {}  # upstream's generic 405 names no resource
    async with client.get("/api") as response:  # kubectl get --raw drops the cluster's path
        assert response.status == 404
        assert "/clusters/CLUSTER" in (await response.json())["message"]
    async with client.get("/livez") as response:
        assert (response.status, await response.text()) == (200, "ok")


METHOD_NOT_ALLOWED = "the server does not allow this method on the requested resource"


async def test_only_get_is_allowed_where_upstream_answers_get_only(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    """As kube-apiserver 1.37: its API paths are routes of GET alone, so HEAD and writes
    are its generic 405 (on an object that does not exist too: the route is matched,
    not the object); /apis and /apis/GROUP are answered whatever the method."""
    client, views = served
    [name, *_] = lease_names(views)
    group = f"{CLUSTER}/apis/coordination.k8s.io"
    refused = [
        LEASES,
        f"{LEASES}/{name}",
        f"{LEASES}/no-such-apiserver",
        STORAGE_VERSIONS,
        f"{CLUSTER}/api",
        f"{CLUSTER}/api/v1",
        f"{CLUSTER}/api/v1/namespaces/kube-system",
        f"{group}/v1",
        f"{CLUSTER}/version",
    ]
    for path in refused:
        for method in ("HEAD", "POST", "PUT", "DELETE"):
            async with client.request(method, path) as response:
                assert response.status == 405, (method, path)
                if method != "HEAD":
                    status = await response.json()
                    assert (status["reason"], status["message"]) == (
                        "MethodNotAllowed",
                        METHOD_NOT_ALLOWED,
                    )
    for path in (f"{CLUSTER}/apis", group):
        async with client.get(path) as response:
            document = await response.json()
        for method in ("HEAD", "POST", "DELETE"):
            async with client.request(method, path) as response:
                assert response.status == 200, (method, path)
                if method != "HEAD":
                    assert await response.json() == document
    for path in (f"{group}/v9", f"{CLUSTER}/apis/no.such.group", f"{CLUSTER}/apis/x.io/v1/ys"):
        async with client.request("HEAD", path) as response:
            assert response.status == 404, path


async def test_a_path_upstream_registers_no_route_for_is_its_generic_404(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    """A namespaced kind without its namespace, a cluster-scoped one with one, a kind
    not served: kube-apiserver 1.37's words, details naming nothing."""
    client, views = served
    [name, *_] = lease_names(views)
    cluster_wide = LEASES.replace("/namespaces/kube-system", "")
    namespaced = STORAGE_VERSIONS.replace("/v1alpha1/", "/v1alpha1/namespaces/kube-system/")
    for path in (
        f"{cluster_wide}/{name}",
        namespaced,
        f"{namespaced}/any",
        f"{CLUSTER}/apis/coordination.k8s.io/v1/widgets",
    ):
        async with client.get(path) as response:
            status = await response.json()
        assert (response.status, status["message"], status["details"]) == (
            404,
            "the server could not find the requested resource",
            {},
        ), path
        for method in ("HEAD", "POST"):  # no route: a 404 whatever the method
            async with client.request(method, path) as response:
                assert response.status == 404, (method, path)


async def test_a_status_is_written_as_upstreams_encoder_writes_it(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    """Compact JSON, upstream's field order, a newline at the end."""
    client, _ = served
    async with client.get(f"{LEASES}/no-such-apiserver") as response:
        body = await response.read()
    assert body.endswith(b"}\n") and b", " not in body and b": " not in body
    assert list(json.loads(body)) == [
        "kind",
        "apiVersion",
        "metadata",
        "status",
        "message",
        "reason",
        "details",
        "code",
    ]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        # Upstream: a selector's syntax first (400), then the list options (422), then
        # a field it does not know (400).
        ("fieldSelector=foo%3Dbar&resourceVersionMatch=Exact", 422),
        ("fieldSelector=foo%3Dbar&resourceVersionMatch=Bogus&resourceVersion=1", 422),
        ("fieldSelector=foo%3Dbar&resourceVersionMatch=Exact&watch=1", 422),
        ("labelSelector=a%3D%3D%3Db&resourceVersionMatch=Exact", 400),
        ("fieldSelector=a%3D%3D%3Db&resourceVersionMatch=Exact", 400),
        ("fieldSelector=foo%3Dbar", 400),
        ("fieldSelector=foo%3Dbar&resourceVersion=abc", 400),
    ],
)
async def test_a_request_with_two_faults_is_answered_for_the_one_upstream_finds_first(
    served: tuple[TestClient[Any, Any], LedgerViews], query: str, code: int
) -> None:
    client, _ = served
    async with client.get(f"{LEASES}?{query}") as response:
        status = await response.json()
    assert (response.status, status["code"]) == (code, code)
    if code == 400 and "foo" in query:
        assert "is not a known field selector" in status["message"]


async def test_an_access_review_is_answered_as_created_now_and_in_the_past(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    review = {"spec": {"resourceAttributes": {"verb": "list", "resource": "leases"}}}
    cluster = LEASES.split("/apis/")[0]
    for prefix in (cluster, f"{cluster}/at/5"):
        async with client.post(prefix + path, json=review) as response:
            assert response.status == 201
            assert (await response.json())["status"]["allowed"] is True
    async with client.post(cluster + path, data=b"{", headers=JSON_BODY) as response:
        assert (response.status, (await response.json())["reason"]) == (400, "BadRequest")
    async with client.post("/clusters/nowhere" + path, json=review) as response:
        assert response.status == 404
    async with client.get(cluster + path) as response:  # only created, as upstream's
        assert (response.status, (await response.json())["reason"]) == (405, "MethodNotAllowed")


async def test_responses_are_not_cached_and_json_is_plain_application_json(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    for path in (LEASES, LEASES.split("/namespaces/")[0], f"{LEASES}/nothing-such"):
        async with client.get(path) as response:
            assert response.headers["Cache-Control"] == "no-cache, private", path
            assert response.headers["Content-Type"] == "application/json", path


async def test_a_continued_list_takes_no_resource_version(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    async with client.get(f"{LEASES}?limit=1") as response:
        token = (await response.json())["metadata"]["continue"]
    async with client.get(f"{LEASES}?limit=1&continue={token}&resourceVersion=100") as refused:
        status = await refused.json()
    assert (refused.status, status["message"]) == (
        400,
        "specifying resource version is not allowed when using continue",
    )
    # Upstream's handler validates the options before its storage refuses the version.
    matched = f"{LEASES}?continue={token}&resourceVersion=100&resourceVersionMatch=NotOlderThan"
    for query in (matched, f"{matched}&watch=1&sendInitialEvents=true"):
        async with client.get(query) as refused:
            status = await refused.json()
        assert (refused.status, status["reason"]) == (422, "Invalid"), status
        messages = [cause["message"] for cause in status["details"]["causes"]]
        assert messages == [
            "Forbidden: resourceVersionMatch is forbidden when continue is provided"
        ]


@pytest.mark.parametrize(
    "query",
    [
        "resourceVersion={}",
        "resourceVersion={}&resourceVersionMatch=Exact",
        "limit=1&resourceVersion={}",
    ],
)
async def test_a_resource_version_not_reached_is_a_timeout_to_retry(
    served: tuple[TestClient[Any, Any], LedgerViews], query: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not older than, and exact (upstream waits for the snapshot too), alike.
    monkeypatch.setattr(clusters, "FRESHNESS_WAIT_SECONDS", 0.3)
    client, views = served
    ahead = views.clusters["cluster-000"].offset + 1_000
    async with client.get(f"{STORAGE_VERSIONS}?{query.format(ahead)}") as response:
        status = await response.json()
    assert (response.status, response.headers["Retry-After"]) == (504, "1")
    assert status["message"].startswith("Timeout: Too large resource version: ")
    assert status["details"]["retryAfterSeconds"] == 1


async def test_a_watch_list_from_a_resource_version_not_reached_says_so_in_the_stream(
    served: tuple[TestClient[Any, Any], LedgerViews], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Upstream's watch cache: 200, then an ERROR event with the 504 Status.
    monkeypatch.setattr(clusters, "FRESHNESS_WAIT_SECONDS", 0.3)
    client, views = served
    ahead = views.clusters["cluster-000"].offset + 1_000
    query = f"sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion={ahead}"
    [error] = await watch(client, STORAGE_VERSIONS, query)
    assert error["type"] == "ERROR"
    assert (error["object"]["code"], error["object"]["reason"]) == (504, "Timeout")
    assert error["object"]["message"].startswith("Timeout: Too large resource version: ")


async def test_a_watch_too_old_names_the_oldest_resource_version_accepted(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    horizon = views.clusters["cluster-000"].horizon
    assert horizon > 0
    [expired] = await watch(client, LEASES, f"resourceVersion={horizon - 1}")
    assert expired["object"]["message"] == f"too old resource version: {horizon - 1} ({horizon})"
    accepted = await watch(client, LEASES, f"resourceVersion={horizon}")
    assert all(e["type"] != "ERROR" for e in accepted)


async def test_one_objects_table_carries_its_resource_version(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, _ = served
    table_type = "application/json;as=Table;v=v1;g=meta.k8s.io"
    async with client.get(STORAGE_VERSIONS) as response:
        listed = (await response.json())["items"]
    some = listed[0]["metadata"]
    async with client.get(
        f"{STORAGE_VERSIONS}/{some['name']}", headers={"Accept": table_type}
    ) as response:
        table = await response.json()
    assert table["kind"] == "Table"
    assert table["metadata"]["resourceVersion"] == some["resourceVersion"]


@pytest.mark.parametrize(
    ("include", "shown"),
    [
        ("", "PartialObjectMetadata"),
        ("&includeObject=Object", "Lease"),
        ("&includeObject=None", None),
    ],
)
async def test_a_table_watchs_bookmark_is_a_table_of_an_empty_object(
    served: tuple[TestClient[Any, Any], LedgerViews], include: str, shown: str | None
) -> None:
    """As kube-apiserver 1.37 converts it: one row, the printer's cells of an empty
    object (an age unknown), the bookmark (or its metadata) as the row's object."""
    client, views = served
    offset = views.clusters["cluster-000"].offset
    table_type = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    events = await watch(client, LEASES, f"allowWatchBookmarks=true{include}", headers=table_type)
    *added, end = events
    assert added and {e["type"] for e in added} == {"ADDED"}
    assert end["type"] == "BOOKMARK"
    bookmark = end["object"]
    assert (bookmark["kind"], bookmark["metadata"]) == ("Table", {"resourceVersion": str(offset)})
    assert bookmark["columnDefinitions"] is None  # sent with the first event only
    [row] = bookmark["rows"]
    assert row["cells"] == ["", "", "<unknown>", "", "<unknown>"]
    metadata = {"resourceVersion": str(offset), "annotations": {INITIAL_EVENTS_END: "true"}}
    if shown is None:
        assert row["object"] is None
    else:
        assert (row["object"]["kind"], row["object"]["metadata"]) == (shown, metadata)


async def test_a_custom_resources_table_bookmark_has_null_cells_but_its_name(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    """Upstream's converter for a custom resource writes null for a column the (empty)
    object lacks."""
    client, _ = served
    states = f"{CLUSTER}/apis/migration.k8s.io/v1alpha1/storagestates"
    table_type = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    events = await watch(client, states, "allowWatchBookmarks=true", headers=table_type)
    [row] = events[-1]["object"]["rows"]
    assert events[-1]["type"] == "BOOKMARK"
    assert row["cells"] == ["", None, None, None, None, None]  # Name, then Current ... Audited


@pytest.mark.parametrize("query", ["limit=2&resourceVersion=0", "limit=0", "limit=-1"])
async def test_a_list_at_resource_version_0_or_with_no_positive_limit_is_whole(
    served: tuple[TestClient[Any, Any], LedgerViews], query: str
) -> None:
    """As upstream's watch cache serves them; client-go's reflector lists with
    resourceVersion=0 and a limit first, and pages only if the answer is cut."""
    client, views = served
    total = len(views.clusters["cluster-000"].state.storage_versions)
    assert total > 2
    async with client.get(f"{STORAGE_VERSIONS}?{query}") as response:
        listed = await response.json()
    assert response.status == 200, listed
    assert len(listed["items"]) == total
    assert "continue" not in listed["metadata"]


async def test_a_page_counts_the_items_after_it_unless_a_selector_is_given(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    client, views = served
    total = len(views.clusters["cluster-000"].state.storage_versions)
    assert total > 2
    async with client.get(f"{STORAGE_VERSIONS}?limit=2") as response:
        first = (await response.json())["metadata"]
    assert first["remainingItemCount"] == total - 2
    async with client.get(f"{STORAGE_VERSIONS}?limit=2&continue={first['continue']}") as response:
        second = (await response.json())["metadata"]
    assert second.get("remainingItemCount", 0) == max(0, total - 4)
    selected = f"{STORAGE_VERSIONS}?limit=1&labelSelector=!svledger.io/absent"  # all of them
    async with client.get(selected) as response:
        page = await response.json()
    assert len(page["items"]) == 1 and page["metadata"]["continue"]
    assert "remainingItemCount" not in page["metadata"]


async def test_a_list_whose_field_selector_pins_one_key_is_never_paged(
    served: tuple[TestClient[Any, Any], LedgerViews],
) -> None:
    """Upstream's store reads the one key a ``metadata.name`` selector names (store.go's
    ``MatchesSingle``) when the key is whole: no ``continue`` for a page that the limit
    filled. Leases of every namespace have no whole key, and page as any list."""
    client, _ = served
    for path, equals in ((STORAGE_VERSIONS, "%3D"), (LEASES, "%3D%3D")):
        async with client.get(path) as response:
            name = (await response.json())["items"][0]["metadata"]["name"]
        async with client.get(
            f"{path}?limit=1&fieldSelector=metadata.name{equals}{name}"
        ) as response:
            page = await response.json()
        assert [item["metadata"]["name"] for item in page["items"]] == [name]
        assert "continue" not in page["metadata"]
    everywhere = LEASES.replace("/namespaces/kube-system", "")
    assert everywhere != LEASES
    async with client.get(everywhere) as response:
        lease = (await response.json())["items"][0]["metadata"]["name"]
    async with client.get(
        f"{everywhere}?limit=1&fieldSelector=metadata.name%3D{lease}"
    ) as response:
        assert (await response.json())["metadata"]["continue"]
    # A field selector that pins the namespace too makes the key whole again.
    pinned = f"metadata.name%3D{lease},metadata.namespace%3Dkube-system"
    async with client.get(f"{everywhere}?limit=1&fieldSelector={pinned}") as response:
        assert "continue" not in (await response.json())["metadata"]


@pytest.mark.parametrize("text", ["2024-01-01", "2024-01-01T10:00:00", "2024-01-01 10:00"])
def test_a_point_without_a_zone_is_refused_naming_a_form_that_is_taken(text: str) -> None:
    with pytest.raises(ApiError) as refused:
        clusters.parse_point(text)
    assert refused.value.code == 400
    suggested = re.search(r"e\.g\. (\S+) for UTC", str(refused.value))
    assert suggested is not None, refused.value
    taken = datetime.fromisoformat(text).replace(tzinfo=UTC)
    assert clusters.parse_point(suggested.group(1)) == taken
