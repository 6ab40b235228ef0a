"""``svledger serve`` read by kubectl and the kubernetes client, over a real scenario's log.

The KEP walkthrough is simulated once onto a topic of the real broker; ``svledger
serve`` runs as a process over it, and is read with the kubectl these machines ship
and the one built from the Go module proxy beside the real apiservers, with client-go's
metadata client and informer (built likewise), and with the ``kubernetes`` Python
client's typed API. What they show is compared with the fold of the same log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import pytest
from kubernetes import client as kube_client

from deploy.kafka.broker import free_port
from deploy.kube import build
from ledger.events import ApiserverHeartbeat, Meta, Position, StorageVersionReported
from ledger.kafka import EndOffsets, EventProducer, create_topics
from ledger.settings import KafkaSettings
from projections.database import engine
from projections.fold import fold
from projections.replay import cluster_log, replay
from projections.state import State
from projections.store import load_state
from readapi import WATCH_WINDOW
from readapi.ledger import LedgerViews
from simulation.run import simulate

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "examples" / "kep-walkthrough.yaml"
CLUSTER = "kep-walkthrough"
KUBECTL_RELEASE = "v1.37.2"


@pytest.fixture(scope="module")
def walkthrough(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> KafkaSettings:
    """A topic holding the walkthrough's whole log."""
    topic = f"svledger-test.serve.{os.getpid()}.{time.monotonic_ns()}"
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=topic, partitions=1)
    db = tmp_path_factory.mktemp("serve") / "walkthrough.db"
    asyncio.run(simulate(WALKTHROUGH, settings, f"sqlite:///{db}", out=None))
    return settings


@pytest.fixture(scope="module")
def log_fold(walkthrough: KafkaSettings) -> tuple[State, list[tuple[object, Position]]]:
    state, records = asyncio.run(cluster_log(walkthrough, CLUSTER))
    return state, [(record.event, record.position) for record in records]


class Server:
    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.process = process
        self.log: list[dict[str, Any]] = []  # its JSON log lines, once it has exited

    @property
    def cluster(self) -> str:
        return f"{self.url}/clusters/{CLUSTER}"


@contextlib.contextmanager
def running_server(settings: KafkaSettings, *extra: str, scheme: str = "http") -> Iterator[Server]:
    port = free_port()
    command = [
        sys.executable, "-m", "svledger", "serve",
        "--bootstrap", settings.bootstrap_servers,
        "--topic", settings.topic,
        "--address", f"127.0.0.1:{port}",
        *extra,
    ]  # fmt: skip
    # Its log goes to a file: a pipe nobody reads while the tests run would block the
    # server once its buffer is full.
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT)
        server = Server(f"{scheme}://127.0.0.1:{port}", process)
        try:
            wait_ready(server)
            yield server
        finally:
            process.terminate()
            process.wait(timeout=30)
            log.seek(0)
            stderr = log.read().decode()
            assert process.returncode == 0, stderr[-2000:]
            server.log = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_serve_says_when_it_has_caught_up_with_the_log(walkthrough: KafkaSettings) -> None:
    with running_server(walkthrough) as server:
        pass
    end = asyncio.run(end_offsets(walkthrough))[0]
    said = [line for line in server.log if "caught up with the log" in line["message"]]
    assert [line["records"] for line in said] == [end]  # once, every record up to the end
    assert re.fullmatch(
        rf"serve: caught up with the log: {end} records read in \d+\.\d s", said[0]["message"]
    )


async def end_offsets(settings: KafkaSettings) -> dict[int, int]:
    async with EndOffsets(settings) as ends:
        return await ends()


def wait_ready(server: Server) -> None:
    context = ssl._create_unverified_context()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.process.poll() is None, "svledger serve exited early"
        try:
            with urllib.request.urlopen(f"{server.url}/readyz", timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.2)
    raise AssertionError("svledger serve did not become ready in 60 s")


@pytest.fixture(scope="module")
def server(walkthrough: KafkaSettings) -> Iterator[Server]:
    with running_server(walkthrough) as running:
        yield running


