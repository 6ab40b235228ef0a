"""Random but coherent ledger histories, for property tests of everything that folds.

:func:`histories` draws a list of ``(event, position)`` as the log would hold it: one
or two clusters, each on its own partition with offsets counting up from 0; event
times that only move forward; a few apiservers per cluster that start (heartbeats
under a fresh holder identity), renew, report and withdraw storage versions of a few
resources (core and named groups), stop gracefully or are expired by the lease GC.
Around them, operators reset storage states, migrations are requested and move, and
CustomResourceDefinitions of the named groups' resources change their storage version
and ``storedVersions`` (pruned by the worker, refused, or by anyone), or are deleted.

The mix is chosen so every rule of the fold gets exercised, the rejections too:
heartbeats with a lease duration no Lease may have, reports from apiservers without a
lease or with an undecodable encoding version, releases from an earlier start of the
apiserver, expiries citing an old renewal (stale), migrations requested for the
current StorageVersion revision or an older one, for the agreed version or another,
and steps of migrations in a phase that does not allow them or of unknown migrations.

The generator keeps its own small model of each cluster only to pick plausible
arguments; it never consults the fold, so what the fold makes of a history is for
the tests to check. :func:`plain_renewals` is a reference for the projector's thinning
of lease renewals, found by folding a history one event at a time.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

from hypothesis import strategies as st

from ledger.events import (
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
    MigrationStatusEvent,
    MigrationSucceeded,
    Position,
    StorageAudited,
    StorageStateReset,
    StorageVersionReported,
    StorageVersionWithdrawn,
    StoredVersionsPruned,
    StoredVersionsPruneRefused,
)
from projections.fold import apply
from projections.state import SEEN_EVENT_WINDOW, State

CLUSTERS = ("east", "west")
HOSTS = ("cp-0", "cp-1", "cp-2")
RESOURCES = (
    ("", "pods", "Pod"),
    ("", "configmaps", "ConfigMap"),
    ("apps", "deployments", "Deployment"),
    ("batch", "cronjobs", "CronJob"),
)
VERSIONS = ("v1beta1", "v1", "v2")
START = datetime(2024, 1, 1, tzinfo=UTC)
LEASE_DURATION_SECONDS = 3600
_DURATIONS = st.sampled_from([LEASE_DURATION_SECONDS, 0])  # 0: no Lease may have it

_Entry: TypeAlias = tuple[str, tuple[str, ...], tuple[str, ...]]  # encoding, decodable, served

# Each action's weight is its number of repeats.
_ACTIONS = (
    ("heartbeat",) * 4
    + ("report",) * 6
    + ("withdraw", "release", "expire", "reset")
    + ("request",) * 2
    + ("step",) * 4
    + ("repeat",)
    + ("crd", "crd", "prune", "audit")
)


def storage_version_hash(group: str, version: str, kind: str) -> str:
    """Upstream's storageVersionHash, written out here independently of the product code."""
    digest = hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def apiserver_id(host: str) -> str:
    return f"apiserver-{host}"


