"""The principal a TLS client's errors name: ``User:<CN>`` of its certificate's subject.

The certificates are real ones, made by the ``openssl`` command as an operator's CA
would make them; the broker's side of the same rule is tried in
``tests/integration/test_kafka_security.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ledger.kafka.errors import NotAuthorized
from ledger.settings import KafkaSettings, certificate_common_name

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def certificate(directory: Path, subject: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``subject`` (openssl's ``/O=.../CN=...``) and its key."""
    certfile, keyfile = directory / "client.crt", directory / "client.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(keyfile),
            "-out",
            str(certfile),
            "-days",
            "1",
            "-subj",
            subject,
        ],
        check=True,
        capture_output=True,
    )
    return certfile, keyfile


def tls(certfile: Path, keyfile: Path, **values: str) -> KafkaSettings:
    """Settings of a client with this certificate: SSL, unless ``values`` say otherwise."""
    values = {"security_protocol": "SSL", **values}
    return KafkaSettings(ssl_certfile=str(certfile), ssl_keyfile=str(keyfile), **values)


@pytest.mark.parametrize(
    ("subject", "common_name"),
    [
        ("/CN=projector", "projector"),
        # Kafka's RFC 2253 name puts the last RDN first: CN=projector,OU=ledger,O=example.
        ("/O=example/OU=ledger/CN=projector", "projector"),
        ("/CN=ignored/CN=reporter-east", "reporter-east"),
    ],
)
def test_the_principal_of_a_certificate_is_its_common_name(
    tmp_path: Path, subject: str, common_name: str
) -> None:
    certfile, keyfile = certificate(tmp_path, subject)
    assert certificate_common_name(str(certfile)) == common_name
    assert tls(certfile, keyfile).principal == f"User:{common_name}"


def test_the_certificate_is_found_after_its_key_in_one_file(tmp_path: Path) -> None:
    certfile, keyfile = certificate(tmp_path, "/CN=projector")
    both = tmp_path / "both.pem"
    both.write_text(keyfile.read_text() + certfile.read_text())
    assert certificate_common_name(str(both)) == "projector"


def test_a_sasl_login_is_the_principal_whatever_the_certificate(tmp_path: Path) -> None:
    certfile, keyfile = certificate(tmp_path, "/CN=projector")
    settings = tls(
        certfile,
        keyfile,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="reader",
        sasl_password="s3cret",
    )
    assert settings.principal == "User:reader"
    refused = NotAuthorized(settings, "Write", "topic 'svledger.events'", "TopicAuthorization")
    assert refused.refused.startswith("principal User:reader may not Write")


def test_a_refusal_names_the_certificate_beside_its_principal(tmp_path: Path) -> None:
    certfile, keyfile = certificate(tmp_path, "/O=example/CN=reader")
    refused = NotAuthorized(
        tls(certfile, keyfile), "Write", "topic 'svledger.events'", "TopicAuthorizationFailed"
    )
    assert refused.principal == "User:reader"
    assert refused.refused == (
        f"principal User:reader (the CN of certificate {certfile}) may not Write topic"
        " 'svledger.events' (Kafka: TopicAuthorizationFailed)"
    )


def test_a_certificate_without_a_common_name_is_named_by_its_file(tmp_path: Path) -> None:
    certfile, keyfile = certificate(tmp_path, "/O=example/OU=ledger")
    assert certificate_common_name(str(certfile)) is None
    refused = NotAuthorized(
        tls(certfile, keyfile), "Read", "group 'svledger-migrator'", "GroupAuthorizationFailed"
    )
    assert refused.principal is None
    assert refused.refused == (
        f"the principal of certificate {certfile} may not Read group 'svledger-migrator'"
        " (Kafka: GroupAuthorizationFailed)"
    )


@pytest.mark.parametrize(
    "text",
    [
        "not a certificate",
        "-----BEGIN CERTIFICATE-----\nbm90IERFUg==\n-----END CERTIFICATE-----\n",  # "not DER"
        "-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n",  # too short
    ],
)
def test_a_file_that_holds_no_readable_certificate_has_no_common_name(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "client.crt"
    path.write_text(text)
    assert certificate_common_name(str(path)) is None
