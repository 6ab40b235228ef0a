"""A broker that enforces security, as the tests of svledger's roles under ACLs see it.

:class:`SecuredKafka` wraps a :class:`~deploy.kafka.broker.LocalKafka` started with
SASL_SSL, SCRAM users and the StandardAuthorizer (fixture ``secured_kafka``, one per
test module). It has one SCRAM user per role of ``deploy/kafka/acls.py`` named after
it (``projector``, ``lease-gc``, ...), reporters of two clusters (``reporter-east``,
``reporter-west``), ``nobody`` (never granted anything) and the super user ``admin``.
No user but ``admin`` may do anything until :meth:`SecuredKafka.grant` runs the ACL
script for it, as an operator would.
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
        self.broker = LocalKafka(security=Security.for_users(*USERS, super_user=ADMIN))

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

    def settings(self, user: str, topic: str, **overrides: Any) -> KafkaSettings:
        """How ``user`` reaches the broker: SASL_SSL, SCRAM-SHA-512, verifying it by the CA."""
        values: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "topic": topic,
            "partitions": 2,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": user,
            "sasl_password": self.password(user),
            "ssl_cafile": str(self.ca_file),
        }
        values.update(overrides)
        return KafkaSettings(**values)

    def environ(self, user: str, topic: str, **variables: str) -> dict[str, str]:
        """This process's environment with ``SVLEDGER_*`` set for ``user`` (``variables`` win)."""
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SVLEDGER_")}
        environ |= {
            "SVLEDGER_KAFKA_BOOTSTRAP": self.bootstrap,
            "SVLEDGER_TOPIC": topic,
            "SVLEDGER_KAFKA_PARTITIONS": "2",
            "SVLEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SVLEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "SVLEDGER_KAFKA_SASL_USERNAME": user,
            "SVLEDGER_KAFKA_SASL_PASSWORD": self.password(user),
            "SVLEDGER_KAFKA_SSL_CAFILE": str(self.ca_file),
        }
        environ |= variables
        return {k: v for k, v in environ.items() if v}

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
