"""What the collector appends for what real kube-apiservers publish, decided without I/O."""

from __future__ import annotations

import collections
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.lease_gc import expired
from kube.upstream import (
    Entry,
    NotUpstream,
    Served,
    Snapshot,
    built_in_entries,
    parse_custom_resource,
    parse_discovery,
    parse_lease,
    parse_storage_version,
    reconcile,
)
from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    CustomResourceDefinitionObserved,
    Event,
    Position,
    StorageVersionReported,
    StorageVersionWithdrawn,
)
from ledger.hashing import hash_of_stored, storage_version_hash
from ledger.validation import check_report
from projections.fold import apply
from projections.state import State, lease_expired

CLUSTER = "real"
A_1 = ("uid-a_1", "a_1")  # the lease of apiserver-a held by a_1, as lease_object makes it
B_1 = ("uid-b_1", "b_1")
T0 = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)
KINDS = {
    ("apps", "deployments"): "Deployment",
    ("", "events"): "Event",
    ("", "pods"): "Pod",
    ("autoscaling", "horizontalpodautoscalers"): "HorizontalPodAutoscaler",
}


def kind_of(group: str, resource: str, version: str) -> str | None:
    stored_group = version.rpartition("/")[0]
    return KINDS.get((stored_group, resource)) or KINDS.get((group, resource))


