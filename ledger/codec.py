"""Avro single-object encoding of ledger events: the bytes of every Kafka record value.

Wire format (Avro specification, "Single-object encoding")::

    C3 01 | CRC-64-AVRO fingerprint of the writer schema, 8 bytes little-endian | Avro binary body

The fingerprint is taken over the writer schema's Parsing Canonical Form, so it names
the exact schema a record was written with and a reader needs no schema registry: the
codec knows every schema version ever shipped in ``schemas/``.

The schema tree is ``<root>/<Name>/v<N>.avsc``. A directory named after an event type
(:data:`ledger.events.EVENT_TYPES`) holds that event's versions; any other directory
holds a shared named type (``Meta``) that event schemas reference by name. A writer
schema is one event version with each shared type inlined at its first reference.
Because a record may have been written with any shipped version of a shared type, the
codec registers every combination of versions; identical combinations collapse to one
fingerprint. The *reader* schema of an event type is its highest version combined with
the highest version of every shared type. Records of any other writer schema are
resolved into it by Avro schema resolution (new fields take their defaults), which is
how old records are upcast into today's classes; where a version changed what a value
means, :mod:`ledger.upcasting` then rewrites the record. ``schemas/README.md`` states the
evolution rules; the codec enforces the one that matters for reading (a field added
since an older version needs a default) when it loads the tree.

Conversions between event dataclasses and Avro records are generic, driven by
:func:`dataclasses.fields` and the field types, and precomputed per class, because
the projector decodes millions of events: per event only the fields that need it are
touched (nested records, arrays to tuples, times to microseconds). Times are converted
between datetimes and microseconds here rather than by fastavro, both ways: fastavro
would take a naive datetime for local time, where the codec refuses naive datetimes; and
its ``timestamp-micros`` reader, called per value, made fastavro's reading of a record a
quarter slower than reading the plain ``long`` (measured on the events that are not
heartbeats). So fastavro reads and writes with the schemas' time fields as plain longs;
the fingerprints are those of the declared schemas. Decoding returns
timezone-aware UTC datetimes, exact to the microsecond.

Every failure, whether a record that is not single-object encoded, an unknown
fingerprint, a truncated or corrupt body, an unencodable event or an unusable schema
tree, raises :class:`CodecError` with a message that names the problem.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import itertools
import json
import os
import pathlib
import re
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from importlib.resources.abc import Traversable
from typing import Any, Final

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from ledger.errors import UsageError
from ledger.events import EVENT_TYPES, Event, from_micros, micros
from ledger.upcasting import upcast

MAGIC: Final = b"\xc3\x01"
HEADER_SIZE: Final = len(MAGIC) + 8
NAMESPACE: Final = "svledger"

_TIMESTAMP: Final = "timestamp-micros"
_VERSION_FILE: Final = re.compile(r"v([1-9][0-9]*)\.avsc")

Convert = Callable[[Any], Any]


class CodecError(UsageError):
    """An event cannot be encoded or decoded, or the schema tree is unusable."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Shape:
    """How one dataclass maps to its Avro record dict and back."""

    cls: type[Any]
    to_avro: Callable[[Any], dict[str, Any]]
    from_avro: Callable[[dict[str, Any]], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class _Writer:
    """A schema records may have been written with, and how to read them."""

    type_name: str
    version: int
    schema: Any
    reader: Any  # the reader schema, or None when this writer schema is the reader
    shape: _Shape
    newest: int  # the reader schema's version; an older writer's records are upcast


@dataclasses.dataclass(frozen=True, slots=True)
class _Encoder:
    """How events of one class are written: always with the type's reader schema."""

    type_name: str
    version: int
    header: bytes
    schema: Any
    shape: _Shape


class Codec:
    """Encodes events with the current schemas and decodes records of any shipped schema."""

    def __init__(self, root: Traversable | None = None) -> None:
        """Load every schema version under ``root`` (default: the packaged ``schemas``)."""
        tree = schema_tree(root)
        missing = sorted(EVENT_TYPES.keys() - tree.keys())
        if missing:
            raise CodecError(
                f"the schema tree has no schema for event type(s) {', '.join(missing)}: "
                f"add <schemas>/<Type>/v1.avsc for each (see schemas/README.md)"
            )
        shared = {
            f"{NAMESPACE}.{name}": versions
            for name, versions in tree.items()
            if name not in EVENT_TYPES
        }
        newest_shared = {name: versions[max(versions)] for name, versions in shared.items()}
        combinations = [
            dict(zip(shared, chosen, strict=True))
            for chosen in itertools.product(*(versions.values() for versions in shared.values()))
        ]
        self._writers: dict[bytes, _Writer] = {}
        self._encoders: dict[type[Any], _Encoder] = {}
        for type_name, versions in tree.items():
            if type_name not in EVENT_TYPES:
                continue
            newest = max(versions)
            reader_json = _inline(versions[newest], newest_shared)
            reader_fingerprint = _fingerprint(_parse(reader_json, type_name, newest))
            reader = _parse(_plain_times(reader_json), type_name, newest)
            shape = _shape(EVENT_TYPES[type_name], reader_json, _records(reader_json))
            self._encoders[shape.cls] = _Encoder(
                type_name, newest, MAGIC + reader_fingerprint, reader, shape
            )
            for version, schema in sorted(versions.items()):
                for definitions in combinations:
                    writer_json = _inline(schema, definitions)
                    _check_readable(writer_json, reader_json, type_name, version, newest)
                    key = _fingerprint(_parse(writer_json, type_name, version))
                    writer = _parse(_plain_times(writer_json), type_name, version)
                    same = key == reader_fingerprint
                    self._writers[key] = _Writer(
                        type_name, version, writer, None if same else reader, shape, newest
                    )

    def encode(self, event: Event) -> bytes:
        """The single-object encoding of ``event`` with its type's current schema."""
        encoder = self._encoders.get(type(event))
        if encoder is None:
            raise CodecError(
                f"{type(event).__name__!r} is not an event type; "
                f"events are instances of {', '.join(EVENT_TYPES)}"
            )
        record = encoder.shape.to_avro(event)
        if (field := _nul_field(record)) is not None:
            raise CodecError(
                f"cannot encode {event!r}: its {field} holds a NUL character, which no"
                " database's text can store; remove it"
            )
        out = io.BytesIO()
        out.write(encoder.header)
        try:
            fastavro.schemaless_writer(out, encoder.schema, record)
        except CodecError:
            raise
        except Exception as error:
            raise CodecError(
                f"cannot encode {event!r} with schema {encoder.type_name} "
                f"v{encoder.version}: {type(error).__name__}: {error}"
            ) from error
        return out.getvalue()

    def decode(self, data: bytes) -> Event:
        """The event in ``data``, upcast from its writer schema to the current class."""
        writer = self._writer_of(data)
        read = self._read(writer, data)
        try:
            return typing.cast(Event, writer.shape.from_avro(read))
        except (OverflowError, ValueError) as error:  # a time no datetime holds, say
            raise CodecError(
                f"{writer.type_name} record ({len(data)} bytes, schema v{writer.version}) "
                f"is corrupt: {type(error).__name__}: {error}"
            ) from error

    def _read(self, writer: _Writer, data: bytes) -> dict[str, Any]:
        stream = io.BytesIO(data)
        stream.seek(HEADER_SIZE)
        try:
            record = fastavro.schemaless_reader(stream, writer.schema, writer.reader)
        except Exception as error:
            raise CodecError(
                f"{writer.type_name} record ({len(data)} bytes, schema v{writer.version}) "
                f"is truncated or corrupt: {type(error).__name__}: {error}"
            ) from error
        if stream.tell() != len(data):
            raise CodecError(
                f"{writer.type_name} record ({len(data)} bytes, schema v{writer.version}) "
                f"is corrupt: {len(data) - stream.tell()} bytes left over after the event"
            )
        read = typing.cast(dict[str, Any], record)
        if (field := _nul_field(read)) is not None:
            raise CodecError(
                f"{writer.type_name} record ({len(data)} bytes, schema v{writer.version}) "
                f"holds a NUL character in {field}, which no database's text can store"
                " (PostgreSQL refuses it): not an event any writer of the ledger makes"
            )
        if writer.version < writer.newest:
            return upcast(writer.type_name, writer.version, writer.newest, read)
        return read

    def type_of(self, data: bytes) -> str:
        """The event type name of an encoded record, from its header alone."""
        return self._writer_of(data).type_name

    def fingerprints(self) -> dict[bytes, tuple[str, int]]:
        """Every writer schema's fingerprint, as on the wire, and its event type and version."""
        return {key: (writer.type_name, writer.version) for key, writer in self._writers.items()}

    def _writer_of(self, data: bytes) -> _Writer:
        if data[: len(MAGIC)] != MAGIC:
            raise CodecError(
                f"not an svledger event: records start with the Avro single-object marker "
                f"c3 01; got {_preview(data)}"
            )
        if len(data) < HEADER_SIZE:
            raise CodecError(
                f"truncated record: {_preview(data)}, shorter than the {HEADER_SIZE}-byte "
                f"single-object header"
            )
        key = bytes(data[len(MAGIC) : HEADER_SIZE])
        writer = self._writers.get(key)
        if writer is None:
            raise CodecError(
                f"unknown writer schema fingerprint {key.hex()} (CRC-64-AVRO, as on the "
                f"wire): the record was written by a newer svledger or by another "
                f"producer; upgrade svledger to read it"
            )
        return writer


@functools.cache
def default_codec() -> Codec:
    """The codec of the packaged schemas, loaded once."""
    return Codec()


def encode(event: Event) -> bytes:
    """:meth:`Codec.encode` with the packaged schemas."""
    return default_codec().encode(event)


def _nul_field(value: Any, name: str = "") -> str | None:
    """The field (``meta.source``, ``served_versions[1]``) of a record (as Avro reads or
    writes it) whose string holds a NUL character, if one does: about a microsecond."""
    kind = type(value)
    if kind is str:
        return name if "\x00" in value else None
    if kind is dict:
        prefix = f"{name}." if name else ""
        for key, item in value.items():
            if (found := _nul_field(item, prefix + key)) is not None:
                return found
    elif kind is list or kind is tuple:
        for index, item in enumerate(value):
            if (found := _nul_field(item, f"{name}[{index}]")) is not None:
                return found
    return None


def decode(data: bytes) -> Event:
    """:meth:`Codec.decode` with the packaged schemas."""
    return default_codec().decode(data)


def type_of(data: bytes) -> str:
    """:meth:`Codec.type_of` with the packaged schemas."""
    return default_codec().type_of(data)


def headers_of(type_name: str) -> tuple[bytes, ...]:
    """The single-object headers (``c3 01`` and the fingerprint) of every packaged
    schema version of the event type ``type_name``: a record of that type starts with
    one of them (``bytes.startswith`` takes the tuple)."""
    fingerprints = default_codec().fingerprints().items()
    return tuple(MAGIC + key for key, (name, _) in fingerprints if name == type_name)


def schema_tree(root: Traversable | None = None) -> dict[str, dict[int, Any]]:
    """``{type name: {version: schema JSON}}`` of every shipped schema (default: the packaged)."""
    return _load_tree(root if root is not None else _packaged_schemas())


def _packaged_schemas() -> Traversable:
    """The installed ``schemas`` namespace package's directory.

    Not ``importlib.resources.files("schemas")``: under a setuptools editable install
    the namespace package's ``__path__`` also holds a placeholder that is not a
    directory, and ``files()`` refuses the whole package.
    """
    for entry in importlib.import_module("schemas").__path__:
        if os.path.isdir(entry):
            return pathlib.Path(entry)
    raise CodecError(
        "the packaged Avro schemas (package 'schemas') are missing: reinstall svledger"
    )


def _preview(data: bytes) -> str:
    """The record's length and first bytes, for error messages."""
    if not data:
        return "an empty record"
    more = " ..." if len(data) > 16 else ""
    return f"{len(data)} bytes: {bytes(data[:16]).hex(' ')}{more}"


def _load_tree(root: Traversable) -> dict[str, dict[int, Any]]:
    """``{type name: {version: schema JSON}}`` for every ``<Name>/v<N>.avsc`` under root."""
    tree: dict[str, dict[int, Any]] = {}
    for directory in root.iterdir():
        if not directory.is_dir() or directory.name.startswith((".", "_")):
            continue
        versions: dict[int, Any] = {}
        for file in directory.iterdir():
            where = f"{directory.name}/{file.name}"
            match = _VERSION_FILE.fullmatch(file.name)
            if match is None:
                raise CodecError(
                    f"unexpected file {where} in the schema tree: schemas are named "
                    f"<Type>/v<N>.avsc with N = 1, 2, ...; rename or remove it"
                )
            try:
                schema = json.loads(file.read_text(encoding="utf-8"))
            except ValueError as error:
                raise CodecError(f"schema {where} is not valid JSON: {error}") from error
            if not isinstance(schema, dict) or (
                schema.get("name"),
                schema.get("namespace"),
            ) != (directory.name, NAMESPACE):
                raise CodecError(
                    f"schema {where} must be a record named {directory.name!r} in "
                    f"namespace {NAMESPACE!r}, like its directory"
                )
            versions[int(match[1])] = schema
        if versions:
            tree[directory.name] = versions
    return tree


def _fullname(name: str) -> str:
    return name if "." in name else f"{NAMESPACE}.{name}"


def _inline(schema: Any, definitions: Mapping[str, Any]) -> Any:
    """``schema`` with each named type of ``definitions`` defined at its first reference."""
    pending = dict(definitions)

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            definition = pending.pop(_fullname(node), None)
            return node if definition is None else walk(definition)
        if isinstance(node, list):
            return [walk(branch) for branch in node]
        if not isinstance(node, dict):
            return node
        kind = node.get("type")
        if kind in ("record", "error"):
            fields = [{**field, "type": walk(field["type"])} for field in node["fields"]]
            return {**node, "fields": fields}
        if kind == "array":
            return {**node, "items": walk(node["items"])}
        if kind == "map":
            return {**node, "values": walk(node["values"])}
        return {**node, "type": walk(kind)}

    return walk(schema)


def _plain_times(schema: Any) -> Any:
    """``schema`` with its ``timestamp-micros`` values as plain longs: the same bytes on
    the wire, converted by the codec (:func:`_shape`) instead of by fastavro."""
    if isinstance(schema, list):
        return [_plain_times(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: _plain_times(value)
        for key, value in schema.items()
        if not (key == "logicalType" and value == _TIMESTAMP)
    }


def _records(schema: Any) -> dict[str, dict[str, Any]]:
    """Every record defined in ``schema`` by full name."""
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for branch in node:
                walk(branch)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "error"):
                namespace = node.get("namespace")
                name = node["name"]
                found[f"{namespace}.{name}" if namespace else _fullname(name)] = node
                for field in node["fields"]:
                    walk(field["type"])
            elif kind == "array":
                walk(node["items"])
            elif kind == "map":
                walk(node["values"])
            else:
                walk(kind)

    walk(schema)
    return found


def _check_readable(writer: Any, reader: Any, type_name: str, version: int, newest: int) -> None:
    """Refuse a tree whose reader schema adds a field without a default to a record."""
    written = _records(writer)
    undefaulted = [
        f"{fullname}.{field['name']}"
        for fullname, record in _records(reader).items()
        if fullname in written
        for field in record["fields"]
        if "default" not in field
        and not (
            {field["name"], *field.get("aliases", ())}
            & {f["name"] for f in written[fullname]["fields"]}
        )
    ]
    if undefaulted:
        raise CodecError(
            f"{type_name} v{newest} cannot read records written with {type_name} "
            f"v{version}: new field(s) {', '.join(undefaulted)} have no default; "
            f"new fields need defaults (see schemas/README.md)"
        )


def _parse(schema: Any, type_name: str, version: int) -> Any:
    try:
        return fastavro.parse_schema(schema)
    except Exception as error:
        raise CodecError(f"schema {type_name}/v{version}.avsc is invalid: {error}") from error


def _fingerprint(parsed: Any) -> bytes:
    # fastavro gives the CRC-64-AVRO value as the hex of its little-endian bytes,
    # which is the byte order of the single-object header.
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


def _shape(cls: type[Any], record: dict[str, Any], records: Mapping[str, Any]) -> _Shape:
    """The converters between ``cls`` and the Avro ``record`` schema, checked to match."""
    names = tuple(field.name for field in dataclasses.fields(cls))
    schema_fields = {field["name"]: field["type"] for field in record["fields"]}
    if names != tuple(schema_fields):
        raise CodecError(
            f"schema {record['name']} has fields {', '.join(schema_fields)} but class "
            f"{cls.__name__} has {', '.join(names)}: a field is added to the class and "
            f"to a new schema version together (see schemas/README.md)"
        )
    hints = typing.get_type_hints(cls)
    converters: dict[str, tuple[Convert | None, Convert | None]] = {}
    for name in names:
        python_type, optional = _unwrap_optional(hints[name])
        if dataclasses.is_dataclass(python_type):
            nested = _shape(
                typing.cast(type[Any], python_type),
                _record_type(schema_fields[name], records),
                records,
            )
            converters[name] = (
                _maybe(nested.to_avro, optional),
                _maybe(nested.from_avro, optional),
            )
        elif python_type is datetime:
            if _logical_type(schema_fields[name]) != _TIMESTAMP:
                raise CodecError(
                    f"{cls.__name__}.{name} is a datetime but schema {record['name']} "
                    f"declares it as {json.dumps(schema_fields[name])}; times are "
                    f'{{"type": "long", "logicalType": "{_TIMESTAMP}"}}'
                )
            converters[name] = (
                _maybe(_to_micros(f"{cls.__name__}.{name}"), optional),
                _maybe(from_micros, optional),
            )
        elif typing.get_origin(python_type) is tuple:
            converters[name] = (None, _maybe(tuple, optional))
        else:
            converters[name] = (None, None)
    return _compile(cls, converters)


def _compile(
    cls: type[Any], converters: Mapping[str, tuple[Convert | None, Convert | None]]
) -> _Shape:
    """Straight-line ``to_avro`` and ``from_avro`` functions for ``cls``.

    Generated source, as :mod:`dataclasses` generates ``__init__``, because a loop over
    fields costs several microseconds per event and the projector decodes millions.
    Field names are Python identifiers, so they are safe to splice into source.
    """
    namespace: dict[str, Any] = {"cls": cls}
    to_items: list[str] = []
    from_items: list[str] = []
    for index, (name, (to_avro, from_avro)) in enumerate(converters.items()):
        value = f"obj.{name}"
        if to_avro is not None:
            namespace[f"to_{index}"] = to_avro
            value = f"to_{index}({value})"
        to_items.append(f"{name!r}: {value}")
        value = f"record[{name!r}]"
        if from_avro is not None:
            namespace[f"from_{index}"] = from_avro
            value = f"from_{index}({value})"
        from_items.append(f"{name}={value}")
    source = (
        f"def to_avro(obj):\n    return {{{', '.join(to_items)}}}\n"
        f"def from_avro(record):\n    return cls({', '.join(from_items)})\n"
    )
    exec(compile(source, f"<svledger.codec {cls.__name__}>", "exec"), namespace)
    return _Shape(cls, namespace["to_avro"], namespace["from_avro"])


def _logical_type(avro_type: Any) -> Any:
    """The logical type of a field's type, or of its one non-null branch."""
    if isinstance(avro_type, list):
        present = [branch for branch in avro_type if branch != "null"]
        avro_type = present[0] if len(present) == 1 else None
    return avro_type.get("logicalType") if isinstance(avro_type, dict) else None


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        present = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(present) == 1:
            return present[0], True
    return hint, False


def _record_type(avro_type: Any, records: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(avro_type, list):
        (avro_type,) = [branch for branch in avro_type if branch != "null"]
    if isinstance(avro_type, str):
        avro_type = records[_fullname(avro_type)]
    return typing.cast(dict[str, Any], avro_type)


def _maybe(convert: Convert, optional: bool) -> Convert:
    if not optional:
        return convert
    return lambda value: None if value is None else convert(value)


def _to_micros(where: str) -> Convert:
    def convert(value: datetime) -> int:
        if value.tzinfo is None:
            raise CodecError(
                f"{where} is a naive datetime ({value.isoformat()}); events carry "
                f"timezone-aware UTC times, e.g. datetime.now(UTC)"
            )
        return micros(value)

    return convert