@dataclasses.dataclass
class _Cluster:
    """What the generator believes about one cluster, to pick plausible arguments.

    A rough model of the fold's rules: it decides which apiserver runs, which entries
    each resource has and when a StorageVersion last changed, so that most events
    make sense and some (chosen on purpose) do not.
    """

    name: str
    partition: int
    next_offset: int = 0
    holders: dict[str, str] = dataclasses.field(default_factory=dict)  # running apiservers
    past_holders: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    renewals: dict[str, list[datetime]] = dataclasses.field(default_factory=dict)
    entries: dict[str, dict[str, _Entry]] = dataclasses.field(default_factory=dict)
    changed_at: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    phases: dict[str, str] = dataclasses.field(default_factory=dict)  # migration ID -> phase
    # Per CustomResourceDefinition's subject: its uid, storage version and storedVersions.
    crds: dict[str, tuple[str, str, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    logged: list[Event] = dataclasses.field(default_factory=list)  # all but heartbeats

    def position(self) -> Position:
        position = Position(self.partition, self.next_offset)
        self.next_offset += 1
        return position

    def set_entry(self, subject: str, apiserver: str, entry: _Entry | None) -> bool:
        entries = self.entries.setdefault(subject, {})
        if entries.get(apiserver) == entry:
            return False
        if entry is None:
            del entries[apiserver]
        else:
            entries[apiserver] = entry
        return True

    def common(self, subject: str) -> str | None:
        versions = {entry[0] for entry in self.entries.get(subject, {}).values()}
        return versions.pop() if len(versions) == 1 else None


# The migration step a worker would take next from each phase, and any step at all.
_NEXT_STEPS: dict[str, tuple[type[MigrationStatusEvent], ...]] = {
    "Pending": (MigrationStarted, MigrationCancelled),
    "Running": (MigrationProgressed, MigrationSucceeded, MigrationSucceeded, MigrationFailed),
    "Failed": (MigrationStarted, MigrationCancelled),
}
_STEPS: tuple[type[MigrationStatusEvent], ...] = (
    MigrationStarted,
    MigrationProgressed,
    MigrationSucceeded,
    MigrationFailed,
    MigrationCancelled,
)
_PHASE_AFTER = {
    MigrationStarted: "Running",
    MigrationProgressed: "Running",
    MigrationSucceeded: "Succeeded",
    MigrationFailed: "Failed",
    MigrationCancelled: "Cancelled",
}


@st.composite
def histories(draw: st.DrawFn, max_events: int = 60) -> list[tuple[Event, Position]]:
    """A history of up to ``max_events`` events, in log order."""
    clusters = [
        _Cluster(name, partition)
        for partition, name in enumerate(CLUSTERS[: draw(st.integers(1, len(CLUSTERS)))])
    ]
    now = START
    records: list[tuple[Event, Position]] = []
    for serial in range(draw(st.integers(0, max_events))):
        now += timedelta(seconds=draw(st.integers(1, 600)))
        cluster = draw(st.sampled_from(clusters))
        action = draw(st.sampled_from(_ACTIONS))
        if action == "repeat":
            # A record that repeats an event of the last hour of its cluster's event time
            # (a producer's retry): the fold sees its ID and leaves the views as they were.
            recent = [e for e in cluster.logged if e.meta.occurred_at >= now - SEEN_EVENT_WINDOW]
            if recent:
                records.append((draw(st.sampled_from(recent)), cluster.position()))
                continue
            action = "heartbeat"
        position = cluster.position()
        meta = Meta(str(uuid.UUID(int=serial + 1)), cluster.name, now, "")
        sensible = draw(st.integers(0, 9)) > 0  # one event in ten is chosen at random
        host = draw(st.sampled_from(HOSTS))
        running = sorted(cluster.holders)
        if action in ("report", "withdraw", "release") and sensible and running:
            apiserver = draw(st.sampled_from(running))
        else:
            apiserver = apiserver_id(host)
        group, resource, kind = draw(st.sampled_from(RESOURCES))
        subject = f"{group}/{resource}"

        event: Event
        if action == "heartbeat":
            holder = cluster.holders.get(apiserver)
            if holder is None:
                holder = f"{apiserver}_{uuid.UUID(int=serial + 1)}"
                cluster.holders[apiserver] = holder
                cluster.past_holders.setdefault(apiserver, []).append(holder)
            cluster.renewals.setdefault(apiserver, []).append(now)
            event = ApiserverHeartbeat(
                dataclasses.replace(meta, source=apiserver),
                apiserver,
                holder,
                host,
                # Now and then one the fold rejects, as upstream refuses such a Lease.
                LEASE_DURATION_SECONDS if sensible else draw(_DURATIONS),
                now,
                "1.31.0",
                # Mostly the same, now and then another: a heartbeat that says more.
                draw(st.sampled_from(["10.0.0.1:6443"] * 4 + [None, "10.0.0.2:6443"])),
            )
        elif action == "report":
            # Apiservers mostly re-report what they reported before (after a restart).
            previous = cluster.entries.get(subject, {}).get(apiserver)
            if sensible and previous is not None and draw(st.integers(0, 3)) > 0:
                entry = previous
            else:
                # Versions as upstream writes them: group-qualified, bare for core.
                versions = [f"{group}/{v}" if group else v for v in VERSIONS]
                encoding = draw(st.sampled_from(versions))
                decodable = set(draw(st.sets(st.sampled_from(versions))))
                if sensible:
                    decodable.add(encoding)
                else:
                    decodable.discard(encoding)
                served = draw(st.sets(st.sampled_from(versions), min_size=1))
                if sensible:
                    served &= decodable
                entry = (encoding, tuple(sorted(decodable)), tuple(sorted(served)))
            if (
                apiserver in cluster.holders
                and sensible
                and cluster.set_entry(subject, apiserver, entry)
            ):
                cluster.changed_at.setdefault(subject, []).append(str(position))
            event = StorageVersionReported(
                dataclasses.replace(meta, source=apiserver),
                apiserver,
                group,
                resource,
                kind,
                *entry,
            )
        elif action == "withdraw":
            reported = sorted(s for s, e in cluster.entries.items() if apiserver in e)
            if sensible and reported:
                subject = draw(st.sampled_from(reported))
                group, resource = subject.split("/")
            if cluster.set_entry(subject, apiserver, None):
                cluster.changed_at.setdefault(subject, []).append(str(position))
            event = StorageVersionWithdrawn(
                dataclasses.replace(meta, source=apiserver), apiserver, group, resource
            )
        elif action in ("release", "expire"):
            if action == "release":
                past = cluster.past_holders.get(apiserver) or [f"{apiserver}_{uuid.UUID(int=0)}"]
                holder = past[-1] if sensible else draw(st.sampled_from(past))
                ended = cluster.holders.get(apiserver) == holder
                event = ApiserverLeaseReleased(
                    dataclasses.replace(meta, source=apiserver), apiserver, holder
                )
            else:
                renewals = cluster.renewals.get(apiserver) or [START]
                last_renew = renewals[-1] if sensible else draw(st.sampled_from(renewals[-3:]))
                ended = apiserver in cluster.holders and last_renew == renewals[-1]
                event = ApiserverLeaseExpired(
                    dataclasses.replace(meta, source="lease-gc"),
                    apiserver,
                    last_renew,
                    LEASE_DURATION_SECONDS,
                )
            if ended:
                del cluster.holders[apiserver]
                for name in cluster.entries:
                    if cluster.set_entry(name, apiserver, None):
                        cluster.changed_at.setdefault(name, []).append(str(position))
        elif action == "reset":
            known_resources = sorted(cluster.entries)
            if sensible and known_resources:
                subject = draw(st.sampled_from(known_resources))
                group, resource = subject.split("/")
            event = StorageStateReset(
                dataclasses.replace(meta, source="operator"), group, resource, "operator reset"
            )
        elif action == "request":
            migration_id = f"migration-{serial}"
            cluster.phases[migration_id] = "Pending"
            changed_at = cluster.changed_at.get(subject, ["0:0"])
            target = cluster.common(subject)
            if target is None or not sensible:
                target = draw(st.sampled_from([f"{group}/{v}" if group else v for v in VERSIONS]))
            event = MigrationRequested(
                dataclasses.replace(meta, source="migrator"),
                migration_id,
                group,
                resource,
                target,
                storage_version_hash(*target.rpartition("/")[::2], kind),
                changed_at[-1] if sensible else draw(st.sampled_from(changed_at[-3:])),
            )
        elif action == "crd":
            uid, storage, stored = cluster.crds.get(subject, (f"uid-{serial}", "v1", ("v1",)))
            deleted = not sensible
            storage = draw(st.sampled_from((storage,) * 2 + VERSIONS))
            stored = tuple(dict.fromkeys((*stored, storage)))
            if draw(st.booleans()):  # storedVersions pruned, by anyone
                stored = (storage,)
            if deleted:
                cluster.crds.pop(subject, None)
            else:
                cluster.crds[subject] = (uid, storage, stored)
            migrating = draw(st.sampled_from([None, "True", "False"]))
            event = CustomResourceDefinitionObserved(
                dataclasses.replace(meta, source="collector"),
                group,
                resource,
                kind,
                f"{resource}.{group}",
                uid,
                serial,
                str(serial),
                VERSIONS,
                VERSIONS,
                storage,
                stored,
                migrating,
                None if migrating is None else "MigrationRunning",
                None if migrating is None else "running",
                None if migrating is None else serial,
                deleted,
            )
        elif action == "audit":
            polluted = draw(st.sampled_from([(), ("v1",)]))
            event = StorageAudited(
                dataclasses.replace(meta, source="svledger-audit"),
                f"audit-{serial}",
                group,
                resource,
                serial,
                cluster.next_offset,
                3,
                300,
                ("v1", "v2"),
                tuple(storage_version_hash(group, v, kind) for v in ("v1", "v2")),
                (1, 2),
                (),
                (),
                0,
                (),
                polluted,
                "objects in v1" if polluted else None,
            )
        elif action == "prune":
            uid, storage, stored = cluster.crds.get(subject, ("", "v1", ("v1", "v2")))
            migration_id = draw(st.sampled_from(sorted(cluster.phases) or ["migration-unknown"]))
            if draw(st.booleans()):
                event = StoredVersionsPruned(
                    dataclasses.replace(meta, source="worker"),
                    migration_id,
                    group,
                    resource,
                    f"{resource}.{group}",
                    serial,
                    str(serial),
                    stored,
                    (storage,),
                )
            else:
                event = StoredVersionsPruneRefused(
                    dataclasses.replace(meta, source="worker"),
                    migration_id,
                    group,
                    resource,
                    f"{resource}.{group}",
                    stored,
                    "GenerationChanged",
                    "the CustomResourceDefinition changed",
                )
        else:
            movable = sorted(m for m, phase in cluster.phases.items() if phase in _NEXT_STEPS)
            if sensible and movable:
                migration_id = draw(st.sampled_from(movable))
                step = draw(st.sampled_from(_NEXT_STEPS[cluster.phases[migration_id]]))
                cluster.phases[migration_id] = _PHASE_AFTER[step]
            else:
                known = sorted(cluster.phases)
                if known and draw(st.integers(0, 3)) > 0:
                    migration_id = draw(st.sampled_from(known))
                else:
                    migration_id = "migration-unknown"
                step = draw(st.sampled_from(_STEPS))
            event = step(
                dataclasses.replace(meta, source="worker"),
                migration_id,
                objects_migrated=serial * 10,
                continue_token=draw(st.sampled_from([None, f"token-{serial}"])),
                reason=draw(st.sampled_from([None, "EncodingVersionsDisagree"])),
            )
        if not isinstance(event, ApiserverHeartbeat):
            cluster.logged.append(event)
        records.append((event, position))
    return records


def plain_renewals(
    history: list[tuple[Event, Position]],
) -> tuple[set[Position], dict[tuple[str, str, str], tuple[int, int, int, int]]]:
    """The plain lease renewals of ``history`` as folding it one by one finds them: the
    heartbeats that say of their lease what it already holds, but the renew time. With
    them, per holder (cluster, apiserver, holder identity): the partition, the first and
    last offset, and how many. Written out here, without the product's term digests."""
    state = State()
    plain: set[Position] = set()
    counts: dict[tuple[str, str, str], tuple[int, int, int, int]] = {}
    for event, position in history:
        if isinstance(event, ApiserverHeartbeat):
            lease = state.leases.get((event.meta.cluster, event.apiserver_id))
            said = (
                event.holder_identity,
                event.hostname,
                event.lease_duration_seconds,
                event.binary_version,
                event.peer_advertise_address,
            )
            if lease is not None and said == (
                lease.holder_identity,
                lease.hostname,
                lease.lease_duration_seconds,
                lease.binary_version,
                lease.peer_advertise_address,
            ):
                plain.add(position)
                holder = (event.meta.cluster, event.apiserver_id, event.holder_identity)
                _, first, _, renewals = counts.get(holder, (0, position.offset, 0, 0))
                counts[holder] = (position.partition, first, position.offset, renewals + 1)
        apply(state, event, position)
    return plain, counts
