"""The ledger's views as Kubernetes API objects: kinds, objects, tables, selectors, errors.

Pure functions of a :class:`View` (a cluster's fold state at one log position) and of
request parameters; :mod:`readapi.server` moves them over HTTP.

* Four kinds, in upstream's JSON shapes: ``internal.apiserver.k8s.io/v1alpha1``
  StorageVersion (KEP-2339), ``coordination.k8s.io/v1`` Lease in ``kube-system`` (the
  apiserver identity lease of KEP-1965, with upstream's labels), and
  ``migration.k8s.io/v1alpha1`` StorageState and StorageVersionMigration
  (kubernetes-sigs/kube-storage-version-migrator). All four are read-only here.
* ``metadata.resourceVersion`` is the log offset (in the cluster's partition) of the
  event that last changed the row; a list's is the offset the view is folded up to.
  ``creationTimestamp`` is the time of the event that created the row, and ``uid`` is
  derived from the cluster, kind, name and that event's offset, so an object deleted
  and created again gets a new uid, as in Kubernetes.
* A migration's phase maps onto upstream's conditions: ``Running`` and ``Succeeded``
  as such; ``Failed`` and ``Cancelled`` as ``Failed`` with the ledger's reason
  (``Cancelled`` for a cancellation) and message; ``Pending`` has no condition (an
  empty status), as a migration upstream has not yet been picked up.
* A StorageVersionMigration's ``spec.resource.version`` is the version part of its
  target storage version. Upstream's trigger puts there the version its migrator
  sends requests to, discovery's preferred version, which the ledger does not hold;
  the worker asks discovery when it runs (:mod:`kube.target`).
* Fields upstream's types mark ``omitempty`` are left out when empty, as upstream's
  JSON leaves them: the core group's ``group: ""``, an apiserver's empty
  ``servedVersions``, a condition's empty reason or message. The ledger's exact phase and the
  number of objects migrated are in labels and annotations under ``svledger.io/``.
* Table columns are those a reader of ``kubectl get`` wants (see each kind's
  ``columns``); ages are relative to the view's time, so a past view shows the ages
  as they were then.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

from ledger.errors import UsageError
from ledger.events import Position
from ledger.hashing import hash_of_stored
from ledger.identity import (
    HOSTNAME_LABEL,
    IDENTITY_LABEL,
    IDENTITY_NAME,
    LEASE_NAMESPACE,
    PEER_ADDRESS_ANNOTATION,
)
from ledger.names import group_resource_string, split_group_version
from ledger.validation import is_dns1123_subdomain
from projections.state import (
    Lease,
    Migration,
    ServerStorageVersion,
    State,
    StorageState,
    StorageVersion,
)

JSON: TypeAlias = dict[str, Any]
Row: TypeAlias = Lease | StorageVersion | StorageState | Migration

PHASE_LABEL: Final = "svledger.io/phase"
RESOURCE_LABEL: Final = "svledger.io/resource"
MIGRATED_ANNOTATION: Final = "svledger.io/objects-migrated"
TARGET_HASH_ANNOTATION: Final = "svledger.io/target-storage-version-hash"
_UID_NAMESPACE: Final = uuid.UUID("6c1f7c8e-5a0b-4f5e-9a43-3f0e2f1b7d21")


class ApiError(UsageError):
    """A request the API refuses; rendered as a Kubernetes ``Status`` (with ``details``
    if given, empty ones too)."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.details = details


