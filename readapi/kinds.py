"""The kinds the read API serves: a fold row of a :class:`View` as a Kubernetes object.

Pure functions of a :class:`View` (a cluster's fold state at one log position); the
handlers (:mod:`readapi.objects`, :mod:`readapi.watch`) move them over HTTP.

* Four kinds, in upstream's JSON shapes: ``internal.apiserver.k8s.io/v1alpha1``
  StorageVersion (KEP-2339), ``coordination.k8s.io/v1`` Lease in ``kube-system`` (the
  apiserver identity lease of KEP-1965, with upstream's labels), and
  ``migration.k8s.io/v1alpha1`` StorageState and StorageVersionMigration
  (kubernetes-sigs/kube-storage-version-migrator). All four are read-only here.
* A custom resource's StorageState carries what the ledger makes of its
  CustomResourceDefinition's ``status.storedVersions`` (:mod:`projections.crds`): the
  versions listed, those no object is stored in, and conditions saying which can go and
  whether one left unsafely (:class:`ServedStorageState`).
* An audited resource's StorageState carries its last audit of the store
  (:mod:`projections.audits`) next to what the ledger infers: what etcd held, and
  conditions when it contradicts the ledger or an encryption key encrypts nothing.
* ``metadata.resourceVersion`` is the log offset (in the cluster's partition) of the
  event that last changed the row (for a StorageState, or its CustomResourceDefinition,
  or a migration its verdicts read, or its last audit). ``creationTimestamp`` is
  the time of the event that created the row, and ``uid`` is derived from the cluster,
  kind, name and that event's offset, so an object deleted and created again gets a new
  uid, as in Kubernetes: the fold records both in the row (``created_at``,
  ``created_revision``; for a StorageState, its fold row's), so a view built from a fold
  snapshot shows what one folded from the log's beginning shows.
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
* The migrator's kinds are custom resources upstream (:data:`CUSTOM_GROUPS`, served by
  CRDs), and upstream's words and shapes for them differ from a built-in kind's where
  noted (a field selector's error here, lists, Table bookmarks and discovery elsewhere).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeAlias

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
from projections.audits import removable_keys
from projections.crds import VersionVerdict, stored_version_verdicts
from projections.state import (
    CustomResourceDefinition,
    Lease,
    Migration,
    ResourceKey,
    ServerStorageVersion,
    State,
    StorageAudit,
    StorageState,
    StorageVersion,
)
from readapi.gojson import JSON
from readapi.selectors import Requirement, Selection
from readapi.status import ApiError


@dataclasses.dataclass(frozen=True, slots=True)
class ServedStorageState:
    """A StorageState as served: the fold's row; for a custom resource whose
    CustomResourceDefinition the ledger holds, the CustomResourceDefinition's row and the
    verdict on each version of its ``storedVersions``
    (:func:`projections.crds.stored_version_verdicts`); and the resource's last audit of
    the store, if it was audited.

    The verdicts read the resource's migrations too (the one that proved a version empty,
    the one running), so ``revision`` is the latest of the StorageState's, the
    CustomResourceDefinition's, those migrations' and the audit's revisions: every event
    that can change the object moves its ``resourceVersion``, which never goes back while
    the CustomResourceDefinition is held (a migration leaves the fold only at an event that
    stores another of the resource's migrations: a request, or a success; an audit is only
    ever replaced by a later one). A deleted CustomResourceDefinition takes its revision
    with it: the object then shows the latest of the others, older than the deletion, and
    a watch resumed from it sends again what came between (never less). Compared by
    value, so an event that changed none of them changes no served object.
    """

    storage_state: StorageState
    crd: CustomResourceDefinition | None
    verdicts: tuple[VersionVerdict, ...]
    audit: StorageAudit | None
    revision: str

    @property
    def key(self) -> ResourceKey:
        return self.storage_state.key

    @property
    def created_revision(self) -> str:
        return self.storage_state.created_revision

    @property
    def created_at(self) -> datetime:
        return self.storage_state.created_at

    @property
    def removable(self) -> tuple[str, ...]:
        """The versions of ``storedVersions`` the ledger proves no object is stored in."""
        return tuple(v.version for v in self.verdicts if v.removable)


def served_storage_state(state: State, row: StorageState) -> ServedStorageState:
    """``row`` as served in ``state``."""
    audit = state.audits.get(row.key)
    revisions = [row.revision] if audit is None else [row.revision, audit.revision]
    crd = state.custom_resources.get(row.key)
    if crd is None:
        return ServedStorageState(row, None, (), audit, max(revisions, key=Position.parse))
    migrations = [
        state.migrations[key]
        for index in (state.active_migrations_by_resource, state.inactive_migrations_by_resource)
        for key in index.get(row.key, ())
    ]
    revision = max(
        (*revisions, crd.revision, *(m.revision for m in migrations)), key=Position.parse
    )
    verdicts = stored_version_verdicts(state, row.key)
    return ServedStorageState(row, crd, verdicts, audit, revision)


Row: TypeAlias = Lease | StorageVersion | ServedStorageState | Migration

PHASE_LABEL: Final = "svledger.io/phase"
RESOURCE_LABEL: Final = "svledger.io/resource"
MIGRATED_ANNOTATION: Final = "svledger.io/objects-migrated"
TARGET_HASH_ANNOTATION: Final = "svledger.io/target-storage-version-hash"
_UID_NAMESPACE: Final = uuid.UUID("6c1f7c8e-5a0b-4f5e-9a43-3f0e2f1b7d21")


# --------------------------------------------------------------------------- views


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """One cluster's rows as the log stood after ``offset`` in its partition.

    ``time`` is the time of the view: the last applied event's for a past view, now
    for the live one; ages are measured to it.
    """

    cluster: str
    offset: int
    time: datetime
    state: State


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
        offset = Position.parse(row.created_revision).offset
        metadata: JSON = {
            "name": name,
            "uid": str(uuid.uuid5(_UID_NAMESPACE, f"{view.cluster}/{self.kind}/{name}/{offset}")),
            "resourceVersion": str(Position.parse(row.revision).offset),
            "creationTimestamp": kube_time(row.created_at),
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


def _age(row: Any, view: View) -> str:
    return human_duration((view.time - row.created_at).total_seconds())


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


def per_apiserver(entries: Sequence[ServerStorageVersion]) -> list[ServerStorageVersion]:
    """One entry per apiserver, the first of its sources in the entries' order: upstream's
    ``storageVersions`` is a list map keyed by ``apiServerID``. Where an apiserver's
    sources disagree the condition's message names them
    (:func:`projections.agreement.agreement`)."""
    seen: set[str] = set()
    shown = []
    for entry in entries:
        if entry.apiserver_id not in seen:
            seen.add(entry.apiserver_id)
            shown.append(entry)
    return shown


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
            for entry in per_apiserver(row.entries)
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
        _first_entries(per_apiserver(row.entries)),
        _age(row, view),
        row.condition.status,
        len(per_apiserver(row.entries)),
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
        _age(row, view),
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


def _storage_state_body(served: ServedStorageState, view: View) -> JSON:
    row = served.storage_state
    status: JSON = {"persistedStorageVersionHashes": list(row.persisted_storage_version_hashes)}
    if row.current_storage_version_hash is not None:
        status["currentStorageVersionHash"] = row.current_storage_version_hash
    conditions: list[JSON] = []
    if served.crd is not None:
        status["storedVersions"] = list(served.crd.stored_versions)
        status["removableStoredVersions"] = list(served.removable)
        conditions += _stored_versions_conditions(served.crd, served.verdicts)
    if served.audit is not None:
        status["lastAudit"] = _last_audit(served.audit)
        conditions += _audit_conditions(served.audit)
    if conditions:
        status["conditions"] = conditions
    return {"spec": {"resource": _group_resource(row.group, row.resource)}, "status": status}


REMOVABLE_CONDITION: Final = "StoredVersionsRemovable"
UNSAFE_PRUNE_CONDITION: Final = "StoredVersionsPrunedUnsafely"


def _stored_versions_conditions(
    crd: CustomResourceDefinition, verdicts: Sequence[VersionVerdict]
) -> list[JSON]:
    """``StoredVersionsRemovable`` while ``storedVersions`` lists a version besides the
    storage version: True if one of them can go now, each one's verdict in the message;
    ``StoredVersionsPrunedUnsafely`` while the CustomResourceDefinition carries an alarm."""
    conditions: list[JSON] = []
    others = [v for v in verdicts if v.version != crd.storage_version]
    if others:
        removable = any(v.removable for v in others)
        conditions.append(
            {
                "type": REMOVABLE_CONDITION,
                "status": "True" if removable else "False",
                "reason": "NoObjectStoredIn" if removable else "ObjectsMayBeStoredIn",
                "message": "; ".join(
                    f"{v.version} can be removed from status.storedVersions now: {v.why}"
                    if v.removable
                    else f"{v.version} stays: {v.why}"
                    for v in others
                ),
            }
        )
    if crd.prune_alarm is not None:
        conditions.append(
            {
                "type": UNSAFE_PRUNE_CONDITION,
                "status": "True",
                "reason": "PrunedWithoutProof",
                "message": crd.prune_alarm,
            }
        )
    return conditions


def _last_audit(audit: StorageAudit) -> JSON:
    """What etcd held of the resource at the audit's revision, every list in the audit's
    order and present even when empty (an audit that found nothing says so)."""
    return {
        "auditID": audit.audit_id,
        "etcdRevision": audit.etcd_revision,
        "auditedAt": kube_time(audit.audited_at),
        "objects": audit.objects,
        "bytes": audit.total_bytes,
        "versions": [
            {"version": version, "storageVersionHash": found_hash, "objects": count}
            for version, found_hash, count in zip(
                audit.versions, audit.version_hashes, audit.version_counts, strict=True
            )
        ],
        "encryptionKeys": [
            {"key": key, "objects": count}
            for key, count in zip(audit.encryption_keys, audit.encryption_counts, strict=True)
        ],
        "undecodable": audit.undecodable,
        "pollutedVersions": list(audit.polluted_versions),
    }


POLLUTED_CONDITION: Final = "StorageContradictsLedger"
KEYS_REMOVABLE_CONDITION: Final = "EncryptionKeysRemovable"


def _audit_conditions(audit: StorageAudit) -> list[JSON]:
    """``StorageContradictsLedger`` while the last audit found objects where the ledger
    holds none can be; ``EncryptionKeysRemovable`` while it found configured keys, but the
    writing one, that encrypt no object. Both stand until the next audit says otherwise:
    only an audit reads the store."""
    conditions: list[JSON] = []
    if audit.pollution is not None:
        conditions.append(
            {
                "type": POLLUTED_CONDITION,
                "status": "True",
                "reason": "ObjectsWhereNoneCanBe",
                "message": audit.pollution,
            }
        )
    if keys := removable_keys(audit):
        conditions.append(
            {
                "type": KEYS_REMOVABLE_CONDITION,
                "status": "True",
                "reason": "NoObjectEncryptedWith",
                "message": (
                    f"no object of the resource is encrypted with {', '.join(keys)} at etcd"
                    f" revision {audit.etcd_revision} (audit {audit.audit_id}): each can be"
                    " removed from the EncryptionConfiguration's providers for it"
                    f" ({audit.encryption_keys[0]} writes), once every apiserver has read the"
                    " configuration that writes with the new key"
                ),
            }
        )
    return conditions


def _group_resource(group: str, resource: str, **more: str) -> JSON:
    """Upstream's ``GroupResource`` (``GroupVersionResource`` with ``version``): the core
    group's empty name is left out (``omitempty``)."""
    return {**({"group": group} if group else {}), **more, "resource": resource}


