"""Random HA histories: the agreement trigger never pollutes and never migrates under disagreement.

Hypothesis draws scenarios of two or three apiservers going through rolling upgrades,
rollbacks, crashes (whose leases the lease GC must expire), graceful stops, restarts
and client writes, with short leases and GC periods so expiries happen within a few
virtual minutes. Each one runs on the real broker (a topic of its own) and real
PostgreSQL (a database of its own, copied from a migrated template so a run does not
pay for the schema migrations). The run's own checks are the assertions: after every
step no object is stored in a version outside the persisted hashes, and no migration
was requested or left running while the apiservers disagreed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from sqlalchemy.engine import URL

from ledger.settings import KafkaSettings
from projections import database
from simulation import scenario
from simulation.run import simulate

pytestmark = pytest.mark.slow

RUNS = 48
#: The runs are drawn in shards, each its own test: a parallel run deals them to several
#: workers (each shard draws its own examples; together they make ``RUNS``).
SHARDS = 4

BINARIES = {
    "old": {"widgets.example.com": {"encoding": "v1", "decodable": ["v1", "v2"]}},
    "new": {"widgets.example.com": {"encoding": "v2", "decodable": ["v1", "v2"]}},
}


@st.composite
def histories(draw: st.DrawFn) -> dict[str, Any]:
    """A valid scenario as the YAML document a user would write."""
    hosts = [f"apiserver-{i}" for i in range(1, draw(st.integers(2, 3)) + 1)]
    running = set(hosts)
    binary = dict.fromkeys(hosts, "old")
    timeline: list[dict[str, Any]] = [{"at": 0, "start": hosts}]
    span = draw(st.integers(4, 9))
    for at in range(1, span):
        for _ in range(draw(st.integers(0, 2))):
            host = draw(st.sampled_from(hosts))
            choices = ["write", "switch"] + (["crash", "stop"] if host in running else ["start"])
            action = draw(st.sampled_from(choices))
            if action == "write":
                timeline.append(
                    {"at": at, "write": "widgets.example.com", "count": draw(st.integers(1, 6))}
                )
            elif action == "switch":
                if binary[host] == "old":
                    timeline.append({"at": at, "upgrade": host, "to": "new"})
                    binary[host] = "new"
                else:
                    timeline.append({"at": at, "rollback": host})
                    binary[host] = "old"
                running.add(host)
            elif action == "start":
                timeline.append({"at": at, "start": host})
                running.add(host)
            else:
                timeline.append({"at": at, action: host})
                running.discard(host)
    timeline.append({"at": span, "end": True})
    return {
        "cluster": f"random-{uuid.uuid4().hex[:12]}",
        "seed": draw(st.integers(0, 2**32)),
        "step_seconds": 30,
        "heartbeat_interval_seconds": 30,
        "lease_duration_seconds": 90,
        "lease_gc_check_period_seconds": 30,
        "requests_per_second": draw(st.sampled_from([None, 0.2, 1])),
        "resources": [
            {
                "group": "example.com",
                "resource": "widgets",
                "kind": "Widget",
                "objects": draw(st.integers(3, 12)),
            }
        ],
        "binaries": BINARIES,
        "apiservers": [{"hostname": h, "binary": "old"} for h in hosts],
        "timeline": timeline,
    }


def _admin(server: URL) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        server.set(drivername="postgresql").render_as_string(hide_password=False), autocommit=True
    )


@pytest.fixture(scope="module")
def template(postgres_server: URL) -> Iterator[str]:
    """A migrated database that every run's database is copied from."""
    name = f"svledger_simulation_template_{uuid.uuid4().hex}"
    with _admin(postgres_server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = postgres_server.set(database=name).render_as_string(hide_password=False)
    database.upgrade(url)
    try:
        yield name
    finally:
        with _admin(postgres_server) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.mark.parametrize("shard", range(SHARDS))
@settings(
    max_examples=RUNS // SHARDS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(document=histories())
def test_agreement_trigger_never_pollutes_nor_migrates_under_disagreement(
    shard: int, document: dict[str, Any], kafka_bootstrap: str, postgres_server: URL, template: str
) -> None:
    model = scenario.parse(yaml.safe_dump(document), "generated")
    name = f"svledger_simulation_{uuid.uuid4().hex}"
    with _admin(postgres_server) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    try:
        result = asyncio.run(
            simulate(
                model,
                KafkaSettings(
                    bootstrap_servers=kafka_bootstrap,
                    topic=f"svledger-test.simulation.{uuid.uuid4().hex}",
                    partitions=1,
                ),
                postgres_server.set(database=name).render_as_string(hide_password=False),
                out=None,
            )
        )
    finally:
        with _admin(postgres_server) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    assert result.polluted_objects == 0, result.rows
    assert result.migrations_while_disagreeing == (), result.rows
