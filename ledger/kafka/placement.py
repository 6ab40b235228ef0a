"""Where each cluster's events are, and growing the topic without moving any cluster.

A cluster's events stay in one partition for ever: their order there is the ledger.
Kafka's default partitioner places a key by the topic's partition count, which
``svledger topics grow`` raises, and would then send most clusters somewhere else. So
the partition of a cluster is recorded once, before its first event, in the
one-partition topic ``<topic>.placement`` (record key: the cluster; value:
``{"partition": N}``), and every writer and reader takes it from there
(:class:`Placements`):

* A writer that meets a cluster with no placement chooses the default partitioner's
  partition over the partitions there are now, appends it, and reads the topic back:
  the **first** placement of a cluster wins. Two writers that raced (one before a grow,
  one after it) agree that way on one partition, whichever each chose. The topic keeps
  every record (retention forever, never compacted: compaction keeps a key's last
  record, not its first).
* A reader does not place: a cluster with no placement has no event yet, and its
  events would go where the default partitioner says.
* A placement never changes, so each process keeps those it has read.
* A ledger whose topic predates placements has no placement topic until ``topics
  create`` (run again on upgrade) makes it: writers refuse to append until then, so
  that no cluster is placed unrecorded. Readers take the default partitioner's
  partition meanwhile: the partition count has never changed.

:func:`grow` raises the partition count: it records the placement of every cluster the
log holds that has none (read from the records' keys), checks that no cluster is split
over two partitions, then adds the partitions. New clusters spread over all of them.
Every writer must record placements (any svledger of this version) before the topic
grows: an older writer would place a new cluster by the new count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from ledger.errors import UsageError
from ledger.kafka.connection import connect, stop_within
from ledger.kafka.errors import BrokerUnavailable, lost, refusals
from ledger.kafka.topics import (
    TopicMissing,
    await_leaders,
    create_topics,
    partition_of,
    topic_partitions,
)
from ledger.settings import KafkaSettings

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS: Final = 30.0  # reading the placement topic to its end

#: Called with the records read and the records to read, as :func:`grow` scans the log.
Progress = Callable[[int, int], None]


def placement_value(partition: int) -> bytes:
    return json.dumps({"partition": partition}).encode()


class Placements:
    """The placement topic as this process knows it: ``await placements.where(clusters)``.

    ``producer``: an idempotent producer of the caller's to append placements with (an
    :class:`~ledger.kafka.producers.EventProducer`'s); without one, a producer of its own
    is started for each append.
    """

    def __init__(self, settings: KafkaSettings, producer: AIOKafkaProducer | None = None) -> None:
        self.settings = settings
        self.topic = settings.placement_topic
        self._producer = producer
        self._placed: dict[str, int] = {}
        self._next = 0  # the next offset of the placement topic to read
        # One round of reading and placing at a time, for every cluster asked meanwhile:
        # a thousand clusters' first events (a fleet's reporters starting) take a few
        # rounds, not a thousand.
        self._round = asyncio.Lock()
        self._to_place: set[str] = set()

    def known(self) -> Mapping[str, int]:
        """The placements read so far."""
        return self._placed

    async def where(self, clusters: Iterable[str], *, place: bool) -> dict[str, int]:
        """The partition of each cluster's events. ``place``: record the placement of a
        cluster that has none (a writer about to append its first event); else a
        cluster with none gets the partition it would be placed in now."""
        wanted = set(clusters)
        if place:
            self._to_place |= wanted - self._placed.keys()
        while not wanted <= self._placed.keys():
            async with self._round:
                if wanted <= self._placed.keys():  # placed by the round before
                    break
                # The events topic first: a principal that may not read it is told so.
                partitions = await topic_partitions(self.settings)
                await self.read(missing_ok=not place)
                if not place:
                    chosen = {c: partition_of(c, partitions) for c in wanted - self._placed.keys()}
                    return {**{c: self._placed[c] for c in wanted - chosen.keys()}, **chosen}
                self._to_place -= self._placed.keys()
                if self._to_place:
                    await self.append({c: partition_of(c, partitions) for c in self._to_place})
                    await self.read()
                    self._to_place -= self._placed.keys()
        return {cluster: self._placed[cluster] for cluster in wanted}

    async def read(self, *, missing_ok: bool = False) -> None:
        """Read the placement topic on from where this process left it. A missing topic
        raises :class:`~ledger.kafka.topics.TopicMissing` (``topics create`` makes it),
        unless ``missing_ok``: the ledger then never grew, and has no placement."""
        try:
            await topic_partitions(self.settings, self.topic)
        except TopicMissing:
            if missing_ok:
                return
            raise
        tp = TopicPartition(self.topic, 0)
        end = -1
        consumer = await connect(
            lambda: AIOKafkaConsumer(
                **self.settings.client_kwargs(), group_id=None, enable_auto_commit=False
            ),
            self.settings,
        )
        try:
            with (
                refusals(self.settings, topic=("Read", self.topic)),
                lost(self.settings, f"reading topic {self.topic!r}"),
            ):
                consumer.assign([tp])
                consumer.seek(tp, self._next)
                async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                    end = (await consumer.end_offsets([tp]))[tp]
                    while self._next < end:
                        records = await consumer.getmany(tp, timeout_ms=1_000)
                        for record in records.get(tp, []):
                            self._learn(record.key, record.value, record.offset)
                        self._next = max(self._next, await consumer.position(tp))
        except TimeoutError:
            raise BrokerUnavailable(
                f"could not read topic {self.topic!r} to its end (offset {end}) on"
                f" {self.settings.bootstrap_servers!r} in {READ_TIMEOUT_SECONDS:.0f} s;"
                " check that its partition has a leader"
            ) from None
        finally:
            await stop_within(consumer, f"the reader of topic {self.topic!r}")

    def _learn(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        try:
            cluster = (key or b"").decode()
            partition = json.loads(value or b"")["partition"]
            if not cluster or not isinstance(partition, int) or partition < 0:
                raise ValueError(f"key {key!r}, value {value!r}")
        except (ValueError, KeyError, TypeError) as error:
            log.warning(
                "skipped the record at offset %d of topic %s: not a placement (%s); only"
                " svledger writes that topic",
                offset,
                self.topic,
                error,
            )
            return
        self._placed.setdefault(cluster, partition)  # the first placement wins

    async def append(self, chosen: Mapping[str, int]) -> None:
        """Append a placement per cluster (acknowledged by every in-sync replica)."""
        own: AIOKafkaProducer | None = None
        producer = self._producer
        if producer is None:
            producer = own = await connect(
                lambda: AIOKafkaProducer(
                    **self.settings.client_kwargs(), enable_idempotence=True, acks="all"
                ),
                self.settings,
            )
        try:
            with refusals(self.settings, topic=("Write", self.topic)):
                sent = [
                    await producer.send(
                        self.topic, value=placement_value(partition), key=cluster.encode(),
                        partition=0,
                    )
                    for cluster, partition in chosen.items()
                ]  # fmt: skip
                await asyncio.gather(*sent)
        finally:
            if own is not None:
                await stop_within(own, f"the writer of topic {self.topic!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Grown:
    """What :func:`grow` did."""

    before: int
    after: int
    clusters: int  # clusters with events in the log
    recorded: int  # of those, the placements recorded now


async def grow(settings: KafkaSettings, partitions: int, progress: Progress | None = None) -> Grown:
    """Raise the events topic to ``partitions`` partitions, every cluster in the log
    kept where it is (the module docstring). Raises :class:`~ledger.errors.UsageError`
    for a count that does not grow the topic, or a log that is not placed as the
    placements say (nothing is changed then)."""
    current = await topic_partitions(settings)
    if partitions <= len(current):
        raise UsageError(
            f"--partitions {partitions}: topic {settings.topic!r} has {len(current)} partitions"
            " already, and Kafka can only add partitions; give a larger count"
        )
    await create_topics(settings)  # the placement topic of a ledger made before it
    placements = Placements(settings)
    await placements.read()
    found = await clusters_in_log(settings, progress)
    misplaced = []
    for cluster, held in sorted(found.items()):
        placed = placements.known().get(cluster, min(held))
        if held != {placed}:
            misplaced.append(f"{cluster!r} placed in {placed}, events in {sorted(held)}")
    if misplaced:
        raise UsageError(
            f"topic {settings.topic!r} holds clusters outside their partition: "
            f"{'; '.join(misplaced)}; a writer that does not record placements wrote them."
            " Nothing was changed"
        )
    unplaced = {c: min(ps) for c, ps in found.items() if c not in placements.known()}
    if unplaced:
        await placements.append(unplaced)
    admin = await connect(lambda: AIOKafkaAdminClient(**settings.client_kwargs()), settings)
    try:
        with (
            refusals(settings, topic=("Alter", settings.topic)),
            lost(settings, f"adding partitions to topic {settings.topic!r}"),
        ):
            await admin.create_partitions({settings.topic: NewPartitions(total_count=partitions)})
            await await_leaders(admin, settings, [settings.topic])
    finally:
        await admin.close()
    log.info(
        "topic %s grew from %d to %d partitions; %d clusters kept their partition (%d"
        " placements recorded now)",
        settings.topic,
        len(current),
        partitions,
        len(found),
        len(unplaced),
    )
    return Grown(len(current), partitions, len(found), len(unplaced))


async def clusters_in_log(
    settings: KafkaSettings, progress: Progress | None = None
) -> dict[str, set[int]]:
    """The partitions each cluster (record key) has records in, read to the ends the
    log has now (committed records only)."""
    consumer = await connect(
        lambda: AIOKafkaConsumer(
            **settings.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=4 * 1024 * 1024,
        ),
        settings,
    )
    found: dict[str, set[int]] = {}
    try:
        with (
            refusals(settings, topic=("Read", settings.topic)),
            lost(settings, f"reading topic {settings.topic!r}"),
        ):
            assigned = [TopicPartition(settings.topic, p) for p in await topic_partitions(settings)]
            consumer.assign(assigned)
            await consumer.seek_to_beginning(*assigned)
            ends = {tp: end for tp, end in (await consumer.end_offsets(assigned)).items() if end}
            total = sum(ends.values())
            while ends:
                batches = await consumer.getmany(*ends, timeout_ms=1_000, max_records=50_000)
                for tp, records in batches.items():
                    for record in records:
                        if record.key:
                            found.setdefault(record.key.decode(errors="replace"), set()).add(
                                tp.partition
                            )
                for tp in list(ends):
                    if await consumer.position(tp) >= ends[tp]:
                        del ends[tp]
                if progress is not None:
                    left = 0
                    for tp, end in ends.items():
                        left += end - await consumer.position(tp)
                    progress(total - left, total)
    finally:
        await stop_within(consumer, f"the reader of topic {settings.topic!r}")
    return found
