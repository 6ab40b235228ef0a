"""Capture the etcd values of ``tests/unit/test_stored.py`` from a real cluster.

Starts one etcd and one kube-apiserver (:class:`deploy.kube.cluster.LocalCluster`,
release ``DEFAULT_VERSION``, stock) storing built-in kinds in protobuf, as upstream does by
default, and encrypting three resources at rest, one per provider that needs no
plugin: Secrets with ``aescbc`` key ``key1``, ServiceAccounts with ``aesgcm`` key
``gcm-key``, LimitRanges with ``secretbox`` key ``box-key``. It creates one object of a
few kinds (a ConfigMap, a Lease, a core Event through ``events.k8s.io/v1``, a
MutatingAdmissionPolicy and its binding, a CustomResourceDefinition, a custom resource
through the non-storage version of that CRD, and one of each encrypted resource), then
saves, per object:

* its etcd key and raw value (base64);
* the ``apiVersion`` and ``kind`` the API server returns for the object read in the
  version it is stored in (CRDs, stored as ``apiextensions.k8s.io/v1beta1``, in ``v1``:
  ``v1beta1`` is no longer served), and the ``storageVersionHash`` its discovery shows
  for the resource, which must be the hash of the stored group, version and kind;
* the encoding and, for encrypted ones, the provider and key the configuration implies.

Before saving, it decodes every value under ``/registry/`` with :func:`kube.stored.decode`
and fails if one is undecodable or if a built-in object is not protobuf. Run from the
repository's root (about ten seconds once ``deploy/kube/build.py`` has built the
binaries)::

    .venv/bin/python -m tests.capture_stored_values [--output PATH]
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deploy.kube.cluster import LocalCluster
from kube.stored import EncryptedValue, StoredObject, Undecodable, decode

OUTPUT = Path(__file__).resolve().parent / "unit" / "data" / "etcd" / "stored_values.json"
NS = "default"
CRD_GROUP = "capture.svledger.io"

# Stored as JSON whatever --storage-media-type says: custom resources, and CRDs (as
# apiextensions.k8s.io/v1beta1) and APIServices, whose servers inside kube-apiserver
# store with a JSON codec of their own (LegacyCodec).
JSON = {"widgets", "customresourcedefinitions"}
JSON_GROUPS = (CRD_GROUP, "apiextensions.k8s.io", "apiregistration.k8s.io")

# resource -> (provider, key name) in the EncryptionConfiguration
ENCRYPTED = {
    "secrets": ("aescbc", "key1"),
    "serviceaccounts": ("aesgcm", "gcm-key"),
    "limitranges": ("secretbox", "box-key"),
}


def encryption_configuration() -> dict[str, Any]:
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [
            {
                "resources": [resource],
                "providers": [
                    {
                        provider: {
                            "keys": [
                                {
                                    "name": name,
                                    "secret": base64.b64encode(secrets.token_bytes(32)).decode(),
                                }
                            ]
                        }
                    },
                    {"identity": {}},
                ],
            }
            for resource, (provider, name) in ENCRYPTED.items()
        ],
    }


def crd() -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{CRD_GROUP}"},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1beta1", "served": True, "storage": False, "schema": schema},
                {"name": "v1", "served": True, "storage": True, "schema": schema},
            ],
        },
    }


# (collection to create in, body, path to read it in its stored version, discovery document
# and resource whose storageVersionHash names that version)
OBJECTS: list[tuple[str, dict[str, Any], str, str, str]] = [
    (
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        crd(),
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{CRD_GROUP}",
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
    ),
    (
        f"/api/v1/namespaces/{NS}/configmaps",
        {"metadata": {"name": "cm"}, "data": {"a": "b"}},
        f"/api/v1/namespaces/{NS}/configmaps/cm",
        "/api/v1",
        "configmaps",
    ),
    (
        f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
        {"metadata": {"name": "lease"}, "spec": {"holderIdentity": "capture"}},
        f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/lease",
        "/apis/coordination.k8s.io/v1",
        "leases",
    ),
    (  # events.k8s.io Events are stored as core v1 Events
        f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
        {
            "metadata": {"name": "event"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "svledger.io/capture",
            "reportingInstance": "capture",
            "action": "Capture",
            "reason": "Captured",
            "type": "Normal",
        },
        f"/api/v1/namespaces/{NS}/events/event",
        "/apis/events.k8s.io/v1",
        "events",
    ),
    (
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
        {
            "metadata": {"name": "policy"},
            "spec": {
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ]
                },
                "mutations": [
                    {
                        "patchType": "ApplyConfiguration",
                        "applyConfiguration": {"expression": "Object{}"},
                    }
                ],
                "reinvocationPolicy": "Never",
            },
        },
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/policy",
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingadmissionpolicies",
    ),
    (
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings",
        {"metadata": {"name": "binding"}, "spec": {"policyName": "policy"}},
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings/binding",
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingadmissionpolicybindings",
    ),
    (  # created through v1beta1, stored (as JSON, as every custom resource) in v1
        f"/apis/{CRD_GROUP}/v1beta1/namespaces/{NS}/widgets",
        {"apiVersion": f"{CRD_GROUP}/v1beta1", "kind": "Widget", "metadata": {"name": "w"}},
        f"/apis/{CRD_GROUP}/v1/namespaces/{NS}/widgets/w",
        f"/apis/{CRD_GROUP}/v1",
        "widgets",
    ),
    (
        f"/api/v1/namespaces/{NS}/secrets",
        {"metadata": {"name": "secret"}, "stringData": {"a": "b"}},
        f"/api/v1/namespaces/{NS}/secrets/secret",
        "/api/v1",
        "secrets",
    ),
    (
        f"/api/v1/namespaces/{NS}/serviceaccounts",
        {"metadata": {"name": "account"}},
        f"/api/v1/namespaces/{NS}/serviceaccounts/account",
        "/api/v1",
        "serviceaccounts",
    ),
    (
        f"/api/v1/namespaces/{NS}/limitranges",
        {"metadata": {"name": "limits"}, "spec": {"limits": [{"type": "Container"}]}},
        f"/api/v1/namespaces/{NS}/limitranges/limits",
        "/api/v1",
        "limitranges",
    ),
]


def create(cluster: LocalCluster, path: str, body: dict[str, Any]) -> None:
    deadline = time.monotonic() + 60
    while True:
        status, answer = cluster.request(path, method="POST", body=body)
        if status == 201:
            return
        # A custom resource's collection answers 404 until its CRD is established.
        if status != 404 or time.monotonic() > deadline:
            raise SystemExit(f"POST {path}: HTTP {status}: {answer[:500]!r}")
        time.sleep(0.5)


def discovery_hash(cluster: LocalCluster, document: str, resource: str) -> str:
    deadline = time.monotonic() + 60
    while True:
        status, answer = cluster.request(document)
        if status == 200:
            for entry in json.loads(answer)["resources"]:
                if entry["name"] == resource:
                    found: str = entry["storageVersionHash"]
                    return found
        if time.monotonic() > deadline:
            raise SystemExit(f"{document} shows no {resource}: HTTP {status}: {answer[:500]!r}")
        time.sleep(0.5)


def etcd_key(values: dict[str, bytes], read_path: str) -> str:
    """The one key of ``values`` the object read at ``read_path`` is stored under:
    ``/registry/[<group>/]<resource>/[<namespace>/]<name>`` (kube-apiserver keeps most
    built-in groups' resources without their group; custom resources with it)."""
    parts = read_path.strip("/").split("/")
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    tail = "/".join([rest[2], rest[1], rest[3]] if rest[0] == "namespaces" else rest[:2])
    found = [key for key in values if key.endswith("/" + tail)]
    if len(found) != 1:
        raise SystemExit(f"etcd keys ending in {tail}: {found}")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="svledger-capture-") as directory:
        config = Path(directory) / "encryption.json"
        config.write_text(json.dumps(encryption_configuration()))
        extra = [f"--encryption-provider-config={config}"]
        with LocalCluster(1, extra_apiserver_args=extra) as cluster:
            captured: list[dict[str, Any]] = []
            for collection, body, read_path, document, resource in OBJECTS:
                create(cluster, collection, body)
                returned = cluster.get_json(read_path)
                captured.append(
                    {
                        "read": read_path,
                        "returned": {
                            "apiVersion": returned["apiVersion"],
                            "kind": returned["kind"],
                        },
                        "storageVersionHash": discovery_hash(cluster, document, resource),
                        "resource": resource,
                    }
                )
            values = dict(cluster.etcd_get_prefix("/registry/"))
    check_every_value(values)
    fixtures: list[dict[str, Any]] = []
    for entry in captured:
        key = etcd_key(values, entry["read"])
        provider = ENCRYPTED.get(entry["resource"])
        encoding = "encrypted" if provider else "json" if entry["resource"] in JSON else "protobuf"
        fixtures.append(
            {
                "key": key,
                "value": base64.b64encode(values[key]).decode(),
                "returned": entry["returned"],
                "storageVersionHash": entry["storageVersionHash"],
                "encoding": encoding,
                "encryption": (
                    {"provider": provider[0], "providerVersion": "v1", "keyName": provider[1]}
                    if provider
                    else None
                ),
            }
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(fixtures, indent=1) + "\n")
    size = sum(len(values[entry["key"]]) for entry in fixtures)
    for entry in fixtures:
        print(f"{len(values[entry['key']]):6} {entry['key']}")
    print(f"{len(fixtures)} values, {size} bytes, written to {args.output}")
    return 0


def check_every_value(values: dict[str, bytes]) -> None:
    """Every value under /registry/ decodes; built-in kinds are protobuf (but JSON_GROUPS')."""
    counts: collections.Counter[str] = collections.Counter()
    failed = []
    for key, value in values.items():
        match decode(key, value):
            case Undecodable() as undecodable:
                failed.append(str(undecodable))
            case StoredObject(encoding=encoding, api_version=version, kind=kind):
                counts[f"{encoding} {version} {kind}"] += 1
            case EncryptedValue(provider=provider, key_name=name):
                counts[f"encrypted {provider} {name}"] += 1
    for line, count in sorted(counts.items()):
        print(f"{count:4} {line}")
    if failed:
        raise SystemExit("undecodable values:\n" + "\n".join(failed))
    json_builtins = [
        c for c in counts if c.startswith("json ") and not c.split()[1].startswith(JSON_GROUPS)
    ]
    if json_builtins:
        raise SystemExit(f"built-in kinds stored as JSON, not protobuf: {json_builtins}")


if __name__ == "__main__":
    sys.exit(main())