def _storage_state_cells(served: ServedStorageState, view: View) -> list[Any]:
    row = served.storage_state
    named = versions_of_hashes(view.state, row)
    return [
        row.name,
        _hash_with_version(_none(row.current_storage_version_hash), named),
        ", ".join(_hash_with_version(h, named) for h in row.persisted_storage_version_hashes),
        _age(row, view),
        ", ".join(served.removable),
        "" if served.audit is None else f"{served.audit.objects} at {served.audit.etcd_revision}",
    ]


STORAGE_STATES: Final = Kind(
    group="migration.k8s.io",
    version="v1alpha1",
    resource="storagestates",
    kind="StorageState",
    singular="storagestate",
    namespaced=False,
    rows=lambda state: {
        key: served_storage_state(state, row) for key, row in state.storage_states.items()
    },
    name=lambda served: served.storage_state.name,
    body=_storage_state_body,
    labels=lambda served: {},
    annotations=lambda served: {},
    columns=(
        Column("Name", "string", "The StorageState's name, <resource>.<group>.", "name"),
        Column("Current", "string", "The current storageVersionHash and its version."),
        Column("Persisted", "string", "Hashes objects may still be stored in, with versions."),
        Column("Age", "string", "Time since the StorageState was created."),
        Column(
            "Removable",
            "string",
            "A custom resource's versions of status.storedVersions no object is stored in.",
            priority=1,
        ),
        Column(
            "Audited",
            "string",
            "Objects etcd held at the last audit's revision: <objects> at <etcd revision>.",
            priority=1,
        ),
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
CUSTOM_GROUPS: Final = frozenset({"migration.k8s.io"})  # served by CRDs upstream
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
        case ServedStorageState():
            return STORAGE_STATES
        case Migration():
            return STORAGE_VERSION_MIGRATIONS


def groups() -> dict[str, list[Kind]]:
    """The served kinds by group, in a stable order."""
    by_group: dict[str, list[Kind]] = {}
    for kind in KINDS:
        by_group.setdefault(kind.group, []).append(kind)
    return by_group


# --------------------------------------------------------------------------- field selectors

FIELDS: Final = ("metadata.name", "metadata.namespace")


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
