"""``svledger audit`` on bad input: a failed audit appends nothing, bad data is counted.

Real etcd processes (:func:`deploy.kube.etcd.local_etcd`), one serving plain HTTP and one
mutual TLS with certificates made here by openssl, each shared by the module; the
suite's broker, a topic per test whose ledger knows core configmaps (one apiserver's
heartbeat and report); and the audit as ``svledger audit`` runs it (:func:`open_store`,
then :func:`run_audit`, appending).

* etcd that cannot be read (a closed port; TLS refused either way, a CA file wrong or
  missing; an https URL with no CA) is an :class:`EtcdError` naming the server and what
  to check, and the log holds no ``StorageAudited``; so does a revision compacted while
  the audit reads, with advice to audit again.
* Values that are not what kube-apiserver writes do not stop the audit: a key under no
  resource is counted as unplaced, a truncated value as undecodable under its key, the
  others are counted, and every resource's ``StorageAudited`` is appended once.
* ``svledger audit`` itself, run as a process with ``--resource``, ``--page-size`` and
  ``--dry-run``: it prints that resource alone, its objects per version and the revision
  read, and appends nothing; a page size of 0 is refused (exit 2) naming the value.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from deploy.kube.cluster import free_port
from deploy.kube.etcd import gateway, local_etcd, put_all
from kube.auditor import AuditOptions, Result, Store, run_audit
from kube.etcd import EtcdError, EtcdSettings, open_store
from ledger.events import ApiserverHeartbeat, Meta, StorageAudited, StorageVersionReported
from ledger.kafka import EventProducer, create_topics
from ledger.settings import KafkaSettings
from projections.replay import cluster_log

pytestmark = pytest.mark.kubernetes  # etcd is the local cluster's build (deploy/kube)

CLUSTER = "audited"
APISERVER = "apiserver-a"
CAPTURED = json.loads(
    (Path(__file__).parent.parent / "unit/data/etcd/stored_values.json").read_text()
)
# A ConfigMap as kube-apiserver v1.37.2 stored it, in protobuf.
CONFIGMAP = base64.b64decode(
    next(e["value"] for e in CAPTURED if e["key"] == "/registry/configmaps/default/cm")
)
CONFIGMAPS = [(f"/registry/configmaps/default/cm-{i}", CONFIGMAP) for i in range(5)]


@dataclass(frozen=True)
class Pki:
    """Files in ``directory``: ``ca.crt`` signed ``etcd.crt`` (127.0.0.1, server and client)
    and ``client.crt``; ``other-ca.crt``, another CA, signed ``other-client.crt``."""

    directory: Path

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        _openssl(directory, "req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "2", "-subj", f"/CN=svledger-test-{ca}")  # fmt: skip
    for name, ca, usage in (
        ("etcd", "ca", "serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1"),
        ("client", "ca", "clientAuth"),
        ("other-client", "other-ca", "clientAuth"),
    ):
        (directory / f"{name}.ext").write_text(f"extendedKeyUsage={usage}\n")
        _openssl(directory, "req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=svledger-test-{name}")  # fmt: skip
        _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt",
                 "-CAkey", f"{ca}.key", "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 "-extfile", f"{name}.ext")  # fmt: skip
    return Pki(directory)


@pytest.fixture(scope="module")
def plain_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_etcd(tmp_path_factory.mktemp("etcd")) as url:
        yield url


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    tls = (Path(pki["ca.crt"]), Path(pki["etcd.crt"]), Path(pki["etcd.key"]))
    with local_etcd(tmp_path_factory.mktemp("etcd-tls"), tls=tls) as url:
        yield url


@pytest.fixture
def etcd(plain_etcd: str) -> str:
    """The plain etcd, emptied."""
    everything = base64.b64encode(b"\0").decode()
    gateway(plain_etcd, "kv/deleterange", {"key": everything, "range_end": everything})
    return plain_etcd


def heartbeat() -> ApiserverHeartbeat:
    now = datetime.now(UTC)
    meta = Meta.new(CLUSTER, APISERVER, now)
    return ApiserverHeartbeat(meta, APISERVER, f"{APISERVER}_1", "a", 3600, now, "1.37")


@pytest.fixture
async def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    """A ledger in which one apiserver of the cluster reported storing configmaps."""
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    await create_topics(settings)
    meta = Meta.new(CLUSTER, APISERVER, datetime.now(UTC))
    versions = ("v1",)
    report = StorageVersionReported(
        meta, APISERVER, "", "configmaps", "ConfigMap", "v1", versions, versions
    )
    async with EventProducer(settings) as producer:
        await producer.send_many([heartbeat(), report])
    return settings


async def audit(
    settings: KafkaSettings,
    etcd: EtcdSettings,
    wrapped: Callable[[Store], Store] = lambda store: store,
) -> Result:
    """The audit as ``svledger audit`` runs it, of the store it opens ``wrapped``."""
    options = AuditOptions(CLUSTER, page_size=10, pages_per_second=1000.0)
    async with open_store(etcd) as store:
        return await run_audit(settings, wrapped(store), options, append=True)


async def audited(settings: KafkaSettings) -> list[StorageAudited]:
    """The StorageAudited events in the cluster's log once a heartbeat appended now is read.

    A committed transaction's records are read (``read_committed``) only once the broker
    has written its commit marker, which it does after the commit returns; a record
    appended later to the same partition is read only after every transaction before it
    is decided. So an audit that appended is seen, and one that did not cannot be later.
    """
    fence = heartbeat()
    async with EventProducer(settings) as producer:
        await producer.send(fence)
    async with asyncio.timeout(60):
        while True:
            _, records = await cluster_log(settings, CLUSTER)
            if any(r.event.meta.event_id == fence.meta.event_id for r in records):
                return [r.event for r in records if isinstance(r.event, StorageAudited)]
            await asyncio.sleep(0.1)


async def test_an_etcd_that_does_not_answer_is_named_and_nothing_is_appended(
    settings: KafkaSettings,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EtcdError) as raised:
        await audit(settings, EtcdSettings((closed,), timeout=5))
    assert f"cannot reach etcd at {closed}" in str(raised.value)
    assert "check --etcd-servers" in str(raised.value)
    assert await audited(settings) == []


async def test_an_etcd_serving_mutual_tls_is_audited_with_the_right_files(
    settings: KafkaSettings, tls_etcd: str, pki: Pki
) -> None:
    files = EtcdSettings((tls_etcd,), pki["ca.crt"], pki["client.crt"], pki["client.key"])
    result = await audit(settings, files)
    assert [(e.resource, e.objects) for e in result.events] == [("configmaps", 0)]
    assert await audited(settings) == list(result.events)


TLS_REFUSED: dict[str, tuple[tuple[str | None, str | None, str | None], list[str]]] = {
    # --etcd-cafile, --etcd-certfile and --etcd-keyfile, and what the error must say.
    "no client certificate": (
        ("ca.crt", None, None),
        ["etcd at {url} did not accept a client without a certificate", "--etcd-certfile"],
    ),
    "a client certificate of another CA": (
        ("ca.crt", "other-client.crt", "other-client.key"),
        ["etcd at {url} did not accept the client certificate {pki}/other-client.crt"],
    ),
    "a CA that did not sign etcd's certificate": (
        ("other-ca.crt", "client.crt", "client.key"),
        [
            "etcd at {url} has a certificate that --etcd-cafile {pki}/other-ca.crt does not verify",
            "CERTIFICATE_VERIFY_FAILED",
        ],
    ),
    "a CA file that does not exist": (
        ("missing-ca.crt", "client.crt", "client.key"),
        ["etcd at {url}: ", "invalid path: {pki}/missing-ca.crt", "check --etcd-cafile"],
    ),
    "no CA file for https": (
        (None, "client.crt", "client.key"),
        ["{url} is https: give --etcd-cafile"],
    ),
}


@pytest.mark.parametrize("case", list(TLS_REFUSED))
async def test_etcd_refused_over_tls_is_named_and_nothing_is_appended(
    settings: KafkaSettings, tls_etcd: str, pki: Pki, case: str
) -> None:
    flags, said = TLS_REFUSED[case]
    cafile, certfile, keyfile = (None if f is None else pki[f] for f in flags)
    with pytest.raises(EtcdError) as raised:
        await audit(settings, EtcdSettings((tls_etcd,), cafile, certfile, keyfile))
    for words in said:
        assert words.format(url=tls_etcd, pki=pki.directory) in str(raised.value)
    assert await audited(settings) == []


class Compacting:
    """etcd's store, compacted past the audit's revision after the first page."""

    def __init__(self, store: Store, url: str) -> None:
        self.store = store
        self.url = url
        self.pages = 0

    async def revision(self) -> int:
        return await self.store.revision()

    async def count(self, start: bytes, end: bytes, revision: int) -> int:
        return await self.store.count(start, end, revision)

    async def page(
        self, start: bytes, end: bytes, revision: int, limit: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        self.pages += 1
        if self.pages == 2:  # kube-apiserver wrote meanwhile, and its compactor ran
            written = gateway(self.url, "kv/put", {"key": base64.b64encode(b"/x").decode()})
            current = int(written["header"]["revision"])
            gateway(self.url, "kv/compaction", {"revision": current, "physical": True})
        return await self.store.page(start, end, revision, limit)


async def test_a_revision_compacted_while_the_audit_reads_says_audit_again(
    settings: KafkaSettings, etcd: str
) -> None:
    put_all(etcd, [(f"/registry/configmaps/default/cm-{i}", CONFIGMAP) for i in range(30)])
    with pytest.raises(EtcdError) as raised:
        await audit(settings, EtcdSettings((etcd,)), lambda store: Compacting(store, etcd))
    assert f"etcd at {etcd} compacted past the audit's revision" in str(raised.value)
    assert "audit again" in str(raised.value)
    assert await audited(settings) == []


def appended_once(result: Result, events: list[StorageAudited]) -> StorageAudited:
    """The audit's one StorageAudited, for configmaps, as appended."""
    assert events == list(result.events)
    (event,) = events
    assert (event.resource, event.etcd_revision) == ("configmaps", result.revision)
    return event


