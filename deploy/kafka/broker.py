"""A real Apache Kafka cluster (KRaft) on 127.0.0.1, for development, tests and CI: one
node by default, or three, replicated, as production runs it.

The broker's jars come from Maven Central: ``pom.xml`` beside this file names the Kafka
release, and ``fetch_jars()`` runs Maven to copy the broker and its runtime dependencies
into ``lib/``. A stamp file holding the hash of ``pom.xml`` marks ``lib/`` as complete, so
later fetches cost nothing until the pom changes.

A broker JVM starting cold spends most of its start loading and compiling classes, and
the suite starts dozens. So the fetch also writes a class-data archive of a broker's
classes (``lib/kafka.jsa``, JDK's dynamic CDS, by starting and stopping a broker once,
9 s), which every later JVM maps instead of loading its classes again; and the JVMs run
with the client compiler alone (``-XX:TieredStopAtLevel=1``), whose code is slower at
peak but costs far less CPU to make: a broker here starts in half the time on a third
of the CPU, and a loaded 2-core machine gets the difference back. A JVM whose archive
does not match its jars says so in its log and loads its classes as usual.

``LocalKafka`` runs one node, a broker and its own KRaft controller in one JVM, or
``brokers`` brokers beside a KRaft controller of their own, as production separates
them (brokers down then never take the metadata quorum with them). Each instance
picks free ports, writes each node's configuration, partition data (``log.dirs``) and
metadata log (``metadata.log.dir``) into a fresh temporary directory, formats the
storage, starts the JVMs together (a controller waits for a quorum) and returns only
once every node accepts connections. ``stop()`` shuts them down (SIGTERM, then SIGKILL
if one hangs) and removes the directory, so nothing outlives the instance. One node at a
time can be killed (SIGKILL), shut down cleanly (a rolling restart), wiped (its
partition data lost, as with a replaced disk) and restarted. Internal topics (consumer
offsets, transaction state) have ``min(3, brokers)`` replicas and need all but one in
sync (at least one), so consumer groups and transactions work on one node and survive a
node down on three; topics are never created implicitly, so code under test must create
the topics it uses.

By default the broker has one PLAINTEXT listener and no authorizer: anyone may do
anything. ``LocalKafka(security=Security.for_users(...))`` runs it as a production
cluster should be run, to test clients against: its one client listener is ``SASL_SSL``
(TLS with a certificate from a throwaway CA made with the ``openssl`` command, then
SCRAM-SHA-512 or SCRAM-SHA-256 logins of the users created when the storage is
formatted), and KRaft's ``StandardAuthorizer`` refuses every request no ACL allows,
except those of the super user, which grants the ACLs. The KRaft controller listener
stays PLAINTEXT on 127.0.0.1: its unauthenticated principal ``User:ANONYMOUS`` must
be a super user for the broker to register with its own controller, which is
acceptable for a broker on the loopback address and nowhere else.

``Security(..., mutual_tls=True)`` adds a second client listener, ``SSL`` with
``ssl.client.auth=required`` (:attr:`LocalKafka.mutual_tls_bootstrap`): a client logs
in with a certificate the same CA signed (:meth:`LocalKafka.client_certificate`), and
the principal mapping rule :data:`PRINCIPAL_MAPPING_RULES` names it ``User:<CN>`` after
its subject's common name, so ACLs are granted to certificate principals as to SCRAM
users.

``kafka_bootstrap()`` is what tests and benchmarks use: the broker named by
``SVLEDGER_KAFKA_BOOTSTRAP`` if set, else a ``LocalKafka`` for the duration of the block.

Stdlib only, so it runs before any virtualenv exists::

    python deploy/kafka/broker.py fetch   # resolve the jars into lib/ only
    python deploy/kafka/broker.py run     # print the bootstrap address, serve until SIGINT/SIGTERM
    python deploy/kafka/broker.py run --brokers 3  # three replicated nodes
    python deploy/kafka/broker.py run --user projector  # the same, secured, with a user
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import dataclasses
import hashlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LIB = HERE / "lib"
_STAMP = LIB / ".pom.sha256"
_CLASS_ARCHIVE = LIB / "kafka.jsa"

# Printed by kafka.server.KafkaRaftServer once the broker serves clients.
_STARTED_MARKER = "Kafka Server started"
_LOG_TAIL_LINES = 40
_JAVA_OPTIONS = (
    "-Xms128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


class BrokerError(RuntimeError):
    """The broker's jars could not be resolved or the broker could not be run."""


SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
# A client certificate's principal is User:<its subject's CN> (Kafka's default would be
# the whole distinguished name, User:CN=...); a subject that does not start with a CN
# keeps the default. Kafka reads the subject in RFC 2253 order, the most specific first.
PRINCIPAL_MAPPING_RULES = "RULE:^CN=([^,]+).*$/$1/,DEFAULT"
# The principal of every connection to the PLAINTEXT controller listener.
_CONTROLLER_PRINCIPAL = "User:ANONYMOUS"


@dataclasses.dataclass(frozen=True)
class Security:
    """Who may log in to a secured :class:`LocalKafka`, and who is its super user.

    ``users`` maps each SCRAM user to its password; every user can log in with either
    mechanism of :data:`SCRAM_MECHANISMS`. ``super_user`` (one of them) is allowed
    everything, grants the ACLs, and is the broker's own identity on its listener.
    ``mutual_tls`` adds a listener where clients log in with a certificate instead.
    """

    users: Mapping[str, str]
    super_user: str = "admin"
    mutual_tls: bool = False

    def __post_init__(self) -> None:
        if self.super_user not in self.users:
            raise BrokerError(f"the super user {self.super_user!r} is not among the users")
        for name in self.users:
            # StorageTool's --add-scram syntax ends a value at ',' or ']'.
            _check_name("SCRAM user", name)

    @classmethod
    def for_users(
        cls, *names: str, super_user: str = "admin", mutual_tls: bool = False
    ) -> Security:
        """The super user and ``names``, each with a fresh random password."""
        return cls(
            {name: secrets.token_hex(16) for name in (super_user, *names)},
            super_user=super_user,
            mutual_tls=mutual_tls,
        )

    def password(self, user: str) -> str:
        try:
            return self.users[user]
        except KeyError:
            raise BrokerError(
                f"no SCRAM user {user!r}; the users are {sorted(self.users)}"
            ) from None


def _check_name(what: str, name: str) -> None:
    if not name or not all(c.isalnum() or c in "._-" for c in name):
        raise BrokerError(f"{what} {name!r}: use letters, digits and '._-' only")


