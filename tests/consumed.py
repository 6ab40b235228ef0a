"""Events as the fold gets them from the consumer: undecoded records, per partition."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeAlias

from aiokafka.structs import ConsumerRecord

from ledger.events import Event, Position
from ledger.kafka import TYPE_HEADER, Messages, Record, to_record

TOPIC = "svledger.events"


Layout: TypeAlias = Literal["written", "old", "moved"]
LAYOUTS: tuple[Layout, ...] = ("written", "old", "moved")


def consumed(
    event: Event, position: Position, *, value: bytes | None = None, headers: Layout = "written"
) -> Any:
    """The record of ``event`` at ``position`` as the broker hands it out. ``headers``: as
    every writer lays them out; ``"old"``, as written before the time and lease headers
    existed (its type header only); ``"moved"``, in another order and with one more (as a
    tool that copies records between clusters might leave them)."""
    key, encoded, written = to_record(event)
    value = encoded if value is None else value
    if headers == "written":
        kept = tuple(written)
    elif headers == "old":
        kept = tuple(h for h in written if h[0] == TYPE_HEADER)
    else:
        kept = (("mirrored-from", b"east"), *reversed(written))
    return ConsumerRecord(
        TOPIC, position.partition, position.offset, 0, 0, key, value, None, len(key), len(value),
        kept,
    )  # fmt: skip


def by_partition(messages: Iterable[Any]) -> Messages:
    """Consumed records grouped per partition, each partition's in the order given."""
    grouped: Messages = {}
    for message in messages:
        grouped.setdefault(message.partition, []).append(message)
    return grouped


def consumed_log(events: Iterable[tuple[Event, Position] | Record]) -> Messages:
    """``(event, position)`` pairs or records, as one poll would hand them to the fold."""
    return by_partition(
        consumed(*((item.event, item.position) if isinstance(item, Record) else item))
        for item in events
    )
