"""Who a client is and what it may do here, answered as upstream's reviews answer it.

``kubectl auth can-i`` asks the API server by creating a ``SelfSubjectAccessReview``
(``authorization.k8s.io/v1``), and ``kubectl auth can-i --list`` a
``SelfSubjectRulesReview``; neither is stored, the answer comes back in the created
object's ``status``. The read API's authorization is one rule: a request that passes
authentication (any request without ``--token-file``) may read everything it serves
and change nothing. So a review allows ``get``, ``list`` and ``watch`` of any resource
in any namespace, and ``get`` of any non-resource path, and denies every
other verb: the ledger is appended to by its producers, never through this API.

As upstream's authorizers, the answer does not depend on whether the resource or path
exists (a request for one that does not gets a 404, not a 403); kubectl warns of a
resource type the server does not have before it asks. Verbs compare as upstream's
(case-sensitive, ``*`` meaning every verb, which includes writes).

``kubectl auth whoami`` creates a ``SelfSubjectReview`` (``authentication.k8s.io/v1``):
its answer is the :class:`User` the request authenticated as, from the token file
(:func:`read_tokens`), or upstream's anonymous user when the server takes no tokens.

The reviews are checked as upstream's ``ValidateSelfSubjectAccessReview`` and its
``SelfSubjectRulesReview`` storage check them: exactly one of ``resourceAttributes``
and ``nonResourceAttributes``, empty ``metadata``, and a rules review names a
namespace. Their ``fieldSelector`` and ``labelSelector`` attributes are accepted and do
not change the answer (everything is readable, whatever is selected).

The reviews are created only (405 for other methods), posted in JSON, YAML or kubectl's
protobuf (:mod:`readapi.protobuf`), and are not in discovery (kubectl needs none). The
server's authentication puts the request's :class:`User` under :data:`USER`, from the
tokens under :data:`TOKENS` (401 without a valid bearer token when there are any).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from readapi import negotiation
from readapi.clusters import check_cluster
from readapi.gojson import JSON
from readapi.responses import method_not_allowed, respond
from readapi.status import ApiError, invalid

GROUP: Final = "authorization.k8s.io"
API_VERSION: Final = f"{GROUP}/v1"
ACCESS_REVIEW: Final = "SelfSubjectAccessReview"
RULES_REVIEW: Final = "SelfSubjectRulesReview"
AUTHENTICATION_VERSION: Final = "authentication.k8s.io/v1"
SELF_REVIEW: Final = "SelfSubjectReview"
AUTHENTICATED: Final = "system:authenticated"  # upstream adds it to every authenticated user
TOKEN_USER: Final = "svledger-reader"  # the user of a token file line that names none


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    """Who a request is, as upstream's ``user.Info``: name, uid and groups."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = (AUTHENTICATED,)

    def info(self) -> JSON:
        """The ``UserInfo`` of an ``authentication.k8s.io`` review."""
        body: JSON = {"username": self.name}
        if self.uid:
            body["uid"] = self.uid
        if self.groups:
            body["groups"] = list(self.groups)
        return body


ANONYMOUS: Final = User("system:anonymous", groups=("system:unauthenticated",))
TOKENS: Final = web.AppKey("tokens", dict[str, User])  # the server's, from its token file
USER: Final = web.RequestKey("user", User)  # whom the request authenticated as


