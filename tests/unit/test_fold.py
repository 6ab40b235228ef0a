"""The fold rules, one readable scenario per test, upstream's cases among them.

Expected condition strings and hashes are written out from upstream (``updater.go``,
the storage-version-hash formula), not taken from the product's constants.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeAlias

import pytest

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    Event,
    Meta,
    MigrationCancelled,
    MigrationFailed,
    MigrationProgressed,
    MigrationRequested,
    MigrationStarted,
    MigrationStatusEvent,
    MigrationSucceeded,
    Position,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
)
from projections.agreement import agreement
from projections.fold import active_migrations, apply, live_leases
from projections.state import (
    SEEN_EVENT_WINDOW,
    Changes,
    Condition,
    Migration,
    ServerStorageVersion,
    State,
    StorageState,
    StorageVersion,
    lease_expired,
)
from tests.histories import storage_version_hash

T0 = datetime(2024, 1, 1, tzinfo=UTC)
PODS = ("", "pods", "Pod")
DEPLOYMENTS = ("apps", "deployments", "Deployment")
Status: TypeAlias = tuple[Literal["True", "False", "Unknown"], str, str]
SET: Status = ("True", "CommonEncodingVersionSet", "Common encoding version set")
UNSET: Status = ("False", "CommonEncodingVersionUnset", "Common encoding version unset")


class Log:
    """One cluster's partition: appends events a second apart and folds each in turn."""

    def __init__(self, state: State | None = None, cluster: str = "east", partition: int = 0):
        self.state = State() if state is None else state
        self.cluster = cluster
        self.partition = partition
        self.offset = -1
        self.now = T0
        self.holders: dict[str, str] = {}
        self.renewed: dict[str, datetime] = {}

    @property
    def revision(self) -> str:
        """The position of the last event appended."""
        return f"{self.partition}:{self.offset}"

    def meta(self, source: str) -> Meta:
        self.offset += 1
        self.now += timedelta(seconds=1)
        return Meta(f"{self.cluster}-{self.offset}", self.cluster, self.now, source)

    def append(self, event: Event) -> Changes:
        return apply(self.state, event, Position(self.partition, self.offset))

    def heartbeat(self, apiserver: str, holder: str | None = None) -> Changes:
        meta = self.meta(apiserver)
        self.holders[apiserver] = holder or self.holders.get(apiserver) or f"{apiserver}_1"
        self.renewed[apiserver] = meta.occurred_at
        return self.append(
            ApiserverHeartbeat(
                meta,
                apiserver,
                self.holders[apiserver],
                f"host-{apiserver}",
                3600,
                meta.occurred_at,
            )
        )

    def report(
        self,
        apiserver: str,
        encoding: str,
        decodable: tuple[str, ...] = ("v1", "v2"),
        served: tuple[str, ...] = ("v1",),
        resource: tuple[str, str, str] = PODS,
        source: str | None = None,
    ) -> Changes:
        group, name, kind = resource
        return self.append(
            StorageVersionReported(
                self.meta(apiserver),
                apiserver,
                group,
                name,
                kind,
                encoding,
                decodable,
                served,
                source=source,
            )
        )

    def withdraw(
        self, apiserver: str, resource: tuple[str, str, str] = PODS, source: str | None = None
    ) -> Changes:
        return self.append(
            StorageVersionWithdrawn(
                self.meta(apiserver), apiserver, resource[0], resource[1], source
            )
        )

    def release(self, apiserver: str, holder: str | None = None) -> Changes:
        return self.append(
            ApiserverLeaseReleased(
                self.meta(apiserver), apiserver, holder or self.holders[apiserver]
            )
        )

    def expire(self, apiserver: str, last_renew_time: datetime | None = None) -> Changes:
        return self.append(
            ApiserverLeaseExpired(
                self.meta("lease-gc"),
                apiserver,
                last_renew_time or self.renewed.get(apiserver, T0),
                3600,
            )
        )

    def reset(self, resource: tuple[str, str, str] = PODS) -> Changes:
        return self.append(
            StorageStateReset(self.meta("operator"), resource[0], resource[1], "operator reset")
        )

    def request(
        self,
        migration_id: str,
        target: str,
        storage_version_revision: str,
        resource: tuple[str, str, str] = PODS,
    ) -> Changes:
        group, name, kind = resource
        return self.append(
            MigrationRequested(
                self.meta("migrator"),
                migration_id,
                group,
                name,
                target,
                storage_version_hash(group, target, kind),
                storage_version_revision,
            )
        )

    def step(
        self,
        step: type[MigrationStatusEvent],
        migration_id: str,
        objects_migrated: int = 0,
        continue_token: str | None = None,
        reason: str | None = None,
    ) -> Changes:
        return self.append(
            step(self.meta("worker"), migration_id, objects_migrated, continue_token, reason)
        )

    def storage_version(self, resource: tuple[str, str, str] = PODS) -> StorageVersion:
        return self.state.storage_versions[(self.cluster, resource[0], resource[1])]

    def has_storage_version(self, resource: tuple[str, str, str] = PODS) -> bool:
        return (self.cluster, resource[0], resource[1]) in self.state.storage_versions

    def storage_state(self, resource: tuple[str, str, str] = PODS) -> StorageState:
        return self.state.storage_states[(self.cluster, resource[0], resource[1])]

    def migration(self, migration_id: str) -> Migration:
        return self.state.migrations[(self.cluster, migration_id)]


