"""The ``ledger_events`` row a batch carries for each folded event (``store.logged``).

The fold builds it from the event it decoded, so the writer never decodes the log's
record again; the row must still say what that record says, field for field.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime

from hypothesis import given
from hypothesis import strategies as st

from ledger.codec import decode, encode
from ledger.events import Event, Position, type_name
from projections import store
from projections.fold import subject
from tests import strategies


@given(strategies.events(), st.integers(0, 1_000), st.integers(0))
def test_the_row_says_what_the_logged_record_says(
    event: Event, partition: int, offset: int
) -> None:
    decoded = decode(encode(event))
    row = store.logged(decoded, Position(partition, offset))
    (
        row_partition,
        row_offset,
        cluster,
        event_id,
        event_type,
        about,
        occurred_at,
        source,
        causation_id,
        correlation_id,
        payload,
    ) = row
    meta = decoded.meta
    assert (row_partition, row_offset) == (partition, offset)
    assert (cluster, event_id, occurred_at, source, causation_id, correlation_id) == (
        meta.cluster,
        meta.event_id,
        meta.occurred_at,
        meta.source,
        meta.causation_id,
        meta.correlation_id,
    )
    assert (event_type, about) == (type_name(event), subject(event))
    fields = [field.name for field in dataclasses.fields(decoded) if field.name != "meta"]
    read = json.loads(payload)
    assert list(read) == fields  # in the order of the Avro record's fields
    for name in fields:
        value = getattr(decoded, name)
        if isinstance(value, datetime):
            assert datetime.fromisoformat(read[name]) == value  # exact to the microsecond
        else:
            assert read[name] == (list(value) if isinstance(value, tuple) else value)
