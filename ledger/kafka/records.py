"""The record format: how an event is written as a Kafka record, and read back.

The record format is the contract every writer shares (:func:`to_record`):

* key: the cluster name, UTF-8, so all events of a cluster land in one partition
  (the default murmur2 partitioner) and form one total order;
* value: the codec's Avro single-object encoding;
* header ``svledger-type``: the event type name, for humans reading with console tools;
* header ``svledger-time``: when the event occurred, in microseconds since 1970 (eight
  bytes, big-endian, signed), so that a reader can cut the log by time without decoding
  the record (:func:`message_time`);
* header ``svledger-lease``, on heartbeats only: the 16-byte
  :func:`~ledger.events.lease_term` of what the heartbeat says besides its renew time.
  A reader that knows the lease's current term can tell a plain renewal without
  decoding the record (the projector's thinning, :mod:`projections.thinning`). Every
  writer builds it from the event it encodes, so it always matches the value;
  admission builds it again from the decoded inbox record.

One other record is written, never read: the fencing record of a transactional producer
(:mod:`ledger.kafka.transactions`).

A consumed record is read back by :func:`decode_message`: the :class:`Record` of its
event, or why it belongs in the dead-letter topic instead (it does not decode, its key
is not its event's ``meta.cluster``, or a header readers trust undecoded says other
than its event). Nothing here does I/O: readers hand in what they consumed.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from collections.abc import Iterable, Sequence
from typing import Any, Final, NamedTuple, TypeAlias

from ledger.codec import CodecError, decode, encode
from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Position,
    heartbeat_term,
    micros,
    type_name,
)

TYPE_HEADER: Final = "svledger-type"
LEASE_HEADER: Final = "svledger-lease"
TIME_HEADER: Final = "svledger-time"


Headers: TypeAlias = list[tuple[str, bytes]]


class OutgoingRecord(NamedTuple):
    key: bytes | None  # None only for a fencing record (PartitionProducer)
    value: bytes
    headers: Headers


def to_record(event: Event, value: bytes | None = None) -> OutgoingRecord:
    """The Kafka record for an event; every writer of the ledger uses this.

    ``value``: the event's encoding as it was logged elsewhere (admission copies an
    inbox record byte for byte), instead of encoding it again.
    """
    headers = [
        (TYPE_HEADER, type_name(event).encode()),
        (TIME_HEADER, micros(event.meta.occurred_at).to_bytes(8, "big", signed=True)),
    ]
    if isinstance(event, ApiserverHeartbeat):
        headers.append((LEASE_HEADER, heartbeat_term(event)))
    return OutgoingRecord(
        key=event.meta.cluster.encode(),
        value=encode(event) if value is None else value,
        headers=headers,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """A decoded event with where it sits in the log, and its encoding as logged."""

    position: Position
    event: Event
    value: bytes

    @property
    def time(self) -> int:
        """When the event occurred, in microseconds since 1970 (as :func:`message_time`)."""
        return micros(self.event.meta.occurred_at)

    @property
    def partition(self) -> int:
        return self.position.partition

    @property
    def offset(self) -> int:
        return self.position.offset


Message: TypeAlias = Any
"""A record as the consumer hands it out undecoded (aiokafka's ``ConsumerRecord``):
``partition``, ``offset``, ``key``, ``value`` and ``headers`` are what the ledger reads."""

Messages: TypeAlias = dict[int, list[Message]]
"""Consumed records per partition, each partition's in log order: one poll's worth."""


def decode_message(message: Message) -> Record | str:
    """The record of a consumed message, or why it belongs in the dead-letter topic."""
    if message.value is None:
        return "record has no value (a tombstone); the ledger never deletes"
    try:
        event = decode(message.value)
    except CodecError as error:
        return str(error)
    cluster = event.meta.cluster
    if message.key != cluster.encode():
        return f"record key {message.key!r} is not the event's meta.cluster {cluster!r}"
    if (lie := _header_lie(message.headers, event)) is not None:
        return lie
    return Record(Position(message.partition, message.offset), event, message.value)


def _header_lie(headers: Headers, event: Event) -> str | None:
    """Which of the headers readers trust without decoding (:func:`to_record`) says
    other than ``event``, if one does.

    The fold counts a plain lease renewal by its lease header and cuts the log by the
    time header, undecoded, so a record whose headers disagree with its event would
    be folded one way by a reader that decodes it and another by one that does not:
    it is refused by both, as a dead letter.
    """
    for name, value in headers:
        if name == TIME_HEADER and len(value) == 8:
            moment = int.from_bytes(value, "big", signed=True)
            if moment != micros(event.meta.occurred_at):
                return (
                    f"header {TIME_HEADER} says the event occurred at {moment} us, its"
                    f" meta.occurred_at {event.meta.occurred_at.isoformat()}: a writer"
                    " must build the headers from the event it encodes"
                )
        elif name == LEASE_HEADER and not (
            isinstance(event, ApiserverHeartbeat) and value == heartbeat_term(event)
        ):
            return (
                f"header {LEASE_HEADER} does not hold the lease term of the"
                f" {type_name(event)} it comes with: a writer must build the headers"
                " from the event it encodes"
            )
    return None


def decode_messages(
    messages: Iterable[Message], records: list[Record], dead: list[tuple[Message, str]]
) -> None:
    """Append the record of each consumed message to ``records``, or the message and why
    it belongs in the dead-letter topic to ``dead``."""
    for message in messages:
        read = decode_message(message)
        if isinstance(read, str):
            dead.append((message, read))
        else:
            records.append(read)


_OFFSET: Final = operator.attrgetter("offset")


def first_at(messages: Sequence[Message], offset: int) -> int:
    """The index of the first of ``messages`` (one partition's, in log order) at or after
    ``offset``; their count if there is none."""
    return bisect.bisect_left(messages, offset, key=_OFFSET)


def message_time(message: Message) -> int | None:
    """When a consumed message's event occurred, in microseconds since 1970: from its
    ``svledger-time`` header, else (a record written before the header) its decoded
    event; None if it does not decode (a dead letter)."""
    for name, value in message.headers:
        if name == TIME_HEADER and len(value) == 8:
            return int.from_bytes(value, "big", signed=True)
    read = decode_message(message)
    return None if isinstance(read, str) else read.time


def max_time(messages: Iterable[Message], latest: int | None) -> int | None:
    """``latest`` (microseconds; None: not kept) moved to the latest time an event of
    ``messages`` occurred at (:func:`message_time`; a dead letter has none)."""
    if latest is None:
        return None
    for message in messages:
        moment = message_time(message)
        if moment is not None and moment > latest:
            latest = moment
    return latest