def status(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    """A ``meta/v1`` Status, as every Kubernetes error body is, its fields in upstream's
    order; ``details`` left out when None, as upstream leaves out a nil pointer, and
    ``{}`` kept when empty; an empty ``reason`` left out, as upstream's omits one."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
    }
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


# What Go's json.Marshal escapes that Python's json.dumps leaves as it is.
_GO_ESCAPES: Final = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
_HTML_CHARACTERS: Final = "".join(map(chr, _GO_ESCAPES))


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it (how upstream's field errors show
    a value of a named string type, and its bodies): compact, UTF-8 kept, HTML
    characters escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if any(character in text for character in _HTML_CHARACTERS):
        return text.translate(_GO_ESCAPES)
    return text


def go_json_body(value: Any) -> bytes:
    """A JSON response body as upstream's encoder writes it: :func:`go_json`, then a
    newline (a lone surrogate, which no request or event holds, written as ``?``)."""
    return (go_json(value) + "\n").encode("utf-8", "replace")


def invalid(kind: str, group: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """Upstream's ``NewInvalid``: a 422 naming every field error of an unnamed ``kind``.

    ``causes``: (field, reason, message), the message as upstream's
    ``field.Error.ErrorBody`` writes it (``Forbidden: ...``, ``Invalid value: ...``).
    """
    described = [f"{field}: {message}" for field, _, message in causes]
    shown = described[0] if len(described) == 1 else "[" + ", ".join(described) + "]"
    return ApiError(
        422,
        "Invalid",
        f'{kind}.{group} "" is invalid: {shown}',
        {
            "group": group,
            "kind": kind,
            "causes": [
                {"reason": f"FieldValue{reason}", "message": message, "field": field}
                for field, reason, message in causes
            ],
        },
    )


# --------------------------------------------------------------------------- views


@dataclasses.dataclass(frozen=True, slots=True)
class Created:
    """When and where (the event's offset) a row first appeared."""

    time: datetime
    offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """One cluster's rows as the log stood after ``offset`` in its partition.

    ``time`` is the time of the view: the last applied event's for a past view, now
    for the live one; ages are measured to it. ``created`` is keyed by kind and row key.
    """

    cluster: str
    offset: int
    time: datetime
    state: State
    created: Mapping[tuple[str, tuple[str, ...]], Created]


# --------------------------------------------------------------------------- kinds


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    description: str
    format: str = ""
    priority: int = 0
    empty: str | None = None  # the cell of an empty object (a bookmark's), if not the type's

    @property
    def empty_cell(self) -> Any:
        """The cell upstream's printer writes for an empty object: an age unknown, a
        number 0, a string empty (or what ``empty`` says)."""
        if self.empty is not None:
            return self.empty
        if self.name == "Age":
            return "<unknown>"
        return 0 if self.type == "integer" else ""


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    """One served resource: its names, where its rows live, and how they read."""

    group: str
    version: str
    resource: str
    kind: str
    singular: str
    namespaced: bool
    rows: Callable[[State], Mapping[Any, Row]]
    name: Callable[[Any], str]
    body: Callable[[Any, View], JSON]
    labels: Callable[[Any], dict[str, str]]
    annotations: Callable[[Any], dict[str, str]]
    columns: tuple[Column, ...]
    cells: Callable[[Any, View], list[Any]]
    # The fields upstream's empty object of the kind writes, {} each: a built-in
    # kind's struct fields without omitempty (a custom resource's object has none).
    zero_fields: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def bookmark(self, resource_version: int, annotations: Mapping[str, str] | None = None) -> JSON:
        """A watch bookmark's object, as upstream's watch cache sends it: an empty object
        of the kind carrying only ``resource_version`` (and ``annotations``)."""
        metadata: JSON = {"resourceVersion": str(resource_version)}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body: JSON = {"kind": self.kind, "apiVersion": self.api_version, "metadata": metadata}
        body.update((field, {}) for field in self.zero_fields)
        return body

    def selected(self, view: View, selection: Selection | None = None) -> list[tuple[Any, JSON]]:
        """The objects of this kind in the view that ``selection`` matches (all without
        one), each with its fold row, sorted by name."""
        pairs = [(row, self.object(row, view)) for row in self.rows(view.state).values()]
        if selection is not None:
            pairs = [pair for pair in pairs if selection.matches(pair[1])]
        return sorted(pairs, key=lambda pair: str(pair[1]["metadata"]["name"]))

    def object(self, row: Any, view: View) -> JSON:
        return {
            "kind": self.kind,
            "apiVersion": self.api_version,
            "metadata": self.metadata(row, view),
            **self.body(row, view),
        }

    def metadata(self, row: Any, view: View) -> JSON:
        name = self.name(row)
        created = view.created.get((self.kind, row.key[1:]))
        offset = created.offset if created else Position.parse(row.revision).offset
        metadata: JSON = {
            "name": name,
            "uid": str(uuid.uuid5(_UID_NAMESPACE, f"{view.cluster}/{self.kind}/{name}/{offset}")),
            "resourceVersion": str(Position.parse(row.revision).offset),
            "creationTimestamp": kube_time(created.time) if created else None,
        }
        if self.namespaced:
            metadata["namespace"] = LEASE_NAMESPACE
        if labels := self.labels(row):
            metadata["labels"] = labels
        if annotations := self.annotations(row):
            metadata["annotations"] = annotations
        return metadata


def kube_time(time: datetime) -> str:
    """``metav1.Time``: RFC 3339 in UTC, to the second."""
    return time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kube_micro_time(time: datetime) -> str:
    """``metav1.MicroTime``: RFC 3339 in UTC, to the microsecond."""
    return time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def human_duration(seconds: float) -> str:
    """An age as kubectl prints one (``HumanDuration`` of k8s.io/apimachinery)."""
    total = int(seconds)
    if total < -1:
        return "<invalid>"
    if total < 0:
        return "0s"
    if total < 120:
        return f"{total}s"
    minutes, hours = total // 60, total // 3600
    if minutes < 10:
        return f"{minutes}m{total % 60}s" if total % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _age(kind: str, row: Any, view: View) -> str:
    created = view.created.get((kind, row.key[1:]))
    return human_duration((view.time - created.time).total_seconds()) if created else "<unknown>"


def _none(value: str | None) -> str:
    return value if value else "<none>"


# StorageVersion ------------------------------------------------------------------


def _first_entries(entries: Sequence[ServerStorageVersion], shown: int = 3) -> str:
    """Upstream's ``formatStorageVersions``: ``ID=VERSION`` of the first ``shown``
    entries, ``+ N more...`` after them, ``<unset>`` for none."""
    text = ",".join(f"{e.apiserver_id}={e.encoding_version}" for e in entries[:shown])
    if len(entries) > shown:
        return f"{text} + {len(entries) - shown} more..."
    return text or "<unset>"


def _storage_version_body(row: StorageVersion, view: View) -> JSON:
    """Upstream's ``StorageVersionStatus``, its fields in upstream's order and its empty
    ones (``servedVersions`` of an apiserver that reports none) left out, as upstream's
    ``omitempty`` leaves them."""
    condition = row.condition
    status: JSON = {
        "storageVersions": [
            {
                "apiServerID": entry.apiserver_id,
                "encodingVersion": entry.encoding_version,
                "decodableVersions": list(entry.decodable_versions),
                **(
                    {"servedVersions": list(entry.served_versions)} if entry.served_versions else {}
                ),
            }
            for entry in row.entries
        ],
    }
    if row.common_encoding_version is not None:
        status["commonEncodingVersion"] = row.common_encoding_version
    status["conditions"] = [
        {
            "type": condition.type,
            "status": condition.status,
            "lastTransitionTime": kube_time(condition.last_transition_time),
            "reason": condition.reason,
            "message": condition.message,
        }
    ]
    return {"spec": {}, "status": status}


STORAGE_VERSIONS: Final = Kind(
    group="internal.apiserver.k8s.io",
    version="v1alpha1",
    resource="storageversions",
    kind="StorageVersion",
    singular="storageversion",
    namespaced=False,
    zero_fields=("spec", "status"),
    rows=lambda state: state.storage_versions,
    name=lambda row: row.name,
    body=_storage_version_body,
    labels=lambda row: {},
    annotations=lambda row: {},
    columns=(
        Column("Name", "string", "The StorageVersion's name, <group>.<resource>.", "name"),
        Column(
            "CommonEncodingVersion",
            "string",
            "The version every API server encodes in; <unset> while they disagree.",
            empty="<unset>",
        ),
        Column(
            "StorageVersions",
            "string",
            "apiserverID=encodingVersion of the first three entries, in their order.",
            empty="<unset>",
        ),
        Column("Age", "string", "Time since the first report."),
        Column("Agreed", "string", "Status of the AllEncodingVersionsEqual condition.", priority=1),
        Column("Servers", "integer", "API servers reporting on the resource.", priority=1),
    ),
    cells=lambda row, view: [
        row.name,
        row.common_encoding_version or "<unset>",
        _first_entries(row.entries),
        _age("StorageVersion", row, view),
        row.condition.status,
        len(row.entries),
    ],
)


# Lease ---------------------------------------------------------------------------


def _lease_body(row: Lease, view: View) -> JSON:
    # A lease the collector saw without a holder has "" in the ledger; upstream's
    # object then has none (``holderIdentity`` is omitted when unset).
    holder = {"holderIdentity": row.holder_identity} if row.holder_identity else {}
    return {
        "spec": {
            **holder,
            "leaseDurationSeconds": row.lease_duration_seconds,
            "renewTime": kube_micro_time(row.renew_time),
        }
    }


LEASES: Final = Kind(
    group="coordination.k8s.io",
    version="v1",
    resource="leases",
    kind="Lease",
    singular="lease",
    namespaced=True,
    zero_fields=("spec",),
    rows=lambda state: state.leases,
    name=lambda row: row.apiserver_id,
    body=_lease_body,
    labels=lambda row: {IDENTITY_LABEL: IDENTITY_NAME, HOSTNAME_LABEL: row.hostname},
    annotations=lambda row: (
        {PEER_ADDRESS_ANNOTATION: row.peer_advertise_address} if row.peer_advertise_address else {}
    ),
    columns=(
        Column("Name", "string", "The API server's ID.", "name"),
        Column("Holder", "string", "spec.holderIdentity."),
        Column("Age", "string", "Time since the lease was first seen."),
        Column("Hostname", "string", "The API server's host name.", priority=1),
        Column("Renewed", "string", "Time since spec.renewTime.", priority=1, empty="<unknown>"),
    ),
    cells=lambda row, view: [
        row.apiserver_id,
        row.holder_identity,
        _age("Lease", row, view),
        row.hostname,
        human_duration((view.time - row.renew_time).total_seconds()),
    ],
)


# StorageState --------------------------------------------------------------------


def versions_of_hashes(state: State, row: StorageState) -> dict[str, str]:
    """The group-qualified version each known storageVersionHash of a resource stands for.

    The candidates are every version an API server reported encoding, decoding or
    serving for the resource, hashed with its kind; a hash none of them gives is
    left out (it reads as the bare hash).
    """
    storage_version = state.storage_versions.get(row.key)
    if storage_version is None:
        return {}
    versions = {
        version
        for entry in storage_version.entries
        for version in (entry.encoding_version, *entry.decodable_versions, *entry.served_versions)
    }
    named: dict[str, str] = {}
    for version in sorted(versions):
        try:
            named[hash_of_stored(version, storage_version.kind)] = version
        except ValueError:
            continue
    return named


def _hash_with_version(value: str, named: Mapping[str, str]) -> str:
    return f"{value} ({named[value]})" if value in named else value


def _storage_state_body(row: StorageState, view: View) -> JSON:
    status: JSON = {"persistedStorageVersionHashes": list(row.persisted_storage_version_hashes)}
    if row.current_storage_version_hash is not None:
        status["currentStorageVersionHash"] = row.current_storage_version_hash
    return {"spec": {"resource": _group_resource(row.group, row.resource)}, "status": status}


def _group_resource(group: str, resource: str, **more: str) -> JSON:
    """Upstream's ``GroupResource`` (``GroupVersionResource`` with ``version``): the core
    group's empty name is left out (``omitempty``)."""
    return {**({"group": group} if group else {}), **more, "resource": resource}


def _storage_state_cells(row: StorageState, view: View) -> list[Any]:
    named = versions_of_hashes(view.state, row)
    return [
        row.name,
        _hash_with_version(_none(row.current_storage_version_hash), named),
        ", ".join(_hash_with_version(h, named) for h in row.persisted_storage_version_hashes),
        _age("StorageState", row, view),
    ]


STORAGE_STATES: Final = Kind(
    group="migration.k8s.io",
    version="v1alpha1",
    resource="storagestates",
    kind="StorageState",
    singular="storagestate",
    namespaced=False,
    rows=lambda state: state.storage_states,
    name=lambda row: row.name,
    body=_storage_state_body,
    labels=lambda row: {},
    annotations=lambda row: {},
    columns=(
        Column("Name", "string", "The StorageState's name, <resource>.<group>.", "name"),
        Column("Current", "string", "The current storageVersionHash and its version."),
        Column("Persisted", "string", "Hashes objects may still be stored in, with versions."),
        Column("Age", "string", "Time since the StorageState was created."),
    ),
    cells=_storage_state_cells,
)


# StorageVersionMigration -----------------------------------------------------------

_CONDITION_OF_PHASE: Final = {
    "Running": "Running",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
    "Cancelled": "Failed",
}


def _migration_body(row: Migration, view: View) -> JSON:
    _, version = split_group_version(row.target_version)
    spec: JSON = {"resource": _group_resource(row.group, row.resource, version=version)}
    if row.continue_token:
        spec["continueToken"] = row.continue_token
    if row.phase not in _CONDITION_OF_PHASE:
        return {"spec": spec, "status": {}}  # Pending: no condition yet, as upstream
    condition: JSON = {
        "type": _CONDITION_OF_PHASE[row.phase],
        "status": "True",
        "lastUpdateTime": kube_time(row.updated_at),
    }
    reason = row.reason or ("Cancelled" if row.phase == "Cancelled" else None)
    if reason:
        condition["reason"] = reason
    if row.message:
        condition["message"] = row.message
    return {"spec": spec, "status": {"conditions": [condition]}}


def _migration_resource(row: Migration) -> str:
    return group_resource_string(row.group, row.resource)


STORAGE_VERSION_MIGRATIONS: Final = Kind(
    group="migration.k8s.io",
    version="v1alpha1",
    resource="storageversionmigrations",
    kind="StorageVersionMigration",
    singular="storageversionmigration",
    namespaced=False,
    rows=lambda state: state.migrations,
    name=lambda row: row.migration_id,
    body=_migration_body,
    labels=lambda row: {PHASE_LABEL: row.phase, RESOURCE_LABEL: _migration_resource(row)},
    annotations=lambda row: {
        MIGRATED_ANNOTATION: str(row.objects_migrated),
        TARGET_HASH_ANNOTATION: row.target_hash,
    },
    columns=(
        Column("Name", "string", "The migration's ID.", "name"),
        Column("Resource", "string", "<resource>.<group> being migrated."),
        Column("Version", "string", "The version objects are rewritten in."),
        Column("Phase", "string", "Pending, Running, Succeeded, Failed or Cancelled."),
        Column("Migrated", "integer", "Objects rewritten so far."),
        Column("Age", "string", "Time since the migration was requested."),
    ),
    cells=lambda row, view: [
        row.migration_id,
        _migration_resource(row),
        row.target_version,
        row.phase,
        row.objects_migrated,
        human_duration((view.time - row.requested_at).total_seconds()),
    ],
)

KINDS: Final = (STORAGE_VERSIONS, LEASES, STORAGE_STATES, STORAGE_VERSION_MIGRATIONS)
_BY_PATH: Final = {(kind.group, kind.version, kind.resource): kind for kind in KINDS}


def kind_of(group: str, version: str, resource: str) -> Kind | None:
    return _BY_PATH.get((group, version, resource))


def row_kind(row: Row) -> Kind:
    """The kind a fold row is served as."""
    match row:
        case StorageVersion():
            return STORAGE_VERSIONS
        case Lease():
            return LEASES
        case StorageState():
            return STORAGE_STATES
        case Migration():
            return STORAGE_VERSION_MIGRATIONS


# --------------------------------------------------------------------------- discovery


def groups() -> dict[str, list[Kind]]:
    """The served kinds by group, in a stable order."""
    by_group: dict[str, list[Kind]] = {}
    for kind in KINDS:
        by_group.setdefault(kind.group, []).append(kind)
    return by_group


_VERBS: Final = ["get", "list", "watch"]


def api_versions(server_address: str) -> JSON:
    """``/api``: the legacy core group, which serves no kinds here, and where a client
    from anywhere reaches the server (``server_address``), as upstream's says."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def core_resources() -> JSON:
    """``/api/v1``: no core resources; without an ``apiVersion``, as upstream's."""
    return {"kind": "APIResourceList", "groupVersion": "v1", "resources": []}


def group_list() -> JSON:
    """``/apis`` in the legacy (unaggregated) format: its items carry no type, as
    kube-apiserver's do not."""
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(map(_group, groups()))}


def group_of(name: str) -> JSON:
    """``/apis/GROUP``."""
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}


