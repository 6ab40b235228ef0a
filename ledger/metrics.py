"""Prometheus metrics of the long-running commands, and the endpoint that exposes them.

Every metric is defined here, once, in prometheus_client's default registry; the
shells (projector, consumers, collector, worker, read API) update them. Each process
exposes its own ``/metrics`` when started with ``--metrics-address HOST:PORT``
(:func:`serve_metrics`), so which command a series comes from is the scrape job's
label, not one of ours. docs/metrics.md lists them (a test keeps the two in step).

Counters are incremented per batch, not per event, so the hot path pays for a few
calls per batch however large it is.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram, start_http_server

CONSUMER_LAG: Final = Gauge(
    "svledger_consumer_lag_records",
    "Records between where a reader is in a partition and the partition's end.",
    ["reader", "partition"],
)
EVENTS_FOLDED: Final = Counter(
    "svledger_events_folded_total", "Events folded into a reader's views.", ["reader"]
)
EVENTS_REJECTED: Final = Counter(
    "svledger_events_rejected_total",
    "Events the fold rejected, with a reason kept in the views (ledger_rejections).",
    ["reader"],
)
RECORDS_DEAD_LETTERED: Final = Counter(
    "svledger_records_dead_lettered_total",
    "Undecodable records copied to the dead-letter topic.",
    ["topic"],
)
MIGRATIONS: Final = Gauge(
    "svledger_migrations", "Migrations in the projector's views, by phase.", ["phase"]
)
REACTION_SECONDS: Final = Histogram(
    "svledger_reaction_seconds",
    "From the time of the event that made a resource's apiservers agree to the commit of "
    "the MigrationRequested it caused.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
HEARTBEAT_AGE_SECONDS: Final = Gauge(
    "svledger_heartbeat_age_seconds",
    "Seconds since an apiserver's lease was last renewed, as lease GC last looked.",
    ["cluster", "apiserver"],
)
KUBE_REQUESTS: Final = Counter(
    "svledger_kube_requests_total",
    "Calls to a Kubernetes API server (collector, worker), by verb and HTTP code (0: no answer).",
    ["verb", "code"],
)
PHASES: Final = ("Pending", "Running", "Succeeded", "Failed", "Cancelled")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9090`` for IPv6); raises ValueError naming the value."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT, e.g. 127.0.0.1:9090")
    return host.strip("[]"), int(port)


def serve_metrics(address: str) -> tuple[str, int]:
    """Expose ``/metrics`` on ``address`` (port 0: any free one) from a background thread.

    Returns the bound host and port.
    """
    host, port = parse_address(address)
    server, _ = start_http_server(port, addr=host)
    return host, int(server.server_port)
