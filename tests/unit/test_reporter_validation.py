"""A report is checked when built: bad names and versions fail with the field, value and rule."""

from __future__ import annotations

import string
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.kafka import EventProducer
from ledger.reporter import Reporter, ResourceReport, ThreadedReporter
from ledger.settings import KafkaSettings
from ledger.validation import InvalidReport

ALNUM = string.ascii_lowercase + string.digits


@st.composite
def dns_labels(draw: st.DrawFn, max_size: int = 63, first: str = ALNUM) -> str:
    """A DNS-1123 label built from its definition (``first`` narrows the first character)."""
    size = draw(st.integers(min_value=1, max_value=max_size))
    if size == 1:
        return draw(st.sampled_from(first))
    middle = draw(st.text(alphabet=ALNUM + "-", min_size=size - 2, max_size=size - 2))
    return draw(st.sampled_from(first)) + middle + draw(st.sampled_from(ALNUM))


subdomains = st.lists(dns_labels(max_size=20), min_size=1, max_size=8).map(".".join)
versions = dns_labels(first=string.ascii_lowercase)


def _report(**fields: object) -> ResourceReport:
    values: dict[str, object] = {
        "group": "apps",
        "resource": "deployments",
        "kind": "Deployment",
        "encoding_version": "v1",
        "decodable_versions": ("v1", "v1beta1"),
        "served_versions": ("v1",),
    }
    values.update(fields)
    return ResourceReport(**values)  # type: ignore[arg-type]


resources = dns_labels(first=string.ascii_lowercase)


@given(group=st.one_of(st.just(""), subdomains), resource=resources, version=versions)
def test_valid_names_are_accepted(group: str, resource: str, version: str) -> None:
    report = _report(
        group=group,
        resource=resource,
        encoding_version=version,
        decodable_versions=[version, "v1"],
        served_versions=[version],
    )
    assert report.key == (group, resource)
    assert report.decodable_versions == (version, "v1")


def _break(name: str, how: int, position: int) -> str:
    """A name that breaks the DNS-1123 rules in one of several ways."""
    cut = position % (len(name) + 1)
    return [
        name[:cut] + "A" + name[cut:],  # uppercase
        name[:cut] + "_" + name[cut:],  # character outside the alphabet
        "-" + name,  # starts with a dash
        name + "-",  # ends with a dash
        name + "x" * (64 - len(name)),  # 64 characters: longer than a label may be
    ][how]


@given(
    dns_labels(max_size=40, first=string.ascii_lowercase), st.integers(0, 4), st.integers(0, 100)
)
def test_invalid_resource_names_are_refused(name: str, how: int, position: int) -> None:
    bad = _break(name, how, position)
    with pytest.raises(InvalidReport) as raised:
        _report(resource=bad)
    assert raised.value.field == "resource"
    assert raised.value.value == bad
    assert repr(bad) in str(raised.value)
    assert "DNS-1035 label" in str(raised.value)


@given(dns_labels(max_size=40, first=string.digits))
def test_a_resource_starting_with_a_digit_is_refused(name: str) -> None:
    # Upstream's ValidateStorageVersionName: the resource segment is a DNS-1035 label.
    with pytest.raises(InvalidReport, match="starting with a letter") as raised:
        _report(resource=name)
    assert raised.value.field == "resource"


@given(subdomains, st.integers(0, 3), st.integers(0, 100))
def test_invalid_group_names_are_refused(group: str, how: int, position: int) -> None:
    bad = _break(group, how, position)
    with pytest.raises(InvalidReport) as raised:
        _report(group=bad)
    assert raised.value.field == "group"
    assert raised.value.value == bad


def test_group_longer_than_a_subdomain_is_refused() -> None:
    group = ".".join(["a" * 63] * 4)  # 255 characters of valid labels
    with pytest.raises(InvalidReport, match="group"):
        _report(group=group)


def test_core_group_must_be_written_empty() -> None:
    with pytest.raises(InvalidReport, match="empty string") as raised:
        _report(group="core", resource="pods", kind="Pod")
    assert raised.value.field == "group"


@given(versions.filter(lambda v: v not in ("v1", "v1beta1")))
def test_encoding_version_must_be_decodable(version: str) -> None:
    # Upstream blames the list: "decodableVersions must include encodingVersion".
    with pytest.raises(InvalidReport) as raised:
        _report(encoding_version=version)
    assert raised.value.field == "decodable_versions"
    assert raised.value.value == ["v1", "v1beta1"]
    assert f"must include encoding_version {version!r}" in raised.value.rule