def _group(name: str) -> JSON:
    version = groups()[name][0].version
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


def resource_list(group: str, version: str) -> JSON | None:
    """``/apis/GROUP/VERSION``, or None for a group version not served."""
    kinds = [kind for kind in groups().get(group, []) if kind.version == version]
    if not kinds:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}",
        "resources": [
            {
                "name": kind.resource,
                "singularName": kind.singular,
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": _VERBS,
                # As upstream's (and a CRD's) discovery: the hash of the version the
                # kind is stored in, the one it is served in here.
                "storageVersionHash": hash_of_stored(f"{kind.group}/{kind.version}", kind.kind),
            }
            for kind in kinds
        ],
    }


def aggregated_discovery(api_version: str, *, core: bool) -> JSON:
    """``APIGroupDiscoveryList`` (``apidiscovery.k8s.io`` v2 or v2beta1), which kubectl asks first.

    ``core`` is for ``/api``: its one version, ``v1``, with no kinds here (as the
    legacy ``/api`` and ``/api/v1`` say).
    """
    items: list[JSON]
    if core:
        version: JSON = {"version": "v1", "resources": [], "freshness": "Current"}
        items = [{"metadata": {}, "versions": [version]}]
    else:
        items = [
            {
                "metadata": {"name": name},
                "versions": [
                    {
                        "version": kinds[0].version,
                        "resources": [_discovered(kind) for kind in kinds],
                        "freshness": "Current",
                    }
                ],
            }
            for name, kinds in groups().items()
        ]
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": api_version,
        "metadata": {},
        "items": items,
    }


