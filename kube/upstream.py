"""What real kube-apiservers publish, and what the ledger must append to hold the same.

Pure: no client, no clock. The collector's shell (:mod:`kube.collector`) keeps a
:class:`Snapshot` of one cluster's identity Leases and StorageVersion entries as its
watches see them, and asks :func:`reconcile` what to append so that the ledger's
fold (:class:`projections.state.State`, read back from the log) holds the same:

* an identity Lease whose ``renewTime`` (or holder) is newer than the ledger's lease
  of that apiserver -> ``ApiserverHeartbeat``, at the lease's own renew time: one
  event per renewal, however often a watch or a re-list shows the same lease. With a
  ``renewal_interval`` (``svledger collect --renewal-interval``), a renewal of the
  same holder is appended only once it is that much newer than the ledger's, or half
  the lease's duration: the log then holds a heartbeat per interval instead of one
  per renewal (upstream renews every 10 s), membership and expiry keep their meaning,
  and the ledger's renew time lags the cluster's by less than the interval. A lease
  the ledger does not hold and that expired by its own ``renewTime +
  leaseDurationSeconds`` is not a member: its apiserver stopped without deleting it,
  the ledger's lease GC expired it (or never saw it), and the object only waits for
  upstream's lease GC, which checks hourly. Its entries are not reported either;
  appending its old renewal would bring it back, to be expired again at the next check;
* a lease the ledger holds but the cluster no longer has -> ``ApiserverLeaseExpired``
  when it had expired by its own ``renewTime + leaseDurationSeconds``, else
  ``ApiserverLeaseReleased`` (from 1.35 kube-apiserver deletes its own lease when it
  stops gracefully, and again when it starts; before, its lease stays, holder and all,
  is renewed again by the restarted server, and expires only if it is not restarted),
  but only once the apiserver is no longer ``departing`` (:attr:`Snapshot.departing`):
  a kube-apiserver deletes its lease as soon as it is told to stop and serves on, writes
  included, for its ``--shutdown-delay-duration``, so a deleted lease is no proof that it
  stopped writing. The shell holds it departing until its discovery, asked after the
  deletion, no longer answers (or, without an address, for ``--shutdown-window``);
* a Lease object without ``renewTime`` or ``leaseDurationSeconds`` is expired, as
  upstream's lease GC (``isLeaseExpired``) holds it: not a member, and
  ``ApiserverLeaseExpired`` if the ledger holds its apiserver's lease. One without
  ``holderIdentity`` is a member like any other (neither upstream's lease GC nor its
  StorageVersion GC looks at the holder); the ledger records its holder as ``""``;
* a ``serverStorageVersions`` entry of a live apiserver that the ledger lacks or holds
  otherwise -> ``StorageVersionReported``, with versions as upstream writes them, in
  its order; always after that apiserver's heartbeat in the same batch, so membership
  comes first;
* a CustomResourceDefinition (:attr:`Snapshot.custom_resources`) the ledger lacks or holds
  otherwise -> ``CustomResourceDefinitionObserved``: its versions (bare, as it names
  them), served and storage versions, ``status.storedVersions``, generation and
  ``StorageMigrating`` condition, before the reports of its resource. A change of its
  ``resourceVersion`` alone is not one: every status write bumps it. One the ledger
  holds that the listed definitions lack -> the same, ``deleted``, once; until the
  definitions are listed, what the ledger holds stands.

Custom resources have no StorageVersion objects (Kubernetes writes none for them). As
the migration KEP's HA design proposes, the collector asks every apiserver directly for
its discovery document, whose ``storageVersionHash`` of a custom resource is the hash of
the version *that* apiserver stores it in; with the CustomResourceDefinition's versions
(:class:`CustomResource`) that hash names the encoding version, and the entry is built
as for a built-in resource: every version of the definition is decodable (the API server
converts between them), the served ones are served, and the discovered hash is carried in
the report (the fold checks it against the kind and version). So agreement on custom
resources is as visible, and guarded, as on built-in ones.

Built-in resources are read the same way (:func:`built_in_entries`), as that is all a
stock cluster publishes: ``StorageVersionAPI`` is alpha and off by default. Every
kube-apiserver lists, in the discovery document of each group/version it serves
(``/api/v1``, ``/apis/<group>/<version>``), a ``storageVersionHash`` per stored resource:
upstream's installer hashes the group/version/kind its storage encoder picks for the
resource's internal object, which is the encoding version, and for a resource stored
in another group (upstream's *cohabitating* resources: ``events.k8s.io`` ``events`` are
stored as core ``v1`` ``Event``) that other group's. The hash does not say which
group/version/kind it is of, so the collector hashes every group/version/kind that any
of the apiservers it asks serves (each resource's ``kind`` in each discovery document) and
takes the one whose hash matches; no table of cohabitating resources is needed, and a
resource one apiserver stores in a version only another one serves (a rolling upgrade)
is still named. Often the stored version is served by none (seen on v1.36.3 and v1.37.2:
CustomResourceDefinitions are stored as ``apiextensions.k8s.io/v1beta1``; a resource that
became GA is stored one more release in its beta, off by default, such as
``mutatingadmissionpolicies`` in ``admissionregistration.k8s.io/v1beta1`` on v1.36 and
``clustertrustbundles`` in ``certificates.k8s.io/v1beta1`` on v1.37), so every version
name upstream's naming allows (``v1`` to ``v3``, each alone or with ``alpha1`` to
``beta9``) is tried next, for the resource's kinds, in its group and in the groups serving
the same kind (:func:`_unserved_match`). A hash that matches none of them is
reported in an unnamed version (an empty ``encoding_version`` carrying the hash), with a
warning once per apiserver, resource and hash: the apiserver serves the resource, so it
writes it, and the fold holds an unnamed version in disagreement with every other (no
migration), and ``explain`` says why. The entry is:

* encoding version: the matched group/version;
* served versions: every version of the resource's group whose discovery document, at
  that apiserver, lists the resource, in the order ``/apis`` lists the group's versions
  (upstream's priority order, as its ``servedVersions``);
* decodable versions: the served ones, then the encoding version if it is not among them
  (a resource stored in another group's version, or in a version this apiserver does not
  serve, as above). Upstream's ``decodableVersions`` is wider: every version its scheme registers
  for the kind (served or not: a version switched off by ``--runtime-config``, or one the
  release still converts from but no longer serves, such as a removed beta), plus the
  versions of the resources it shares storage with (core ``events`` lists
  ``events.k8s.io/v1``). Discovery shows none of these, so they are missing. Nothing in
  the ledger decides on decodable versions beyond upstream's validation (the encoding and
  served versions are among them), and the StorageState is built from encoding versions
  only (every hash an apiserver reported encoding with stays in its persisted hashes
  until a migration under agreement), so the narrower list makes no decision less safe.

Where the cluster serves StorageVersion objects, both sources are reported, each
report saying which it is (``source``: ``storageversion`` for an object's entry,
``discovery`` for a hash): the fold keeps an entry per apiserver and source and sees two
that name different versions as a disagreement, so an apiserver whose StorageVersion
entry contradicts its own discovery (an entry left by an earlier process, one written
by hand) stops every migration of the resource, and ``explain``, ``serve`` (the
condition's message) and ``svledger_storage_version_source_conflicts`` name it. They do
not cover quite the same resources (v1.36.3 and v1.37.2 write no StorageVersion for
``events.k8s.io`` ``events``, which discovery gives), which the per-source entries make
harmless.

**Membership.** Agreement needs an entry of every apiserver holding a live lease
(:func:`projections.agreement.agreement`); an apiserver the collector has no address for
(neither ``--apiserver`` nor the lease's peer-address annotation) has none on a stock
cluster, and one whose discovery cannot be read loses its discovered entries
(``StorageVersionWithdrawn`` with the reason), so agreement on every resource is unknown
until it is read again or its lease ends. The ledger's discovered entries of an apiserver
this collector has not asked yet stand (a restarted collector does not withdraw what its
predecessor read); a resource that left an apiserver's discovery is withdrawn too.

An entry that vanished from an upstream object is **not** withdrawn, nor forgotten.
kube-apiservers never remove their own entries; only kube-controller-manager's
StorageVersion GC does, and it races with restarts: it can delete the entries an
apiserver has just re-registered, for as long as that apiserver runs. The ledger
removes an apiserver's entries itself when its lease ends, and a restarted apiserver
(a new lease) is reported with the StorageVersion entries last seen for it until it
writes new ones, so the ledger stays complete where upstream's objects do not. A
restarted kube-apiserver rewrites its own entries before it accepts a write of their
resource (upstream's write barrier), and the watch shows that rewrite even when the GC
removes it afterwards, so the entry carried over stands only until then.

An entry read from an apiserver's discovery has no such rewrite behind it: it is what
the process answering at that address said, and a restart may bring another binary
(a downgrade stores ``mutatingadmissionpolicies`` in ``v1beta1`` again). So it holds
only for the lease it was read under (:attr:`Entry.observed_under`: the lease object's
UID and holder as the collector's lease watch showed them when the read began), and is
reported only while that lease is the apiserver's: a new lease (the object deleted and
created again, or a new holder) is reported with no discovered entry until a read made
under it confirms one. A read that began before the collector saw the new lease is
passed over (the next one, seconds later, counts); one that began after it was answered
by the new process, since a restarted apiserver takes its lease only once it serves, at
the address the old one left. A new holder in an existing lease (kube-apiserver before
1.35 keeps its lease across a restart, and from 1.35 deletes and recreates it at start,
which a watch may show as one change) also ends the ledger's lease of the old holder
(``ApiserverLeaseReleased``, before the new holder's heartbeat): the fold keeps an
apiserver's entries across heartbeats, so without it the new process would inherit the
old one's entries in the ledger itself.

Because :func:`reconcile` compares with the ledger rather than with what the watch
showed before, a restarted collector (which reads the ledger back from the log)
appends exactly what the ledger lacks, and a re-list after ``410 Gone`` appends
nothing twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeAlias

from ledger.events import (
    SOURCE_DISCOVERY,
    SOURCE_STORAGE_VERSION,
    ApiserverHeartbeat,
    ApiserverLeaseExpired,
    ApiserverLeaseReleased,
    CustomResourceDefinitionObserved,
    Event,
    Meta,
    StorageVersionReported,
    StorageVersionWithdrawn,
)
from ledger.hashing import UNNAMED_VERSION, hash_of_stored, storage_version_hash
from ledger.identity import (
    HOSTNAME_LABEL,
    IDENTITY_LABEL,
    IDENTITY_NAME,
    LEASE_NAMESPACE,
    PEER_ADDRESS_ANNOTATION,
)
from ledger.names import CORE_GROUP_ALIAS, group_resource_string, split_group_version
from ledger.validation import InvalidReport, check_report
from projections.state import CustomResourceDefinition, ResourceKey, State, lease_expired

SOURCE: Final = "svledger-collector"
# The CustomResourceDefinition condition a storage version migration sets (upstream's
# in-tree migrator, and svledger's worker).
STORAGE_MIGRATING: Final = "StorageMigrating"

EntryKey: TypeAlias = tuple[str, str, str, str]  # apiserver ID, group, resource, source
Incarnation: TypeAlias = tuple[str, str]  # a lease object's UID and holder identity
# The kind of ``resource`` stored as a group-qualified version; None if discovery has none.
KindOf: TypeAlias = Callable[[str, str, str], str | None]  # (group, resource, version)


class NotUpstream(ValueError):
    """An object that is not what the collector watches for, or is malformed."""


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """An apiserver identity Lease (``coordination.k8s.io/v1``, ``kube-system``)."""

    apiserver_id: str  # the Lease's name
    holder_identity: str  # "" when the object has none
    hostname: str
    lease_duration_seconds: int | None  # None: none, or not positive (expired, as upstream)
    renew_time: datetime | None  # None: none (expired, as upstream)
    peer_advertise_address: str | None = None  # its annotation, if any
    uid: str = ""  # the object's metadata.uid: a lease deleted and created again has a new one

    @property
    def incarnation(self) -> Incarnation:
        """What tells this lease from any earlier or later one of the same apiserver."""
        return (self.uid, self.holder_identity)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One apiserver's ``serverStorageVersions`` entry in a resource's StorageVersion."""

    apiserver_id: str
    group: str
    resource: str
    encoding_version: str
    decodable_versions: tuple[str, ...]  # in the object's order (:func:`_listed`)
    served_versions: tuple[str, ...]  # likewise
    # As the apiserver's discovery shows it; None for an entry of a StorageVersion object.
    storage_version_hash: str | None = None
    kind: str | None = None  # the stored kind, when known without discovery's help
    # The apiserver's lease (:attr:`Lease.incarnation`) when the discovery that shows the
    # entry was read: reported for that lease only. None for an entry of a StorageVersion
    # object, which stands across leases (see the module's docstring).
    observed_under: Incarnation | None = None

    @property
    def source(self) -> str:
        """Where it was read (``StorageVersionReported.source``)."""
        return SOURCE_STORAGE_VERSION if self.observed_under is None else SOURCE_DISCOVERY

    @property
    def key(self) -> EntryKey:
        return (self.apiserver_id, self.group, self.resource, self.source)