def condition(status: Status, last_transition_time: datetime) -> Condition:
    return Condition("AllEncodingVersionsEqual", *status, last_transition_time)


def pods_hash(version: str) -> str:
    return storage_version_hash("", version, "Pod")


def encodings(storage_version: StorageVersion) -> dict[str, str]:
    return {e.apiserver_id: e.encoding_version for e in storage_version.entries}


def joined(*apiservers: str) -> Log:
    log = Log()
    for apiserver in apiservers:
        log.heartbeat(apiserver)
    return log


# --- agreement: upstream's TestLocalUpdateStorageVersion, through the fold ---------------


def test_first_entry_sets_the_common_version_and_the_condition() -> None:
    log = joined("1")

    log.report("1", "v1")

    storage_version = log.storage_version()
    assert storage_version.entries == (ServerStorageVersion("1", "v1", ("v1", "v2"), ("v1",)),)
    assert storage_version.common_encoding_version == "v1"
    assert storage_version.condition == condition(SET, log.now)


def test_new_entry_with_another_encoding_version_clears_common_version() -> None:
    log = joined("1", "2")
    log.report("1", "v1")
    log.report("2", "v1")
    assert log.storage_version().common_encoding_version == "v1"
    log.heartbeat("3")

    log.report("3", "v2")

    storage_version = log.storage_version()
    assert encodings(storage_version) == {"1": "v1", "2": "v1", "3": "v2"}
    assert storage_version.common_encoding_version is None
    assert storage_version.condition == condition(UNSET, log.now)
    assert log.storage_state().current_storage_version_hash is None


def test_new_entry_with_extra_decodable_versions_keeps_common_version() -> None:
    # Upstream's case adds apiserver 4's entry to agreeing ones; here 4 is a member from
    # the start (agreement waits for its report) and its new entry replaces its first.
    log = joined("1", "2", "4")
    log.report("1", "v1")
    log.report("2", "v1", served=("v1", "v2"))
    log.report("4", "v1")
    agreed_at = log.storage_version().condition.last_transition_time

    log.report("4", "v1", decodable=("v1", "v2", "v4"), served=("v1", "v2"))

    storage_version = log.storage_version()
    assert storage_version.common_encoding_version == "v1"
    assert storage_version.condition == condition(SET, agreed_at)
    assert storage_version.entries[-1] == ServerStorageVersion(
        "4", "v1", ("v1", "v2", "v4"), ("v1", "v2")
    )


def test_another_agreeing_entry_while_versions_disagree_keeps_the_condition() -> None:
    log = joined("1", "2", "3", "4")
    log.report("1", "v1")
    log.report("3", "v2")
    disagreed_at = log.now

    log.report("4", "v1", decodable=("v1", "v2", "v4"))

    assert log.storage_version().common_encoding_version is None
    assert log.storage_version().condition == condition(UNSET, disagreed_at)


# --- lastTransitionTime: upstream's seven TestSetCommonEncodingVersion cases ---------------

SSV1 = ServerStorageVersion("1", "v1", ("v1", "v2"), ("v1",))
SSV2 = ServerStorageVersion("2", "v1", ("v1", "v2"), ("v1", "v2"))
SSV3 = ServerStorageVersion("3", "v2", ("v1", "v2"), ("v1", "v2"))
SSV5 = ServerStorageVersion("5", "v2", ("v1", "v2", "v4"), ("v1", "v2"))
EARLIER = T0
NOW = T0 + timedelta(minutes=5)


@pytest.mark.parametrize(
    ("entries", "old_common", "old_status", "common", "status", "transition"),
    [
        pytest.param((SSV1, SSV2, SSV3), None, None, None, UNSET, True, id="no-common_init"),
        pytest.param((SSV1, SSV2, SSV3), "v1", SET, None, UNSET, True, id="no-common_transition"),
        pytest.param(
            (SSV1, SSV2, SSV3), None, UNSET, None, UNSET, False, id="no-common_no-transition"
        ),
        pytest.param((SSV1, SSV2), None, None, "v1", SET, True, id="common_init"),
        pytest.param((SSV1, SSV2), "v1", SET, "v1", SET, False, id="common_no-transition"),
        pytest.param((SSV1, SSV2), None, UNSET, "v1", SET, True, id="common_transition"),
        pytest.param((SSV3, SSV5), "v1", SET, "v2", SET, True, id="common_version-changed"),
    ],
)
def test_last_transition_time(
    entries: tuple[ServerStorageVersion, ...],
    old_common: str | None,
    old_status: Status | None,
    common: str | None,
    status: Status,
    transition: bool,
) -> None:
    old_condition = None if old_status is None else condition(old_status, EARLIER)

    got_common, got_condition = agreement(entries, old_common, old_condition, NOW)

    assert got_common == common
    assert got_condition == condition(status, NOW if transition else EARLIER)


def test_common_version_moving_to_another_version_is_a_transition() -> None:
    log = joined("1")
    log.report("1", "v1")
    log.report("1", "v2")

    assert log.storage_version().common_encoding_version == "v2"
    assert log.storage_version().condition == condition(SET, log.now)
    assert log.storage_state().current_storage_version_hash == pods_hash("v2")


