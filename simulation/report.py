"""What a simulation run shows: a timeline per resource and the pollution check.

A table per resource in the style of the KEP's case walkthrough, read from the
projection views after each step, one row per step in which something changed; then
the pollution check:

* *polluted objects*: objects stored in a version whose hash is not in the persisted
  hashes (``Unknown`` in the list covers every version), measured after every step; the
  worst is reported. A correct trigger keeps it at 0.
* *migrations while apiservers disagreed*: migrations requested while the apiservers
  did not all encode the target version, or still Pending or Running at the end of a
  step while they disagreed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Final, Literal, TypeAlias

Trigger: TypeAlias = Literal["agreement", "discovery-hash"]


TRIGGERS: Final[tuple[Trigger, ...]] = ("agreement", "discovery-hash")


@dataclasses.dataclass(frozen=True, slots=True)
class TimelineRow:
    """A resource after a step in which something changed, as the views show it."""

    at_seconds: int
    resource: str
    events: tuple[str, ...]
    encoding_versions: tuple[str | None, ...]  # per apiserver, in scenario order
    common_version: str | None
    persisted_versions: tuple[str, ...]  # the ledger's StorageState, hashes shown as versions
    baseline_persisted_versions: tuple[str, ...] | None  # the old trigger's StorageState
    migration: str | None  # the latest migration, e.g. "Running v2"
    stored: Mapping[str, int]  # objects per encoded version
    polluted: int  # objects outside the persisted hashes of the trigger in charge

    @property
    def time(self) -> str:
        return f"{self.at_seconds // 60}:{self.at_seconds % 60:02d}"


@dataclasses.dataclass(frozen=True, slots=True)
class SimulationResult:
    cluster: str
    trigger: Trigger
    apiservers: tuple[str, ...]  # hostnames, the order of TimelineRow.encoding_versions
    rows: tuple[TimelineRow, ...]
    # Objects outside the persisted hashes, worst after any step, summed over resources:
    # against the StorageState of the trigger in charge (the old trigger's own in
    # discovery-hash mode), and against the ledger's guarded StorageState.
    polluted_objects: int
    ledger_polluted_objects: int
    # IDs of migrations requested, or left active, while the apiservers disagreed.
    migrations_while_disagreeing: tuple[str, ...]
    final_persisted_versions: Mapping[str, tuple[str, ...]]  # by resource name
    final_stored: Mapping[str, Mapping[str, int]]  # by resource name
    refused_writes: int  # client writes that found no apiserver ready to serve them
    events: int  # records of the cluster in the log


def render(result: SimulationResult) -> str:
    """The timeline tables (Markdown) and the pollution check, as ``simulate`` prints them."""
    baseline = result.trigger == "discovery-hash"
    lines = [f"# Simulation of cluster {result.cluster!r}, trigger {result.trigger}", ""]
    for resource in dict.fromkeys(row.resource for row in result.rows):
        header = ["time", "what happened", *result.apiservers, "common", "persisted (ledger)"]
        if baseline:
            header.append("persisted (discovery-hash trigger)")
        header += ["migration", "stored objects", "polluted"]
        lines += [f"## {resource}", "", _cells(header), _cells(["---"] * len(header))]
        for row in (r for r in result.rows if r.resource == resource):
            cells = [
                row.time,
                "; ".join(row.events),
                *(version or "-" for version in row.encoding_versions),
                row.common_version or "-",
                ", ".join(row.persisted_versions) or "-",
            ]
            if baseline:
                cells.append(", ".join(row.baseline_persisted_versions or ()) or "-")
            cells += [
                row.migration or "-",
                " ".join(f"{v}:{n}" for v, n in row.stored.items()) or "-",
                str(row.polluted),
            ]
            lines.append(_cells(cells))
        lines.append("")
    lines += ["## Pollution check", ""]
    if baseline:
        lines.append(
            "objects stored in a version outside the persisted hashes (worst after any step):"
            f" {result.polluted_objects} against the discovery-hash trigger's StorageState,"
            f" {result.ledger_polluted_objects} against the ledger's guarded StorageState"
        )
    else:
        lines.append(
            "objects stored in a version outside the persisted hashes (worst after any step):"
            f" {result.polluted_objects}"
        )
    lines.append(
        "migrations requested or running while the apiservers disagreed:"
        f" {len(result.migrations_while_disagreeing)}"
    )
    if result.refused_writes:
        lines.append(f"client writes refused (no apiserver ready): {result.refused_writes}")
    return "\n".join(lines) + "\n"


def _cells(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"