@dataclasses.dataclass
class Snapshot:
    """The cluster as the collector's watches have shown it.

    ``entries`` holds the last entry seen for each (apiserver, resource, source), from any
    watch event or list, and forgets none: an entry that vanished from its object was
    removed by kube-controller-manager's StorageVersion GC, never by its apiserver,
    and the GC races with apiserver restarts. Entries of apiservers without a lease,
    and discovered entries observed under another lease than the apiserver's, are
    ignored by :func:`reconcile`, so the snapshot need not prune them.
    """

    leases: dict[str, Lease] = dataclasses.field(default_factory=dict)
    entries: dict[EntryKey, Entry] = dataclasses.field(default_factory=dict)
    # The apiservers whose discovery this collector has asked, each with why it could not
    # be read ("" when it was): the ledger's discovered entries of these that
    # ``entries`` lacks are withdrawn (:func:`reconcile`); of the others, left as they are.
    discovery: dict[str, str] = dataclasses.field(default_factory=dict)
    # Apiservers whose lease object is gone but which may still serve (and write): a
    # kube-apiserver deletes its lease when told to stop, then serves on for its
    # --shutdown-delay-duration. The ledger keeps their leases (and entries) meanwhile.
    departing: set[str] = dataclasses.field(default_factory=set)
    # The CustomResourceDefinitions by name, as their watch shows them, and whether they
    # have been listed: until they are, one the ledger holds and this lacks is not listed
    # yet rather than deleted (:func:`reconcile`).
    custom_resources: dict[str, CustomResource] = dataclasses.field(default_factory=dict)
    custom_resources_listed: bool = False


