"""The Avro codec: round trips, the wire format, schema evolution, and bad input."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import pathlib
import shutil
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given
from hypothesis import strategies as st

from ledger import codec
from ledger.codec import Codec, CodecError
from ledger.events import (
    EVENT_TYPES,
    ApiserverHeartbeat,
    Event,
    Meta,
    StorageStateReset,
    StorageVersionReported,
    heartbeat_term,
    micros,
    type_name,
)
from tests import strategies

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMAS = pathlib.Path(__file__).parents[2] / "schemas"


def crc64_avro(data: bytes) -> int:
    """The 64-bit Rabin fingerprint exactly as the Avro specification gives it."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_the_specification_fingerprint_matches_published_vectors() -> None:
    # From the Avro implementations' own tests (Ruby, Go, C#).
    assert crc64_avro(b'"int"') == 0x7275D51A3F395C8F
    assert crc64_avro(b'"null"') == 7195948357588979594


def read_schema(type_dir: pathlib.Path, version: int) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((type_dir / f"v{version}.avsc").read_text())
    return schema


def with_meta(event_schema: dict[str, Any], meta_schema: dict[str, Any]) -> dict[str, Any]:
    """The event schema with the Meta record defined where it is referenced."""
    composed = copy.deepcopy(event_schema)
    for field in composed["fields"]:
        if field["type"] == "svledger.Meta":
            field["type"] = meta_schema
    return composed


def single_object(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """A record encoded by the Avro specification, independently of the codec."""
    parsed = fastavro.parse_schema(schema)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, parsed, record)
    fingerprint = crc64_avro(to_parsing_canonical_form(parsed).encode())
    return b"\xc3\x01" + fingerprint.to_bytes(8, "little") + body.getvalue()


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
@given(data=st.data())
def test_every_event_type_round_trips(name: str, data: st.DataObject) -> None:
    event = data.draw(strategies.BY_TYPE[name]())
    encoded = codec.encode(event)
    decoded = codec.decode(encoded)
    assert decoded == event
    assert type(decoded) is type(event)
    assert codec.type_of(encoded) == type_name(event) == name


@given(strategies.events())
def test_decoded_times_are_utc_and_exact_to_the_microsecond(event: Event) -> None:
    decoded = codec.decode(codec.encode(event))
    for before, after in [(event.meta.occurred_at, decoded.meta.occurred_at)] + [
        (getattr(event, name), getattr(decoded, name))
        for name in ("renew_time", "last_renew_time")
        if hasattr(event, name)
    ]:
        assert after.utcoffset() == timedelta(0)
        assert after == before
        assert after.microsecond == before.astimezone(UTC).microsecond


def test_a_time_in_another_zone_decodes_as_the_same_instant_in_utc() -> None:
    berlin_summer = timezone(timedelta(hours=2))
    occurred = datetime(2024, 6, 1, 14, 30, 15, 123456, tzinfo=berlin_summer)
    event = StorageStateReset(Meta.new("prod", "alice", occurred), "apps", "deployments", "restore")
    decoded = codec.decode(codec.encode(event))
    assert decoded.meta.occurred_at == datetime(2024, 6, 1, 12, 30, 15, 123456, tzinfo=UTC)
    assert decoded.meta.occurred_at.tzinfo == UTC


@given(strategies.apiserver_heartbeat())
def test_records_follow_the_avro_single_object_encoding(event: ApiserverHeartbeat) -> None:
    schema = with_meta(
        read_schema(SCHEMAS / "ApiserverHeartbeat", 2), read_schema(SCHEMAS / "Meta", 1)
    )
    record = {
        "meta": {
            "event_id": event.meta.event_id,
            "cluster": event.meta.cluster,
            "occurred_at": event.meta.occurred_at,
            "source": event.meta.source,
            "causation_id": event.meta.causation_id,
            "correlation_id": event.meta.correlation_id,
        },
        "apiserver_id": event.apiserver_id,
        "holder_identity": event.holder_identity,
        "hostname": event.hostname,
        "lease_duration_seconds": event.lease_duration_seconds,
        "renew_time": event.renew_time,
        "binary_version": event.binary_version,
        "peer_advertise_address": event.peer_advertise_address,
    }
    assert codec.encode(event) == single_object(schema, record)