def _discovered(kind: Kind) -> JSON:
    # A built-in kind's response kind has an empty group and version (the resource's
    # own), as kube-apiserver writes them; a custom resource's names them.
    custom = kind.group in CUSTOM_GROUPS
    return {
        "resource": kind.resource,
        "responseKind": {
            "group": kind.group if custom else "",
            "version": kind.version if custom else "",
            "kind": kind.kind,
        },
        "scope": "Namespaced" if kind.namespaced else "Cluster",
        "singularResource": kind.singular,
        "verbs": _VERBS,
    }


# --------------------------------------------------------------------------- selection


@dataclasses.dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "=" | "in":
                return value in self.values
            case "!=" | "notin":
                return value not in self.values
            case "exists":
                return value is not None
            case ">" | "<":
                # As upstream's Gt and Lt: the label's value, read as an integer.
                if value is None or _INTEGER.fullmatch(value) is None:
                    return False
                (bound,) = self.values
                return int(value) > int(bound) if self.operator == ">" else int(value) < int(bound)
            case _:
                return value is None


_SET_REQUIREMENT: Final = re.compile(r"^\s*([^\s!=(),<>]+)\s+(in|notin)\s*\(([^()]*)\)\s*$")
_EQUALITY: Final = re.compile(r"^\s*([^\s!=(),<>]+)\s*(==|=|!=)\s*([^\s!=(),<>]*)\s*$")
_ORDER: Final = re.compile(r"^\s*([^\s!=(),<>]+)\s*([<>])\s*([^\s!=(),<>]*)\s*$")
_EXISTS: Final = re.compile(r"^\s*(!?)\s*([^\s!=(),<>]+)\s*$")
_INTEGER: Final = re.compile(r"[-+]?[0-9]+")


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """A label selector as Kubernetes writes one: ``a=b,c!=d,e in (f,g),h,!i,j>1``."""
    requirements = []
    parts = _split_selector(text)
    if text.strip() and any(not part.strip() for part in parts):
        raise ApiError(
            400,
            "BadRequest",
            f"unable to parse labelSelector {text!r}: found '', expected an identifier after ','",
        )
    for part in parts:
        if not part.strip():
            continue
        if match := _SET_REQUIREMENT.match(part):
            # As upstream's parser: "()" and a trailing "," stand for the empty value.
            values = frozenset(v.strip() for v in match[3].split(","))
            requirements.append(Requirement(match[1], match[2], values))
        elif match := _ORDER.match(part):
            if _INTEGER.fullmatch(match[3]) is None:
                raise ApiError(
                    400,
                    "BadRequest",
                    f"invalid requirement {part.strip()!r} of labelSelector {text!r}: for"
                    " '>' and '<' the value must be an integer",
                )
            requirements.append(Requirement(match[1], match[2], frozenset({match[3]})))
        elif match := _EQUALITY.match(part):
            operator = "!=" if match[2] == "!=" else "="
            requirements.append(Requirement(match[1], operator, frozenset({match[3]})))
        elif match := _EXISTS.match(part):
            requirements.append(Requirement(match[2], "!" if match[1] else "exists", frozenset()))
        else:
            raise ApiError(
                400,
                "BadRequest",
                f"unable to parse requirement {part.strip()!r} of labelSelector {text!r}: "
                "write key=value, key!=value, key in (a,b), key notin (a,b), key or !key",
            )
        _check_label(requirements[-1], text)
    return tuple(requirements)