def parse_time(text: str) -> datetime:
    """An RFC 3339 time as Kubernetes writes it (``2026-11-23T03:10:00.123456Z``)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_lease(obj: Mapping[str, Any]) -> Lease:
    """The identity lease in a Lease object; :class:`NotUpstream` if it is none.

    Upstream's identity leases live in ``kube-system`` with the identity label; its
    lease GC and StorageVersion GC ignore any other (an object without a namespace,
    as a watch of ``kube-system`` may leave it, is taken to be there).
    """
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    spec = obj.get("spec") or {}
    name = metadata.get("name", "")
    namespace = metadata.get("namespace", LEASE_NAMESPACE)
    if labels.get(IDENTITY_LABEL) != IDENTITY_NAME:
        raise NotUpstream(f"lease {name!r} is not a kube-apiserver identity lease")
    if namespace != LEASE_NAMESPACE:
        raise NotUpstream(
            f"lease {name!r} is in namespace {namespace!r}; identity leases are in"
            f" {LEASE_NAMESPACE!r}"
        )
    renew = spec.get("renewTime")
    duration = spec.get("leaseDurationSeconds")
    holder = spec.get("holderIdentity") or ""
    peer = (metadata.get("annotations") or {}).get(PEER_ADDRESS_ANNOTATION) or None
    uid = metadata.get("uid") or ""
    if "\x00" in holder or "\x00" in (peer or ""):
        raise NotUpstream(f"lease {name!r} holds a NUL character, which no event may carry")
    return Lease(
        name,
        holder,
        labels.get(HOSTNAME_LABEL, ""),
        int(duration) if duration and int(duration) > 0 else None,
        parse_time(renew) if renew else None,
        peer,
        uid,
    )


def parse_storage_version(obj: Mapping[str, Any]) -> dict[EntryKey, Entry]:
    """The entries of a StorageVersion object, keyed by (apiserver ID, group, resource).

    The object is named ``<group>.<resource>``, ``core.<resource>`` for the core group;
    a resource name has no dots, so the name splits at its last one, as upstream's
    validation splits it.
    """
    name = (obj.get("metadata") or {}).get("name", "")
    group, dot, resource = name.rpartition(".")
    if not dot or not group or not resource:
        raise NotUpstream(f"StorageVersion {name!r} is not named <group>.<resource>")
    if group == CORE_GROUP_ALIAS:
        group = ""
    entries: dict[EntryKey, Entry] = {}
    for raw in (obj.get("status") or {}).get("storageVersions") or ():
        entry = Entry(
            apiserver_id=raw.get("apiServerID", ""),
            group=group,
            resource=resource,
            encoding_version=raw.get("encodingVersion", ""),
            decodable_versions=_listed(raw.get("decodableVersions")),
            served_versions=_listed(raw.get("servedVersions")),
        )
        entries[entry.key] = entry
    return entries


def _listed(versions: Iterable[str] | None) -> tuple[str, ...]:
    """Versions in the order the object lists them (upstream's: the directly decodable
    ones in the scheme's priority, then the equivalent resources'), each once."""
    return tuple(dict.fromkeys(versions or ()))


@dataclasses.dataclass(frozen=True, slots=True)
class CustomResource:
    """A CustomResourceDefinition: its resource's versions, by which a discovered hash is
    named (:meth:`entry`), and what the ledger records of it (the fields of
    ``CustomResourceDefinitionObserved``)."""

    group: str
    resource: str  # plural
    kind: str
    name: str  # the definition's, ``<plural>.<group>``
    uid: str
    generation: int
    resource_version: str
    versions: tuple[str, ...]  # every version, bare (``v1``), in spec.versions' order
    served_versions: tuple[str, ...]  # the served ones
    storage_version: str  # bare
    stored_versions: tuple[str, ...]  # status.storedVersions
    # Its StorageMigrating condition (the in-tree migrator's, and svledger's worker's).
    storage_migrating_status: str | None = None
    storage_migrating_reason: str | None = None
    storage_migrating_message: str | None = None
    storage_migrating_observed_generation: int | None = None

    def entry(
        self, apiserver_id: str, discovered_hash: str, observed_under: Incarnation
    ) -> Entry | None:
        """The entry of an apiserver whose discovery, read under its lease
        ``observed_under``, shows ``discovered_hash``, if it is the hash of one of the
        versions (the one that apiserver stores in)."""
        versions = tuple(f"{self.group}/{v}" for v in self.versions)
        for version in versions:
            if hash_of_stored(version, self.kind) == discovered_hash:
                return Entry(
                    apiserver_id,
                    self.group,
                    self.resource,
                    version,
                    versions,
                    tuple(f"{self.group}/{v}" for v in self.served_versions),
                    discovered_hash,
                    self.kind,
                    observed_under,
                )
        return None


def parse_custom_resource(obj: Mapping[str, Any]) -> CustomResource:
    """A CustomResourceDefinition (``apiextensions.k8s.io/v1``); :class:`NotUpstream` if it
    lacks group, names or versions, or does not mark exactly one version as its storage
    version (as upstream's validation requires)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    name = metadata.get("name", "")
    group = spec.get("group", "")
    names = spec.get("names") or {}
    versions = spec.get("versions") or ()
    if not (group and names.get("plural") and names.get("kind") and versions) or not all(
        v.get("name") for v in versions
    ):
        raise NotUpstream(f"CustomResourceDefinition {name!r} lacks group, names or versions")
    storage = [v["name"] for v in versions if v.get("storage")]
    if len(storage) != 1:
        raise NotUpstream(
            f"CustomResourceDefinition {name!r} marks {len(storage)} versions as its storage"
            f" version ({', '.join(storage) or 'none'}), where upstream allows exactly one"
        )
    migrating: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or () if c.get("type") == STORAGE_MIGRATING), {}
    )
    observed_generation = migrating.get("observedGeneration")
    return CustomResource(
        group,
        names["plural"],
        names["kind"],
        name,
        metadata.get("uid") or "",
        int(metadata.get("generation") or 0),
        metadata.get("resourceVersion") or "",
        tuple(v["name"] for v in versions),
        tuple(v["name"] for v in versions if v.get("served")),
        storage[0],
        tuple(status.get("storedVersions") or ()),
        _text(migrating.get("status")),
        _text(migrating.get("reason")),
        _text(migrating.get("message")),
        None if observed_generation is None else int(observed_generation),
    )


