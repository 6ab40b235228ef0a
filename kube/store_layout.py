"""Which resource an etcd key holds, as kube-apiserver lays its objects out.

kube-apiserver keeps each object under ``<prefix>/<resource prefix>/[<namespace>/]<name>``,
``<prefix>`` being its ``--etcd-prefix`` (``/registry`` by default). The resource prefix is:

* for a resource of kube-apiserver's own groups, the resource's name without its group
  (``/registry/deployments/default/web`` is an ``apps`` Deployment), except for upstream's
  special prefixes (``SpecialDefaultResourcePrefixes`` in ``pkg/kubeapiserver/
  default_storage_factory_builder.go``): ``replicationcontrollers`` under ``controllers``,
  ``endpoints`` under ``services/endpoints``, ``nodes`` under ``minions``, ``services``
  under ``services/specs``, ``ingresses`` (``networking.k8s.io`` and ``extensions``) under
  ``ingress``;
* ``<group>/<plural>`` for a custom resource, and for the resources of the two servers
  kube-apiserver runs inside itself besides its own: ``apiextensions.k8s.io``
  ``customresourcedefinitions`` and ``apiregistration.k8s.io`` ``apiservices`` (their
  storage takes the prefix from the group and resource, not from kube-apiserver's table).

A cluster-scoped object's key has its name right after the resource prefix, a namespaced
one's its namespace then its name; neither can hold ``/``, so the number of segments
tells which, and the layout needs no list of scopes.

**Cohabiting resources.** Upstream stores some resources of two groups as one
(``AddCohabitatingResources``): core ``events`` and ``events.k8s.io`` ``events`` are both
kept under ``/registry/events``, as core ``v1`` Events, whichever group wrote them; the
same held for the ``extensions`` group's copies of ``apps``, ``networking.k8s.io`` and
``policy`` resources until they were removed. The key says nothing of the group an object
was written through; kube-apiserver holds the prefix as the storage of the first resource
of each pair whose group is enabled (the core, ``apps``, ``networking.k8s.io`` and
``policy`` groups always are), and a key under a shared prefix is placed under that owner:
every Event is core ``events``, including those created as ``events.k8s.io/v1``. The
ledger's reports of the guest resource describe the same objects, and the stored
``apiVersion`` of each value (:mod:`kube.stored`) is the owner's.

**Keys that hold no object.** kube-apiserver keeps a few keys of its own beside the
objects, which :meth:`Layout.place` names, with what they are, rather than report as
unknown: the allocators' ranges (``ranges/serviceips``, ``ranges/secondaryserviceips``,
``ranges/servicenodeports``; v1.36 and v1.37 keep service IPs as IPAddress objects only and
write just the NodePort range, but a cluster upgraded from an older release may keep the
others), one key per kube-apiserver under ``masterleases/`` (its lease on the
``kubernetes`` Service's endpoints, ``--endpoint-reconciler-type=lease``, the default) and
under ``peerserverleases/`` (its address for the mixed-version proxy, written by v1.36 and
v1.37 with their defaults), and, at the root of the keyspace whatever the prefix, the
compactor's ``compact_rev_key``. ``health`` under the prefix is named too: kube-apiserver's
etcd health check reads it and never writes it, but kine (k3s's datastore) does. Any other
key is either under a resource's prefix or "under no resource the ledger knows", as a
resource the ledger has not heard of is (a custom resource whose definition it has not
observed, an API the cluster served once). The whole table was checked against every key
of real v1.36.3 and v1.37.2 clusters holding objects of most kinds
(``tests/unit/test_store_layout.py``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from ledger.names import group_resource_string

PREFIX: Final = "/registry"

GroupResource: TypeAlias = tuple[str, str]

# SpecialDefaultResourcePrefixes, upstream's prefixes other than the resource's name.
_SPECIAL: Final[Mapping[GroupResource, str]] = {
    ("", "replicationcontrollers"): "controllers",
    ("", "endpoints"): "services/endpoints",
    ("", "nodes"): "minions",
    ("", "services"): "services/specs",
    ("extensions", "ingresses"): "ingress",
    ("networking.k8s.io", "ingresses"): "ingress",
}
# Built-in resources stored under <group>/<resource>, as custom resources are: those of
# apiextensions-apiserver and kube-aggregator, which kube-apiserver runs in its process.
_GROUP_QUALIFIED: Final = frozenset(
    {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("apiregistration.k8s.io", "apiservices"),
    }
)
# Upstream's cohabiting resources: each guest -> the resource whose storage holds it.
_COHABITING: Final[Mapping[GroupResource, GroupResource]] = {
    ("extensions", "networkpolicies"): ("networking.k8s.io", "networkpolicies"),
    ("extensions", "deployments"): ("apps", "deployments"),
    ("extensions", "daemonsets"): ("apps", "daemonsets"),
    ("extensions", "replicasets"): ("apps", "replicasets"),
    ("events.k8s.io", "events"): ("", "events"),
    ("extensions", "replicationcontrollers"): ("", "replicationcontrollers"),
    ("extensions", "podsecuritypolicies"): ("policy", "podsecuritypolicies"),
    ("extensions", "ingresses"): ("networking.k8s.io", "ingresses"),
}

# Keys kube-apiserver keeps beside the objects, by their path under the prefix, and what
# each is. Those of the allocators hold a core v1 RangeAllocation, the leases a v1 Endpoints.
_NOT_OBJECTS: Final[Mapping[str, str]] = {
    "ranges/serviceips": "the service IP allocator's range",
    "ranges/secondaryserviceips": "the secondary (dual-stack) service IP allocator's range",
    "ranges/servicenodeports": "the NodePort allocator's range",
    "health": "the key etcd health checks read",  # written by kine, not kube-apiserver
}
# ... and the folders of those it keeps one per kube-apiserver: <folder>/<name>.
_NOT_OBJECT_FOLDERS: Final[Mapping[str, str]] = {
    "masterleases": "a kube-apiserver's lease on the kubernetes Service's endpoints, by its IP"
    " (--endpoint-reconciler-type=lease, the default)",
    "peerserverleases": "a kube-apiserver's address for its peers' mixed-version proxy, by its"
    " identity",
}
_UNKNOWN: Final = (
    "under no resource the ledger knows (it knows a resource once an apiserver reported"
    " storing it, a custom resource once its CustomResourceDefinition is observed)"
)
# etcd3's compactor keeps the last compacted revision here, at the root of the keyspace.
COMPACT_REV_KEY: Final = "compact_rev_key"


@dataclass(frozen=True, slots=True)
class Placed:
    """A key that holds an object of ``group``/``resource``; ``namespace`` None if the
    object is cluster-scoped."""

    group: str
    resource: str
    namespace: str | None
    name: str


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A key that holds no object of a resource the layout knows, and why."""

    key: str
    reason: str


