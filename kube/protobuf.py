"""Kubernetes' protobuf encoding: its envelope, and messages declared at run time.

kube-apiserver writes an object in protobuf (``apimachinery/pkg/runtime/serializer/
protobuf``), to a client or to etcd, as the four bytes ``k8s\\0`` then a
``runtime.Unknown`` message: ``typeMeta`` (``apiVersion``, ``kind``) names the object's
kind and version, ``raw`` holds the object's own message, ``contentEncoding`` and
``contentType`` are left empty.

No Python package ships Kubernetes' ``.proto`` files, so the messages a reader needs are
declared here at run time, with the field numbers of upstream's ``generated.proto``
files, and the ``protobuf`` library reads them: :func:`declare` turns a table of
messages into classes, :func:`unwrap` opens the envelope and :func:`parse` reads a
declared message, both raising :class:`ProtobufError`. Only the fields a reader uses
need declaring: the library skips the others, as it skips any field it does not know.

Pure: no I/O. The read API (:mod:`readapi.protobuf`) reads request bodies with it, and
:mod:`kube.stored` the values kube-apiserver keeps in etcd.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

MAGIC: Final = b"k8s\x00"

STRING: Final = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
BYTES: Final = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
_MESSAGE: Final = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE

#: A message's fields: (JSON name, field number, a declared message's name or a scalar type).
Fields: TypeAlias = tuple[
    tuple[str, int, str | descriptor_pb2.FieldDescriptorProto.Type.ValueType], ...
]

# apimachinery's runtime.Unknown and the TypeMeta in it (``k8s.io/apimachinery/pkg/
# runtime/generated.proto``).
_ENVELOPE: Final[dict[str, Fields]] = {
    "TypeMeta": (("apiVersion", 1, STRING), ("kind", 2, STRING)),
    "Unknown": (
        ("typeMeta", 1, "TypeMeta"),
        ("raw", 2, BYTES),
        ("contentEncoding", 3, STRING),
        ("contentType", 4, STRING),
    ),
}


class ProtobufError(ValueError):
    """Bytes that do not hold the Kubernetes protobuf message they should; says why."""


@dataclass(frozen=True)
class Envelope:
    """An opened ``k8s\\0`` envelope: the object's kind and version, and its message.

    ``content_type`` is None when the envelope has no such field. Kubernetes' encoder
    writes every field of the envelope, in order, ``contentType`` last even when empty,
    so an envelope without it is one cut short (a cut between two fields leaves valid
    protobuf).
    """

    api_version: str
    kind: str
    raw: bytes
    content_type: str | None


def declare(file: str, package: str, messages: Mapping[str, Fields]) -> dict[str, Any]:
    """Classes for ``messages`` (name -> fields), declared in a descriptor pool of their own
    as the proto2 file ``file`` of ``package``; a message field names another of them."""
    proto = descriptor_pb2.FileDescriptorProto(name=file, package=package, syntax="proto2")
    for name, fields in messages.items():
        message = proto.message_type.add(name=name)
        for field, number, kind in fields:
            declared = message.field.add(
                name=field,
                json_name=field,
                number=number,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            )
            if isinstance(kind, str):
                declared.type = _MESSAGE
                declared.type_name = f".{package}.{kind}"
            else:
                declared.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in messages
    }


def parse(message: Any, data: bytes) -> Any:
    """``data`` read as ``message`` (a class from :func:`declare`); ProtobufError if it
    cannot be (the library cannot tell a truncated message from a corrupt one)."""
    try:
        return message.FromString(data)
    except DecodeError as error:
        raise ProtobufError(f"{message.DESCRIPTOR.name}: {error}") from None


def unwrap(data: bytes) -> Envelope:
    """The envelope in ``data``, which must start with :data:`MAGIC`; ProtobufError if it
    does not, if the envelope cannot be read, or if its ``apiVersion``, ``kind`` or
    ``contentType`` is not UTF-8 text."""
    if not data.startswith(MAGIC):
        raise ProtobufError(
            f"it does not start with the protobuf envelope's {MAGIC!r} but {data[:8]!r}"
        )
    unknown = parse(_envelope(), data[len(MAGIC) :])
    texts = {"apiVersion": unknown.typeMeta.apiVersion, "kind": unknown.typeMeta.kind}
    if unknown.HasField("contentType"):
        texts["contentType"] = unknown.contentType
    for name, value in texts.items():
        # proto2 strings are not checked: the library hands back invalid UTF-8 as bytes.
        if not isinstance(value, str):
            raise ProtobufError(f"the envelope's {name} {value!r} is not UTF-8 text")
    return Envelope(texts["apiVersion"], texts["kind"], unknown.raw, texts.get("contentType"))


@functools.cache
def _envelope() -> Any:
    return declare("svledger/kubernetes-runtime.proto", "svledger.kubernetes.runtime", _ENVELOPE)[
        "Unknown"
    ]
