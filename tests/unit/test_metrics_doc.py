"""docs/metrics.md lists every metric ledger/metrics.py defines, as defined."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

from ledger import metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def defined() -> dict[str, tuple[str, tuple[str, ...]]]:
    found = {}
    for value in vars(metrics).values():
        if hasattr(value, "_labelnames") and hasattr(value, "_type"):
            name = value._name
            if value._type == "counter":
                name += "_total"
            found[name] = (value._type, tuple(value._labelnames))
    return found


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = re.findall(r"^\| `(svledger_\w+)` \| (\w+) \|([^|]*)\|", DOC.read_text(), re.M)
    return {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    assert documented() == defined()


def test_the_metrics_are_registered_for_exposition() -> None:
    exposed = {metric.name for metric in REGISTRY.collect()}
    for name, (kind, _) in defined().items():
        assert (name.removesuffix("_total") if kind == "counter" else name) in exposed
