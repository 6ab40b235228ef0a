"""A real single-node Apache Kafka broker (KRaft) on 127.0.0.1, for development, tests and CI.

The broker's jars come from Maven Central: ``pom.xml`` beside this file names the Kafka
release, and ``fetch_jars()`` runs Maven to copy the broker and its runtime dependencies
into ``lib/``. A stamp file holding the hash of ``pom.xml`` marks ``lib/`` as complete, so
later fetches cost nothing until the pom changes.

``LocalKafka`` runs one broker that is also its own KRaft controller. Each instance picks
free ports, writes its configuration and data into a fresh temporary directory, formats
the storage, starts the JVM and returns only once the broker accepts connections on its
bootstrap address. ``stop()`` shuts it down (SIGTERM, then SIGKILL if it hangs) and
removes the directory, so nothing outlives the instance. The configuration suits one
node: internal topics (consumer offsets, transaction state) have one replica and need one
in-sync replica, so consumer groups and transactions work, and topics are never created
implicitly, so code under test must create the topics it uses.

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

``kafka_bootstrap()`` is what tests and benchmarks use: the broker named by
``SVLEDGER_KAFKA_BOOTSTRAP`` if set, else a ``LocalKafka`` for the duration of the block.

Stdlib only, so it runs before any virtualenv exists::

    python deploy/kafka/broker.py fetch   # resolve the jars into lib/ only
    python deploy/kafka/broker.py run     # print the bootstrap address, serve until SIGINT/SIGTERM
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

# Printed by kafka.server.KafkaRaftServer once the broker serves clients.
_STARTED_MARKER = "Kafka Server started"
_LOG_TAIL_LINES = 40
_JAVA_OPTIONS = (
    "-Xms128m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


class BrokerError(RuntimeError):
    """The broker's jars could not be resolved or the broker could not be run."""


SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
# The principal of every connection to the PLAINTEXT controller listener.
_CONTROLLER_PRINCIPAL = "User:ANONYMOUS"


@dataclasses.dataclass(frozen=True)
class Security:
    """Who may log in to a secured :class:`LocalKafka`, and who is its super user.

    ``users`` maps each SCRAM user to its password; every user can log in with either
    mechanism of :data:`SCRAM_MECHANISMS`. ``super_user`` (one of them) is allowed
    everything, grants the ACLs, and is the broker's own identity on its listener.
    """

    users: Mapping[str, str]
    super_user: str = "admin"

    def __post_init__(self) -> None:
        if self.super_user not in self.users:
            raise BrokerError(f"the super user {self.super_user!r} is not among the users")
        for name in self.users:
            # StorageTool's --add-scram syntax ends a value at ',' or ']'.
            if not name or not all(c.isalnum() or c in "._-" for c in name):
                raise BrokerError(f"SCRAM user {name!r}: use letters, digits and '._-' only")

    @classmethod
    def for_users(cls, *names: str, super_user: str = "admin") -> Security:
        """The super user and ``names``, each with a fresh random password."""
        return cls(
            {name: secrets.token_hex(16) for name in (super_user, *names)}, super_user=super_user
        )

    def password(self, user: str) -> str:
        try:
            return self.users[user]
        except KeyError:
            raise BrokerError(
                f"no SCRAM user {user!r}; the users are {sorted(self.users)}"
            ) from None


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


