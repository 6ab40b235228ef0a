"""Prometheus metrics of the long-running commands, and the endpoint that exposes them.

Every metric is defined here, once, in prometheus_client's default registry; the
shells (projector, consumers, collector, worker, read API) update them. Each process
exposes its own ``/metrics`` when started with ``--metrics-address HOST:PORT``
(:func:`serve_metrics`), so which command a series comes from is the scrape job's
label, not one of ours. docs/metrics.md lists them (a test keeps the two in step).

Counters are incremented per batch, not per event, so the hot path pays for a few
calls per batch however large it is.

Two kinds of gauge:

* Set as things happen: a reader's lag after each poll (:class:`ReaderLag`).
* Read from a fold when scraped (:class:`SampledGauge`): migrations by phase and
  heartbeat ages are functions of the state a consumer folds, and an age grows between
  events. Computing them at scrape time costs the hot path nothing and never shows a
  series the state no longer has (an expired lease, a partition handed to another
  member). The exposition server answers from a thread of its own; the fold belongs to
  the event loop, so the sample is taken on the loop, between two of its steps, and
  the scrape waits for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Final, TypeAlias

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# A scrape waits this long for a busy event loop to take a sample, then goes without it.
SAMPLE_TIMEOUT_SECONDS: Final = 5.0

Samples: TypeAlias = Iterable[tuple[Sequence[str], float]]


class SampledGauge(Collector):
    """A gauge whose samples a running consumer computes from its fold when scraped.

    The consumer lends a ``source`` for as long as it runs (:meth:`sampling`): a function
    of no arguments returning ``(label values, value)`` pairs. With several sources
    (two consumers in one process) a label set given by more than one shows the last's.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._sources: list[tuple[Callable[[], Samples], asyncio.AbstractEventLoop, int]] = []
        REGISTRY.register(self)

    @contextlib.contextmanager
    def sampling(self, source: Callable[[], Samples]) -> Iterator[None]:
        """Show ``source``'s samples while in the block; call it in a running event loop."""
        entry = (source, asyncio.get_running_loop(), threading.get_ident())
        self._sources.append(entry)
        try:
            yield
        finally:
            self._sources.remove(entry)

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> list[GaugeMetricFamily]:
        samples: dict[tuple[str, ...], float] = {}
        for source, loop, thread in list(self._sources):
            taken = _on_loop(source, loop, thread)
            samples.update((tuple(labels), value) for labels, value in taken)
        family = self._family()
        for labels, value in sorted(samples.items()):
            family.add_metric(labels, value)
        return [family]

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)


def _on_loop(
    source: Callable[[], Samples], loop: asyncio.AbstractEventLoop, thread: int
) -> list[tuple[Sequence[str], float]]:
    """``source()`` run on ``loop`` (whose thread is ``thread``); [] if it cannot be."""
    if threading.get_ident() == thread:
        return list(source())  # scraped from the loop itself (a test): no hand-over
    taken: concurrent.futures.Future[list[tuple[Sequence[str], float]]] = (
        concurrent.futures.Future()
    )

    def take() -> None:
        try:
            taken.set_result(list(source()))
        except Exception as error:
            taken.set_exception(error)

    try:
        loop.call_soon_threadsafe(take)
    except RuntimeError:  # the loop has closed since
        return []
    try:
        return taken.result(SAMPLE_TIMEOUT_SECONDS)
    except TimeoutError:
        log.warning("a metrics sample took over %.0f s; scraped without it", SAMPLE_TIMEOUT_SECONDS)
        return []
    except Exception:
        log.exception("a metrics sample failed; scraped without it")
        return []


# --------------------------------------------------------------------------- readers

# A counter's creation time as a series of its own (``*_created``) doubles the series
# for nothing a rate or an increase needs.
disable_created_metrics()  # type: ignore[no-untyped-call]

CONSUMER_LAG: Final = Gauge(
    "svledger_consumer_lag_records",
    "Records of a partition a reader has yet to read: the partition's last stable offset "
    "minus the reader's position.",
    ["reader", "partition"],
)
EVENTS_FOLDED: Final = Counter(
    "svledger_events_folded_total", "Events folded into a reader's views.", ["reader"]
)
EVENTS_REJECTED: Final = Counter(
    "svledger_events_rejected_total",
    "Events the fold rejected, with a reason kept in the views (rejected_events).",
    ["reader"],
)
RECORDS_DEAD_LETTERED: Final = Counter(
    "svledger_records_dead_lettered_total",
    "Undecodable records copied to the dead-letter topic.",
    ["topic"],
)
ADMISSION_REFUSED: Final = Counter(
    "svledger_admission_refused_total",
    "Inbox records admission refused (sent to the dead-letter topic), by the rule broken.",
    ["rule"],
)
EVENTS_APPENDED: Final = Counter(
    "svledger_events_appended_total",
    "Events a consumer appended to the log (committed transactions), by event type.",
    ["reader", "type"],
)