def fetch_jars() -> Path:
    """Copy the broker jars into ``lib/`` unless they match ``pom.xml`` already; return ``lib/``."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()
    if _STAMP.is_file() and _STAMP.read_text().strip() == digest:
        return LIB
    mvn = _require_tool("mvn", "Apache Maven 3.8+ (for example `apt-get install maven`)")
    # A half-copied or older lib/ may hold jars of another Kafka release: start afresh.
    shutil.rmtree(LIB, ignore_errors=True)
    _run(
        [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies"],
        f"mvn could not resolve the Kafka broker jars named in {POM}",
        "; check that Maven Central is reachable",
    )
    _STAMP.write_text(digest + "\n")
    return LIB


def fetch() -> Path:
    """:func:`fetch_jars`, then the class-data archive of a broker's classes unless there
    is one; return ``lib/``. Without the archive (a JVM that cannot write one) brokers
    start as fast as before, so a failure to write it is said, never raised."""
    lib = fetch_jars()
    if not _CLASS_ARCHIVE.is_file():
        partial = _CLASS_ARCHIVE.with_suffix(".jsa.partial")
        try:
            # Written by the JVM as it exits: the broker's, stopped by SIGTERM, is last.
            with LocalKafka(_archive_classes_to=partial):
                pass
            partial.replace(_CLASS_ARCHIVE)
        except (BrokerError, OSError) as error:
            print(f"warning: no class-data archive for the broker ({error})", file=sys.stderr)
    return lib


@dataclasses.dataclass
class _Node:
    """One KRaft node of a :class:`LocalKafka`: a broker, a controller, or both in one JVM."""

    node_id: int
    directory: Path
    port: int  # the client listener's; the controller listener's on a controller alone
    controller_port: int
    mutual_tls_port: int | None = None  # the SSL listener of Security(mutual_tls=True)
    roles: str = "broker,controller"
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "broker.log"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def metadata_dir(self) -> Path:
        return self.directory / "metadata"

    def log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        return f"Last lines of {self.log_path}:\n" + "\n".join(lines)


class LocalKafka:
    """Kafka brokers on free 127.0.0.1 ports, alive between start() and stop(): one (its
    own KRaft controller) by default, ``brokers=3`` for a replicated cluster (with a
    KRaft controller apart, which no fault of a broker touches).

    Brokers are numbered from 0 in the methods that act on one (:meth:`kill`,
    :meth:`terminate`, :meth:`restart`, :meth:`wipe`, :meth:`hang`); their Kafka node
    IDs are that number plus one. With several, the internal topics (consumer offsets,
    transaction state) have ``min(3, brokers)`` replicas and need all but one in sync,
    as a production cluster runs them.
    """

    def __init__(
        self,
        *,
        brokers: int = 1,
        heap: str = "512m",
        startup_timeout: float = 120.0,
        security: Security | None = None,
        overrides: Mapping[str, str] | None = None,
        _archive_classes_to: Path | None = None,
    ) -> None:
        """``overrides``: broker settings (``server.properties`` keys) set over its own."""
        if brokers < 1:
            raise BrokerError(f"brokers={brokers}: a cluster has at least one broker")
        self.brokers = brokers
        self._heap = heap
        self._startup_timeout = startup_timeout
        self.security = security
        self._overrides = dict(overrides or {})
        self._archive_classes_to = _archive_classes_to  # by fetch(), else the archive is read
        self._workdir: Path | None = None
        self._nodes: list[_Node] = []  # the brokers
        self._controller: _Node | None = None  # a controller of its own, with several brokers
        self._cluster_id = _cluster_id()

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients connect to: ``127.0.0.1:PORT`` of every node."""
        self._require_running()
        return ",".join(node.address for node in self._nodes)

    def address(self, node: int) -> str:
        """The client address of node ``node`` alone."""
        return self._node(node).address

    def node_of(self, broker_id: int) -> int:
        """The node number of the broker Kafka calls ``broker_id`` (a leader's, say)."""
        return broker_id - 1

    def running(self, node: int) -> bool:
        return self._node(node).process is not None

    @property
    def data_dir(self) -> Path:
        """The first node's ``log.dirs``: one directory per topic partition, ``<topic>-<n>``."""
        return self._node(0).data_dir

    @property
    def ca_file(self) -> Path:
        """The PEM certificate of the CA that signed the broker's, for clients to verify it."""
        return self._tls_dir / "ca.pem"

    @property
    def mutual_tls_bootstrap(self) -> str:
        """The bootstrap address of the listener where clients log in with a certificate
        (``SSL``, ``ssl.client.auth=required``): ``127.0.0.1:PORT`` of every node."""
        if not self._require_security().mutual_tls:
            raise BrokerError("no mutual TLS listener: give Security(..., mutual_tls=True)")
        self._require_running()
        return ",".join(f"127.0.0.1:{node.mutual_tls_port}" for node in self._nodes)

    def client_certificate(self, user: str) -> tuple[Path, Path]:
        """A client certificate for ``user`` (subject ``CN=<user>``) signed by the CA,
        and its unencrypted key: PEM files ``(certfile, keyfile)``, made on first use.

        On the :attr:`mutual_tls_bootstrap` listener its principal is ``User:<user>``.
        """
        _check_name("certificate user", user)
        name = f"client-{user}"
        certfile, keyfile = self._tls_dir / f"{name}.crt", self._tls_dir / f"{name}.key"
        if not certfile.is_file():
            _issue(self._tls_dir, name, f"/CN={user}", "extendedKeyUsage=clientAuth\n")
        return certfile, keyfile

    def client_properties(self, user: str) -> Path:
        """A Java client configuration file logging in as ``user`` (``--command-config``).

        For Kafka's own tools (``kafka-acls.sh`` and the like): SASL_SSL with
        SCRAM-SHA-512, verifying the broker against :attr:`ca_file`.
        """
        security = self._require_security()
        assert self._workdir is not None
        path = self._workdir / f"client-{user}.properties"
        path.write_text(
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={SCRAM_MECHANISMS[0]}\n"
            f"sasl.jaas.config={_scram_login(user, security.password(user))}\n"
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={self.ca_file}\n"
        )
        return path

    @property
    def _tls_dir(self) -> Path:
        self._require_security()
        self._require_running()
        assert self._workdir is not None
        return self._workdir / "tls"

    def _require_security(self) -> Security:
        if self.security is None:
            raise BrokerError("this broker is not secured: give LocalKafka(security=...)")
        return self.security

    def _require_running(self) -> None:
        if self._workdir is None:
            raise BrokerError("the broker is not running: call start() first")

    def _node(self, node: int) -> _Node:
        self._require_running()
        if not 0 <= node < len(self._nodes):
            raise BrokerError(f"no node {node}: the nodes are 0 to {len(self._nodes) - 1}")
        return self._nodes[node]

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalKafka:
        """Start every node and return once each accepts connections."""
        if self._workdir is not None:
            raise BrokerError(f"the broker is already running at {self.bootstrap}")
        self._workdir = Path(tempfile.mkdtemp(prefix="svledger-kafka-"))
        try:
            mutual_tls = self.security is not None and self.security.mutual_tls
            alone = self.brokers == 1
            self._nodes = [
                _Node(
                    index + 1,
                    self._workdir / f"node-{index + 1}",
                    free_port(),
                    free_port(),
                    free_port() if mutual_tls else None,
                    roles="broker,controller" if alone else "broker",
                )
                for index in range(self.brokers)
            ]
            if not alone:
                port = free_port()
                self._controller = _Node(
                    self.brokers + 1, self._workdir / "controller", port, port, roles="controller"
                )
            if self.security is not None:
                _make_certificates(self._tls_dir)
            java = self._java_command()
            for node in self._every_node():
                node.directory.mkdir()
                self._write_config(node)
                self._format_storage(java, node)
            for node in self._every_node():  # a node waits for its controllers: all at once
                self._spawn(node)
            for node in self._every_node():
                self._wait_until_ready(node)
        except BaseException:
            self.stop()
            raise
        return self

    def _every_node(self) -> list[_Node]:
        return [*self._nodes, *([self._controller] if self._controller else [])]

    def kill(self, node: int = 0) -> None:
        """Kill a node hard (SIGKILL), as a crash would; its data stays for :meth:`restart`."""
        target = self._node(node)
        process, target.process = target.process, None
        if process is None:
            raise BrokerError(f"node {node} is not running")
        process.kill()
        process.wait()

    def terminate(self, node: int = 0, timeout: float = 60.0) -> None:
        """Shut a node down cleanly (SIGTERM: a controlled shutdown that hands its
        leaderships over first), as an operator's rolling restart does; its data stays."""
        target = self._node(node)
        process, target.process = target.process, None
        if process is None:
            raise BrokerError(f"node {node} is not running")
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise BrokerError(
                f"node {node} did not shut down within {timeout:g} s: killed.\n{target.log_tail()}"
            ) from None

    def wipe(self, node: int) -> None:
        """Delete a stopped node's partition data (``log.dirs``), as a replaced disk loses
        it, and format the empty directory as an operator must (``kafka-storage format
        --ignore-formatted`` with the cluster's ID). Its metadata log stays, so it comes back
        as the same broker; restarted, it fetches every replica it holds again from the
        leaders."""
        target = self._node(node)
        if target.process is not None:
            raise BrokerError(f"node {node} is running: kill() or terminate() it first")
        shutil.rmtree(target.data_dir)
        self._format_storage(self._java_command(), target, "--ignore-formatted")

    def hang(self, node: int = 0) -> None:
        """Freeze a node (SIGSTOP): its connections stay open and nothing is answered,
        as when its machine stalls; :meth:`resume` lets it go on."""
        process = self._node(node).process
        if process is None:
            raise BrokerError(f"node {node} is not running")
        process.send_signal(signal.SIGSTOP)

    def resume(self, node: int = 0) -> None:
        """Let a node frozen by :meth:`hang` go on (SIGCONT)."""
        process = self._node(node).process
        if process is not None:
            process.send_signal(signal.SIGCONT)

    def restart(self, node: int = 0) -> None:
        """Start a killed or terminated node again on its data and ports; return once ready."""
        target = self._node(node)
        if target.process is not None:
            raise BrokerError(f"node {node} is running: restart() follows kill() or terminate()")
        self._spawn(target)
        self._wait_until_ready(target)

    def _java_command(self) -> list[str]:
        java = _require_tool(
            "java", "a Java 17+ runtime (for example `apt-get install default-jre`)"
        )
        assert self._workdir is not None
        archive = []
        if self._archive_classes_to is not None:
            archive = [f"-XX:ArchiveClassesAtExit={self._archive_classes_to}"]
        elif _CLASS_ARCHIVE.is_file():
            archive = [f"-XX:SharedArchiveFile={_CLASS_ARCHIVE}"]
        return [
            java,
            f"-Xmx{self._heap}",
            *_JAVA_OPTIONS,
            *archive,
            f"-Dlog4j2.configurationFile={self._write_log_config(self._workdir)}",
            "-cp",
            str(fetch_jars() / "*"),
        ]

    def _spawn(self, node: _Node) -> None:
        with node.log_path.open("wb") as log:
            node.process = subprocess.Popen(
                [*self._java_command(), "kafka.Kafka", str(node.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after 30 s) and delete the data; safe to repeat."""
        stopping = []
        for node in self._every_node():
            process, node.process = node.process, None
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a hung node could not stop
                process.terminate()
                stopping.append(process)
        deadline = time.monotonic() + 30
        for process in stopping:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._nodes, self._controller = [], None
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise BrokerError, with the end of its log, if a node's process has exited."""
        self._require_running()
        for node in self._every_node():
            if node.process is None:
                continue
            code = node.process.poll()
            if code is not None:
                raise BrokerError(
                    f"the Kafka {node.roles} (node ID {node.node_id}) exited with code {code}."
                    f"\n{node.log_tail()}"
                )

    def _write_config(self, node: _Node) -> None:
        listener = "PLAINTEXT" if self.security is None else "SASL_SSL"
        replicas = min(3, self.brokers)
        in_sync = max(1, replicas - 1)
        voters = ",".join(
            f"{n.node_id}@127.0.0.1:{n.controller_port}"
            for n in self._every_node()
            if "controller" in n.roles
        )
        if node.roles == "controller":
            self._write_controller_config(node, voters)
            return
        clients = {listener: node.address}  # client listeners, named by their protocol
        if node.mutual_tls_port is not None:
            clients["SSL"] = f"127.0.0.1:{node.mutual_tls_port}"
        advertised = [f"{name}://{address}" for name, address in clients.items()]
        protocols = [f"{name}:{name}" for name in clients]
        listeners = list(advertised)
        if "controller" in node.roles:
            listeners.append(f"CONTROLLER://127.0.0.1:{node.controller_port}")
        settings = {
            "process.roles": node.roles,
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join([*protocols, "CONTROLLER:PLAINTEXT"]),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            **self._security_config(),
            "log.dirs": str(node.data_dir),
            "metadata.log.dir": str(node.metadata_dir),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": str(replicas),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(in_sync),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(in_sync),
            "group.initial.rebalance.delay.ms": "0",
            "transaction.partition.verification.enable": "false",
            **self._overrides,
        }
        node.config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))

    def _write_controller_config(self, node: _Node, voters: str) -> None:
        """A controller alone: the quorum's listener only, and the authorizer if secured."""
        secured = self._security_config()
        settings = {
            "process.roles": "controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"CONTROLLER://127.0.0.1:{node.controller_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            **{k: v for k, v in secured.items() if k in ("authorizer.class.name", "super.users")},
            "log.dirs": str(node.data_dir),
            "metadata.log.dir": str(node.metadata_dir),
            **self._overrides,
        }
        node.config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))

    def _security_config(self) -> dict[str, str]:
        """SASL_SSL with SCRAM on the client listener (and, with ``mutual_tls``, SSL with
        client certificates on a second one), and the authorizer; none by default."""
        if self.security is None:
            return {}
        tls, admin = self._tls_dir, self.security.super_user
        config = {
            "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
            # The broker talks to itself (transaction markers, for one) as the super user.
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISMS[0],
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tls / "broker.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls / "ca.pem"),
            "ssl.client.auth": "none",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{admin};{_CONTROLLER_PRINCIPAL}",
            "allow.everyone.if.no.acl.found": "false",
        }
        for mechanism in SCRAM_MECHANISMS:
            # The server side of a SCRAM login needs a JAAS entry per mechanism; the
            # credentials in it are the ones the broker presents as a client.
            key = f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config"
            config[key] = _scram_login(admin, self.security.password(admin))
        if self.security.mutual_tls:
            # The SSL listener's clients are who their certificates (the CA signed) say.
            config["listener.name.ssl.ssl.client.auth"] = "required"
            config["ssl.principal.mapping.rules"] = PRINCIPAL_MAPPING_RULES
        return config

    @staticmethod
    def _write_log_config(workdir: Path) -> Path:
        path = workdir / "log4j2.properties"
        path.write_text(
            "status = warn\n"
            "appender.stdout.type = Console\n"
            "appender.stdout.name = STDOUT\n"
            "appender.stdout.layout.type = PatternLayout\n"
            "appender.stdout.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.stdout.ref = STDOUT\n"
        )
        return path

    def _format_storage(self, java_command: list[str], node: _Node, *options: str) -> None:
        # SCRAM credentials live in the cluster metadata: written with the first record.
        scram = [
            argument
            for user, password in (self.security.users.items() if self.security else ())
            for mechanism in SCRAM_MECHANISMS
            for argument in ("--add-scram", f"{mechanism}=[name={user},password={password}]")
        ]
        _run(
            [
                *java_command,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self._cluster_id,
                "-c",
                str(node.config),
                *scram,
                *options,
            ],
            f"formatting the Kafka storage in {node.directory} failed",
        )

    def _wait_until_ready(self, node: _Node) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if _STARTED_MARKER in node.log_path.read_text(errors="replace") and _accepts(node.port):
                return
            time.sleep(0.2)
        raise BrokerError(
            f"the Kafka broker (node {node.node_id - 1}) did not start within"
            f" {self._startup_timeout:g} s; raise startup_timeout on a slow machine.\n"
            f"{node.log_tail()}"
        )