def _text(value: str | None) -> str | None:
    """A condition's free text as an event may carry it: a NUL character (which no event
    may carry, :mod:`ledger.codec`) shown escaped, as JSON writes it. Rejecting the whole
    definition instead would leave its resource's discovered hashes unnamed."""
    return None if value is None else value.replace("\x00", "\\u0000")


@dataclasses.dataclass(frozen=True, slots=True)
class Served:
    """A resource as one discovery document (of one group/version) of one apiserver lists it."""

    group: str
    resource: str  # plural
    version: str  # the document's group/version, group-qualified (core: ``v1``)
    kind: str
    storage_version_hash: str | None  # None: not stored (a virtual resource), or not shown


def parse_discovery(document: Mapping[str, Any]) -> list[Served]:
    """The resources of one discovery document (``APIResourceList`` of ``/api/v1`` or
    ``/apis/<group>/<version>``), subresources left out; :class:`NotUpstream` if it names
    no group/version."""
    group_version = document.get("groupVersion") or ""
    try:
        group, _ = split_group_version(group_version)
    except ValueError as error:
        raise NotUpstream(f"a discovery document names no group/version: {error}") from error
    served = []
    for resource in document.get("resources") or ():
        name, kind = resource.get("name") or "", resource.get("kind") or ""
        if name and kind and "/" not in name:
            found = resource.get("storageVersionHash") or None
            served.append(Served(group, name, group_version, kind, found))
    return served


