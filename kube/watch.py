"""What one real cluster shows the collector (:mod:`kube.collector`): its apiservers'
identity Leases, its StorageVersions and CustomResourceDefinitions, and each apiserver's
own discovery, kept in a :class:`~kube.upstream.Snapshot` that the collector holds
against the ledger.

**Watching.** The identity Leases and the StorageVersions are each listed, then
watched from the list's ``resourceVersion`` with bookmarks, so a resumed watch starts
where the last one ended; the server ends a watch every few minutes and it is resumed
from the last version seen. ``410 Gone`` (the version is too old) means list again.
Errors back off (doubling to 30 s) and are retried; nothing is appended until both have
been listed once, so a collector never mistakes "not listed yet" for "deleted". A cluster that
does not serve StorageVersions (``404``: the API is off by default upstream) counts as
listed with none, with a warning that says how to enable them, and is asked again
every 30 s: its leases (and custom resources) are collected meanwhile.

**Each apiserver's discovery.** With the addresses of the apiservers themselves
(``--apiserver HOSTNAME=URL``, else the peer address an identity lease advertises in its
``kubernetes.io/peer-advertise-address`` annotation, which kube-apiserver writes: v1.36.3
and v1.37.2 do by default), the collector names custom resources by their definitions and
reads every apiserver's discovery every few seconds (``/api/v1``, ``/apis`` and each
group/version it lists): the ``storageVersionHash`` it shows for a resource, custom or
built-in, names the version that apiserver stores it in (:mod:`kube.upstream`), so a
stock cluster (no StorageVersion objects) gives every built-in resource too. The
aggregated discovery (``/apis`` as ``APIGroupDiscoveryList``, two requests instead of one
per group/version) would be cheaper but carries no ``storageVersionHash``, so the
per-group/version documents are read: 24 small requests per apiserver and poll on
v1.37.2 (64 resources with a hash), 55 to 70 ms in all, answered from its memory. What a
read shows holds only for the lease the apiserver held, as the lease watch showed it,
when the read began: a restarted apiserver (a new lease) is reported with none of it
until a read under its new lease confirms it, as a restart may bring another release
(:mod:`kube.upstream`). Reads begin once the leases have been listed. A read that fails
(no answer, refused, an error status) withdraws the apiserver's discovered entries, with
the reason, so agreement is unknown until a read succeeds; one without any address is
warned about once. A cluster reached only through a load balancer, without peer
addresses or ``--apiserver``, gives leases and (with the alpha API) StorageVersion
entries, but no discovered entry: each apiserver's own discovery cannot be asked there,
as the balancer picks which one answers.

**CustomResourceDefinitions.** They are watched too, addresses or not, and each is
recorded (``CustomResourceDefinitionObserved``) when the ledger does not hold it as it
is: its versions, served and storage version, ``status.storedVersions``, generation and
``StorageMigrating`` condition; not at every status write, which only bumps its
``resourceVersion``; and once, ``deleted``, when it is gone. A definition the ledger holds
counts as gone only once the definitions have been listed, so a restarted collector ends
none it has not listed yet. A ``404`` on their list (a stand-in serving none) is asked
again every 30 s, and decides nothing meanwhile.

**Kinds.** A report needs the kind of the objects (the storage version hash is computed
from group, version and kind), which StorageVersion objects do not carry. It comes
from discovery, asked once and again whenever an entry names a resource it has not
seen: the cluster's, then, given ``--apiserver``, each apiserver's own. In a rolling
upgrade only the newer apiservers serve the resources their release adds; without
their addresses those entries wait (logged) until the server behind the kubeconfig
serves them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Final

from kube.client import ApiError, CertificateError, ClusterUnreachable, Kube
from kube.upstream import (
    Entry,
    Incarnation,
    Lease,
    NotUpstream,
    Served,
    Snapshot,
    built_in_entries,
    parse_custom_resource,
    parse_discovery,
    parse_lease,
    parse_storage_version,
)
from ledger.clock import Clock
from ledger.events import SOURCE_DISCOVERY
from ledger.identity import IDENTITY_SELECTOR, LEASE_NAMESPACE, SHUTDOWN_WINDOW_SECONDS
from ledger.names import split_group_version

log = logging.getLogger(__name__)

LEASES: Final = ("coordination.k8s.io", "v1", "leases", LEASE_NAMESPACE)
STORAGE_VERSIONS: Final = ("internal.apiserver.k8s.io", "v1alpha1", "storageversions", None)
CUSTOM_RESOURCES: Final = ("apiextensions.k8s.io", "v1", "customresourcedefinitions", None)
DISCOVERY_POLL_SECONDS: Final = 5.0  # each apiserver's discovery is asked this often
DISCOVERY_READ_SECONDS: Final = 30.0  # and read for this long at most
MAX_BACKOFF_SECONDS: Final = 30.0
GONE: Final = 410
NOT_FOUND: Final = 404
DISCOVERY_SECONDS: Final = 10.0  # discovery is read again at most this often
PEER_DISCOVERY_SECONDS: Final = 5.0  # an apiserver's own discovery is waited for this long


class Discovery:
    """Kinds of resources by (group, resource), from the API servers' discovery.

    ``kube``'s discovery, and that of each of ``apiservers`` (clients that reach one
    apiserver each) at the first read and whenever a kind ``kube``'s does not name was
    missed; what they named is kept. In a rolling upgrade the newer apiservers publish
    entries for resources an older one does not serve, so the server behind ``kube``
    (an older one, or whichever a load balancer picks) may not know their kinds. The
    apiservers are asked at once, each for :data:`PEER_DISCOVERY_SECONDS` at most, as
    the collector's reports wait meanwhile; one that does not answer (restarting, hung)
    or cannot be trusted is passed over until the next read.
    """

    def __init__(self, kube: Kube, clock: Clock, apiservers: Iterable[Kube] = ()) -> None:
        self._kube = kube
        self._apiservers = tuple(apiservers)
        self._clock = clock
        self._kinds: dict[tuple[str, str], str] = {}
        self._peer_kinds: dict[tuple[str, str], str] = {}  # what the apiservers named
        self._missed: set[tuple[str, str, str]] = set()  # (group, resource, stored group)
        self._read_at: datetime | None = None

    def kind_of(self, group: str, resource: str, version: str) -> str | None:
        """The kind of ``resource`` stored as ``version`` (its own group's if not served)."""
        stored_group, _ = split_group_version(version)
        kind = _kind(self._kinds, group, resource, stored_group)
        if kind is None:
            self._missed.add((group, resource, stored_group))
        return kind

    async def refresh(self) -> None:
        """Read discovery again if a kind was missed since the last read (rate-limited)."""
        now = self._clock.now()
        if self._read_at is not None and (
            not self._missed or (now - self._read_at).total_seconds() < DISCOVERY_SECONDS
        ):
            return
        first = self._read_at is None
        self._read_at = now
        missed, self._missed = self._missed, set()
        kinds: dict[tuple[str, str], str] = {}
        await _read_kinds(self._kube, kinds)
        if self._apiservers and (first or any(_kind(kinds, *key) is None for key in missed)):
            for found in await asyncio.gather(*map(_peer_kinds, self._apiservers)):
                for key, kind in found.items():
                    self._peer_kinds.setdefault(key, kind)
        for key, kind in self._peer_kinds.items():
            kinds.setdefault(key, kind)
        self._kinds = kinds


def _kind(
    kinds: Mapping[tuple[str, str], str], group: str, resource: str, stored_group: str
) -> str | None:
    return kinds.get((stored_group, resource)) or kinds.get((group, resource))


async def _peer_kinds(apiserver: Kube) -> dict[tuple[str, str], str]:
    """The kinds one apiserver's discovery names, as far as it answers in time."""
    kinds: dict[tuple[str, str], str] = {}
    try:
        await asyncio.wait_for(_read_kinds(apiserver, kinds, quiet=True), PEER_DISCOVERY_SECONDS)
    except (ApiError, ClusterUnreachable, CertificateError, TimeoutError) as error:
        reason = str(error) or f"no answer within {PEER_DISCOVERY_SECONDS:.0f} s"
        log.info("discovery at %s: %s", apiserver.host, reason)
    return kinds


async def _read_kinds(
    kube: Kube, kinds: dict[tuple[str, str], str], *, quiet: bool = False
) -> None:
    """Add the kinds ``kube``'s discovery names to ``kinds``, keeping those it holds."""
    for served in await _read_discovery(kube, quiet=quiet):
        kinds.setdefault((served.group, served.resource), served.kind)


async def _read_discovery(kube: Kube, *, quiet: bool = True) -> list[Served]:
    """Every resource ``kube``'s discovery lists, group/version by group/version in the
    order ``/apis`` lists them (each group's preferred version first); a group/version that
    fails (an aggregated API that is down) is skipped, with a warning unless ``quiet``."""
    paths = ["/api/v1"]
    groups = await kube.get("/apis")
    paths += [f"/apis/{v['groupVersion']}" for g in groups.get("groups", ()) for v in g["versions"]]
    served: list[Served] = []
    for path in paths:
        try:
            served += parse_discovery(await kube.get(path))
        except (ApiError, NotUpstream) as error:
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "discovery of %s at %s failed: %s",
                path,
                kube.host,
                error,
            )
    return served