# --- leases and StorageVersion GC ------------------------------------------------------------


@pytest.mark.parametrize("end", ["expire", "release"])
def test_lease_ended_removes_its_entries_and_recomputes_agreement(end: str) -> None:
    log = joined("1", "2", "3")
    log.report("1", "v1")
    log.report("2", "v1")
    log.report("3", "v2")
    log.report("3", "v1", resource=DEPLOYMENTS)
    log.report("1", "v1", resource=DEPLOYMENTS)

    changes = log.expire("3") if end == "expire" else log.release("3")

    assert [lease.apiserver_id for lease in live_leases(log.state, "east")] == ["1", "2"]
    assert encodings(log.storage_version()) == {"1": "v1", "2": "v1"}
    assert log.storage_version().common_encoding_version == "v1"
    assert log.storage_version().condition == condition(SET, log.now)
    assert log.storage_version().revision == log.revision
    assert encodings(log.storage_version(DEPLOYMENTS)) == {"1": "v1"}
    assert log.storage_state().current_storage_version_hash == pods_hash("v1")
    assert changes.leases == {("east", "3")}
    assert changes.storage_versions == {("east", "", "pods"), ("east", "apps", "deployments")}
    assert changes.storage_states == {("east", "", "pods")}
    assert changes.rejections == []


def test_expiry_for_an_apiserver_without_entries_completes_the_membership() -> None:
    log = joined("1", "2")
    log.report("1", "v1")
    assert log.storage_version().condition.status == "Unknown"

    changes = log.expire("2")

    assert ("east", "2") not in log.state.leases
    assert encodings(log.storage_version()) == {"1": "v1"}
    assert log.storage_version().condition == condition(SET, log.now)
    assert log.storage_state().current_storage_version_hash == pods_hash("v1")
    key = ("east", "", "pods")
    assert changes == Changes(
        leases={("east", "2")}, storage_versions={key}, storage_states={key}, clusters={"east"}
    )


def test_last_entry_removed_deletes_the_storage_version_but_not_its_storage_state() -> None:
    log = joined("1", "2")
    log.report("1", "v1")
    created = (log.revision, log.now)  # the StorageState's creation, kept as it changes
    log.report("2", "v1")
    log.withdraw("1")  # 1 holds a lease and no entry: agreement is unknown from here
    unknown_since = log.revision

    changes = log.expire("2")

    assert not log.has_storage_version()
    assert ("east", "", "pods") in changes.storage_versions
    assert log.storage_state() == StorageState(
        "east", "", "pods", ("Unknown", pods_hash("v1")), None, unknown_since, *created
    )
    assert log.state.resources_by_apiserver == {}


def test_stale_expiry_is_ignored_and_recorded() -> None:
    log = joined("1")
    log.report("1", "v1")
    seen_by_gc = log.renewed["1"]
    log.heartbeat("1")
    lease = log.state.leases[("east", "1")]

    changes = log.expire("1", last_renew_time=seen_by_gc)

    assert log.state.leases[("east", "1")] == lease
    assert encodings(log.storage_version()) == {"1": "v1"}
    assert (changes.leases, changes.storage_versions) == (set(), set())
    [rejection] = changes.rejections
    assert (rejection.event_type, rejection.subject, rejection.revision) == (
        "ApiserverLeaseExpired",
        "1",
        log.revision,
    )
    assert "stale" in rejection.reason
    assert lease.renew_time.isoformat() in rejection.reason


def test_release_from_an_earlier_start_keeps_the_new_lease() -> None:
    log = joined("1")
    log.heartbeat("1", holder="1_second-start")
    log.report("1", "v1")

    changes = log.release("1", holder="1_1")

    assert log.state.leases[("east", "1")].holder_identity == "1_second-start"
    assert log.has_storage_version()
    [rejection] = changes.rejections
    assert "'1_1'" in rejection.reason and "'1_second-start'" in rejection.reason


def test_ending_a_lease_nobody_holds_is_recorded() -> None:
    log = joined("1")
    log.expire("1")

    changes = log.expire("1")

    [rejection] = changes.rejections
    assert "holds no lease" in rejection.reason


def test_heartbeat_after_expiry_is_a_rejoin() -> None:
    log = joined("1")
    log.report("1", "v1")
    log.expire("1")
    assert log.report("1", "v1").rejections

    log.heartbeat("1", holder="1_2")
    changes = log.report("1", "v1")

    assert changes.rejections == []
    assert log.state.leases[("east", "1")].holder_identity == "1_2"
    assert encodings(log.storage_version()) == {"1": "v1"}
    assert log.storage_version().condition == condition(SET, log.now)


def test_renewal_moves_only_the_lease_revision() -> None:
    log = joined("1")
    log.report("1", "v1")
    storage_version = log.storage_version()

    changes = log.heartbeat("1")

    assert log.state.leases[("east", "1")].renew_time == log.now
    assert log.state.leases[("east", "1")].revision == log.revision
    assert log.storage_version() == storage_version
    assert changes == Changes(leases={("east", "1")}, clusters={"east"})


