"""svledger: an event-sourced ledger of Kubernetes storage versions.

The public face for API servers that embed the reporter::

    from svledger import EventProducer, KafkaSettings, Reporter, ResourceReport, create_topics

Everything named in ``__all__`` is stable API; the packages below it (``ledger``,
``projections``, ``consumers``, ``kube``, ``simulation``) are the implementation. The
names load on first use, so the command line (``svledger.cli``) starts without Kafka.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ledger.errors import SvledgerError, Unavailable, UsageError
    from ledger.gate import WriteGate, WriteGateMiddleware
    from ledger.kafka import EventProducer, create_topics
    from ledger.reporter import Reporter, ReporterOptions, ResourceReport, ThreadedReporter
    from ledger.settings import KafkaSettings
    from ledger.validation import InvalidReport

_HOMES: Final = {
    "Reporter": "ledger.reporter",
    "ReporterOptions": "ledger.reporter",
    "ResourceReport": "ledger.reporter",
    "ThreadedReporter": "ledger.reporter",
    "WriteGate": "ledger.gate",
    "WriteGateMiddleware": "ledger.gate",
    "EventProducer": "ledger.kafka",
    "create_topics": "ledger.kafka",
    "KafkaSettings": "ledger.settings",
    "InvalidReport": "ledger.validation",
    "SvledgerError": "ledger.errors",
    "UsageError": "ledger.errors",
    "Unavailable": "ledger.errors",
}

__all__ = [
    "EventProducer",
    "InvalidReport",
    "KafkaSettings",
    "Reporter",
    "ReporterOptions",
    "ResourceReport",
    "SvledgerError",
    "ThreadedReporter",
    "Unavailable",
    "UsageError",
    "WriteGate",
    "WriteGateMiddleware",
    "create_topics",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'svledger' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