def kubectls() -> list[pytest.param]:
    return [
        pytest.param("kubectl", id="kubectl-shipped"),
        pytest.param(
            KUBECTL_RELEASE, id=f"kubectl-{KUBECTL_RELEASE}", marks=pytest.mark.kubernetes
        ),
    ]


@pytest.fixture(params=kubectls())
def kubectl(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    # "kubectl" is the machine's; a release version means that release's, built if needed.
    binary = "kubectl" if request.param == "kubectl" else str(build.kubectl(request.param))
    empty = tmp_path / "kubeconfig"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    return [binary, "--kubeconfig", str(empty), "--cache-dir", str(tmp_path / "cache")]


def run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def table(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


# --------------------------------------------------------------------------- kubectl


def test_kubectl_get_prints_the_views_columns(
    server: Server, kubectl: list[str], log_fold: tuple[State, list[object]]
) -> None:
    state, _ = log_fold
    (storage_version,) = state.storage_versions.values()
    # Upstream's columns for its own kinds (pkg/printers/internalversion), the ledger's
    # after them with -o wide.
    header, *rows = table(
        run([*kubectl, "--server", server.cluster, "get", "storageversions", "-o", "wide"])
    )
    assert header == [
        "NAME", "COMMONENCODINGVERSION", "STORAGEVERSIONS", "AGE", "AGREED", "SERVERS",
    ]  # fmt: skip
    assert len(storage_version.entries) <= 3  # so all are shown
    assert rows == [
        [
            "apps.deployments",
            storage_version.common_encoding_version or "<unset>",
            ",".join(f"{e.apiserver_id}={e.encoding_version}" for e in storage_version.entries),
            rows[0][3],
            storage_version.condition.status,
            str(len(storage_version.entries)),
        ]
    ]

    leases = table(
        run([*kubectl, "--server", server.cluster, "get", "leases", "-n", "kube-system"])
    )
    assert leases[0] == ["NAME", "HOLDER", "AGE"]
    assert sorted(row[0] for row in leases[1:]) == sorted(k[1] for k in state.leases)
    assert {row[0]: row[1] for row in leases[1:]} == {
        apiserver_id: lease.holder_identity for (_, apiserver_id), lease in state.leases.items()
    }

    header, *states = table(run([*kubectl, "--server", server.cluster, "get", "storagestates"]))
    (storage_state,) = state.storage_states.values()
    assert header == ["NAME", "CURRENT", "PERSISTED", "AGE"]
    # a hash is shown with the version it stands for
    current = storage_state.current_storage_version_hash
    assert states[0][:3] == ["deployments.apps", current, "(apps/v2)"]

    header, *migrations = table(
        run([*kubectl, "--server", server.cluster, "get", "storageversionmigrations"])
    )
    assert header == ["NAME", "RESOURCE", "VERSION", "PHASE", "MIGRATED", "AGE"]
    phases = {m.migration_id: (m.phase, str(m.objects_migrated)) for m in state.migrations.values()}
    assert {row[0]: (row[3], row[4]) for row in migrations} == phases


def test_kubectl_get_yaml_is_upstreams_shape(
    server: Server, kubectl: list[str], log_fold: tuple[State, list[object]]
) -> None:
    state, _ = log_fold
    (storage_version,) = state.storage_versions.values()
    out = run(
        [
            *kubectl,
            "--server",
            server.cluster,
            "get",
            "storageversion",
            "apps.deployments",
            "-o",
            "json",
        ]
    )
    obj = json.loads(out)
    assert obj["apiVersion"] == "internal.apiserver.k8s.io/v1alpha1"
    assert obj["kind"] == "StorageVersion"
    assert obj["metadata"]["resourceVersion"] == str(
        Position.parse(storage_version.revision).offset
    )
    status = obj["status"]
    assert status["commonEncodingVersion"] == storage_version.common_encoding_version
    assert [s["apiServerID"] for s in status["storageVersions"]] == [
        e.apiserver_id for e in storage_version.entries
    ]
    assert status["storageVersions"][0]["decodableVersions"] == list(
        storage_version.entries[0].decodable_versions
    )
    (condition,) = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "AllEncodingVersionsEqual",
        storage_version.condition.status,
        storage_version.condition.reason,
    )
    yaml_out = run([*kubectl, "--server", server.cluster, "get", "storageversions", "-o", "yaml"])
    assert "commonEncodingVersion: apps/v2" in yaml_out


def test_kubectl_explain_describes_each_kind_and_its_fields(
    server: Server, kubectl: list[str]
) -> None:
    explained = run([*kubectl, "--server", server.cluster, "explain", "storageversions"])
    assert explained.splitlines()[:3] == [
        "GROUP:      internal.apiserver.k8s.io",
        "KIND:       StorageVersion",
        "VERSION:    v1alpha1",
    ]
    assert re.search(r"^  status\t<StorageVersionStatus>", explained, re.MULTILINE)
    entries = run(
        [*kubectl, "--server", server.cluster, "explain", "storageversions.status.storageVersions"]
    )
    assert "FIELD: storageVersions <[]ServerStorageVersion>" in entries
    # Required as upstream's document marks it (kube-apiserver 1.37's explain says so too).
    assert re.search(r"^  encodingVersion\t<string> -required-$", entries, re.MULTILINE)
    assert re.search(r"^  servedVersions\t<\[\]string>$", entries, re.MULTILINE)
    # Every kind, also in a past view, and a field path through a named type.
    for resource, kind in (
        ("leases.spec", "Lease"),
        ("storagestates.status.persistedStorageVersionHashes", "StorageState"),
        ("storageversionmigrations.spec.resource", "StorageVersionMigration"),
    ):
        out = run([*kubectl, "--server", f"{server.cluster}/at/5", "explain", resource])
        assert f"KIND:       {kind}" in out
    recursive = run([*kubectl, "--server", server.cluster, "explain", "leases", "--recursive"])
    assert re.search(r"^    holderIdentity\t<string>$", recursive, re.MULTILINE)
    missing = subprocess.run(
        [*kubectl, "--server", server.cluster, "explain", "storageversions.status.nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0
    assert 'field "nope" does not exist' in missing.stderr


def test_kubectl_auth_can_i_may_read_everything_and_change_nothing(
    server: Server, kubectl: list[str]
) -> None:
    # kubectl posts its reviews in protobuf (readapi.protobuf) and prints the answer.
    def can_i(*asked: str) -> subprocess.CompletedProcess[str]:
        command = [*kubectl, "--server", server.cluster, "auth", "can-i", *asked]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    for asked in (
        ("list", "storageversions"),
        ("watch", "leases", "-n", "kube-system"),
        ("get", "storagestates", "--all-namespaces"),
        ("get", "/openapi/v3"),
    ):
        answer = can_i(*asked)
        assert (answer.returncode, answer.stdout) == (0, "yes\n"), (asked, answer.stderr)
    refused = can_i("delete", "leases", "-n", "kube-system")
    assert refused.returncode == 1
    assert refused.stdout.startswith("no - the ledger's read API only reads")
    listed = run([*kubectl, "--server", f"{server.cluster}/at/5", "auth", "can-i", "--list"])
    assert table(listed)[1:] == [
        ["*.*", "[]", "[]", "[get", "list", "watch]"],
        ["[*]", "[]", "[get]"],
    ]


def test_kubectl_watch_sees_an_event_appended_to_kafka(
    server: Server, kubectl: list[str], walkthrough: KafkaSettings
) -> None:
    hostname = f"watched-{time.monotonic_ns()}"
    watch = subprocess.Popen(
        [*kubectl, "--server", server.cluster, "get", "leases", "-n", "kube-system", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert watch.stdout is not None
        printed = Lines(watch.stdout)
        lines = printed.until(lambda line: line.startswith("NAME"), 30)
        assert lines, "kubectl printed no header"
        time.sleep(1)  # the watch is open after the list is printed
        appended = datetime.now(UTC)
        asyncio.run(append_heartbeat(walkthrough, hostname, appended))
        seen = printed.until(lambda line: hostname in line, 60)
        assert seen and hostname in seen[-1], what_it_said(watch, printed)
    finally:
        watch.kill()
        watch.wait()


@pytest.mark.kubernetes
def test_client_gos_metadata_informer_lists_and_watches(
    server: Server, walkthrough: KafkaSettings, log_fold: tuple[State, list[object]]
) -> None:
    # The metadata client and informer of client-go (the release's, built from the Go
    # module proxy) ask for PartialObjectMetadata and PartialObjectMetadataList.
    state, _ = log_fold
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    with urllib.request.urlopen(server.cluster + path, timeout=10) as response:
        # As served now: other tests of this module may have appended leases.
        leases = {item["metadata"]["name"] for item in json.load(response)["items"]}
    assert {apiserver_id for _, apiserver_id in state.leases} <= leases
    hostname = f"informed-{time.monotonic_ns()}"
    informer = subprocess.Popen(
        [
            str(build.metadata_client(KUBECTL_RELEASE)),
            server.cluster,
            "coordination.k8s.io",
            "v1",
            "leases",
            "kube-system",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert informer.stdout is not None
        printed = Lines(informer.stdout)
        lines = printed.until(lambda line: "SYNCED" in line, 60)
        assert lines, informer.stderr.read1().decode() if informer.poll() is not None else ""
        listed, got, *events = [json.loads(line) for line in lines]
        assert {o["name"] for o in listed["list"]} == set(leases)
        assert {(o["kind"], o["apiVersion"]) for o in listed["list"]} == {
            ("PartialObjectMetadata", "meta.k8s.io/v1")
        }
        assert got["get"]["name"] == listed["list"][0]["name"]
        assert {e["name"] for e in events if e["type"] == "ADDED"} == set(leases)
        asyncio.run(append_heartbeat(walkthrough, hostname, datetime.now(UTC)))
        seen = printed.until(lambda line: hostname in line, 60)
        assert seen, "the informer's watch did not see the lease appended to Kafka"
        assert json.loads(seen[-1])["type"] == "ADDED"
    finally:
        assert informer.stdin is not None
        informer.stdin.close()
        informer.wait(timeout=30)
    assert informer.returncode == 0, informer.stderr.read().decode()[-2000:]  # type: ignore[union-attr]


def what_it_said(process: subprocess.Popen[bytes], printed: Lines) -> str:
    """What a process still running printed on stdout and stderr, once killed."""
    process.kill()
    assert process.stderr is not None
    err = process.stderr.read().decode()
    return f"stdout: {printed.everything()[-2000:]!r}; stderr: {err[-2000:]!r}"


class Lines:
    """A child's output line by line, as it comes, read by a thread of its own.

    Waiting on the pipe itself (a select) and then reading it through a buffered
    reader loses lines: one read may take several lines off the pipe, and those after
    the first wait in the reader's buffer, where no select sees them, until the next
    line arrives, if one ever does.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()  # None: the end
        self._said: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._lines.put(line.decode())
        self._lines.put(None)

    def until(self, done: Callable[[str], bool], seconds: float) -> list[str]:
        """The lines up to and including the first that is ``done``, if it comes within
        ``seconds``; else none."""
        lines: list[str] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self._said.append(line)
            lines.append(line)
            if done(line):
                return lines
        return []

    def everything(self) -> str:
        """All it printed, once the process has ended."""
        self._reader.join(timeout=10)
        while not self._lines.empty():
            line = self._lines.get()
            if line is not None:
                self._said.append(line)
        return "".join(self._said)


async def append_heartbeat(settings: KafkaSettings, hostname: str, at: datetime) -> Position:
    event = ApiserverHeartbeat(
        meta=Meta.new(CLUSTER, "test", at),
        apiserver_id=f"apiserver-{hostname}",
        holder_identity=f"apiserver-{hostname}_1",
        hostname=hostname,
        lease_duration_seconds=3600,
        renew_time=at,
    )
    async with EventProducer(settings) as producer:
        return await producer.send(event)


# --------------------------------------------------------------------------- python client


def api_client(url: str, token: str | None = None) -> kube_client.ApiClient:
    configuration = kube_client.Configuration()
    configuration.host = url
    configuration.verify_ssl = False
    if token:
        configuration.api_key = {"authorization": f"Bearer {token}"}
    return kube_client.ApiClient(configuration)


def test_the_kubernetes_client_reads_typed_objects_now_and_in_the_past(
    server: Server,
    walkthrough: KafkaSettings,
    log_fold: tuple[State, list[tuple[object, Position]]],
) -> None:
    _, records = log_fold
    # The log as it is now: other tests append heartbeats (new members) to the cluster.
    state, _ = asyncio.run(cluster_log(walkthrough, CLUSTER))
    api = kube_client.InternalApiserverV1alpha1Api(api_client(server.cluster))
    listed = api.list_storage_version()
    (item,) = listed.items
    assert isinstance(item, kube_client.V1alpha1StorageVersion)
    (storage_version,) = state.storage_versions.values()
    assert item.status.common_encoding_version == storage_version.common_encoding_version
    assert [s.api_server_id for s in item.status.storage_versions] == [
        e.apiserver_id for e in storage_version.entries
    ]
    leases = kube_client.CoordinationV1Api(api_client(server.cluster)).list_namespaced_lease(
        "kube-system"
    )
    assert {lease.metadata.name for lease in leases.items} >= {k[1] for k in state.leases}
    lease = leases.items[0]
    assert lease.metadata.labels["apiserver.kubernetes.io/identity"] == "kube-apiserver"
    assert lease.spec.holder_identity.startswith(lease.metadata.name)

    # The first disagreement of the walkthrough, read through /at/OFFSET and /at/TIME.
    past_state = State()
    point = None
    for event, position in records:
        fold([(event, position)], past_state)  # type: ignore[list-item]
        (row,) = past_state.storage_versions.values() or (None,)
        if row is not None and row.condition.status == "False":
            point = (position, event.meta.occurred_at)  # type: ignore[attr-defined]
            break
    assert point is not None
    position, occurred_at = point
    for at in (str(position.offset), occurred_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")):
        past = kube_client.InternalApiserverV1alpha1Api(
            api_client(f"{server.cluster}/at/{at}")
        ).list_storage_version()
        (then,) = past.items
        assert then.status.common_encoding_version is None, at
        assert then.status.conditions[0].status == "False"
        assert int(past.metadata.resource_version) <= position.offset


# --------------------------------------------------------------------------- protocol


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(
            request, timeout=10, context=ssl._create_unverified_context()
        ) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_errors_are_kubernetes_statuses(server: Server) -> None:
    code, body = get(f"{server.cluster}/apis/nothing.example.com/v1/things")
    assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound")
    code, body = get(f"{server.url}/clusters/no-such-cluster/apis")
    assert code == 404 and "no-such-cluster" in str(body["message"])
    code, body = get(f"{server.cluster}/apis/internal.apiserver.k8s.io/v1alpha1/storageversions/x")
    assert (code, body["details"]) == (
        404,
        {"name": "x", "group": "internal.apiserver.k8s.io", "kind": "storageversions"},
    )
    request = urllib.request.Request(
        f"{server.cluster}/apis/migration.k8s.io/v1alpha1/storagestates", method="DELETE"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 405
    assert json.loads(refused.value.read())["reason"] == "MethodNotAllowed"
    code, body = get(
        f"{server.cluster}/apis/migration.k8s.io/v1alpha1/storagestates?labelSelector=a%20in%20("
    )
    assert (code, body["reason"]) == (400, "BadRequest")


def test_the_timeline_page_is_served(server: Server) -> None:
    with urllib.request.urlopen(f"{server.cluster}/timeline/deployments.apps", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/html")
        page = r.read().decode()
    assert page.count('class="apiserver-row"') == 3
    assert 'class="migration-bar"' in page
    code, body = get(f"{server.cluster}/timeline/nothing.example.com")
    assert (code, body["reason"]) == (404, "NotFound")


def test_lists_page_with_limit_and_continue_on_one_snapshot(server: Server) -> None:
    base = f"{server.cluster}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    _, whole = get(base)
    names: list[str] = []
    url = f"{base}?limit=2"
    while True:
        _, page = get(url)
        names += [item["metadata"]["name"] for item in page["items"]]  # type: ignore[attr-defined]
        token = page["metadata"].get("continue")  # type: ignore[attr-defined]
        if not token:
            break
        url = f"{base}?limit=2&continue={token}"
    assert names == [item["metadata"]["name"] for item in whole["items"]]  # type: ignore[attr-defined]
    assert len(names) > 2


def test_a_watch_from_an_offset_older_than_the_window_gets_410_expired(
    walkthrough: KafkaSettings,
) -> None:
    with running_server(walkthrough, "--watch-window", "5") as small:
        url = (
            f"{small.cluster}/apis/internal.apiserver.k8s.io/v1alpha1/storageversions"
            "?watch=true&resourceVersion=1&timeoutSeconds=2"
        )
        with urllib.request.urlopen(url, timeout=10) as response:
            (event,) = [json.loads(line) for line in response]
        assert event["type"] == "ERROR"
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_a_token_file_and_tls_guard_the_api(
    walkthrough: KafkaSettings, tmp_path: Path, kubectl: list[str]
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text('# readers\ns3cret-reader\nt0k3n,alice,42,"ops"\n')
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    with running_server(
        walkthrough,
        "--token-file", str(tokens),
        "--tls-cert-file", str(cert),
        "--tls-private-key-file", str(key),
        scheme="https",
    ) as secured:  # fmt: skip
        code, body = get(f"{secured.cluster}/apis")
        assert (code, body["reason"]) == (401, "Unauthorized")
        out = run(
            [
                *kubectl, "--server", secured.cluster, "--certificate-authority", str(cert),
                "--token", "s3cret-reader", "get", "storageversions", "-o", "name",
            ]
        )  # fmt: skip
        assert out.strip() == "storageversion.internal.apiserver.k8s.io/apps.deployments"
        allowed = run(
            [
                *kubectl, "--server", secured.cluster, "--certificate-authority", str(cert),
                "--token", "s3cret-reader", "auth", "can-i", "get", "storageversions",
            ]
        )  # fmt: skip
        assert allowed == "yes\n"
        whoami = run(
            [
                *kubectl, "--server", secured.cluster, "--certificate-authority", str(cert),
                "--token", "t0k3n", "auth", "whoami",
            ]
        )  # fmt: skip
        assert table(whoami) == [
            ["ATTRIBUTE", "VALUE"],
            ["Username", "alice"],
            ["UID", "42"],
            ["Groups", "[ops", "system:authenticated]"],
        ]
        refused = subprocess.run(
            [
                *kubectl, "--server", secured.cluster, "--certificate-authority", str(cert),
                "--token", "wrong", "get", "storageversions",
            ],
            capture_output=True,
            text=True,
        )  # fmt: skip
        assert refused.returncode != 0 and "Unauthorized" in refused.stderr
        unknown = subprocess.run(
            [
                *kubectl, "--server", secured.cluster, "--certificate-authority", str(cert),
                "--token", "wrong", "auth", "can-i", "get", "/healthz",
            ],
            capture_output=True,
            text=True,
        )  # fmt: skip
        assert unknown.returncode != 0 and "Unauthorized" in unknown.stderr


# --------------------------------------------------------------------------- the past


@pytest.mark.parametrize("watch_window", [WATCH_WINDOW, 5], ids=["one-by-one", "thinned"])
async def test_a_past_view_equals_the_fold_of_the_log_up_to_it(
    walkthrough: KafkaSettings,
    log_fold: tuple[State, list[tuple[object, Position]]],
    watch_window: int,
) -> None:
    """Whether the log found at start-up is folded one by one, or (but for the last
    ``watch_window`` records) with plain renewals thinned."""
    _, records = log_fold
    # Checkpoints every 7 records, the newest 2 kept at that spacing: older points start
    # from the sparser ones the server keeps on a long log.
    assert len(records) > 7 * 8, "too short a log to thin the checkpoints"
    assert len(records) < WATCH_WINDOW, "the default window keeps the walkthrough whole"
    views = LedgerViews(
        walkthrough,
        checkpoint_every=7,
        recent_checkpoints=2,
        cached_views=4,
        watch_window=watch_window,
    )
    stop = asyncio.Event()
    follower = asyncio.create_task(views.follow(stop))
    try:
        await asyncio.wait_for(views.ready.wait(), 60)
        live = views.fold(CLUSTER)
        step = max(1, len(records) // 25)
        for index in range(0, len(records), step):
            event, position = records[index]
            expected = fold(records[: index + 1])  # type: ignore[arg-type]
            past = await views.view_at(CLUSTER, position.offset)
            assert _content(past.state) == _content(expected), position
            at_time = event.meta.occurred_at  # type: ignore[attr-defined]
            later = [e for e, _ in records[index + 1 :] if e.meta.occurred_at <= at_time]  # type: ignore[attr-defined]
            if not later:  # the time names exactly this prefix
                by_time = await views.view_at(CLUSTER, at_time)
                assert _content(by_time.state) == _content(expected), at_time
        now, _ = await cluster_log(walkthrough, CLUSTER)
        assert _content(live.state) == _content(now)
        before = await views.view_at(CLUSTER, records[0][0].meta.occurred_at - timedelta(days=1))  # type: ignore[attr-defined]
        assert _content(before.state) == _content(State())
    finally:
        stop.set()
        await follower


async def test_a_past_time_is_cut_as_replay_cuts_it_and_an_open_cut_is_built_again(
    kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    """Two clusters in one partition, and an event of one appended after an event of the
    other that occurred after the time: ``/at/TIME`` leaves it out, as ``replay --until``
    does. A time no event is after yet is answered anew once the log grows."""
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    await create_topics(settings)
    start = datetime(2024, 1, 1, 10, 0, tzinfo=UTC)

    def at(minutes: int) -> datetime:
        return start + timedelta(minutes=minutes)

    def heartbeat(cluster: str, minutes: int) -> ApiserverHeartbeat:
        meta = Meta.new(cluster, "apiserver-a", at(minutes))
        return ApiserverHeartbeat(meta, "apiserver-a", "apiserver-a_1", "a", 3600, at(minutes))

    def report(version: str, minutes: int) -> StorageVersionReported:
        meta = Meta.new("east", "apiserver-a", at(minutes))
        both = ("apps/v1", "apps/v2")
        return StorageVersionReported(
            meta, "apiserver-a", "apps", "deployments", "Deployment", version, both, both
        )

    log = [heartbeat("east", 0), report("apps/v1", 1), heartbeat("west", 10), report("apps/v2", 5)]
    async with EventProducer(settings) as producer:
        await producer.send_many(log)
    east = [(e, Position(0, i)) for i, e in enumerate(log) if e.meta.cluster == "east"]
    views = LedgerViews(settings)
    stop = asyncio.Event()
    follower = asyncio.create_task(views.follow(stop))
    try:
        await asyncio.wait_for(views.ready.wait(), 60)
        cut = await views.view_at("east", at(7))
        assert _content(cut.state) == _content(fold(east[:2]))  # not the report at 0:3
        replayed = f"sqlite:///{tmp_path}/at-7.db"
        await replay(settings, replayed, until=at(7), cluster="east")
        with engine(replayed).connect() as connection:
            assert _content(load_state(connection)) == _content(cut.state)

        open_cut = await views.view_at("east", at(30))
        assert _content(open_cut.state) == _content(fold(east))
        later = report("apps/v1", 20)
        async with EventProducer(settings) as producer:
            await producer.send_many([later])
        await asyncio.wait_for(_folded(views, "east", 4), 60)
        again = await views.view_at("east", at(30))
        assert _content(again.state) == _content(fold([*east, (later, Position(0, 4))]))
    finally:
        stop.set()
        await follower


async def _folded(views: LedgerViews, cluster: str, offset: int) -> None:
    while views.fold(cluster).offset < offset:
        await views.changed(1.0)


def _content(state: State) -> tuple[object, ...]:
    return (state.leases, state.storage_versions, state.storage_states, state.migrations)


def test_an_address_in_use_is_a_usage_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "svledger", "serve", "--address", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
