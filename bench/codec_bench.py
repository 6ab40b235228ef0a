"""Encode and decode throughput of the Avro codec over a realistic mix of events.

The mix is what a live log holds: mostly heartbeats (every API server, every 10 s),
some storage version reports, and a trickle of lease, reset and migration events.
Prints one JSON object: events per second for encode and for decode (best of
``--rounds`` passes over the same events), and the mean record size.

    .venv/bin/python -m bench.codec_bench [--events 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import fastavro

from ledger import codec
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    Event,
    Meta,
    MigrationCancelled,
    MigrationFailed,
    MigrationProgressed,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
    type_name,
)
from ledger.hashing import storage_version_hash
from ledger.identity import apiserver_id, holder_identity

CLUSTERS = [f"cluster-{i}" for i in range(20)]
HOSTS = [f"cp-{i}.example.internal" for i in range(3)]
RESOURCES = [
    ("", "pods", "Pod"),
    ("", "configmaps", "ConfigMap"),
    ("apps", "deployments", "Deployment"),
    ("batch", "jobs", "Job"),
    ("networking.k8s.io", "ingresses", "Ingress"),
]
START = datetime(2024, 1, 1, tzinfo=UTC)


def mix(rng: random.Random) -> list[tuple[float, Callable[[Meta], Event]]]:
    """(weight, factory) for each kind of event in a live log."""

    def server() -> tuple[str, str]:
        host = rng.choice(HOSTS)
        return host, apiserver_id(host)

    def resource() -> tuple[str, str, str]:
        return rng.choice(RESOURCES)

    def heartbeat(meta: Meta) -> Event:
        host, ident = server()
        return ApiserverHeartbeat(
            meta, ident, holder_identity(ident), host, 3600, meta.occurred_at, "v1.31.2"
        )

    def reported(meta: Meta) -> Event:
        group, name, kind = resource()
        return StorageVersionReported(
            meta, server()[1], group, name, kind, "v1", ("v1", "v1beta1"), ("v1", "v1beta1")
        )

    def requested(meta: Meta) -> Event:
        group, name, kind = resource()
        return MigrationRequested(
            meta,
            str(uuid.UUID(int=rng.getrandbits(128))),
            group,
            name,
            "v1",
            storage_version_hash(group, "v1", kind),
            f"{rng.randrange(12)}:{rng.randrange(10**9)}",
        )

    def step(cls: type[MigrationProgressed] | type[MigrationStarted]) -> Callable[[Meta], Event]:
        return lambda meta: cls(
            meta,
            str(uuid.UUID(int=rng.getrandbits(128))),
            rng.randrange(10**6),
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzfQ",
        )

    return [
        (80.0, heartbeat),
        (12.0, reported),
        (1.0, lambda meta: ApiserverLeaseReleased(meta, server()[1], holder_identity("x"))),
        (
            1.0,
            lambda meta: ApiserverLeaseExpired(meta, server()[1], meta.occurred_at, 3600),
        ),
        (1.0, lambda meta: StorageVersionWithdrawn(meta, server()[1], *resource()[:2])),
        (0.5, lambda meta: StorageStateReset(meta, *resource()[:2], "restored from backup")),
        (1.0, requested),
        (0.5, step(MigrationStarted)),
        (2.0, step(MigrationProgressed)),
        (0.5, lambda meta: MigrationSucceeded(meta, "m", 1200)),
        (0.25, lambda meta: MigrationFailed(meta, "m", 500, "tok", "Timeout", "list timed out")),
        (0.25, lambda meta: MigrationCancelled(meta, "m", 0, None, "EncodingVersionsDisagree")),
    ]


def generate(count: int, seed: int) -> list[Event]:
    rng = random.Random(seed)
    weights, factories = zip(*mix(rng), strict=True)
    events = []
    for index, factory in enumerate(rng.choices(factories, weights, k=count)):
        meta = Meta(
            event_id=str(uuid.UUID(int=rng.getrandbits(128))),
            cluster=rng.choice(CLUSTERS),
            occurred_at=START + timedelta(microseconds=index * 10_017),
            source="bench",
            causation_id=None,
            correlation_id=None,
        )
        events.append(factory(meta))
    return events


def best_rate(count: int, rounds: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return count / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per pass")
    parser.add_argument("--rounds", type=int, default=3, help="passes; the best counts")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    events = generate(args.events, args.seed)
    encode, decode = codec.encode, codec.decode
    records = [encode(event) for event in events]  # also loads the schemas once
    assert [decode(record) for record in records[:1000]] == events[:1000]

    result = {
        "benchmark": "codec",
        "events": args.events,
        "encode_events_per_s": round(
            best_rate(args.events, args.rounds, lambda: [encode(e) for e in events])
        ),
        "decode_events_per_s": round(
            best_rate(args.events, args.rounds, lambda: [decode(r) for r in records])
        ),
        "mean_record_bytes": round(sum(map(len, records)) / len(records), 1),
        "mix": dict(Counter(type_name(event) for event in events).most_common()),
        "python": platform.python_version(),
        "fastavro": fastavro.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