_LABEL_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _check_label(requirement: Requirement, text: str) -> None:
    """Upstream's ``labels.Parse`` checks: a key is a qualified name (an optional DNS
    subdomain prefix and ``/``, then a name of at most 63 characters), a value empty
    or such a name."""
    prefix, slash, name = requirement.key.rpartition("/")
    if not (_is_label_name(name) and (not slash or is_dns1123_subdomain(prefix))):
        raise ApiError(
            400,
            "BadRequest",
            f"invalid label key {requirement.key!r} in labelSelector {text!r}: a name of at"
            " most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an"
            " alphanumeric one, with an optional DNS subdomain prefix and '/'"
            " (e.g. 'app' or 'kubernetes.io/hostname')",
        )
    for value in requirement.values if requirement.operator not in (">", "<") else ():
        if value and not _is_label_name(value):
            raise ApiError(
                400,
                "BadRequest",
                f"invalid label value {value!r} in labelSelector {text!r}: at most 63"
                " alphanumeric characters, '-', '_' or '.', starting and ending with an"
                " alphanumeric one, or empty",
            )


def _is_label_name(name: str) -> bool:
    return len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def _split_selector(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


FIELDS: Final = ("metadata.name", "metadata.namespace")


CUSTOM_GROUPS: Final = frozenset({"migration.k8s.io"})  # served by CRDs upstream


def parse_field_selector(text: str) -> tuple[Requirement, ...]:
    """A field selector's requirements (``=``, ``==``, ``!=``), its syntax checked; which
    fields a kind knows is checked after the request's options
    (:func:`check_field_selector`), as upstream's handler parses it before it validates
    them and its storage refuses an unknown field after."""
    requirements = []
    for part in _split_selector(text):
        if not part.strip():
            continue  # upstream's field selectors skip empty terms
        match = _EQUALITY.match(part)
        if match is None:
            raise ApiError(
                400,
                "BadRequest",
                f"invalid field selector {part.strip()!r}: write field=value or field!=value",
            )
        operator = "!=" if match[2] == "!=" else "="
        requirements.append(Requirement(match[1], operator, frozenset({match[3]})))
    return tuple(requirements)


def check_field_selector(requirements: Iterable[Requirement], group: str, namespaced: bool) -> None:
    """Refuse a field selector on a field other than ``metadata.name`` and
    ``metadata.namespace``, in the words upstream
    uses for the kind's ``group``: those of a custom resource's for the groups upstream
    serves by CRDs (whose cluster-scoped kinds have no ``metadata.namespace`` either),
    else those of ``DefaultMetaV1FieldSelectorConversion``."""
    custom = group in CUSTOM_GROUPS
    fields = FIELDS if namespaced or not custom else FIELDS[:1]
    for requirement in requirements:
        if requirement.key not in fields:
            raise ApiError(
                400,
                "BadRequest",
                f"field label not supported: {requirement.key}"
                if custom
                else f'"{requirement.key}" is not a known field selector: only '
                f'"{FIELDS[0]}", "{FIELDS[1]}"',
            )


@dataclasses.dataclass(frozen=True, slots=True)
class Selection:
    """Which objects a request is about: namespace, name, label and field selectors."""

    namespace: str | None = None
    name: str | None = None
    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, obj: JSON) -> bool:
        metadata = obj["metadata"]
        namespace = metadata.get("namespace", "")
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.name is not None and metadata["name"] != self.name:
            return False
        fields = {"metadata.name": metadata["name"], "metadata.namespace": namespace}
        return all(r.matches(metadata.get("labels", {})) for r in self.labels) and all(
            r.matches(fields) for r in self.fields
        )