@pytest.mark.parametrize("apiserver_id", ["Bad_ID", "-fea", "", "a..b", "x" * 254])
def test_a_heartbeat_under_an_id_no_lease_may_be_named_is_rejected(apiserver_id: str) -> None:
    # Upstream's ValidateLease: a Lease's name is a DNS-1123 subdomain.
    log = joined("1")

    changes = log.heartbeat(apiserver_id)

    assert ("east", apiserver_id) not in log.state.leases
    assert changes.leases == set()
    [rejection] = changes.rejections
    assert (rejection.event_type, rejection.revision) == ("ApiserverHeartbeat", log.revision)
    assert repr(apiserver_id) in rejection.reason and "DNS-1123 subdomain" in rejection.reason


@pytest.mark.parametrize(
    ("duration", "why"), [(0, "is not positive"), (-60, "is not positive"), (2**62, "an int32")]
)
def test_a_heartbeat_with_a_duration_no_lease_may_have_leaves_the_lease_as_it_was(
    duration: int, why: str
) -> None:
    # Upstream's ValidateLeaseSpec: leaseDurationSeconds must be greater than 0, and the
    # field is an int32 (a longer one overflowed the lease GC's expiry check).
    log = joined("1")
    lease = log.state.leases[("east", "1")]
    meta = log.meta("1")
    refused = ApiserverHeartbeat(
        meta, "1", lease.holder_identity, lease.hostname, duration, meta.occurred_at
    )

    changes = log.append(refused)

    assert log.state.leases[("east", "1")] == lease
    [rejection] = changes.rejections
    assert f"lease_duration_seconds {duration} " in rejection.reason and why in rejection.reason
    # Nor does a renew time at the calendar's end, or such a duration (in a fold snapshot
    # of an older svledger), overflow the expiry check.
    assert not lease_expired(datetime.max.replace(tzinfo=UTC), 3600, meta.occurred_at)
    assert not lease_expired(meta.occurred_at, 2**62, meta.occurred_at + timedelta(days=1))


# --- reports ---------------------------------------------------------------------------------


def test_entry_without_a_lease_is_rejected() -> None:
    log = joined("1")

    changes = log.report("2", "v1")

    assert not log.has_storage_version()
    assert log.state.storage_states == {}
    [rejection] = changes.rejections
    assert (rejection.cluster, rejection.event_type, rejection.subject) == (
        "east",
        "StorageVersionReported",
        "core.pods",
    )
    assert "'2'" in rejection.reason and "heartbeat" in rejection.reason


def test_entry_without_a_lease_among_disagreeing_entries_changes_nothing() -> None:
    # Upstream's storageversiongc Test_StorageVersionContainsInvalidLeaseID: the GC drops
    # the entry of an apiserver without a lease; the fold never takes it in.
    log = joined("1", "2", "3")
    log.report("1", "v1")
    log.report("2", "v2")
    log.report("3", "v2")
    before = log.storage_version()

    changes = log.report("4", "v2")

    assert log.storage_version() == before
    assert encodings(before) == {"1": "v1", "2": "v2", "3": "v2"}
    assert before.common_encoding_version is None and before.condition.status == "False"
    [rejection] = changes.rejections
    assert "'4'" in rejection.reason


def test_encoding_version_not_decodable_is_rejected() -> None:
    log = joined("1")
    log.report("1", "v1")

    changes = log.report("1", "v3", decodable=("v1", "v2"))

    assert encodings(log.storage_version()) == {"1": "v1"}
    [rejection] = changes.rejections
    assert "'v3'" in rejection.reason and "decodable" in rejection.reason


def test_identical_report_changes_nothing() -> None:
    log = joined("1", "2")
    log.report("1", "v1")
    log.report("2", "v1")
    storage_version, storage_state = log.storage_version(), log.storage_state()

    changes = log.report("1", "v1")

    assert changes == Changes(clusters={"east"})  # only its latest event time moved
    assert (log.storage_version(), log.storage_state()) == (storage_version, storage_state)


def report_of(log: Log, apiserver: str, encoding: str) -> StorageVersionReported:
    """A report of pods by ``apiserver``, made but not appended."""
    return StorageVersionReported(
        log.meta(apiserver), apiserver, "", "pods", "Pod", encoding, ("v1", "v2"), ("v1",)
    )


def test_a_repeated_event_is_folded_once_and_the_repeat_is_recorded() -> None:
    log = joined("1")
    first = report_of(log, "1", "v1")
    log.append(first)
    at = log.revision
    log.report("1", "v2")  # a later report: the repeat must not take it back
    storage_version, storage_state = log.storage_version(), log.storage_state()

    log.meta("1")  # the repeat's own place in the log
    changes = log.append(first)

    assert (log.storage_version(), log.storage_state()) == (storage_version, storage_state)
    assert changes.leases | changes.storage_versions | changes.storage_states == set()
    [rejection] = changes.rejections
    assert rejection.revision == log.revision
    assert f"a repeat of the event at {at} (event_id {first.meta.event_id}" in rejection.reason


def test_a_repeat_past_an_hour_of_its_clusters_event_time_is_folded_as_a_new_event() -> None:
    log = joined("1")
    first = report_of(log, "1", "v1")
    log.append(first)
    log.now += SEEN_EVENT_WINDOW  # the next event is an hour and a second later
    log.report("1", "v2")

    log.meta("1")
    changes = log.append(first)

    assert changes.rejections == []
    assert encodings(log.storage_version()) == {"1": "v1"}


