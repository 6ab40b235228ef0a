"""Hypothesis strategies for every ledger event type.

Each event type has a strategy named after it in snake case (``apiserver_heartbeat``,
``migration_requested``, ...) and :func:`events` draws from all of them. What the
identifying fields (cluster, apiserver ID, group, resource, versions, migration ID)
are drawn from is a :class:`Domains`: :data:`ANY` spans the whole Avro value space
(any Unicode text, any time from year 1 to 9999), which is what a codec test wants;
:data:`FEW` draws from a handful of realistic values, so that random sequences of
events keep hitting the same apiservers and resources, which is what a fold test
wants. Every strategy takes ``domains`` as a keyword.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime

from hypothesis import strategies as st

from ledger.events import (
    EVENT_TYPES,
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    CustomResourceDefinitionObserved,
    Event,
    Meta,
    MigrationCancelled,
    MigrationFailed,
    MigrationProgressed,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    StorageAudited,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
)
from ledger.hashing import storage_version_hash

# Avro strings are UTF-8, which cannot carry lone surrogates.
# No NUL: the codec refuses it (no database's text can store one).
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def utc_datetimes(
    min_value: datetime = datetime(1, 1, 1), max_value: datetime = datetime(9999, 12, 31)
) -> st.SearchStrategy[datetime]:
    """Timezone-aware UTC datetimes with microseconds, between two naive bounds."""
    return st.datetimes(min_value=min_value, max_value=max_value, timezones=st.just(UTC))


ANY_TIME = utc_datetimes()


@dataclasses.dataclass(frozen=True)
class Domains:
    """Where identifying fields come from."""

    clusters: st.SearchStrategy[str] = TEXT
    apiserver_ids: st.SearchStrategy[str] = TEXT
    hostnames: st.SearchStrategy[str] = TEXT
    groups: st.SearchStrategy[str] = TEXT
    resources: st.SearchStrategy[str] = TEXT
    kinds: st.SearchStrategy[str] = TEXT
    versions: st.SearchStrategy[str] = TEXT
    migration_ids: st.SearchStrategy[str] = TEXT
    texts: st.SearchStrategy[str] = TEXT
    times: st.SearchStrategy[datetime] = ANY_TIME
    durations: st.SearchStrategy[int] = LONG
    counts: st.SearchStrategy[int] = LONG


ANY = Domains()

FEW = Domains(
    clusters=st.sampled_from(["prod", "staging"]),
    apiserver_ids=st.sampled_from(["apiserver-a", "apiserver-b", "apiserver-c"]),
    hostnames=st.sampled_from(["cp-1", "cp-2", "cp-3"]),
    groups=st.sampled_from(["", "apps", "batch"]),
    resources=st.sampled_from(["deployments", "jobs", "pods"]),
    kinds=st.sampled_from(["Deployment", "Job", "Pod"]),
    versions=st.sampled_from(["v1", "v2", "v1beta1"]),
    migration_ids=st.sampled_from(["m-1", "m-2", "m-3", "m-4"]),
    texts=st.sampled_from(["", "EncodingVersionsDisagree", "operator request"]),
    times=utc_datetimes(datetime(2024, 1, 1), datetime(2024, 1, 2)),
    durations=st.sampled_from([15, 3600]),
    counts=st.integers(min_value=0, max_value=10_000),
)


def metas(*, domains: Domains = ANY) -> st.SearchStrategy[Meta]:
    optional_ids = st.none() | st.uuids().map(str)
    return st.builds(
        Meta,
        event_id=st.uuids().map(str),
        cluster=domains.clusters,
        occurred_at=domains.times,
        source=domains.apiserver_ids | domains.texts,
        causation_id=optional_ids,
        correlation_id=optional_ids,
    )


def apiserver_heartbeat(*, domains: Domains = ANY) -> st.SearchStrategy[ApiserverHeartbeat]:
    return st.builds(
        ApiserverHeartbeat,
        meta=metas(domains=domains),
        apiserver_id=domains.apiserver_ids,
        holder_identity=st.builds(
            lambda apiserver_id, instance: f"{apiserver_id}_{instance}",
            domains.apiserver_ids,
            st.uuids(),
        ),
        hostname=domains.hostnames,
        lease_duration_seconds=domains.durations,
        renew_time=domains.times,
        binary_version=st.none() | domains.versions,
        peer_advertise_address=st.none() | st.sampled_from(["10.0.0.1:6443", "[fd00::1]:443"]),
    )


def apiserver_lease_released(
    *, domains: Domains = ANY
) -> st.SearchStrategy[ApiserverLeaseReleased]:
    return st.builds(
        ApiserverLeaseReleased,
        meta=metas(domains=domains),
        apiserver_id=domains.apiserver_ids,
        holder_identity=domains.texts,
    )


def apiserver_lease_expired(*, domains: Domains = ANY) -> st.SearchStrategy[ApiserverLeaseExpired]:
    return st.builds(
        ApiserverLeaseExpired,
        meta=metas(domains=domains),
        apiserver_id=domains.apiserver_ids,
        last_renew_time=domains.times,
        lease_duration_seconds=domains.durations,
    )


@st.composite
def storage_version_reported(draw: st.DrawFn, *, domains: Domains = ANY) -> StorageVersionReported:
    """Reports whose encoding version is among the decodable versions, as valid ones are."""
    encoding_version = draw(domains.versions)
    others = draw(st.lists(domains.versions, max_size=3))
    decodable = draw(st.permutations(list(dict.fromkeys([encoding_version, *others]))))
    return StorageVersionReported(
        meta=draw(metas(domains=domains)),
        apiserver_id=draw(domains.apiserver_ids),
        group=draw(domains.groups),
        resource=draw(domains.resources),
        kind=draw(domains.kinds),
        encoding_version=encoding_version,
        decodable_versions=tuple(decodable),
        served_versions=tuple(draw(st.lists(domains.versions, max_size=3, unique=True))),
    )


def storage_version_withdrawn(
    *, domains: Domains = ANY
) -> st.SearchStrategy[StorageVersionWithdrawn]:
    return st.builds(
        StorageVersionWithdrawn,
        meta=metas(domains=domains),
        apiserver_id=domains.apiserver_ids,
        group=domains.groups,
        resource=domains.resources,
    )


def storage_state_reset(*, domains: Domains = ANY) -> st.SearchStrategy[StorageStateReset]:
    return st.builds(
        StorageStateReset,
        meta=metas(domains=domains),
        group=domains.groups,
        resource=domains.resources,
        reason=domains.texts,
    )


@st.composite
def migration_requested(draw: st.DrawFn, *, domains: Domains = ANY) -> MigrationRequested:
    """Requests whose target hash is the hash of their target version, as real ones are."""
    group = draw(domains.groups)
    target_version = draw(domains.versions)
    kind = draw(domains.kinds)
    try:
        target_hash = storage_version_hash(group, target_version, kind)
    except ValueError:  # a drawn name the hash refuses (e.g. containing '/')
        target_hash = draw(domains.texts)
    partition, offset = draw(st.integers(0, 11)), draw(st.integers(0, 2**40))
    return MigrationRequested(
        meta=draw(metas(domains=domains)),
        migration_id=draw(domains.migration_ids),
        group=group,
        resource=draw(domains.resources),
        target_version=target_version,
        target_hash=target_hash,
        storage_version_revision=f"{partition}:{offset}",
    )


MigrationStatusClass = (
    type[MigrationStarted]
    | type[MigrationProgressed]
    | type[MigrationSucceeded]
    | type[MigrationFailed]
    | type[MigrationCancelled]
)


def _migration_status(cls: MigrationStatusClass, domains: Domains) -> st.SearchStrategy[Event]:
    return st.builds(
        cls,
        meta=metas(domains=domains),
        migration_id=domains.migration_ids,
        objects_migrated=domains.counts,
        continue_token=st.none() | domains.texts,
        reason=st.none() | domains.texts,
        message=st.none() | domains.texts,
    )


def migration_started(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    return _migration_status(MigrationStarted, domains)


def migration_progressed(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    return _migration_status(MigrationProgressed, domains)


def migration_succeeded(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    return _migration_status(MigrationSucceeded, domains)


def migration_failed(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    return _migration_status(MigrationFailed, domains)


def migration_cancelled(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    return _migration_status(MigrationCancelled, domains)


def _bare_versions(domains: Domains) -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(domains.versions, max_size=3, unique=True).map(tuple)


@st.composite
def custom_resource_definition_observed(
    draw: st.DrawFn, *, domains: Domains = ANY
) -> CustomResourceDefinitionObserved:
    """The state of a CustomResourceDefinition: its storage version among its versions."""
    versions = draw(st.lists(domains.versions, min_size=1, max_size=3, unique=True))
    storage = draw(st.sampled_from(versions))
    status = draw(st.none() | st.sampled_from(["True", "False"]))
    return CustomResourceDefinitionObserved(
        meta=draw(metas(domains=domains)),
        group=draw(domains.groups),
        resource=draw(domains.resources),
        kind=draw(domains.kinds),
        name=draw(domains.texts),
        uid=draw(st.sampled_from(["uid-1", "uid-2"])),
        generation=draw(domains.counts),
        resource_version=draw(domains.texts),
        versions=tuple(versions),
        served_versions=tuple(draw(st.lists(st.sampled_from(versions), unique=True))),
        storage_version=storage,
        stored_versions=tuple(
            dict.fromkeys([*draw(st.lists(st.sampled_from(versions), unique=True)), storage])
        ),
        storage_migrating_status=status,
        storage_migrating_reason=None if status is None else draw(domains.texts),
        storage_migrating_message=None if status is None else draw(domains.texts),
        storage_migrating_observed_generation=None if status is None else draw(domains.counts),
        deleted=draw(st.booleans()),
    )


def stored_versions_pruned(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    return st.builds(
        StoredVersionsPruned,
        meta=metas(domains=domains),
        migration_id=domains.migration_ids,
        group=domains.groups,
        resource=domains.resources,
        name=domains.texts,
        generation=domains.counts,
        resource_version=domains.texts,
        stored_versions_before=_bare_versions(domains),
        stored_versions_after=_bare_versions(domains),
    )


def stored_versions_prune_refused(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    return st.builds(
        StoredVersionsPruneRefused,
        meta=metas(domains=domains),
        migration_id=domains.migration_ids,
        group=domains.groups,
        resource=domains.resources,
        name=domains.texts,
        stored_versions=_bare_versions(domains),
        reason=domains.texts,
        message=domains.texts,
    )


@st.composite
def storage_audited(draw: st.DrawFn, *, domains: Domains = ANY) -> StorageAudited:
    """An audit's count of one resource: parallel lists of one length each."""
    versions = draw(st.lists(domains.versions, max_size=3, unique=True))
    keys = draw(st.lists(domains.texts, max_size=2, unique=True))
    polluted = draw(st.lists(st.sampled_from(versions), unique=True)) if versions else []
    return StorageAudited(
        meta=draw(metas(domains=domains)),
        audit_id=draw(domains.texts),
        group=draw(domains.groups),
        resource=draw(domains.resources),
        etcd_revision=draw(domains.counts),
        ledger_offset=draw(domains.counts),
        objects=draw(domains.counts),
        total_bytes=draw(domains.counts),
        versions=tuple(versions),
        version_hashes=tuple(draw(domains.texts) for _ in versions),
        version_counts=tuple(draw(domains.counts) for _ in versions),
        encryption_keys=tuple(keys),
        encryption_counts=tuple(draw(domains.counts) for _ in keys),
        undecodable=draw(domains.counts),
        undecodable_keys=tuple(draw(st.lists(domains.texts, max_size=2))),
        polluted_versions=tuple(polluted),
        pollution=draw(domains.texts) if polluted else None,
    )