# --------------------------------------------------------------------------- lists, tables


def object_list(
    kind: Kind, items: Sequence[JSON], resource_version: int, token: str, remaining: int | None
) -> JSON:
    """A ``<Kind>List``. As upstream encodes a built-in kind's list, its items carry no
    ``kind`` and ``apiVersion`` (the list says them once); a custom resource's carry them."""
    if kind.group not in CUSTOM_GROUPS:
        items = [{k: v for k, v in item.items() if k not in _TYPE_META} for item in items]
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": list_metadata(resource_version, token, remaining),
        "items": list(items),
    }


_TYPE_META: Final = frozenset({"kind", "apiVersion"})


def list_metadata(resource_version: int, token: str, remaining: int | None = None) -> JSON:
    """``ListMeta``; ``remaining`` is upstream's ``remainingItemCount``, which it gives
    for a page with more after it when no selector makes the count uncertain."""
    metadata: JSON = {"resourceVersion": str(resource_version)}
    if token:
        metadata["continue"] = token
    if remaining is not None:
        metadata["remainingItemCount"] = remaining
    return metadata


def bookmark_table(
    kind: Kind,
    bookmark: JSON,
    *,
    api_version: str = "meta.k8s.io/v1",
    include_object: str = "Metadata",
    with_columns: bool = True,
) -> JSON:
    """A watch bookmark's object (:meth:`Kind.bookmark`) as upstream converts it for a
    Table watch: one row, of an empty object's cells (a built-in kind's printer's; null
    but the name for a custom resource's), the bookmark as its object."""
    if kind.group in CUSTOM_GROUPS:
        # A custom resource's converter writes null for a column its object lacks.
        cells = ["" if column.format == "name" else None for column in kind.columns]
    else:
        cells = [column.empty_cell for column in kind.columns]
    row: JSON = {"cells": cells, "object": None}
    if include_object == "Object":
        row["object"] = bookmark
    elif include_object == "Metadata":
        row["object"] = partial_metadata(bookmark, api_version)
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": {"resourceVersion": bookmark["metadata"]["resourceVersion"]},
        "columnDefinitions": _column_definitions(kind) if with_columns else None,
        "rows": [row],
    }


