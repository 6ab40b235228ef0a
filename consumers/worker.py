"""The migration worker: rewrite every object of a resource so it is stored in the target version.

Upstream semantics (kube-storage-version-migrator): list the resource in chunks of
500 with continue tokens and rewrite each object unchanged (a no-op update makes the
apiserver re-encode it in its storage version); a conflict means the object changed
since it was read, so read it again and retry; not found means it is gone, which
counts as done; 429, 5xx and timeouts are retried with backoff, or after the wait the
server asks for (``Retry-After``, or a ``Status``'s ``retryAfterSeconds``, as upstream's
``SuggestsClientDelay``) (each retry is counted in ``svledger_worker_retries_total``,
:mod:`ledger.metrics`).

:func:`migrate` runs one migration against a :class:`~consumers.targets.Target` and
reports through ``append``: ``MigrationStarted`` (when it was Pending), one
``MigrationProgressed(objects_migrated, continue_token)`` after each chunk, then
``MigrationSucceeded``, or ``MigrationFailed(reason, message)``. As in upstream's
migrator, an object whose rewrite fails does not stop its chunk: every object of the
chunk gets its rewrite, then the migration fails naming the first failure, at the
chunk's starting token. The migrator's next attempt of the same decision resumes
there (:func:`resumed`). Where upstream's migrator retries every error but 405 without
end, the worker gives up after ``RetryPolicy.max_retries`` and at once on a refusal
that retrying cannot cure (401, 403, 400, 422, 405): the migration fails with a reason
an operator can read and act on, and the migrator requests it again after its
back-off, rather than a worker spinning on a 403 for ever. A migration that is already
Running resumes from its last continue token, so a restarted worker redoes at most one
chunk (rewrites are idempotent). ``cancelled`` is asked between objects, so a ``MigrationCancelled``
stops the run within one object's rewrite.

:func:`run_worker` is the shell. It follows the log with
:class:`~consumers.partitions.PartitionFollower`: migrations belong to a cluster and
a cluster to one partition, so the member that owns a partition runs its migrations,
one at a time, a running one first, then the oldest request. ``svledger worker
--cluster NAME`` runs one cluster's migrations only, through that cluster's API
server, in a group of its own per cluster (``svledger-worker.NAME``); such a worker
still follows and folds every partition, though it acts on one. Its events are
appended through the partition's transactional producer: a worker that lost the
partition (rebalance, or a zombie after a restart) is fenced at its next append and
stops. After each terminal event the runner waits until the fold has read
it back before picking the next migration, and a cancellation appended by the
migrator reaches the runner through the same fold.

The migrator decides on the log as far as it has read it, so a request can land after
an event that already voids it (an apiserver that stopped agreeing a moment before):
no log can make an append conditional on what others appended meanwhile. The worker
therefore runs a migration only while its own fold finds it current
(:func:`projections.fold.stale_reason`, the rule that would refuse its success): it
does not start a stale one, and stops a running one that becomes stale, without
waiting for the migrator's cancellation, which follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Final, Protocol, TypeAlias, TypeVar

from consumers.migrator import migration_id
from consumers.partitions import PartitionFollower, PartitionLog, PartitionLost
from consumers.targets import (
    Conflict,
    NotFound,
    ObjectRef,
    Target,
    TargetError,
    TargetFailed,
    TooManyRequests,
    Transient,
)
from ledger import metrics
from ledger.clock import Clock
from ledger.errors import AccessDenied
from ledger.events import (
    Event,
    Meta,
    MigrationFailed,
    MigrationProgressed,
    MigrationStarted,
    MigrationSucceeded,
)
from ledger.kafka import BROKER_ERRORS, Placements
from ledger.names import group_resource_string
from ledger.settings import KafkaSettings
from projections.fold import stale_reason
from projections.snapshots import SnapshotSource
from projections.state import Migration, MigrationKey, State

log = logging.getLogger(__name__)

SOURCE: Final = "svledger-worker"
GROUP_ID: Final = "svledger-worker"
CHECK_RETRY_SECONDS: Final = 5.0  # a migration its check keeps waiting is tried again
CHUNK_SIZE: Final = 500

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently one call to the target is retried."""

    max_retries: int = 8
    backoff: float = 1.0  # seconds before the first retry; doubles each time
    max_backoff: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        return float(min(self.backoff * 2**attempt, self.max_backoff))


