"""Who may say what through a cluster's inbox: :func:`consumers.admission.judge`."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.admission import MAX_VALUE_BYTES, REPORTER_EVENTS, Refused, judge
from ledger.codec import encode
from ledger.errors import UsageError
from ledger.events import Event
from ledger.settings import KafkaSettings
from tests.strategies import FEW, events


def _in(event: Event, cluster: str) -> Event:
    return dataclasses.replace(event, meta=dataclasses.replace(event.meta, cluster=cluster))


def _from_its_apiserver(event: Event) -> Event:
    source = getattr(event, "apiserver_id", event.meta.source)
    return dataclasses.replace(event, meta=dataclasses.replace(event.meta, source=source))


@given(events(domains=FEW))
def test_a_reporter_says_only_what_reporters_emit_and_for_its_own_cluster(event: Event) -> None:
    event = _from_its_apiserver(event)
    cluster = event.meta.cluster
    verdict = judge(cluster, cluster.encode(), encode(event))
    if type(event) in REPORTER_EVENTS:
        assert verdict == event
    else:
        assert isinstance(verdict, Refused)
        assert verdict.rule == "type"
        assert type(event).__name__ in verdict.reason
        assert event.meta.event_id in verdict.reason


@given(events(domains=FEW), st.sampled_from(["east", "west", "prod-eu-1"]))
def test_an_event_for_another_cluster_is_refused_whatever_its_type(
    event: Event, inbox: str
) -> None:
    forged = _in(event, "elsewhere")
    verdict = judge(inbox, b"elsewhere", encode(forged))
    assert isinstance(verdict, Refused)
    assert verdict.rule == "cluster"
    assert "'elsewhere'" in verdict.reason and repr(inbox) in verdict.reason


@given(events(domains=FEW))
def test_a_record_keyed_to_another_cluster_is_refused(event: Event) -> None:
    cluster = event.meta.cluster
    verdict = judge(cluster, b"not-" + cluster.encode(), encode(event))
    assert isinstance(verdict, Refused) and verdict.rule == "key"


@given(st.binary(max_size=64) | st.none())
def test_bytes_that_are_no_event_are_refused_with_the_codec_s_reason(value: bytes | None) -> None:
    verdict = judge("east", b"east", value)
    assert isinstance(verdict, Refused) and verdict.rule == "undecodable"
    assert verdict.reason


def test_inbox_topics_are_named_after_the_ledger_and_the_cluster() -> None:
    settings = KafkaSettings(topic="fleet.events", inbox=True)
    assert settings.inbox_topic("east") == "fleet.events.inbox.east"
    assert settings.write_topic("east") == "fleet.events.inbox.east"
    assert KafkaSettings(topic="fleet.events").write_topic("east") == "fleet.events"


def test_a_cluster_name_that_cannot_name_a_topic_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as refused:
        KafkaSettings(inbox=True).inbox_topic("east/1")
    assert "'east/1'" in str(refused.value) and "[a-zA-Z0-9._-]" in str(refused.value)


def test_inbox_is_read_from_the_environment_and_checked() -> None:
    assert KafkaSettings.from_env({"SVLEDGER_INBOX": "true"}).inbox
    assert not KafkaSettings.from_env({"SVLEDGER_INBOX": "0"}).inbox
    with pytest.raises(UsageError, match=r"SVLEDGER_INBOX='maybe': must be true or false"):
        KafkaSettings.from_env({"SVLEDGER_INBOX": "maybe"})


@given(events(domains=FEW))
def test_a_reporter_speaks_only_as_its_apiserver(event: Event) -> None:
    """Its events name their apiserver as their source; one naming another (a service's
    name, say) would be attributed to it."""
    if type(event) not in REPORTER_EVENTS:
        return
    cluster = event.meta.cluster
    forged = dataclasses.replace(
        event, meta=dataclasses.replace(event.meta, source="svledger-migrator")
    )
    verdict = judge(cluster, cluster.encode(), encode(forged))
    assert isinstance(verdict, Refused) and verdict.rule == "source"
    assert "'svledger-migrator'" in verdict.reason


def test_a_record_larger_than_any_event_is_refused_before_it_is_read() -> None:
    verdict = judge("east", b"east", bytes(MAX_VALUE_BYTES + 1))
    assert isinstance(verdict, Refused) and verdict.rule == "size"
    assert f"{MAX_VALUE_BYTES + 1} bytes" in verdict.reason
