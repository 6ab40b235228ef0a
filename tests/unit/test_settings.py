"""Kafka settings from the environment: what each combination gives; errors name the variable."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from ledger.errors import UsageError
from ledger.settings import KafkaSettings, SettingsError, bootstrap_addresses


def test_defaults_need_no_environment() -> None:
    settings = KafkaSettings.from_env({})
    assert settings.bootstrap_servers == "localhost:9092"
    assert settings.topic == "svledger.events"
    assert settings.dlq_topic == "svledger.events.dlq"
    assert settings.client_kwargs() == {
        "bootstrap_servers": "localhost:9092",
        "client_id": "svledger",
        "security_protocol": "PLAINTEXT",
    }


def test_flags_win_over_the_environment() -> None:
    environ = {"SVLEDGER_KAFKA_BOOTSTRAP": "kafka:9092", "SVLEDGER_TOPIC": "from-env"}
    settings = KafkaSettings.from_env(environ, topic="from-flag")
    assert (settings.bootstrap_servers, settings.topic) == ("kafka:9092", "from-flag")
    assert settings.dlq_topic == "from-flag.dlq"


def test_sasl_plaintext_passes_the_credentials() -> None:
    environ = {
        "SVLEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "SVLEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "SVLEDGER_KAFKA_SASL_USERNAME": "projector",
        "SVLEDGER_KAFKA_SASL_PASSWORD": "s3cret",
    }
    kwargs = KafkaSettings.from_env(environ).client_kwargs()
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("projector", "s3cret")
    assert "ssl_context" not in kwargs


def test_sasl_ssl_passes_credentials_and_a_tls_context(tmp_path: Path) -> None:
    environ = {
        "SVLEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "SVLEDGER_KAFKA_SASL_USERNAME": "reporter",
        "SVLEDGER_KAFKA_SASL_PASSWORD": "pw",
    }
    kwargs = KafkaSettings.from_env(environ).client_kwargs()
    assert kwargs["sasl_plain_username"] == "reporter"
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["ssl_context"].verify_mode == ssl.CERT_REQUIRED


def test_the_password_is_not_shown() -> None:
    settings = KafkaSettings(
        security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password="hunter2"
    )
    assert "hunter2" not in repr(settings)


@pytest.mark.parametrize(
    ("environ", "variable", "value"),
    [
        ({"SVLEDGER_KAFKA_PARTITIONS": "six"}, "SVLEDGER_KAFKA_PARTITIONS", "six"),
        ({"SVLEDGER_KAFKA_PARTITIONS": "0"}, "SVLEDGER_KAFKA_PARTITIONS", 0),
        ({"SVLEDGER_TOPIC": "bad topic"}, "SVLEDGER_TOPIC", "bad topic"),
        (
            {"SVLEDGER_KAFKA_SECURITY_PROTOCOL": "TLS"},
            "SVLEDGER_KAFKA_SECURITY_PROTOCOL",
            "TLS",
        ),
        (
            {"SVLEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "SVLEDGER_KAFKA_SASL_USERNAME": "u"},
            "SVLEDGER_KAFKA_SASL_USERNAME",
            "u",
        ),
        (
            {
                "SVLEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "SVLEDGER_KAFKA_SASL_MECHANISM": "GSSAPI",
                "SVLEDGER_KAFKA_SASL_USERNAME": "u",
                "SVLEDGER_KAFKA_SASL_PASSWORD": "p",
            },
            "SVLEDGER_KAFKA_SASL_MECHANISM",
            "GSSAPI",
        ),
        (
            {"SVLEDGER_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"},
            "SVLEDGER_KAFKA_SSL_CAFILE",
            "/nonexistent/ca.pem",
        ),
    ],
)
def test_a_bad_variable_is_named_with_its_value(
    environ: dict[str, str], variable: str, value: object
) -> None:
    with pytest.raises(SettingsError) as raised:
        KafkaSettings.from_env(environ)
    assert raised.value.name == variable
    assert raised.value.value == value
    assert str(raised.value).startswith(f"{variable}={value!r}: ")
    assert isinstance(raised.value, UsageError)


@pytest.mark.parametrize(
    ("servers", "addresses"),
    [
        ("kafka-0:9093", [("kafka-0", 9093)]),
        ("a:1, b:65535", [("a", 1), ("b", 65535)]),
        ("[::1]:9092", [("::1", 9092)]),
        ("kafka", [("kafka", 9092)]),  # no port: Kafka's, as Kafka clients read it
    ],
)
def test_bootstrap_servers_read_as_kafka_clients_read_them(
    servers: str, addresses: list[tuple[str, int]]
) -> None:
    assert bootstrap_addresses(servers) == addresses
    assert KafkaSettings(bootstrap_servers=servers).bootstrap_servers == servers


@pytest.mark.parametrize(
    ("servers", "entry"),
    [("kafka:port", "kafka:port"), ("a:1,b:0", "b:0"), ("a:1,,b:2", ""), ("h:65536", "h:65536")],
)
def test_a_bootstrap_entry_that_is_no_address_is_named(servers: str, entry: str) -> None:
    with pytest.raises(SettingsError, match=f"{entry!r} is not host:port"):
        KafkaSettings.from_env({"SVLEDGER_KAFKA_BOOTSTRAP": servers})


def test_a_client_certificate_needs_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("not checked here")
    with pytest.raises(SettingsError, match="SVLEDGER_KAFKA_SSL_KEYFILE=None: give the client"):
        KafkaSettings.from_env({"SVLEDGER_KAFKA_SSL_CERTFILE": str(cert)})