async def test_a_key_of_no_resource_is_counted_apart_and_the_rest_appended(
    settings: KafkaSettings, etcd: str, caplog: pytest.LogCaptureFixture
) -> None:
    put_all(etcd, [*CONFIGMAPS, ("/registry/not-a-resource/x", CONFIGMAP)])
    with caplog.at_level(logging.WARNING, logger="kube.auditor"):
        result = await audit(settings, EtcdSettings((etcd,)))
    assert (result.keys, result.unplaced) == (6, 1)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "kube.auditor"]
    assert (
        "ledger knows: 1;" in warning and "/registry/not-a-resource/x (under no resource" in warning
    )
    event = appended_once(result, await audited(settings))
    assert (event.objects, event.versions, event.version_counts) == (5, ("v1",), (5,))
    assert (event.undecodable, event.polluted_versions) == (0, ())


async def test_a_truncated_value_is_counted_as_undecodable_under_its_key(
    settings: KafkaSettings, etcd: str
) -> None:
    broken = "/registry/configmaps/default/broken"
    put_all(etcd, [*CONFIGMAPS, (broken, CONFIGMAP[: len(CONFIGMAP) // 2])])
    result = await audit(settings, EtcdSettings((etcd,)))
    assert (result.keys, result.unplaced) == (6, 0)
    event = appended_once(result, await audited(settings))
    assert (event.objects, event.versions, event.version_counts) == (6, ("v1",), (5,))
    assert event.total_bytes == 5 * len(CONFIGMAP) + len(CONFIGMAP) // 2
    assert (event.undecodable, event.undecodable_keys) == (1, (f"{broken}: CorruptProtobuf",))


def svledger(*argv: str) -> subprocess.CompletedProcess[str]:
    """``svledger`` run as a user runs it, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "svledger", "--log-format", "text", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def test_the_audit_command_prints_one_resource_at_the_revision_read_and_appends_nothing(
    settings: KafkaSettings, etcd: str
) -> None:
    meta = Meta.new(CLUSTER, APISERVER, datetime.now(UTC))
    events = StorageVersionReported(meta, APISERVER, "", "events", "Event", "v1", ("v1",), ("v1",))
    async with EventProducer(settings) as producer:
        await producer.send(events)  # the ledger knows configmaps and events
    event = next(e["value"] for e in CAPTURED if e["key"] == "/registry/events/default/event")
    put_all(etcd, [(f"/registry/configmaps/default/cm-{i}", CONFIGMAP) for i in range(25)])
    put_all(etcd, [(f"/registry/events/default/e-{i}", base64.b64decode(event)) for i in range(3)])
    revision = int(gateway(etcd, "maintenance/status", {})["header"]["revision"])
    kafka = ("--bootstrap", settings.bootstrap_servers, "--topic", settings.topic)
    flags = ("audit", "--cluster", CLUSTER, "--etcd-servers", etcd, *kafka)

    ran = svledger(*flags, "--resource", "configmaps", "--page-size", "10", "--dry-run")
    assert ran.returncode == 0, ran.stderr
    first, *resources = ran.stdout.splitlines()
    # The 25 configmaps in pages of 10 (3 range requests); the events not read.
    assert first.startswith(f"etcd revision {revision}: 25 keys in 3 requests, "), ran.stdout
    assert resources == ["core.configmaps: 25 objects (25 v1)"]
    assert await audited(settings) == []

    refused = svledger(*flags, "--page-size", "0")
    assert refused.returncode == 2
    assert "--page-size: '0' is not a positive number of keys" in refused.stderr