class ClusterWatch:
    """The cluster's identity Leases, StorageVersions and CustomResourceDefinitions, and
    each apiserver's discovery, kept in a :class:`Snapshot`."""

    def __init__(
        self,
        kube: Kube,
        apiservers: Mapping[str, Kube],
        shutdown_window: float = SHUTDOWN_WINDOW_SECONDS,
    ) -> None:
        self.snapshot = Snapshot()
        self.changed = asyncio.Event()
        self._kube = kube
        self._apiservers = apiservers  # apiserver ID -> a client addressing it directly
        self._peers: dict[str, Kube] = {}  # peer address -> a client addressing it
        self._shutdown_window = shutdown_window
        # Departing apiservers (Snapshot.departing): when the deletion of the lease was
        # seen (the loop's time), and the lease it deleted.
        self._departed: dict[str, tuple[float, Lease]] = {}
        self._served: dict[str, list[Served]] = {}  # apiserver ID -> its last discovery
        # apiserver ID -> its lease when its last discovery read began (None: it had none)
        self._read_under: dict[str, Incarnation | None] = {}
        self._leases_listed = asyncio.Event()
        self._listed: set[str] = set()
        self._unserved: set[str] = set()  # told: the cluster does not serve it
        self._told: set[str] = set()  # discovery problems logged once each

    @property
    def synced(self) -> bool:
        return self._listed >= {LEASES[2], STORAGE_VERSIONS[2]}

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await asyncio.gather(
                self._follow(LEASES, self._leases, stop, label_selector=IDENTITY_SELECTOR),
                self._follow(STORAGE_VERSIONS, self._storage_versions, stop),
                self._follow(CUSTOM_RESOURCES, self._custom_resources, stop),
                self._poll_discovery(stop),
            )
        finally:
            # The clients made from the leases' peer addresses are the watch's own.
            for peer in self._peers.values():
                await peer.close()

    def _addressed(self) -> dict[str, Kube]:
        """A client for each live apiserver the collector can address: as ``--apiserver``
        names it, else at the peer address its identity lease advertises (the
        ``kubernetes.io/peer-advertise-address`` annotation, which v1.36.3 and v1.37.2 write by
        default), with the kubeconfig's credentials. One with
        neither is logged once: agreement on every resource is unknown while it lives."""
        addressed = {}
        for apiserver_id, lease in sorted(self.snapshot.leases.items()):
            client = self._client(apiserver_id, lease)
            if client is not None:
                addressed[apiserver_id] = client
            elif apiserver_id not in self._told:
                self._told.add(apiserver_id)
                log.warning(
                    "no address for apiserver %s (host %s): its lease advertises no peer"
                    " address and --apiserver does not name its host, so what it stores is"
                    " unknown and no resource can reach agreement while its lease lives;"
                    " give --apiserver %s=https://HOST:PORT",
                    apiserver_id,
                    lease.hostname or "?",
                    lease.hostname or "HOSTNAME",
                )
        return addressed

    def _client(self, apiserver_id: str, lease: Lease) -> Kube | None:
        """A client addressing ``apiserver_id`` itself, if its address is known."""
        if apiserver_id in self._apiservers:
            return self._apiservers[apiserver_id]
        address = lease.peer_advertise_address
        if not address:
            return None
        if address not in self._peers:
            self._peers[address] = self._kube.at(f"https://{address}")
        return self._peers[address]

    async def _check_departures(self) -> None:
        """End the departure of each departing apiserver that has stopped: its discovery,
        asked after its lease was deleted, does not answer; or, without an address, the
        shutdown window has passed since. One that answers still serves (and may write)."""
        loop = asyncio.get_running_loop()
        for apiserver_id, (seen, lease) in list(self._departed.items()):
            client = self._client(apiserver_id, lease)
            began = loop.time()
            if client is None:
                stopped = began - seen >= self._shutdown_window
                how = f"no address to ask it; {self._shutdown_window:.0f} s have passed"
            else:
                try:
                    await asyncio.wait_for(client.get("/api"), PEER_DISCOVERY_SECONDS)
                except (TimeoutError, ApiError, ClusterUnreachable, CertificateError) as error:
                    stopped, how = True, f"its discovery no longer answers ({error or 'timeout'})"
                else:
                    stopped, how = False, ""
            if stopped and self._departed.get(apiserver_id, (None,))[0] == seen:
                log.info("apiserver %s has stopped: %s", apiserver_id, how)
                del self._departed[apiserver_id]
                self.snapshot.departing.discard(apiserver_id)
                self.changed.set()

    def _depart(self, apiserver_id: str, lease: Lease) -> None:
        """``apiserver_id``'s lease object is gone: hold it departing until it stops."""
        self._departed[apiserver_id] = (asyncio.get_running_loop().time(), lease)
        self.snapshot.departing.add(apiserver_id)
        log.info(
            "the lease of apiserver %s was deleted; it is a member until it stops serving"
            " (kube-apiserver serves on for its --shutdown-delay-duration)",
            apiserver_id,
        )

    def _custom_resources(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.snapshot.custom_resources.pop(name, None)
            return
        try:
            self.snapshot.custom_resources[name] = parse_custom_resource(obj)
        except NotUpstream as error:
            log.warning("ignoring CustomResourceDefinition: %s", error)

    async def _poll_discovery(self, stop: asyncio.Event) -> None:
        """Each apiserver's own discovery hash of every resource, as entries, each of the
        lease the apiserver held when the read began (``Entry.observed_under``)."""
        await self._leases_listed.wait()  # a read before any lease is known confirms nothing
        while not stop.is_set():
            leases = self.snapshot.leases
            addressed = self._addressed()
            under = {a: leases[a].incarnation if a in leases else None for a in addressed}
            # At once, so that one apiserver that does not answer holds up none of the
            # others.
            read = await asyncio.gather(
                *(
                    asyncio.wait_for(_read_discovery(kube), DISCOVERY_READ_SECONDS)
                    for kube in addressed.values()
                ),
                return_exceptions=True,
            )
            for apiserver_id, found in zip(addressed, read, strict=True):
                if isinstance(found, BaseException) and not isinstance(
                    found, TimeoutError | ApiError | ClusterUnreachable | CertificateError
                ):
                    raise found
                if isinstance(found, BaseException):
                    # Nobody knows what it writes now: its discovered entries leave the
                    # ledger (kube.upstream.reconcile) until a read succeeds again.
                    why = (
                        f"no answer within {DISCOVERY_READ_SECONDS:.0f} s"
                        if isinstance(found, TimeoutError)
                        else str(found)
                    )
                    if self.snapshot.discovery.get(apiserver_id) != why:
                        log.warning("discovery at %s: %s", apiserver_id, why)
                    self.snapshot.discovery[apiserver_id] = why
                    self._served.pop(apiserver_id, None)
                else:
                    if self.snapshot.discovery.get(apiserver_id):
                        log.info("discovery at %s answers again", apiserver_id)
                    self.snapshot.discovery[apiserver_id] = ""
                    self._served[apiserver_id] = found
                    self._read_under[apiserver_id] = under[apiserver_id]
            for apiserver_id in addressed:
                self._replace_discovered(apiserver_id)
            await self._check_departures()
            await sleep_or_stop(stop, DISCOVERY_POLL_SECONDS)

    def _replace_discovered(self, apiserver_id: str) -> None:
        """Put ``apiserver_id``'s discovered entries in the snapshot in place of its earlier
        ones (none, if its last read failed)."""
        found = {}
        if apiserver_id in self._served:
            found = {entry.key: entry for entry in self._discovered(apiserver_id)}
        entries = self.snapshot.entries
        gone = [
            key
            for key, entry in entries.items()
            if key[0] == apiserver_id and entry.source == SOURCE_DISCOVERY and key not in found
        ]
        for key in gone:
            del entries[key]
        changed = bool(gone)
        for key, entry in found.items():
            if entries.get(key) != entry:
                entries[key] = entry
                changed = True
        if changed:
            self.changed.set()

    def _discovered(self, apiserver_id: str) -> list[Entry]:
        """The entries ``apiserver_id``'s last discovery shows: of custom resources by their
        definitions, of built-in ones by their hashes (beside the StorageVersion objects'
        where the cluster serves them: the cross-check); none if it held no lease when the
        read began."""
        own = self._served[apiserver_id]
        read_under = self._read_under[apiserver_id]
        if read_under is None:
            return []
        customs = {(c.group, c.resource): c for c in self.snapshot.custom_resources.values()}
        entries = []
        for served in own:
            custom = customs.get((served.group, served.resource))
            if custom is not None and served.storage_version_hash is not None:
                entry = custom.entry(apiserver_id, served.storage_version_hash, read_under)
                if entry is not None and entry not in entries:
                    entries.append(entry)
        everywhere = [served for found in self._served.values() for served in found]
        built_in, problems = built_in_entries(apiserver_id, read_under, own, everywhere, customs)
        for problem in problems:
            if problem not in self._told:
                self._told.add(problem)
                log.warning("cannot report: %s", problem)
        return entries + built_in

    def _leases(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            lease = self.snapshot.leases.pop(name, None)
            if lease is not None:
                self._depart(name, lease)
            return
        try:
            self.snapshot.leases[name] = parse_lease(obj)
        except NotUpstream as error:
            self.snapshot.leases.pop(name, None)
            log.info("ignoring lease: %s", error)
            return
        self._departed.pop(name, None)  # a lease again: a restart, whose holder ends the old
        self.snapshot.departing.discard(name)

    def _storage_versions(self, kind: str, obj: dict[str, Any]) -> None:
        # Entries are merged, never dropped: see kube.upstream.Snapshot.
        try:
            self.snapshot.entries.update(parse_storage_version(obj))
        except NotUpstream as error:
            log.warning("ignoring StorageVersion: %s", error)

    async def _follow(
        self,
        what: tuple[str, str, str, str | None],
        apply: Callable[[str, dict[str, Any]], None],
        stop: asyncio.Event,
        **query: Any,
    ) -> None:
        group, version, plural, namespace = what
        backoff = 0.5
        resource_version: str | None = None
        while not stop.is_set():
            try:
                if resource_version is None:
                    resource_version = await self._relist(what, apply, **query)
                    backoff = 0.5
                began = asyncio.get_running_loop().time()
                async for kind, obj in self._kube.watch(
                    group, version, plural, namespace, resource_version, **query
                ):
                    resource_version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        apply(kind, obj)
                        self.changed.set()
                    backoff = 0.5  # the watch works
                    if stop.is_set():
                        return
                if asyncio.get_running_loop().time() - began > 1.0:
                    continue  # the server ended the watch (it does every few minutes): resume
                log.warning("%s: the watch ended at once; retrying in %.1f s", plural, backoff)
            except ApiError as error:
                if error.status == GONE:
                    log.info("%s: watch expired (410 Gone); listing again", plural)
                    resource_version = None
                    continue
                if error.status == NOT_FOUND and what == CUSTOM_RESOURCES:
                    # Served by every kube-apiserver; a stand-in may lack them.
                    if plural not in self._unserved:
                        self._unserved.add(plural)
                        log.info("the cluster serves no %s (404); asked again", plural)
                    resource_version = None
                    backoff = MAX_BACKOFF_SECONDS
                elif error.status == NOT_FOUND and what == STORAGE_VERSIONS:
                    # Switched off (or not yet on): listed again once it answers, as a
                    # watch from a version of the API that went away cannot resume.
                    self._not_served(plural)
                    resource_version = None
                    backoff = MAX_BACKOFF_SECONDS
                else:
                    log.warning("%s: %s; retrying in %.1f s", plural, error, backoff)
            except Exception as error:  # a broken connection, an unreachable server
                log.warning("%s: %s; retrying in %.1f s", plural, error, backoff)
            await sleep_or_stop(stop, backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _not_served(self, plural: str) -> None:
        """The cluster does not serve StorageVersions (upstream's default): count them as
        listed, with none, so that leases (and custom resources) are collected meanwhile;
        they are asked for again every ``MAX_BACKOFF_SECONDS``, in case they are enabled.
        Entries are never dropped (:class:`~kube.upstream.Snapshot`), so an apiserver that
        answers 404 for a while, during the rolling restart that enables them, loses none."""
        if plural not in self._unserved:
            self._unserved.add(plural)
            log.warning(
                "the cluster does not serve %s/%s %s (404), so storage versions are collected"
                " only from each apiserver's own discovery, given --apiserver for every one of"
                " them (else only leases are); for upstream's own entries, run every"
                " kube-apiserver with --feature-gates=StorageVersionAPI=true and"
                " --runtime-config=%s/%s=true; asked again every %.0f s",
                *STORAGE_VERSIONS[:3],
                *STORAGE_VERSIONS[:2],
                MAX_BACKOFF_SECONDS,
            )
        if plural not in self._listed:
            self._listed.add(plural)
            self.changed.set()

    async def _relist(
        self,
        what: tuple[str, str, str, str | None],
        apply: Callable[[str, dict[str, Any]], None],
        **query: Any,
    ) -> str:
        """List everything (in pages), replacing what the snapshot held; the list's version."""
        group, version, plural, namespace = what
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self._kube.list(
                group, version, plural, namespace, limit=500, _continue=token or None, **query
            )
            items += page.get("items", ())
            token = page.get("metadata", {}).get("continue")
            if not token:
                break
        before = dict(self.snapshot.leases)
        if plural == LEASES[2]:
            self.snapshot.leases.clear()  # a lease missing from the list has ended
        elif plural == CUSTOM_RESOURCES[2]:
            self.snapshot.custom_resources.clear()  # so is a definition: it was deleted
        if plural in self._unserved:
            self._unserved.discard(plural)
            log.info("the cluster serves %s now: collecting storage versions", plural)
        for obj in items:
            apply("ADDED", obj)
        if plural == LEASES[2]:
            for name, lease in before.items():
                if name not in self.snapshot.leases:
                    self._depart(name, lease)  # deleted while the watch was down
            self._leases_listed.set()
        elif plural == CUSTOM_RESOURCES[2]:
            self.snapshot.custom_resources_listed = True
        self._listed.add(plural)
        self.changed.set()
        resource_version: str = page["metadata"]["resourceVersion"]
        return resource_version


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