def test_a_repeat_within_the_hour_is_found_though_later_events_came_between() -> None:
    log = joined("1")
    first = report_of(log, "1", "v1")
    log.append(first)
    for version in ("v2", "v1") * 200:  # enough IDs that old ones are forgotten meanwhile
        log.report("1", version)
    log.now = first.meta.occurred_at + SEEN_EVENT_WINDOW - timedelta(seconds=1)
    log.report("1", "v2")  # exactly an hour after the first

    log.meta("1")
    assert log.append(first).rejections
    assert encodings(log.storage_version()) == {"1": "v2"}


def test_an_event_of_the_first_year_is_folded_and_its_repeat_found() -> None:
    log = joined("1")
    log.now = datetime(1, 1, 1, 0, 10, tzinfo=UTC)  # a clock gone wrong, or a forged event
    first = report_of(log, "1", "v1")
    log.append(first)
    assert encodings(log.storage_version()) == {"1": "v1"}
    log.meta("1")
    assert log.append(first).rejections


def test_heartbeats_are_not_kept_by_id_and_another_cluster_may_use_the_same_id() -> None:
    east = joined("1")
    renewal = ApiserverHeartbeat(east.meta("1"), "1", "1_1", "host-1", 3600, east.now)
    east.append(renewal)
    east.meta("1")
    assert east.append(renewal).rejections == []  # says again what the lease says

    report = report_of(east, "1", "v1")
    east.append(report)
    west = Log(east.state, cluster="west", partition=1)
    west.heartbeat("1")
    west.meta("1")
    same_id = dataclasses.replace(report, meta=dataclasses.replace(report.meta, cluster="west"))
    assert west.append(same_id).rejections == []
    assert encodings(west.storage_version()) == {"1": "v1"}


def test_withdrawal_removes_one_entry() -> None:
    log = joined("1", "2")
    log.report("1", "v1")
    log.report("2", "v2")
    log.report("2", "v2", resource=DEPLOYMENTS)

    log.withdraw("2")

    assert encodings(log.storage_version()) == {"1": "v1"}
    # 2 reports deployments and no longer pods: it does not serve pods.
    assert log.storage_version().condition == condition(SET, log.now)
    assert encodings(log.storage_version(DEPLOYMENTS)) == {"2": "v2"}
    assert log.withdraw("2").rejections
    # Its last entry withdrawn, it reports nothing: what it writes is unknown.
    log.withdraw("2", resource=DEPLOYMENTS)
    assert log.storage_version().condition.status == "Unknown"
    log.release("2")
    assert log.storage_version().condition == condition(SET, log.now)


# --- membership: every live apiserver must have reported ------------------------------


UNKNOWN_REASON = "CommonEncodingVersionUnknown"


def test_a_member_that_has_not_reported_leaves_agreement_unknown() -> None:
    log = joined("1", "2")

    log.report("1", "v1")

    storage_version = log.storage_version()
    assert storage_version.common_encoding_version is None
    assert storage_version.condition.status == "Unknown"
    assert storage_version.condition.reason == UNKNOWN_REASON
    assert "2" in storage_version.condition.message
    assert log.storage_state().current_storage_version_hash is None
    log.report("2", "v1")
    assert log.storage_version().condition == condition(SET, log.now)


def test_a_joining_member_makes_every_resource_of_its_cluster_unknown_until_it_reports() -> None:
    log = joined("1")
    log.report("1", "v1")
    log.report("1", "v1", resource=DEPLOYMENTS)
    other = Log(log.state, cluster="west", partition=1)
    other.heartbeat("9")
    other.report("9", "v1")

    changes = log.heartbeat("2")

    assert changes.storage_versions == {("east", "", "pods"), ("east", "apps", "deployments")}
    for resource in (PODS, DEPLOYMENTS):
        assert log.storage_version(resource).condition.status == "Unknown"
        assert log.storage_version(resource).revision == log.revision
    assert other.storage_version().condition.status == "True"  # clusters never meet
    changes = log.report("2", "v1")
    assert log.storage_version().condition == condition(SET, log.now)
    # 2 reports pods and not deployments: it does not serve them, 1 alone writes them.
    assert log.storage_version(DEPLOYMENTS).condition == condition(SET, log.now)
    assert ("east", "apps", "deployments") in changes.storage_versions
    assert not log.heartbeat("2").storage_versions  # a renewal is no join


def test_a_success_requested_before_a_member_joined_is_stale() -> None:
    log = joined("1")
    log.report("1", "v1")
    log.request("m", "v1", log.revision)
    log.step(MigrationStarted, "m")
    log.heartbeat("2")
    log.report("2", "v1")  # the same version: but it may have written anything before

    changes = log.step(MigrationSucceeded, "m", 3)

    assert log.storage_state().persisted_storage_version_hashes == ("Unknown", pods_hash("v1"))
    assert changes.rejections[0].reason.startswith("stale success")


