"""Plain lease renewals, folded without decoding most of them.

Most of the log is heartbeats, and most heartbeats are *plain renewals*: they say of
their lease exactly what the lease already holds (:func:`~ledger.events.lease_term`:
cluster, apiserver, holder, hostname, duration, binary version) and only move its
renew time. The fold of a heartbeat overwrites its lease whole, and the only event
that reads a lease's renew time is an expiry (:mod:`projections.fold`), so of a run
of plain renewals of one lease only the last one's renew time and position reach the
views, unless an expiry of that lease comes in between.

:class:`Thinning` folds a batch that way. A plain renewal is told from its
``svledger-lease`` record header, undecoded, or, for a heartbeat written before the
header (decoded then), from its fields: either way by comparing its term with the
lease's current term, so the same record is classified the same whatever the batch
boundaries. A plain renewal is counted (per holder: how many, the first and last
offset) and kept pending instead of folded. Before an expiry of the lease, and at the
end of the batch, the pending renewals are folded: the last readable one, preceded by
the last one with another renew time (so a row whose time went back and forth gets
the position one-by-one folding gives it). A heartbeat that is not a plain renewal
(the first of a holder, one after the lease ended, one that changes more) drops the
pending ones of its lease, which it overwrites, and is folded as any event; so is a
release that ends the lease. One the fold rejects overwrites nothing: the pending
ones are folded before it, as before an expiry.

The views are exactly those of folding every event one by one
(``tests/unit/test_thinning.py``); what differs is that plain renewals have no
``ledger_events`` row: the ``lease_renewals`` table counts them per holder.

Trust: the header is the record's word for its term. Every writer builds it from the
event it encodes (:func:`ledger.kafka.to_record`) and admission builds it again from
the decoded inbox record, so only a principal that may write the events topic
directly could make the two differ. A record that is read and found to differ from
its headers is a dead letter wherever it is read (:func:`ledger.kafka.decode_message`),
so it is folded by no reader. A renewal is held pending only if its value starts as
a heartbeat's (``c3 01`` and a heartbeat schema's fingerprint); any other is decoded
at once, and dead-lettered. Of a run of pending renewals only the last ones are read
(:meth:`Thinning._flush`): one of those that does not decode goes to the dead-letter
topic and is not counted; the ones before are counted on their headers' word and
never read, so a heartbeat's value cut short or garbled after its first ten bytes is
not found among them. Decoding them all to find one would cost the fold most of what
thinning saves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Final, TypeAlias

from ledger.codec import headers_of
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    Event,
    from_micros,
    heartbeat_term,
    lease_term,
)
from ledger.kafka import LEASE_HEADER, TIME_HEADER, Message, Record, decode_message
from projections.fold import apply, heartbeat_refusal, occurred
from projections.state import Changes, HolderKey, Lease, LeaseKey, RenewalCount, State

log = logging.getLogger(__name__)


def _term(lease: Lease) -> bytes:
    return lease_term(
        lease.cluster,
        lease.apiserver_id,
        lease.holder_identity,
        lease.hostname,
        lease.lease_duration_seconds,
        lease.binary_version,
        lease.peer_advertise_address,
    )


class LeaseTerms:
    """The current term of every lease of a :class:`State`, both ways."""

    def __init__(self, state: State) -> None:
        self._by_key = {key: _term(lease) for key, lease in state.leases.items()}
        # term -> (lease, its cluster as a record key): the hot path compares bytes
        self.by_term = {term: (key, key[0].encode()) for key, term in self._by_key.items()}

    def key_of(self, cluster: str, term: bytes) -> LeaseKey | None:
        """The lease whose current term ``term`` is, if it is ``cluster``'s."""
        found = self.by_term.get(term)
        return found[0] if found is not None and found[0][0] == cluster else None

    def update(self, state: State, key: LeaseKey) -> None:
        """Take the lease ``key``'s term (or its absence) from ``state``."""
        old = self._by_key.pop(key, None)
        if old is not None:
            del self.by_term[old]
        lease = state.leases.get(key)
        if lease is not None:
            term = self._by_key[key] = _term(lease)
            self.by_term[term] = (key, key[0].encode())


