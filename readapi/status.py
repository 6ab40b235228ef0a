"""A request the read API refuses, and the ``Status`` it is answered with.

Every error a client of the read API meets is a ``meta/v1`` ``Status``, as
kube-apiserver's are: :class:`ApiError` carries its code, reason, message and details
from wherever the request is refused to the server's error middleware, which writes
:func:`status` of it (:mod:`readapi.responses`); :func:`invalid` is upstream's 422 for
parameters that cannot go together.
"""

from __future__ import annotations

from ledger.errors import UsageError
from readapi.gojson import JSON


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