def built_in_entries(
    apiserver_id: str,
    observed_under: Incarnation,
    own: Sequence[Served],
    everywhere: Sequence[Served],
    custom: Collection[tuple[str, str]] = (),
) -> tuple[list[Entry], list[str]]:
    """The entries that ``apiserver_id``'s own discovery (``own``), read under its lease
    ``observed_under``, shows, and what cannot be.

    ``everywhere`` is what every apiserver asked serves (``own`` included): the stored
    group/version/kind of a resource is the one among them whose hash its
    ``storageVersionHash`` is. Resources in ``custom`` (group, resource) are left to
    :class:`CustomResource`. Returns the entries, in the order of ``own``, and one line per
    resource whose hash names nothing served (or whose versions disagree), for the shell
    to log; see the module's docstring for how the versions are derived.
    """
    stored_as: dict[str, tuple[str, str]] = {}
    for served in everywhere:
        with contextlib.suppress(ValueError):  # a kind or version no hash can be made of
            stored_hash = hash_of_stored(served.version, served.kind)
            stored_as.setdefault(stored_hash, (served.version, served.kind))
    versions: dict[tuple[str, str], list[str]] = {}
    hashes: dict[tuple[str, str], list[str]] = {}
    kinds: dict[tuple[str, str], set[str]] = {}
    for served in own:
        key = (served.group, served.resource)
        if key in custom:
            continue
        kinds.setdefault(key, set()).add(served.kind)
        versions.setdefault(key, [])
        if served.version not in versions[key]:
            versions[key].append(served.version)
        if served.storage_version_hash is not None:
            hashes.setdefault(key, [])
            if served.storage_version_hash not in hashes[key]:
                hashes[key].append(served.storage_version_hash)
    entries: list[Entry] = []
    problems: list[str] = []
    for (group, resource), found in hashes.items():
        where = (
            f"{apiserver_id}'s discovery of {group_resource_string(group, resource)}"
            f" ({', '.join(versions[group, resource])})"
        )
        if len(found) > 1:
            problems.append(
                f"{where} shows storageVersionHash {', '.join(found)} in different versions,"
                " where one storage has one; not reported"
            )
            continue
        match = stored_as.get(found[0]) or _unserved_match(
            found[0], group, kinds[group, resource], everywhere
        )
        served_versions = tuple(versions[group, resource])
        if match is None:
            # Reported all the same, with the hash and no version: the apiserver serves
            # the resource, so it writes it, in a version that agrees with no other.
            problems.append(
                f"{where} shows storageVersionHash {found[0]}, the hash of none of the"
                " group/version/kinds the apiservers serve or upstream's version names;"
                " reported as stored in an unnamed version, which agrees with none"
            )
            match = (UNNAMED_VERSION, sorted(kinds[group, resource])[0])
        encoding, kind = match
        decodable = served_versions + (
            () if encoding in (*served_versions, UNNAMED_VERSION) else (encoding,)
        )
        entries.append(
            Entry(
                apiserver_id,
                group,
                resource,
                encoding,
                decodable,
                served_versions,
                found[0],
                kind,
                observed_under,
            )
        )
    return entries, problems


