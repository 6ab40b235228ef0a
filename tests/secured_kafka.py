"""A broker that enforces security, as the tests of svledger's roles under ACLs see it.

:class:`SecuredKafka` wraps a :class:`~deploy.kafka.broker.LocalKafka` started with
SASL_SSL, SCRAM users and the StandardAuthorizer (fixture ``secured_kafka``, one per
test module). It has one SCRAM user per role of ``deploy/kafka/acls.py`` named after
it (``projector``, ``lease-gc``, ...), reporters of two clusters (``reporter-east``,
``reporter-west``), ``nobody`` (never granted anything) and the super user ``admin``.
No user but ``admin`` may do anything until :meth:`SecuredKafka.grant` runs the ACL
script for it, as an operator would.

A second listener takes client certificates instead (mutual TLS): a client of
``settings(user, ..., certificate=True)`` logs in there with a certificate for ``CN=user``
the broker's CA signed, and is the principal ``User:<user>``, granted as a SCRAM user is.
Certificate users are names of their own (``cert-projector``), so that what such a client
may do comes from its certificate's ACLs alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from deploy.kafka import acls
from deploy.kafka.acls import ROLES, Grant
from deploy.kafka.broker import LocalKafka, Security
from ledger.settings import KafkaSettings

ROOT: Final = Path(__file__).resolve().parents[1]
ACL_SCRIPT: Final = ROOT / "deploy" / "kafka" / "acls.py"
USERS: Final = (
    *(role for role in ROLES if role != "reporter"),
    "reporter-east",
    "reporter-west",
    "nobody",
)
ADMIN: Final = "admin"


class SecuredKafka:
    """Settings, environments and ACLs for the users of a secured :class:`LocalKafka`."""

    def __init__(self) -> None:
        self.broker = LocalKafka(
            security=Security.for_users(*USERS, super_user=ADMIN, mutual_tls=True)
        )

    def start(self) -> SecuredKafka:
        self.broker.start()
        return self

    def stop(self) -> None:
        self.broker.stop()

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def ca_file(self) -> Path:
        return self.broker.ca_file

    def password(self, user: str) -> str:
        assert self.broker.security is not None
        return self.broker.security.password(user)

    def settings(
        self, user: str, topic: str, *, certificate: bool = False, **overrides: Any
    ) -> KafkaSettings:
        """How ``user`` reaches the broker, verifying it by the CA: SASL_SSL with
        SCRAM-SHA-512, or with ``certificate`` SSL with a client certificate."""
        values: dict[str, Any] = {
            "topic": topic,
            "partitions": 2,
            "ssl_cafile": str(self.ca_file),
            **self._login(user, certificate),
        }
        values.update(overrides)
        return KafkaSettings(**values)

    def environ(
        self, user: str, topic: str, *, certificate: bool = False, **variables: str
    ) -> dict[str, str]:
        """This process's environment with ``SVLEDGER_*`` set for ``user``, as
        :meth:`settings` has it (``variables`` win)."""
        settings = self.settings(user, topic, certificate=certificate)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SVLEDGER_")}
        environ |= {
            "SVLEDGER_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
            "SVLEDGER_TOPIC": topic,
            "SVLEDGER_KAFKA_PARTITIONS": str(settings.partitions),
            "SVLEDGER_KAFKA_SECURITY_PROTOCOL": settings.security_protocol,
            "SVLEDGER_KAFKA_SASL_MECHANISM": settings.sasl_mechanism if settings.uses_sasl else "",
            "SVLEDGER_KAFKA_SASL_USERNAME": settings.sasl_username or "",
            "SVLEDGER_KAFKA_SASL_PASSWORD": settings.sasl_password or "",
            "SVLEDGER_KAFKA_SSL_CAFILE": settings.ssl_cafile or "",
            "SVLEDGER_KAFKA_SSL_CERTFILE": settings.ssl_certfile or "",
            "SVLEDGER_KAFKA_SSL_KEYFILE": settings.ssl_keyfile or "",
        }
        environ |= variables
        return {k: v for k, v in environ.items() if v}

    def _login(self, user: str, certificate: bool) -> dict[str, Any]:
        if certificate:
            certfile, keyfile = self.broker.client_certificate(user)
            return {
                "bootstrap_servers": self.broker.mutual_tls_bootstrap,
                "security_protocol": "SSL",
                "ssl_certfile": str(certfile),
                "ssl_keyfile": str(keyfile),
            }
        return {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": user,
            "sasl_password": self.password(user),
        }

    def grant(self, topic: str, grants: Mapping[str, tuple[str, str | None]]) -> None:
        """Run ``deploy/kafka/acls.py`` for each ``user: (role, cluster)``, side by side."""
        admin = self.broker.client_properties(ADMIN)
        runs: list[tuple[Sequence[str], subprocess.Popen[str]]] = []
        for user, (role, cluster) in grants.items():
            command = [
                sys.executable,
                str(ACL_SCRIPT),
                "--bootstrap-server",
                self.bootstrap,
                "--command-config",
                str(admin),
                "--topic",
                topic,
                "--role",
                role,
                "--principal",
                f"User:{user}",
                *(["--cluster", cluster] if cluster else []),
            ]
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            runs.append((command, process))
        for command, process in runs:
            output, _ = process.communicate(timeout=300)
            assert process.returncode == 0, f"{command} failed:\n{output}"

    def revoke(self, user: str, grants: Sequence[Grant]) -> None:
        """Take ``grants`` back from ``user``, as an operator would with kafka-acls --remove."""
        admin = self.broker.client_properties(ADMIN)
        tool = acls.find_tool(None)
        acls.apply(
            acls.acl_commands(tool, self.bootstrap, str(admin), f"User:{user}", grants, remove=True)
        )
