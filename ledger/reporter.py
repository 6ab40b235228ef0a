"""The library an API server embeds to take part in the ledger.

A :class:`Reporter` does on Kafka what kube-apiserver does with its identity Lease
and the StorageVersion API (KEP-1965, KEP-2339), in the KEP's order:

1. **membership**: ``start`` appends an ``ApiserverHeartbeat`` and waits for its
   acknowledgement, so the lease exists in the log before anything that needs it;
2. **storage versions**: then a ``StorageVersionReported`` per served resource, by
   group then resource as upstream's manager updates them, and waits for those
   acknowledgements (upstream also reports only the first of resources that share
   their storage, e.g. ``ingresses`` of ``extensions`` and ``networking.k8s.io``; the
   reporter cannot tell which do, so a server that serves both reports one);
3. **serve writes**: only then does the :class:`~ledger.gate.WriteGate` open and the
   reporter become ``ready``.

Both go to the cluster's partition, so the log holds them in exactly that order.
Identity is upstream's: the apiserver ID is stable for a hostname, the holder
identity is new on every ``start``.

After ``start`` a heartbeat is sent every ``heartbeat_interval`` seconds plus up to
``jitter`` of it (upstream's ``wait.Jitter``; 0.04 by default, the factor of upstream's
lease controller), measured from the end of the previous one. A failed heartbeat is
logged and tried again on the next tick; the loop never dies of it. One that Kafka
holds instead (aiokafka keeps a send while the broker is away) is told of every
interval until it lands. If a heartbeat is
acknowledged at least half ``lease_duration_seconds`` (and two heartbeat intervals) after
the previous acknowledged one, the lease may have been expired by the lease GC in
between (which decides by its own clock: half a lease duration leaves room for the
skew the long duration is there to tolerate), which also dropped this server's storage
versions: the reporter re-joins by reporting every resource again (the gate is closed
until that is acknowledged). Upstream re-reports every storage version every 10 minutes
(kube-aggregator's post-start hook), in case another agent changed or deleted its
StorageVersion objects; a re-report that changes nothing changes no resourceVersion.
Here the same holds of the fold (a report that changes nothing leaves its
StorageVersion, revision included, as it was), but nothing except the end of its lease
takes a server's entries away, so only a gap that may have cost the lease is followed
by a re-report: one on a timer would only lengthen the log.

The reporter keeps the resources it should report (*desired*) and the reports the
log is known to hold (*acknowledged*); every change (start, ``update``, a re-join)
sends the difference and opens the gate for what was acknowledged. A resource whose
report failed stays closed, its 503 naming the error, and is retried after the next
heartbeat. ``stop`` closes the gate for good (unlike upstream's, which stays open while
the server drains: once the lease is released the others may agree without this
server and a migration start, which a write in the old version would then escape) and
sends ``ApiserverLeaseReleased``, waiting at most ``shutdown_timeout`` seconds
(10, upstream's bound on deleting its lease at shutdown) for the acknowledgement: a
release that does not land in time is logged, and the lease GC expires the lease. A
``stop`` while ``start`` is still trying to register ends that ``start`` (not ready, the
gate closed), as upstream's ``Stop`` releases a sync stuck retrying.

:class:`ThreadedReporter` runs the same reporter on an event loop of its own, in a
daemon thread, behind a blocking API for servers that are not asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import threading
from collections.abc import Coroutine, Iterable
from datetime import datetime, timedelta
from typing import Any, Final, TypedDict, TypeVar, Unpack

from ledger.clock import Clock, SystemClock
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseReleased,
    Event,
    Meta,
    StorageVersionReported,
    StorageVersionWithdrawn,
)
from ledger.gate import GroupResource, WriteGate
from ledger.identity import apiserver_id, check_hostname, holder_identity
from ledger.kafka import BROKER_ERRORS, EventProducer, TopicMissing, unless_stopped
from ledger.names import group_resource_string
from ledger.settings import KafkaSettings
from ledger.validation import LEASE_DURATION_MAX, InvalidReport, check_report

log = logging.getLogger(__name__)

# What keeps a reporter's events from the log for now: the broker is away, or the topic
# is not created yet (it may be meanwhile).
_UNREACHABLE: Final = (*BROKER_ERRORS, TopicMissing)

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceReport:
    """How this server stores and serves one resource; checked when built."""

    group: str
    resource: str
    kind: str
    encoding_version: str
    decodable_versions: tuple[str, ...]
    served_versions: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in ("group", "resource", "kind", "encoding_version"):
            if not isinstance(getattr(self, name), str):
                raise InvalidReport(name, getattr(self, name), "must be a string")
        for name in ("decodable_versions", "served_versions"):
            versions = getattr(self, name)
            if not isinstance(versions, Iterable) or isinstance(versions, str):
                raise InvalidReport(name, versions, "must be a list of versions, e.g. ['apps/v1']")
            if not all(isinstance(version, str) for version in versions):
                raise InvalidReport(name, versions, "must hold versions as strings")
        # Accept any sequence of versions but keep tuples, so reports compare by value.
        object.__setattr__(self, "decodable_versions", tuple(self.decodable_versions))
        object.__setattr__(self, "served_versions", tuple(self.served_versions))
        check_report(
            self.group,
            self.resource,
            self.kind,
            self.encoding_version,
            self.decodable_versions,
            self.served_versions,
        )

    @property
    def key(self) -> GroupResource:
        return (self.group, self.resource)


def _by_key(resources: Iterable[ResourceReport]) -> dict[GroupResource, ResourceReport]:
    by_key: dict[GroupResource, ResourceReport] = {}
    for report in resources:
        if report.key in by_key:
            raise InvalidReport(
                "resource",
                group_resource_string(*report.key),
                "reported twice; give one report per resource",
            )
        by_key[report.key] = report
    return by_key


class ReporterOptions(TypedDict, total=False):
    """:class:`Reporter`'s keyword options, for wrappers that pass them on."""

    heartbeat_interval: float
    jitter: float
    lease_duration_seconds: int
    binary_version: str | None
    peer_advertise_address: str | None
    rng: random.Random | None


