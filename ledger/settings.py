"""Where the log lives and how to reach it: one frozen :class:`KafkaSettings`.

Every process that touches Kafka (reporters, the projector, the consumers, the
CLI) builds its clients from the same settings, read from ``SVLEDGER_*``
environment variables by :meth:`KafkaSettings.from_env`:

=================================== ==========================================
variable                            meaning (default)
=================================== ==========================================
``SVLEDGER_KAFKA_BOOTSTRAP``        ``host:port[,host:port...]`` (``localhost:9092``)
``SVLEDGER_TOPIC``                  the event topic (``svledger.events``)
``SVLEDGER_DLQ_TOPIC``              the dead-letter topic (``<topic>.dlq``)
``SVLEDGER_KAFKA_PARTITIONS``       partitions of a created topic (6)
``SVLEDGER_KAFKA_REPLICATION_FACTOR`` replicas of a created topic (``min(3, brokers)``)
``SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS`` its ``min.insync.replicas`` (replicas - 1, at least 1)
``SVLEDGER_KAFKA_CLIENT_ID``        client id shown in broker logs (``svledger``)
``SVLEDGER_KAFKA_SECURITY_PROTOCOL`` PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
``SVLEDGER_KAFKA_SASL_MECHANISM``   PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
``SVLEDGER_KAFKA_SASL_USERNAME``    SASL user
``SVLEDGER_KAFKA_SASL_PASSWORD``    SASL password
``SVLEDGER_KAFKA_SSL_CAFILE``       CA bundle (PEM) to verify the broker
``SVLEDGER_KAFKA_SSL_CERTFILE``     client certificate (PEM) for mutual TLS
``SVLEDGER_KAFKA_SSL_KEYFILE``      its private key (PEM)
``SVLEDGER_INBOX``                  ``true``: write events to their cluster's inbox topic
                                    ``<topic>.inbox.<cluster>``, not to the topic
                                    (reporters, when ``svledger admit`` guards the
                                    ledger: docs/production.md); ``false`` (default)
=================================== ==========================================

Settings are checked when built, so a typo fails at start-up with the variable
and the value in the message, not later as a connection error.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any, Final

from aiokafka.helpers import create_ssl_context

from ledger.errors import UsageError

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Field name -> environment variable; the order is the order of the docstring table.
_ENV: Final = {
    "bootstrap_servers": "SVLEDGER_KAFKA_BOOTSTRAP",
    "topic": "SVLEDGER_TOPIC",
    "dlq_topic": "SVLEDGER_DLQ_TOPIC",
    "partitions": "SVLEDGER_KAFKA_PARTITIONS",
    "replication_factor": "SVLEDGER_KAFKA_REPLICATION_FACTOR",
    "min_insync_replicas": "SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS",
    "client_id": "SVLEDGER_KAFKA_CLIENT_ID",
    "security_protocol": "SVLEDGER_KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "SVLEDGER_KAFKA_SASL_MECHANISM",
    "sasl_username": "SVLEDGER_KAFKA_SASL_USERNAME",
    "sasl_password": "SVLEDGER_KAFKA_SASL_PASSWORD",
    "ssl_cafile": "SVLEDGER_KAFKA_SSL_CAFILE",
    "ssl_certfile": "SVLEDGER_KAFKA_SSL_CERTFILE",
    "ssl_keyfile": "SVLEDGER_KAFKA_SSL_KEYFILE",
    "inbox": "SVLEDGER_INBOX",
}
_INT_FIELDS: Final = frozenset({"partitions", "replication_factor", "min_insync_replicas"})
_BOOL_FIELDS: Final = frozenset({"inbox"})
_BOOLEANS: Final = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
INBOX_INFIX: Final = ".inbox."
KAFKA_PORT: Final = 9092


class SettingsError(UsageError):
    """A setting has a value the ledger cannot use; the message names it and says why."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"{name}={value!r}: {rule}")
        self.name = name
        self.value = value
        self.rule = rule