# Every built-in API version is named as upstream's version priority reads them:
# ``v<major>``, ``v<major>alpha<n>`` or ``v<major>beta<n>``.
_VERSION_NAMES: Final = tuple(
    f"v{major}{level}"
    for major in range(1, 4)
    for level in ("", *(f"{stage}{n}" for stage in ("beta", "alpha") for n in range(1, 10)))
)


def _unserved_match(
    found: str, group: str, kinds: Iterable[str], everywhere: Sequence[Served]
) -> tuple[str, str] | None:
    """The group/version/kind, served by no apiserver, whose hash is ``found``, if any.

    A kube-apiserver often stores a resource in a version nobody serves: a resource that
    became GA is stored, for one more release, in the beta version the release before
    served (upstream's compatibility-version rule), a beta off by default; and
    CustomResourceDefinitions are stored as ``apiextensions.k8s.io/v1beta1``, which no
    release serves since v1.22. Such a version is in the apiserver's scheme but in no
    discovery document, so every version name upstream's naming allows is tried, for the
    resource's kinds, in its own group and in every group serving the same kind (where a
    cohabitating resource is stored).
    """
    kinds = set(kinds)
    groups = dict.fromkeys([group, *(s.group for s in everywhere if s.kind in kinds)])
    for candidate_group in groups:
        for name in _VERSION_NAMES:
            version = f"{candidate_group}/{name}" if candidate_group else name
            for kind in sorted(kinds):
                if storage_version_hash(candidate_group, name, kind) == found:
                    return version, kind
    return None


