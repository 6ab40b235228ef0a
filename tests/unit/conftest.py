"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from ledger.settings import KafkaSettings
from readapi.ledger import LedgerViews
from readapi.server import ServeOptions, app
from tests.served import EVENTS, FOLDED, fold


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient[Any, Any], LedgerViews]]:
    """The read API over the first :data:`~tests.served.FOLDED` events; bookmarks every
    0.2 s. The broker address is never dialled: the test folds the views itself."""
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", topic="t", partitions=1)
    views = LedgerViews(settings, watch_window=300)
    fold(views, EVENTS[:FOLDED])
    views.ready.set()
    client = TestClient(TestServer(app(views, ServeOptions(bookmark_seconds=0.2))))
    await client.start_server()
    try:
        yield client, views
    finally:
        await client.close()
