"""svledger against a broker that enforces TLS, SCRAM logins and least-privilege ACLs.

One secured broker for the module (``secured_kafka``): SASL_SSL, a user per role, and
the StandardAuthorizer, which refuses whatever no ACL allows. The module's topic is
created by the ``setup`` role and every role is granted its ACLs by the shipped
``deploy/kafka/acls.py``, run as an operator would run it. Then:

* a client the broker does not let in (a wrong password, PLAINTEXT on the SASL_SSL
  port, a certificate it cannot verify) fails at once, with what to check;
* a role missing an ACL fails at once with the principal, the operation and the
  resource, from the library and, with the role to grant and exit code 69, from the
  command line;
* a role's client certificate, on the broker's mutual TLS listener, is the principal
  ``User:<CN>`` and may do what its ACLs allow and nothing else, refused as by name;
* the pipeline runs with each role under its own principal and nothing more: the
  projector, the lease GC and the migrator as ``svledger`` commands, the worker (whose
  Kubernetes target is a stand-in) as a process of this module, all configured by
  ``SVLEDGER_KAFKA_*`` variables; an operator's producer appends the apiservers'
  events;
* ``svledger collect`` as ``collector`` turns a real cluster's (etcd and three
  kube-apiservers) identity Leases and StorageVersions into the ledger, and
  ``svledger serve`` as ``reader`` serves them.

This module is also the worker's entry point (``python -m
tests.integration.test_kafka_security worker CLUSTER``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select

from consumers.targets import ObjectRef, Page
from consumers.worker import GROUP_ID as WORKER_GROUP
from consumers.worker import Rewriter, run_worker
from deploy.kafka.acls import grants
from deploy.kafka.broker import free_port
from kube.client import connect
from ledger.clock import SystemClock
from ledger.codec import decode
from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Meta,
    MigrationSucceeded,
    StorageVersionReported,
)
from ledger.hashing import storage_version_hash
from ledger.kafka import (
    DLQ_REASON_HEADER,
    EventProducer,
    NotAuthenticated,
    NotAuthorized,
    PartitionProducer,
    create_topics,
    topic_partitions,
)
from ledger.reporter import Reporter, ResourceReport
from ledger.settings import KafkaSettings
from projections.database import engine
from projections.projector import DEFAULT_PROJECTION, group_id
from projections.schema import (
    apiserver_leases,
    ledger_events,
    storage_states,
    storage_version_migrations,
)
from projections.store import database_id
from tests.integration.test_admission import admitted_all, read_topic
from tests.integration.test_collector import CLUSTER, agree
from tests.integration.test_migrator import read_records
from tests.kube import upstream_leases
from tests.secured_kafka import ROOT, SecuredKafka

TOPIC = "svledger.secured"
COLLECTED = CLUSTER  # the real cluster's name in the ledger
# Far below the connect timeout (30 s) a client that is not let in would wait out.
AT_ONCE = 15.0
DEADLINE = 120.0  # a guard against a hung broker or process, not a measurement


@pytest.fixture(scope="module")
def storage_version_api() -> bool:
    """``agree`` holds the ledger against the real cluster's StorageVersion objects."""
    return True


@pytest.fixture(scope="module")
def kafka(secured_kafka: SecuredKafka) -> SecuredKafka:
    """The module's broker, every role granted on :data:`TOPIC` and the topics created."""
    secured_kafka.grant(
        TOPIC,
        {
            "setup": ("setup", None),
            "projector": ("projector", None),
            "lease-gc": ("lease-gc", None),
            "migrator": ("migrator", None),
            "worker": ("worker", "east"),
            "operator": ("operator", None),
            "reader": ("reader", None),
            "reporter-east": ("reporter", "east"),
            "collector": ("collector", COLLECTED),
        },
    )
    created = svledger(secured_kafka, "setup", "topics", "create")
    assert created.returncode == 0, created.stderr
    return secured_kafka


