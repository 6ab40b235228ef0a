"""The served kinds' schemas as OpenAPI v3, which ``kubectl explain`` reads.

kube-apiserver publishes its schemas per group version: ``/openapi/v3`` lists the group
versions, each with a ``serverRelativeURL`` (carrying a ``hash`` of the document, so a
client may cache it), and that URL answers an OpenAPI 3.0 document whose
``components.schemas`` hold every kind of the group version, each marked with its
``x-kubernetes-group-version-kind``. kubectl finds a resource's kind by discovery, then
its schema by that mark. This module builds the same documents for the four kinds of
:mod:`readapi.kinds`.

The schemas describe what this API serves, field for field (``tests/unit/test_openapi.py``
checks every served object against them), in upstream's type names and JSON shapes;
their descriptions say what each field means in the ledger. A field upstream's types
have and the ledger never fills (``ObjectMeta.generation``, ``Lease.spec.acquireTime``,
...) is left out rather than described as always empty.

The ``serverRelativeURL`` is the whole path from the server's root, the cluster's prefix
(``/clusters/CLUSTER``, or a past view's ``/clusters/CLUSTER/at/POINT``) included,
because client-go requests it as is rather than below the path it was configured with.

The documents are served as upstream's handler serves them, in JSON only: a document's
ETag is its hash, and a client that has it (``If-None-Match``, read as Go's
``ServeContent`` reads it: a list, weak tags matching too) gets a 304; asked with the
current ``hash``, as the index links it, a document is ``Cache-Control: public,
immutable`` and kept for a year, and asked with a stale one it is a 301 to the current
one's URL.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from aiohttp import web

from readapi.clusters import check_cluster
from readapi.gojson import JSON
from readapi.kinds import KINDS, Kind, groups
from readapi.responses import json_response, no_such_path

_META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1"
OBJECT_META: Final = f"{_META}.ObjectMeta"
LIST_META: Final = f"{_META}.ListMeta"
_COMPONENT_PREFIX: Final = "#/components/schemas/"


def _string(description: str, **more: Any) -> JSON:
    return {"type": "string", "description": description, **more}


def _time(description: str) -> JSON:
    return _string(description, format="date-time")


def _integer(description: str, bits: int = 32) -> JSON:
    return {"type": "integer", "format": f"int{bits}", "description": description}


def _strings(description: str) -> JSON:
    return {"type": "array", "items": {"type": "string", "default": ""}, "description": description}


def _string_map(description: str) -> JSON:
    return {
        "type": "object",
        "additionalProperties": {"type": "string", "default": ""},
        "description": description,
    }


def _ref(name: str, description: str) -> JSON:
    """A reference to component ``name``, wrapped as upstream's documents wrap one, so
    the field keeps a description of its own."""
    return {
        "allOf": [{"$ref": _COMPONENT_PREFIX + name}],
        "default": {},
        "description": description,
    }


def _object(description: str, properties: JSON, required: tuple[str, ...] = ()) -> JSON:
    schema: JSON = {"type": "object", "description": description, "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def _list_map(schema: JSON, key: str) -> JSON:
    """An array ``schema`` marked as upstream's ``+listType=map`` with ``key``."""
    return {**schema, "x-kubernetes-list-map-keys": [key], "x-kubernetes-list-type": "map"}


def _kind_fields(kind: Kind) -> JSON:
    return {
        "apiVersion": _string(f"The schema of this object: {kind.api_version}."),
        "kind": _string(f"The kind of this object: {kind.kind}."),
        "metadata": _ref(OBJECT_META, "Standard object metadata; see ObjectMeta."),
    }


_GROUP_RESOURCE: Final = {
    "group": _string("The API group; left out for the core group."),
    "resource": _string("The resource, plural and lower case, e.g. deployments."),
}

_SHARED: Final[JSON] = {
    OBJECT_META: _object(
        "Metadata of a served object. Every object is read-only: the ledger's producers "
        "append events, and the views are folded from them.",
        {
            "name": _string("The object's name, unique within its kind (and namespace)."),
            "namespace": _string("kube-system for the apiserver identity leases; unset otherwise."),
            "uid": _string(
                "Derived from the cluster, kind, name and the log offset of the event that "
                "created the object, so an object deleted and created again gets a new one."
            ),
            "resourceVersion": _string(
                "The log offset, in the cluster's partition, of the event that last "
                "changed the object. Opaque to clients, as in Kubernetes."
            ),
            "creationTimestamp": {
                **_time("The time of the event that created the object; null when not known."),
                "nullable": True,
            },
            "labels": _string_map(
                "Labels, as upstream sets them; svledger.io/ ones are the ledger's."
            ),
            "annotations": _string_map("Annotations; svledger.io/ ones are the ledger's."),
        },
    ),
    LIST_META: _object(
        "Metadata of a list.",
        {
            "resourceVersion": _string("The log offset the view is folded up to."),
            "continue": _string("Set when there are more items: pass it to get the next page."),
            "remainingItemCount": {
                "type": "integer",
                "format": "int64",
                "description": "How many items follow this page, when known.",
            },
        },
    ),
}