def test_sources_of_one_apiserver_are_entries_of_their_own_and_must_agree() -> None:
    log = joined("1")
    log.report("1", "v1", source="discovery")
    log.report("1", "v1", source="storageversion")
    assert [e.key for e in log.storage_version().entries] == [
        ("1", "discovery"),
        ("1", "storageversion"),
    ]
    assert log.storage_version().condition == condition(SET, log.now - timedelta(seconds=1))

    log.report("1", "v2", source="discovery")

    storage_version = log.storage_version()
    assert storage_version.common_encoding_version is None
    assert storage_version.condition.status == "False"
    assert storage_version.condition.message == (
        "Common encoding version unset; sources disagree: 1: discovery v2, storageversion v1"
    )
    log.withdraw("1", source="storageversion")
    assert log.storage_version().common_encoding_version == "v2"
    assert log.withdraw("1", source="storageversion").rejections  # that entry is gone
    assert log.withdraw("1").rejections  # and it never reported itself


def test_the_end_of_a_lease_drops_every_source_of_its_apiserver() -> None:
    log = joined("1", "2")
    log.report("1", "v1", source="discovery")
    log.report("1", "v1", source="storageversion")
    log.report("2", "v2", source="discovery")

    log.expire("2")

    assert [e.key for e in log.storage_version().entries] == [
        ("1", "discovery"),
        ("1", "storageversion"),
    ]
    assert log.storage_version().common_encoding_version == "v1"
    assert log.state.resources_by_apiserver == {("east", "1"): {("east", "", "pods")}}


def test_entries_keep_upstreams_order() -> None:
    # updater.go: a known apiserver's entry is replaced in place, a new one appended;
    # the StorageVersion GC drops an apiserver's entries and keeps the others' order.
    def order() -> list[str]:
        return [entry.apiserver_id for entry in log.storage_version().entries]

    log = joined("3", "1", "2")
    log.report("3", "v1")
    log.report("1", "v1")
    log.report("2", "v1")
    assert order() == ["3", "1", "2"]
    log.report("3", "v2")
    assert order() == ["3", "1", "2"]
    assert log.storage_version().entries[0].encoding_version == "v2"
    log.release("1")
    assert order() == ["3", "2"]
    log.heartbeat("1", holder="1_2")
    log.report("1", "v2")
    assert order() == ["3", "2", "1"]
    log.withdraw("3")
    assert order() == ["2", "1"]


# --- StorageState ----------------------------------------------------------------------------


def test_persisted_hashes_accumulate_every_reported_version_until_reset() -> None:
    log = joined("1", "2")
    log.report("1", "v1")
    created = (log.revision, log.now)
    assert log.storage_state().persisted_storage_version_hashes == ("Unknown", pods_hash("v1"))

    log.report("2", "v2")
    log.report("2", "v1")
    log.report("1", "v2")
    assert log.storage_state().persisted_storage_version_hashes == (
        "Unknown",
        pods_hash("v1"),
        pods_hash("v2"),
    )
    assert log.storage_state().current_storage_version_hash is None

    log.report("2", "v2")
    assert log.storage_state().current_storage_version_hash == pods_hash("v2")

    log.reset()
    assert log.storage_state() == StorageState(
        "east", "", "pods", ("Unknown",), pods_hash("v2"), log.revision, *created
    )
    log.report("1", "v2")
    assert log.storage_state().persisted_storage_version_hashes == ("Unknown", pods_hash("v2"))


def test_hashes_follow_the_upstream_formula_with_group_and_kind() -> None:
    log = joined("1")
    log.report("1", "apps/v1", ("apps/v1",), ("apps/v1",), resource=DEPLOYMENTS)

    assert log.storage_state(DEPLOYMENTS).current_storage_version_hash == (
        storage_version_hash("apps", "v1", "Deployment")
    )
    assert storage_version_hash("", "v1", "Pod") == "xPOwRZ+Yhw8="


def test_a_resource_stored_in_another_groups_version_hashes_what_is_stored() -> None:
    # events.k8s.io events are stored as core v1 Events: upstream writes encoding "v1".
    events = ("events.k8s.io", "events", "Event")
    log = joined("1")
    log.report("1", "v1", ("v1", "events.k8s.io/v1"), ("events.k8s.io/v1",), resource=events)

    assert log.storage_state(events).current_storage_version_hash == (
        storage_version_hash("", "v1", "Event")
    )
    assert log.storage_version(events).common_encoding_version == "v1"


def test_a_served_version_that_cannot_be_decoded_is_rejected() -> None:
    log = joined("1")
    changes = log.report("1", "apps/v1", ("apps/v1",), ("apps/v2",), resource=DEPLOYMENTS)

    [rejection] = changes.rejections
    assert "served_versions 'apps/v2'" in rejection.reason
    assert log.state.storage_versions == {}


def test_reset_of_an_unknown_resource_is_rejected() -> None:
    log = joined("1")

    changes = log.reset(DEPLOYMENTS)

    assert log.state.storage_states == {}
    [rejection] = changes.rejections
    assert "deployments.apps" in rejection.reason


# --- migrations ------------------------------------------------------------------------------


def agreed_on(version: str) -> Log:
    """Two apiservers that agree on ``version`` for pods, after an upgrade from v1."""
    log = joined("1", "2")
    log.report("1", "v1")
    log.report("2", "v1")
    if version != "v1":
        log.report("1", version)
        log.report("2", version)
    return log


