"""The read API served in process over views folded from a generated log.

What is under test with it is how the API answers, not how the log is read: the
views are folded in memory (:func:`fold`) and served by the real aiohttp application
(the ``served`` fixture in ``tests/unit/conftest.py``).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient

from ledger.events import Event, Position
from ledger.kafka import Record
from readapi.ledger import LedgerViews
from tests.workloads import mixed_events

CLUSTER = "/clusters/cluster-000"
LEASES = f"{CLUSTER}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
STORAGE_VERSIONS = f"{CLUSTER}/apis/internal.apiserver.k8s.io/v1alpha1/storageversions"
EVENTS = list(mixed_events(600, clusters=1))
FOLDED = 400  # events folded before the server starts; the rest are appended by tests


def fold(views: LedgerViews, events: list[Event]) -> None:
    start = views.clusters["cluster-000"].offset + 1 if views.clusters else 0
    views._fold([Record(Position(0, start + i), e, b"") for i, e in enumerate(events)])
    views._wake()


def lease_names(views: LedgerViews) -> list[str]:
    """The names of the served cluster's Leases (its apiserver IDs)."""
    return [apiserver for _, apiserver in views.clusters["cluster-000"].state.leases]


async def watch(
    client: TestClient[Any, Any],
    path: str,
    query: str,
    *,
    parameter: bool = True,
    headers: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A watch of ``path`` for a second; without ``parameter``, or with ``watch=`` in
    ``query``, no ``watch=true`` added."""
    watching = "watch=true&" if parameter and "watch=" not in query else ""
    url = f"{path}?{watching}timeoutSeconds=1&{query}"
    async with client.get(url, headers=headers or {}) as response:
        assert response.status == 200, await response.text()
        return [json.loads(line) for line in (await response.text()).splitlines() if line]