COLLECTED_CLUSTERS: Final = Gauge(
    "svledger_collector_clusters",
    "Clusters a collector process collects now: those whose partitions its group gives it.",
    ["group"],
)


class ReaderLag:
    """One reader's series of ``svledger_consumer_lag_records``.

    :meth:`set` replaces them all, so a partition the reader no longer reads (revoked
    in a rebalance) leaves the metric instead of showing its last lag for ever.
    """

    def __init__(self, reader: str) -> None:
        self.reader = reader
        self._partitions: set[int] = set()

    def set(self, lags: Mapping[int, int]) -> None:
        for partition in self._partitions - lags.keys():
            with contextlib.suppress(KeyError):  # a namesake reader removed it already
                CONSUMER_LAG.remove(self.reader, str(partition))
        for partition, lag in lags.items():
            CONSUMER_LAG.labels(self.reader, str(partition)).set(lag)
        self._partitions = set(lags)

    def clear(self) -> None:
        self.set({})


# --------------------------------------------------------------------------- consumers

MIGRATIONS: Final = SampledGauge(
    "svledger_migrations",
    "Migrations of each cluster by phase, in the migrator's fold of its partitions.",
    ["cluster", "phase"],
)
AGREEMENT: Final = SampledGauge(
    "svledger_storage_version_agreement",
    "Each StorageVersion's AllEncodingVersionsEqual condition in the migrator's fold: 1 for "
    "its status (True, False, Unknown), by cluster and resource.",
    ["cluster", "resource", "status"],
)
UNREPORTED_APISERVERS: Final = SampledGauge(
    "svledger_storage_version_unreported_apiservers",
    "Apiservers holding a live lease without an entry in a StorageVersion, in the "
    "migrator's fold: above 0, agreement on the resource is unknown.",
    ["cluster", "resource"],
)
SOURCE_CONFLICTS: Final = SampledGauge(
    "svledger_storage_version_source_conflicts",
    "Apiservers whose sources (discovery, StorageVersion object) name different encoding "
    "versions of a resource, in the migrator's fold.",
    ["cluster", "resource"],
)
STORED_VERSIONS_REMOVABLE: Final = SampledGauge(
    "svledger_stored_versions_removable",
    "Versions of a CustomResourceDefinition's status.storedVersions that the migrator's fold "
    "proves no object is stored in: they can be pruned, then dropped from spec.versions.",
    ["cluster", "resource"],
)
STORED_VERSIONS_UNSAFE_PRUNES: Final = SampledGauge(
    "svledger_stored_versions_unsafe_prunes",
    "1 for a CustomResourceDefinition whose status.storedVersions lost a version while the "
    "ledger held that objects may still be stored in it, until a migration proves the store.",
    ["cluster", "resource"],
)
POLLUTED_OBJECTS: Final = SampledGauge(
    "svledger_storage_polluted_objects",
    "Objects the last audit of the store found in versions the ledger holds none can be stored "
    "in (svledger audit), in the migrator's fold.",
    ["cluster", "resource"],
)
REACTION_SECONDS: Final = Histogram(
    "svledger_reaction_seconds",
    "From the time of the event that made a resource's apiservers agree to the commit of "
    "the MigrationRequested it caused.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
HEARTBEAT_AGE_SECONDS: Final = SampledGauge(
    "svledger_heartbeat_age_seconds",
    "Seconds since each live apiserver lease was last renewed, in lease GC's fold, now.",
    ["cluster", "apiserver"],
)
WORKER_RETRIES: Final = Counter(
    "svledger_worker_retries_total",
    "Calls to a migration target the worker retried, by why.",
    ["reason"],
)
KUBE_REQUESTS: Final = Counter(
    "svledger_kube_requests_total",
    "Requests to a Kubernetes API server (collector, worker) by verb, resource and HTTP "
    "code (0: no answer).",
    ["verb", "resource", "code"],
)


# --------------------------------------------------------------------------- exposition


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9090`` for IPv6); raises ValueError naming the value."""
    host, _, port = text.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT, e.g. 127.0.0.1:9090")
    return host.strip("[]"), int(port)


def format_address(host: str, port: int) -> str:
    """``HOST:PORT`` as :func:`parse_address` reads it and URLs write it (``[::1]:9090``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve_metrics(address: str) -> tuple[str, int]:
    """Expose ``/metrics`` on ``address`` (port 0: any free one) from a background thread.

    Returns the bound host and port, and logs them (``metrics_address``). Raises
    ValueError for an address that is not ``HOST:PORT``, OSError when it cannot listen.
    """
    host, port = parse_address(address)
    server, _ = start_http_server(port, addr=host)
    port = int(server.server_port)
    shown = format_address(host, port)
    log.info("metrics on http://%s/metrics", shown, extra={"metrics_address": shown})
    return host, port