class _Package:
    """The components of one kind's Go package: each named type a component of its own,
    so kubectl prints a field's type by name, as for upstream's."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.components: JSON = {}

    def define(self, name: str, schema: JSON) -> str:
        self.components[f"{self.package}.{name}"] = schema
        return f"{self.package}.{name}"

    def field(self, name: str, schema: JSON, description: str) -> JSON:
        """A field of type ``name``, defined here as ``schema``."""
        return _ref(self.define(name, schema), description)

    def array(self, name: str, schema: JSON, description: str) -> JSON:
        """An array field of items of type ``name``, defined here as ``schema``."""
        item = {"$ref": _COMPONENT_PREFIX + self.define(name, schema), "default": {}}
        return {"type": "array", "items": item, "description": description}


def _storage_version(kind: Kind, package: _Package) -> JSON:
    entry = _object(
        "What one API server reported for the resource.",
        {
            "apiServerID": _string("The ID of the API server (its identity lease's name)."),
            "encodingVersion": _string("The version it encodes objects in when it writes them."),
            "decodableVersions": _strings(
                "The versions it can decode; includes the encoding version."
            ),
            "servedVersions": _strings(
                "The versions it serves the resource in; left out when it reported none."
            ),
        },
        ("apiServerID", "encodingVersion", "decodableVersions"),
    )
    # As upstream's types mark them (+listType): kubectl explain and apply read these.
    entry["properties"]["decodableVersions"]["x-kubernetes-list-type"] = "set"
    entry["properties"]["servedVersions"]["x-kubernetes-list-type"] = "set"
    condition = _object(
        "The state of the agreement.",
        {
            "type": _string("AllEncodingVersionsEqual."),
            "status": _string("True when every API server reports the same encoding version."),
            "lastTransitionTime": _time("The time of the ledger event that last flipped status."),
            "reason": _string("CommonEncodingVersionSet or CommonEncodingVersionUnset."),
            "message": _string("The reason, for humans."),
        },
        ("type", "status", "reason", "message"),
    )
    status = _object(
        "The reports and the agreement folded from them.",
        {
            "storageVersions": _list_map(
                package.array("ServerStorageVersion", entry, "One entry per reporting API server."),
                "apiServerID",
            ),
            "commonEncodingVersion": _string(
                "The encoding version every API server reports; left out while they disagree."
            ),
            "conditions": _list_map(
                package.array(
                    "StorageVersionCondition", condition, "The AllEncodingVersionsEqual condition."
                ),
                "type",
            ),
        },
    )
    return _object(
        "The storage versions API server instances report for one resource (KEP-2339), "
        "folded from the ledger: an entry per API server with a live identity lease.",
        {
            **_kind_fields(kind),
            "spec": package.field(
                "StorageVersionSpec", _object("Empty.", {}), "Always empty, as upstream's."
            ),
            "status": package.field(
                "StorageVersionStatus", status, "The API servers' reports and whether they agree."
            ),
        },
        ("metadata",),  # as upstream's document marks it
    )


def _lease(kind: Kind, package: _Package) -> JSON:
    spec = _object(
        "Who holds the lease, for how long, and when it was last renewed.",
        {
            "holderIdentity": _string(
                "The holder, <apiserver ID>_<UUID>: a new UUID on every start of the server; "
                "left out when the lease has none."
            ),
            "leaseDurationSeconds": _integer("Seconds the lease stays valid after its renew time."),
            "renewTime": _time("When the holder last renewed the lease, to the microsecond."),
        },
    )
    return _object(
        "An API server's identity lease (KEP-1965) as the ledger last saw it renewed: "
        "its name is the API server's ID, its host name is in the kubernetes.io/hostname "
        "label. A lease that expired or was released is gone.",
        {**_kind_fields(kind), "spec": package.field("LeaseSpec", spec, "The lease's term.")},
    )


def _storage_state(kind: Kind, package: _Package) -> JSON:
    resource = package.field(
        "GroupResource", _object("A resource.", dict(_GROUP_RESOURCE)), "The resource."
    )
    condition = _object(
        "What the ledger makes of the CustomResourceDefinition's storedVersions, and what "
        "the last audit of the store says against the ledger.",
        {
            "type": _string(
                "StoredVersionsRemovable: whether a version of storedVersions besides the "
                "storage version can leave it now (left out when there is none); "
                "StoredVersionsPrunedUnsafely: a version left storedVersions while objects "
                "may still have been stored in it; StorageContradictsLedger: the last audit "
                "found objects stored in a version the ledger holds none can be stored in; "
                "EncryptionKeysRemovable: the last audit found configured encryption keys, "
                "but the writing one, that encrypt no object of the resource."
            ),
            "status": _string(
                "True or False; only StoredVersionsRemovable is ever False, the others are "
                "left out when they do not hold. StoredVersionsPrunedUnsafely stands until a "
                "migration proves the store clean, the audit's two until the next audit."
            ),
            "reason": _string(
                "NoObjectStoredIn, ObjectsMayBeStoredIn, PrunedWithoutProof, "
                "ObjectsWhereNoneCanBe or NoObjectEncryptedWith."
            ),
            "message": _string(
                "Each version's verdict and the ledger positions it rests on, the alarm, "
                "or the keys that can go and the one that writes."
            ),
        },
        ("type", "status", "reason", "message"),
    )
    audited_version = _object(
        "The objects stored in one version.",
        {
            "version": _string("The version, <group>/<version> (v1 for the core group)."),
            "storageVersionHash": _string("Its storageVersionHash, as discovery gives it."),
            "objects": _integer("Objects stored in it.", 64),
        },
        ("version", "storageVersionHash", "objects"),
    )
    audited_key = _object(
        "The objects one encryption key encrypts.",
        {
            "key": _string(
                "The key, <provider>:<name> as the EncryptionConfiguration names it "
                "(identity for values stored in the clear)."
            ),
            "objects": _integer("Objects it encrypts; 0 for a configured key none uses.", 64),
        },
        ("key", "objects"),
    )
    audit = _object(
        "What etcd held of the resource at one revision, read by svledger audit.",
        {
            "auditID": _string("The audit's ID (a UUID), shared by every resource it counted."),
            "etcdRevision": _integer("The etcd revision every page was read at.", 64),
            "auditedAt": _time("The time of the audit's event in the ledger."),
            "objects": _integer("Values etcd held under the resource's keys.", 64),
            "bytes": _integer("Their stored size, in bytes.", 64),
            "versions": package.array(
                "StorageAuditVersion",
                audited_version,
                "The objects per version they are stored in, sorted by version; an "
                "encrypted object's version is not read, so it is counted under its key.",
            ),
            "encryptionKeys": package.array(
                "StorageAuditEncryptionKey",
                audited_key,
                "The objects per encryption key. Given the API servers' "
                "EncryptionConfiguration, every key it lists for the resource, in its order "
                "(the first encrypts every write), 0 counts included; without it, the keys "
                "found, sorted.",
            ),
            "undecodable": _integer(
                "Values neither an object nor an encrypted value kube-apiserver writes.", 64
            ),
            "pollutedVersions": _strings(
                "The versions objects were found stored in that the ledger holds none can "
                "be: neither before nor after the audit's read did it hold their hash."
            ),
        },
        (
            "auditID", "etcdRevision", "auditedAt", "objects", "bytes", "versions",
            "encryptionKeys", "undecodable", "pollutedVersions",
        ),
    )  # fmt: skip
    status = _object(
        "storageVersionHash values, as discovery gives them for versions of the resource; "
        "for a custom resource, its CustomResourceDefinition's storedVersions as the ledger "
        "judges them; for an audited one, what its last audit found in etcd.",
        {
            "currentStorageVersionHash": _string(
                "The storageVersionHash of the version the API servers agree on; left out "
                "until they first do."
            ),
            "persistedStorageVersionHashes": _strings(
                "Hashes of every version objects may still be stored in; Unknown while "
                "objects may be stored in a version the ledger never saw, until a "
                "migration has rewritten every object."
            ),
            "storedVersions": _strings(
                "A custom resource's: its CustomResourceDefinition's status.storedVersions, "
                "as the ledger last observed them; left out for a resource of no "
                "CustomResourceDefinition the ledger holds."
            ),
            "removableStoredVersions": _strings(
                "The versions of storedVersions no object can be stored in, as the ledger "
                "proves: a migration rewrote every object while every API server encoded "
                "the storage version, and none has encoded them since. They can leave "
                "storedVersions, then spec.versions. Present with storedVersions; empty "
                "when none can go."
            ),
            "lastAudit": package.field(
                "StorageAudit",
                audit,
                "The resource's last audit of the store (svledger audit), next to what the "
                "ledger infers; left out for a resource never audited.",
            ),
            "conditions": _list_map(
                package.array(
                    "StorageStateCondition",
                    condition,
                    "A custom resource's StoredVersionsRemovable and "
                    "StoredVersionsPrunedUnsafely conditions, an audited resource's "
                    "StorageContradictsLedger and EncryptionKeysRemovable; left out when none "
                    "holds.",
                ),
                "type",
            ),
        },
    )
    return _object(
        "The storage versions objects of one resource may be stored in, as "
        "kube-storage-version-migrator keeps them.",
        {
            **_kind_fields(kind),
            "spec": package.field(
                "StorageStateSpec",
                _object("Which resource the state is of.", {"resource": resource}),
                "The resource.",
            ),
            "status": package.field(
                "StorageStateStatus",
                status,
                "The current and the persisted hashes; for a custom resource, which versions "
                "can leave its CustomResourceDefinition's storedVersions; for an audited one, "
                "its last audit.",
            ),
        },
    )


def _migration(kind: Kind, package: _Package) -> JSON:
    condition = _object(
        "The migration's state.",
        {
            "type": _string("Running, Succeeded or Failed."),
            "status": _string("True."),
            "lastUpdateTime": _time("The time of the ledger event that set it."),
            "reason": _string("Why it failed; Cancelled for a cancelled migration."),
            "message": _string("What happened, for humans."),
        },
        ("type", "status"),
    )
    resource = _object(
        "A resource, with the version objects are rewritten in.",
        {
            "group": _GROUP_RESOURCE["group"],
            "version": _string("The version objects are rewritten in."),
            "resource": _GROUP_RESOURCE["resource"],
        },
    )
    spec = _object(
        "The resource a migration rewrites, and where it goes on.",
        {
            "resource": package.field(
                "GroupVersionResource", resource, "The resource and the version it is migrated to."
            ),
            "continueToken": _string("Where a resumed migration goes on listing."),
        },
        ("resource",),  # as the upstream CRD requires
    )
    status = _object(
        "How far the migration is.",
        {
            "conditions": package.array(
                "MigrationCondition", condition, "The condition of the migration's phase."
            )
        },
    )
    return _object(
        "A storage migration of one resource: every object rewritten in the version the "
        "API servers agree on. The ledger's phase (Pending, Running, Succeeded, Failed, "
        "Cancelled) is in the svledger.io/phase label.",
        {
            **_kind_fields(kind),
            "spec": package.field("StorageVersionMigrationSpec", spec, "What is migrated."),
            "status": package.field(
                "StorageVersionMigrationStatus", status, "Empty while the migration is pending."
            ),
        },
    )


_SCHEMAS: Final = {
    "StorageVersion": ("io.k8s.api.apiserverinternal.v1alpha1", _storage_version),
    "Lease": ("io.k8s.api.coordination.v1", _lease),
    "StorageState": ("io.k8s.migration.v1alpha1", _storage_state),
    "StorageVersionMigration": ("io.k8s.migration.v1alpha1", _migration),
}


def component_name(kind: Kind) -> str:
    """The name of ``kind``'s schema in its group version's document."""
    return f"{_SCHEMAS[kind.kind][0]}.{kind.kind}"


def _mark(kind: Kind, name: str) -> list[JSON]:
    return [{"group": kind.group, "kind": name, "version": kind.version}]


def _list(kind: Kind) -> JSON:
    return _object(
        f"A list of {kind.kind} objects.",
        {
            "apiVersion": _string(f"The schema of this list: {kind.api_version}."),
            "kind": _string(f"{kind.kind}List."),
            "metadata": _ref(LIST_META, "Standard list metadata; see ListMeta."),
            "items": {
                "type": "array",
                "items": _ref(component_name(kind), f"A {kind.kind}."),
                "description": f"The {kind.resource}.",
            },
        },
        ("items",),
    )


def _operation(kind: Kind, action: str, schema: str, path: str) -> JSON:
    """A read operation as upstream's documents list it: kubectl explain finds a
    resource's kind through the ``x-kubernetes-group-version-kind`` of its path's get."""
    what = (
        f"list or watch objects of kind {kind.kind}"
        if action == "list"
        else f"read the specified {kind.kind}"
    )
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in ("namespace", "name")
        if "{" + name + "}" in path
    ]
    operation: JSON = {
        "description": what,
        "operationId": f"{action}{kind.kind}",
        "responses": {
            "200": {
                "description": "OK",
                "content": {
                    media: {"schema": {"$ref": _COMPONENT_PREFIX + schema}}
                    for media in ("application/json", "application/yaml")
                },
            }
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _mark(kind, kind.kind)[0],
    }
    if parameters:
        operation["parameters"] = parameters
    return {"get": operation}


def _paths(kind: Kind) -> JSON:
    scope = "/namespaces/{namespace}" if kind.namespaced else ""
    collection = f"/apis/{kind.group}/{kind.version}{scope}/{kind.resource}"
    name = component_name(kind)
    return {
        collection: _operation(kind, "list", f"{name}List", collection),
        f"{collection}/{{name}}": _operation(kind, "get", name, f"{collection}/{{name}}"),
    }


def group_version_paths() -> list[str]:
    """The group versions with a document, as ``/openapi/v3`` lists them."""
    return sorted({f"apis/{kind.group}/{kind.version}" for kind in KINDS})


def document(path: str) -> bytes | None:
    """The OpenAPI v3 document of group version ``path`` (``apis/GROUP/VERSION``), as
    served; None for a path that has none (checked before the cache, which so holds only
    the few real documents, whatever paths clients ask for)."""
    return _document(path) if path in group_version_paths() else None


@functools.cache
def _document(path: str) -> bytes:
    _, group, version = path.split("/")
    schemas: JSON = dict(_SHARED)
    paths: JSON = {}
    for kind in groups()[group]:
        if kind.version != version:
            continue
        name = component_name(kind)
        package_name, build = _SCHEMAS[kind.kind]
        package = _Package(package_name)
        schemas[name] = {
            **build(kind, package),
            "x-kubernetes-group-version-kind": _mark(kind, kind.kind),
        }
        schemas.update(package.components)
        paths.update(_paths(kind))
        schemas[f"{name}List"] = {
            **_list(kind),
            "x-kubernetes-group-version-kind": _mark(kind, f"{kind.kind}List"),
        }
    body = {
        "openapi": "3.0.0",
        "info": {"title": "svledger", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    return json.dumps(body, sort_keys=True).encode()


@functools.cache
def document_hash(path: str) -> str:
    """The hash of a served document (:func:`document`), as upstream's: SHA-512, in hex."""
    return hashlib.sha512(_document(path)).hexdigest().upper()