def _cluster_id() -> str:
    """A new Kafka cluster ID: 16 random bytes in unpadded URL-safe base64."""
    # One that starts with "-" would be read by StorageTool as an option: draw again.
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    return cluster_id


@contextlib.contextmanager
def kafka_bootstrap() -> Iterator[str]:
    """``SVLEDGER_KAFKA_BOOTSTRAP`` if set, else the address of a LocalKafka alive for the block."""
    configured = os.environ.get("SVLEDGER_KAFKA_BOOTSTRAP")
    if configured:
        yield configured
        return
    with LocalKafka() as kafka:
        yield kafka.bootstrap


def _scram_login(user: str, password: str) -> str:
    """A JAAS entry logging in as ``user`` with SCRAM (Java client and broker syntax)."""
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


# The CA and the broker's certificate live as long as the broker: a day is plenty.
_CERTIFICATE_DAYS = "2"


def _make_certificates(tls: Path) -> None:
    """A throwaway CA (``ca.pem``) and a broker certificate it signed, for 127.0.0.1.

    ``broker.pem`` holds the broker's unencrypted PKCS#8 key and certificate: a PEM
    keystore as Kafka reads it. The certificate names ``localhost`` and ``127.0.0.1``,
    so clients verify the host as well as the signature.
    """
    tls.mkdir(parents=True)
    _run(
        [
            _openssl(),
            "req",
            "-x509",
            *_NEW_KEY,
            "-keyout",
            str(tls / "ca.key"),
            "-out",
            str(tls / "ca.pem"),
            "-days",
            _CERTIFICATE_DAYS,
            "-subj",
            "/CN=svledger test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        "openssl could not make the test CA",
    )
    _issue(
        tls,
        "broker",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    (tls / "broker.pem").write_text(
        (tls / "broker.key").read_text() + (tls / "broker.crt").read_text()
    )


_NEW_KEY: Final = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _issue(tls: Path, name: str, subject: str, extensions: str) -> None:
    """``<name>.key`` and ``<name>.crt`` in ``tls``: a new key and its certificate for
    ``subject``, with the X.509 ``extensions`` (openssl's syntax), signed by the CA."""
    openssl = _openssl()
    _run(
        [
            openssl,
            "req",
            *_NEW_KEY,
            "-keyout",
            str(tls / f"{name}.key"),
            "-out",
            str(tls / f"{name}.csr"),
            "-subj",
            subject,
        ],
        f"openssl could not make the key of {subject}",
    )
    (tls / f"{name}.ext").write_text(extensions)
    _run(
        [
            openssl,
            "x509",
            "-req",
            "-in",
            str(tls / f"{name}.csr"),
            "-CA",
            str(tls / "ca.pem"),
            "-CAkey",
            str(tls / "ca.key"),
            "-CAcreateserial",
            "-days",
            _CERTIFICATE_DAYS,
            "-extfile",
            str(tls / f"{name}.ext"),
            "-out",
            str(tls / f"{name}.crt"),
        ],
        f"openssl could not sign the certificate of {subject}",
    )


def _openssl() -> str:
    return _require_tool("openssl", "the openssl command (`apt-get install openssl`)")


def _run(command: list[str], failure: str, hint: str = "") -> None:
    """Run ``command`` to completion; raise BrokerError with its output if it fails."""
    result = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BrokerError(
            f"{failure} (exit code {result.returncode}){hint}:\n{result.stdout}{result.stderr}"
        )


def _require_tool(name: str, what: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BrokerError(f"`{name}` is not on PATH; the local Kafka broker needs {what}")
    return path


EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORTS_BELOW_EPHEMERAL: Final = 10_000
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (tests and benchmarks too),
    below the kernel's ephemeral range, and not handed out before by this process.

    The port ``bind(0)`` gives comes from the ephemeral range, the one every outgoing
    connection takes its local port from: between this check and the server's own bind a
    client connection (to Kafka, etcd, PostgreSQL) can take it, and the server fails with
    "address already in use" (a kube-apiserver did, once, in a full run). No connection
    takes a port below the range, so one is drawn at random there and checked; ``bind(0)``
    only if none of a hundred draws is free.
    """
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    candidates = range(max(1024, low - _PORTS_BELOW_EPHEMERAL), low)
    for port in random.sample(candidates, min(100, len(candidates))):
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        _handed_out.add(port)
        return int(port)


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _die_with_parent() -> None:
    # Runs in the forked child before exec: ask Linux to SIGTERM the JVM when the process
    # that started it dies, so a killed test run or shell never leaves a broker behind.
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "fetch",
        help="resolve the broker jars into deploy/kafka/lib/, write the class-data archive "
        "brokers start from, and exit",
    )
    run = commands.add_parser(
        "run", help="start a broker, print its bootstrap address, serve until SIGINT/SIGTERM"
    )
    run.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="NAME",
        help="secure the broker (SASL_SSL, ACLs) with this SCRAM user besides 'admin', the "
        "super user; repeat for more. Prints the CA file, the admin's client properties "
        "and every user's password after the address",
    )
    run.add_argument(
        "--brokers",
        type=int,
        default=1,
        metavar="N",
        help="run N nodes (brokers and controllers), replicated as production runs them "
        "(default 1); the bootstrap address lists them all",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch()
            return 0
        stop_requested = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda _signum, _frame: stop_requested.set())
        security = Security.for_users(*args.user) if args.user else None
        with LocalKafka(brokers=args.brokers, security=security) as kafka:
            print(kafka.bootstrap, flush=True)
            if security is not None:
                print(f"ca-file {kafka.ca_file}")
                print(f"admin-properties {kafka.client_properties(security.super_user)}")
                for user, password in security.users.items():
                    print(f"user {user} {password}", flush=True)
            while not stop_requested.wait(1.0):
                kafka.check_alive()
        return 0
    except BrokerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
