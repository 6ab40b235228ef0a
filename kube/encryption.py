"""Which encryption keys the apiservers' ``EncryptionConfiguration`` names for a resource.

kube-apiserver encrypts the values it writes to etcd as its
``--encryption-provider-config`` says (``apiserver.config.k8s.io/v1``
``EncryptionConfiguration``): each entry of ``resources`` names resources
(``secrets``, ``deployments.apps``, ``*.apps``, ``*.*``) and lists providers in order.
The first provider (its first key) encrypts every write; the others only decrypt what
they encrypted before. A value says what encrypted it in its prefix,
``k8s:enc:<provider>:<version>:<key name>:`` (:mod:`kube.stored`), and ``identity``
values are stored in the clear.

:func:`keys_for` gives, for one resource, every provider and key the configuration lists,
in its order, labelled as the audit labels values (``aescbc:v1:key2``, ``kms:v2:vault``,
``identity``), so an audit can count keys that encrypt nothing (0) and say that such a
key, but the first, can leave the configuration. The first entry that matches a resource
is the one kube-apiserver uses, as upstream matches them.

Pure: it reads a parsed document, not the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ledger.errors import UsageError

KIND: Final = "EncryptionConfiguration"
API_VERSIONS: Final = frozenset({"apiserver.config.k8s.io/v1", "apiserver.k8s.io/v1"})
IDENTITY: Final = "identity"
# Providers whose keys are listed under ``keys``, and the version their values carry.
KEYED: Final = {"aescbc": "v1", "aesgcm": "v1", "secretbox": "v1"}


class EncryptionConfigError(UsageError):
    """An EncryptionConfiguration that is not one kube-apiserver reads."""


def keys_for(config: Mapping[str, Any], group: str, resource: str) -> tuple[str, ...]:
    """The providers and keys ``config`` lists for ``group``/``resource``, in its order
    (the first writes); ``()`` if no entry names the resource (stored in the clear)."""
    _check(config)
    for entry in config.get("resources") or ():
        if any(_matches(name, group, resource) for name in entry.get("resources") or ()):
            return tuple(
                label for provider in entry.get("providers") or () for label in _labels(provider)
            )
    return ()


def _check(config: Mapping[str, Any]) -> None:
    if config.get("kind") != KIND or config.get("apiVersion") not in API_VERSIONS:
        raise EncryptionConfigError(
            f"an {KIND} (apiVersion apiserver.config.k8s.io/v1) is expected, not kind"
            f" {config.get('kind')!r} of apiVersion {config.get('apiVersion')!r}; give the file"
            " kube-apiserver reads with --encryption-provider-config"
        )


def _matches(name: str, group: str, resource: str) -> bool:
    """Whether a ``resources`` name (``secrets``, ``deployments.apps``, ``*.apps``,
    ``*.*``; ``*.`` is every core resource) designates ``group``/``resource``."""
    wanted_resource, _, wanted_group = name.partition(".")
    return wanted_resource in ("*", resource) and (
        wanted_group == group or (wanted_group == "*" and name == "*.*")
    )


def _labels(provider: Mapping[str, Any]) -> list[str]:
    """The labels of one provider's keys, as :mod:`kube.audit` labels values."""
    labels = []
    for kind, spec in provider.items():
        if kind == IDENTITY:
            labels.append(IDENTITY)
        elif kind in KEYED:
            labels += [
                f"{kind}:{KEYED[kind]}:{key['name']}" for key in (spec or {}).get("keys") or ()
            ]
        elif kind == "kms":
            version = (spec or {}).get("apiVersion", "v1")
            labels.append(f"kms:{version}:{(spec or {}).get('name')}")
        else:
            raise EncryptionConfigError(
                f"provider {kind!r} is not one kube-apiserver knows (aescbc, aesgcm, secretbox,"
                " kms, identity)"
            )
    return labels
