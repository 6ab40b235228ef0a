"""The worker against a real kube-apiserver behaves as upstream's migrator does.

MutatingAdmissionPolicies are created on v1.36.3 (stored as ``v1beta1``); the apiserver
is upgraded to v1.37.2 (which stores them as ``v1``), and a ValidatingAdmissionPolicy
refuses every update of one of them. The migration to v1 lists in chunks: the refused
object does not stop its chunk (every other object of the chunk is rewritten, as etcd
shows), the migration fails naming it, and the trigger requests it again after its
back-off, again and again, until the refusal is lifted and it succeeds.
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
from deploy.kube.rolling_upgrade import NEW, OLD, policy
from kube.client import ApiError, Kube, connect
from kube.collector import run_collector
from kube.target import KubernetesTarget
from ledger.clock import SystemClock
from ledger.events import MigrationFailed
from ledger.kafka import create_topics
from ledger.settings import KafkaSettings
from tests.kube import eventually, ledger_of

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]

CLUSTER = "worker-real"
GROUP = "admissionregistration.k8s.io"
POLICIES = f"/apis/{GROUP}/v1/mutatingadmissionpolicies"
FROZEN = "p-3"
NAMES = [f"p-{i}" for i in range(7)]  # listed in this order, in chunks of 5

DENY = {
    "apiVersion": f"{GROUP}/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "freeze-p-3"},
    "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [GROUP],
                    "apiVersions": ["*"],
                    "operations": ["UPDATE"],
                    "resources": ["mutatingadmissionpolicies"],
                }
            ]
        },
        "validations": [
            {"expression": f"object.metadata.name != '{FROZEN}'", "message": f"{FROZEN} is frozen"}
        ],
    },
}
DENY_BINDING = {
    "apiVersion": f"{GROUP}/v1",
    "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": "freeze-p-3"},
    "spec": {"policyName": "freeze-p-3", "validationActions": ["Deny"]},
}


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
    return {
        key.rsplit("/", 1)[1]: json.loads(value)["apiVersion"].rsplit("/", 1)[1]
        for key, value in cluster.etcd_get_prefix("/registry/mutatingadmissionpolicies/")
    }


async def test_a_refused_object_fails_its_migration_after_its_chunk_and_it_is_retried(
    upgraded: tuple[LocalCluster, Kube], kafka_bootstrap: str, unique_topic: str
) -> None:
    cluster, kube = upgraded
    assert set(stored(cluster).values()) == {"v1beta1"}
    await kube.request("POST", f"/apis/{GROUP}/v1/validatingadmissionpolicies", DENY)
    await kube.request("POST", f"/apis/{GROUP}/v1/validatingadmissionpolicybindings", DENY_BINDING)

    async def refused() -> str | None:
        current = await kube.get(f"{POLICIES}/{FROZEN}")
        try:
            await kube.request("PUT", f"{POLICIES}/{FROZEN}", current)
        except ApiError as error:
            return None if FROZEN in str(error) else str(error)
        return "not refused yet"

    await eventually(refused, "the admission policy refuses updates of p-3", timeout=60)

    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=2)
    await create_topics(settings)
    stop = asyncio.Event()
    clock = SystemClock()
    rewriter = Rewriter(KubernetesTarget(kube), clock, chunk_size=5)
    tasks = [
        asyncio.create_task(run_collector(settings, CLUSTER, kube, stop=stop, clock=clock)),
        asyncio.create_task(run_migrator(settings, stop=stop, backoff=Backoff(seconds=2))),
        asyncio.create_task(run_worker(settings, rewriter, stop=stop, cluster=CLUSTER)),
    ]

    async def failures() -> list[MigrationFailed]:
        state, records = await ledger_of(settings, CLUSTER)
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
        assert (first.objects_migrated, first.continue_token) == (0, None)
        # The refused object's chunk was rewritten but for it; the next chunk never began.
        assert stored(cluster) == {
            "p-0": "v1", "p-1": "v1", "p-2": "v1", "p-3": "v1beta1", "p-4": "v1",
            "p-5": "v1beta1", "p-6": "v1beta1",
        }  # fmt: skip

        await kube.request(
            "DELETE", f"/apis/{GROUP}/v1/validatingadmissionpolicybindings/freeze-p-3"
        )

        async def all_v1() -> str | None:
            versions = stored(cluster)
            return None if set(versions.values()) == {"v1"} else str(versions)

        await eventually(all_v1, "a later attempt migrated every object")
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
