"""Kafka I/O for the ledger: topics, the record format, producing and consuming events.

This package is the one place that speaks to aiokafka (settings aside, which build its
TLS context): topics, the record format, the producers (plain, and transactional per
partition for consume-transform-produce), the readers (decoding with a dead-letter
topic, raw group members for per-partition folds), end offsets and lags: everything
that depends on the client library's behaviour. Each module holds one part of it and
imports only modules listed before it here (``tests/unit/test_layers.py`` checks):

* :mod:`~ledger.kafka.records`: the record format every writer and reader shares
  (:func:`to_record`, :func:`decode_message`); it does no I/O.
* :mod:`~ledger.kafka.errors`: what the broker's failures mean: an outage
  (:class:`BrokerUnavailable`) or a refusal (:class:`NotAuthenticated`,
  :class:`NotAuthorized`), told apart.
* :mod:`~ledger.kafka.connection`: starting a client (:func:`connect`), riding out an
  outage (:func:`while_away`), and stopping in time (:func:`stop_connecting_on`,
  :func:`stop_within`).
* :mod:`~ledger.kafka.topics`: creating the topics, their partitions
  (:func:`topic_partitions`, :func:`partition_of`) and end offsets (:class:`EndOffsets`).
* :mod:`~ledger.kafka.placement`: the partition each cluster's events are in, recorded
  once (:class:`Placements`), and growing the topic without moving any (:func:`grow`).
* :mod:`~ledger.kafka.producers`: :class:`EventProducer`, which appends events.
* :mod:`~ledger.kafka.transactions`: records and a group's offsets in one transaction
  (:class:`TransactionalProducer`, :class:`PartitionProducer`), and fencing.
* :mod:`~ledger.kafka.dead_letters`: the dead-letter topic, each bad record sent once
  (:class:`DeadLetters`).
* :mod:`~ledger.kafka.assignor`: aiokafka's side of :mod:`ledger.assignment`
  (:class:`BacklogAssignor`).
* :mod:`~ledger.kafka.readers`: how every reader reads (:func:`ledger_consumer`,
  :func:`lags`) and :class:`EventConsumer`, which decodes.
* :mod:`~ledger.kafka.members`: consumer group members that hand out raw records
  (:class:`GroupMember`, :class:`PatternMember`).

Callers import the names below from here (``from ledger.kafka import EventProducer``).
A test that replaces a name patches it in the module that looks it up
(``ledger.kafka.topics.connect``, not ``ledger.kafka.connect``).
"""

from __future__ import annotations

from aiokafka import TopicPartition  # re-exported: a partition of any topic

from ledger.kafka.assignor import BacklogAssignor
from ledger.kafka.connection import (
    RETRY_SECONDS,
    STOP_TIMEOUT_SECONDS,
    StoppedConnecting,
    connect,
    stop_connecting_on,
    stop_within,
    unless_stopped,
    while_away,
)
from ledger.kafka.dead_letters import (
    DEAD_LETTER_ATTEMPTS,
    DEAD_LETTER_SENDERS,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_REASON_HEADER,
    DLQ_TOPIC_HEADER,
    DeadLetters,
    DeadLettersUnsent,
    dead_letter_headers,
)
from ledger.kafka.errors import (
    BROKER_ERRORS,
    GRANT_HINT,
    BrokerUnavailable,
    NotAuthenticated,
    NotAuthorized,
)
from ledger.kafka.members import GroupMember, PatternMember
from ledger.kafka.placement import Grown, Placements, grow
from ledger.kafka.producers import EventProducer
from ledger.kafka.readers import (
    METADATA_MAX_AGE_MS,
    EventConsumer,
    StartOffsets,
    drop_fetch,
    lags,
    ledger_consumer,
)
from ledger.kafka.records import (
    LEASE_HEADER,
    TIME_HEADER,
    TYPE_HEADER,
    Headers,
    Message,
    Messages,
    OutgoingRecord,
    Record,
    decode_message,
    decode_messages,
    first_at,
    max_time,
    message_time,
    to_record,
)
from ledger.kafka.topics import (
    TOPIC_CONFIG,
    EndOffsets,
    TopicForgets,
    TopicMissing,
    create_topics,
    end_offsets,
    partition_of,
    topic_partitions,
)
from ledger.kafka.transactions import (
    FENCE_HEADER,
    TRANSACTION_TIMEOUT_SECONDS,
    Addressed,
    PartitionProducer,
    TransactionalProducer,
    TransactionFailed,
)

__all__ = [
    "BROKER_ERRORS",
    "DEAD_LETTER_ATTEMPTS",
    "DEAD_LETTER_SENDERS",
    "DLQ_OFFSET_HEADER",
    "DLQ_PARTITION_HEADER",
    "DLQ_REASON_HEADER",
    "DLQ_TOPIC_HEADER",
    "FENCE_HEADER",
    "GRANT_HINT",
    "LEASE_HEADER",
    "METADATA_MAX_AGE_MS",
    "RETRY_SECONDS",
    "STOP_TIMEOUT_SECONDS",
    "TIME_HEADER",
    "TOPIC_CONFIG",
    "TRANSACTION_TIMEOUT_SECONDS",
    "TYPE_HEADER",
    "Addressed",
    "BacklogAssignor",
    "BrokerUnavailable",
    "DeadLetters",
    "DeadLettersUnsent",
    "EndOffsets",
    "EventConsumer",
    "EventProducer",
    "GroupMember",
    "Grown",
    "Headers",
    "Message",
    "Messages",
    "NotAuthenticated",
    "NotAuthorized",
    "OutgoingRecord",
    "PartitionProducer",
    "PatternMember",
    "Placements",
    "Record",
    "StartOffsets",
    "StoppedConnecting",
    "TopicForgets",
    "TopicMissing",
    "TopicPartition",
    "TransactionFailed",
    "TransactionalProducer",
    "connect",
    "create_topics",
    "dead_letter_headers",
    "decode_message",
    "decode_messages",
    "drop_fetch",
    "end_offsets",
    "first_at",
    "grow",
    "lags",
    "ledger_consumer",
    "max_time",
    "message_time",
    "partition_of",
    "stop_connecting_on",
    "stop_within",
    "to_record",
    "topic_partitions",
    "unless_stopped",
    "while_away",
]
