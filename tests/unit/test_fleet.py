"""Reading a fleet (``svledger collect --fleet PATH``): which clusters, named how, reached how."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
import yaml

from kube.fleet import Fleet, FleetCluster, FleetError, read_fleet
from ledger.logcontext import ClusterField, about
from svledger.cli import JsonLinesFormatter


def kubeconfig(*contexts: str, current: str | None = None) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": c, "cluster": {"server": f"https://{c}:6443"}} for c in contexts],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": c, "context": {"cluster": c, "user": "u"}} for c in contexts],
            "current-context": current or (contexts[0] if contexts else ""),
        }
    )


def test_each_context_of_a_kubeconfig_is_a_cluster_named_by_it(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(kubeconfig("prod-eu-1", "prod-us-1"))
    assert read_fleet(str(path)) == {
        "prod-eu-1": FleetCluster("prod-eu-1", str(path), "prod-eu-1"),
        "prod-us-1": FleetCluster("prod-us-1", str(path), "prod-us-1"),
    }


def test_each_kubeconfig_of_a_directory_is_a_cluster_named_by_its_file(tmp_path: Path) -> None:
    for name in ("prod-eu-1.yaml", "prod-us-1.kubeconfig", "staging"):
        (tmp_path / name).write_text(kubeconfig("admin@x"))
    (tmp_path / "..data").mkdir()  # a mounted Secret's bookkeeping
    (tmp_path / ".hidden.yaml").write_text(kubeconfig("admin@x"))
    fleet = read_fleet(str(tmp_path))
    assert fleet == {
        name: FleetCluster(name, str(tmp_path / file), None)
        for name, file in [
            ("prod-eu-1", "prod-eu-1.yaml"),
            ("prod-us-1", "prod-us-1.kubeconfig"),
            ("staging", "staging"),
        ]
    }


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ({}, "holds no kubeconfig file; put one per cluster in it"),
        ({"a.yaml": "", "a.yml": ""}, "a.yaml and a.yml both name cluster 'a'; keep one"),
    ],
)
def test_a_directory_that_names_no_cluster_or_one_twice_is_refused(
    tmp_path: Path, files: dict[str, str], named: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(FleetError, match=named) as refused:
        read_fleet(str(tmp_path))
    assert f"--fleet {tmp_path}" in str(refused.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("clusters: [", "cannot read it as a kubeconfig"),
        ("- a\n- b\n", "it is not a kubeconfig"),
        (kubeconfig(), "has no named contexts"),
        ("contexts:\n- name: a\n- context: {}\n", "has no named contexts"),
        ("contexts:\n- name: a\n- name: a\n", "context 'a' is defined twice"),
    ],
)
def test_a_kubeconfig_that_names_no_cluster_is_refused(
    tmp_path: Path, text: str, named: str
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(FleetError, match=named):
        read_fleet(str(path))


def test_a_fleet_read_again_keeps_the_source_of_each_cluster_read_as_before(
    tmp_path: Path,
) -> None:
    """A collector restarts only the clusters whose source changed (kube.collector)."""
    (tmp_path / "a.yaml").write_text(kubeconfig("x"))
    (tmp_path / "b.yaml").write_text(kubeconfig("y"))
    fleet = Fleet(str(tmp_path), asyncio.Semaphore(1))
    first = fleet.read()
    (tmp_path / "b.yaml").unlink()
    (tmp_path / "c.yaml").write_text(kubeconfig("z"))
    second = fleet.read()
    assert second.keys() == {"a", "c"}
    assert second["a"] is first["a"]
    assert second["a"].owned and not second["a"].apiservers


def test_records_logged_about_a_cluster_name_it_in_json_and_in_text() -> None:
    record = logging.makeLogRecord({"msg": "the watch ended", "levelno": logging.WARNING})
    field = ClusterField()
    with about("prod-eu-1"):
        assert field.filter(record)
    assert json.loads(JsonLinesFormatter().format(record))["cluster"] == "prod-eu-1"
    assert "cluster_tag" not in json.loads(JsonLinesFormatter().format(record))
    text = logging.Formatter("%(cluster_tag)s%(message)s")
    assert text.format(record) == "[prod-eu-1] the watch ended"
    untagged = logging.makeLogRecord({"msg": "started"})
    assert field.filter(untagged)
    assert text.format(untagged) == "started"
    assert "cluster" not in json.loads(JsonLinesFormatter().format(untagged))