def test_fresh_success_refines_persisted_hashes_to_the_target() -> None:
    log = agreed_on("v2")
    log.request("m1", "v2", log.storage_version().revision)
    assert [m.migration_id for m in active_migrations(log.state, ("east", "", "pods"))] == ["m1"]
    log.step(MigrationStarted, "m1")
    log.step(MigrationProgressed, "m1", objects_migrated=500, continue_token="c1")
    assert (log.migration("m1").objects_migrated, log.migration("m1").continue_token) == (
        500,
        "c1",
    )

    changes = log.step(MigrationSucceeded, "m1", objects_migrated=742)

    assert log.storage_state().persisted_storage_version_hashes == (pods_hash("v2"),)
    assert log.storage_state().revision == log.revision
    assert dataclasses.astuple(log.migration("m1"))[7:10] == ("Succeeded", 742, None)
    assert active_migrations(log.state, ("east", "", "pods")) == []
    assert changes.rejections == []
    assert changes.storage_states == {("east", "", "pods")}


def test_success_after_the_storage_version_changed_is_stale() -> None:
    log = agreed_on("v2")
    log.request("m1", "v2", log.storage_version().revision)
    log.step(MigrationStarted, "m1")
    # An apiserver goes back to v1 for a while: it may write v1 objects meanwhile.
    log.report("1", "v1")
    log.report("1", "v2")
    assert log.storage_version().common_encoding_version == "v2"
    persisted = log.storage_state().persisted_storage_version_hashes

    changes = log.step(MigrationSucceeded, "m1", objects_migrated=10)

    assert log.migration("m1").phase == "Succeeded"
    assert log.storage_state().persisted_storage_version_hashes == persisted
    assert changes.storage_states == set()
    [rejection] = changes.rejections
    assert "stale" in rejection.reason and log.storage_version().revision in rejection.reason


def test_success_for_a_version_that_is_no_longer_common_is_stale() -> None:
    log = agreed_on("v2")
    log.request("m1", "v1", log.storage_version().revision)
    log.step(MigrationStarted, "m1")

    changes = log.step(MigrationSucceeded, "m1")

    assert "Unknown" in log.storage_state().persisted_storage_version_hashes
    [rejection] = changes.rejections
    assert "'v1'" in rejection.reason and "'v2'" in rejection.reason


def test_a_cancelled_migration_cannot_be_moved_by_the_worker() -> None:
    log = agreed_on("v2")
    log.request("m1", "v2", log.storage_version().revision)
    log.step(MigrationStarted, "m1")
    log.step(MigrationCancelled, "m1", reason="EncodingVersionsDisagree")
    cancelled = log.migration("m1")

    changes = log.step(MigrationProgressed, "m1", objects_migrated=500)

    assert log.migration("m1") == cancelled
    assert (cancelled.phase, cancelled.reason) == ("Cancelled", "EncodingVersionsDisagree")
    [rejection] = changes.rejections
    assert "Cancelled" in rejection.reason and "Running" in rejection.reason


def test_a_failed_migration_resumes_from_its_continue_token() -> None:
    log = agreed_on("v2")
    log.request("m1", "v2", log.storage_version().revision)
    log.step(MigrationStarted, "m1")
    log.step(MigrationProgressed, "m1", objects_migrated=500, continue_token="c1")
    # As the worker sends them: each step with how far the migration is.
    log.step(MigrationFailed, "m1", objects_migrated=500, continue_token="c1", reason="Timeout")
    assert active_migrations(log.state, ("east", "", "pods")) == []
    assert log.migration("m1").continue_token == "c1"

    log.step(MigrationStarted, "m1", objects_migrated=500, continue_token="c1")

    assert (log.migration("m1").phase, log.migration("m1").reason) == ("Running", None)
    assert log.migration("m1").continue_token == "c1"
    assert active_migrations(log.state, ("east", "", "pods")) == [log.migration("m1")]


def test_a_resumed_attempt_shows_where_it_started_and_where_it_failed() -> None:
    # Attempt 1 starts where attempt 0 failed and fails before its first chunk is
    # done: its view says so, for the attempt after it to resume from.
    log = agreed_on("v2")
    log.request("attempt-1", "v2", log.storage_version().revision)
    log.step(MigrationStarted, "attempt-1", objects_migrated=500, continue_token="c1")
    assert (
        log.migration("attempt-1").objects_migrated,
        log.migration("attempt-1").continue_token,
    ) == (500, "c1")
    log.step(
        MigrationFailed, "attempt-1", objects_migrated=500, continue_token="c1", reason="Timeout"
    )
    failed = log.migration("attempt-1")
    assert (failed.phase, failed.objects_migrated, failed.continue_token) == ("Failed", 500, "c1")


def test_steps_of_unknown_migrations_and_reused_ids_are_rejected() -> None:
    log = agreed_on("v1")
    assert "no migration 'm9'" in log.step(MigrationStarted, "m9").rejections[0].reason
    log.request("m1", "v1", log.storage_version().revision)
    requested = log.migration("m1")

    changes = log.request("m1", "v1", log.storage_version().revision)

    assert log.migration("m1") == requested
    assert "already taken" in changes.rejections[0].reason


