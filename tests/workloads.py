"""A deterministic workload: the events of many clusters' control planes, interleaved.

:func:`mixed_events` tells just enough of each cluster's story for every event to be
plausible (membership before reports, leases that expire, migrations that run their
course, a few events the fold must reject), so tests and benchmarks fold the same
kind of log a fleet appends, of any length, the same for the same seed.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Final

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    Event,
    Meta,
    MigrationProgressed,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    StorageStateReset,
    StorageVersionReported,
)
from ledger.hashing import storage_version_hash

RESOURCES: Final = (
    ("", "pods", "Pod"),
    ("", "configmaps", "ConfigMap"),
    ("", "secrets", "Secret"),
    ("apps", "deployments", "Deployment"),
    ("batch", "jobs", "Job"),
    ("networking.k8s.io", "ingresses", "Ingress"),
)
HOSTS: Final = ("cp-0", "cp-1", "cp-2")
START: Final = datetime(2024, 1, 1, tzinfo=UTC)


@dataclasses.dataclass
class _Apiserver:
    host: str
    version: str = "v1"
    holder: str | None = None  # None: holds no lease
    renewed: datetime = START

    @property
    def id(self) -> str:
        return f"apiserver-{self.host}"


@dataclasses.dataclass
class _Cluster:
    """Just enough of a cluster's story to emit a plausible next event."""

    name: str
    apiservers: list[_Apiserver]
    pending: list[Event] = dataclasses.field(default_factory=list)
    serial: int = 0


def mixed_events(count: int, clusters: int = 50, seed: int = 0) -> Iterator[Event]:
    """``count`` events of ``clusters`` clusters, interleaved, deterministic for ``seed``."""
    rng = random.Random(seed)
    sims = [
        _Cluster(f"cluster-{i:03d}", [_Apiserver(host) for host in HOSTS]) for i in range(clusters)
    ]
    now = START
    for _ in range(count):
        now += timedelta(milliseconds=rng.randint(1, 200))
        yield _next_event(rng, rng.choice(sims), now)


def _next_event(rng: random.Random, cluster: _Cluster, now: datetime) -> Event:
    cluster.serial += 1
    if cluster.pending:
        return cluster.pending.pop(0)

    def meta(source: str) -> Meta:
        return Meta(str(uuid.UUID(int=rng.getrandbits(128))), cluster.name, now, source)

    apiserver = rng.choice(cluster.apiservers)
    roll = rng.random()
    if apiserver.holder is None or roll < 0.002:
        # (Re)start: membership first, then every resource's storage version.
        apiserver.holder = f"{apiserver.id}_{uuid.UUID(int=rng.getrandbits(128))}"
        if roll < 0.001:
            apiserver.version = "v2" if apiserver.version == "v1" else "v1"
        apiserver.renewed = now
        cluster.pending = [
            StorageVersionReported(
                meta(apiserver.id),
                apiserver.id,
                group,
                name,
                kind,
                apiserver.version,
                ("v1", "v2"),
                ("v1", "v2"),
            )
            for group, name, kind in RESOURCES
        ]
        return ApiserverHeartbeat(
            meta(apiserver.id), apiserver.id, apiserver.holder, apiserver.host, 3600, now, "1.31"
        )
    if roll < 0.004:
        apiserver.holder = None
        return ApiserverLeaseExpired(meta("lease-gc"), apiserver.id, apiserver.renewed, 3600)
    group, name, kind = rng.choice(RESOURCES)
    if roll < 0.005:
        return StorageStateReset(meta("operator"), group, name, "benchmark reset")
    if roll < 0.006:
        # Reported by an apiserver that never sent a heartbeat: the fold rejects it.
        return StorageVersionReported(
            meta("apiserver-stranger"), "apiserver-stranger", group, name, kind, "v1", ("v1",), ()
        )
    if roll < 0.02:
        migration = f"migration-{cluster.serial}"
        version = apiserver.version
        target = storage_version_hash(group, version, kind)
        steps: list[Event] = [
            MigrationStarted(meta("worker"), migration),
            *(
                MigrationProgressed(meta("worker"), migration, 500 * i, f"token-{i}")
                for i in range(1, 4)
            ),
            MigrationSucceeded(meta("worker"), migration, 2000),
        ]
        cluster.pending = steps
        return MigrationRequested(meta("migrator"), migration, group, name, version, target, "0:0")
    apiserver.renewed = now
    return ApiserverHeartbeat(
        meta(apiserver.id), apiserver.id, apiserver.holder, apiserver.host, 3600, now, "1.31"
    )
