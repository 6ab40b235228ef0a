"""The cluster a log record is about, for a process that works for many clusters at once.

A collector of a fleet (``svledger collect --fleet``) watches many clusters in one event
loop, and the code that logs (a watch that backs off, a discovery read that fails) is the
same for each. Each cluster's work runs under :func:`about` its cluster, in a task of its
own or a block; :class:`ClusterField`, installed on the log handler, then adds the
cluster to every record: the ``cluster`` key of a JSON line, a ``[cluster]`` before a
text line's message. A context variable, not an argument threaded through every call:
asyncio gives each task a copy of the context it was created in, so a record logged by a
library the cluster's task calls is tagged as well.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Final

_CLUSTER: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "svledger_cluster", default=None
)


@contextlib.contextmanager
def about(cluster: str) -> Iterator[None]:
    """Tag the records logged within the block (and by the tasks it creates) with ``cluster``."""
    token = _CLUSTER.set(cluster)
    try:
        yield
    finally:
        _CLUSTER.reset(token)


class ClusterField(logging.Filter):
    """Sets ``record.cluster`` (when there is one) and ``record.cluster_tag`` (``[NAME] ``
    or nothing, for text formats) from the context the record was logged in."""

    def filter(self, record: logging.LogRecord) -> bool:
        cluster = _CLUSTER.get()
        if cluster is not None and not hasattr(record, "cluster"):
            record.cluster = cluster
        tagged = getattr(record, "cluster", None)
        record.cluster_tag = f"[{tagged}] " if tagged else ""
        return True
