"""The in-tree executor while its cluster is away (a cancellation still ends the
migration), and on a real cluster it does not trust, without and with
kube-controller-manager."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.worker import Rewriter
from deploy.kafka.broker import free_port
from deploy.kube.cluster import LocalCluster
from kube.client import ApiError, Kube, connect
from kube.executor import GROUP, StorageMigrationExecutor, object_name
from kube.target import KubernetesTarget
from ledger.clock import SystemClock
from ledger.events import Event, MigrationFailed, MigrationStarted, MigrationSucceeded
from projections.state import Migration, Phase
from tests.kube import eventually, kube_at

START = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.fixture
async def away() -> AsyncIterator[Kube]:
    """A client of an API server that does not answer: nothing listens on its port."""
    kube = kube_at(f"http://127.0.0.1:{free_port()}")
    yield kube
    await kube.close()


class Appended(list[Event]):
    """What an executor appends, kept: an :data:`~consumers.worker.Append`."""

    async def __call__(self, events: Sequence[Event]) -> None:
        self.extend(events)


def in_tree(kube: Kube, **options: float) -> StorageMigrationExecutor:
    """The in-tree executor as the worker makes it: events go to the rewrite executor."""
    clock = SystemClock()
    return StorageMigrationExecutor(kube, clock, Rewriter(KubernetesTarget(kube), clock), **options)


def started(
    executor: StorageMigrationExecutor, running: Migration, appended: Appended
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """``executor`` running ``running`` in the background, until the event is set."""
    stop = asyncio.Event()
    return stop, asyncio.create_task(executor.run(running, append=appended, cancelled=stop.is_set))


def migration(phase: Phase) -> Migration:
    return Migration(
        "east", "m-1", "apps", "deployments", "apps/v1", "h", "0:1", phase, 0, None, None,
        None, START, START, "0:2", "0:2", START,
    )  # fmt: skip


@pytest.mark.parametrize("phase", ["Pending", "Running"])
async def test_a_migration_cancelled_while_its_cluster_is_away_ends(
    away: Kube, phase: Phase
) -> None:
    appended = Appended()
    polls = 0

    def cancelled() -> bool:
        nonlocal polls
        polls += 1
        return polls > 3  # cancelled after a few attempts to reach the cluster

    executor = in_tree(away, poll_seconds=0.01)
    await asyncio.wait_for(
        executor.run(migration(phase), append=appended, cancelled=cancelled), timeout=30
    )
    assert appended == []  # nothing was created, nothing started, nothing to report
    assert polls == 4


async def untrusted_fails(kubeconfig: Path, tmp_path: Path) -> None:
    config = json.loads(kubeconfig.read_text())
    for cluster in config["clusters"]:
        del cluster["cluster"]["certificate-authority-data"]
    untrusted = tmp_path / "untrusted"
    untrusted.write_text(json.dumps(config))
    kube = await connect(str(untrusted))
    appended = Appended()
    try:
        executor = in_tree(kube, poll_seconds=0.2)
        run = executor.run(migration("Pending"), append=appended, cancelled=lambda: False)
        await asyncio.wait_for(run, timeout=60)
    finally:
        await kube.close()
    assert len(appended) == 1, appended
    failed = appended[0]
    assert isinstance(failed, MigrationFailed)
    assert failed.reason == "RequestFailed"
    assert "certificate-authority" in failed.message


@pytest.mark.kubernetes
async def test_a_migration_untrusted_or_no_controller_takes_fails_one_a_controller_takes_does_not(
    tmp_path: Path,
) -> None:
    appended = Appended()
    with LocalCluster(1) as cluster:
        kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        executor = in_tree(kube, poll_seconds=0.2, controller_wait_seconds=3)
        path = f"/apis/{GROUP}/v1/storageversionmigrations"
        try:
            # An API server the kubeconfig's CA does not verify: asking again would not help.
            await untrusted_fails(cluster.write_kubeconfig(tmp_path / "trusted"), tmp_path)

            # No kube-controller-manager: nothing takes the object.
            alone = migration("Pending")
            await asyncio.wait_for(
                executor.run(alone, append=appended, cancelled=lambda: False), timeout=60
            )
            assert [type(e) for e in appended] == [MigrationStarted, MigrationFailed]
            failed = appended[1]
            assert isinstance(failed, MigrationFailed)
            assert failed.reason == "ControllerNotRunning"
            assert "storage-version-migrator-controller" in failed.message
            with pytest.raises(ApiError) as gone:
                await kube.get(f"{path}/{object_name(alone)}")
            assert gone.value.status == 404  # deleted, as a cancelled one is

            # Queued: from 1.36 the controller runs one object of a resource at a time and
            # sets status.resourceVersion only on that one. Behind an object it runs (its
            # Running condition, set here as the controller sets it), the wait goes on.
            appended.clear()
            ahead = await kube.request(
                "POST",
                path,
                {
                    "apiVersion": f"{GROUP}/v1",
                    "kind": "StorageVersionMigration",
                    "metadata": {"name": "operators-own"},
                    "spec": {"resource": {"group": "apps", "resource": "deployments"}},
                },
            )
            ahead["status"] = {
                "conditions": [
                    {
                        "type": "Running",
                        "status": "True",
                        "reason": "MigrationRunning",
                        "message": "running",
                        "lastTransitionTime": "2026-11-29T12:00:00Z",
                    }
                ]
            }
            await kube.request("PUT", f"{path}/operators-own/status", ahead)
            queued = dataclasses.replace(migration("Pending"), migration_id="m-queued")
            _, waiting = started(executor, queued, appended)
            await asyncio.sleep(8)  # well past controller_wait_seconds
            assert [type(e) for e in appended] == [MigrationStarted], appended
            assert not waiting.done()
            await kube.request("DELETE", f"{path}/operators-own")
            # Nothing runs it now, and no controller takes it: it fails as one alone does.
            await asyncio.wait_for(waiting, 60)
            assert [type(e) for e in appended] == [MigrationStarted, MigrationFailed]
            assert isinstance(appended[1], MigrationFailed)
            assert appended[1].reason == "ControllerNotRunning"
            appended.clear()

            # Its own Running condition (set first, before status.resourceVersion, by the
            # 1.36+ controller) says a controller took it.
            marked = dataclasses.replace(migration("Pending"), migration_id="m-marked")
            stop, following = started(executor, marked, appended)

            async def created() -> str | None:
                try:
                    own = await kube.get(f"{path}/{object_name(marked)}")
                except ApiError as error:
                    return str(error)
                own["status"] = ahead["status"]
                await kube.request("PUT", f"{path}/{object_name(marked)}/status", own)
                return None

            await eventually(created, "the executor creates its object")
            await asyncio.sleep(8)  # well past controller_wait_seconds
            assert [type(e) for e in appended] == [MigrationStarted], appended
            stop.set()
            await asyncio.wait_for(following, 60)
            appended.clear()

            # With the controller, the object is taken at once, however long it then runs.
            cluster.start_controller_manager()
            # It answers its health check before its informers have synced: one migration,
            # given all the time it needs, shows it runs; the next must be taken in 3 s.
            warm = dataclasses.replace(migration("Pending"), migration_id="m-warm")
            patient, warmed = (
                in_tree(kube, poll_seconds=0.2, controller_wait_seconds=120),
                Appended(),
            )
            await asyncio.wait_for(
                patient.run(warm, append=warmed, cancelled=lambda: False), timeout=180
            )
            assert warmed and isinstance(warmed[-1], MigrationSucceeded), warmed
            appended.clear()
            taken = dataclasses.replace(migration("Pending"), migration_id="m-2")
            stop, running = started(executor, taken, appended)

            async def has_resource_version() -> str | None:
                if any(isinstance(e, MigrationSucceeded) for e in appended):
                    return None  # done already, and its object deleted
                try:
                    obj = await kube.get(f"{path}/{object_name(taken)}")
                except ApiError as error:
                    return str(error)
                return None if (obj.get("status") or {}).get("resourceVersion") else str(obj)

            await eventually(has_resource_version, "the controller takes the object")
            await asyncio.sleep(5)  # past controller_wait_seconds
            assert not any(isinstance(e, MigrationFailed) for e in appended), appended
            stop.set()
            await asyncio.wait_for(running, 60)
        finally:
            await kube.close()


@pytest.mark.kubernetes
async def test_a_finished_migration_leaves_no_object_and_events_are_rewritten_by_the_worker(
    tmp_path: Path,
) -> None:
    """The ledger keeps the record: an object left behind (an alpha one) would break the
    API after an upgrade. kube-controller-manager's migrator cannot list events, which
    its garbage collector ignores: they went Running for ever."""
    appended = Appended()
    with LocalCluster(1) as cluster:
        cluster.start_controller_manager()
        kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        executor = in_tree(kube, poll_seconds=0.5)
        path = f"/apis/{GROUP}/v1/storageversionmigrations"
        try:
            events = dataclasses.replace(
                migration("Pending"), migration_id="m-events", group="", resource="events"
            )
            await asyncio.wait_for(
                executor.run(events, append=appended, cancelled=lambda: False), timeout=120
            )
            assert type(appended[0]) is MigrationStarted
            assert type(appended[-1]) is MigrationSucceeded, appended
            listed = await kube.get(path)
            assert [o["metadata"]["name"] for o in listed["items"]] == []  # none was made

            appended.clear()
            done = dataclasses.replace(
                migration("Pending"), migration_id="m-done", group="", resource="configmaps"
            )
            await asyncio.wait_for(
                executor.run(done, append=appended, cancelled=lambda: False), timeout=300
            )
            assert [type(e) for e in appended] == [MigrationStarted, MigrationSucceeded]
            with pytest.raises(ApiError) as gone:
                await kube.get(f"{path}/{object_name(done)}")
            assert gone.value.status == 404
        finally:
            await kube.close()


@pytest.mark.kubernetes
async def test_a_migration_on_a_cluster_that_does_not_serve_the_api_fails_saying_so(
    tmp_path: Path,
) -> None:
    appended = Appended()
    off = [f"--runtime-config={GROUP}/v1=false"]
    with LocalCluster(1, extra_apiserver_args=off) as cluster:
        kube = await connect(str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        executor = in_tree(kube, poll_seconds=0.2)
        try:
            await asyncio.wait_for(
                executor.run(migration("Pending"), append=appended, cancelled=lambda: False),
                timeout=60,
            )
        finally:
            await kube.close()
    assert len(appended) == 1
    failed = appended[0]
    assert isinstance(failed, MigrationFailed)
    assert failed.reason == "NotServed"
    assert f"--runtime-config={GROUP}/v1beta1=true" in failed.message