class Reporter:
    """Heartbeats and storage-version reports of one API server (asyncio)."""

    def __init__(
        self,
        cluster: str,
        hostname: str,
        resources: Iterable[ResourceReport],
        producer: EventProducer,
        clock: Clock | None = None,
        *,
        heartbeat_interval: float = 10.0,
        jitter: float = 0.04,
        lease_duration_seconds: int = 3600,
        binary_version: str | None = None,
        peer_advertise_address: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not cluster:
            raise ValueError("cluster name must not be empty: it is the key of every event")
        check_hostname(hostname)
        if heartbeat_interval <= 0 or jitter < 0:
            raise ValueError(
                f"heartbeat_interval={heartbeat_interval} must be positive and "
                f"jitter={jitter} not negative"
            )
        if (
            not isinstance(lease_duration_seconds, int)
            or isinstance(lease_duration_seconds, bool)
            or not 0 < lease_duration_seconds <= LEASE_DURATION_MAX
        ):
            raise ValueError(
                f"lease_duration_seconds={lease_duration_seconds!r} must be a whole number of"
                f" seconds from 1 to {LEASE_DURATION_MAX}, as a Lease's leaseDurationSeconds"
                " (an int32)"
            )
        if heartbeat_interval >= lease_duration_seconds:
            raise ValueError(
                f"heartbeat_interval={heartbeat_interval} s must be shorter than "
                f"lease_duration_seconds={lease_duration_seconds}, or the lease lapses "
                "between heartbeats"
            )
        self.cluster = cluster
        self.hostname = hostname
        self.apiserver_id = apiserver_id(hostname)
        self.holder_identity: str | None = None
        self.binary_version = binary_version
        self.peer_advertise_address = peer_advertise_address  # "<ip>:<port>", as upstream's
        self._producer = producer
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._interval = heartbeat_interval
        self._jitter = jitter
        self._lease_duration = lease_duration_seconds
        # Half a lease duration, and at least two heartbeats' time (see the module doc).
        self._rejoin_after = timedelta(
            seconds=max(lease_duration_seconds / 2, 2 * heartbeat_interval * (1 + jitter))
        )
        self._rng = rng if rng is not None else random.Random()
        self._desired = _by_key(resources)
        self._acknowledged: dict[GroupResource, ResourceReport] = {}
        self._last_renewal: datetime | None = None  # renew time of the last acked heartbeat
        self._may_hold_lease = False  # a heartbeat of this holder was sent: stop releases the lease
        self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None
        self.gate = WriteGate(self._desired)

    @property
    def ready(self) -> bool:
        """Member of the cluster with every resource's storage version on record."""
        return self._loop_task is not None and self.gate.completed

    @property
    def resources(self) -> list[ResourceReport]:
        return list(self._desired.values())

    async def start(self) -> None:
        """Join (heartbeat acknowledged), report every resource, then open the gate.

        While the broker cannot take the registration (down, restarting, unreachable, the
        topic not created yet) it tries again every heartbeat interval, with the gate
        closed, and returns once the registration has landed: the API server serves no
        write of a resource whose storage version is not on record, and needs no restart
        when Kafka comes back.
        A :meth:`stop` meanwhile ends it at once, not ready.
        """
        if self._loop_task is not None:
            raise RuntimeError(f"reporter {self.apiserver_id} ({self.hostname}) already started")
        self._stopping.clear()
        self.holder_identity = holder_identity(self.apiserver_id)
        async with self._lock:
            self._acknowledged.clear()
            self._last_renewal = None
            while True:
                try:
                    if not await unless_stopped(self._connected_register(), self._stopping):
                        return
                    break
                except _UNREACHABLE as error:
                    self._failed(error)
                    log.warning(
                        "apiserver %s cannot register yet (the write gate stays closed), "
                        "trying again in %.0f s: %s: %s",
                        self.apiserver_id,
                        self._interval,
                        type(error).__name__,
                        error,
                    )
                if not await unless_stopped(self._clock.sleep(self._interval), self._stopping):
                    return
        self._loop_task = asyncio.create_task(
            self._heartbeat_loop(), name=f"svledger-heartbeat-{self.apiserver_id}"
        )

    async def stop(self, shutdown_timeout: float = 10.0) -> None:
        """Stop heartbeating and release the lease (graceful shutdown), waiting at most
        ``shutdown_timeout`` seconds for the release to be acknowledged."""
        self._stopping.set()
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self._lock:  # a start still registering has returned
            self._acknowledged.clear()
            self._refresh_gate()
            if not self._may_hold_lease:
                return
            self._may_hold_lease = False
            assert self.holder_identity is not None
            release = ApiserverLeaseReleased(
                meta=self._meta(),
                apiserver_id=self.apiserver_id,
                holder_identity=self.holder_identity,
            )
            try:
                await asyncio.wait_for(self._producer.send(release), shutdown_timeout)
            except (TimeoutError, *_UNREACHABLE) as error:
                why = "no acknowledgement" if isinstance(error, TimeoutError) else error
                log.warning(
                    "apiserver %s could not release its lease in %g s (%s: %s); the lease"
                    " GC expires it %d s after its last renewal",
                    self.apiserver_id,
                    shutdown_timeout,
                    type(error).__name__,
                    why,
                    self._lease_duration,
                )

    async def update(self, resources: Iterable[ResourceReport]) -> None:
        """Report what changed and withdraw what is no longer served.

        The gate closes for every changed resource until its new report is acknowledged.
        """
        desired = _by_key(resources)
        async with self._lock:
            self._desired = desired
            self._refresh_gate()
            if self._loop_task is not None:
                await self._sync()

    def _meta(self) -> Meta:
        return Meta.new(self.cluster, self.apiserver_id, self._clock.now())

    def _unacknowledged(self) -> list[ResourceReport]:
        """The desired reports the log is not known to hold, by group then resource (the
        core group first): the order upstream's storage version manager updates them in."""
        return [r for k, r in sorted(self._desired.items()) if self._acknowledged.get(k) != r]

    def _refresh_gate(self) -> None:
        stale = {r.key for r in self._unacknowledged()}
        self.gate.close(stale)
        self.gate.open(self.gate.pending - stale)

    async def _connected_register(self) -> None:
        await self._producer.start()  # connected already, unless the caller left it to us
        await self._register()

    async def _register(self) -> None:
        await self._heartbeat()
        await self._sync()

    async def _heartbeat(self) -> None:
        """Send a heartbeat; when it follows a gap of half a lease duration, re-join."""
        assert self.holder_identity is not None
        now = self._clock.now()
        self._may_hold_lease = True
        await self._producer.send(
            ApiserverHeartbeat(
                meta=Meta.new(self.cluster, self.apiserver_id, now),
                apiserver_id=self.apiserver_id,
                holder_identity=self.holder_identity,
                hostname=self.hostname,
                lease_duration_seconds=self._lease_duration,
                renew_time=now,
                binary_version=self.binary_version,
                peer_advertise_address=self.peer_advertise_address,
            )
        )
        previous, self._last_renewal = self._last_renewal, now
        if previous is not None and now - previous >= self._rejoin_after:
            log.warning(
                "apiserver %s renewed its lease %s after the previous renewal (lease "
                "duration %d s); it may have expired: reporting every resource again",
                self.apiserver_id,
                now - previous,
                self._lease_duration,
            )
            self._acknowledged.clear()
            self._refresh_gate()

    async def _sync(self) -> None:
        """Send the reports and withdrawals that the log does not hold yet."""
        reports = self._unacknowledged()
        withdrawn = sorted(k for k in self._acknowledged if k not in self._desired)
        if not reports and not withdrawn:
            return
        events: list[Event] = [
            StorageVersionWithdrawn(
                meta=self._meta(), apiserver_id=self.apiserver_id, group=group, resource=resource
            )
            for group, resource in withdrawn
        ]
        events.extend(
            StorageVersionReported(
                meta=self._meta(),
                apiserver_id=self.apiserver_id,
                group=r.group,
                resource=r.resource,
                kind=r.kind,
                encoding_version=r.encoding_version,
                decodable_versions=r.decodable_versions,
                served_versions=r.served_versions,
            )
            for r in reports
        )
        try:
            await self._producer.send_many(events)
        except Exception as error:
            self._failed(error)
            raise
        for key in withdrawn:
            del self._acknowledged[key]
        self._acknowledged.update((r.key, r) for r in reports)
        self._refresh_gate()

    def _failed(self, error: BaseException) -> None:
        """Name ``error`` in the 503 of every resource still pending: upstream's message
        carries the last error its registration met (a blank one is named by its type)."""
        self.gate.fail(self.gate.pending, str(error) or type(error).__name__)

    def _next_interval(self) -> float:
        return self._interval * (1.0 + self._rng.random() * self._jitter)

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._clock.sleep(self._next_interval())
            try:
                async with self._lock:
                    await self._told_while_waiting(self._register())
            except Exception as error:
                self._failed(error)
                log.warning(
                    "apiserver %s: heartbeat or report failed, trying again next tick: %s: %s",
                    self.apiserver_id,
                    type(error).__name__,
                    error,
                )

    async def _told_while_waiting(self, registering: Coroutine[Any, Any, None]) -> None:
        """Await ``registering``, warning every heartbeat interval that Kafka has not
        acknowledged it yet: aiokafka holds a send while the broker is away, so a heartbeat
        waits rather than fails, and the lease lapses unless it lands in time."""
        task = asyncio.ensure_future(registering)
        waited = 0.0
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._interval)
                if done:
                    return task.result()
                waited += self._interval
                log.warning(
                    "apiserver %s: Kafka has not acknowledged its heartbeat in %.0f s; still"
                    " trying (its lease lapses %d s after the last renewal acknowledged)",
                    self.apiserver_id,
                    waited,
                    self._lease_duration,
                )
        finally:
            task.cancel()


