"""``svledger history`` and ``explain`` without a database: name resolution and the words.

The facts are made by the real fold from a readable scenario, so the explanation is
checked against what the fold did, event by event, at positions the test chose.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.events import (
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    Event,
    Meta,
    MigrationRequested,
    MigrationStarted,
    MigrationSucceeded,
    Position,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
    type_name,
)
from ledger.names import resource_name, storage_state_name
from projections import fold
from projections.crds import stored_version_verdicts
from projections.history import (
    Facts,
    HistoryEntry,
    ResourceNameError,
    explanation,
    format_history,
    hash_origins,
    in_request_order,
    resolve,
    with_membership,
)
from projections.state import ResourceKey, State
from tests.histories import storage_version_hash

START = datetime(2024, 6, 1, tzinfo=UTC)
KEY: ResourceKey = ("prod", "apps", "deployments")


def entry(event: Event, position: Position, rejection: str | None) -> HistoryEntry:
    """The history row of an event, its payload as ``ledger_events`` keeps it."""

    def plain(value: object) -> object:
        if isinstance(value, datetime):
            return value.isoformat()
        return list(value) if isinstance(value, tuple) else value

    payload = {
        field.name: plain(getattr(event, field.name))
        for field in dataclasses.fields(event)
        if field.name != "meta"
    }
    return HistoryEntry(
        position=position,
        cluster=event.meta.cluster,
        event_type=type_name(event),
        subject=fold.subject(event),
        occurred_at=event.meta.occurred_at,
        source=event.meta.source,
        payload=payload,
        rejection=rejection,
    )


LEASE_EVENTS = ("ApiserverHeartbeat", "ApiserverLeaseReleased", "ApiserverLeaseExpired")
RESOURCE_EVENTS = (
    "StorageVersionReported",
    "StorageVersionWithdrawn",
    "StorageStateReset",
    "CustomResourceDefinitionObserved",
    "StoredVersionsPruned",
    "StoredVersionsPruneRefused",
)


class Scenario:
    """Events of one cluster at offsets 0, 1, 2, ... folded as they are added."""

    def __init__(self) -> None:
        self.state = State()
        self.entries: list[HistoryEntry] = []
        self.records: list[tuple[Event, Position]] = []  # what the log holds, in order

    def meta(self, source: str) -> Meta:
        offset = len(self.entries)
        return Meta(f"event-{offset}", "prod", START + timedelta(minutes=offset), source)

    def add(self, event: Event) -> Position:
        position = Position(0, len(self.entries))
        changes = fold.apply(self.state, event, position)
        rejection = changes.rejections[0].reason if changes.rejections else None
        self.entries.append(entry(event, position, rejection))
        self.records.append((event, position))
        return position

    def heartbeat(self, apiserver: str) -> Position:
        meta = self.meta(apiserver)
        return self.add(
            ApiserverHeartbeat(meta, apiserver, f"{apiserver}_1", apiserver, 3600, meta.occurred_at)
        )

    def report(self, apiserver: str, version: str) -> Position:
        return self.add(
            StorageVersionReported(
                self.meta(apiserver), apiserver, "apps", "deployments", "Deployment",
                f"apps/{version}", ("apps/v1", "apps/v2"), ("apps/v1", "apps/v2"),
            )
        )  # fmt: skip

    def facts(self, key: ResourceKey = KEY) -> Facts:
        """What ``gather`` would read: the resource's events and the cluster's lease events."""
        lease_events = [e for e in self.entries if e.event_type in LEASE_EVENTS and e.applied]
        history, membership = with_membership(
            [e for e in self.entries if e.event_type not in LEASE_EVENTS], lease_events
        )
        return Facts(
            key=key,
            storage_version=self.state.storage_versions.get(key),
            storage_state=self.state.storage_states.get(key),
            migrations=in_request_order(
                (m for m in self.state.migrations.values() if m.resource_key == key), history
            ),
            history=tuple(
                e
                for e in history
                if e.subject == resource_name(*key[1:]) or e.event_type not in RESOURCE_EVENTS
            ),
            membership=tuple(membership),
            crd=self.state.custom_resources.get(key),
            verdicts=stored_version_verdicts(self.state, key),
            audit=self.state.audits.get(key),
        )


@pytest.fixture
def rolling_upgrade() -> tuple[Scenario, dict[str, Position]]:
    """Three apiservers agree on v1, a migration pins v1, then a and b move to v2 and c dies."""
    s = Scenario()
    at: dict[str, Position] = {}
    for apiserver in ("a", "b", "c"):
        s.heartbeat(apiserver)
    for apiserver in ("a", "b", "c"):
        at[f"report {apiserver} v1"] = s.report(apiserver, "v1")
    h1 = storage_version_hash("apps", "v1", "Deployment")
    h2 = storage_version_hash("apps", "v2", "Deployment")
    at["request m1"] = s.add(
        MigrationRequested(
            s.meta("migrator"), "m1", "apps", "deployments", "apps/v1", h1, str(at["report c v1"])
        )
    )
    s.add(MigrationStarted(s.meta("worker"), "m1"))
    at["m1 succeeded"] = s.add(MigrationSucceeded(s.meta("worker"), "m1", 7))
    at["report a v2"] = s.report("a", "v2")
    c_heartbeat = s.state.leases["prod", "c"].renew_time
    at["expire c"] = s.add(ApiserverLeaseExpired(s.meta("lease-gc"), "c", c_heartbeat, 3600))
    at["report b v2"] = s.report("b", "v2")
    at["request m2"] = s.add(
        MigrationRequested(
            s.meta("migrator"), "m2", "apps", "deployments", "apps/v2", h2, str(at["report b v2"])
        )
    )
    at["start m2"] = s.add(MigrationStarted(s.meta("worker"), "m2"))
    at["stranger"] = s.report("stranger", "v1")
    return s, at


def test_explanation_cites_the_reports_behind_each_entry_and_the_agreement(
    rolling_upgrade: tuple[Scenario, dict[str, Position]],
) -> None:
    scenario, at = rolling_upgrade
    text = explanation(scenario.facts())
    lines = text.splitlines()
    entry_a = next(line for line in lines if line.strip().startswith("- a encodes"))
    entry_b = next(line for line in lines if line.strip().startswith("- b encodes"))
    assert "encodes in apps/v2" in entry_a and f"at {at['report a v2']} " in entry_a
    assert "encodes in apps/v2" in entry_b and f"at {at['report b v2']} " in entry_b
    assert not any(line.strip().startswith("- c encodes") for line in lines)
    agreement = next(line for line in lines if line.startswith("They agree"))
    # Agreement came back when b moved to v2, the last apiserver still on v1.
    assert "v2" in agreement and f"at {at['report b v2']} " in agreement


def test_explanation_names_the_expiry_that_removed_an_entry(
    rolling_upgrade: tuple[Scenario, dict[str, Position]],
) -> None:
    scenario, at = rolling_upgrade
    removal = next(
        line
        for line in explanation(scenario.facts()).splitlines()
        if line.strip().startswith("- c ")
    )
    assert f"at {at['expire c']} " in removal and "lease-gc" in removal


def test_every_persisted_hash_is_traced_to_the_event_that_put_it_there(
    rolling_upgrade: tuple[Scenario, dict[str, Position]],
) -> None:
    scenario, at = rolling_upgrade
    facts = scenario.facts()
    h1 = storage_version_hash("apps", "v1", "Deployment")
    h2 = storage_version_hash("apps", "v2", "Deployment")
    assert facts.storage_state is not None
    assert facts.storage_state.persisted_storage_version_hashes == (h1, h2)
    origins = hash_origins(facts)
    assert origins[h1].position == at["m1 succeeded"]
    assert origins[h2].position == at["report a v2"]
    text = explanation(facts)
    assert f"- {h1}: migration m1 rewrote every object" in text
    assert f"- {h2}: a reported encoding version apps/v2" in text


def test_explanation_gives_the_latest_migration_and_its_phase(
    rolling_upgrade: tuple[Scenario, dict[str, Position]],
) -> None:
    scenario, at = rolling_upgrade
    text = explanation(scenario.facts())
    migration = text[text.index("Latest migration") :]
    assert migration.startswith("Latest migration m2 (of 2): Running, to apps/v2")
    assert f"at {at['request m2']} " in migration and f"at {at['start m2']} " in migration


def test_the_latest_migration_is_the_last_requested_when_requests_share_a_time() -> None:
    # The migrator requests, cancels and requests again within one event time when the
    # storage version changes under its request; IDs are UUIDs, in no order.
    s = Scenario()
    for apiserver in ("a", "b"):
        s.heartbeat(apiserver)
        s.report(apiserver, "v2")
    h2 = storage_version_hash("apps", "v2", "Deployment")
    revision = str(Position(0, len(s.entries) - 1))
    same_time = s.meta("migrator")
    for migration_id in ("m9", "m1"):
        meta = dataclasses.replace(same_time, event_id=f"request-{migration_id}")
        s.add(
            MigrationRequested(meta, migration_id, "apps", "deployments", "apps/v2", h2, revision)
        )
    migration = explanation(s.facts())
    assert "Latest migration m1 (of 2)" in migration


def test_a_stale_success_is_what_last_moved_its_migration() -> None:
    # Succeeded after the StorageVersion moved on: the migration ends Succeeded, the
    # persisted hashes are kept, and the success is recorded as a rejection.
    s = Scenario()
    s.heartbeat("a")
    s.report("a", "v1")
    h1 = storage_version_hash("apps", "v1", "Deployment")
    revision = str(Position(0, len(s.entries) - 1))
    s.add(
        MigrationRequested(s.meta("migrator"), "m1", "apps", "deployments", "apps/v1", h1, revision)
    )
    s.add(MigrationStarted(s.meta("worker"), "m1"))
    s.report("a", "v2")
    succeeded = s.add(MigrationSucceeded(s.meta("worker"), "m1", 7))
    assert s.entries[-1].rejection is not None
    assert s.state.migrations["prod", "m1"].revision == str(succeeded)
    text = explanation(s.facts())
    migration = text[text.index("Latest migration") :]
    assert migration.startswith("Latest migration m1 (of 1): Succeeded")
    assert f"last moved by MigrationSucceeded at {succeeded} " in migration
    assert f"applied in part: MigrationSucceeded at {succeeded}: stale success" in migration
    [line] = [row for row in format_history(s.facts().history).splitlines() if "Succeeded" in row]
    assert line.startswith(f"{succeeded} ")
    assert "-- applied in part: stale success of migration 'm1'" in line


def test_a_reset_is_the_origin_of_unknown() -> None:
    s = Scenario()
    s.heartbeat("a")
    first = s.report("a", "v1")
    assert hash_origins(s.facts())["Unknown"].position == first
    reset = s.add(StorageStateReset(s.meta("operator"), "apps", "deployments", "restore"))
    facts = s.facts()
    assert hash_origins(facts) == {"Unknown": facts.history[-1]}
    assert facts.history[-1].position == reset
    assert "reset by operator (restore)" in explanation(facts)


def test_history_table_shows_every_event_and_why_one_was_rejected(
    rolling_upgrade: tuple[Scenario, dict[str, Position]],
) -> None:
    scenario, at = rolling_upgrade
    history = scenario.facts().history
    table = format_history(history).splitlines()
    assert len(table) == len(history) + 1
    stranger = next(line for line in table if line.startswith(f"{at['stranger']} "))
    assert "rejected: " in stranger and "holds no lease" in stranger


def test_lease_ends_count_only_while_the_apiserver_held_an_entry() -> None:
    s = Scenario()
    s.heartbeat("a")
    s.heartbeat("b")
    s.report("a", "v1")
    s.add(StorageVersionWithdrawn(s.meta("a"), "a", "apps", "deployments"))
    after_withdrawal = s.add(ApiserverLeaseExpired(s.meta("lease-gc"), "a", START, 3600))
    never_reported = s.add(ApiserverLeaseExpired(s.meta("lease-gc"), "b", START, 3600))
    s.heartbeat("a")
    s.report("a", "v1")
    holding = s.add(
        ApiserverLeaseExpired(s.meta("lease-gc"), "a", START + timedelta(hours=1), 3600)
    )
    kept = {e.position for e in s.facts().history if "Lease" in e.event_type}
    assert kept == {holding}
    assert after_withdrawal not in kept and never_reported not in kept


_NAMES = st.sampled_from(["", "apps", "a.b", "pods", "b"])
_KEYS = st.tuples(st.sampled_from(["east", "west"]), _NAMES, st.sampled_from(["pods", "b", "jobs"]))


@given(known=st.sets(_KEYS, min_size=1, max_size=8), data=st.data())
def test_a_name_resolves_to_the_one_resource_it_fits_or_lists_all_it_fits(
    known: set[ResourceKey], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(known)))
    name = data.draw(
        st.sampled_from([resource_name(key[1], key[2]), storage_state_name(key[1], key[2])])
    )
    cluster = data.draw(st.sampled_from([key[0], None]))
    fits = {
        (c, g, r)
        for c, g, r in known
        if cluster in (None, c) and name in (resource_name(g, r), storage_state_name(g, r))
    }
    if len(fits) == 1:
        assert resolve(name, cluster, known) == key
    else:
        with pytest.raises(ResourceNameError) as error:
            resolve(name, cluster, known)
        for c, g, r in fits:
            assert f"{resource_name(g, r)} in cluster {c!r}" in str(error.value)


def test_an_unknown_name_says_how_to_name_a_resource() -> None:
    expected = r"'widgets' in cluster 'prod'.*<group>\.<resource>"
    with pytest.raises(ResourceNameError, match=expected):
        resolve("widgets", "prod", {KEY})


def test_the_agreement_is_set_by_the_event_that_moved_it_among_events_of_its_time() -> None:
    s = Scenario()
    s.heartbeat("a")
    s.heartbeat("b")
    s.report("a", "v2")
    s.report("b", "v1")  # they disagree
    moment = s.meta("b").occurred_at
    released = s.add(
        ApiserverLeaseReleased(dataclasses.replace(s.meta("b"), occurred_at=moment), "b", "b_1")
    )
    again = s.add(
        StorageVersionReported(
            dataclasses.replace(s.meta("a"), occurred_at=moment), "a", "apps", "deployments",
            "Deployment", "apps/v2", ("apps/v1", "apps/v2"), ("apps/v1", "apps/v2"),
        )
    )  # fmt: skip
    assert s.entries[again.offset].applied  # the same report again: it changes nothing

    agreement = next(
        line for line in explanation(s.facts()).splitlines() if line.startswith("They agree")
    )
    assert f"set by ApiserverLeaseReleased at {released} " in agreement


def test_a_history_that_begins_at_a_fold_snapshot_starts_from_its_entries() -> None:
    """A replay started from fold snapshots holds no report from before them: the lease
    ends that remove the entries they held are still the resource's history."""
    s = Scenario()
    for apiserver in ("a", "b"):
        s.heartbeat(apiserver)
        s.report(apiserver, "v1")
    start = s.state.storage_versions[KEY]
    begins = len(s.entries)
    s.report("a", "v2")
    expired = s.add(
        ApiserverLeaseExpired(s.meta("lease-gc"), "b", START + timedelta(minutes=2), 3600)
    )
    after = s.entries[begins:]
    history, membership = with_membership(
        [e for e in after if e.event_type not in LEASE_EVENTS],
        [e for e in after if e.event_type in LEASE_EVENTS],
        [entry.key for entry in start.entries],
        {"a", "b"},
    )
    facts = Facts(
        KEY,
        s.state.storage_versions[KEY],
        s.state.storage_states[KEY],
        (),
        tuple(history),
        start,
        tuple(membership),
        frozenset({"a", "b"}),
    )
    assert expired in {e.position for e in history}
    text = explanation(facts)
    assert (
        f"- b stopped renewing its lease; lease-gc expired it: ApiserverLeaseExpired at {expired} "
        in text
    )
    assert f"set by ApiserverLeaseExpired at {expired} " in text  # a's v2 is common now


