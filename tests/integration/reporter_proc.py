"""An API server stand-in: runs one Reporter until killed, for tests that kill a process.

    python reporter_proc.py BOOTSTRAP TOPIC CLUSTER HOSTNAME HEARTBEAT_INTERVAL

Prints ``ready <apiserver-id>`` once the reporter is ready, then heartbeats forever.
"""

from __future__ import annotations

import asyncio
import sys

from ledger.kafka import EventProducer
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings

RESOURCES = (
    ResourceReport("apps", "deployments", "Deployment", "apps/v1", ("apps/v1",), ("apps/v1",)),
    ResourceReport("", "pods", "Pod", "v1", ("v1",), ("v1",)),
)


async def main(bootstrap: str, topic: str, cluster: str, hostname: str, interval: str) -> None:
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic=topic)
    async with EventProducer(settings) as producer:
        reporter = Reporter(
            cluster, hostname, RESOURCES, producer, heartbeat_interval=float(interval), jitter=0
        )
        await reporter.start()
        print("ready", reporter.apiserver_id, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
