"""What an operator appends by hand: a migration request and a StorageState reset.

Both read the ledger first (every partition up to its current end, folded with the
projections' fold) and refuse, with the offending value and what to do, anything
the fold would only reject later:

* :func:`request_migration` asks for a migration of a resource to its **common**
  encoding version, at the StorageVersion's current revision. There is no other
  safe target: while apiservers disagree, objects keep being written in more than
  one version. ``version``, when given, must be that common version (a check that
  the operator migrates to what they think). A request is refused while another
  migration of the resource is Pending or Running.
* :func:`reset_storage_state` sets the persisted hashes back to ``["Unknown"]``
  (for example after restoring etcd from a backup); the fold cancels the resource's
  Pending or Running migration with it, and the migration trigger requests a fresh one.

The operator's name is the events' ``meta.source``. As with the migrator, the rules
are pure functions of the folded log (:func:`decide_request`, :func:`decide_reset`,
tested without I/O); the two coroutines only read the log, decide and append.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from ledger.errors import UsageError
from ledger.events import Event, Meta, MigrationRequested, StorageStateReset
from ledger.kafka import EventProducer
from ledger.names import resource_name
from ledger.settings import KafkaSettings
from ledger.validation import check_group, check_resource, check_version
from projections.fold import active_migrations
from projections.replay import cluster_log
from projections.state import ResourceKey, State, StorageVersion


class OperatorError(UsageError):
    """An operator command that cannot be carried out; the message says why and what to do."""


async def request_migration(
    settings: KafkaSettings,
    cluster: str,
    group: str,
    resource: str,
    version: str | None,
    operator: str,
) -> MigrationRequested:
    """Append a ``MigrationRequested`` to the common encoding version; return it."""
    _check(cluster, group, resource, operator)
    state, _ = await cluster_log(settings, cluster)
    event = decide_request(
        state,
        Meta.new(cluster, operator, datetime.now(UTC)),
        group,
        resource,
        version,
        migration_id=str(uuid.uuid4()),
    )
    await _append(settings, event)
    return event


async def reset_storage_state(
    settings: KafkaSettings, cluster: str, group: str, resource: str, reason: str, operator: str
) -> StorageStateReset:
    """Append a ``StorageStateReset`` (persisted hashes back to ``["Unknown"]``); return it."""
    _check(cluster, group, resource, operator)
    state, _ = await cluster_log(settings, cluster)
    event = decide_reset(
        state, Meta.new(cluster, operator, datetime.now(UTC)), group, resource, reason
    )
    await _append(settings, event)
    return event


def decide_request(
    state: State,
    meta: Meta,
    group: str,
    resource: str,
    version: str | None,
    *,
    migration_id: str,
) -> MigrationRequested:
    """The request an operator may append for ``resource`` now, or :class:`OperatorError`."""
    cluster = meta.cluster
    key = _check(cluster, group, resource, meta.source)
    if version is not None:
        check_version("version", version)
    storage_version = _storage_version(state, key)
    storage_state = state.storage_states.get(key)
    name = resource_name(group, resource)
    common = storage_version.common_encoding_version
    target_hash = storage_state.current_storage_version_hash if storage_state else None
    if common is None or target_hash is None:
        versions = sorted({e.encoding_version for e in storage_version.entries})
        raise OperatorError(
            f"the apiservers of cluster {cluster!r} disagree on the encoding version of"
            f" {name!r} ({', '.join(versions)}); a migration now would be undone by the"
            " servers still writing another version: finish the rollout first"
        )
    if version is not None and version != common:
        raise OperatorError(
            f"version {version!r} is not the common encoding version {common!r} of {name!r}"
            f" in cluster {cluster!r}; migrate to {common!r} (or omit --version)"
        )
    active = active_migrations(state, key)
    if active:
        raise OperatorError(
            f"migration {active[0].migration_id!r} of {name!r} in cluster {cluster!r} is"
            f" already {active[0].phase}; wait for it to end before requesting another"
        )
    return MigrationRequested(
        meta=meta,
        migration_id=migration_id,
        group=group,
        resource=resource,
        target_version=common,
        target_hash=target_hash,
        storage_version_revision=storage_version.revision,
    )


def decide_reset(
    state: State, meta: Meta, group: str, resource: str, reason: str
) -> StorageStateReset:
    """The reset an operator may append for ``resource`` now, or :class:`OperatorError`."""
    cluster = meta.cluster
    key = _check(cluster, group, resource, meta.source)
    if not reason.strip():
        raise OperatorError("give a reason for the reset, e.g. --reason 'etcd restored'")
    if key not in state.storage_states:
        raise OperatorError(
            f"no StorageState for {resource_name(group, resource)!r} in cluster {cluster!r};"
            " check the group (empty for core) and the resource (plural, lowercase)"
        )
    return StorageStateReset(meta=meta, group=group, resource=resource, reason=reason)


def _check(cluster: str, group: str, resource: str, operator: str) -> ResourceKey:
    if not cluster:
        raise OperatorError("give the cluster name (the events' meta.cluster)")
    if not operator.strip():
        raise OperatorError("give the operator's name (--operator), recorded as the source")
    try:
        check_group(group)
        check_resource(resource)
    except ValueError as error:
        raise OperatorError(str(error)) from None
    return (cluster, group, resource)


def _storage_version(state: State, key: ResourceKey) -> StorageVersion:
    storage_version = state.storage_versions.get(key)
    if storage_version is None:
        cluster, group, resource = key
        raise OperatorError(
            f"no live apiserver of cluster {cluster!r} reports {resource_name(group, resource)!r};"
            " check the group (empty for core) and the resource (plural, lowercase)"
        )
    return storage_version


async def _append(settings: KafkaSettings, event: Event) -> None:
    async with EventProducer(settings) as producer:
        await producer.send(event)