def test_no_current_hash_is_put_down_to_no_apiserver_reporting_once_none_does() -> None:
    s = Scenario()
    s.heartbeat("a")
    s.report("a", "v1")
    s.add(StorageVersionWithdrawn(s.meta("a"), "a", "apps", "deployments"))
    text = explanation(s.facts())
    assert "no current storage version hash: no apiserver reports the resource" in text
    assert "while the apiservers disagree" not in text


def test_an_unnamed_storage_version_is_a_disagreement_explain_puts_into_words() -> None:
    s = Scenario()
    for apiserver in ("a", "b"):
        s.heartbeat(apiserver)
    s.report("a", "v1")
    found = storage_version_hash("apps", "v9", "Deployment")  # no version anyone names
    unnamed = s.add(
        StorageVersionReported(
            s.meta("b"), "b", "apps", "deployments", "Deployment", "", ("apps/v1",),
            ("apps/v1",), found, "discovery",
        )
    )  # fmt: skip
    text = explanation(s.facts())
    assert "b (read from discovery) encodes in an unnamed version (its discovery hash" in text
    assert "They disagree (an unnamed version by b; apps/v1 by a)" in text
    assert f"{found}: b reported encoding version an unnamed version" in text
    (row,) = [
        line for line in format_history(s.facts().history).splitlines() if str(unnamed) in line
    ]
    assert f"stores it with storageVersionHash {found}, the hash of no version" in row
