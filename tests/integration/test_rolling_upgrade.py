"""The seeds' claim on real binaries: a rolling upgrade v1.36.3 -> v1.37.2, checked in etcd.

MutatingAdmissionPolicy(Binding) moves its storage version from v1beta1 to v1 between
these releases; clients keep creating such objects through every apiserver while the
apiservers are upgraded one by one (``deploy/kube/rolling_upgrade.py``). The apiservers
are stock (no StorageVersion API, protobuf in etcd): svledger knows what each encodes in
from its own discovery only. With the ledger's agreement trigger, with either executor,
etcd ends with every object in v1, no migration was requested on a disagreement and
none succeeded while the apiservers disagreed. The old discovery-hash trigger believes
the resource migrated while etcd still holds objects in v1beta1.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from deploy.kube.rolling_upgrade import NEW_VERSION, Result, run
from ledger.settings import KafkaSettings

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes]


async def upgrade(bootstrap: str, trigger: str, executor: str, tmp_path: Path) -> Result:
    topic = f"svledger-test.rolling-upgrade.{uuid.uuid4().hex[:8]}"
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic=topic, partitions=3)
    return await run(settings, trigger, executor, tmp_path)


@pytest.mark.parametrize("executor", ["rewrite", "storagemigration"])
async def test_the_agreement_trigger_leaves_no_object_behind(
    executor: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    result = await upgrade(kafka_bootstrap, "agreement", executor, tmp_path)

    assert result.written > 20  # clients wrote through the whole upgrade
    for resource, stored in result.stored.items():
        assert set(stored) == {NEW_VERSION}, (resource, stored)
        assert result.believed_migrated[resource]
        assert result.succeeded[resource] >= 1
    assert result.left_behind == 0
    assert result.migrations_while_disagreeing == []
    assert result.views_match_apiservers
    for resource, (before, after) in result.audits.items():
        # svledger audit counts what etcd holds, as read here; the store is as the ledger
        # says before and after, so neither is pollution.
        assert dict(zip(after[0].versions, after[0].version_counts, strict=True)) == dict(
            result.stored[resource]
        )
        assert after[1] == (NEW_VERSION,)
        assert before[0].objects > 0 and not before[0].polluted_versions
        assert not after[0].polluted_versions


async def test_the_discovery_hash_trigger_believes_a_polluted_migration_done(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    result = await upgrade(kafka_bootstrap, "discovery-hash", "rewrite", tmp_path)

    assert all(result.believed_migrated.values())
    assert result.left_behind > 0  # objects the old apiservers wrote after its migration
    assert result.migrations_while_disagreeing != []
    # The audit finds them; the ledger never held them gone (the baseline's successes
    # came while the apiservers disagreed), so it is no contradiction of the ledger.
    found = sum(
        n
        for _, after in result.audits.values()
        for v, n in zip(after[0].versions, after[0].version_counts, strict=True)
        if v != NEW_VERSION
    )
    assert found == result.left_behind
    assert not any(after[0].polluted_versions for _, after in result.audits.values())
