"""The KEP's case walkthrough on the real broker and real PostgreSQL, with both triggers."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest

from ledger.settings import KafkaSettings
from simulation import scenario
from simulation.report import SimulationResult, TimelineRow
from simulation.run import SimulationError, simulate
from simulation.scenario import Restart

WALKTHROUGH = Path(__file__).resolve().parents[2] / "examples" / "kep-walkthrough.yaml"


@pytest.fixture
def settings(kafka_bootstrap: str, unique_topic: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)


def minutes_of(kind: str, hostname: str) -> list[int]:
    """When the walkthrough file restarts ``hostname`` with an upgrade or a rollback."""
    return [
        entry.at_seconds
        for entry in scenario.load(WALKTHROUGH).timeline
        if isinstance(entry.action, Restart)
        and entry.action.kind == kind
        and entry.action.hostname == hostname
    ]


def rows_with(result: SimulationResult, words: str) -> list[TimelineRow]:
    return [row for row in result.rows if any(words in event for event in row.events)]


async def test_the_walkthrough_migrates_only_while_all_apiservers_agree(
    settings: KafkaSettings, postgres_url: str
) -> None:
    out = io.StringIO()
    result = await simulate(WALKTHROUGH, settings, postgres_url, out=out)

    last_upgrade_of_3, reupgrade_of_3 = minutes_of("upgrade", "apiserver-3")
    (rollback_of_3,) = minutes_of("rollback", "apiserver-3")
    # Every row with a migration in flight shows the apiservers agreeing on its target.
    for row in result.rows:
        if row.migration is not None and row.migration.split()[0] in ("Pending", "Running"):
            assert row.common_version == row.migration.split()[1], row
    # The migration to v2 starts once all three run v2, not during the rolling upgrade.
    requested = [row.at_seconds for row in rows_with(result, "migration to v2 requested")]
    assert requested and min(requested) == last_upgrade_of_3
    # The rollback of apiserver 3 cancels it: its restart is a new lease, whose versions
    # are unknown until it reports, and then disagree. Which of the two the trigger sees
    # first is up to how its polls split the events of that instant (simulation.run).
    cancelled = rows_with(result, "cancelled: EncodingVersionsUnknown")
    cancelled += rows_with(result, "cancelled: EncodingVersionsDisagree")
    assert rollback_of_3 in [row.at_seconds for row in cancelled]
    assert not [t for t in requested if rollback_of_3 < t < reupgrade_of_3]
    # The second upgrade restarts it, and it succeeds: persisted hashes are just v2.
    assert reupgrade_of_3 in requested
    (success,) = [
        row.at_seconds
        for row in rows_with(result, "migration to v2 succeeded")
        if row.persisted_versions == ("v2",)
    ]
    assert success > reupgrade_of_3
    assert result.final_persisted_versions == {"deployments.apps": ("v2",)}
    assert set(result.final_stored["deployments.apps"]) == {"v2"}
    # The pollution check: nothing outside the persisted hashes, no migration under disagreement.
    assert result.polluted_objects == 0
    assert result.ledger_polluted_objects == 0
    assert result.migrations_while_disagreeing == ()
    printed = out.getvalue()
    assert "| time | what happened | apiserver-1 | apiserver-2 | apiserver-3 |" in printed
    assert "outside the persisted hashes (worst after any step): 0" in printed


async def test_the_discovery_hash_trigger_pollutes_the_same_walkthrough(
    settings: KafkaSettings, postgres_url: str
) -> None:
    result = await simulate(WALKTHROUGH, settings, postgres_url, trigger="discovery-hash", out=None)

    # The old trigger believed every object was in v2 while some were still in v1 ...
    assert result.polluted_objects > 0
    polluted_rows = [row for row in result.rows if row.polluted]
    assert polluted_rows
    assert all(row.baseline_persisted_versions == ("v2",) for row in polluted_rows)
    assert all(row.stored.get("v1", 0) >= row.polluted for row in polluted_rows)
    # ... while the ledger's StorageState, which refuses stale successes, stayed truthful.
    assert result.ledger_polluted_objects == 0
    stored = result.final_stored["deployments.apps"]
    persisted = result.final_persisted_versions["deployments.apps"]
    assert set(stored) <= set(persisted)


async def test_a_cluster_is_simulated_only_once_per_topic(
    settings: KafkaSettings, postgres_url: str, tmp_path: Path
) -> None:
    short = tmp_path / "short.yaml"
    short.write_text(
        WALKTHROUGH.read_text().split("timeline:")[0]
        + "timeline:\n  - {at: 0, start: apiserver-1}\n  - {at: 0.5, end: true}\n"
    )
    await simulate(short, settings, postgres_url, out=None)
    with pytest.raises(SimulationError, match="cluster 'kep-walkthrough' already has events"):
        await simulate(short, settings, postgres_url, out=None)
    argv = ["simulate", str(short), "--bootstrap", settings.bootstrap_servers]
    argv += ["--topic", settings.topic, "--db", postgres_url]
    again = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "svledger", *argv, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await again.communicate()
    assert again.returncode == 2, stderr  # 1 says the simulation found pollution
    assert b"already has events" in stderr and b"Traceback" not in stderr