class LocalKafka:
    """One KRaft broker+controller on free 127.0.0.1 ports, alive between start() and stop()."""

    def __init__(
        self,
        *,
        heap: str = "512m",
        startup_timeout: float = 120.0,
        security: Security | None = None,
        overrides: Mapping[str, str] | None = None,
    ) -> None:
        """``overrides``: broker settings (``server.properties`` keys) set over its own."""
        self._heap = heap
        self._startup_timeout = startup_timeout
        self.security = security
        self._overrides = dict(overrides or {})
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port = 0

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients connect to, ``127.0.0.1:PORT``."""
        if self._process is None:
            raise BrokerError("the broker is not running: call start() first")
        return f"127.0.0.1:{self._port}"

    @property
    def data_dir(self) -> Path:
        """The broker's ``log.dirs``: one directory per topic partition, ``<topic>-<n>``."""
        if self._workdir is None:
            raise BrokerError("the broker is not running: call start() first")
        return self._workdir / "data"

    @property
    def ca_file(self) -> Path:
        """The PEM certificate of the CA that signed the broker's, for clients to verify it."""
        return self._tls_dir / "ca.pem"

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
        if self._workdir is None:
            raise BrokerError("the broker is not running: call start() first")
        return self._workdir / "tls"

    def _require_security(self) -> Security:
        if self.security is None:
            raise BrokerError("this broker is not secured: give LocalKafka(security=...)")
        return self.security

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
        """Start the broker and return once it accepts connections at ``bootstrap``."""
        if self._process is not None:
            raise BrokerError(f"the broker is already running at {self.bootstrap}")
        self._workdir = Path(tempfile.mkdtemp(prefix="svledger-kafka-"))
        try:
            self._port, controller_port = free_port(), free_port()
            if self.security is not None:
                _make_certificates(self._tls_dir)
            config = self._write_config(controller_port)
            self._format_storage(self._java_command(), config)
            self._launch(config)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """Kill the broker hard (SIGKILL), as a crash would; its data stays for :meth:`restart`."""
        process, self._process = self._process, None
        if process is None:
            raise BrokerError("the broker is not running: call start() first")
        process.kill()
        process.wait()

    def hang(self) -> None:
        """Freeze the broker (SIGSTOP): its connections stay open and nothing is answered,
        as when its machine stalls; :meth:`resume` lets it go on."""
        if self._process is None:
            raise BrokerError("the broker is not running: call start() first")
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a broker frozen by :meth:`hang` go on (SIGCONT)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start the broker again on its data and ports after :meth:`kill`; return once ready."""
        if self._process is not None or self._workdir is None:
            raise BrokerError("restart() follows kill(): the broker must be killed, not stopped")
        self._launch(self._workdir / "server.properties")

    def _java_command(self) -> list[str]:
        java = _require_tool(
            "java", "a Java 17+ runtime (for example `apt-get install default-jre`)"
        )
        return [
            java,
            f"-Xmx{self._heap}",
            *_JAVA_OPTIONS,
            f"-Dlog4j2.configurationFile={self._write_log_config()}",
            "-cp",
            str(fetch_jars() / "*"),
        ]

    def _launch(self, config: Path) -> None:
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [*self._java_command(), "kafka.Kafka", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self._wait_until_ready()

    def stop(self) -> None:
        """Stop the broker (SIGTERM, SIGKILL after 30 s) and delete its data; safe to repeat."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise BrokerError, with the end of the broker's log, if the broker process has exited."""
        if self._process is None:
            raise BrokerError("the broker is not running: call start() first")
        code = self._process.poll()
        if code is not None:
            raise BrokerError(f"the Kafka broker exited with code {code}.\n{self._log_tail()}")

    @property
    def _log_path(self) -> Path:
        assert self._workdir is not None
        return self._workdir / "broker.log"

    def _write_config(self, controller_port: int) -> Path:
        assert self._workdir is not None
        listener = "PLAINTEXT" if self.security is None else "SASL_SSL"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"{listener}://127.0.0.1:{self._port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{self._port}",
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            **self._security_config(),
            "log.dirs": str(self.data_dir),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "transaction.partition.verification.enable": "false",
            **self._overrides,
        }
        path = self._workdir / "server.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return path

    def _security_config(self) -> dict[str, str]:
        """SASL_SSL with SCRAM on the client listener, and the authorizer; none by default."""
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
        return config

    def _write_log_config(self) -> Path:
        assert self._workdir is not None
        path = self._workdir / "log4j2.properties"
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

    def _format_storage(self, java_command: list[str], config: Path) -> None:
        # Kafka cluster ids are 16 random bytes in unpadded URL-safe base64. One that
        # starts with "-" would be read by StorageTool as an option: draw again.
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
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
                cluster_id,
                "-c",
                str(config),
                *scram,
            ],
            f"formatting the Kafka storage in {self._workdir} failed",
        )

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if _STARTED_MARKER in self._log_path.read_text(errors="replace") and _accepts(
                self._port
            ):
                return
            time.sleep(0.2)
        raise BrokerError(
            f"the Kafka broker did not start within {self._startup_timeout:g} s; "
            f"raise startup_timeout on a slow machine.\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        lines = self._log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        return f"Last lines of {self._log_path}:\n" + "\n".join(lines)


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
    openssl = _require_tool("openssl", "the openssl command (`apt-get install openssl`)")
    tls.mkdir(parents=True)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _run(
        [
            openssl,
            "req",
            "-x509",
            *key,
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
    _run(
        [
            openssl,
            "req",
            *key,
            "-keyout",
            str(tls / "broker.key"),
            "-out",
            str(tls / "broker.csr"),
            "-subj",
            "/CN=localhost",
        ],
        "openssl could not make the broker's key",
    )
    extensions = tls / "broker.ext"
    extensions.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _run(
        [
            openssl,
            "x509",
            "-req",
            "-in",
            str(tls / "broker.csr"),
            "-CA",
            str(tls / "ca.pem"),
            "-CAkey",
            str(tls / "ca.key"),
            "-CAcreateserial",
            "-days",
            _CERTIFICATE_DAYS,
            "-extfile",
            str(extensions),
            "-out",
            str(tls / "broker.crt"),
        ],
        "openssl could not sign the broker's certificate",
    )
    (tls / "broker.pem").write_text(
        (tls / "broker.key").read_text() + (tls / "broker.crt").read_text()
    )


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
    commands.add_parser("fetch", help="resolve the broker jars into deploy/kafka/lib/ and exit")
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
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch_jars()
            return 0
        stop_requested = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda _signum, _frame: stop_requested.set())
        security = Security.for_users(*args.user) if args.user else None
        with LocalKafka(security=security) as kafka:
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