@dataclass(frozen=True)
class Layout:
    """Where the resources one cluster stores keep their objects; build it with :meth:`of`.

    ``root`` is the ``--etcd-prefix`` as kube-apiserver joins keys to it (``/registry/``);
    ``owners`` maps each resource prefix (``services/specs``) to the resource it is the
    storage of, and ``prefixes_of`` each resource the layout knows, and the owner of each
    cohabiting guest, to its resource prefix.
    """

    root: str
    owners: Mapping[str, GroupResource]
    prefixes_of: Mapping[GroupResource, str]

    @classmethod
    def of(
        cls,
        resources: Iterable[GroupResource],
        custom: Iterable[GroupResource] = (),
        prefix: str = PREFIX,
    ) -> Layout:
        """The layout of the (group, resource) pairs ``resources``, of which those in
        ``custom`` (group, plural) are custom resources, under ``--etcd-prefix`` ``prefix``.

        Raises ValueError for a resource name that cannot be a prefix (empty, or with
        ``/``), and for two resources that would share a prefix without cohabiting.
        """
        custom = frozenset(custom)
        owners: dict[str, GroupResource] = {}
        prefixes_of: dict[GroupResource, str] = {}
        for group_resource in sorted({*resources, *custom}):
            group, resource = group_resource
            if (
                not resource
                or "/" in resource
                or "/" in group
                or (group_resource in custom and not group)
            ):
                raise ValueError(
                    f"resource {group_resource_string(group, resource)!r}: a resource is a"
                    f" non-empty name and its group a name (non-empty for a custom resource),"
                    f" neither with '/', e.g. ('apps', 'deployments')"
                )
            if group_resource in custom or group_resource in _GROUP_QUALIFIED:
                owner, path = group_resource, f"{group}/{resource}"
            else:
                owner = _COHABITING.get(group_resource, group_resource)
                path = _SPECIAL.get(owner, owner[1].lower())
            held = owners.setdefault(path, owner)
            if held != owner:
                raise ValueError(
                    f"{group_resource_string(*held)} and {group_resource_string(*owner)} would"
                    f" both be stored under {_root(prefix)}{path}/, which kube-apiserver"
                    f" shares only between cohabiting resources; is one of them served by"
                    f" an aggregated API server, or a custom resource not passed as custom?"
                )
            prefixes_of[group_resource] = prefixes_of[owner] = path
        return cls(_root(prefix), owners, prefixes_of)

    @property
    def prefix(self) -> str:
        """The ``--etcd-prefix`` as a user writes it: ``/registry``."""
        return self.root.rstrip("/") or "/"

    def place(self, key: str) -> Placed | Unplaced:
        """The object etcd key ``key`` holds, or why it holds none this layout knows."""
        if not key.startswith(self.root):
            if key == COMPACT_REV_KEY:
                return Unplaced(key, "not an object: the revision kube-apiserver last compacted to")
            return Unplaced(key, f"outside the prefix {self.prefix}")
        path = key[len(self.root) :]
        parts = path.split("/")
        # Longest prefix first: services/specs/<ns>/<name> is a Service, whatever "services"
        # alone might be. Every prefix has one segment or two (<group>/<plural>), and none
        # is looked up with the key's last segment: a key is placed by its folder alone, so
        # that a reader can place a folder once (kube.audit does).
        if len(parts) > 2:
            owner = self.owners.get(f"{parts[0]}/{parts[1]}")
            if owner is not None:
                return _placed(key, owner, parts[2:])
        owner = self.owners.get(parts[0])
        if owner is not None:
            return _placed(key, owner, parts[1:])
        return Unplaced(key, _not_an_object(path) or _UNKNOWN)

    def prefixes(self, resources: Iterable[GroupResource] | None = None) -> tuple[str, ...]:
        """The key prefixes to read for the objects of ``resources`` (every key under the
        prefix if None), each ending in ``/`` so that ``pods`` does not read
        ``podtemplates``; sorted, none under another. A cohabiting guest reads its owner's.

        Raises ValueError for a resource the layout does not know.
        """
        if resources is None:
            return (self.root,)
        chosen = set()
        for group_resource in resources:
            path = self.prefixes_of.get(group_resource)
            if path is None:
                raise ValueError(
                    f"resource {group_resource_string(*group_resource)!r} is none the ledger"
                    f" knows for this cluster; it knows a resource once an apiserver reported"
                    f" storing it, a custom resource once its CustomResourceDefinition is"
                    f" observed"
                )
            chosen.add(f"{self.root}{path}/")
        ordered = sorted(chosen)
        return tuple(p for p in ordered if not any(p.startswith(o) for o in chosen - {p}))


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``: etcd's
    ``range_end`` for reading a prefix."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # an empty prefix: every key


def _root(prefix: str) -> str:
    """``prefix`` as kube-apiserver's etcd3 storage prepends it to a key (``path.Join("/",
    prefix)``, then a ``/``): ``registry`` and ``/registry/`` are ``/registry/``."""
    segments = [segment for segment in prefix.split("/") if segment]
    return "/" + "".join(f"{segment}/" for segment in segments)


def _placed(key: str, owner: GroupResource, rest: list[str]) -> Placed | Unplaced:
    if len(rest) == 1 and rest[0]:
        return Placed(owner[0], owner[1], None, rest[0])
    if len(rest) == 2 and rest[0] and rest[1]:
        return Placed(owner[0], owner[1], rest[0], rest[1])
    return Unplaced(
        key,
        f"under the prefix of {group_resource_string(*owner)}, but not followed by"
        f" <namespace>/<name> or <name>",
    )


def _not_an_object(path: str) -> str | None:
    """What kube-apiserver keeps at ``path`` under the prefix if it is no object."""
    what = _NOT_OBJECTS.get(path)
    if what is None:
        folder, _, name = path.partition("/")
        if name and "/" not in name:
            what = _NOT_OBJECT_FOLDERS.get(folder)
    return None if what is None else f"not an object: {what}"