def test_every_rule_a_report_breaks_is_named_as_upstreams_validation_lists_them() -> None:
    # A row of upstream's TestValidateServerStorageVersion: its error is the served one.
    with pytest.raises(InvalidReport) as raised:
        _report(
            encoding_version="mygroup.com/v2",
            decodable_versions=("mygroup.com/v2", "/v3"),
            served_versions=("mygroup.com/",),
        )
    assert (raised.value.field, raised.value.value) == ("decodable_versions", "/v3")
    assert [(more.field, more.value) for more in raised.value.more] == [
        ("served_versions", "mygroup.com/"),
        ("served_versions", "mygroup.com/"),  # malformed, and not decodable
    ]
    assert "invalid served_versions 'mygroup.com/'" in str(raised.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("encoding_version", "1"),
        ("encoding_version", "V1"),
        ("decodable_versions", ("v1", "v1_beta")),
        ("served_versions", ("v1", "")),
        ("kind", ""),
        ("kind", "9Lives"),
        ("kind", "Deploy ment"),
        ("decodable_versions", ()),
    ],
)
def test_each_field_is_named_when_it_breaks_a_rule(field: str, value: object) -> None:
    with pytest.raises(InvalidReport) as raised:
        _report(**{field: value})
    assert raised.value.field == field
    assert str(raised.value).startswith(f"invalid {field} ")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("encoding_version", None),
        ("kind", 7),
        ("decodable_versions", "v1"),  # one string, not a list of one
        ("served_versions", None),
        ("decodable_versions", ("v1", 1)),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(InvalidReport) as raised:
        _report(**{field: value})
    assert raised.value.field == field
    assert repr(value) in str(raised.value)


def test_reports_compare_by_value_whatever_sequence_was_given() -> None:
    assert _report(decodable_versions=["v1", "v1beta1"]) == _report(
        decodable_versions=("v1", "v1beta1")
    )


def test_versions_are_group_qualified_as_upstream_writes_them() -> None:
    report = _report(
        encoding_version="apps/v1",
        decodable_versions=("apps/v1", "apps/v1beta2"),
        served_versions=("apps/v1",),
    )
    assert report.encoding_version == "apps/v1"
    # events.k8s.io events are stored as core v1 Events.
    _report(
        group="events.k8s.io",
        resource="events",
        kind="Event",
        encoding_version="v1",
        decodable_versions=("v1", "events.k8s.io/v1"),
        served_versions=("events.k8s.io/v1",),
    )


@pytest.mark.parametrize(
    ("bad", "blamed"),
    [
        ("Apps/v1", ["group"]),
        ("apps/", ["version"]),
        ("/v1", ["group"]),
        ("apps/V1", ["version"]),
        ("a_b/v1", ["group"]),
        # Upstream's isValidAPIVersion lists both parts' errors, and refuses a third part.
        ("Bad_Group/V1", ["group", "version"]),
        ("/", ["group", "version"]),
        ("apps/v1/x", ["'/' at most"]),
        ("mygroup.com/v2/myresource", ["'/' at most"]),
    ],
)
def test_a_malformed_group_version_is_refused_naming_each_part_that_breaks(
    bad: str, blamed: list[str]
) -> None:
    with pytest.raises(InvalidReport) as raised:
        _report(encoding_version=bad, decodable_versions=(bad,), served_versions=())
    assert raised.value.field == "encoding_version"
    assert raised.value.value == bad
    named = [
        part
        for part, words in [
            ("group", "the group a DNS-1123"),
            ("version", "the version a DNS-1035"),
            ("'/' at most", "one '/' at most"),
        ]
        if words in raised.value.rule
    ]
    assert named == blamed


def test_a_served_version_must_be_decodable() -> None:
    with pytest.raises(InvalidReport) as raised:
        _report(
            encoding_version="apps/v1",
            decodable_versions=("apps/v1",),
            served_versions=("apps/v1", "apps/v2"),
        )
    assert (raised.value.field, raised.value.value) == ("served_versions", "apps/v2")
    assert "cannot serve a version it cannot decode" in str(raised.value)


@pytest.mark.parametrize(
    "options",
    [
        {"lease_duration_seconds": 3600.5},
        {"lease_duration_seconds": 2**31},  # past a Lease's int32
        {"lease_duration_seconds": 0},
        {"lease_duration_seconds": True},
        {"heartbeat_interval": 0},
        {"heartbeat_interval": 3600},  # as long as the lease: it would lapse
    ],
)
def test_a_reporter_refuses_timings_a_lease_cannot_hold(options: dict[str, Any]) -> None:
    producer = EventProducer(KafkaSettings())  # not started: nothing is sent
    with pytest.raises(ValueError) as raised:
        Reporter("east", "cp-0.example", [_report()], producer, **options)
    [(name, value)] = options.items()
    assert f"{name}={value!r}" in str(raised.value)


def test_a_threaded_reporter_needs_kafka_settings_before_it_starts_a_thread() -> None:
    threads = set(threading.enumerate())
    with pytest.raises(TypeError, match="settings=None must be KafkaSettings"):
        ThreadedReporter("east", "cp-0.example", [_report()], None)  # type: ignore[arg-type]
    assert set(threading.enumerate()) <= threads