def document_url(prefix: str, path: str) -> str:
    """Where the current document of ``path`` is, below ``prefix`` (the request's path
    up to ``/openapi``): with its hash, so a client may keep it for good."""
    return f"{prefix}/openapi/v3/{path}?hash={document_hash(path)}"


def index(prefix: str) -> JSON:
    """``/openapi/v3`` below ``prefix`` (the request's path up to ``/openapi``)."""
    return {
        "paths": {
            path: {"serverRelativeURL": document_url(prefix, path)}
            for path in group_version_paths()
        }
    }


# --------------------------------------------------------------------------- handlers


async def handle_index(request: web.Request) -> web.StreamResponse:
    check_cluster(request)
    return json_response(index(request.path.removesuffix("/openapi/v3")))


async def handle_document(request: web.Request) -> web.StreamResponse:
    """A group version's OpenAPI v3 document, as upstream's handler serves one: its
    ETag the document's hash, 304 to a client that has it; asked with the current
    ``hash`` (as the index links it), cacheable for a year; with another, a 301 to the
    current one's URL."""
    check_cluster(request)
    path = request.match_info["path"]
    body = document(path)
    if body is None:
        raise no_such_path(request)
    current = document_hash(path)
    headers = {"ETag": f'"{current}"', "Vary": "Accept"}
    if asked := request.query.get("hash"):
        if asked != current:
            prefix = request.path.removesuffix(f"/openapi/v3/{path}")
            raise web.HTTPMovedPermanently(document_url(prefix, path))
        headers["Cache-Control"] = "public, immutable"
        headers["Expires"] = email.utils.format_datetime(
            datetime.now(UTC) + timedelta(days=365), usegmt=True
        )
    # As Go's http.ServeContent reads it: a list, weak tags matching too.
    held = {
        tag.strip().removeprefix("W/")
        for tag in request.headers.get("If-None-Match", "").split(",")
    }
    if held & {headers["ETag"], "*"}:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type="application/json", headers=headers)
