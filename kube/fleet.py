"""The clusters of a fleet, as ``svledger collect --fleet PATH`` reads them, and how to
reach each.

``PATH`` is either

* **a kubeconfig file**: each of its contexts is a cluster, named in the ledger by the
  context's name (what ``kubectl config get-contexts`` lists); or
* **a directory**: each kubeconfig file in it is a cluster, reached through the file's
  current context and named by the file's name less a kubeconfig suffix
  (:data:`SUFFIXES`): ``prod-eu-1.yaml`` is cluster ``prod-eu-1``. That is the shape a
  fleet's kubeconfigs take when a Secret holding one key per cluster is mounted as a
  volume; the hidden entries kubelet keeps beside the keys (``..data``) are skipped.

The fleet is read again while the collector runs (:data:`FLEET_READ_SECONDS`), so that
clusters added to or removed from the file or directory are collected or let go without a
restart; a read that fails keeps the clusters of the last one that worked. Each cluster's
apiservers are asked at the peer addresses their identity leases advertise (written by
default since v1.36), as there is no ``--apiserver`` per cluster here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from ledger.errors import UsageError

if TYPE_CHECKING:  # the client library takes a second to import; the command line reads
    from kube.client import Kube  # this module's defaults without it

SUFFIXES: Final = (".yaml", ".yml", ".kubeconfig", ".conf", ".config")
FLEET_READ_SECONDS: Final = 30.0
CONCURRENCY: Final = 32  # requests in flight across a fleet's apiservers, by default


class FleetError(UsageError):
    """The fleet cannot be read as given; the message names the path and what to fix."""


@dataclasses.dataclass(frozen=True, slots=True)
class FleetCluster:
    """One cluster of the fleet: its name in the ledger, and kubectl's way to reach it."""

    name: str
    kubeconfig: str
    context: str | None  # None: the file's current context


@dataclasses.dataclass(frozen=True, eq=False)
class Source:
    """How a collector reaches one cluster: ``open`` gives its client, which the collector
    closes when it lets the cluster go if ``owned``; ``apiservers`` a client of each of
    its apiservers by ID (``--apiserver``; else their leases' peer addresses are asked)."""

    open: Callable[[], Awaitable[Kube]]
    apiservers: Mapping[str, Kube] = dataclasses.field(default_factory=dict)
    owned: bool = True


class Fleet:
    """The clusters at ``path`` (:func:`read_fleet`), each as a :class:`Source` whose
    clients share ``slots`` (at most that many requests in flight across the fleet).
    Each :meth:`read` reads ``path`` again; a cluster read as before keeps its source, so
    a collector restarts only the clusters whose kubeconfig or context changed."""

    def __init__(self, path: str, slots: asyncio.Semaphore) -> None:
        self.path = path
        self._slots = slots
        self._sources: dict[FleetCluster, Source] = {}

    def read(self) -> dict[str, Source]:
        """Every cluster of the fleet now; raises :class:`FleetError` as :func:`read_fleet`."""
        from kube.client import connect

        fleet = read_fleet(self.path)
        self._sources = {
            cluster: self._sources.get(cluster)
            or Source(
                functools.partial(connect, cluster.kubeconfig, cluster.context, slots=self._slots)
            )
            for cluster in fleet.values()
        }
        return {cluster.name: source for cluster, source in self._sources.items()}


def read_fleet(path: str) -> dict[str, FleetCluster]:
    """The clusters ``path`` names (the module docstring), by name.

    Raises :class:`FleetError` if ``path`` is neither a kubeconfig nor a directory, names
    no cluster, or names one twice.
    """
    where = Path(path)
    if where.is_dir():
        return _directory(where)
    if where.is_file():
        return _contexts(where)
    raise FleetError(
        f"--fleet {path}: no such file or directory; give a kubeconfig (each context a"
        " cluster) or a directory of kubeconfig files (each file a cluster)"
    )


def _contexts(path: Path) -> dict[str, FleetCluster]:
    document = _load(path)
    contexts = document.get("contexts") or []
    found = [c.get("name") for c in contexts if isinstance(c, dict)]
    names = [name for name in found if isinstance(name, str) and name]
    if not names or len(names) != len(found):
        raise FleetError(
            f"--fleet {path}: the kubeconfig has no named contexts; give each cluster a"
            " context (kubectl config set-context NAME --cluster ... --user ...)"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise FleetError(f"--fleet {path}: context {repeated[0]!r} is defined twice")
    return {name: FleetCluster(name, str(path), name) for name in names}


def _directory(path: Path) -> dict[str, FleetCluster]:
    fleet: dict[str, FleetCluster] = {}
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        name = _cluster_name(entry.name)
        if name in fleet:
            raise FleetError(
                f"--fleet {path}: {Path(fleet[name].kubeconfig).name} and {entry.name} both"
                f" name cluster {name!r}; keep one"
            )
        fleet[name] = FleetCluster(name, str(Path(entry.path)), None)
    if not fleet:
        raise FleetError(
            f"--fleet {path}: the directory holds no kubeconfig file; put one per cluster in"
            f" it, named after the cluster (e.g. prod-eu-1.yaml)"
        )
    return fleet


def _cluster_name(file_name: str) -> str:
    for suffix in SUFFIXES:
        if file_name.endswith(suffix) and len(file_name) > len(suffix):
            return file_name[: -len(suffix)]
    return file_name


def _load(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        reason = " ".join(str(error).split())
        raise FleetError(f"--fleet {path}: cannot read it as a kubeconfig: {reason}") from error
    if not isinstance(document, dict):
        raise FleetError(
            f"--fleet {path}: it is not a kubeconfig (a YAML mapping of clusters, users and"
            " contexts)"
        )
    return document