def _column_definitions(kind: Kind) -> list[JSON]:
    return [
        {
            "name": column.name,
            "type": column.type,
            "format": column.format,
            "description": column.description,
            "priority": column.priority,
        }
        for column in kind.columns
    ]


def table(
    kind: Kind,
    rows: Iterable[tuple[Any, JSON]],
    view: View,
    *,
    api_version: str = "meta.k8s.io/v1",
    include_object: str = "Metadata",
    token: str = "",
    remaining: int | None = None,
    with_columns: bool = True,
) -> JSON:
    """A ``meta.k8s.io`` Table of ``rows`` (fold row, object), as ``kubectl get`` prints;
    each row's object in full, as ``PartialObjectMetadata`` or left out (``include_object``
    ``Object``, ``Metadata`` or ``None``: null, as upstream's empty ``RawExtension``
    encodes)."""
    table_rows = []
    for row, obj in rows:
        table_row: JSON = {"cells": kind.cells(row, view), "object": None}
        if include_object == "Object":
            table_row["object"] = obj
        elif include_object == "Metadata":
            table_row["object"] = partial_metadata(obj, api_version)
        table_rows.append(table_row)
    metadata = list_metadata(view.offset, token, remaining)
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": metadata,
        # upstream's NoHeaders: no definitions, encoded as null
        "columnDefinitions": _column_definitions(kind) if with_columns else None,
        "rows": table_rows,
    }


