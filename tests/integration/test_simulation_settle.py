"""A simulation step ends only once every appended event has been read and reacted to.

The run judges "migrations while the apiservers disagreed" at the end of each step,
so the step must not end between a lease GC's expiry and the trigger's cancellation
that answers it. A transaction's commit returns before the broker has written its
markers, so for a moment the expiry is appended but not yet committed; the run's
reader must count such a record as still to come, not as the end of the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import yaml
from aiokafka import AIOKafkaProducer

from ledger.events import ApiserverHeartbeat, Meta
from ledger.kafka import connect, create_topics, to_record
from ledger.settings import KafkaSettings
from simulation import scenario
from simulation.checks import LogMirror
from simulation.run import VIRTUAL_START, simulate

CLUSTER = "settle"

# A history in which a migration is rightly requested on the word of a crashed
# apiserver (its lease is still live), then must be cancelled in the very step its
# lease expires, because no apiserver is left to agree on anything.
CRASH_AFTER_STOP = {
    "cluster": CLUSTER,
    "seed": 117253,
    "step_seconds": 30,
    "heartbeat_interval_seconds": 30,
    "lease_duration_seconds": 90,
    "lease_gc_check_period_seconds": 30,
    "requests_per_second": 0.2,
    "resources": [{"group": "example.com", "resource": "widgets", "kind": "Widget", "objects": 12}],
    "binaries": {
        "old": {"widgets.example.com": {"encoding": "v1", "decodable": ["v1", "v2"]}},
        "new": {"widgets.example.com": {"encoding": "v2", "decodable": ["v1", "v2"]}},
    },
    "apiservers": [
        {"hostname": "apiserver-1", "binary": "old"},
        {"hostname": "apiserver-2", "binary": "old"},
    ],
    "timeline": [
        {"at": 0, "start": ["apiserver-1", "apiserver-2"]},
        {"at": 3, "upgrade": "apiserver-2", "to": "new"},
        {"at": 4, "crash": "apiserver-2"},
        {"at": 4, "start": "apiserver-2"},
        {"at": 5, "crash": "apiserver-1"},
        {"at": 5, "stop": "apiserver-2"},
        {"at": 7, "end": True},
    ],
}


async def _eventually(condition: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(30):
        while not await condition():
            await asyncio.sleep(0.01)


async def test_a_record_of_an_open_transaction_is_still_to_be_read(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    await create_topics(settings)
    heartbeat = ApiserverHeartbeat(
        Meta.new(CLUSTER, "apiserver-a", VIRTUAL_START),
        "apiserver-a",
        "apiserver-a_1",
        "a",
        90,
        VIRTUAL_START,
    )
    producer = await connect(
        lambda: AIOKafkaProducer(
            **settings.client_kwargs(), transactional_id=f"{unique_topic}.txn"
        ),
        settings,
    )
    try:
        async with LogMirror(settings, CLUSTER) as mirror:
            await _eventually(mirror.caught_up)
            for outcome in ("abort", "commit"):
                await producer.begin_transaction()
                key, value, headers = to_record(heartbeat)
                await (await producer.send(unique_topic, value, key, headers=headers))
                assert not await mirror.caught_up()
                if outcome == "abort":
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
                await _eventually(mirror.caught_up)
                # The aborted record is never read; the committed one is.
                assert [r.event for r in mirror.records] == (
                    [heartbeat] if outcome == "commit" else []
                )
    finally:
        await producer.stop()


async def test_a_step_ends_only_after_the_trigger_answered_a_lease_expiry(
    kafka_bootstrap: str, unique_topic: str, postgres_url: str
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic=unique_topic, partitions=1)
    model = scenario.parse(yaml.safe_dump(CRASH_AFTER_STOP), "crash-after-stop")

    result = await simulate(model, settings, postgres_url, out=None)

    (requested,) = [
        r for r in result.rows if r.at_seconds > 0 and "migration to v1 requested" in r.events
    ]
    assert requested.encoding_versions == ("v1", None)  # the crashed apiserver-1 alone
    (expired,) = [r for r in result.rows if "lease of apiserver-1 expired" in r.events]
    assert expired.encoding_versions == (None, None)
    assert "migration to v1 cancelled: EncodingVersionsDisagree" in expired.events
    assert expired.migration == "Cancelled v1"
    assert result.migrations_while_disagreeing == ()
    assert result.polluted_objects == 0
