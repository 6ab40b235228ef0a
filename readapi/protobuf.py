"""Request bodies in Kubernetes' protobuf encoding, for the reviews kubectl posts in it.

client-go's typed clients send built-in kinds as ``application/vnd.kubernetes.protobuf``
and accept JSON back, so ``kubectl auth can-i`` and ``kubectl auth whoami`` post their
reviews in protobuf however the server answers (client-go has no fallback to JSON for
them). The encoding (``apimachinery/pkg/runtime/serializer/protobuf``): the four bytes
``k8s\\0``, then a ``runtime.Unknown`` message whose ``typeMeta`` names the kind and whose
``raw`` holds the object's own message.

The messages are declared here at run time, with the field numbers of upstream's
``generated.proto`` files (``k8s.io/api/authorization/v1``, ``apimachinery``'s
``runtime`` and ``meta/v1``), and the ``protobuf`` library reads them; only the fields
the reviews are answered from are declared, and the library skips the others (an
``ObjectMeta``'s labels or annotations among them, so a protobuf review's metadata is
judged empty from its names and uid alone). Objects are decoded to the dicts their
JSON form decodes to, field names as upstream's JSON names them.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError

from readapi.gojson import JSON
from readapi.status import ApiError

MEDIA_TYPE: Final = "application/vnd.kubernetes.protobuf"
MAGIC: Final = b"k8s\x00"
_PACKAGE: Final = "svledger.kubernetes"

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE

# name -> its fields: (JSON name, field number, a message type's name or a scalar type)
_MESSAGES: Final[
    dict[str, tuple[tuple[str, int, str | descriptor_pb2.FieldDescriptorProto.Type.ValueType], ...]]
] = {
    "TypeMeta": (("apiVersion", 1, _STRING), ("kind", 2, _STRING)),
    "Unknown": (
        ("typeMeta", 1, "TypeMeta"),
        ("raw", 2, _BYTES),
        ("contentEncoding", 3, _STRING),
        ("contentType", 4, _STRING),
    ),
    "ObjectMeta": (
        ("name", 1, _STRING),
        ("generateName", 2, _STRING),
        ("namespace", 3, _STRING),
        ("uid", 5, _STRING),
    ),
    "ResourceAttributes": tuple(
        (name, number, _STRING)
        for number, name in enumerate(
            ("namespace", "verb", "group", "version", "resource", "subresource", "name"), 1
        )
    ),
    "NonResourceAttributes": (("path", 1, _STRING), ("verb", 2, _STRING)),
    "SelfSubjectAccessReviewSpec": (
        ("resourceAttributes", 1, "ResourceAttributes"),
        ("nonResourceAttributes", 2, "NonResourceAttributes"),
    ),
    "SelfSubjectAccessReview": (
        ("metadata", 1, "ObjectMeta"),
        ("spec", 2, "SelfSubjectAccessReviewSpec"),
    ),
    "SelfSubjectRulesReviewSpec": (("namespace", 1, _STRING),),
    "SelfSubjectRulesReview": (
        ("metadata", 1, "ObjectMeta"),
        ("spec", 2, "SelfSubjectRulesReviewSpec"),
    ),
    "SelfSubjectReview": (("metadata", 1, "ObjectMeta"),),  # authentication.k8s.io/v1
}
KINDS: Final = ("SelfSubjectAccessReview", "SelfSubjectRulesReview", "SelfSubjectReview")


@functools.cache
def _classes() -> dict[str, Any]:
    """The message classes of :data:`_MESSAGES`, declared in a pool of their own."""
    file = descriptor_pb2.FileDescriptorProto(
        name="svledger/kubernetes-reviews.proto", package=_PACKAGE, syntax="proto2"
    )
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind in fields:
            declared = message.field.add(
                name=field,
                json_name=field,
                number=number,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            )
            if isinstance(kind, str):
                declared.type = _MESSAGE
                declared.type_name = f".{_PACKAGE}.{kind}"
            else:
                declared.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


def decode(data: bytes) -> JSON:
    """The object in a protobuf-encoded body, as its JSON form decodes: a review kind's,
    with its ``kind`` and ``apiVersion``; 400 BadRequest for anything else."""
    if not data.startswith(MAGIC):
        raise _bad(f"it does not start with the protobuf envelope's {MAGIC!r}")
    classes = _classes()
    unknown = _parse(classes["Unknown"], data[len(MAGIC) :])
    kind = unknown.typeMeta.kind
    if kind not in KINDS:
        raise _bad(f"its kind is {kind!r}; only {', '.join(KINDS)} are read in protobuf here")
    body = json_format.MessageToDict(
        _parse(classes[kind], unknown.raw), preserving_proto_field_name=True
    )
    return {"kind": kind, "apiVersion": unknown.typeMeta.apiVersion, **body}


def _parse(message: Any, data: bytes) -> Any:
    try:
        return message.FromString(data)
    except DecodeError as error:
        raise _bad(f"{message.DESCRIPTOR.name}: {error}") from None


def _bad(why: str) -> ApiError:
    return ApiError(400, "BadRequest", f"the protobuf body of the request cannot be read: {why}")