def lease_object(
    apiserver: str, holder: str, renew: datetime, duration: int = 3600, uid: str | None = None
) -> dict[str, Any]:
    """An identity Lease; its UID is the holder's unless ``uid`` says (an object created
    again by the same process)."""
    return {
        "metadata": {
            "name": apiserver,
            "uid": f"uid-{holder}" if uid is None else uid,
            "namespace": "kube-system",
            "labels": {
                "apiserver.kubernetes.io/identity": "kube-apiserver",
                "kubernetes.io/hostname": f"host-{apiserver}",
            },
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


def storage_version_object(
    name: str, *entries: tuple[str, str, list[str], list[str]]
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "storageVersions": [
                {
                    "apiServerID": apiserver,
                    "encodingVersion": encoding,
                    "decodableVersions": decodable,
                    "servedVersions": served,
                }
                for apiserver, encoding, decodable, served in entries
            ]
        },
    }


class Ledger:
    """The collector's view of the log: it folds what the collector appends."""

    def __init__(self) -> None:
        self.state = State()
        self.offset = 0
        self.appended: list[Event] = []

    def collect(
        self, snapshot: Snapshot, now: datetime, interval: timedelta = timedelta(0)
    ) -> list[Event]:
        events, problems = reconcile(self.state, CLUSTER, snapshot, kind_of, now, interval)
        assert problems == []
        for event in events:
            changes = apply(self.state, event, Position(0, self.offset))
            assert changes.rejections == [], changes.rejections
            self.offset += 1
        self.appended += events
        return events

    def restarted(self) -> Ledger:
        """A restarted collector's view: what this one appended, read back from the log."""
        ledger = Ledger()
        for event in self.appended:
            apply(ledger.state, event, Position(0, ledger.offset))
            ledger.offset += 1
        return ledger


def cluster(leases: dict[str, tuple[str, datetime]], *objects: dict[str, Any]) -> Snapshot:
    snapshot = Snapshot()
    for apiserver, (holder, renew) in leases.items():
        snapshot.leases[apiserver] = parse_lease(lease_object(apiserver, holder, renew))
    for obj in objects:
        snapshot.entries.update(parse_storage_version(obj))
    return snapshot


DEPLOYMENTS = storage_version_object(
    "apps.deployments",
    ("apiserver-a", "apps/v1", ["apps/v1", "apps/v1beta1"], ["apps/v1"]),
    ("apiserver-b", "apps/v1", ["apps/v1"], ["apps/v1"]),
)


def test_each_renewal_is_one_heartbeat_and_a_resync_adds_nothing() -> None:
    ledger = Ledger()
    first = ledger.collect(cluster({"apiserver-a": ("a_1", T0)}), T0)
    assert [type(e) for e in first] == [ApiserverHeartbeat]
    assert ledger.collect(cluster({"apiserver-a": ("a_1", T0)}), T0 + timedelta(seconds=5)) == []

    renewed = ledger.collect(cluster({"apiserver-a": ("a_1", T0 + timedelta(seconds=10))}), T0)
    [heartbeat] = renewed
    assert isinstance(heartbeat, ApiserverHeartbeat)
    assert heartbeat.renew_time == heartbeat.meta.occurred_at == T0 + timedelta(seconds=10)
    assert (heartbeat.hostname, heartbeat.holder_identity) == ("host-apiserver-a", "a_1")


def test_the_peer_advertise_address_is_carried_and_a_new_one_is_a_heartbeat_at_once() -> None:
    # kube-apiservers annotate their identity lease with it (UnknownVersionInteroperabilityProxy,
    # on by default since 1.36); a renewal interval does not hold back a lease that changed.
    def addressed(address: str, renew: datetime) -> Snapshot:
        obj = lease_object("apiserver-a", "a_1", renew)
        obj["metadata"]["annotations"] = {"kubernetes.io/peer-advertise-address": address}
        snapshot = Snapshot()
        snapshot.leases["apiserver-a"] = parse_lease(obj)
        return snapshot

    ledger = Ledger()
    [joined] = ledger.collect(addressed("10.0.0.1:6443", T0), T0, timedelta(minutes=1))
    assert isinstance(joined, ApiserverHeartbeat)
    assert joined.peer_advertise_address == "10.0.0.1:6443"
    second = T0 + timedelta(seconds=10)
    assert ledger.collect(addressed("10.0.0.1:6443", second), second, timedelta(minutes=1)) == []
    [moved] = ledger.collect(addressed("10.0.0.2:6443", second), second, timedelta(minutes=1))
    assert isinstance(moved, ApiserverHeartbeat)
    assert moved.peer_advertise_address == "10.0.0.2:6443"
    assert ledger.state.leases[CLUSTER, "apiserver-a"].peer_advertise_address == "10.0.0.2:6443"
    assert parse_lease(lease_object("apiserver-a", "a_1", T0)).peer_advertise_address is None


def test_a_renewal_interval_appends_a_renewal_per_interval_and_every_new_holder() -> None:
    ledger = Ledger()
    minute = timedelta(seconds=60)
    appended = []
    for tick in range(0, 181, 10):  # upstream renews every 10 s
        renew = T0 + timedelta(seconds=tick)
        events = ledger.collect(cluster({"apiserver-a": ("a_1", renew)}), renew, minute)
        appended += [e.renew_time for e in events if isinstance(e, ApiserverHeartbeat)]
    assert appended == [T0, T0 + minute, T0 + 2 * minute, T0 + 3 * minute]

    # A restart (a new holder) is appended at once, after the old holder's lease ends,
    # and so is its lease's end.
    restart = T0 + timedelta(seconds=185)
    [replaced, heartbeat] = ledger.collect(
        cluster({"apiserver-a": ("a_2", restart)}), restart, minute
    )
    assert isinstance(replaced, ApiserverLeaseReleased) and replaced.holder_identity == "a_1"
    assert isinstance(heartbeat, ApiserverHeartbeat) and heartbeat.holder_identity == "a_2"
    [released] = ledger.collect(cluster({}), restart + timedelta(seconds=5), minute)
    assert isinstance(released, ApiserverLeaseReleased)


def test_a_renewal_interval_never_lets_the_ledgers_lease_lapse() -> None:
    ledger = Ledger()
    duration = 40
    appended = []
    for tick in range(0, 201, 10):
        renew = T0 + timedelta(seconds=tick)
        snapshot = Snapshot()
        snapshot.leases["apiserver-a"] = parse_lease(
            lease_object("apiserver-a", "a_1", renew, duration)
        )
        events = ledger.collect(snapshot, renew, timedelta(hours=1))
        appended += [e.renew_time for e in events if isinstance(e, ApiserverHeartbeat)]
    # At most half the lease's duration apart, whatever the interval asked.
    gaps = {(later - earlier).total_seconds() for earlier, later in itertools.pairwise(appended)}
    assert gaps == {20.0}


def test_reports_come_after_membership_and_name_the_stored_kind() -> None:
    ledger = Ledger()
    events = ledger.collect(
        cluster({"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}, DEPLOYMENTS), T0
    )
    assert [type(e).__name__ for e in events] == [
        "ApiserverHeartbeat",
        "ApiserverHeartbeat",
        "StorageVersionReported",
        "StorageVersionReported",
    ]
    storage_version = ledger.state.storage_versions[CLUSTER, "apps", "deployments"]
    assert storage_version.common_encoding_version == "apps/v1"
    assert {e.apiserver_id: e.decodable_versions for e in storage_version.entries} == {
        "apiserver-a": ("apps/v1", "apps/v1beta1"),
        "apiserver-b": ("apps/v1",),
    }
    assert ledger.state.storage_states[
        CLUSTER, "apps", "deployments"
    ].current_storage_version_hash == (storage_version_hash("apps", "v1", "Deployment"))


def test_an_entry_of_an_apiserver_without_a_lease_waits_for_its_lease() -> None:
    ledger = Ledger()
    events = ledger.collect(cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS), T0)
    assert {e.apiserver_id for e in events if isinstance(e, StorageVersionReported)} == {
        "apiserver-a"
    }
    later = ledger.collect(
        cluster({"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}, DEPLOYMENTS), T0
    )
    assert [(type(e).__name__, e.apiserver_id) for e in later] == [  # type: ignore[attr-defined]
        ("ApiserverHeartbeat", "apiserver-b"),
        ("StorageVersionReported", "apiserver-b"),
    ]


def test_events_stored_as_core_v1_are_reported_with_the_core_kind() -> None:
    events_object = storage_version_object(
        "core.events", ("apiserver-a", "v1", ["events.k8s.io/v1", "v1"], ["v1"])
    )
    ledger = Ledger()
    reported = ledger.collect(cluster({"apiserver-a": ("a_1", T0)}, events_object), T0)[-1]
    assert isinstance(reported, StorageVersionReported)
    assert (reported.group, reported.resource, reported.kind) == ("", "events", "Event")
    assert reported.decodable_versions == ("events.k8s.io/v1", "v1")


def test_versions_keep_the_order_upstream_lists_them_in() -> None:
    # Upstream lists the directly decodable versions in the scheme's priority (autoscaling:
    # v2 before v1), then the equivalent resources'; the ledger mirrors the object.
    hpa = "autoscaling.horizontalpodautoscalers"
    listed = ["autoscaling/v2", "autoscaling/v1"]
    ledger = Ledger()
    leases = {"apiserver-a": ("a_1", T0)}
    ledger.collect(
        cluster(
            leases, storage_version_object(hpa, ("apiserver-a", "autoscaling/v2", listed, listed))
        ),
        T0,
    )
    [entry] = ledger.state.storage_versions[
        CLUSTER, "autoscaling", "horizontalpodautoscalers"
    ].entries
    assert entry.decodable_versions == entry.served_versions == ("autoscaling/v2", "autoscaling/v1")
    # Listed again in another order, the entry is reported again as the object now has it.
    relisted = list(reversed(listed))
    [again] = ledger.collect(
        cluster(
            leases, storage_version_object(hpa, ("apiserver-a", "autoscaling/v2", relisted, listed))
        ),
        T0,
    )
    assert isinstance(again, StorageVersionReported)
    assert again.decodable_versions == ("autoscaling/v1", "autoscaling/v2")
    assert (
        ledger.collect(
            cluster(
                leases,
                storage_version_object(hpa, ("apiserver-a", "autoscaling/v2", relisted, listed)),
            ),
            T0,
        )
        == []
    )


def test_a_vanished_entry_of_a_live_apiserver_is_not_withdrawn() -> None:
    # kube-controller-manager's StorageVersion GC can delete an apiserver's freshly
    # re-registered entries; the apiserver is alive and still writes in that version.
    ledger = Ledger()
    leases = {"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}
    ledger.collect(cluster(leases, DEPLOYMENTS), T0)
    gc_raced = storage_version_object(
        "apps.deployments", ("apiserver-a", "apps/v1", ["apps/v1", "apps/v1beta1"], ["apps/v1"])
    )
    assert ledger.collect(cluster(leases, gc_raced), T0) == []
    assert ledger.collect(cluster(leases), T0) == []  # the whole object deleted
    entries = ledger.state.storage_versions[CLUSTER, "apps", "deployments"].entries
    assert {e.apiserver_id for e in entries} == {"apiserver-a", "apiserver-b"}


def test_a_deleted_lease_ends_as_released_or_expired_by_its_own_renew_time() -> None:
    ledger = Ledger()
    leases = {"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}
    ledger.collect(cluster(leases, DEPLOYMENTS), T0)

    [released] = ledger.collect(cluster({"apiserver-b": ("b_1", T0)}, DEPLOYMENTS), T0)
    assert isinstance(released, ApiserverLeaseReleased)
    assert (released.apiserver_id, released.holder_identity) == ("apiserver-a", "a_1")

    after_expiry = T0 + timedelta(seconds=3601)
    [expired] = ledger.collect(cluster({}, DEPLOYMENTS), after_expiry)
    assert isinstance(expired, ApiserverLeaseExpired)
    assert (expired.apiserver_id, expired.last_renew_time) == ("apiserver-b", T0)
    assert ledger.state.leases == {}
    assert (CLUSTER, "apps", "deployments") not in ledger.state.storage_versions


def without(obj: dict[str, Any], *fields: str) -> dict[str, Any]:
    """A Lease object whose spec lacks ``fields``."""
    spec = {name: value for name, value in obj["spec"].items() if name not in fields}
    return {**obj, "spec": spec}


def test_a_lease_without_renew_time_or_duration_is_expired_as_upstreams_gc_holds_it() -> None:
    # Upstream's isLeaseExpired (apiserverleasegc): no renewTime or no
    # leaseDurationSeconds is expired, whatever the time.
    assert lease_expired(None, 3600, T0) and lease_expired(T0, None, T0)
    for missing in ("renewTime", "leaseDurationSeconds"):
        ledger = Ledger()
        ledger.collect(cluster({"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}), T0)
        snapshot = cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS)
        snapshot.leases["apiserver-b"] = parse_lease(
            without(lease_object("apiserver-b", "b_1", T0), missing)
        )
        now = T0 + timedelta(seconds=5)  # the ledger's lease of b has not expired
        events = ledger.collect(snapshot, now)
        ended = [e for e in events if not isinstance(e, StorageVersionReported)]
        assert [(type(e), e.apiserver_id) for e in ended] == [  # type: ignore[attr-defined]
            (ApiserverLeaseExpired, "apiserver-b")
        ], missing
        assert set(ledger.state.leases) == {(CLUSTER, "apiserver-a")}
        held = ledger.state.storage_versions[CLUSTER, "apps", "deployments"]
        assert [e.apiserver_id for e in held.entries] == ["apiserver-a"]
        # A ledger that never held it admits it no more than an expired one.
        fresh = Ledger().collect(snapshot, now)
        assert {e.apiserver_id for e in fresh} == {"apiserver-a"}  # type: ignore[attr-defined]


def test_a_lease_without_holder_is_a_member_as_upstreams_gcs_hold_it() -> None:
    # Neither upstream's lease GC nor its StorageVersion GC looks at the holder.
    snapshot = cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS)
    snapshot.leases["apiserver-b"] = parse_lease(
        without(lease_object("apiserver-b", "b_1", T0), "holderIdentity")
    )
    ledger = Ledger()
    ledger.collect(snapshot, T0)
    assert ledger.state.leases[CLUSTER, "apiserver-b"].holder_identity == ""
    held = ledger.state.storage_versions[CLUSTER, "apps", "deployments"]
    assert [e.apiserver_id for e in held.entries] == ["apiserver-a", "apiserver-b"]
    # Deleted before it expired: a release of that (empty) holder, which applies.
    [released] = ledger.collect(cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS), T0)
    assert isinstance(released, ApiserverLeaseReleased) and released.holder_identity == ""
    assert set(ledger.state.leases) == {(CLUSTER, "apiserver-a")}


def test_an_identity_lease_outside_kube_system_is_not_upstreams() -> None:
    obj = lease_object("apiserver-a", "a_1", T0)
    with pytest.raises(NotUpstream, match="namespace 'default'"):
        parse_lease({**obj, "metadata": {**obj["metadata"], "namespace": "default"}})


def test_a_lease_whose_holder_holds_a_nul_character_is_passed_over() -> None:
    """No event may carry one (no database's text can store it): the lease is ignored,
    as a malformed one is, rather than failing every append of the collector."""
    with pytest.raises(NotUpstream, match="NUL character"):
        parse_lease(lease_object("apiserver-a", "a\x00_1", T0))


def test_another_components_lease_is_not_an_apiserver_identity_lease() -> None:
    # Upstream's apiserverleasegc Test_Controller: a lease labelled for another
    # component is never the apiserver lease GC's, however long expired.
    obj = lease_object("apiserver-a", "a_1", T0 - timedelta(hours=2))
    labels = {"apiserver.kubernetes.io/identity": "kube-controller-manager"}
    with pytest.raises(NotUpstream, match="not a kube-apiserver identity lease"):
        parse_lease({**obj, "metadata": {**obj["metadata"], "labels": labels}})


def test_an_expired_lease_left_behind_is_not_brought_back_after_the_lease_gc() -> None:
    # An apiserver that crashed leaves its lease; upstream's GC deletes it within the
    # hour. The ledger's lease GC expires it first: the collector must not re-add it.
    ledger = Ledger()
    leases = {"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}
    ledger.collect(cluster(leases, DEPLOYMENTS), T0)
    later = T0 + timedelta(seconds=3700)
    renewed = {"apiserver-a": ("a_1", later), "apiserver-b": ("b_1", T0)}  # b crashed
    [heartbeat] = ledger.collect(cluster(renewed, DEPLOYMENTS), later)
    assert isinstance(heartbeat, ApiserverHeartbeat) and heartbeat.apiserver_id == "apiserver-a"
    for expiry in expired(ledger.state, later):
        apply(ledger.state, expiry, Position(0, ledger.offset))
        ledger.offset += 1
    assert set(ledger.state.leases) == {(CLUSTER, "apiserver-a")}
    assert ledger.collect(cluster(renewed, DEPLOYMENTS), later + timedelta(seconds=5)) == []
    held = ledger.state.storage_versions[CLUSTER, "apps", "deployments"]
    assert [e.apiserver_id for e in held.entries] == ["apiserver-a"]


def test_a_restarted_apiserver_is_reported_again_though_its_objects_did_not_change() -> None:
    # kube-apiserver deletes its lease when it stops and starts; its entries stay in the
    # StorageVersion objects, unchanged, so no watch event shows them again.
    ledger = Ledger()
    ledger.collect(cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS), T0)
    ledger.collect(cluster({}, DEPLOYMENTS), T0 + timedelta(seconds=1))
    back = ledger.collect(
        cluster({"apiserver-a": ("a_2", T0 + timedelta(seconds=2))}, DEPLOYMENTS),
        T0 + timedelta(seconds=2),
    )
    assert [type(e).__name__ for e in back] == ["ApiserverHeartbeat", "StorageVersionReported"]


def discovered(apiserver: str, encoding: str, under: tuple[str, str]) -> Entry:
    """``apiserver``'s entry for deployments in its discovery, read under its lease ``under``."""
    decodable = tuple(sorted({encoding, "apps/v1"}))
    found = hash_of_stored(encoding, "Deployment")
    return Entry(
        apiserver,
        "apps",
        "deployments",
        encoding,
        decodable,
        (encoding,),
        found,
        "Deployment",
        under,
    )


def with_entries(snapshot: Snapshot, *entries: Entry) -> Snapshot:
    snapshot.entries.update((e.key, e) for e in entries)
    return snapshot


def held_entries(ledger: Ledger) -> dict[tuple[str, str], str]:
    """(apiserver, resource) -> the encoding version the ledger holds."""
    return {
        (e.apiserver_id, resource): e.encoding_version
        for (_, _, resource), view in ledger.state.storage_versions.items()
        for e in view.entries
    }


def test_a_restarted_apiserver_is_reported_with_no_discovered_entry_it_has_not_confirmed() -> None:
    # Restarted on an older binary, it stores in apps/v1beta1; what the old
    # process's discovery showed (apps/v1) must not stand for it, in the ledger or the report.
    ledger = Ledger()
    a_2 = ("uid-a_2", "a_2")
    old_v1 = discovered("apiserver-a", "apps/v1", A_1)
    ledger.collect(with_entries(cluster({"apiserver-a": ("a_1", T0)}), old_v1), T0)
    assert held_entries(ledger) == {("apiserver-a", "deployments"): "apps/v1"}

    # The lease seen again with another holder (deleted and created at start, one change
    # to the watch): the old holder's lease ends, with its entries; nothing is reported.
    restart = T0 + timedelta(seconds=8)
    restarted = cluster({"apiserver-a": ("a_2", restart)})
    replaced, joined = ledger.collect(with_entries(restarted, old_v1), restart)
    assert isinstance(replaced, ApiserverLeaseReleased) and replaced.holder_identity == "a_1"
    assert isinstance(joined, ApiserverHeartbeat) and joined.holder_identity == "a_2"
    assert held_entries(ledger) == {}

    # A read begun before the collector saw the new lease confirms nothing either.
    stale = discovered("apiserver-a", "apps/v1beta1", A_1)
    assert ledger.collect(with_entries(restarted, stale), restart) == []
    # One begun under it does.
    [confirmed] = ledger.collect(
        with_entries(restarted, discovered("apiserver-a", "apps/v1beta1", a_2)), restart
    )
    assert isinstance(confirmed, StorageVersionReported)
    assert confirmed.encoding_version == "apps/v1beta1"
    assert held_entries(ledger) == {("apiserver-a", "deployments"): "apps/v1beta1"}


def test_a_lease_created_again_by_the_same_process_waits_for_a_read_under_it() -> None:
    # The object deleted (seen by the collector) and created again, same holder: a new
    # lease all the same, whose discovered entries are read again before they count.
    ledger = Ledger()
    ledger.collect(
        with_entries(
            cluster({"apiserver-a": ("a_1", T0)}), discovered("apiserver-a", "apps/v1", A_1)
        ),
        T0,
    )
    [released] = ledger.collect(cluster({}), T0 + timedelta(seconds=1))
    assert isinstance(released, ApiserverLeaseReleased)
    back = T0 + timedelta(seconds=2)
    again = Snapshot()
    again.leases["apiserver-a"] = parse_lease(lease_object("apiserver-a", "a_1", back, uid="u2"))
    with_entries(again, discovered("apiserver-a", "apps/v1", A_1))
    assert [type(e) for e in ledger.collect(again, back)] == [ApiserverHeartbeat]
    with_entries(again, discovered("apiserver-a", "apps/v1", ("u2", "a_1")))
    assert [type(e) for e in ledger.collect(again, back)] == [StorageVersionReported]


@st.composite
def restarts(
    draw: st.DrawFn,
) -> list[tuple[dict[str, tuple[str, str] | None], list[tuple[str, str, bool]]]]:
    """Apiservers over time: each step, each one's lease (UID, holder) or None (deleted),
    and the discovery reads that end in it: (apiserver, encoding version, whether the
    read began under the lease before the current one)."""
    leases: dict[str, tuple[str, str] | None] = {"apiserver-a": None, "apiserver-b": None}
    serial = itertools.count()
    steps = []
    for _ in range(draw(st.integers(1, 10))):
        for apiserver, lease in list(leases.items()):
            change = draw(st.sampled_from(["keep", "restart", "recreate", "delete"]))
            if change == "restart" or (lease is None and change != "delete"):
                n = next(serial)
                leases[apiserver] = (f"uid-{n}", f"{apiserver}_{n}")
            elif change == "recreate" and lease is not None:
                leases[apiserver] = (f"uid-{next(serial)}", lease[1])
            elif change == "delete":
                leases[apiserver] = None
        reads = draw(
            st.lists(
                st.tuples(
                    st.sampled_from(sorted(leases)), st.sampled_from(_VERSIONS), st.booleans()
                ),
                max_size=3,
            )
        )
        steps.append((dict(leases), reads))
    return steps


@given(restarts())
def test_a_lease_never_holds_a_discovered_entry_not_read_under_its_holder(
    steps: list[tuple[dict[str, tuple[str, str] | None], list[tuple[str, str, bool]]]],
) -> None:
    ledger = Ledger()
    snapshot = Snapshot()
    previous: dict[str, tuple[str, str]] = {}  # apiserver -> the lease before the current
    current: dict[str, tuple[str, str]] = {}
    read_by: dict[tuple[str, str], set[str]] = collections.defaultdict(set)  # (apiserver, holder)
    now = T0
    for leases, reads in steps:
        now += timedelta(seconds=5)
        snapshot.leases.clear()
        for apiserver, lease in leases.items():
            if lease is not None and lease != current.get(apiserver):
                if apiserver in current:
                    previous[apiserver] = current[apiserver]
                current[apiserver] = lease
            if lease is not None:
                uid, holder = lease
                obj = lease_object(apiserver, holder, now, uid=uid)
                snapshot.leases[apiserver] = parse_lease(obj)
        for apiserver, encoding, stale in reads:
            under = previous.get(apiserver) if stale else current.get(apiserver)
            if under is None:
                continue
            # A read under a lease ended before this step was answered by its process.
            read_by[apiserver, under[1]].add(encoding)
            with_entries(snapshot, discovered(apiserver, encoding, under))
        ledger.collect(snapshot, now)
        assert ledger.collect(snapshot, now) == []  # converged
        held = held_entries(ledger)
        for apiserver, lease in leases.items():
            held_as = held.get((apiserver, "deployments"))
            if lease is None:
                assert held_as is None
                continue
            # Never an entry its holder's process did not show.
            assert held_as is None or held_as in read_by[apiserver, lease[1]]
            shown = snapshot.entries.get((apiserver, "apps", "deployments"))
            if shown is not None and shown.observed_under == lease:
                assert held_as == shown.encoding_version  # and every one it confirmed


def test_a_restarted_collector_appends_nothing_the_ledger_holds() -> None:
    first = Ledger()
    snapshot = cluster({"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}, DEPLOYMENTS)
    first.collect(snapshot, T0)
    assert first.restarted().collect(snapshot, T0 + timedelta(seconds=30)) == []


def test_an_entry_whose_kind_is_unknown_is_held_back_and_said() -> None:
    crd = storage_version_object(
        "example.com.widgets", ("apiserver-a", "example.com/v1", ["example.com/v1"], [])
    )
    state = State()
    events, problems = reconcile(
        state, CLUSTER, cluster({"apiserver-a": ("a_1", T0)}, crd), kind_of, T0
    )
    assert [type(e) for e in events] == [ApiserverHeartbeat]
    assert problems and "widgets.example.com" in problems[0] and "example.com/v1" in problems[0]


_VERSIONS = ("apps/v1", "apps/v1beta1", "apps/v2")


@st.composite
def snapshots(draw: st.DrawFn) -> list[tuple[Snapshot, datetime]]:
    """A cluster over time: apiservers come, renew, restart and go; entries change."""
    steps = []
    now = T0
    for _ in range(draw(st.integers(1, 12))):
        now += timedelta(seconds=draw(st.integers(1, 4000)))
        leases: dict[str, tuple[str, datetime]] = {}
        entries = []
        for apiserver in draw(
            st.sets(st.sampled_from(["apiserver-a", "apiserver-b", "apiserver-c"]))
        ):
            holder = f"{apiserver}_{draw(st.integers(1, 2))}"
            leases[apiserver] = (holder, now - timedelta(seconds=draw(st.integers(0, 5))))
            if draw(st.booleans()):
                encoding = draw(st.sampled_from(_VERSIONS))
                entries.append((apiserver, encoding, sorted({encoding, "apps/v1"}), [encoding]))
        steps.append((cluster(leases, storage_version_object("apps.deployments", *entries)), now))
    return steps


@given(snapshots())
def test_after_each_collection_the_ledger_holds_what_the_cluster_shows(
    steps: list[tuple[Snapshot, datetime]],
) -> None:
    ledger = Ledger()
    for snapshot, now in steps:
        ledger.collect(snapshot, now)
        assert ledger.collect(snapshot, now) == []  # converged: nothing twice
        live = {(CLUSTER, a) for a in snapshot.leases}
        assert set(ledger.state.leases) == live
        held = ledger.state.storage_versions.get((CLUSTER, "apps", "deployments"))
        shown = {(e.apiserver_id, e.encoding_version) for e in snapshot.entries.values()}
        ledger_entries = (
            set() if held is None else {(e.apiserver_id, e.encoding_version) for e in held.entries}
        )
        assert shown <= ledger_entries  # every entry shown is held
        assert {a for a, _ in ledger_entries} <= set(snapshot.leases)  # only of live apiservers


@given(micros=st.integers(-2_000_000, 2_000_000))
def test_the_lease_gc_and_the_collector_agree_on_when_a_lease_has_expired(micros: int) -> None:
    # Upstream's isLeaseExpired: expired once renewTime + leaseDurationSeconds < now.
    now = T0 + timedelta(seconds=3600, microseconds=micros)
    gone = now > T0 + timedelta(seconds=3600)

    ledger = Ledger()
    ledger.collect(cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS), T0)
    assert [e.apiserver_id for e in expired(ledger.state, now)] == (["apiserver-a"] if gone else [])
    [ended] = ledger.collect(cluster({}, DEPLOYMENTS), now)
    assert isinstance(ended, ApiserverLeaseExpired if gone else ApiserverLeaseReleased)

    stranger = Ledger()  # a lease the ledger never held, seen at ``now``
    admitted = stranger.collect(cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS), now)
    assert [type(e) for e in admitted] == (
        [] if gone else [ApiserverHeartbeat, StorageVersionReported]
    )


def discovery_document(
    group_version: str, *resources: tuple[str, str, str | None]
) -> dict[str, Any]:
    """An ``APIResourceList`` as ``/api/v1`` or ``/apis/<group>/<version>`` answers it."""
    listed: list[dict[str, Any]] = []
    for name, kind, found in resources:
        listed.append({"name": name, "kind": kind, "namespaced": True, "verbs": ["get"]})
        if found is not None:
            listed[-1]["storageVersionHash"] = found
    return {"kind": "APIResourceList", "groupVersion": group_version, "resources": listed}


def test_discovery_lists_stored_resources_with_their_hash_and_leaves_out_subresources() -> None:
    core = discovery_document(
        "v1",
        ("pods", "Pod", hash_of_stored("v1", "Pod")),
        ("pods/status", "Pod", None),
        ("bindings", "Binding", None),  # created, never stored: no hash
    )
    assert parse_discovery(core) == [
        Served("", "pods", "v1", "Pod", hash_of_stored("v1", "Pod")),
        Served("", "bindings", "v1", "Binding", None),
    ]
    with pytest.raises(NotUpstream, match="names no group/version"):
        parse_discovery({"resources": []})


# A few resources as a kube-apiserver's discovery lists them, with the hashes it shows.
STOCK = [
    *parse_discovery(
        discovery_document(
            "v1",
            ("pods", "Pod", "xPOwRZ+Yhw8="),
            ("events", "Event", "r2yiGXH7wu8="),
            ("bindings", "Binding", None),
        )
    ),
    *parse_discovery(discovery_document("apps/v1", ("deployments", "Deployment", "8aSe+NMegvE="))),
    *parse_discovery(discovery_document("events.k8s.io/v1", ("events", "Event", "r2yiGXH7wu8="))),
    *parse_discovery(
        discovery_document(
            "autoscaling/v2",
            ("horizontalpodautoscalers", "HorizontalPodAutoscaler", "qwQve8ut294="),
        )
    ),
    *parse_discovery(
        discovery_document(
            "autoscaling/v1",
            ("horizontalpodautoscalers", "HorizontalPodAutoscaler", "qwQve8ut294="),
        )
    ),
]


def test_upstreams_discovery_hashes_are_those_of_the_stored_group_version_kind() -> None:
    # events.k8s.io events hash as core v1 Events, autoscaling/v1 HPAs as v2 ones.
    assert [s.storage_version_hash for s in STOCK if s.storage_version_hash] == [
        hash_of_stored(v, k)
        for v, k in [
            ("v1", "Pod"),
            ("v1", "Event"),
            ("apps/v1", "Deployment"),
            ("v1", "Event"),
            ("autoscaling/v2", "HorizontalPodAutoscaler"),
            ("autoscaling/v2", "HorizontalPodAutoscaler"),
        ]
    ]


def test_a_built_in_resource_is_reported_as_the_served_kind_its_discovery_hash_names() -> None:
    entries, problems = built_in_entries("apiserver-a", A_1, STOCK, STOCK)
    assert problems == []
    assert {(e.group, e.resource): e for e in entries} == {
        ("", "pods"): Entry(
            "apiserver-a",
            "",
            "pods",
            "v1",
            ("v1",),
            ("v1",),
            hash_of_stored("v1", "Pod"),
            "Pod",
            A_1,
        ),
        ("", "events"): Entry(
            "apiserver-a", "", "events", "v1", ("v1",), ("v1",), "r2yiGXH7wu8=", "Event", A_1
        ),
        ("apps", "deployments"): Entry(
            "apiserver-a",
            "apps",
            "deployments",
            "apps/v1",
            ("apps/v1",),
            ("apps/v1",),
            "8aSe+NMegvE=",
            "Deployment",
            A_1,
        ),
        # Stored in another group's version: decodable from it too.
        ("events.k8s.io", "events"): Entry(
            "apiserver-a",
            "events.k8s.io",
            "events",
            "v1",
            ("events.k8s.io/v1", "v1"),
            ("events.k8s.io/v1",),
            "r2yiGXH7wu8=",
            "Event",
            A_1,
        ),
        # Served in two versions, in the order discovery lists them.
        ("autoscaling", "horizontalpodautoscalers"): Entry(
            "apiserver-a",
            "autoscaling",
            "horizontalpodautoscalers",
            "autoscaling/v2",
            ("autoscaling/v2", "autoscaling/v1"),
            ("autoscaling/v2", "autoscaling/v1"),
            "qwQve8ut294=",
            "HorizontalPodAutoscaler",
            A_1,
        ),
    }
    # Reported with the matched kind, though the cluster's discovery names none.
    snapshot = cluster({"apiserver-a": ("a_1", T0)})
    snapshot.entries.update((e.key, e) for e in entries)
    events, problems = reconcile(State(), CLUSTER, snapshot, lambda *_: None, T0)
    assert problems == []
    reported = {
        (e.group, e.resource): (e.kind, e.encoding_version)
        for e in events
        if isinstance(e, StorageVersionReported)
    }
    assert reported[("events.k8s.io", "events")] == ("Event", "v1")
    assert len(reported) == 5


def mutating_admission_policies(served: str, stored: str) -> list[Served]:
    kind = "MutatingAdmissionPolicy"
    return parse_discovery(
        discovery_document(
            f"admissionregistration.k8s.io/{served}",
            ("mutatingadmissionpolicies", kind, hash_of_stored(stored, kind)),
        )
    )


def test_a_version_only_another_apiserver_serves_is_found_among_what_it_serves() -> None:
    old = mutating_admission_policies("v1beta1", "admissionregistration.k8s.io/v1beta1")
    new = mutating_admission_policies("v1", "admissionregistration.k8s.io/v1beta1")
    [entry], _ = built_in_entries("apiserver-b", B_1, new, [*old, *new])
    assert entry.encoding_version == "admissionregistration.k8s.io/v1beta1"
    assert entry.served_versions == ("admissionregistration.k8s.io/v1",)
    assert entry.decodable_versions == (
        "admissionregistration.k8s.io/v1",
        "admissionregistration.k8s.io/v1beta1",
    )


def test_a_version_served_by_no_apiserver_is_found_by_upstreams_version_names() -> None:
    # As v1.36.3 does: mutatingadmissionpolicies served in v1 (v1beta1 is off by default),
    # stored in v1beta1; CustomResourceDefinitions stored in a version no release serves.
    own = [
        *mutating_admission_policies("v1", "admissionregistration.k8s.io/v1beta1"),
        *parse_discovery(
            discovery_document(
                "apiextensions.k8s.io/v1",
                (
                    "customresourcedefinitions",
                    "CustomResourceDefinition",
                    "jfWCUB31mvA=",  # as a v1.37.2 apiserver shows it
                ),
            )
        ),
    ]
    entries, problems = built_in_entries("apiserver-a", A_1, own, own)
    assert problems == []
    assert [(e.resource, e.encoding_version, e.decodable_versions) for e in entries] == [
        (
            "mutatingadmissionpolicies",
            "admissionregistration.k8s.io/v1beta1",
            ("admissionregistration.k8s.io/v1", "admissionregistration.k8s.io/v1beta1"),
        ),
        (
            "customresourcedefinitions",
            "apiextensions.k8s.io/v1beta1",
            ("apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1"),
        ),
    ]


def test_a_hash_that_names_nothing_is_reported_unnamed_and_said() -> None:
    own = mutating_admission_policies("v1", "example.com/v1")  # another group's, unserved
    entries, problems = built_in_entries("apiserver-b", B_1, own, own)
    [unnamed] = entries
    assert (unnamed.encoding_version, unnamed.storage_version_hash) == (
        "",
        own[0].storage_version_hash,
    )
    assert (
        unnamed.decodable_versions
        == unnamed.served_versions
        == ("admissionregistration.k8s.io/v1",)
    )
    assert problems == [
        "apiserver-b's discovery of mutatingadmissionpolicies.admissionregistration.k8s.io"
        " (admissionregistration.k8s.io/v1) shows storageVersionHash"
        f" {own[0].storage_version_hash}, the hash of none of the group/version/kinds the"
        " apiservers serve or upstream's version names; reported as stored in an unnamed"
        " version, which agrees with none"
    ]
    # The ledger holds it: a disagreement with any other apiserver, whose words say why.
    ledger = Ledger()
    leases = {"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}
    [named], _ = built_in_entries(
        "apiserver-a", A_1, mutating_admission_policies("v1", "admissionregistration.k8s.io/v1"), []
    )
    ledger.collect(with_entries(cluster(leases), named, unnamed), T0)
    key = (CLUSTER, "admissionregistration.k8s.io", "mutatingadmissionpolicies")
    storage_version = ledger.state.storage_versions[key]
    assert storage_version.common_encoding_version is None
    assert "stored in a version no one can name by apiserver-b" in (
        storage_version.condition.message
    )
    assert (
        own[0].storage_version_hash
        in ledger.state.storage_states[key].persisted_storage_version_hashes
    )
    # Named once an apiserver serves that group's kind.
    widgets = parse_discovery(
        discovery_document("example.com/v2", ("widgets", "MutatingAdmissionPolicy", None))
    )
    [entry], _ = built_in_entries("apiserver-b", B_1, own, [*own, *widgets])
    assert entry.encoding_version == "example.com/v1"


def test_custom_resources_are_left_to_their_definitions() -> None:
    widgets = parse_discovery(
        discovery_document(
            "example.com/v1", ("widgets", "Widget", hash_of_stored("example.com/v1", "Widget"))
        )
    )
    assert built_in_entries("apiserver-a", A_1, widgets, widgets, {("example.com", "widgets")}) == (
        [],
        [],
    )


_GROUPS = ["", "apps", "events.k8s.io", "example.io"]
_KINDS = ["Event", "Deployment", "Thing"]


@st.composite
def served_sets(draw: st.DrawFn) -> tuple[list[Served], list[Served], tuple[str, str]]:
    """An apiserver's resource (``things``, group ``example.io``) served in some versions,
    stored as a random group/version/kind, among random ones the other apiservers serve."""

    def version_of(group: str) -> str:
        name = draw(st.sampled_from(["v1", "v1beta1", "v2", "v2alpha1"]))
        return f"{group}/{name}" if group else name

    stored = (version_of(draw(st.sampled_from(_GROUPS))), draw(st.sampled_from(_KINDS)))
    found = hash_of_stored(*stored)
    own = [
        Served("example.io", "things", v, "Thing", found)
        for v in dict.fromkeys(
            draw(st.lists(st.builds(version_of, st.just("example.io")), min_size=1))
        )
    ]
    others = [
        Served(group, draw(st.sampled_from(["things", "events"])), version_of(group), kind, None)
        for group, kind in draw(
            st.lists(st.tuples(st.sampled_from(_GROUPS), st.sampled_from(_KINDS)), max_size=12)
        )
    ]
    return own, others, stored


@given(served_sets())
def test_the_stored_version_is_found_whenever_an_apiserver_serves_it(
    case: tuple[list[Served], list[Served], tuple[str, str]],
) -> None:
    own, others, (stored_version, stored_kind) = case
    everywhere = [*own, *others]
    entries, problems = built_in_entries("apiserver-a", A_1, own, everywhere)
    served_anywhere = {(s.version, s.kind) for s in everywhere}
    served = tuple(s.version for s in own)
    # Unserved, it is found in the resource's group, or one serving the resource's kind.
    stored_group = stored_version.rpartition("/")[0]
    groups = {"example.io"} | {s.group for s in everywhere if s.kind == "Thing"}
    named = stored_kind == "Thing" and stored_group in groups
    if (stored_version, stored_kind) not in served_anywhere and not named:
        [unnamed] = entries
        assert unnamed.encoding_version == ""  # reported, with its hash, as unnamed
        assert len(problems) == 1 and "the hash of none of" in problems[0]
        return
    assert problems == []
    [entry] = entries
    assert (entry.encoding_version, entry.kind) == (stored_version, stored_kind)
    assert entry.served_versions == served
    expected = served if stored_version in served else (*served, stored_version)
    assert entry.decodable_versions == expected
    check_report(
        entry.group,
        entry.resource,
        stored_kind,
        entry.encoding_version,
        entry.decodable_versions,
        entry.served_versions,
        entry.apiserver_id,
    )


# --- sources and membership -------------------------------------------------------------


def test_each_report_says_its_source_and_a_contradiction_between_them_is_a_disagreement() -> None:
    ledger = Ledger()
    snapshot = cluster({"apiserver-a": ("a_1", T0)}, DEPLOYMENTS)  # its object says apps/v1
    with_entries(snapshot, discovered("apiserver-a", "apps/v1", A_1))
    events = ledger.collect(snapshot, T0)
    sources = [e.source for e in events if isinstance(e, StorageVersionReported)]
    assert sorted(sources) == ["discovery", "storageversion"]
    key = (CLUSTER, "apps", "deployments")
    assert ledger.state.storage_versions[key].common_encoding_version == "apps/v1"

    # Its discovery names another version than its StorageVersion entry.
    with_entries(snapshot, discovered("apiserver-a", "apps/v2", A_1))
    [report] = ledger.collect(snapshot, T0)
    assert isinstance(report, StorageVersionReported) and report.source == "discovery"
    storage_version = ledger.state.storage_versions[key]
    assert storage_version.common_encoding_version is None
    assert "sources disagree: apiserver-a: discovery apps/v2, storageversion apps/v1" in (
        storage_version.condition.message
    )


def two_discovered(a_stores: str, b_stores: str) -> tuple[Ledger, Snapshot]:
    """A ledger that holds apiserver-a storing deployments in ``a_stores`` and apiserver-b
    in ``b_stores``, both read from their discovery, and the snapshot that showed it."""
    ledger = Ledger()
    leases = {"apiserver-a": ("a_1", T0), "apiserver-b": ("b_1", T0)}
    snapshot = with_entries(
        cluster(leases),
        discovered("apiserver-a", a_stores, A_1),
        discovered("apiserver-b", b_stores, B_1),
    )
    ledger.collect(snapshot, T0)
    return ledger, snapshot


def test_an_apiserver_whose_discovery_cannot_be_read_loses_its_discovered_entries() -> None:
    # A ledger a predecessor wrote: this collector has asked neither apiserver yet.
    ledger, snapshot = two_discovered("apps/v1", "apps/v1")
    del snapshot.entries["apiserver-b", "apps", "deployments", "discovery"]
    assert ledger.collect(snapshot, T0) == []  # b not asked yet: its entry stands

    snapshot.discovery.update({"apiserver-a": "", "apiserver-b": "connection refused"})
    [withdrawn] = ledger.collect(snapshot, T0)

    assert isinstance(withdrawn, StorageVersionWithdrawn)
    assert (withdrawn.apiserver_id, withdrawn.source) == ("apiserver-b", "discovery")
    assert withdrawn.reason == "its discovery could not be read: connection refused"
    condition = ledger.state.storage_versions[CLUSTER, "apps", "deployments"].condition
    assert condition.status == "Unknown" and "apiserver-b" in condition.message
    assert ledger.collect(snapshot, T0) == []  # once
    # Read again: reported again, and agreement is back.
    snapshot.discovery["apiserver-b"] = ""
    with_entries(snapshot, discovered("apiserver-b", "apps/v1", B_1))
    [reported] = ledger.collect(snapshot, T0)
    assert isinstance(reported, StorageVersionReported)
    condition = ledger.state.storage_versions[CLUSTER, "apps", "deployments"].condition
    assert condition.status == "True"


def b_departing() -> tuple[Ledger, Snapshot]:
    """apiserver-a on apps/v2, apiserver-b on apps/v1 told to stop: its lease is deleted,
    and it may still serve (and write)."""
    ledger, snapshot = two_discovered("apps/v2", "apps/v1")
    del snapshot.leases["apiserver-b"]
    snapshot.departing.add("apiserver-b")
    return ledger, snapshot


def test_a_departing_apiserver_keeps_its_lease_and_entries_until_it_has_stopped() -> None:
    # kube-apiserver deletes its lease when told to stop, then serves (and writes) on for
    # its --shutdown-delay-duration: its entries must hold agreement back meanwhile.
    ledger, snapshot = b_departing()

    assert ledger.collect(snapshot, T0 + timedelta(seconds=5)) == []
    assert held_entries(ledger) == {
        ("apiserver-a", "deployments"): "apps/v2",
        ("apiserver-b", "deployments"): "apps/v1",
    }
    # Its ledger lease expired by its own renew time: departing or not, it ends.
    expired_at = T0 + timedelta(seconds=3601)
    assert [type(e) for e in ledger.collect(snapshot, expired_at)] == [ApiserverLeaseExpired]


def test_a_stopped_apiserver_is_released_and_agreement_follows() -> None:
    ledger, snapshot = b_departing()
    ledger.collect(snapshot, T0)

    snapshot.departing.discard("apiserver-b")  # its discovery stopped answering
    [released] = ledger.collect(snapshot, T0 + timedelta(seconds=12))

    assert isinstance(released, ApiserverLeaseReleased)
    key = (CLUSTER, "apps", "deployments")
    assert ledger.state.storage_versions[key].common_encoding_version == "apps/v2"


# --- CustomResourceDefinitions ----------------------------------------------------------

WIDGETS = (CLUSTER, "example.com", "widgets")


def widgets_definition(
    storage: str = "v1",
    stored: tuple[str, ...] = ("v1",),
    *,
    generation: int = 1,
    resource_version: str = "100",
    uid: str = "uid-widgets",
    migrating: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The CustomResourceDefinition of ``widgets.example.com``: v1alpha1 (no longer served),
    v1 and v2, stored in ``storage``; ``migrating``: its StorageMigrating condition."""
    conditions = [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}]
    if migrating is not None:
        conditions.append({"type": "StorageMigrating", **migrating})
    return {
        "metadata": {
            "name": "widgets.example.com",
            "uid": uid,
            "generation": generation,
            "resourceVersion": resource_version,
        },
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {"name": v, "served": v != "v1alpha1", "storage": v == storage}
                for v in ("v1alpha1", "v1", "v2")
            ],
        },
        "status": {"storedVersions": list(stored), "conditions": conditions},
    }


def definitions(*objects: dict[str, Any]) -> Snapshot:
    """A cluster whose CustomResourceDefinitions have been listed: ``objects``."""
    snapshot = Snapshot(custom_resources_listed=True)
    for obj in objects:
        snapshot.custom_resources[obj["metadata"]["name"]] = parse_custom_resource(obj)
    return snapshot


def observed(events: list[Event]) -> CustomResourceDefinitionObserved:
    [event] = events
    assert isinstance(event, CustomResourceDefinitionObserved)
    return event


def test_a_definition_is_recorded_at_first_sight_and_not_again_while_it_holds() -> None:
    ledger = Ledger()
    event = observed(ledger.collect(definitions(widgets_definition()), T0))

    assert (event.meta.cluster, event.meta.source) == (CLUSTER, "svledger-collector")
    assert (event.group, event.resource, event.kind, event.name, event.uid) == (
        "example.com",
        "widgets",
        "Widget",
        "widgets.example.com",
        "uid-widgets",
    )
    assert (event.generation, event.resource_version) == (1, "100")
    # Bare, as the definition names them, in its order.
    assert event.versions == ("v1alpha1", "v1", "v2")
    assert event.served_versions == ("v1", "v2")
    assert (event.storage_version, event.stored_versions) == ("v1", ("v1",))
    assert event.storage_migrating_status is None and event.storage_migrating_reason is None
    assert event.storage_migrating_observed_generation is None
    assert not event.deleted
    assert ledger.state.custom_resources[WIDGETS].storage_version == "v1"

    assert ledger.collect(definitions(widgets_definition()), T0 + timedelta(seconds=5)) == []


def test_a_new_storage_version_is_recorded() -> None:
    ledger = Ledger()
    ledger.collect(definitions(widgets_definition()), T0)
    # The apiserver adds the new storage version to storedVersions in the same update.
    changed = widgets_definition("v2", ("v1", "v2"), generation=2, resource_version="105")

    event = observed(ledger.collect(definitions(changed), T0))

    assert (event.storage_version, event.stored_versions) == ("v2", ("v1", "v2"))
    assert (event.generation, event.resource_version) == (2, "105")
    assert ledger.collect(definitions(changed), T0) == []


def test_a_change_of_stored_versions_is_recorded() -> None:
    ledger = Ledger()
    ledger.collect(definitions(widgets_definition("v2", ("v1", "v2"), generation=2)), T0)
    pruned = widgets_definition("v2", ("v2",), generation=2, resource_version="130")

    event = observed(ledger.collect(definitions(pruned), T0))

    assert event.stored_versions == ("v2",)
    assert ledger.state.custom_resources[WIDGETS].stored_versions == ("v2",)
    assert ledger.collect(definitions(pruned), T0) == []


def test_a_status_write_that_changes_only_the_resource_version_is_not_recorded() -> None:
    # Every write of the object bumps its resourceVersion (conditions' heartbeats, an
    # annotation): one event each would flood the log with nothing new.
    ledger = Ledger()
    ledger.collect(definitions(widgets_definition()), T0)

    assert ledger.collect(definitions(widgets_definition(resource_version="101")), T0) == []
    assert ledger.state.custom_resources[WIDGETS].resource_version == "100"


def test_the_storage_migrating_condition_is_recorded_when_set_and_when_cleared() -> None:
    ledger = Ledger()
    ledger.collect(definitions(widgets_definition("v2", ("v1", "v2"), generation=2)), T0)
    running = {
        "status": "True",
        "reason": "MigrationRunning",
        "message": "migrating to v2\x00",
        "observedGeneration": 2,
    }
    migrating = widgets_definition("v2", ("v1", "v2"), generation=2, migrating=running)

    set_ = observed(ledger.collect(definitions(migrating), T0))

    assert (set_.storage_migrating_status, set_.storage_migrating_reason) == (
        "True",
        "MigrationRunning",
    )
    # A NUL character, which no event may carry, is kept escaped, as JSON writes it.
    assert set_.storage_migrating_message == "migrating to v2\\u0000"
    assert set_.storage_migrating_observed_generation == 2
    assert ledger.collect(definitions(migrating), T0) == []

    cleared = observed(
        ledger.collect(definitions(widgets_definition("v2", ("v1", "v2"), generation=2)), T0)
    )

    assert (cleared.storage_migrating_status, cleared.storage_migrating_message) == (None, None)
    assert cleared.storage_migrating_observed_generation is None
    assert ledger.state.custom_resources[WIDGETS].storage_migrating_reason is None


def test_a_deleted_definition_is_recorded_deleted_once_with_its_last_state() -> None:
    ledger = Ledger()
    ledger.collect(definitions(widgets_definition("v2", ("v1", "v2"), generation=2)), T0)

    event = observed(ledger.collect(definitions(), T0))

    assert event.deleted
    assert (event.name, event.uid, event.storage_version) == (
        "widgets.example.com",
        "uid-widgets",
        "v2",
    )
    assert event.stored_versions == ("v1", "v2")
    assert WIDGETS not in ledger.state.custom_resources
    assert ledger.collect(definitions(), T0) == []


def test_a_definition_created_again_under_its_name_ends_the_old_one_first() -> None:
    ledger = Ledger()
    ledger.collect(definitions(widgets_definition()), T0)
    again = widgets_definition(uid="uid-widgets-2", resource_version="200")

    ended, created = ledger.collect(definitions(again), T0)

    assert isinstance(ended, CustomResourceDefinitionObserved) and ended.deleted
    assert ended.uid == "uid-widgets"
    assert isinstance(created, CustomResourceDefinitionObserved) and not created.deleted
    assert created.uid == "uid-widgets-2"
    assert ledger.state.custom_resources[WIDGETS].uid == "uid-widgets-2"


def test_a_restarted_collector_records_nothing_the_ledger_holds_of_a_definition() -> None:
    first = Ledger()
    first.collect(definitions(widgets_definition()), T0)
    # Its status written since, by the apiserver: a new resourceVersion and nothing else.
    shown = definitions(widgets_definition(resource_version="117"))

    assert first.restarted().collect(shown, T0 + timedelta(seconds=30)) == []


def test_a_definition_not_listed_yet_is_not_taken_for_deleted() -> None:
    restarted = Ledger()
    restarted.collect(definitions(widgets_definition()), T0)
    restarted = restarted.restarted()

    # Its leases are listed and watched; its definitions are not listed yet (a 404 from a
    # stand-in, a list that failed and is retried).
    assert restarted.collect(Snapshot(), T0 + timedelta(seconds=30)) == []
    assert WIDGETS in restarted.state.custom_resources
    # Listed, and gone: deleted.
    assert observed(restarted.collect(definitions(), T0 + timedelta(seconds=35))).deleted


def test_a_custom_resource_is_reported_after_its_definition_in_its_group_versions() -> None:
    crd = parse_custom_resource(widgets_definition("v2", ("v1", "v2"), generation=2))
    entry = crd.entry("apiserver-a", hash_of_stored("example.com/v2", "Widget"), A_1)
    assert entry is not None
    assert entry.encoding_version == "example.com/v2"
    assert entry.decodable_versions == (
        "example.com/v1alpha1",
        "example.com/v1",
        "example.com/v2",
    )
    assert entry.served_versions == ("example.com/v1", "example.com/v2")
    snapshot = with_entries(cluster({"apiserver-a": ("a_1", T0)}), entry)
    snapshot.custom_resources["widgets.example.com"] = crd

    events = Ledger().collect(snapshot, T0)

    assert [type(e) for e in events] == [
        ApiserverHeartbeat,
        CustomResourceDefinitionObserved,
        StorageVersionReported,
    ]


def test_a_definition_without_exactly_one_storage_version_is_not_upstreams() -> None:
    obj = widgets_definition()
    obj["spec"]["versions"][2]["storage"] = True
    with pytest.raises(NotUpstream, match=r"marks 2 versions as its storage version \(v1, v2\)"):
        parse_custom_resource(obj)
