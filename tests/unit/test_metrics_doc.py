"""docs/metrics.md lists every metric ledger/metrics.py defines, as defined, with an example."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from ledger import metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def defined() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each metric of ledger.metrics: its exposed name, type and label names."""
    found = {}
    for value in vars(metrics).values():
        if isinstance(value, metrics.SampledGauge):
            found[value.name] = ("gauge", value.labelnames)
        elif isinstance(value, MetricWrapperBase):
            # prometheus_client keeps a metric's definition in private attributes only.
            kind = str(value._type)
            name = value._name + ("_total" if kind == "counter" else "")
            found[name] = (kind, tuple(value._labelnames))
    return found


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = re.findall(r"^\| `(svledger_\w+)` \| (\w+) \|([^|]*)\|", DOC.read_text(), re.M)
    return {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    assert documented() == defined()


def test_every_metric_has_an_example_query() -> None:
    examples = DOC.read_text().partition("## Examples")[2]
    assert [name for name in defined() if name not in examples] == []


def test_the_exposition_parses_and_shows_every_metric() -> None:
    families = text_string_to_metric_families(generate_latest(REGISTRY).decode())
    exposed = {family.name: family.type for family in families}
    for name, (kind, _) in defined().items():
        assert exposed[name.removesuffix("_total") if kind == "counter" else name] == kind
