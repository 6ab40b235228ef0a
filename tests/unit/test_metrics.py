"""The metrics' own logic, without a broker: labels, lag series, samples taken from a fold."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from consumers.lease_gc import heartbeat_ages
from consumers.migrator import migrations_by_phase
from kube.client import request_labels
from ledger import metrics
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    Event,
    Meta,
    MigrationCancelled,
    MigrationRequested,
    MigrationStarted,
    Position,
)
from projections.fold import apply
from projections.state import State
from svledger.cli import build_parser

START = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("method", "path", "labels"),
    [
        ("GET", "/apis/apps/v1/namespaces/ns/deployments", ("list", "deployments.apps")),
        ("GET", "/apis/apps/v1/deployments?limit=500", ("list", "deployments.apps")),
        ("GET", "/apis/apps/v1/namespaces/ns/deployments/web", ("get", "deployments.apps")),
        ("PUT", "/apis/apps/v1/namespaces/ns/deployments/web", ("update", "deployments.apps")),
        ("PUT", "/apis/apps/v1/namespaces/n/deployments/w/status",
         ("update", "deployments.apps/status")),
        ("GET", "/api/v1/pods", ("list", "pods")),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", ("patch", "pods")),
        ("GET", "/api/v1/namespaces", ("list", "namespaces")),
        ("GET", "/api/v1/namespaces/kube-system", ("get", "namespaces")),
        ("PUT", "/api/v1/namespaces/kube-system/finalize", ("update", "namespaces/finalize")),
        ("POST", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations",
         ("create", "storageversionmigrations.storagemigration.k8s.io")),
        ("DELETE", "/apis/storagemigration.k8s.io/v1alpha1/storageversionmigrations/m",
         ("delete", "storageversionmigrations.storagemigration.k8s.io")),
        ("DELETE", "/api/v1/namespaces/ns/configmaps", ("deletecollection", "configmaps")),
        ("GET", "/api", ("get", "")),
        ("GET", "/api/v1", ("get", "")),
        ("GET", "/apis", ("get", "")),
        ("GET", "/apis/apps", ("get", "")),
        ("GET", "/apis/apps/v1", ("get", "")),
        ("GET", "/version", ("get", "")),
    ],
)  # fmt: skip
def test_a_request_is_named_as_the_apiserver_names_it(
    method: str, path: str, labels: tuple[str, str]
) -> None:
    assert request_labels(method, path) == labels


def lag(reader: str, partition: int) -> float | None:
    return REGISTRY.get_sample_value(
        "svledger_consumer_lag_records", {"reader": reader, "partition": str(partition)}
    )


def test_a_readers_lag_shows_only_the_partitions_it_reads_now() -> None:
    reader = metrics.ReaderLag("test-lag-reader")
    reader.set({0: 12, 1: 0})
    assert (lag("test-lag-reader", 0), lag("test-lag-reader", 1)) == (12, 0)
    reader.set({1: 3, 2: 7})  # partition 0 revoked, 2 assigned
    assert (lag("test-lag-reader", 0), lag("test-lag-reader", 1)) == (None, 3)
    assert lag("test-lag-reader", 2) == 7
    reader.clear()
    assert [lag("test-lag-reader", p) for p in (0, 1, 2)] == [None, None, None]


def sampled(name: str) -> dict[tuple[str, ...], float]:
    (family,) = [f for f in REGISTRY.collect() if f.name == name]
    return {tuple(s.labels.values()): s.value for s in family.samples}


async def test_a_sampled_gauge_shows_its_sources_while_they_run() -> None:
    first = metrics.MIGRATIONS.sampling(lambda: [(("a", "Pending"), 1), (("b", "Pending"), 2)])
    second = metrics.MIGRATIONS.sampling(lambda: [(("b", "Pending"), 5)])
    with first:
        with second:
            # A label set both give shows the later source's value.
            assert sampled("svledger_migrations") == {("a", "Pending"): 1, ("b", "Pending"): 5}
        assert sampled("svledger_migrations") == {("a", "Pending"): 1, ("b", "Pending"): 2}
    assert sampled("svledger_migrations") == {}


async def test_a_scrape_from_another_thread_takes_the_sample_on_the_event_loop() -> None:
    threads: list[int] = []

    def source() -> list[tuple[Sequence[str], float]]:
        threads.append(threading.get_ident())
        return [(("c", "Running"), 3)]

    with metrics.MIGRATIONS.sampling(source):
        scraped = await asyncio.to_thread(sampled, "svledger_migrations")
    assert scraped == {("c", "Running"): 3}
    assert threads == [threading.get_ident()]


async def test_a_scrape_does_not_wait_for_ever_on_a_busy_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "SAMPLE_TIMEOUT_SECONDS", 0.05)
    scraped = threading.Event()

    def scrape() -> dict[tuple[str, ...], float]:
        try:
            return sampled("svledger_migrations")
        finally:
            scraped.set()

    with metrics.MIGRATIONS.sampling(lambda: [(("c", "Running"), 3)]):
        scraper = asyncio.get_running_loop().run_in_executor(None, scrape)
        # The loop stays blocked until the scrape has returned: it cannot take the sample.
        assert scraped.wait(30)
        assert await scraper == {}


def folded(events: Sequence[Event]) -> State:
    state = State()
    for offset, event in enumerate(events):
        apply(state, event, Position(0, offset))
    return state


def heartbeat(cluster: str, apiserver: str, renewed: datetime) -> ApiserverHeartbeat:
    meta = Meta.new(cluster, apiserver, renewed)
    return ApiserverHeartbeat(meta, apiserver, f"{apiserver}_x", apiserver, 3600, renewed)


def test_heartbeat_ages_are_those_of_the_live_leases_now() -> None:
    renewed = START + timedelta(seconds=10)
    state = folded(
        [
            heartbeat("east", "a", START),
            heartbeat("east", "b", START),
            heartbeat("west", "a", START),
            heartbeat("east", "a", renewed),
            ApiserverLeaseExpired(Meta.new("east", "gc", renewed), "b", START, 3600),
        ]
    )
    assert heartbeat_ages(state, START + timedelta(seconds=25)) == {
        ("east", "a"): 15.0,
        ("west", "a"): 25.0,
    }


def requested(cluster: str, migration_id: str) -> MigrationRequested:
    meta = Meta.new(cluster, "migrator", START)
    return MigrationRequested(meta, migration_id, "", "pods", "v1", "h", "0:0")


def test_migrations_are_counted_by_cluster_and_phase_zeros_included() -> None:
    state = folded(
        [
            requested("east", "m1"),
            requested("east", "m2"),
            requested("west", "m3"),
            MigrationStarted(Meta.new("east", "worker", START), "m1"),
            MigrationCancelled(Meta.new("west", "migrator", START), "m3", 0, None, "R", "r"),
        ]
    )
    assert migrations_by_phase(state) == {
        ("east", "Pending"): 1,
        ("east", "Running"): 1,
        ("east", "Succeeded"): 0,
        ("east", "Failed"): 0,
        ("east", "Cancelled"): 0,
        ("west", "Pending"): 0,
        ("west", "Running"): 0,
        ("west", "Succeeded"): 0,
        ("west", "Failed"): 0,
        ("west", "Cancelled"): 1,
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["project"],
        ["serve"],
        ["lease-gc"],
        ["migrator"],
        ["worker", "--cluster", "east"],
        ["collect", "--cluster", "east"],
    ],
)
def test_every_long_running_command_takes_a_metrics_address(argv: list[str]) -> None:
    args = build_parser().parse_args([*argv, "--metrics-address", "127.0.0.1:0"])
    assert args.metrics_address == "127.0.0.1:0"


@pytest.mark.parametrize(
    ("host", "port", "written"),
    [("127.0.0.1", 9090, "127.0.0.1:9090"), ("::1", 0, "[::1]:0"), ("svledger", 80, "svledger:80")],
)
def test_an_address_is_written_as_it_is_read(host: str, port: int, written: str) -> None:
    # The logged address of serve and of the metrics endpoint: an IPv6 host in brackets.
    assert metrics.format_address(host, port) == written
    assert metrics.parse_address(written) == (host, port)