class RetriesExhausted(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


async def _retrying(
    call: Callable[[], Awaitable[_T]], what: str, policy: RetryPolicy, clock: Clock
) -> _T:
    attempt = 0
    while True:
        try:
            return await call()
        except Conflict as error:
            reason, delay = "Conflict", 0.0  # re-read at once: rewrite reads the object again
            last: TargetError = error
        except TooManyRequests as error:
            reason, delay = "TooManyRequests", policy.delay(attempt, error.retry_after)
            last = error
        except Transient as error:
            reason, delay = "Transient", policy.delay(attempt, error.retry_after)
            last = error
        except TargetError:
            raise
        except Exception as error:
            log.exception("%s: the target raised %s", what, type(error).__name__)
            raise TargetFailed(f"{type(error).__name__}: {error}") from error
        if attempt >= policy.max_retries:
            raise RetriesExhausted(
                reason, f"{what}: gave up after {attempt + 1} attempts: {last}"
            ) from last
        attempt += 1
        metrics.WORKER_RETRIES.labels(reason).inc()
        await clock.sleep(delay)


async def migrate(
    migration: Migration,
    target: Target,
    *,
    append: Callable[[Sequence[Event]], Awaitable[object]],
    cancelled: Callable[[], bool],
    clock: Clock,
    chunk_size: int = CHUNK_SIZE,
    policy: RetryPolicy = RetryPolicy(),
) -> None:
    """Run ``migration`` to its end (or until ``cancelled()``), reporting through ``append``."""

    def meta() -> Meta:
        return Meta.new(migration.cluster, SOURCE, clock.now())

    group, resource, mid = migration.group, migration.resource, migration.migration_id
    done = migration.objects_migrated
    token = migration.continue_token
    if migration.phase == "Pending":
        await append([MigrationStarted(meta(), mid, objects_migrated=done, continue_token=token)])
    try:
        while True:
            page = await _retrying(
                functools.partial(target.list, group, resource, token, chunk_size),
                f"listing {group_resource_string(group, resource)} after {token!r}",
                policy,
                clock,
            )
            failure: tuple[str, str] | None = None  # the chunk's first (reason, message)
            for ref in page.objects:
                if cancelled():
                    return
                try:
                    with contextlib.suppress(NotFound):  # gone: nothing left to migrate
                        await _retrying(
                            functools.partial(target.rewrite, group, resource, ref),
                            f"rewriting {_shown(ref)}",
                            policy,
                            clock,
                        )
                except (RetriesExhausted, TargetError) as error:
                    # As upstream's migrator: the rest of the chunk still gets its
                    # rewrite; the migration fails after the chunk, naming the first.
                    if failure is None:
                        failure = _failure(error, _shown(ref))
            if failure is not None:
                reason, message = failure
                await append([MigrationFailed(meta(), mid, done, token, reason, message)])
                return
            # Counted per chunk, so the count always matches the continue token.
            done += len(page.objects)
            token = page.continue_token
            if token is None:
                await append([MigrationSucceeded(meta(), mid, objects_migrated=done)])
                return
            if cancelled():
                return
            await append([MigrationProgressed(meta(), mid, done, token)])
    except (RetriesExhausted, TargetError) as error:  # listing failed
        reason, message = _failure(error, f"listing {group_resource_string(group, resource)}")
        await append([MigrationFailed(meta(), mid, done, token, reason, message)])


def _failure(error: RetriesExhausted | TargetError, what: str) -> tuple[str, str]:
    """The reason and message of a MigrationFailed for ``error``, naming what failed."""
    if isinstance(error, RetriesExhausted):
        return error.reason, error.message
    return type(error).__name__, f"{what}: {error}"


def _shown(ref: ObjectRef) -> str:
    return ref.name if ref.namespace is None else f"{ref.namespace}/{ref.name}"


def next_migrations(
    state: State, cluster: str | None = None, *, current_only: bool = True
) -> list[Migration]:
    """The Pending or Running migrations of the partition's clusters (or of ``cluster``):
    the Running ones first (a worker stopped while running them), as upstream's migrator
    takes running migrations before pending ones, then oldest request first; with
    ``current_only``, not those that are stale already (:func:`projections.fold.stale_reason`)."""
    active = [
        m
        for m in state.migrations.values()
        if m.active
        and (cluster is None or m.cluster == cluster)
        and not (current_only and stale_reason(state, m) is not None)
    ]
    return sorted(active, key=lambda m: (m.phase != "Running", m.requested_at, m.migration_id))


def migration_cancelled(state: State, key: MigrationKey, *, current_only: bool = True) -> bool:
    """Whether the migration ``key`` should stop: it ended (cancelled, most often), it is
    no longer in the view at all (an ended migration is dropped when its resource's next
    one is requested: the migrator cancels and requests again in one transaction), or,
    with ``current_only``, it is stale: its StorageVersion moved since the request, so
    its success would not count and the migrator cancels it once it reads the same."""
    migration = state.migrations.get(key)
    if migration is None or not migration.active:
        return True
    return current_only and stale_reason(state, migration) is not None


def resumed(state: State, migration: Migration) -> Migration:
    """``migration``, set to go on where the failed attempt before it stopped, if it can.

    The migrator requests a failed migration again, after its back-off, as attempt n
    of the same decision (:func:`consumers.migrator.migration_id`: the same target, the
    same StorageVersion revision, the same StorageState revision). While those hold, no
    apiserver has encoded the resource in another version since attempt n-1 was
    requested and nobody reset the StorageState, so every object attempt n-1 rewrote
    is still stored in the target version: a Pending attempt n starts from the
    continue token and count attempt n-1 failed at (DESIGN.md asks for it; upstream's
    migrator resumes a migration from its ``continueToken`` only when it restarts while
    running it, and requests a failed one anew). Anything else starts from the beginning.
    """
    storage_state = state.storage_states.get(migration.resource_key)
    if migration.phase != "Pending" or migration.continue_token or storage_state is None:
        return migration
    previous: Migration | None = None
    for attempt in itertools.count():
        earlier = migration_id(
            migration.resource_key,
            migration.target_hash,
            migration.storage_version_revision,
            storage_state.revision,
            attempt,
        )
        if earlier == migration.migration_id:
            break
        previous = state.migrations.get((migration.cluster, earlier))
        if previous is None:
            return migration  # not the migrator's attempt on the current state
    if previous is None or previous.phase != "Failed" or not previous.continue_token:
        return migration
    return dataclasses.replace(
        migration,
        objects_migrated=previous.objects_migrated,
        continue_token=previous.continue_token,
    )


def next_migration(
    state: State, cluster: str | None = None, *, current_only: bool = True
) -> Migration | None:
    """The oldest migration :func:`next_migrations` gives, if any."""
    return next(iter(next_migrations(state, cluster, current_only=current_only)), None)


Append: TypeAlias = Callable[[Sequence[Event]], Awaitable[object]]


# Asked before a migration starts (run_worker's ``check``): why it must wait, if it must.
ClusterCheck: TypeAlias = Callable[[State, str], Awaitable[str | None]]


class Executor(Protocol):
    """Runs one migration to its end, reporting its steps through ``append``.

    :class:`Rewriter` rewrites the objects itself (upstream's out-of-tree migrator);
    :class:`kube.executor.StorageMigrationExecutor` has kube-controller-manager's
    in-tree migrator do it.
    """

    async def run(
        self, migration: Migration, *, append: Append, cancelled: Callable[[], bool]
    ) -> None: ...


class Hooks(Protocol):
    """Told of each migration the worker runs: before its executor runs it, and once its
    end is folded (:class:`kube.stored_versions.StoredVersionsPruner` marks a custom
    resource's CRD while it runs and prunes its ``status.storedVersions`` after).

    ``ended`` gets the partition's fold state, which holds the migration's end (phase
    Succeeded, Failed or Cancelled), and may append events of its own through ``append``.
    """

    async def started(self, migration: Migration) -> None: ...

    async def ended(self, state: State, migration: Migration, append: Append) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Rewriter:
    """The executor that rewrites every object through a :class:`Target` (:func:`migrate`)."""

    target: Target
    clock: Clock
    chunk_size: int = CHUNK_SIZE
    policy: RetryPolicy = RetryPolicy()

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk size {self.chunk_size!r} must be at least 1, e.g. 500")

    async def run(
        self, migration: Migration, *, append: Append, cancelled: Callable[[], bool]
    ) -> None:
        await migrate(
            migration,
            self.target,
            append=append,
            cancelled=cancelled,
            clock=self.clock,
            chunk_size=self.chunk_size,
            policy=self.policy,
        )


async def run_worker(
    settings: KafkaSettings,
    executor: Executor,
    *,
    stop: asyncio.Event,
    group_id: str = GROUP_ID,
    cluster: str | None = None,
    concurrency: int = 1,
    snapshots: SnapshotSource | None = None,
    current_only: bool = True,
    check: ClusterCheck | None = None,
    hooks: Hooks | None = None,
) -> None:
    """Run the migrations of the partitions this member owns until ``stop`` is set.

    ``concurrency`` migrations at once, running ones first, then the oldest requests
    (never two of one resource: a resource has at most one active migration). One
    suits the rewriting executor, which shares the apiserver's capacity; the in-tree
    executor hands the work to kube-controller-manager, which runs migrations of
    different resources side by side.

    With ``cluster``, only that cluster's migrations: an executor that reaches one
    cluster's apiserver must not run another's. Workers of different clusters then
    need groups of their own (each follows every partition); the transactional ids
    derive from ``group_id``, so they do not fence one another.

    ``snapshots``: the projector's database, to rebuild partitions from their latest
    fold snapshots instead of the log's beginning (:mod:`consumers.partitions`).

    ``check``: asked before each migration starts, with the partition's fold state and
    the migration's cluster; a reason it returns keeps the migration waiting (logged),
    tried again when the log moves or :data:`CHECK_RETRY_SECONDS` later
    (:class:`kube.cluster_check.IdentityCheck`: whether the executor's API server is
    that cluster's).

    ``hooks``: told of each migration before it runs and after its end is folded
    (:class:`Hooks`). One that fails is logged with the migration's ID; the migration,
    and the next, run on regardless.

    ``current_only=False`` runs every migration requested, stale or not, as upstream's
    migrator runs every StorageVersionMigration it is given: only for the baselines
    that show what a trigger without the ledger's agreement does (``simulate
    --trigger discovery-hash``, :mod:`deploy.kube.rolling_upgrade`).
    """
    follower = PartitionFollower(
        settings,
        group_id=group_id,
        transactional_prefix=f"{group_id}-{settings.topic}",
        events=False,  # it runs what the migrations' state says, and reads no lease
        snapshots=snapshots,
    )
    runners: dict[int, tuple[PartitionLog, asyncio.Task[None]]] = {}
    checked = cluster is None  # whether the cluster's partition was looked at, once read
    home: int | None = None  # the partition the cluster's events go to

    async def check_cluster(partition_log: PartitionLog) -> None:
        """Warn once if the cluster's partition, read to its end, has no event of it."""
        nonlocal checked, home
        if checked or not partition_log.caught_up:
            return
        if home is None:
            try:
                placed = await Placements(settings).where([str(cluster)], place=False)
                home = placed[str(cluster)]
            except BROKER_ERRORS:
                return  # told on the next move of the log
        if partition_log.partition != home:
            return  # another member's, or none of the cluster's events
        checked = True
        known = clusters_of(partition_log.state)
        if cluster not in known:
            log.warning(
                "no event of cluster %r in topic %s (partition %d, where its events go): its"
                " migrations run once it has some; that partition has clusters %s. Check"
                " --cluster",
                cluster,
                settings.topic,
                home,
                ", ".join(map(repr, sorted(known))) or "(none)",
            )

    async def run_one(partition_log: PartitionLog, migration: Migration) -> None:
        key = migration.key
        positions: list[int] = []

        async def append(events: Sequence[Event]) -> None:
            positions.extend(p.offset for p in await partition_log.commit(events))

        def cancelled() -> bool:
            return migration_cancelled(partition_log.state, key, current_only=current_only)

        # Where the failed attempt before it stopped: the in-tree executor cannot start
        # mid-list, but hands the resources it cannot migrate to the rewrite executor.
        migration = resumed(partition_log.state, migration)
        if hooks is not None:
            with _logged(migration, "started"):
                await hooks.started(migration)
        await executor.run(migration, append=append, cancelled=cancelled)
        # Done only once its last event is folded, so it is not picked again.
        await partition_log.wait_folded(max(positions, default=0) + 1)
        ended = partition_log.state.migrations.get(key)
        # A runner stopped while its migration is still active (made stale, its
        # cancellation still to come) has seen no end: nothing to tell.
        if hooks is not None and ended is not None and not ended.active:
            with _logged(migration, "ended"):
                await hooks.ended(partition_log.state, ended, append)

    async def refused(partition_log: PartitionLog, migration: Migration) -> float | None:
        """When to ask again (event loop time) if ``check`` keeps ``migration`` waiting,
        else None: asked again :data:`CHECK_RETRY_SECONDS` after its last answer at the
        soonest, however often the log moves (it may ask an API server), and said once a
        minute at most."""
        if check is None:
            return None
        loop = asyncio.get_running_loop()
        now = loop.time()
        ask_again, said = refusals.get(migration.cluster, (-math.inf, -math.inf))
        if now < ask_again:
            return ask_again
        reason = await check(partition_log.state, migration.cluster)
        if reason is None:
            refusals.pop(migration.cluster, None)
            return None
        if now >= said + 60.0:
            log.warning("migration %s waits: %s", migration.migration_id, reason)
            said = now
        ask_again = loop.time() + CHECK_RETRY_SECONDS  # from its answer
        refusals[migration.cluster] = (ask_again, said)
        return ask_again

    # Per cluster whose migrations wait: when to ask the check again, and when last said.
    refusals: dict[str, tuple[float, float]] = {}

    async def serve(partition_log: PartitionLog) -> None:
        running: dict[MigrationKey, asyncio.Task[None]] = {}
        try:
            while True:
                await partition_log.wait_folded()
                await check_cluster(partition_log)
                for key in [k for k, task in running.items() if task.done()]:
                    running.pop(key).result()  # a failure is the runner's, served again
                ask_again: float | None = None  # while a migration waits for the check
                for migration in next_migrations(
                    partition_log.state, cluster, current_only=current_only
                ):
                    if len(running) >= concurrency:
                        break
                    if migration.key in running:
                        continue
                    ask_again = await refused(partition_log, migration)
                    if ask_again is not None:
                        break
                    running[migration.key] = asyncio.create_task(run_one(partition_log, migration))
                moved = asyncio.create_task(partition_log.wait_moved())
                await asyncio.wait(
                    [moved, *running.values()],
                    timeout=None
                    if ask_again is None
                    else max(0.0, ask_again - asyncio.get_running_loop().time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                moved.cancel()
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    async with follower:
        try:
            async for folded in follower.batches(stop):
                for partition in [p for p in runners if p not in follower.logs]:
                    await _finish(runners.pop(partition)[1])
                partition_log = folded.log
                current = runners.get(partition_log.partition)
                if current is not None and (current[0] is not partition_log or current[1].done()):
                    await _finish(current[1])
                    current = None
                if current is None:
                    task = asyncio.create_task(serve(partition_log))
                    runners[partition_log.partition] = (partition_log, task)
        finally:
            for _, task in runners.values():
                await _finish(task)


@contextlib.contextmanager
def _logged(migration: Migration, hook: str) -> Iterator[None]:
    """Log a hook's failure with the migration's ID, and go on: a hook only accompanies
    the migration, whose own events are what the ledger must have. Not the partition's
    loss or a missing ACL met by its appends: those are the runner's, as ever."""
    try:
        yield
    except (PartitionLost, AccessDenied):
        raise
    except Exception:
        log.exception(
            "migration %s: the %s hook failed",
            migration.migration_id,
            hook,
            extra={"migration": migration.migration_id},
        )


def clusters_of(state: State) -> set[str]:
    """The clusters with a row in ``state``."""
    return {
        key[0]
        for rows in (state.leases, state.storage_versions, state.storage_states, state.migrations)
        for key in rows
    }


async def _finish(task: asyncio.Task[None]) -> None:
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, PartitionLost):
        pass
    except AccessDenied:
        raise  # a missing ACL: serving the partition again would be refused again
    except Exception:
        log.exception("migration runner failed; its partition is served again")