def test_a_new_request_drops_the_resources_ended_migrations_and_keeps_its_failed_attempts() -> None:
    log = agreed_on("v2")
    revision = log.storage_version().revision
    other = ("", "configmaps", "ConfigMap")
    log.report("1", "v1", resource=other)
    log.request("elsewhere", "v1", log.storage_version(other).revision, resource=other)
    log.step(MigrationCancelled, "elsewhere")
    log.request("earlier", "v1", revision)  # of another target: cannot be resumed now
    log.step(MigrationFailed, "earlier", reason="Timeout")
    log.request("done", "v2", revision)
    log.step(MigrationStarted, "done")
    log.step(MigrationSucceeded, "done")
    log.request("failed", "v2", revision)
    log.step(MigrationFailed, "failed", reason="Timeout")
    log.step(MigrationCancelled, "failed")  # it ends here
    log.request("resumable", "v2", revision)
    log.step(MigrationFailed, "resumable", reason="Timeout")
    assert {key[1] for key in log.state.migrations} == {"elsewhere", "resumable"}

    changes = log.request("next", "v2", revision)

    assert {key[1] for key in log.state.migrations} == {"elsewhere", "resumable", "next"}
    assert changes.migrations == {("east", "next")}
    # The fold keeps no trace of a dropped migration: its ID is free, its steps unknown.
    assert "no migration 'done'" in log.step(MigrationStarted, "done").rejections[0].reason
    rebuilt = State(
        log.state.leases, log.state.storage_versions, log.state.storage_states, log.state.migrations
    )
    assert rebuilt.inactive_migrations_by_resource == log.state.inactive_migrations_by_resource


def test_failed_attempts_are_dropped_by_a_request_for_another_revision() -> None:
    log = agreed_on("v2")
    log.request("m1", "v2", log.storage_version().revision)
    log.step(MigrationFailed, "m1", reason="Timeout")
    log.report("1", "v1")
    log.report("1", "v2")  # agreement again, at a later revision

    changes = log.request("m2", "v2", log.storage_version().revision)

    assert {key[1] for key in log.state.migrations} == {"m2"}
    assert changes.migrations == {("east", "m1"), ("east", "m2")}


def test_a_fresh_success_leaves_the_resource_only_its_success() -> None:
    """Upstream's e2e tests end asserting that every migration listed has succeeded: its
    trigger deletes a resource's migrations before it requests one, failed ones too."""
    log = agreed_on("v2")
    revision = log.storage_version().revision
    other = ("", "configmaps", "ConfigMap")
    log.report("1", "v1", resource=other)
    log.request("elsewhere", "v1", log.storage_version(other).revision, resource=other)
    log.step(MigrationFailed, "elsewhere", reason="Timeout")
    log.request("m1", "v2", revision)
    log.step(MigrationFailed, "m1", reason="Timeout")
    log.request("m2", "v2", revision)  # the migrator's next attempt, after its back-off
    log.step(MigrationStarted, "m2")

    changes = log.step(MigrationSucceeded, "m2")

    assert {key[1]: m.phase for key, m in log.state.migrations.items()} == {
        "elsewhere": "Failed",
        "m2": "Succeeded",
    }
    assert changes.migrations == {("east", "m1"), ("east", "m2")}
    assert "no migration 'm1'" in log.step(MigrationStarted, "m1").rejections[0].reason


def test_a_stale_success_keeps_the_failed_attempts() -> None:
    log = agreed_on("v2")
    revision = log.storage_version().revision
    log.request("m1", "v2", revision)
    log.step(MigrationFailed, "m1", reason="Timeout")
    log.request("m2", "v2", revision)
    log.step(MigrationStarted, "m2")
    log.report("1", "v1")
    log.report("1", "v2")

    log.step(MigrationSucceeded, "m2")

    assert {key[1]: m.phase for key, m in log.state.migrations.items()} == {
        "m1": "Failed",
        "m2": "Succeeded",
    }


# --- clusters and revisions ------------------------------------------------------------------


def test_clusters_are_isolated() -> None:
    east = joined("1", "2")
    west = Log(east.state, cluster="west", partition=1)
    west.heartbeat("1")
    east.report("1", "v1")
    east.report("2", "v1")
    west.report("1", "v2")
    assert west.report("2", "v2").rejections  # "2" holds a lease in east only

    east.expire("1")

    assert encodings(east.storage_version()) == {"2": "v1"}
    assert encodings(west.storage_version()) == {"1": "v2"}
    assert west.storage_state().current_storage_version_hash == pods_hash("v2")
    assert east.storage_state().current_storage_version_hash == pods_hash("v1")
    assert [lease.key for lease in live_leases(east.state, "west")] == [("west", "1")]


def test_a_row_revision_is_the_position_of_the_last_event_that_changed_it() -> None:
    log = joined("1", "2")
    log.report("1", "v1")
    reported_at = log.revision
    log.heartbeat("2")
    renewed_at = log.revision
    log.report("1", "v1")

    assert reported_at == "0:2" and renewed_at == "0:3"
    assert log.storage_version().revision == reported_at
    assert log.storage_state().revision == reported_at
    assert log.state.leases[("east", "2")].revision == renewed_at