def svledger(
    kafka: SecuredKafka, user: str, *argv: str, certificate: bool = False, **variables: str
) -> subprocess.CompletedProcess[str]:
    """``svledger ARGV`` as ``user`` (``variables`` override its ``SVLEDGER_*``), to the end;
    with ``certificate``, logged in by the user's client certificate."""
    return subprocess.run(
        [sys.executable, "-m", "svledger", *argv],
        env=kafka.environ(user, TOPIC, certificate=certificate, **variables),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stderr.strip().splitlines()[-1]


def meta(cluster: str, source: str) -> Meta:
    return Meta.new(cluster, source, datetime.now(UTC))


def heartbeat(cluster: str, apiserver: str, renewed: datetime, seconds: int) -> Event:
    return ApiserverHeartbeat(
        meta(cluster, apiserver), apiserver, f"{apiserver}_1", apiserver, seconds, renewed
    )


def pods(cluster: str, apiserver: str, version: str) -> Event:
    return StorageVersionReported(
        meta(cluster, apiserver), apiserver, "", "pods", "Pod", version, ("v1", "v2"), ("v1",)
    )


async def append(settings: KafkaSettings, events: list[Event]) -> None:
    async with EventProducer(settings) as producer:
        await producer.send_many(events)


# --------------------------------------------------------------------------- authentication


async def test_a_wrong_password_is_refused_at_once_naming_the_user(kafka: SecuredKafka) -> None:
    started = time.monotonic()
    with pytest.raises(NotAuthenticated, match=r"refused the SCRAM-SHA-512 login of user 'reader'"):
        await topic_partitions(kafka.settings("reader", TOPIC, sasl_password="not-it"))
    assert time.monotonic() - started < AT_ONCE

    started = time.monotonic()
    done = svledger(kafka, "lease-gc", "lease-gc", SVLEDGER_KAFKA_SASL_PASSWORD="not-it")
    assert time.monotonic() - started < AT_ONCE + 5  # and the interpreter's start
    assert done.returncode == 69, done.stderr
    assert re.fullmatch(
        rf"svledger: error: Kafka at '{kafka.bootstrap}' refused the SCRAM-SHA-512 login of"
        r" user 'lease-gc' \(.*invalid credentials.*\); check SVLEDGER_KAFKA_SASL_USERNAME and"
        r" SVLEDGER_KAFKA_SASL_PASSWORD against the users the cluster knows, and"
        r" SVLEDGER_KAFKA_SASL_MECHANISM",
        last_line(done),
    )
    assert "Traceback" not in done.stderr


async def test_a_plaintext_client_on_the_secured_port_is_refused_at_once(
    kafka: SecuredKafka, tmp_path: Path
) -> None:
    plaintext = KafkaSettings(bootstrap_servers=kafka.bootstrap, topic=TOPIC)
    started = time.monotonic()
    with pytest.raises(NotAuthenticated, match="expects another security protocol than PLAINTEXT"):
        await topic_partitions(plaintext)
    assert time.monotonic() - started < AT_ONCE

    done = svledger(
        kafka,
        "projector",
        "project",
        "--db",
        f"sqlite:///{tmp_path / 'views.db'}",
        SVLEDGER_KAFKA_SECURITY_PROTOCOL="PLAINTEXT",
    )
    assert done.returncode == 69, done.stderr
    assert last_line(done) == (
        f"svledger: error: Kafka at '{kafka.bootstrap}' closed the connection unanswered 5 times"
        " in a row: its listener there expects another security protocol than PLAINTEXT"
        " (SASL_SSL, say); check SVLEDGER_KAFKA_SECURITY_PROTOCOL against the listener, and"
        " the broker's log"
    )


async def test_a_broker_certificate_from_an_unknown_ca_is_refused(kafka: SecuredKafka) -> None:
    with pytest.raises(NotAuthenticated, match="cannot verify the certificate of Kafka"):
        await topic_partitions(kafka.settings("reader", TOPIC, ssl_cafile=None))


async def test_scram_sha_256_logs_in_as_well(kafka: SecuredKafka) -> None:
    settings = kafka.settings("reader", TOPIC, sasl_mechanism="SCRAM-SHA-256")
    assert await topic_partitions(settings) == [0, 1]


# --------------------------------------------------------------------------- authorization


async def test_a_reporter_writes_its_inbox_and_may_not_write_the_events_topic(
    kafka: SecuredKafka,
) -> None:
    await create_topics(kafka.settings("admin", TOPIC), ["east"])
    await append(
        kafka.settings("reporter-east", TOPIC, inbox=True), [heartbeat("east", "r1", _now(), 60)]
    )

    with pytest.raises(NotAuthorized) as refused:
        await append(kafka.settings("reporter-east", TOPIC), [heartbeat("east", "r1", _now(), 60)])
    assert (refused.value.principal, refused.value.operation, refused.value.resource) == (
        "User:reporter-east",
        "Write",
        f"topic '{TOPIC}'",
    )
    assert str(refused.value) == (
        f"principal User:reporter-east may not Write topic '{TOPIC}' (Kafka:"
        " TopicAuthorizationFailed); grant its role's ACLs with deploy/kafka/acls.py"
        " (docs/production.md)"
    )


async def test_write_on_the_topic_is_all_an_idempotent_producer_needs(kafka: SecuredKafka) -> None:
    # The operator has Write on the topic and nothing on the cluster (no IdempotentWrite):
    # Kafka hands it an idempotent producer ID all the same.
    await append(kafka.settings("operator", TOPIC), [heartbeat("south", "s1", _now(), 60)])
    # A principal that may write no topic at all is refused the producer ID.
    with pytest.raises(NotAuthorized, match=rf"User:reader may not Write topic '{TOPIC}'"):
        await append(kafka.settings("reader", TOPIC), [heartbeat("south", "s1", _now(), 60)])


async def test_a_transactional_id_outside_the_role_is_refused(kafka: SecuredKafka) -> None:
    producer = PartitionProducer(
        kafka.settings("migrator", TOPIC), 0, f"svledger-lease-gc-{TOPIC}-0", "svledger-lease-gc"
    )
    with pytest.raises(NotAuthorized) as refused:
        await producer.start()
    assert refused.value.refused == (
        f"principal User:migrator may not Write transactional ID 'svledger-lease-gc-{TOPIC}-0'"
        " (Kafka: TransactionalIdAuthorizationFailed)"
    )


def test_a_reader_run_as_projector_is_refused_the_dead_letter_topic(
    kafka: SecuredKafka, tmp_path: Path
) -> None:
    # The reader may read the topic, but not copy undecodable records aside as a
    # projector does; the dead letters' sender looks up their topic first.
    started = time.monotonic()
    done = svledger(kafka, "reader", "project", "--db", f"sqlite:///{tmp_path / 'views.db'}")
    assert time.monotonic() - started < AT_ONCE + 5
    assert done.returncode == 69, done.stderr
    assert last_line(done) == (
        f"svledger: error: principal User:reader may not Describe topic '{TOPIC}.dlq' (Kafka:"
        " TopicAuthorizationFailed); `svledger project` runs as role projector: grant it with"
        " python deploy/kafka/acls.py --role projector --principal User:reader --topic"
        f" {TOPIC} (see docs/production.md, Security)"
    )
    assert "Traceback" not in done.stderr


def test_the_projector_without_its_group_acl_names_its_role(
    kafka: SecuredKafka, tmp_path: Path
) -> None:
    group = grants("projector", TOPIC)[1]
    assert group.kind == "group"
    kafka.revoke("projector", [group])
    url = f"sqlite:///{tmp_path / 'views.db'}"
    try:
        done = svledger(kafka, "projector", "project", "--db", url)
    finally:
        kafka.grant(TOPIC, {"projector": ("projector", None)})
    with engine(url).connect() as connection:  # the group is named by the database's ID
        named = group_id(TOPIC, DEFAULT_PROJECTION, database_id(connection))
    assert done.returncode == 69, done.stderr
    assert last_line(done) == (
        f"svledger: error: principal User:projector may not Read group '{named}'"
        " (Kafka: GroupAuthorizationFailed); `svledger project` runs as role"
        " projector: grant it with python deploy/kafka/acls.py --role projector --principal"
        f" User:projector --topic {TOPIC} (see docs/production.md, Security)"
    )
    assert "Traceback" not in done.stderr


async def test_an_operator_command_run_by_a_reader_names_the_operator_role(
    kafka: SecuredKafka,
) -> None:
    await append(
        kafka.settings("operator", TOPIC),
        [heartbeat("north", "n1", _now(), 3600), pods("north", "n1", "v1")],
    )
    done = await asyncio.to_thread(
        svledger,
        kafka,
        "reader",
        "storagestate",
        "reset",
        "",
        "pods",
        "--cluster",
        "north",
        "--reason",
        "restored etcd",
    )
    assert done.returncode == 69, done.stderr
    assert last_line(done) == (
        f"svledger: error: principal User:reader may not Write topic '{TOPIC}' (Kafka:"
        " ClusterAuthorizationFailed); `svledger storagestate` runs as role operator: grant it"
        f" with python deploy/kafka/acls.py --role operator --principal User:reader --topic"
        f" {TOPIC} (see docs/production.md, Security)"
    )


# --------------------------------------------------------------------------- client certificates

# Users who log in with a client certificate alone (subject CN=<user>), and their roles.
CERTIFIED = {
    "cert-reporter-east": ("reporter", "east"),
    "cert-projector": ("projector", None),
    "cert-reader": ("reader", None),
}


@pytest.fixture(scope="module")
def certified(kafka: SecuredKafka) -> SecuredKafka:
    """The module's broker, each user of :data:`CERTIFIED` granted its role's ACLs as
    the principal ``User:<CN>`` by ``deploy/kafka/acls.py``, as any other principal."""
    kafka.grant(TOPIC, CERTIFIED)
    return kafka


async def test_a_reporters_certificate_writes_its_inbox_and_may_not_write_the_events_topic(
    certified: SecuredKafka,
) -> None:
    await create_topics(certified.settings("admin", TOPIC), ["east"])
    await append(
        certified.settings("cert-reporter-east", TOPIC, certificate=True, inbox=True),
        [heartbeat("east", "r1", _now(), 60)],
    )

    settings = certified.settings("cert-reporter-east", TOPIC, certificate=True)
    started = time.monotonic()
    with pytest.raises(NotAuthorized) as refused:
        await append(settings, [heartbeat("east", "r1", _now(), 60)])
    assert time.monotonic() - started < AT_ONCE
    assert (refused.value.principal, refused.value.operation, refused.value.resource) == (
        "User:cert-reporter-east",
        "Write",
        f"topic '{TOPIC}'",
    )
    assert str(refused.value) == (
        f"principal User:cert-reporter-east (the CN of certificate {settings.ssl_certfile}) may"
        f" not Write topic '{TOPIC}' (Kafka: TopicAuthorizationFailed); grant its role's ACLs"
        " with deploy/kafka/acls.py (docs/production.md)"
    )


async def test_a_readers_certificate_reads_the_topic_and_may_not_write_it(
    certified: SecuredKafka,
) -> None:
    written = heartbeat("cert", "c1", _now(), 60)
    await append(certified.settings("operator", TOPIC), [written])
    reader = certified.settings("cert-reader", TOPIC, certificate=True)
    assert written.meta.event_id in {event.meta.event_id for event, _ in await read_records(reader)}

    started = time.monotonic()
    with pytest.raises(NotAuthorized, match=r"principal User:cert-reader \(the CN of certificate"):
        await append(reader, [heartbeat("cert", "c1", _now(), 60)])
    assert time.monotonic() - started < AT_ONCE


def test_certificates_run_the_commands_of_their_roles_and_are_refused_the_others(
    certified: SecuredKafka, tmp_path: Path
) -> None:
    replayed = f"sqlite:///{tmp_path / 'replayed.db'}"
    done = svledger(certified, "cert-projector", "replay", "--db", replayed, certificate=True)
    assert done.returncode == 0, done.stderr

    certfile, _ = certified.broker.client_certificate("cert-reader")
    views = f"sqlite:///{tmp_path / 'views.db'}"
    started = time.monotonic()
    done = svledger(certified, "cert-reader", "project", "--db", views, certificate=True)
    assert time.monotonic() - started < AT_ONCE + 5  # and the interpreter's start
    assert done.returncode == 69, done.stderr
    assert last_line(done) == (
        f"svledger: error: principal User:cert-reader (the CN of certificate {certfile}) may not"
        f" Describe topic '{TOPIC}.dlq' (Kafka: TopicAuthorizationFailed); `svledger project`"
        " runs as role projector: grant it with python deploy/kafka/acls.py --role projector"
        f" --principal User:cert-reader --topic {TOPIC} (see docs/production.md, Security)"
    )
    assert "Traceback" not in done.stderr

    certfile, _ = certified.broker.client_certificate("cert-reporter-east")
    page = str(tmp_path / "pods.html")
    done = svledger(
        certified,
        "cert-reporter-east",
        "timeline",
        "core.pods",
        "--cluster",
        "east",
        "--html",
        page,
        certificate=True,
    )
    assert done.returncode == 69, done.stderr
    assert last_line(done) == (
        f"svledger: error: principal User:cert-reporter-east (the CN of certificate {certfile})"
        f" may not Describe topic '{TOPIC}' (Kafka: TopicAuthorizationFailed); `svledger"
        " timeline` runs as role reader: grant it with python deploy/kafka/acls.py --role"
        f" reader --principal User:cert-reporter-east --topic {TOPIC} (see docs/production.md,"
        " Security)"
    )
    assert "Traceback" not in done.stderr


async def test_a_client_without_a_certificate_is_refused_at_once(certified: SecuredKafka) -> None:
    anonymous = certified.settings(
        "cert-reader", TOPIC, certificate=True, ssl_certfile=None, ssl_keyfile=None
    )
    started = time.monotonic()
    with pytest.raises(NotAuthenticated):
        await topic_partitions(anonymous)
    assert time.monotonic() - started < AT_ONCE


# --------------------------------------------------------------------------- the pipeline


class Objects:
    """A migration target of a few pods that rewrites instantly (the worker's stand-in)."""

    async def list(self, group: str, resource: str, continue_token: str | None, limit: int) -> Page:
        return Page(tuple(ObjectRef("default", f"{resource}-{i}") for i in range(3)), None)

    async def rewrite(self, group: str, resource: str, ref: ObjectRef) -> None:
        pass


async def _work(cluster: str) -> None:
    """``svledger worker --cluster CLUSTER`` with :class:`Objects` for a Kubernetes API."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await run_worker(
        KafkaSettings.from_env(),
        Rewriter(Objects(), SystemClock(), chunk_size=10),
        stop=stop,
        group_id=f"{WORKER_GROUP}.{cluster}",  # as the command names it
        cluster=cluster,
    )


class Processes:
    """Long-running processes, each as its own user, their stderr kept in files."""

    def __init__(self, kafka: SecuredKafka, logs: Path) -> None:
        self.kafka = kafka
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, user: str, *argv: str) -> None:
        with (self.logs / f"{user}.log").open("wb") as log:
            self.running[user] = subprocess.Popen(
                [sys.executable, *argv],
                env=self.kafka.environ(user, TOPIC),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def check_alive(self) -> None:
        for user, process in self.running.items():
            assert process.poll() is None, f"{user} exited {process.returncode}:\n{self.log(user)}"

    def log(self, user: str) -> str:
        return (self.logs / f"{user}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> dict[str, int]:
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = {}
        for user, process in self.running.items():
            try:
                codes[user] = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[user] = process.wait()
        return codes


@contextlib.contextmanager
def processes(kafka: SecuredKafka, logs: Path) -> Iterator[Processes]:
    running = Processes(kafka, logs)
    try:
        yield running
    finally:
        running.stop()


def _wait_for(db: Engine, done: Callable[[Any], bool], running: Processes, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        running.check_alive()
        with contextlib.suppress(Exception), db.connect() as connection:  # not created yet
            if done(connection):
                return
        time.sleep(0.5)
    raise AssertionError(
        f"no {what} within {DEADLINE:.0f} s\n"
        + "\n".join(f"--- {user}\n{running.log(user)}" for user in running.running)
    )


def _now() -> datetime:
    return datetime.now(UTC)


def test_the_pipeline_runs_with_each_role_under_its_own_principal(
    kafka: SecuredKafka, tmp_path: Path
) -> None:
    views = tmp_path / "views.db"
    db = create_engine(f"sqlite:///{views}")
    with processes(kafka, tmp_path) as running:
        svledger_ = ["-m", "svledger", "--log-format", "text"]
        running.start("projector", *svledger_, "project", "--db", f"sqlite:///{views}")
        running.start("migrator", *svledger_, "migrator")
        running.start("lease-gc", *svledger_, "lease-gc", "--check-period", "1")
        running.start("worker", "-m", "tests.integration.test_kafka_security", "worker", "east")

        # The apiservers' events, appended by the operator: three of east agree on v1, and
        # west's only apiserver stopped heartbeating a minute ago.
        now = _now()
        asyncio.run(
            append(
                kafka.settings("operator", TOPIC),
                [
                    *(heartbeat("east", a, now, 3600) for a in ("a1", "a2", "a3")),
                    *(pods("east", a, "v1") for a in ("a1", "a2", "a3")),
                    heartbeat("west", "w1", now - timedelta(seconds=60), 5),
                ],
            )
        )

        # The migrator requests the migration, the worker runs it, the projector shows it.
        def migrated(connection: Any) -> bool:
            phases = connection.execute(
                select(storage_version_migrations.c.phase).where(
                    storage_version_migrations.c.cluster == "east"
                )
            ).all()
            return [phase for (phase,) in phases] == ["Succeeded"]

        _wait_for(db, migrated, running, "migration of east's pods")
        with db.connect() as connection:
            (persisted,) = connection.execute(
                select(storage_states.c.persisted_storage_version_hashes).where(
                    storage_states.c.cluster == "east"
                )
            ).one()
        assert persisted == [storage_version_hash("", "v1", "Pod")]

        # The lease GC expires west's lease; the projector folds the expiry.
        def expired(connection: Any) -> bool:
            expiries = connection.execute(
                select(ledger_events.c.subject).where(
                    ledger_events.c.cluster == "west",
                    ledger_events.c.event_type == "ApiserverLeaseExpired",
                )
            ).all()
            return len(expiries) == 1

        _wait_for(db, expired, running, "expiry of west's lease")
        with db.connect() as connection:
            leases = select(apiserver_leases.c.apiserver_id).where(
                apiserver_leases.c.cluster == "west"
            )
            assert connection.execute(leases).all() == []
        codes = running.stop()
    assert codes == dict.fromkeys(codes, 0), {user: running.log(user) for user in codes}
    for user in codes:
        assert "NotAuthorized" not in running.log(user)

    # A replay of the log under the projector's principal gives the same migration.
    replayed = tmp_path / "replayed.db"
    done = svledger(kafka, "projector", "replay", "--db", f"sqlite:///{replayed}")
    assert done.returncode == 0, done.stderr
    with create_engine(f"sqlite:///{replayed}").connect() as connection:
        assert migrated(connection)

    # A reader draws the history from the log.
    page = tmp_path / "pods.html"
    done = svledger(
        kafka, "reader", "timeline", "core.pods", "--cluster", "east", "--html", str(page)
    )
    assert done.returncode == 0, done.stderr
    assert "MigrationSucceeded" in page.read_text()


if __name__ == "__main__":
    assert sys.argv[1] == "worker"
    asyncio.run(_work(sys.argv[2]))


def test_a_reporter_speaks_only_through_its_inbox_and_admission_refuses_forgeries(
    kafka: SecuredKafka, tmp_path: Path
) -> None:
    """The reporter → inbox → admission path with each role under its own principal."""
    kafka.grant(TOPIC, {"admission": ("admission", None), "reporter-west": ("reporter", "west")})
    admin = kafka.settings("admin", TOPIC)
    created = svledger(kafka, "setup", "topics", "create", "--inbox", "east", "--inbox", "west")
    assert created.returncode == 0, created.stderr
    east = kafka.settings("reporter-east", TOPIC, inbox=True)
    with processes(kafka, tmp_path) as running:
        running.start("admission", "-m", "svledger", "--log-format", "text", "admit")
        asyncio.run(_report_and_forge(kafka, east, admin))
        codes = running.stop()
    assert codes == {"admission": 0}, running.log("admission")
    assert "NotAuthorized" not in running.log("admission")


async def _report_and_forge(kafka: SecuredKafka, east: KafkaSettings, admin: KafkaSettings) -> None:
    async with EventProducer(east) as producer:
        pods_v1 = ResourceReport("", "pods", "Pod", "v1", ("v1",), ("v1",))
        reporter = Reporter("east", "e1", [pods_v1], producer, heartbeat_interval=60.0)
        await reporter.start()  # the gate opens once the inbox has its registration
        await admitted_all(admin, ["east", "west"])
        before = await read_records(admin)
        assert {type(e).__name__ for e, _ in before} >= {
            "ApiserverHeartbeat",
            "StorageVersionReported",
        }
        # The east reporter's principal forges an outcome in its own inbox: refused.
        forged = MigrationSucceeded(meta("east", "e1"), "m-1", 10)
        await producer.send(forged)
        await admitted_all(admin, ["east", "west"])
        # It may not write west's inbox at all, nor the events topic.
        for_west = heartbeat("west", "w1", _now(), 60)
        with pytest.raises(NotAuthorized, match=rf"Write topic '{TOPIC}.inbox.west'"):
            await producer.send(for_west)
        after = await read_records(admin)
        assert [e.meta.event_id for e, _ in after] == [e.meta.event_id for e, _ in before]
        dead = {
            decode(value).meta.event_id: dict(headers)[DLQ_REASON_HEADER].decode()
            for value, headers in await read_topic(admin, admin.dlq_topic)
        }
        assert "may not come from a reporter's inbox" in dead[forged.meta.event_id]
        await reporter.stop()


def _serves(port: int, leases: set[str], running: Processes) -> None:
    """Wait until ``svledger serve`` serves exactly ``leases`` as the real cluster's."""
    url = (
        f"http://127.0.0.1:{port}/clusters/{COLLECTED}"
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    )
    served: set[str] | str = "nothing"
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        running.check_alive()
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
            served = {item["metadata"]["name"] for item in json.load(response)["items"]}
            if served == leases:
                return
        time.sleep(0.5)  # serve folds the log on its own: it may lag behind
    raise AssertionError(f"{url} served {served}, not {leases}, within {DEADLINE:.0f} s")


async def test_the_collector_and_the_read_api_run_under_their_roles(
    kafka: SecuredKafka, kubeconfig: str, tmp_path: Path
) -> None:
    port = free_port()
    svledger_ = ["-m", "svledger", "--log-format", "text"]
    with processes(kafka, tmp_path) as running:
        running.start(
            "collector", *svledger_, "collect", "--cluster", COLLECTED, "--kubeconfig", kubeconfig
        )
        running.start("reader", *svledger_, "serve", "--address", f"127.0.0.1:{port}")
        kube = await connect(kubeconfig)
        try:
            # The ledger, read as the reader, equals what the apiservers publish.
            await agree(kafka.settings("reader", TOPIC), kube)
            apiservers = set(await upstream_leases(kube))
        finally:
            await kube.close()
        assert len(apiservers) == 3
        await asyncio.to_thread(_serves, port, apiservers, running)
        assert running.stop() == {"collector": 0, "reader": 0}