def _check_topic(name: str, value: str, topic: str) -> None:
    if not value or len(topic) > 249 or not all(c.isalnum() or c in "._-" for c in topic):
        raise SettingsError(
            name, value, f"a Kafka topic name ({topic!r}) is 1-249 characters of [a-zA-Z0-9._-]"
        )


def bootstrap_addresses(servers: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` of each entry of a comma-separated ``host[:port]`` list
    (``[::1]:9092`` for IPv6; no port is Kafka's 9092, as Kafka clients take it); raises
    ValueError naming the entry that is not one."""
    addresses = []
    for entry in (entry.strip() for entry in servers.split(",")):
        host, colon, port = entry.rpartition(":")
        if not colon:
            host, port = entry, str(KAFKA_PORT)
        host = host.strip("[]")
        if "/" in host:
            raise ValueError(f"{entry!r} is not host:port: a broker address has no scheme or path")
        if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r} is not host:port (a port from 1 to 65535)")
        addresses.append((host, int(port)))
    return addresses


_PEM_CERTIFICATE: Final = re.compile(
    r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL
)
_COMMON_NAME_OID: Final = b"\x55\x04\x03"  # 2.5.4.3, DER-encoded
_VERSION_TAG: Final = 0xA0  # [0] EXPLICIT, the version of a v2 or v3 certificate


def certificate_common_name(path: str) -> str | None:
    """The common name (CN) of the subject of the first certificate in the PEM file at
    ``path``; None if it has none, or the file holds no certificate that can be read.

    The stdlib reads certificates only on connections, and this one is the client's
    own, so its subject is read off the DER encoding (RFC 5280, 4.1): Certificate ::=
    SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
    signature, issuer, validity, subject, ... }, ... }, the subject a SEQUENCE of SETs
    of SEQUENCE { type OID, value string }. Of several CNs, the last is the most
    specific: the one Kafka's RFC 2253 names put first.
    """
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            pem = _PEM_CERTIFICATE.search(file.read())
        if pem is None:
            return None
        der = base64.b64decode(pem.group(1))
        ((_, certificate),) = _der_elements(der)
        (_, tbs), *_ = _der_elements(certificate)
        fields = _der_elements(tbs)
        if fields[0][0] == _VERSION_TAG:
            del fields[0]
        _, subject = fields[4]  # after serialNumber, signature, issuer and validity
        common_names = []
        for _, relative_name in _der_elements(subject):
            for _, attribute in _der_elements(relative_name):
                (_, oid), (_, value) = _der_elements(attribute)
                if oid == _COMMON_NAME_OID:
                    common_names.append(value.decode("utf-8", errors="replace"))
    except (OSError, ValueError, IndexError):  # binascii.Error is a ValueError
        return None
    return common_names[-1] if common_names else None


def _der_elements(data: bytes) -> list[tuple[int, bytes]]:
    """The ``(tag, content)`` of each DER element in ``data``, in order; ValueError or
    IndexError if ``data`` is not a run of whole elements."""
    elements = []
    offset = 0
    while offset < len(data):
        tag, length = data[offset], data[offset + 1]
        offset += 2
        if length & 0x80:  # the long form: the next (length & 0x7F) bytes hold it
            size = length & 0x7F
            length = int.from_bytes(data[offset : offset + size], "big")
            offset += size
        if offset + length > len(data):
            raise ValueError("not DER: an element runs past its container")
        elements.append((tag, data[offset : offset + length]))
        offset += length
    return elements


def _check_bootstrap(servers: str) -> None:
    if not servers.strip():
        raise SettingsError("bootstrap_servers", servers, "give at least one host:port")
    try:
        bootstrap_addresses(servers)
    except ValueError as error:
        raise SettingsError(
            "bootstrap_servers", servers, f"{error}; give host:port[,host:port...]"
        ) from None


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaSettings:
    bootstrap_servers: str = "localhost:9092"
    topic: str = "svledger.events"
    dlq_topic: str = ""  # empty means "<topic>.dlq"
    partitions: int = 6
    replication_factor: int | None = None  # None: min(3, brokers), chosen by topics create
    min_insync_replicas: int | None = None  # None: replication_factor - 1, at least 1
    client_id: str = "svledger"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    inbox: bool = False

    def __post_init__(self) -> None:
        if not self.dlq_topic:
            object.__setattr__(self, "dlq_topic", f"{self.topic}.dlq")
        _check_bootstrap(self.bootstrap_servers)
        for name in ("topic", "dlq_topic"):
            _check_topic(name, getattr(self, name), getattr(self, name))
        if self.dlq_topic == self.topic:
            raise SettingsError(
                "dlq_topic", self.dlq_topic, "the dead-letter topic must differ from the topic"
            )
        for name in sorted(_INT_FIELDS):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SettingsError(name, getattr(self, name), "must be at least 1")
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise SettingsError(
                "security_protocol",
                self.security_protocol,
                f"must be one of {', '.join(SECURITY_PROTOCOLS)}",
            )
        if self.uses_sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise SettingsError(
                    "sasl_mechanism",
                    self.sasl_mechanism,
                    f"must be one of {', '.join(SASL_MECHANISMS)}",
                )
            if not self.sasl_username or self.sasl_password is None:
                raise SettingsError(
                    "sasl_username",
                    self.sasl_username,
                    f"{self.security_protocol} needs both a SASL username and password",
                )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise SettingsError(name, path, "no such file")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise SettingsError(
                "ssl_keyfile", self.ssl_keyfile, "give the client certificate and key together"
            )

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol.endswith("SSL")

    @property
    def inbox_prefix(self) -> str:
        """Every inbox topic's name starts with this: ``<topic>.inbox.``."""
        return f"{self.topic}{INBOX_INFIX}"

    def inbox_topic(self, cluster: str) -> str:
        """The topic a cluster's reporters write to when the ledger is guarded."""
        topic = f"{self.inbox_prefix}{cluster}"
        _check_topic("cluster", cluster, topic)
        return topic

    @property
    def placement_topic(self) -> str:
        """Where each cluster's partition is recorded (:mod:`ledger.kafka.placement`)."""
        return f"{self.topic}.placement"

    def write_topic(self, cluster: str) -> str:
        """Where this process appends a cluster's events: its inbox or the ledger."""
        return self.inbox_topic(cluster) if self.inbox else self.topic

    @property
    def principal(self) -> str | None:
        """Who Kafka's ACLs know this client as: ``User:<name>`` for a SASL login.

        For a TLS client with a certificate (and no SASL login), ``User:<CN>`` after the
        common name of the certificate's subject, as the principal mapping rule
        ``RULE:^CN=([^,]+).*$/$1/,DEFAULT`` the brokers should have names it
        (docs/production.md, Security); brokers with other rules name it otherwise.
        None for a certificate without a CN, and for a PLAINTEXT client (anonymous).
        """
        if self.uses_sasl:
            return f"User:{self.sasl_username}"
        if self.uses_ssl and self.ssl_certfile is not None:
            common_name = certificate_common_name(self.ssl_certfile)
            return None if common_name is None else f"User:{common_name}"
        return None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **overrides: Any) -> KafkaSettings:
        """Settings from ``SVLEDGER_*`` variables; ``overrides`` (field=value) win over them."""
        values: dict[str, Any] = {}
        for name, variable in _ENV.items():
            raw = environ.get(variable)
            if raw is None or raw == "":
                continue
            if name in _INT_FIELDS:
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise SettingsError(variable, raw, "must be a whole number") from None
            elif name in _BOOL_FIELDS:
                if raw.lower() not in _BOOLEANS:
                    raise SettingsError(variable, raw, "must be true or false")
                values[name] = _BOOLEANS[raw.lower()]
            else:
                values[name] = raw
        values.update(overrides)
        try:
            return cls(**values)
        except SettingsError as error:
            if error.name in overrides or error.name not in _ENV:
                raise
            # Report the variable the user set, not the field it became.
            raise SettingsError(_ENV[error.name], error.value, error.rule) from None

    def client_kwargs(self) -> dict[str, Any]:
        """Connection arguments shared by aiokafka's producer, consumer and admin client."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.uses_sasl:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password
        if self.uses_ssl:
            kwargs["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        return kwargs
