"""The values kube-apiserver keeps in etcd: which kind, in which version, in which encoding.

Each object lives under one etcd key (``/registry/<resource>/[<namespace>/]<name>``), its
value in one of these forms, told apart by their first bytes:

* **protobuf** (``--storage-media-type=application/vnd.kubernetes.protobuf``, upstream's
  default for built-in kinds): the envelope of :mod:`kube.protobuf`, ``k8s\\0`` then a
  ``runtime.Unknown`` whose ``typeMeta`` names the stored ``apiVersion`` and ``kind``;
* **JSON** (``--storage-media-type=application/json``; custom resources always): the
  object's JSON, starting ``{``, with ``apiVersion`` and ``kind`` among its members;
* **encrypted at rest** (``--encryption-provider-config``): the prefix
  ``k8s:enc:<provider>:<v1|v2>:<name>:`` then ciphertext. The provider is named as an
  EncryptionConfiguration names it (``aescbc``, ``aesgcm``, ``secretbox``, ``kms``, the
  last with ``v1`` or ``v2``), the name is the key's (for ``kms``, the provider's). The
  kind and version are inside the ciphertext and stay unread: this module decrypts
  nothing. ``identity`` writes values unchanged, so they read as protobuf or JSON.

:func:`decode` says which, for one value, and never raises: a value it cannot read is an
:class:`Undecodable` naming the key, a :class:`Reason` and the offending bytes, so a scan
over thousands of keys reports it and goes on. The version is the one the value was
*written* in, the fact a storage migration changes; an object of one API group can be
stored as another's (``events.k8s.io`` Events are stored as core ``v1`` Events).

A protobuf value cut short anywhere is undecodable (the envelope ends with a field
kube-apiserver always writes), and so is a JSON value cut before its closing brace. An
encrypted value's ciphertext is not looked into, so one cut after its prefix still reads
as encrypted (the API server fails to decrypt it).

Known limits, each reported as an :class:`Undecodable` rather than guessed:

* CBOR (``application/cbor``, behind the alpha ``CBORServingAndStorage`` gate) is
  recognised by its self-describing tag and not read;
* YAML storage (``application/yaml``, accepted by the flag, unseen in practice) is not
  recognised;
* upstream lets an ``aescbc``, ``aesgcm`` or ``secretbox`` key's name, and a kms ``v1``
  provider's name, contain ``:``; the ciphertext after the prefix is arbitrary bytes, so
  without the EncryptionConfiguration such a name cannot be told from the ciphertext and
  is reported up to its first ``:``.

Pure: no I/O.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, TypeAlias

from kube.protobuf import MAGIC, ProtobufError, unwrap
from ledger.names import split_group_version

ENCRYPTED: Final = b"k8s:enc:"
# The first bytes of upstream's CBOR encoding: the self-described CBOR tag (RFC 8949 3.4.6).
_CBOR: Final = b"\xd9\xd9\xf7"
_SHOWN: Final = 40  # bytes of an undecodable value shown in its detail

Provider: TypeAlias = Literal["aescbc", "aesgcm", "secretbox", "kms"]
ProviderVersion: TypeAlias = Literal["v1", "v2"]
# The provider and version of each prefix upstream writes (``k8s.io/apiserver/pkg/server/
# options/encryptionconfig``): k8s:enc:<provider>:<version>:<name>:
_PROVIDERS: Final[dict[tuple[bytes, bytes], tuple[Provider, ProviderVersion]]] = {
    (b"aescbc", b"v1"): ("aescbc", "v1"),
    (b"aesgcm", b"v1"): ("aesgcm", "v1"),
    (b"secretbox", b"v1"): ("secretbox", "v1"),
    (b"kms", b"v1"): ("kms", "v1"),
    (b"kms", b"v2"): ("kms", "v2"),
}


class Reason(enum.StrEnum):
    """Why a value cannot be read."""

    EMPTY = "Empty"
    #: The first bytes are none of the forms above.
    UNKNOWN_ENCODING = "UnknownEncoding"
    #: A form kube-apiserver can write but this module does not read (CBOR).
    UNSUPPORTED_ENCODING = "UnsupportedEncoding"
    #: ``k8s\0`` then bytes that are no whole ``runtime.Unknown``: truncated or corrupt.
    CORRUPT_PROTOBUF = "CorruptProtobuf"
    #: ``{`` then bytes that are not a JSON object.
    CORRUPT_JSON = "CorruptJSON"
    #: A readable envelope or JSON object without a valid ``apiVersion`` or ``kind``.
    MISSING_TYPE = "MissingType"
    #: ``k8s:enc:`` without a provider, version and name upstream writes.
    UNKNOWN_ENCRYPTION = "UnknownEncryption"


@dataclass(frozen=True)
class StoredObject:
    """A value kube-apiserver wrote in the clear: the kind and the version it was stored as."""

    key: str
    encoding: Literal["protobuf", "json"]
    api_version: str  # group-qualified as upstream writes it: ``apps/v1``, ``v1`` for core
    kind: str

    @property
    def group(self) -> str:
        """The API group, ``""`` for core."""
        return split_group_version(self.api_version)[0]

    @property
    def version(self) -> str:
        """The version within the group: ``v1``."""
        return split_group_version(self.api_version)[1]


@dataclass(frozen=True)
class EncryptedValue:
    """A value encrypted at rest: by which provider and key, as its prefix says."""

    encoding: ClassVar[Literal["encrypted"]] = "encrypted"
    key: str
    provider: Provider
    provider_version: ProviderVersion  # ``v2`` only for kms
    key_name: str  # the key's name; for kms the provider's


@dataclass(frozen=True)
class Undecodable:
    """A value that cannot be read, under ``key``: why, with the offending bytes."""

    key: str
    reason: Reason
    detail: str

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}: {self.detail}"


Stored: TypeAlias = StoredObject | EncryptedValue | Undecodable


def decode(key: str, value: bytes) -> Stored:
    """What the value ``value`` stored under etcd key ``key`` is; never raises."""
    if not value:
        return Undecodable(key, Reason.EMPTY, "the value is empty")
    if value.startswith(MAGIC):
        return _protobuf(key, value)
    if value.startswith(b"{"):
        return _json(key, value)
    if value.startswith(ENCRYPTED):
        return _encrypted(key, value)
    if value.startswith(_CBOR):
        return Undecodable(
            key,
            Reason.UNSUPPORTED_ENCODING,
            f"the value is CBOR (--storage-media-type=application/cbor), which is not read"
            f" here: {_shown(value)}",
        )
    return Undecodable(
        key,
        Reason.UNKNOWN_ENCODING,
        f"the value starts with none of {MAGIC!r} (protobuf), b'{{' (JSON) or {ENCRYPTED!r}"
        f" (encrypted at rest): {_shown(value)}",
    )


def _protobuf(key: str, value: bytes) -> Stored:
    try:
        envelope = unwrap(value)
    except ProtobufError as error:
        return Undecodable(
            key,
            Reason.CORRUPT_PROTOBUF,
            f"the protobuf envelope is truncated or corrupt ({error}), {len(value)} bytes:"
            f" {_shown(value)}",
        )
    if envelope.content_type is None:
        return Undecodable(
            key,
            Reason.CORRUPT_PROTOBUF,
            f"the protobuf envelope is truncated: it ends before its contentType, which"
            f" kube-apiserver always writes, {len(value)} bytes: {_shown(value)}",
        )
    return _object(key, "protobuf", envelope.api_version, envelope.kind)


def _json(key: str, value: bytes) -> Stored:
    try:
        document = json.loads(value)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        return Undecodable(
            key, Reason.CORRUPT_JSON, f"the value is not JSON ({error}): {_shown(value)}"
        )
    if not isinstance(document, dict):
        return Undecodable(
            key, Reason.CORRUPT_JSON, f"the JSON value is not an object: {_shown(value)}"
        )
    return _object(key, "json", document.get("apiVersion"), document.get("kind"))


def _object(key: str, encoding: Literal["protobuf", "json"], api_version: Any, kind: Any) -> Stored:
    """The object named by ``apiVersion`` and ``kind`` as the value holds them."""
    where = "envelope's typeMeta" if encoding == "protobuf" else "JSON object"
    for name, text in (("apiVersion", api_version), ("kind", kind)):
        if not isinstance(text, str) or not text:
            return Undecodable(
                key, Reason.MISSING_TYPE, f"the {where} has no {name} (it holds {text!r})"
            )
    try:
        split_group_version(api_version)
    except ValueError as error:
        return Undecodable(key, Reason.MISSING_TYPE, f"the {where}'s apiVersion: {error}")
    if "/" in kind:  # a kind never has one, and group/version/kind would hash ambiguously
        return Undecodable(key, Reason.MISSING_TYPE, f"the {where}'s kind {kind!r} contains '/'")
    return StoredObject(key, encoding, api_version, kind)


def _encrypted(key: str, value: bytes) -> Stored:
    # k8s:enc:<provider>:<version>:<name>:<ciphertext>. The ciphertext may hold any byte,
    # ':' included, so only the first three fields after "k8s:enc:" are split off.
    fields = value[len(ENCRYPTED) :].split(b":", 3)
    if len(fields) < 4 or not fields[2]:
        return Undecodable(
            key,
            Reason.UNKNOWN_ENCRYPTION,
            f"the value starts with {ENCRYPTED!r} but not <provider>:<version>:<name>:"
            f" {_shown(value)}",
        )
    known = _PROVIDERS.get((fields[0], fields[1]))
    if known is None:
        return Undecodable(
            key,
            Reason.UNKNOWN_ENCRYPTION,
            f"encryption provider {fields[0]!r} {fields[1]!r} is none of upstream's"
            f" ({', '.join(f'{p} {v}' for p, v in _PROVIDERS.values())}): {_shown(value)}",
        )
    return EncryptedValue(key, *known, fields[2].decode("utf-8", "backslashreplace"))


def _shown(value: bytes) -> str:
    """The first bytes of ``value``, for a message."""
    return repr(value[:_SHOWN]) + ("..." if len(value) > _SHOWN else "")
