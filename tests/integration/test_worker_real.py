"""The worker against a real kube-apiserver behaves as upstream's migrator does.

MutatingAdmissionPolicies are created on a stock v1.36.3 apiserver (stored as
``v1beta1``, in protobuf); the apiserver is upgraded to v1.37.2 (which stores them as
``v1``). The worker runs as a service account that RBAC lets update every one of them
but one (admission policies cannot refuse writes to admissionregistration objects, so
the refusal is a 403). The migration
to v1 lists in chunks: the refused object does not stop its chunk (every other object
of the chunk is rewritten, as etcd shows), the migration fails naming it, and the
trigger requests it again after its back-off, again and again, until the refusal is
lifted and it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from consumers.migrator import Backoff, run_migrator
from consumers.worker import Rewriter, run_worker
from deploy.kube.cluster import LocalCluster
from deploy.kube.rolling_upgrade import NEW, OLD, addressed, policy, stored_as
from kube.client import Kube, connect
from kube.cluster_check import IdentityCheck
from kube.collector import run_collector
from kube.target import KubernetesTarget
from ledger.clock import SystemClock
from ledger.events import MigrationFailed
from ledger.kafka import create_topics
from ledger.settings import KafkaSettings
from projections.replay import cluster_log
from tests.kube import eventually

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

CLUSTER = "worker-real"
GROUP = "admissionregistration.k8s.io"
POLICIES = f"/apis/{GROUP}/v1/mutatingadmissionpolicies"
FROZEN = "p-3"
NAMES = [f"p-{i}" for i in range(7)]  # listed in this order, in chunks of 5

ROLE = "/apis/rbac.authorization.k8s.io/v1/clusterroles/svledger-worker"


def worker_role(updatable: list[str]) -> dict[str, object]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "svledger-worker"},
        "rules": [
            {"apiGroups": [GROUP], "resources": ["mutatingadmissionpolicies"],
             "verbs": ["get", "list"]},
            {"apiGroups": [GROUP], "resources": ["mutatingadmissionpolicies"],
             "verbs": ["update"], "resourceNames": updatable},
            # The identity check: the worker lists the apiservers' identity Leases.
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]},
        ],
    }  # fmt: skip


async def worker_identity(
    cluster: LocalCluster, admin: Kube, path: Path, role: dict[str, object] | None = None
) -> Kube:
    """A service account bound to the ClusterRole ``svledger-worker``, ``role`` (by
    default, allowed to update every policy but FROZEN); a client as it."""
    await admin.request(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "svledger-worker"}},
    )
    await admin.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        role or worker_role([n for n in NAMES if n != FROZEN]),
    )
    await admin.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "svledger-worker"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "svledger-worker",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "svledger-worker", "namespace": "default"}
            ],
        },
    )
    issued = await admin.request(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/svledger-worker/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    config = json.loads(cluster.write_kubeconfig(path).read_text())
    config["users"][0]["user"] = {"token": issued["status"]["token"]}
    path.write_text(json.dumps(config))
    return await connect(str(path))


@pytest.fixture
async def upgraded(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, Kube]]:
    """One apiserver: policies created on the old release, then upgraded to the new."""
    with LocalCluster(1, version=OLD) as cluster:
        kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            for name in NAMES:
                await kube.request("POST", POLICIES, policy(name))
            await asyncio.to_thread(cluster.restart_apiserver, 0, NEW)
            yield cluster, kube
        finally:
            await kube.close()


def stored(cluster: LocalCluster) -> dict[str, str]:
    """Each policy's name -> the version etcd holds it in (protobuf, as upstream stores)."""
    return {
        key.rsplit("/", 1)[1]: stored_as(key, value).rsplit("/", 1)[1]
        for key, value in cluster.etcd_get_prefix("/registry/mutatingadmissionpolicies/")
    }


async def test_a_refused_object_fails_its_migration_after_its_chunk_and_it_is_retried(
    upgraded: tuple[LocalCluster, Kube], kafka_bootstrap: str, unique_topic: str, tmp_path: Path
) -> None:
    cluster, kube = upgraded
    assert set(stored(cluster).values()) == {"v1beta1"}
    worker_kube = await worker_identity(cluster, kube, tmp_path / "worker.kubeconfig")

    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    stop = asyncio.Event()
    clock = SystemClock()
    rewriter = Rewriter(KubernetesTarget(worker_kube), clock, chunk_size=5)
    # A stock apiserver: the collector reads what it stores in from its own discovery.
    direct = addressed(kube, cluster)
    tasks = [
        asyncio.create_task(
            run_collector(settings, CLUSTER, kube, stop=stop, clock=clock, apiservers=direct)
        ),
        asyncio.create_task(run_migrator(settings, stop=stop, backoff=Backoff(seconds=2))),
        asyncio.create_task(
            run_worker(
                settings, rewriter, stop=stop, cluster=CLUSTER, check=IdentityCheck(worker_kube)
            )
        ),
    ]

    async def failures() -> list[MigrationFailed]:
        state, records = await cluster_log(settings, CLUSTER)
        return [
            r.event
            for r in records
            if isinstance(r.event, MigrationFailed)
            and state.migrations[CLUSTER, r.event.migration_id].resource
            == "mutatingadmissionpolicies"
        ]

    async def failed_twice() -> str | None:
        return None if len(await failures()) >= 2 else f"{len(await failures())} failures"

    try:
        await eventually(failed_twice, "the migration failed and was requested again")
        first = (await failures())[0]
        assert FROZEN in (first.message or "")
        assert first.reason == "Forbidden"
        assert (first.objects_migrated, first.continue_token) == (0, None)
        # The refused object's chunk was rewritten but for it; the next chunk never began.
        assert stored(cluster) == {
            "p-0": "v1", "p-1": "v1", "p-2": "v1", "p-3": "v1beta1", "p-4": "v1",
            "p-5": "v1beta1", "p-6": "v1beta1",
        }  # fmt: skip

        current = await kube.get(ROLE)
        await kube.request("PUT", ROLE, {**worker_role(NAMES), "metadata": current["metadata"]})

        async def all_v1() -> str | None:
            versions = stored(cluster)
            return None if set(versions.values()) == {"v1"} else str(versions)

        await eventually(all_v1, "a later attempt migrated every object")
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for client in (worker_kube, *direct.values()):
            await client.close()
