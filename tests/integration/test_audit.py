"""``svledger audit`` on a real cluster: what etcd holds, counted at one revision, checked
against the ledger.

Two stock kube-apiservers (v1.37.2) encrypt secrets with aescbc as an
``EncryptionConfiguration`` says (key1 first); the collector, the migration trigger and
the worker (``rewrite`` executor) run in this process for cluster ``audited``, on one
topic for the module. Counts are checked against etcd read here independently, through
its JSON gateway, at the audit's revision.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from sqlalchemy import create_engine

from consumers.migrator import run_migrator
from consumers.operator import request_migration
from consumers.worker import Rewriter, run_worker
from deploy.kube.cluster import LocalCluster
from deploy.kube.rolling_upgrade import NEW, addressed
from kube.auditor import AuditOptions, Result, run_audit
from kube.client import Kube, connect
from kube.collector import run_collector
from kube.etcd import EtcdSettings, open_store
from kube.stored import EncryptedValue, StoredObject, decode
from kube.target import KubernetesTarget
from ledger import metrics
from ledger.clock import SystemClock
from ledger.events import MigrationSucceeded, StorageAudited
from ledger.kafka import create_topics
from ledger.settings import KafkaSettings
from projections.history import explain
from projections.replay import cluster_log, replay
from tests.kube import eventually

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes, pytest.mark.asyncio(loop_scope="module")]

CLUSTER = "audited"
NAMESPACE = "audit"
KEY1 = base64.b64encode(b"k" * 32).decode()
KEY2 = base64.b64encode(b"n" * 32).decode()


def encryption(*keys: tuple[str, str]) -> dict[str, Any]:
    """An EncryptionConfiguration encrypting secrets with aescbc ``keys``, the first writing."""
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [
            {
                "resources": ["secrets"],
                "providers": [
                    {"aescbc": {"keys": [{"name": n, "secret": s} for n, s in keys]}},
                    {"identity": {}},
                ],
            }
        ],
    }


@dataclasses.dataclass
class Pipeline:
    cluster: LocalCluster
    settings: KafkaSettings
    kube: Kube
    config: Path  # the EncryptionConfiguration file the apiservers read
    workdir: Path

    def options(self, **kwargs: Any) -> AuditOptions:
        config = yaml.safe_load(self.config.read_text())
        return AuditOptions(CLUSTER, pages_per_second=10_000.0, encryption=config, **kwargs)

    async def audit(self, **kwargs: Any) -> Result:
        async with open_store(EtcdSettings((self.cluster.etcd_url,))) as store:
            return await run_audit(self.settings, store, self.options(**kwargs))


@pytest.fixture(scope="module")
def encrypted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    config = tmp_path_factory.mktemp("encryption") / "encryption.yaml"
    config.write_text(yaml.safe_dump(encryption(("key1", KEY1))))
    with LocalCluster(
        2, version=NEW, extra_apiserver_args=[f"--encryption-provider-config={config}"]
    ) as cluster:
        yield cluster, config


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipeline(
    encrypted: tuple[LocalCluster, Path],
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Pipeline]:
    cluster, config = encrypted
    workdir = tmp_path_factory.mktemp("audit")
    topic = f"svledger-test.audit.{uuid.uuid4().hex[:8]}"
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=topic, partitions=1)
    await create_topics(settings)
    kube = await connect(str(cluster.write_kubeconfig(workdir / "kubeconfig")))
    direct = addressed(kube, cluster)
    clock = SystemClock()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            # An apiserver restarted (the key rotation) leaves at once: a test of the store,
            # not of shutdown delays (test_agreement_real.py).
            run_collector(
                settings,
                CLUSTER,
                kube,
                stop=stop,
                clock=clock,
                apiservers=direct,
                shutdown_window=2.0,
            )
        ),
        asyncio.create_task(run_migrator(settings, stop=stop, group_id=f"{topic}.migrator")),
        asyncio.create_task(
            run_worker(
                settings,
                Rewriter(KubernetesTarget(kube), clock, chunk_size=100),
                stop=stop,
                cluster=CLUSTER,
                group_id=f"{topic}.worker",
            )
        ),
    ]
    pipeline = Pipeline(cluster, settings, kube, config, workdir)
    await kube.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    try:
        await eventually(
            lambda: settled(pipeline, ("", "configmaps"), ("", "secrets")),
            "the first migrations",
            180,
        )
        yield pipeline
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for client in direct.values():
            await client.close()
        await kube.close()


async def settled(pipeline: Pipeline, *resources: tuple[str, str]) -> str | None:
    """None once each resource's apiservers agree, its StorageState holds one hash and no
    migration of it is active."""
    state, _ = await cluster_log(pipeline.settings, CLUSTER)
    members = state.members_by_cluster.get(CLUSTER, set())
    if len(members) != 2:
        return f"members {sorted(members)}"
    for group, resource in resources:
        storage_state = state.storage_states.get((CLUSTER, group, resource))
        if storage_state is None or len(storage_state.persisted_storage_version_hashes) != 1:
            return f"{resource}: {storage_state}"
        if state.active_migrations_by_resource.get((CLUSTER, group, resource)):
            return f"{resource}: a migration is active"
        storage_version = state.storage_versions.get((CLUSTER, group, resource))
        if storage_version is None or storage_version.condition.status != "True":
            return f"{resource}: no agreement ({storage_version})"
    return None


def etcd_range(cluster: LocalCluster, prefix: str, revision: int) -> list[tuple[str, bytes]]:
    """Every (key, value) under ``prefix`` at ``revision``, read through etcd's gateway here."""
    key = prefix.encode()
    end = key[:-1] + bytes([key[-1] + 1])
    body = {
        "key": base64.b64encode(key).decode(),
        "range_end": base64.b64encode(end).decode(),
        "revision": revision,
    }
    request = urllib.request.Request(
        f"{cluster.etcd_url}/v3/kv/range", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        kvs = json.loads(answer.read()).get("kvs", [])
    return [
        (base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", ""))) for kv in kvs
    ]


def counted(pairs: list[tuple[str, bytes]]) -> tuple[Counter[str], Counter[str]]:
    """Per stored apiVersion, and per encryption key, as a person would count them."""
    versions: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    for key, value in pairs:
        found = decode(key, value)
        if isinstance(found, StoredObject):
            versions[found.api_version] += 1
        elif isinstance(found, EncryptedValue):
            keys[f"{found.provider}:{found.provider_version}:{found.key_name}"] += 1
    return versions, keys


async def logged(pipeline: Pipeline, result: Result) -> None:
    """Wait until the log shows ``result``'s events: a transaction's commit markers are
    written after its commit returns, so a read at once may end before them."""

    async def shown() -> str | None:
        _, records = await cluster_log(pipeline.settings, CLUSTER)
        ids = {r.event.audit_id for r in records if isinstance(r.event, StorageAudited)}
        return None if result.events[0].audit_id in ids else "the audit is not in the log yet"

    await eventually(shown, "the audit in the log", 30)


def of(result: Result, group: str, resource: str) -> StorageAudited:
    (event,) = [e for e in result.events if (e.group, e.resource) == (group, resource)]
    return event


async def create(kube: Kube, kind: str, names: list[str]) -> None:
    plural = f"{kind.lower()}s"
    for start in range(0, len(names), 50):
        await asyncio.gather(
            *(
                kube.request(
                    "POST",
                    f"/api/v1/namespaces/{NAMESPACE}/{plural}",
                    {
                        "apiVersion": "v1",
                        "kind": kind,
                        "metadata": {"name": name},
                        "data": {"k": "dg=="},
                    },
                )
                for name in names[start : start + 50]
            )
        )


async def test_an_audit_counts_what_etcd_holds_at_one_revision_in_any_page_size(
    pipeline: Pipeline,
) -> None:
    kube, cluster = pipeline.kube, pipeline.cluster
    await create(kube, "ConfigMap", [f"cm-{i}" for i in range(1000)])
    await create(kube, "Secret", [f"s-{i}" for i in range(20)])
    stop = asyncio.Event()

    async def writing() -> None:  # the store moves while the audit reads it
        for i in range(10_000):
            if stop.is_set():
                return
            await create(kube, "ConfigMap", [f"late-{i}"])

    writer = asyncio.create_task(writing())
    try:
        small = await pipeline.audit(resources=("configmaps", "secrets"), page_size=10)
    finally:
        stop.set()
        await writer
    configmaps, secrets = of(small, "", "configmaps"), of(small, "", "secrets")
    assert {e.etcd_revision for e in small.events} == {small.revision}
    assert small.requests >= 100  # pages of 10 over 1,000 objects and more
    at_revision = etcd_range(cluster, "/registry/configmaps/", small.revision)
    versions, _ = counted(at_revision)
    assert configmaps.objects == len(at_revision) >= 1000
    assert dict(zip(configmaps.versions, configmaps.version_counts, strict=True)) == versions
    _, keys = counted(etcd_range(cluster, "/registry/secrets/", small.revision))
    assert keys["aescbc:v1:key1"] >= 20
    assert dict(zip(secrets.encryption_keys, secrets.encryption_counts, strict=True)) == {
        "aescbc:v1:key1": keys["aescbc:v1:key1"],
        "identity": 0,
    }
    # Pages of 500 and of 10 over the same store count the same.
    large = await pipeline.audit(resources=("configmaps",), page_size=500)
    again = await pipeline.audit(resources=("configmaps",), page_size=10)
    assert of(large, "", "configmaps").version_counts == of(again, "", "configmaps").version_counts
    assert large.requests < again.requests
    # Clean runs raise no alarm.
    await logged(pipeline, again)
    _, records = await cluster_log(pipeline.settings, CLUSTER)
    audits = [r.event for r in records if isinstance(r.event, StorageAudited)]
    assert len(audits) == 4 and not any(a.polluted_versions for a in audits)


async def test_a_rotated_encryption_key_can_go_once_a_migration_rewrote_every_secret(
    pipeline: Pipeline,
) -> None:
    cluster, settings = pipeline.cluster, pipeline.settings
    await create(pipeline.kube, "Secret", [f"r-{i}" for i in range(30)])
    pipeline.config.write_text(yaml.safe_dump(encryption(("key2", KEY2), ("key1", KEY1))))
    state, _ = await cluster_log(settings, CLUSTER)
    old = {lease.holder_identity for lease in state.leases.values()}
    for index in range(2):
        cluster.restart_apiserver(index)

    async def restarted() -> str | None:  # the ledger holds the new incarnations alone
        state, _ = await cluster_log(settings, CLUSTER)
        holders = {lease.holder_identity for lease in state.leases.values()}
        return None if len(holders) == 2 and not holders & old else f"holders {holders}"

    await eventually(restarted, "the restarted apiservers in the ledger", 120)
    rotated = of(await pipeline.audit(resources=("secrets",)), "", "secrets")
    counts = dict(zip(rotated.encryption_keys, rotated.encryption_counts, strict=True))
    assert rotated.encryption_keys == ("aescbc:v1:key2", "aescbc:v1:key1", "identity")
    assert counts["aescbc:v1:key1"] >= 30 and counts["identity"] == 0
    assert rotated.polluted_versions == () and rotated.pollution is None

    await eventually(lambda: settled(pipeline, ("", "secrets")), "agreement on secrets again", 120)
    requested = await request_migration(settings, CLUSTER, "", "secrets", None, "test")

    async def migrated() -> str | None:
        state, records = await cluster_log(settings, CLUSTER)
        done = any(
            isinstance(r.event, MigrationSucceeded)
            and r.event.migration_id == requested.migration_id
            for r in records
        )
        row = state.migrations.get((CLUSTER, requested.migration_id))
        return None if done else f"migration {requested.migration_id}: {row}"

    await eventually(migrated, "the migration of secrets", 120)
    audit = await pipeline.audit(resources=("secrets",))
    after = of(audit, "", "secrets")
    counts = dict(zip(after.encryption_keys, after.encryption_counts, strict=True))
    assert counts["aescbc:v1:key1"] == 0 and counts["aescbc:v1:key2"] == after.objects
    assert after.polluted_versions == () and after.pollution is None
    await logged(pipeline, audit)
    database = f"sqlite:///{pipeline.workdir / 'rotated.db'}"
    await replay(settings, database, progress=False)
    with create_engine(database).connect() as connection:
        text = explain(connection, "secrets", CLUSTER)
    assert "aescbc:v1:key1 encrypts no object of this resource" in text, text
    assert "(aescbc:v1:key2 writes)" in text


async def test_an_object_written_where_the_ledger_says_none_can_be_raises_the_alarm(
    pipeline: Pipeline,
) -> None:
    group, kube, cluster = "audit.svledger.test", pipeline.kube, pipeline.cluster
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": v == "v2",
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
                for v in ("v1", "v2")
            ],
        },
    }
    await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    async def served() -> str | None:
        try:
            await kube.get(f"/apis/{group}/v2/namespaces/{NAMESPACE}/widgets")
        except Exception as error:  # not served yet
            return str(error)
        return None

    await eventually(served, "widgets served", 30)
    for i in range(5):
        body = {"apiVersion": f"{group}/v2", "kind": "Widget", "metadata": {"name": f"w-{i}"}}
        await kube.request("POST", f"/apis/{group}/v2/namespaces/{NAMESPACE}/widgets", body)
    await eventually(lambda: settled(pipeline, (group, "widgets")), "widgets migrated", 120)
    name = f"{group}.widgets"
    clean = of(await pipeline.audit(resources=(name,)), group, "widgets")
    assert clean.polluted_versions == () and clean.version_counts == (5,)

    # A writer outside the apiservers (an old backup restored, a tool) puts a v1 object.
    intruder = {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": "old", "namespace": NAMESPACE},
    }
    put = {
        "key": base64.b64encode(f"/registry/{group}/widgets/{NAMESPACE}/old".encode()).decode(),
        "value": base64.b64encode(json.dumps(intruder).encode()).decode(),
    }
    request = urllib.request.Request(
        f"{cluster.etcd_url}/v3/kv/put", data=json.dumps(put).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30):
        pass
    polluted = of(await pipeline.audit(resources=(name,)), group, "widgets")
    assert polluted.polluted_versions == (f"{group}/v1",)
    assert polluted.pollution is not None and f"1 in {group}/v1" in polluted.pollution

    async def alarmed() -> str | None:
        (family,) = metrics.POLLUTED_OBJECTS.collect()
        found = [
            s.value for s in family.samples if s.labels == {"cluster": CLUSTER, "resource": name}
        ]
        return None if found == [1.0] else f"the gauge shows {found}"

    await eventually(alarmed, "the pollution gauge", 30)
    database = f"sqlite:///{pipeline.workdir / 'polluted.db'}"
    await replay(pipeline.settings, database, progress=False)
    with create_engine(database).connect() as connection:
        text = explain(connection, name, CLUSTER)
    assert f"1 stored in {group}/v1" in text and "POLLUTION" in text and "ALARM: etcd holds" in text