@pytest.fixture
def schema_root(tmp_path: pathlib.Path) -> pathlib.Path:
    """A writable copy of the shipped schema tree."""
    root = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, root)
    return root


def ship_older_version(root: pathlib.Path, name: str, drop: str) -> dict[str, Any]:
    """Make the newest shipped version of ``name`` one newer and put it without field
    ``drop`` in its place."""
    type_dir = root / name
    newest = max(int(path.stem[1:]) for path in type_dir.glob("v*.avsc"))
    current = read_schema(type_dir, newest)
    (type_dir / f"v{newest}.avsc").rename(type_dir / f"v{newest + 1}.avsc")
    older = copy.deepcopy(current)
    older["fields"] = [field for field in current["fields"] if field["name"] != drop]
    (type_dir / f"v{newest}.avsc").write_text(json.dumps(older))
    return older


def test_an_older_version_decodes_into_the_current_class_with_the_new_fields_default() -> None:
    # ApiserverHeartbeat v1, as shipped, before v2 added the peer advertise address.
    older = read_schema(SCHEMAS / "ApiserverHeartbeat", 1)
    assert "peer_advertise_address" not in {field["name"] for field in older["fields"]}
    renewed = datetime(2024, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
    record = {
        "meta": {
            "event_id": "8d7a2c1e-0000-4000-8000-000000000001",
            "cluster": "prod",
            "occurred_at": renewed,
            "source": "apiserver-x",
            "causation_id": None,
            "correlation_id": None,
        },
        "apiserver_id": "apiserver-x",
        "holder_identity": "apiserver-x_1",
        "hostname": "cp-1",
        "lease_duration_seconds": 3600,
        "renew_time": renewed,
        "binary_version": "v1.31.0",
    }
    written = single_object(with_meta(older, read_schema(SCHEMAS / "Meta", 1)), record)

    decoded = codec.decode(written)

    assert decoded == ApiserverHeartbeat(
        meta=Meta("8d7a2c1e-0000-4000-8000-000000000001", "prod", renewed, "apiserver-x"),
        apiserver_id="apiserver-x",
        holder_identity="apiserver-x_1",
        hostname="cp-1",
        lease_duration_seconds=3600,
        renew_time=renewed,
        binary_version="v1.31.0",
        peer_advertise_address=None,
    )
    # Its lease term is the one its record's svledger-lease header was written with
    # before v2, so thinning tells its renewals as it did.
    written_before = "\0".join(("prod", "apiserver-x", "apiserver-x_1", "cp-1", "3600", "+v1.31.0"))
    assert (
        heartbeat_term(decoded) == hashlib.blake2b(written_before.encode(), digest_size=16).digest()
    )
    addressed = dataclasses.replace(decoded, peer_advertise_address="10.0.0.1:6443")
    assert heartbeat_term(addressed) != heartbeat_term(decoded)


def test_a_new_field_takes_the_default_its_schema_declares(schema_root: pathlib.Path) -> None:
    older = ship_older_version(schema_root, "StorageStateReset", drop="reason")
    newest = read_schema(schema_root / "StorageStateReset", 2)
    for field in newest["fields"]:
        if field["name"] == "reason":
            field["default"] = "reset before reasons were recorded"
    (schema_root / "StorageStateReset" / "v2.avsc").write_text(json.dumps(newest))
    occurred = datetime(2023, 1, 1, tzinfo=UTC)
    meta = {"event_id": "e", "cluster": "c", "occurred_at": occurred, "source": "bob"}
    written = single_object(
        with_meta(older, read_schema(schema_root / "Meta", 1)),
        {
            "meta": {**meta, "causation_id": None, "correlation_id": None},
            "group": "",
            "resource": "pods",
        },
    )

    decoded = Codec(schema_root).decode(written)

    assert decoded == StorageStateReset(
        Meta("e", "c", occurred, "bob"), "", "pods", "reset before reasons were recorded"
    )


def test_records_written_with_an_older_shared_meta_still_decode(
    schema_root: pathlib.Path,
) -> None:
    older_meta = ship_older_version(schema_root, "Meta", drop="correlation_id")
    occurred = datetime(2022, 5, 5, 5, 5, 5, 5, tzinfo=UTC)
    written = single_object(
        with_meta(read_schema(schema_root / "StorageStateReset", 1), older_meta),
        {
            "meta": {
                "event_id": "e",
                "cluster": "c",
                "occurred_at": occurred,
                "source": "bob",
                "causation_id": "cause",
            },
            "group": "apps",
            "resource": "deployments",
            "reason": "restore",
        },
    )
    current = Codec(schema_root)
    event = StorageStateReset(
        Meta("e", "c", occurred, "bob", "cause"), "apps", "deployments", "restore"
    )

    assert current.decode(written) == event
    assert current.decode(current.encode(event)) == event


def test_a_new_field_without_default_is_refused_when_the_tree_loads(
    schema_root: pathlib.Path,
) -> None:
    ship_older_version(schema_root, "ApiserverHeartbeat", drop="hostname")
    with pytest.raises(CodecError, match=r"svledger\.ApiserverHeartbeat\.hostname have no default"):
        Codec(schema_root)


def test_a_schema_that_differs_from_its_class_is_refused(schema_root: pathlib.Path) -> None:
    # Its newest schema is then v1, which lacks the class's peer_advertise_address.
    (schema_root / "ApiserverHeartbeat" / "v2.avsc").unlink()
    with pytest.raises(CodecError, match=r"class ApiserverHeartbeat has .*peer_advertise_address"):
        Codec(schema_root)


def test_a_time_declared_without_timestamp_micros_is_refused(schema_root: pathlib.Path) -> None:
    # The codec converts times itself, so a time must be declared as one to be converted.
    path = schema_root / "ApiserverLeaseExpired" / "v1.avsc"
    schema = json.loads(path.read_text())
    for field in schema["fields"]:
        if field["name"] == "last_renew_time":
            field["type"] = "long"
    path.write_text(json.dumps(schema))
    with pytest.raises(CodecError, match=r"ApiserverLeaseExpired\.last_renew_time is a datetime"):
        Codec(schema_root)


def test_a_tree_without_some_event_type_is_refused(schema_root: pathlib.Path) -> None:
    shutil.rmtree(schema_root / "MigrationFailed")
    with pytest.raises(CodecError, match=r"no schema for event type.*MigrationFailed"):
        Codec(schema_root)


def test_a_misnamed_schema_file_is_refused(schema_root: pathlib.Path) -> None:
    (schema_root / "StorageStateReset" / "v1.avsc").rename(
        schema_root / "StorageStateReset" / "V2.avsc"
    )
    with pytest.raises(CodecError, match=r"StorageStateReset/V2\.avsc"):
        Codec(schema_root)


@given(st.binary())
def test_random_bytes_raise_the_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        codec.decode(data)


@given(strategies.events(), st.data())
def test_every_truncation_raises_the_codec_error(event: Event, data: st.DataObject) -> None:
    encoded = codec.encode(event)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(CodecError, match=r"truncated|not an svledger event"):
        codec.decode(encoded[:cut])


@given(strategies.events(), st.integers(min_value=16, max_value=16 + 63))
def test_a_bit_flip_in_the_fingerprint_is_an_unknown_fingerprint(event: Event, bit: int) -> None:
    encoded = bytearray(codec.encode(event))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(
        CodecError, match=f"unknown writer schema fingerprint {encoded[2:10].hex()}"
    ):
        codec.decode(bytes(encoded))
    with pytest.raises(CodecError, match="upgrade svledger"):
        codec.type_of(bytes(encoded))


@given(strategies.events(), st.integers(min_value=0, max_value=15))
def test_a_wrong_marker_says_it_is_not_single_object_encoded(event: Event, bit: int) -> None:
    encoded = bytearray(codec.encode(event))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(
        CodecError, match=f"c3 01; got {len(encoded)} bytes: {encoded[:2].hex(' ')}"
    ):
        codec.decode(bytes(encoded))


@given(strategies.events(), st.data())
def test_a_corrupt_body_decodes_to_some_event_or_raises_the_codec_error(
    event: Event, data: st.DataObject
) -> None:
    encoded = bytearray(codec.encode(event))
    for bit in data.draw(st.lists(st.integers(80, len(encoded) * 8 - 1), min_size=1, max_size=4)):
        encoded[bit // 8] ^= 1 << (bit % 8)
    encoded += data.draw(st.binary(max_size=4))
    try:
        decoded = codec.decode(bytes(encoded))
    except CodecError:
        return
    assert type(decoded) is type(event)


@given(strategies.events(), st.binary(min_size=1, max_size=8))
def test_bytes_after_the_event_are_corrupt(event: Event, extra: bytes) -> None:
    with pytest.raises(CodecError, match="bytes left over"):
        codec.decode(codec.encode(event) + extra)


def test_a_naive_datetime_is_refused_with_the_field_named() -> None:
    naive = datetime(2024, 1, 1, 12, 0)
    event = ApiserverHeartbeat(
        Meta.new("prod", "apiserver-x", T0), "apiserver-x", "apiserver-x_1", "cp-1", 3600, naive
    )
    with pytest.raises(CodecError, match=r"ApiserverHeartbeat\.renew_time is a naive datetime"):
        codec.encode(event)


def test_a_value_out_of_its_avro_range_is_refused_with_the_event_shown() -> None:
    event = ApiserverHeartbeat(
        Meta.new("prod", "apiserver-x", T0),
        "apiserver-x",
        "apiserver-x_1",
        "cp-1",
        2**64,
        datetime.now(UTC),
    )
    with pytest.raises(
        CodecError,
        match=r"cannot encode ApiserverHeartbeat.*lease_duration_seconds=18446744073709551616",
    ):
        codec.encode(event)


def test_an_object_that_is_not_an_event_is_refused() -> None:
    with pytest.raises(CodecError, match="'Meta' is not an event type"):
        codec.encode(Meta.new("prod", "x", T0))  # type: ignore[arg-type]


def test_a_time_out_of_a_datetimes_range_is_corrupt_with_the_type_named() -> None:
    # A flipped bit in a timestamp reads as a long no datetime holds.
    event = ApiserverHeartbeat(
        Meta.new("prod", "apiserver-x", T0), "apiserver-x", "apiserver-x_1", "cp-1", 3600, T0
    )
    encoded = codec.encode(event)
    body = encoded.replace(avro_long(micros(T0)), avro_long(2**62))
    assert body != encoded
    with pytest.raises(CodecError, match=r"ApiserverHeartbeat record .* is corrupt: OverflowError"):
        codec.decode(body)


def avro_long(value: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, "long", value)
    return out.getvalue()


def test_a_nul_character_in_a_string_is_refused_both_ways_naming_the_field() -> None:
    """PostgreSQL stores no NUL in text: a record holding one stopped the projector for
    every cluster. No writer makes one, and every reader dead-letters one."""
    event = ApiserverHeartbeat(
        Meta.new("prod", "apiserver-x", T0), "apiserver-x", "apiserver-x_1", "cp-1", 3600, T0
    )
    with pytest.raises(CodecError, match=r"its hostname holds a NUL character"):
        codec.encode(dataclasses.replace(event, hostname="cp\x001"))
    forged = codec.encode(event).replace(b"cp-1", b"cp\x001")  # the same length
    with pytest.raises(CodecError, match=r"ApiserverHeartbeat record .* NUL character in hostname"):
        codec.decode(forged)
    reported = codec.encode(
        StorageVersionReported(
            Meta.new("prod", "apiserver-x", T0), "apiserver-x", "apps", "deployments",
            "Deployment", "apps/v1", ("apps/v1", "apps/v2"), ("apps/v1",),
        )
    )  # fmt: skip
    with pytest.raises(CodecError, match=r"NUL character in decodable_versions\[1\]"):
        codec.decode(reported.replace(b"apps/v2", b"apps/\x002"))
