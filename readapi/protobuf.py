"""Request bodies in Kubernetes' protobuf encoding, for the reviews kubectl posts in it.

client-go's typed clients send built-in kinds as ``application/vnd.kubernetes.protobuf``
and accept JSON back, so ``kubectl auth can-i`` and ``kubectl auth whoami`` post their
reviews in protobuf however the server answers (client-go has no fallback to JSON for
them). The encoding (:mod:`kube.protobuf`, which opens it): the four bytes ``k8s\\0``,
then a ``runtime.Unknown`` message whose ``typeMeta`` names the kind and whose ``raw``
holds the object's own message.

The review messages are declared here, with :func:`kube.protobuf.declare` and the field
numbers of upstream's ``generated.proto`` files (``k8s.io/api/authorization/v1`` and
``apimachinery``'s ``meta/v1``); only the fields the reviews are answered from are
declared, and the library skips the others (an ``ObjectMeta``'s labels or annotations
among them, so a protobuf review's metadata is judged empty from its names and uid
alone). Objects are decoded to the dicts their JSON form decodes to, field names as
upstream's JSON names them.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from google.protobuf import json_format

from kube.protobuf import STRING, Fields, ProtobufError, declare, parse, unwrap
from readapi.gojson import JSON
from readapi.status import ApiError

MEDIA_TYPE: Final = "application/vnd.kubernetes.protobuf"

_MESSAGES: Final[dict[str, Fields]] = {
    "ObjectMeta": (
        ("name", 1, STRING),
        ("generateName", 2, STRING),
        ("namespace", 3, STRING),
        ("uid", 5, STRING),
    ),
    "ResourceAttributes": tuple(
        (name, number, STRING)
        for number, name in enumerate(
            ("namespace", "verb", "group", "version", "resource", "subresource", "name"), 1
        )
    ),
    "NonResourceAttributes": (("path", 1, STRING), ("verb", 2, STRING)),
    "SelfSubjectAccessReviewSpec": (
        ("resourceAttributes", 1, "ResourceAttributes"),
        ("nonResourceAttributes", 2, "NonResourceAttributes"),
    ),
    "SelfSubjectAccessReview": (
        ("metadata", 1, "ObjectMeta"),
        ("spec", 2, "SelfSubjectAccessReviewSpec"),
    ),
    "SelfSubjectRulesReviewSpec": (("namespace", 1, STRING),),
    "SelfSubjectRulesReview": (
        ("metadata", 1, "ObjectMeta"),
        ("spec", 2, "SelfSubjectRulesReviewSpec"),
    ),
    "SelfSubjectReview": (("metadata", 1, "ObjectMeta"),),  # authentication.k8s.io/v1
}
KINDS: Final = ("SelfSubjectAccessReview", "SelfSubjectRulesReview", "SelfSubjectReview")


@functools.cache
def _classes() -> dict[str, Any]:
    """The message classes of :data:`_MESSAGES`."""
    return declare("svledger/kubernetes-reviews.proto", "svledger.kubernetes", _MESSAGES)


def decode(data: bytes) -> JSON:
    """The object in a protobuf-encoded body, as its JSON form decodes: a review kind's,
    with its ``kind`` and ``apiVersion``; 400 BadRequest for anything else."""
    try:
        envelope = unwrap(data)
        if envelope.kind not in KINDS:
            raise ProtobufError(
                f"its kind is {envelope.kind!r}; only {', '.join(KINDS)} are read in protobuf here"
            )
        message = parse(_classes()[envelope.kind], envelope.raw)
    except ProtobufError as error:
        raise ApiError(
            400, "BadRequest", f"the protobuf body of the request cannot be read: {error}"
        ) from None
    body = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return {"kind": envelope.kind, "apiVersion": envelope.api_version, **body}