def reconcile(
    state: State,
    cluster: str,
    snapshot: Snapshot,
    kind_of: KindOf,
    now: datetime,
    renewal_interval: timedelta = timedelta(0),
) -> tuple[list[Event], list[str]]:
    """What to append so the ledger holds what ``snapshot`` shows, and what cannot be.

    Returns the events, in the order to append them (heartbeats, each after the end of
    the lease of the holder it replaces, then lease ends, then CustomResourceDefinitions,
    then reports, then withdrawals), and one line per entry that cannot be reported yet
    (no kind known, or a report upstream's validation would refuse), for the shell to log.
    """
    events: list[Event] = []
    problems: list[str] = []
    live: set[str] = set()
    replaced: set[str] = set()  # apiservers whose ledger lease ends here for a new holder
    for apiserver_id, lease in sorted(snapshot.leases.items()):
        held = state.leases.get((cluster, apiserver_id))
        if held is None and lease_expired(lease.renew_time, lease.lease_duration_seconds, now):
            continue  # gone, though upstream's lease GC has not deleted the object yet
        if lease.renew_time is None or lease.lease_duration_seconds is None:
            continue  # expired whatever the time, as upstream's lease GC sees it: ended below
        live.add(apiserver_id)
        if held is not None and (held.holder_identity, held.peer_advertise_address) == (
            lease.holder_identity,
            lease.peer_advertise_address,
        ):
            step = min(renewal_interval, timedelta(seconds=held.lease_duration_seconds / 2))
            if lease.renew_time <= held.renew_time or lease.renew_time < held.renew_time + step:
                continue
        if held is not None and held.holder_identity != lease.holder_identity:
            # Another process holds the lease: the old one's lease, and its entries, end.
            replaced.add(apiserver_id)
            events.append(
                ApiserverLeaseReleased(
                    Meta.new(cluster, apiserver_id, now), apiserver_id, held.holder_identity
                )
            )
        events.append(
            ApiserverHeartbeat(
                Meta.new(cluster, apiserver_id, lease.renew_time),
                apiserver_id,
                lease.holder_identity,
                lease.hostname,
                lease.lease_duration_seconds,
                lease.renew_time,
                peer_advertise_address=lease.peer_advertise_address,
            )
        )
    for (lease_cluster, apiserver_id), held in sorted(state.leases.items()):
        if lease_cluster != cluster or apiserver_id in live:
            continue
        departing = apiserver_id in snapshot.departing and apiserver_id not in snapshot.leases
        if departing and not lease_expired(held.renew_time, held.lease_duration_seconds, now):
            continue  # its lease is deleted, but it may still write: not ended yet
        ended: Event
        # A lease the cluster still has but that is not live has no renew time or
        # duration: expired, by upstream's rule, whatever the ledger's renew time says.
        if apiserver_id in snapshot.leases or lease_expired(
            held.renew_time, held.lease_duration_seconds, now
        ):
            ended = ApiserverLeaseExpired(
                Meta.new(cluster, SOURCE, now),
                apiserver_id,
                held.renew_time,
                held.lease_duration_seconds,
            )
        else:
            ended = ApiserverLeaseReleased(
                Meta.new(cluster, apiserver_id, now), apiserver_id, held.holder_identity
            )
        events.append(ended)
    # Definitions before reports and withdrawals. A custom resource's entry is named by its
    # definition (the version its discovered hash is of), so the ledger holds the
    # definition (a new one, a new storage version) before the report it named. A deleted
    # definition's resource leaves each apiserver's discovery at the next read, seconds
    # after the watch showed the deletion, so its entries are withdrawn in a later batch
    # as a rule, and the ledger holds entries of a resource without a definition meanwhile
    # (as it always does of built-in ones); in one batch, the deletion, the cause, comes
    # first.
    events += _definitions(state, cluster, snapshot, now)
    # In the order the entries were first seen, which for one StorageVersion is the
    # order of its status.storageVersions: the ledger appends a new entry as upstream
    # does, so it lists them as upstream's object does.
    for entry in snapshot.entries.values():
        if entry.apiserver_id not in live:
            continue
        under = entry.observed_under
        if under is not None and under != snapshot.leases[entry.apiserver_id].incarnation:
            continue  # read under an earlier lease: not confirmed by the process holding it
        if entry.apiserver_id not in replaced and _holds(state, cluster, entry):
            continue
        report = _report(cluster, entry, kind_of, now)
        if isinstance(report, str):
            problems.append(report)
        else:
            events.append(report)
    events += _withdrawals(state, cluster, snapshot, live - replaced, now)
    return events, problems


def _definitions(
    state: State, cluster: str, snapshot: Snapshot, now: datetime
) -> list[CustomResourceDefinitionObserved]:
    """An event of each CustomResourceDefinition the snapshot shows otherwise than the
    ledger holds it (a new one, or one whose versions, storedVersions, generation or
    StorageMigrating condition changed; not one whose resourceVersion alone did, as
    every status write bumps it), by name, then of each the ledger holds that the
    snapshot, listed, lacks (``deleted``). One deleted and created again under the same
    name (a new UID) is both: the old one's end, then the new one."""
    events = []
    shown: set[ResourceKey] = set()
    for _, definition in sorted(snapshot.custom_resources.items()):
        key = (cluster, definition.group, definition.resource)
        shown.add(key)
        held = state.custom_resources.get(key)
        if held is not None and _said(held) == _said(definition):
            continue
        if held is not None and held.uid != definition.uid:
            events.append(_observed(cluster, held, now, deleted=True))
        events.append(_observed(cluster, definition, now))
    if not snapshot.custom_resources_listed:
        return events  # not listed yet, by this collector: what the ledger holds stands
    for key, held in sorted(state.custom_resources.items()):
        if key[0] == cluster and key not in shown:
            events.append(_observed(cluster, held, now, deleted=True))
    return events


