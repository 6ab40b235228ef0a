"""What a cluster's etcd actually stores, counted per resource, to check the ledger against.

``svledger audit`` reads every key under the cluster's ``--etcd-prefix`` (or under the
prefixes of the resources it is asked about, :meth:`kube.store_layout.Layout.prefixes`) at
one etcd revision, page by page, and hands each page of (key, value) pairs to
:meth:`Audit.add_page`. Each key is placed (:mod:`kube.store_layout`) and each value read
(:func:`kube.stored.decode`), and the :class:`Audit` keeps, per resource, a :class:`Tally`:

* ``objects``: the values stored under the resource's prefix, and their ``bytes``;
* ``versions``: how many were written in each ``apiVersion``, the fact a storage
  migration changes (``apps/v1``; core ``v1``; a cohabiting guest's objects under the
  owner's);
* ``encryption``: how many are encrypted at rest, per provider, version and key as the
  value's prefix names them (``aescbc:v1:key1``, ``kms:v2:<provider>``: a kms ``v1``
  value is one to rewrite, so the version is kept); what they were written in stays
  unread, as the values are not decrypted;
* ``undecodable``: how many could not be read, and the first :data:`KEPT` of them by key,
  each with its reason. A scan goes on past them: a cluster with one corrupt value is
  still counted.

Keys that hold no object of a resource the layout knows (:class:`~kube.store_layout.Unplaced`:
kube-apiserver's own keys, a resource the ledger has not heard of) are counted apart, the
first :data:`KEPT` by key kept with their reasons. So every pair handed in is counted once:
``keys == unplaced + sum(tally.objects)``.

What is kept does not depend on the order of the pages, and every view is sorted (tallies
by group and resource, counts by name, kept keys by key), so the same store read twice
gives equal results, fit to become an event. The reader records its own work beside it:
the etcd revision it read at, and per page, the request and the bytes it received.

Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from kube.store_layout import GroupResource, Layout, Unplaced
from kube.stored import EncryptedValue, StoredObject, Undecodable, decode

#: How many undecodable values (per resource) and unplaced keys are kept, the first by key.
KEPT: Final = 20

_Item = TypeVar("_Item", Undecodable, Unplaced)


@dataclass(frozen=True)
class Tally:
    """What etcd stores for one resource; the counts sorted by name."""

    group: str
    resource: str
    objects: int
    bytes: int
    versions: tuple[tuple[str, int], ...]  # (stored apiVersion, objects)
    encryption: tuple[tuple[str, int], ...]  # ("<provider>:<version>:<key name>", objects)
    undecodable: int
    undecodable_kept: tuple[Undecodable, ...]  # the first KEPT by key
    # The kind of the objects stored in each of versions (the first seen): with the
    # apiVersion, what their storage version hash is computed from.
    kinds: tuple[tuple[str, str], ...] = ()


class _First(Generic[_Item]):
    """The first ``limit`` items by key of those added, in any order, and how many."""

    __slots__ = ("count", "items", "keys", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.keys: list[str] = []
        self.items: list[_Item] = []

    def add(self, item: _Item) -> None:
        self.count += 1
        if len(self.keys) == self.limit and (not self.keys or item.key >= self.keys[-1]):
            return
        at = bisect.bisect(self.keys, item.key)
        self.keys.insert(at, item.key)
        self.items.insert(at, item)
        del self.keys[self.limit :], self.items[self.limit :]


class _Counting:
    """One resource's counts while pages come in."""

    __slots__ = ("bytes", "encryption", "kinds", "objects", "undecodable", "versions")

    def __init__(self, keep: int) -> None:
        self.objects = 0
        self.bytes = 0
        self.versions: Counter[str] = Counter()
        self.kinds: dict[str, str] = {}
        self.encryption: Counter[str] = Counter()
        self.undecodable: _First[Undecodable] = _First(keep)

    def tally(self, group: str, resource: str) -> Tally:
        return Tally(
            group,
            resource,
            self.objects,
            self.bytes,
            tuple(sorted(self.versions.items())),
            tuple(sorted(self.encryption.items())),
            self.undecodable.count,
            tuple(self.undecodable.items),
            tuple(sorted(self.kinds.items())),
        )


class Audit:
    """The counts of one read of a cluster's etcd, at ``revision``, placed by ``layout``."""

    def __init__(self, layout: Layout, revision: int, *, keep: int = KEPT) -> None:
        self.layout = layout
        self.revision = revision
        self.pages = 0
        self.bytes_read = 0
        self.keys = 0
        self._keep = keep
        self._counting: dict[GroupResource, _Counting] = {}
        self._unplaced: _First[Unplaced] = _First(keep)
        # The resource of each folder (the key up to its last "/") that held an object: a
        # key is placed by its folder alone (a name holds no "/"), and the folders are few
        # (a resource's, or one per namespace), so most keys cost a dict look-up, not a
        # placing.
        self._folders: dict[str, GroupResource] = {}

    def add_page(self, pairs: Iterable[tuple[str, bytes]], *, bytes_read: int = 0) -> None:
        """Count one page of (key, value) pairs, which one request of ``bytes_read`` bytes
        received; an empty page counts as a request too."""
        self.pages += 1
        self.bytes_read += bytes_read
        place = self.layout.place
        folders = self._folders
        counting = self._counting
        for key, value in pairs:
            self.keys += 1
            folder, _, name = key.rpartition("/")
            owner = folders.get(folder) if name else None
            if owner is None:
                placed = place(key)
                if isinstance(placed, Unplaced):
                    self._unplaced.add(placed)
                    continue
                owner = folders[folder] = (placed.group, placed.resource)
            counts = counting.get(owner)
            if counts is None:
                counts = counting[owner] = _Counting(self._keep)
            counts.objects += 1
            counts.bytes += len(value)
            stored = decode(key, value)
            if isinstance(stored, StoredObject):
                counts.versions[stored.api_version] += 1
                if stored.api_version not in counts.kinds:
                    counts.kinds[stored.api_version] = str(stored.kind)
            elif isinstance(stored, EncryptedValue):
                label = f"{stored.provider}:{stored.provider_version}:{stored.key_name}"
                counts.encryption[label] += 1
            else:
                counts.undecodable.add(stored)

    @property
    def tallies(self) -> tuple[Tally, ...]:
        """Every resource with a value stored, by group and resource."""
        return tuple(counts.tally(*owner) for owner, counts in sorted(self._counting.items()))

    @property
    def unplaced(self) -> int:
        """How many keys held no object of a resource the layout knows."""
        return self._unplaced.count

    @property
    def unplaced_kept(self) -> tuple[Unplaced, ...]:
        """The first :data:`KEPT` of them by key, each with why."""
        return tuple(self._unplaced.items)