BY_TYPE: dict[str, Callable[..., st.SearchStrategy[Event]]] = {
    "ApiserverHeartbeat": apiserver_heartbeat,
    "ApiserverLeaseReleased": apiserver_lease_released,
    "ApiserverLeaseExpired": apiserver_lease_expired,
    "StorageVersionReported": storage_version_reported,
    "StorageVersionWithdrawn": storage_version_withdrawn,
    "StorageStateReset": storage_state_reset,
    "MigrationRequested": migration_requested,
    "MigrationStarted": migration_started,
    "MigrationProgressed": migration_progressed,
    "MigrationSucceeded": migration_succeeded,
    "MigrationFailed": migration_failed,
    "MigrationCancelled": migration_cancelled,
    "CustomResourceDefinitionObserved": custom_resource_definition_observed,
    "StoredVersionsPruned": stored_versions_pruned,
    "StoredVersionsPruneRefused": stored_versions_prune_refused,
    "StorageAudited": storage_audited,
}
assert BY_TYPE.keys() == EVENT_TYPES.keys(), "every event type needs a strategy"


def events(*, domains: Domains = ANY) -> st.SearchStrategy[Event]:
    """Any event of any type."""
    return st.one_of([strategy(domains=domains) for strategy in BY_TYPE.values()])