def _said(definition: CustomResource | CustomResourceDefinition) -> tuple[object, ...]:
    """What an event says of ``definition``, but for its resourceVersion."""
    return (
        definition.group,
        definition.resource,
        definition.kind,
        definition.name,
        definition.uid,
        definition.generation,
        definition.versions,
        definition.served_versions,
        definition.storage_version,
        definition.stored_versions,
        definition.storage_migrating_status,
        definition.storage_migrating_reason,
        definition.storage_migrating_message,
        definition.storage_migrating_observed_generation,
    )


def _observed(
    cluster: str,
    definition: CustomResource | CustomResourceDefinition,
    now: datetime,
    *,
    deleted: bool = False,
) -> CustomResourceDefinitionObserved:
    return CustomResourceDefinitionObserved(
        Meta.new(cluster, SOURCE, now),
        definition.group,
        definition.resource,
        definition.kind,
        definition.name,
        definition.uid,
        definition.generation,
        definition.resource_version,
        definition.versions,
        definition.served_versions,
        definition.storage_version,
        definition.stored_versions,
        definition.storage_migrating_status,
        definition.storage_migrating_reason,
        definition.storage_migrating_message,
        definition.storage_migrating_observed_generation,
        deleted,
    )


def _withdrawals(
    state: State, cluster: str, snapshot: Snapshot, live: Collection[str], now: datetime
) -> list[StorageVersionWithdrawn]:
    """The discovered entries the ledger holds for a live apiserver whose discovery the
    collector asked but no longer shows them: it could not be read (then nobody knows
    what it writes, and the fold holds agreement unknown until it is read again), or the
    resource left it (a CustomResourceDefinition deleted). Entries of StorageVersion
    objects are never withdrawn (see the module's docstring)."""
    withdrawals = []
    for key in sorted(state.resources_by_cluster.get(cluster, ())):
        for held in state.storage_versions[key].entries:
            apiserver_id = held.apiserver_id
            if held.source != SOURCE_DISCOVERY or apiserver_id not in live:
                continue
            if apiserver_id not in snapshot.discovery:
                continue  # not asked yet by this collector: what the ledger holds stands
            if (apiserver_id, key[1], key[2], SOURCE_DISCOVERY) in snapshot.entries:
                continue
            unreadable = snapshot.discovery[apiserver_id]
            reason = (
                f"its discovery could not be read: {unreadable}"
                if unreadable
                else "its discovery no longer shows a storageVersionHash for the resource"
            )
            withdrawals.append(
                StorageVersionWithdrawn(
                    Meta.new(cluster, SOURCE, now),
                    apiserver_id,
                    key[1],
                    key[2],
                    SOURCE_DISCOVERY,
                    reason,
                )
            )
    return withdrawals


def _holds(state: State, cluster: str, entry: Entry) -> bool:
    storage_version = state.storage_versions.get((cluster, entry.group, entry.resource))
    if storage_version is None:
        return False
    for held in storage_version.entries:
        if held.key == (entry.apiserver_id, entry.source):
            return (
                held.encoding_version == entry.encoding_version
                and held.decodable_versions == entry.decodable_versions
                and held.served_versions == entry.served_versions
            )
    return False


def _report(
    cluster: str, entry: Entry, kind_of: KindOf, now: datetime
) -> StorageVersionReported | str:
    where = f"{entry.apiserver_id}'s entry for {group_resource_string(entry.group, entry.resource)}"
    unnamed = entry.encoding_version == UNNAMED_VERSION and entry.storage_version_hash
    try:
        if not unnamed:
            split_group_version(entry.encoding_version)
    except ValueError as error:
        return f"{where}: {error}"
    kind = entry.kind or kind_of(entry.group, entry.resource, entry.encoding_version)
    if kind is None:
        return f"{where}: discovery names no kind for it in {entry.encoding_version}; retried"
    try:
        check_report(
            entry.group,
            entry.resource,
            kind,
            entry.encoding_version,
            entry.decodable_versions,
            entry.served_versions,
            entry.apiserver_id,
            entry.storage_version_hash,
        )
    except InvalidReport as error:
        return f"{where}: {error}"
    return StorageVersionReported(
        Meta.new(cluster, entry.apiserver_id, now),
        entry.apiserver_id,
        entry.group,
        entry.resource,
        kind,
        entry.encoding_version,
        entry.decodable_versions,
        entry.served_versions,
        entry.storage_version_hash,
        entry.source,
    )