class _WaitedOut(TimeoutError):
    """A :class:`ThreadedReporter` call's wait ran out (not the call's own timeout)."""


async def _cancel_the_rest() -> None:
    """Cancel the loop's other tasks (a producer's that did not close) and let them end."""
    rest = asyncio.all_tasks() - {asyncio.current_task()}
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


class ThreadedReporter:
    """A :class:`Reporter` behind a blocking API, on its own event loop in a daemon thread.

    It owns its producer, built from ``settings``; every other argument is the
    reporter's. Use as a context manager or call ``start()`` / ``stop()``, once: ``stop``
    ends the thread. ``start()`` returns once registered, as the asyncio reporter's: while
    Kafka is away it tries again every heartbeat interval (connecting its producer too),
    but for at most ``timeout`` seconds (None: no bound), then raises ``TimeoutError``
    and stops trying, the gate closed. ``timeout`` bounds every other call too.
    """

    def __init__(
        self,
        cluster: str,
        hostname: str,
        resources: Iterable[ResourceReport],
        settings: KafkaSettings,
        clock: Clock | None = None,
        *,
        timeout: float | None = 60.0,
        **options: Unpack[ReporterOptions],
    ) -> None:
        if not isinstance(settings, KafkaSettings):
            raise TypeError(
                f"settings={settings!r} must be KafkaSettings (KafkaSettings.from_env() reads"
                " SVLEDGER_KAFKA_BOOTSTRAP and the rest); the threaded reporter makes its own"
                " producer"
            )
        self._timeout = timeout
        self._producer = EventProducer(settings)
        self._reporter = Reporter(cluster, hostname, resources, self._producer, clock, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"svledger-reporter-{hostname}", daemon=True
        )
        self._thread.start()

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(self._timeout)
        except TimeoutError:
            if future.done():
                raise  # the call's own
            # The work ends with the wait: a call the caller was told had failed must
            # not go on and change the gate later.
            future.cancel()
            raise _WaitedOut from None

    @property
    def gate(self) -> WriteGate:
        return self._reporter.gate

    @property
    def ready(self) -> bool:
        return self._reporter.ready

    @property
    def apiserver_id(self) -> str:
        return self._reporter.apiserver_id

    def start(self) -> None:
        try:
            self._run(self._start())
        except _WaitedOut:
            raise TimeoutError(
                f"apiserver {self.apiserver_id} did not register in {self._timeout} s and"
                " stopped trying (its writes stay closed); last seen error:"
                f" {self.gate.error or 'none yet'};"
                f" is Kafka at {self._producer.settings.bootstrap_servers} reachable?"
            ) from None

    async def _start(self) -> None:
        try:
            await self._reporter.start()  # it connects the producer
        except BaseException:
            await self._producer.__aexit__(None, None, None)
            raise

    def stop(self) -> None:
        """Release the lease, close the producer and end the loop's thread: within the
        reporter's shutdown timeout and the producer's (10 s each), Kafka reachable or
        not."""
        try:
            self._run(self._stop())
        finally:
            self._run(_cancel_the_rest())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self._timeout)
            self._loop.close()

    async def _stop(self) -> None:
        try:
            await self._reporter.stop()
        finally:
            await self._producer.__aexit__(None, None, None)

    def update(self, resources: Iterable[ResourceReport]) -> None:
        self._run(self._reporter.update(list(resources)))

    def __enter__(self) -> ThreadedReporter:
        try:
            self.start()
        except BaseException:
            with contextlib.suppress(TimeoutError):  # the start's error is the one to tell
                self.stop()  # no exit follows a failed entry: end the thread here
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
