"""docs/events.md is what ``ledger.reference`` generates from schemas/, never hand-edited."""

from __future__ import annotations

from pathlib import Path

from ledger import reference
from ledger.events import EVENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_the_event_reference_is_generated_from_the_schemas() -> None:
    assert DOC.read_text() == reference.render(), (
        f"docs/events.md differs from what schemas/ generate; regenerate it: {reference.COMMAND}"
    )


def test_the_reference_has_a_section_for_every_event_type_and_meta() -> None:
    headings = {line[3:] for line in reference.render().splitlines() if line.startswith("## ")}
    assert set(EVENT_TYPES) | {"Meta"} <= headings
