"""The event reference, ``docs/events.md``, generated from the Avro schemas in ``schemas/``.

The schemas are the contract (every field has a ``doc``), so the reference is written
from them and never by hand: :func:`render` turns the schema tree into Markdown, and
``tests/unit/test_events_doc.py`` fails when ``docs/events.md`` differs from it. After
changing a schema, regenerate the page::

    python -m ledger.reference > docs/events.md

What the page holds, all read from the tree and the codec that loads it: the record
format, one section per event type in :data:`ledger.events.EVENT_TYPES` order with the
fields of its current (reader) schema, what earlier versions lacked or said otherwise,
the shared named types (``Meta``), and the fingerprint of every writer schema, which
is what a record's header carries and what a dead-letter reason quotes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ledger.codec import HEADER_SIZE, MAGIC, NAMESPACE, default_codec, schema_tree
from ledger.events import EVENT_TYPES

COMMAND: Final = "python -m ledger.reference > docs/events.md"


def render() -> str:
    """``docs/events.md``, from the packaged schemas."""
    schemas = schema_tree()
    events = [name for name in EVENT_TYPES if name in schemas]
    shared = sorted(name for name in schemas if name not in EVENT_TYPES)
    lines = [
        "# Event reference",
        "",
        f"<!-- Generated from schemas/ by `{COMMAND}`; do not edit by hand. -->",
        "",
        "Every record on the events topic is one of the events below. This page is generated",
        "from the Avro schemas in [`schemas/`](../schemas/) (`ledger/reference.py`), and",
        "`tests/unit/test_events_doc.py` fails when the two differ: to change an event, add a",
        "schema version as [`schemas/README.md`](../schemas/README.md) says, then run",
        f"`{COMMAND}`.",
        "",
        "## The record",
        "",
        "* **key**: the cluster name (`meta.cluster`), UTF-8. All events of a cluster land in",
        "  one partition, in one order: the ledger of that cluster.",
        f"* **value**: Avro single-object encoding: the bytes `{MAGIC.hex(' ')}`, the",
        f"  {HEADER_SIZE - len(MAGIC)}-byte CRC-64-AVRO fingerprint of the writer schema"
        " (little-endian, as",
        "  listed under [Writer schemas](#writer-schemas)), then the Avro binary body.",
        "  Records of an older schema version are read into the current one by Avro schema",
        "  resolution (a field added since takes its default).",
        "* **header** `svledger-type`: the event type's name, for people reading the topic",
        "  with console tools.",
        "* **header** `svledger-time`: when the event occurred (its `meta.occurred_at`), as 8",
        "  bytes: signed big-endian microseconds since 1970-01-01 UTC. Every writer sets it",
        "  from the event; the projector and replay read a heartbeat's time by it without",
        "  decoding the heartbeat.",
        "* **header** `svledger-lease`, on `ApiserverHeartbeat` only: 16 bytes, the BLAKE2b",
        "  digest (16-byte digest size) of what the heartbeat says of its lease besides the",
        "  renew time, as UTF-8 text joined by NUL bytes: cluster, apiserver ID, holder",
        "  identity, hostname, lease duration in decimal, `+` and the binary version (`-`",
        "  when there is none), then `+` and the peer advertise address only when there is",
        "  one (`ledger.events.lease_term`). Every writer sets it from the event; the",
        "  projector tells plain renewals by it without decoding them.",
        "",
        "Every writer sets the headers in this order: type, time, lease. The projector's fast path",
        "reads them where they are in that order; a record whose headers come otherwise (a tool",
        "that copied it between clusters and added one, say) is decoded and folded the same, only",
        "more slowly. A record whose time or lease header says other than its event is sent to",
        "the dead-letter topic by every reader that decodes it, and folded by none: a reader that",
        "counts a renewal by its header and one that decodes it must fold the same.",
        "",
        "Times are `timestamp-micros`: microseconds since 1970-01-01 UTC.",
        "",
        "## Events",
        "",
        "| event | schema | meaning |",
        "| --- | --- | --- |",
    ]
    for name in events:
        newest = max(schemas[name])
        versions = ", ".join(f"v{v}" for v in sorted(schemas[name]))
        summary = _text(_first_sentence(schemas[name][newest]["doc"]))
        lines.append(f"| [{name}](#{name.lower()}) | {versions} | {summary} |")
    for name in events:
        lines += ["", *_event_section(name, schemas[name])]
    for name in shared:
        lines += ["", *_shared_section(name, schemas[name])]
    lines += ["", *_fingerprint_section()]
    return "\n".join(lines) + "\n"


def _event_section(name: str, versions: Mapping[int, Any]) -> list[str]:
    newest = max(versions)
    current = versions[newest]
    lines = [
        f"## {name}",
        "",
        _text(current["doc"]),
        "",
        _current_schema(name, newest),
        "",
        *_field_table(current["fields"]),
    ]
    for version in sorted(versions, reverse=True)[1:]:
        lines += ["", *_older_version(name, version, versions[version], current)]
    return lines


def _shared_section(name: str, versions: Mapping[int, Any]) -> list[str]:
    newest = max(versions)
    current = versions[newest]
    return [
        f"## {name}",
        "",
        f"A named record shared by the events (`{NAMESPACE}.{name}`). {_text(current['doc'])}",
        "",
        _current_schema(name, newest),
        "",
        *_field_table(current["fields"]),
        *_IN_PRACTICE.get(name, []),
    ]


# What svledger's own writers put in a shared record's fields, beside the docs of its
# shipped schema, which stay as they were shipped (schemas/README.md).
_IN_PRACTICE: Final = {
    "Meta": [
        "",
        "What svledger's own writers put there:",
        "",
        "* `source`: the apiserver ID for a reporter's events, `svledger-collector` for the",
        "  events the collector makes of a real cluster, `svledger-lease-gc`,",
        "  `svledger-migrator` and `svledger-worker` for the consumers', and the operator's",
        "  name (`--operator`) for an operator's.",
        "* `event_id`: a new UUID per event, except the lease GC's expiries and the",
        "  migrator's requests, whose IDs derive from what caused them (UUIDv5), so a",
        "  consumer that decides again after a restart appends the same ID. The log keeps",
        "  what was appended (rows are keyed by log position); the fold folds an event once:",
        "  a record whose ID an event of its cluster, other than a heartbeat, had within the",
        "  last hour of the cluster's event time is a repeat, recorded in `rejected_events`",
        "  and folded no further (a repeated heartbeat only says again what its lease said).",
        "* `causation_id` and `correlation_id`: set by the migrator only, on a request: the",
        "  ID of the event that made it request the migration, and that event's",
        "  correlation ID (else its ID). A migration's later steps carry neither; its",
        "  `migration_id` ties them to the request.",
    ],
}


def _current_schema(name: str, version: int) -> str:
    path = f"schemas/{name}/v{version}.avsc"
    return f"Current schema: [`{path}`](../{path})."


def _older_version(name: str, version: int, old: Any, current: Any) -> list[str]:
    old_fields = {field["name"]: field for field in old["fields"]}
    new_fields = {field["name"]: field for field in current["fields"]}
    path = f"schemas/{name}/v{version}.avsc"
    lines = [f"### {name} v{version}", "", f"[`{path}`](../{path}): {_text(old['doc'])}", ""]
    added = [field for field in new_fields if field not in old_fields]
    removed = [field for field in old_fields if field not in new_fields]
    if added:
        lines.append(f"* Fields added since: {_names(added)}.")
    if removed:
        lines.append(f"* Fields it had that the current schema drops: {_names(removed)}.")
    for field, before in old_fields.items():
        after = new_fields.get(field)
        if after is None:
            continue
        if _type(before["type"]) != _type(after["type"]):
            lines.append(f"* `{field}` was {_type(before['type'])}, now {_type(after['type'])}.")
        if before.get("doc") != after.get("doc"):
            lines.append(f"* `{field}` then meant: {_text(before.get('doc', ''))}")
    return lines


def _field_table(fields: Iterable[Any]) -> list[str]:
    lines = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for field in fields:
        default = _default(field["default"]) if "default" in field else "required"
        doc = _text(field.get("doc", "")).replace("|", "\\|")
        lines.append(f"| `{field['name']}` | {_type(field['type'])} | {default} | {doc} |")
    return lines


def _type(avro: Any) -> str:
    """An Avro type in words: ``string``, ``array of string``, ``string or null``, ..."""
    if isinstance(avro, str):
        short = avro.removeprefix(f"{NAMESPACE}.")
        return f"[{short}](#{short.lower()})" if short != avro else f"`{avro}`"
    if isinstance(avro, list):
        return " or ".join(_type(branch) for branch in sorted(avro, key=lambda b: b == "null"))
    if avro.get("logicalType"):
        return f"`{avro['logicalType']}`"
    if avro["type"] == "array":
        return f"array of {_type(avro['items'])}"
    if avro["type"] == "map":
        return f"map of {_type(avro['values'])}"
    return _type(avro["type"])


def _default(value: Any) -> str:
    return "`null`" if value is None else f"`{value!r}`"


def _names(fields: Iterable[str]) -> str:
    return ", ".join(f"`{field}`" for field in fields)


def _text(doc: str) -> str:
    """A schema's doc as Markdown text: ``<group>`` must not read as an HTML tag."""
    return doc.replace("<", "\\<")


def _first_sentence(doc: str) -> str:
    # A sentence ends at ". " unless the dot ends an abbreviation such as "e.g.".
    match = re.search(r"(?<!\be\.g)(?<!\bi\.e)\. ", doc)
    return doc[: match.start() + 1] if match else doc


def _fingerprint_section() -> list[str]:
    lines = [
        "## Writer schemas",
        "",
        "Every schema a record may have been written with, by the fingerprint in its header",
        f"(the {HEADER_SIZE - len(MAGIC)} bytes after `{MAGIC.hex(' ')}`, in wire order)."
        " A record with another",
        "fingerprint was written by a newer svledger or by another producer: the projector",
        "sends it to the dead-letter topic with a reason that quotes the fingerprint.",
        "",
        "| fingerprint | event | version |",
        "| --- | --- | --- |",
    ]
    order = {name: index for index, name in enumerate(EVENT_TYPES)}
    fingerprints = default_codec().fingerprints()
    for key, (name, version) in sorted(
        fingerprints.items(), key=lambda item: (order[item[1][0]], item[1][1])
    ):
        lines.append(f"| `{key.hex()}` | [{name}](#{name.lower()}) | v{version} |")
    return lines


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