def read_tokens(path: Path) -> dict[str, User]:
    """The bearer tokens in a token file, and whose each is.

    A line is kube-apiserver's static token file format, ``token,user,uid,"group1,group2"``
    (CSV), or a token alone, whose user is :data:`TOKEN_USER`; blank lines and ``#``
    comments are skipped. As upstream's, every user is also in ``system:authenticated``.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise ValueError(f"cannot read token file {path}: {error.strerror}") from error
    tokens: dict[str, User] = {}
    for fields in csv.reader(line for line in lines if not line.lstrip().startswith("#")):
        fields = [field.strip() for field in fields]
        if not fields or not fields[0]:
            continue
        name = fields[1] if len(fields) > 1 and fields[1] else TOKEN_USER
        uid = fields[2] if len(fields) > 2 else ""
        groups = [group.strip() for group in fields[3].split(",")] if len(fields) > 3 else []
        tokens[fields[0]] = User(name, uid, (*(g for g in groups if g), AUTHENTICATED))
    if not tokens:
        raise ValueError(f"token file {path} holds no token; write one token per line")
    return tokens


def self_review(body: Any, user: User) -> JSON:
    """The ``SelfSubjectReview`` ``body`` asks for: who ``user`` is."""
    _review(body, SELF_REVIEW, AUTHENTICATION_VERSION)
    return {
        "kind": SELF_REVIEW,
        "apiVersion": AUTHENTICATION_VERSION,
        "metadata": {},
        "status": {"userInfo": user.info()},
    }


RESOURCE_VERBS: Final = ("get", "list", "watch")
NON_RESOURCE_VERBS: Final = ("get",)
ALLOWED: Final = "the ledger's read API lets every authenticated client read all it serves"
DENIED: Final = (
    "the ledger's read API only reads: its events are appended by their producers,"
    " never through this API"
)


def access_review(body: Any) -> JSON:
    """The ``SelfSubjectAccessReview`` ``body`` asks for, with its ``status`` answered."""
    review = _review(body, ACCESS_REVIEW)
    spec = review.get("spec") or {}
    if not isinstance(spec, dict):
        raise _unrecognized(ACCESS_REVIEW, f"spec is {_shown(spec)}, not an object")
    resource = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    causes = []
    if (resource is None) == (non_resource is None):
        # Upstream shows the nonResourceAttributes: "null" when absent, else the value.
        shown = '"null"' if non_resource is None else _shown(non_resource)
        causes.append(
            (
                "spec",
                "Invalid",
                f"Invalid value: {shown}: exactly one of nonResourceAttributes"
                " or resourceAttributes must be specified",
            )
        )
    causes += _metadata_causes(review)
    if causes:
        raise invalid(ACCESS_REVIEW, GROUP, causes)
    attributes, verbs = (
        (resource, RESOURCE_VERBS) if resource is not None else (non_resource, NON_RESOURCE_VERBS)
    )
    if not isinstance(attributes, dict):
        raise _unrecognized(ACCESS_REVIEW, f"the attributes are {_shown(attributes)}")
    allowed = attributes.get("verb") in verbs
    status: JSON = {"allowed": allowed, "reason": ALLOWED if allowed else DENIED}
    if not allowed:
        status["denied"] = True  # no other authorizer could allow it: nothing is written here
    return {
        "kind": ACCESS_REVIEW,
        "apiVersion": API_VERSION,
        "metadata": {},
        "spec": spec,
        "status": status,
    }


def rules_review(body: Any) -> JSON:
    """The ``SelfSubjectRulesReview`` ``body`` asks for: every rule the client holds in
    its namespace (the same in all of them). As upstream's, the answer carries the
    status alone, not the spec."""
    review = _review(body, RULES_REVIEW)
    spec = review.get("spec") or {}
    if not isinstance(spec, dict) or not spec.get("namespace"):
        raise ApiError(400, "BadRequest", "no namespace on request")
    causes = _metadata_causes(review)
    if causes:
        raise invalid(RULES_REVIEW, GROUP, causes)
    return {
        "kind": RULES_REVIEW,
        "apiVersion": API_VERSION,
        "metadata": {},
        "spec": {},
        "status": {
            "resourceRules": [
                {"verbs": list(RESOURCE_VERBS), "apiGroups": ["*"], "resources": ["*"]}
            ],
            "nonResourceRules": [{"verbs": list(NON_RESOURCE_VERBS), "nonResourceURLs": ["*"]}],
            "incomplete": False,
        },
    }


def _review(body: Any, kind: str, api_version: str = API_VERSION) -> JSON:
    """``body`` as a review of ``kind``: an object whose kind and apiVersion, where
    given, are that kind's."""
    if not isinstance(body, dict):
        raise _unrecognized(kind, f"the body is {_shown(body)}, not an object")
    for field, expected in (("kind", kind), ("apiVersion", api_version)):
        given = body.get(field)
        if given not in (None, "", expected):
            raise _unrecognized(kind, f"its {field} is {given!r}, not {expected!r}")
    return body


def _metadata_causes(review: JSON) -> list[tuple[str, str, str]]:
    """Upstream's "metadata: must be empty": kubectl sends ``creationTimestamp: null``,
    which is empty; a name, labels or any other set field is not."""
    metadata = review.get("metadata") or {}
    if isinstance(metadata, dict) and not any(metadata.values()):
        return []
    return [("metadata", "Invalid", f"Invalid value: {_shown(metadata)}: must be empty")]


def _unrecognized(kind: str, why: str) -> ApiError:
    return ApiError(
        400,
        "BadRequest",
        f"the object provided is unrecognized (must be of type {kind}): {why}",
    )


def _shown(value: Any) -> str:
    return json.dumps(value)[:200]


# --------------------------------------------------------------------------- handlers


async def handle_access_review(request: web.Request) -> web.StreamResponse:
    return await _answer_review(request, access_review)


async def handle_rules_review(request: web.Request) -> web.StreamResponse:
    return await _answer_review(request, rules_review)


async def handle_self_review(request: web.Request) -> web.StreamResponse:
    return await _answer_review(request, lambda body: self_review(body, request[USER]))


async def _answer_review(request: web.Request, answer: Callable[[Any], JSON]) -> web.Response:
    """Create a review: read the object posted, answer it with 201 Created, as upstream
    does, in the media type the request accepts. Nothing is stored; a review is only
    created (405 for any other method)."""
    check_cluster(request)
    if request.method != "POST":
        return method_not_allowed(request)
    output = negotiation.negotiate(request.headers.get("Accept", ""), convert=False)
    body = negotiation.read_body(request.content_type, await request.read())
    response = respond(output, answer(body))
    response.set_status(201)
    return response