def partial_metadata(obj: JSON, api_version: str) -> JSON:
    """``obj`` as upstream's ``PartialObjectMetadata``: its kind and its metadata alone."""
    return {"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": obj["metadata"]}


def partial_metadata_list(
    items: Sequence[JSON],
    api_version: str,
    resource_version: int,
    token: str,
    remaining: int | None,
) -> JSON:
    """A list as upstream's ``PartialObjectMetadataList``; each item keeps its kind, as
    upstream's do."""
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": api_version,
        "metadata": list_metadata(resource_version, token, remaining),
        "items": [partial_metadata(obj, api_version) for obj in items],
    }


# --------------------------------------------------------------------------- paging


def continue_token(resource_version: int, after: str) -> str:
    """An opaque ``continue``: the list's resourceVersion and the last name returned."""
    raw = json.dumps({"rv": resource_version, "after": after}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def parse_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), str(data["after"])
    except (ValueError, KeyError, TypeError, binascii.Error) as error:
        raise ApiError(
            400,
            "BadRequest",
            f"continue token {token[:40]!r} is not one this server gave; "
            "start the list again without it",
        ) from error


def page(
    items: Sequence[JSON],
    after: str,
    limit: int | None,
    selected: Callable[[JSON], bool] = lambda obj: True,
) -> tuple[list[JSON], str | None]:
    """The ``selected`` of ``items`` after the name ``after``, at most ``limit``; and the
    last one's name if any item, selected or not, remains after the one that filled the
    page (as upstream's watch cache pages a list with a selector: the next page may be
    empty)."""
    rest = [obj for obj in items if obj["metadata"]["name"] > after] if after else list(items)
    chosen = []
    for index, obj in enumerate(rest):
        if selected(obj):
            chosen.append(obj)
        if limit is not None and len(chosen) >= limit:
            more = index < len(rest) - 1
            return chosen, str(chosen[-1]["metadata"]["name"]) if more else None
    return chosen, None