# A plain renewal's value starts as a heartbeat's: one that does not is decoded (and
# found a dead letter) at once, at the cost of a prefix compare per renewal.
_HEARTBEAT_HEADERS: Final = headers_of(ApiserverHeartbeat.__name__)

_Pending: TypeAlias = Message | Record  # undecoded, or decoded for want of the header
# Each lease's plain renewals not folded yet, in log order.
Pending: TypeAlias = dict[LeaseKey, list[_Pending]]


class Thinning:
    """Folds one batch of consumed records into ``state``, thinning plain renewals.

    ``fold(messages, ...)`` per partition, each partition's records in log order, then
    ``finish()``. A consumer that folds poll after poll may hand each poll's thinning
    the same ``pending`` and call ``finish()`` only now and then: renewals still
    pending then carry over to the next poll, and the state lags only in its leases'
    renew times (and those rows' revisions) and its clusters' latest event times until
    it is called. ``counts`` then holds
    the plain renewals per holder, ``dead`` the records that belong in the dead-letter
    topic (with the reason), and ``changes`` the keys the batch changed. With
    ``folded``, it is called with each record folded but plain renewals and the keys
    its event changed, in log order, right after the event is folded: what a consumer
    that reacts to each event (the migrator) reads, and how the read API tells when
    each row was created; a plain renewal changes only its lease's renew time.
    """

    def __init__(
        self,
        state: State,
        terms: LeaseTerms,
        changes: Changes,
        folded: Callable[[Record, Changes], object] | None = None,
        pending: Pending | None = None,
    ) -> None:
        self.state = state
        self.terms = terms
        self.changes = changes
        self.folded = folded
        self.counts: dict[HolderKey, RenewalCount] = {}
        self.dead: list[tuple[Message, str]] = []
        self.renewals = 0
        self._pending: Pending = {} if pending is None else pending

    def fold(
        self, messages: Iterable[Message], logged: list[Record], latest: int | None
    ) -> int | None:
        """Fold ``messages`` (one partition's, in log order) and append to ``logged``
        the records to log in ``ledger_events`` (all but plain renewals and dead
        letters). Returns ``latest`` (microseconds since 1970; None: not kept) moved
        to the latest time an event of ``messages`` occurred at.

        The hot path, most of the log: a heartbeat as every writer lays out its headers
        (:func:`ledger.kafka.to_record`: type, time, lease term) whose term is its
        lease's is counted undecoded, with no object made for it.
        """
        by_term = self.terms.by_term
        pending = self._pending
        for message in messages:
            headers = message.headers
            moment = None
            if len(headers) == 3:
                _, (time_name, time), (lease_name, term) = headers
                if time_name == TIME_HEADER and lease_name == LEASE_HEADER and len(time) == 8:
                    moment = int.from_bytes(time, "big", signed=True)
                    found = by_term.get(term)
                    value = message.value
                    if (
                        found is not None
                        and found[1] == message.key
                        and value is not None
                        and value.startswith(_HEARTBEAT_HEADERS)
                    ):
                        waiting = pending.get(found[0])
                        if waiting is None:
                            pending[found[0]] = [message]
                        else:
                            waiting.append(message)
                        if latest is not None and moment > latest:
                            latest = moment
                        continue
            record = self._decoded(message)
            if record is None:
                continue
            if latest is not None:
                if moment is None:
                    moment = record.time
                if moment > latest:
                    latest = moment
            if self.fold_record(record):
                logged.append(record)
        return latest

    def fold_record(self, record: Record) -> bool:
        """Fold a decoded ``record``; False if it is a plain renewal (kept pending)."""
        event = record.event
        if isinstance(event, ApiserverHeartbeat):
            key = self.terms.key_of(event.meta.cluster, heartbeat_term(event))
            if key is not None:
                self._renewed(key, record)
                return False
            key = (event.meta.cluster, event.apiserver_id)
            if heartbeat_refusal(event) is None:
                self._take(key)  # overwritten by this heartbeat
            else:
                self._flush(key)  # rejected: the lease stays, renewed as they say
            self._fold_own(event, record)
            self.terms.update(self.state, key)
        elif isinstance(event, ApiserverLeaseExpired):
            key = (event.meta.cluster, event.apiserver_id)
            self._flush(key)  # an expiry compares the lease's renew time
            self._fold_own(event, record)
            self.terms.update(self.state, key)
        elif isinstance(event, ApiserverLeaseReleased):
            key = (event.meta.cluster, event.apiserver_id)
            holder = self.state.leases.get(key)
            self._fold_own(event, record)
            if holder is not None and key not in self.state.leases:
                self._take(key, holder.holder_identity)  # renewed, then ended
            self.terms.update(self.state, key)
        else:
            self._fold_own(event, record)
        return True

    def _decoded(self, message: Message) -> Record | None:
        read = decode_message(message)
        if isinstance(read, str):
            self.dead.append((message, read))
            return None
        return read

    def finish(self) -> None:
        """Fold the pending renewals of every lease."""
        for key in list(self._pending):
            self._flush(key)

    def _apply(self, event: Event, record: Record) -> None:
        apply(self.state, event, record.position, self.changes)

    def _fold_own(self, event: Event, record: Record) -> None:
        """Fold the event of a record that is not a plain renewal, in its log order."""
        if self.folded is None:
            self._apply(event, record)
            return
        own = apply(self.state, event, record.position)
        self.folded(record, own)
        self.changes.add(own)

    def _renewed(self, key: LeaseKey, record: _Pending) -> None:
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = [record]
        else:
            pending.append(record)

    def _take(self, key: LeaseKey, holder: str | None = None) -> list[_Pending]:
        """Remove the pending renewals of lease ``key`` and count them for its holder
        (``holder``, else the lease's)."""
        pending = self._pending.pop(key, None)
        if not pending:
            return []
        if holder is None:
            holder = self.state.leases[key].holder_identity
        partition, first = pending[0].partition, pending[0].offset
        last = pending[-1].offset
        # Their times, as folding each would have moved the cluster's latest time.
        latest = from_micros(max(map(_moment, pending)))
        occurred(self.state, key[0], partition, latest, self.changes)
        count = self.counts.get((key[0], key[1], holder))
        if count is None:
            self.counts[key[0], key[1], holder] = RenewalCount(partition, first, last, len(pending))
        else:
            count.last_offset = last
            count.renewals += len(pending)
        self.renewals += len(pending)
        return pending

    def _flush(self, key: LeaseKey) -> None:
        """Fold the pending renewals of lease ``key`` as one-by-one folding would end.

        Only the last ones are read: the last readable one and the last before it with
        another renew time. One that does not read on the way there is a dead letter,
        neither counted nor folded; the ones before are counted by their headers alone.
        """
        pending = self._pending.get(key)
        if pending is None:
            return
        dead = len(self.dead)
        readable = self._readable(reversed(pending))
        last = next(readable, None)
        first, before = last, None
        for record in readable:
            assert last is not None
            if _renewed(record) != _renewed(last):
                before = record
                break
            first = record
        if len(self.dead) > dead:
            unread = {message.offset for message, _ in self.dead[dead:]}
            pending[:] = [p for p in pending if p.offset not in unread]
        self._take(key)
        if first is None:
            return
        if before is not None:
            self._apply(before.event, before)
        self._apply(first.event, first)
        self.terms.update(self.state, key)

    def _readable(self, pending: Iterable[_Pending]) -> Iterator[Record]:
        """The records of ``pending`` that decode; the others go to :attr:`dead`."""
        for record in pending:
            if isinstance(record, Record):
                yield record
            elif isinstance(decoded := self._decoded(record), Record):
                yield decoded


def _moment(pending: _Pending) -> int:
    """When a pending renewal occurred (microseconds): its time header, read as the hot
    path of :meth:`Thinning.fold` found it, or its event's."""
    if isinstance(pending, Record):
        return pending.time
    return int.from_bytes(pending.headers[1][1], "big", signed=True)


def _renewed(record: Record) -> object:
    event = record.event
    assert isinstance(event, ApiserverHeartbeat)
    return event.renew_time, heartbeat_term(event)
