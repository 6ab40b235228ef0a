"""A projector in its own process, for tests that kill it.

``python -m tests.integration.projector_proc BOOTSTRAP TOPIC DB_URL [solo|group
[SNAPSHOT_EVERY]]`` projects without a consumer group (a restart after ``kill -9``
then need not wait for the broker to expire the dead member), or with ``group`` as a
member of the projection's consumer group, sharing the partitions with the other
members; it takes a fold snapshot every ``SNAPSHOT_EVERY`` offsets of a partition.
It stops cleanly on SIGTERM: the batch in hand is committed, exit 0. It prints
``ready`` once SIGTERM is handled so.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from ledger.settings import KafkaSettings
from projections.projector import run_projector


async def main(
    bootstrap: str, topic: str, db_url: str, group: str = "solo", snapshot_every: str = ""
) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)  # from here on SIGTERM means a clean stop
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic=topic)
    await run_projector(
        settings,
        db_url,
        stop=stop,
        group=group == "group",
        snapshot_every=int(snapshot_every) if snapshot_every else None,
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(*sys.argv[1:6]))
