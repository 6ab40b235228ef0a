"""What a migration runs against: the cluster's objects of one resource.

The migration worker (:mod:`consumers.worker`) needs two operations, shaped after the
Kubernetes API so a REST target is a thin adapter:

* ``list`` one chunk of a resource's objects, paged by an opaque continue token
  (``?limit=500&continue=...``);
* ``rewrite`` one object unchanged: read it and write it back as it is (a no-op
  update), so the apiserver that serves the write re-encodes it in its storage version.

Failures are reported by raising one of the :class:`TargetError` subclasses below;
the worker decides what each means (upstream semantics): :class:`Conflict` -> read
again and retry, :class:`NotFound` -> the object is gone, which counts as migrated,
:class:`TooManyRequests` and :class:`Transient` -> retry later with backoff,
honouring ``retry_after`` when the target gives one. Any other exception is a bug
in the target, or a failure its client raises outside these: the worker counts it as
:class:`TargetFailed` (logged with its traceback), which fails the migration.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectRef:
    """One object of a resource; ``namespace`` is ``None`` for cluster-scoped objects."""

    namespace: str | None
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    """One chunk of a list; ``continue_token`` is ``None`` on the last chunk."""

    objects: tuple[ObjectRef, ...]
    continue_token: str | None


class TargetError(Exception):
    """Base of the errors a target raises for the worker to interpret."""


class Conflict(TargetError):
    """The object changed between read and write (HTTP 409): read it again and retry."""


class NotFound(TargetError):
    """The object no longer exists (HTTP 404): nothing left to migrate."""


class _MayRetryAfter(TargetError):
    """An error after which the target may say how long to wait (``retry_after``, s)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooManyRequests(_MayRetryAfter):
    """The target asks to slow down (HTTP 429), optionally saying for how long."""


class Transient(_MayRetryAfter):
    """A timeout or unavailable server (HTTP 5xx, 503): retry with backoff, or after
    the time the server asks for (``Retry-After``, a ``ServerTimeout``'s
    ``retryAfterSeconds``)."""


class TargetFailed(TargetError):
    """The target raised an exception it does not classify (see the module docstring)."""


class Target(Protocol):
    """The objects a migration rewrites. Implementations must be safe to retry."""

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        """The next chunk of at most ``limit`` objects after ``continue_token``.

        ``continue_token=None`` starts from the beginning. A token returned by an
        earlier call (even by an earlier process) continues where that chunk ended.
        """
        ...

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        """Read the object and write it back unchanged (a no-op update)."""
        ...
