"""The ``svledger`` command frame, ``hash`` and ``apiserver-id``."""

from __future__ import annotations

import json
import logging
import pathlib
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Final

import pytest

from ledger.events import ApiserverHeartbeat, Event, Meta, Position, StorageVersionReported
from projections import store
from projections.database import engine, shown
from projections.projector import Projection, fold_batch
from projections.state import State
from svledger.cli import LibraryRepeats, build_parser, configure_logging, main
from tests.consumed import consumed_log


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The command configures the root logger; give the next test the one it had."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    ("argv", "printed"),
    [
        (["hash", "apps", "v1", "Deployment"], "8aSe+NMegvE="),
        (["hash", "", "v1", "Pod"], "xPOwRZ+Yhw8="),
        (["hash", "core", "v1", "Pod"], "xPOwRZ+Yhw8="),
        (["apiserver-id", "minikube"], "apiserver-eqt674mfxb4j56mrjjkoe7b7ii"),
    ],
)
def test_prints_the_value_and_succeeds(
    argv: list[str], printed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    assert capsys.readouterr().out == printed + "\n"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["hash", "apps", "v1/beta1", "Deployment"], "version 'v1/beta1' contains '/'"),
        (["hash", "apps", "v1"], "required: KIND"),
        (["apiserver-id", ""], "hostname is empty"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
        (["--log-level", "loud", "hash", "", "v1", "Pod"], "invalid choice: 'LOUD'"),
        ([], "required: COMMAND"),
    ],
)
def test_a_bad_argument_is_a_usage_error_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "usage: svledger" in captured.err
    assert named in captured.err


def test_help_explains_the_tool_and_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "event-sourced ledger of Kubernetes storage versions" in out
    for command in ("hash", "apiserver-id"):
        assert command in out


def test_the_log_level_is_case_insensitive(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "debug", "hash", "", "v1", "Pod"]) == 0
    assert logging.getLogger().level == logging.DEBUG


def test_json_logs_are_one_object_per_line_with_the_extra_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("INFO", "json")
    log = logging.getLogger("svledger.test")
    log.debug("not shown")
    log.info("projected %d events", 3, extra={"partition": 2, "offset": 41})
    try:
        raise RuntimeError("broker down")
    except RuntimeError:
        log.exception("retrying")

    lines = capsys.readouterr().err.splitlines()

    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "INFO"
    assert first["logger"] == "svledger.test"
    assert first["message"] == "projected 3 events"
    assert (first["partition"], first["offset"]) == (2, 41)
    assert first["time"].endswith("+00:00")
    assert second["level"] == "ERROR"
    assert "RuntimeError: broker down" in second["exception"]


def test_configuring_twice_keeps_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "text")
    configure_logging("INFO", "text")
    logging.getLogger("svledger.test").warning("once")
    assert capsys.readouterr().err.count("once") == 1


def test_a_librarys_repeated_message_is_shown_once_a_window_with_the_count_held_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("INFO", "text")
    client = logging.getLogger("aiokafka.client")
    for node in range(300):  # a broker away: an error at every retry
        client.error("Unable connect to node with id %s: %s", node % 3, "refused")
    logging.getLogger("svledger.test").warning("own %s", 1)
    logging.getLogger("svledger.test").warning("own %s", 2)
    lines = capsys.readouterr().err.splitlines()
    assert len([line for line in lines if "Unable connect" in line]) == 1
    assert len([line for line in lines if "own" in line]) == 2  # svledger's own: all
    repeats = LibraryRepeats(window=10.0)
    records = [
        logging.makeLogRecord({"name": "aiokafka", "msg": "down %s", "created": t})
        for t in (0.0, 1.0, 2.0, 12.0, 13.0)
    ]
    assert [repeats.filter(r) for r in records] == [True, False, False, True, False]
    assert records[3].getMessage() == "down %s (2 more like it held back)"


def test_python_dash_m_svledger_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "svledger", "hash", "", "v1", "Pod"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "xPOwRZ+Yhw8=\n")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["replay", "--until", "yesterday", "--db", "sqlite:///x.db"], "'yesterday'"),
        (["replay", "--processes", "0", "--db", "sqlite:///x.db"], "'0' is not a positive"),
        (
            ["explain", "apps.deployments", "--db", "sqlite:///missing/views.db"],
            "svledger db upgrade",
        ),
        (["history", "apps.deployments", "--db", "mysql://h/db"], "mysql"),
        (["simulate", "no-such-scenario.yaml"], "no-such-scenario.yaml"),
        (["lease-gc", "--check-period", "-5"], "'-5'"),
        (["migrator", "--metrics-address", "9100"], "'9100' is not HOST:PORT"),
        (["storagestate", "reset", "apps", "deployments", "--cluster", "c"], "--reason"),
        # Refused before the cluster's log is read (nothing listens on port 1).
        (
            ["storagestate", "reset", "apps", "deployments", "--cluster", "c", "--reason", " "],
            "argument --reason: ' ' is not a reason",
        ),
        (
            ["migrations", "request", "apps", "deployments", "--cluster", ""],
            "argument --cluster: '' is not a cluster name",
        ),
        (
            ["timeline", "apps.deployments", "--cluster", "c", "--html", "/nonexistent/t.html"],
            "cannot write --html /nonexistent/t.html: no folder /nonexistent",
        ),
        # Not a number a wait can be: NaN would sleep for ever, inf never come back.
        (["lease-gc", "--check-period", "nan"], "'nan' is not a number of seconds"),
        (["lease-gc", "--check-period", "1e400"], "'1e400' is not a number of seconds"),
        (["migrator", "--retry-backoff", "inf"], "'inf' is not a number of seconds"),
        (["collect", "--renewal-interval", "1e15"], "'1e15' is not a number of seconds"),
        (
            ["migrator", "--retry-backoff", "100", "--max-retry-backoff", "10"],
            "--max-retry-backoff 10 is shorter than --retry-backoff 100",
        ),
        # Digits Python's isdigit() takes but int() does not.
        (["replay", "--until", "\u00b2", "--db", "sqlite:///x.db"], "'\u00b2'"),
        (["project", "--snapshot-every", "\u00b2"], "'\u00b2' is not a number of offsets"),
        (["project", "--bootstrap", "kafka:port"], "'kafka:port' is not host:port"),
        (["project", "--bootstrap", "h:1,127.0.0.1:99999"], "'127.0.0.1:99999' is not"),
        (["project", "--bootstrap", ""], "'' is not host:port"),
        (["project", "--topic", ""], "'' is not a topic name"),
        (["project", "--db", "sqlite:///"], "names no file"),
        (["replay", "--snapshots-from", "garbage"], "'garbage' is not a URL"),
        (["project", "--bootstrap", "http://kafka:9092"], "a broker address has no scheme"),
        (["project", "--db", "postgresql://u@h:port/x"], "its port is not a number"),
        (["replay", "--until", "2026-01-02", "--db", "sqlite:///x.db"], "2026-01-02T00:00:00Z"),
        (["worker", "--cluster", ""], "argument --cluster: '' is not a cluster name"),
        (["collect", "--cluster", " "], "argument --cluster: ' ' is not a cluster name"),
        (["replay", "--cluster", "", "--db", "sqlite:///x.db"], "'' is not a cluster name"),
        (["history", "apps.deployments", "--cluster", ""], "'' is not a cluster name"),
        (["timeline", "", "--cluster", "c", "--html", "-"], "'' is not a resource"),
        (["collect", "--cluster", "c", "--apiserver", "m1=https://"], "'m1=https://' is not"),
        (["collect", "--cluster", "c", "--apiserver", "m1=10.0.0.1:6443"], "is not HOSTNAME=URL"),
        (
            [
                "collect",
                "--cluster",
                "c",
                "--apiserver",
                "m1=https://a",
                "--apiserver",
                "m1=https://b",
            ],
            "--apiserver m1=... is given more than once",
        ),
        (["collect"], "one of the arguments --cluster --fleet is required"),
        (["collect", "--cluster", "c", "--fleet", "f"], "not allowed with argument"),
        (["collect", "--fleet", "/nonexistent/fleet"], "--fleet /nonexistent/fleet: no such file"),
        (["collect", "--fleet", "f", "--kubeconfig", "k"], "--kubeconfig is for --cluster"),
        (["collect", "--fleet", "f", "--apiserver", "m1=https://a"], "--apiserver is for"),
        (
            ["collect", "--fleet", "f", "--concurrency", "0"],
            "'0' is not a positive number of requests",
        ),
        (["collect", "--cluster", "c", "--group", "g"], "--group g is for --fleet"),
        (["timeline", "apps.deployments", "--cluster", "c", "--html", "/tmp"], "it is a folder"),
        (
            ["worker", "--cluster", "c", "--executor", "storagemigration", "--chunk-size", "10"],
            "--chunk-size is for --executor rewrite",
        ),
        (
            [
                "worker",
                "--cluster",
                "c",
                "--executor",
                "storagemigration",
                "--prune-stored-versions",
            ],
            "--prune-stored-versions is for --executor rewrite",
        ),
        (
            ["migrations", "request", "apps", "deployments", "--cluster", "c", "--version", "V1"],
            "argument --version: invalid version 'V1'",
        ),
    ],
)
def test_bad_arguments_name_the_value_and_exit_2(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variable", "value", "argv"),
    [
        ("SVLEDGER_DATABASE_URL", "nope", ["project"]),
        ("SVLEDGER_METRICS_ADDRESS", "9100", ["migrator"]),
        ("SVLEDGER_SNAPSHOTS_FROM", "garbage", ["lease-gc"]),
        (
            "USER",
            " ",
            ["storagestate", "reset", "apps", "deployments", "--cluster", "c", "--reason", "r"],
        ),
    ],
)
def test_a_bad_default_from_the_environment_names_its_variable(
    variable: str,
    value: str,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"{value!r}" in error
    assert f"(the value of ${variable}, which applies when the option is not given)" in error


def test_a_default_from_the_environment_is_parsed_into_a_plain_string(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SVLEDGER_DATABASE_URL", "sqlite:///from-the-environment.db")
    args = build_parser().parse_args(["project"])
    # A plain str: it is pickled to the writer process, which need not know the mark.
    assert type(args.db) is str
    assert args.db == "sqlite:///from-the-environment.db"


def test_an_unknown_option_is_told_by_its_subcommand_with_its_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["hash", "apps", "v1", "Deployment", "--bogus"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: svledger hash [-h] [--log-level")
    assert error.endswith("svledger hash: error: unrecognized arguments: --bogus\n")


@pytest.mark.parametrize(
    ("argv", "level", "log_format"),
    [
        (["hash", "apps", "v1", "Deployment"], "INFO", "json"),
        (["--log-level", "debug", "hash", "apps", "v1", "Deployment"], "DEBUG", "json"),
        (["hash", "apps", "v1", "Deployment", "--log-format", "text"], "INFO", "text"),
        (
            ["--log-level", "debug", "hash", "--log-format", "text", "apps", "v1", "Pod"],
            "DEBUG",
            "text",
        ),
        (
            ["--log-level", "debug", "hash", "--log-level", "error", "", "v1", "Pod"],
            "ERROR",
            "json",
        ),
    ],
)
def test_the_logging_options_stand_before_or_after_the_command(
    argv: list[str], level: str, log_format: str
) -> None:
    args = build_parser().parse_args(argv)
    assert (args.log_level, args.log_format) == (level, log_format)


def test_a_database_url_that_does_not_parse_is_shown_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["db", "upgrade", "--db", "admin:s3cret-pw@db.example.com/svledger"]) == 2
    error = capsys.readouterr().err
    assert "'admin:***@db.example.com/svledger' is not a URL" in error
    assert "s3cret-pw" not in error


@pytest.mark.parametrize(
    ("given", "logged"),
    [
        (
            "postgresql://admin:s3cret-pw@db:5432/svledger",
            "postgresql://admin:***@db:5432/svledger",
        ),
        ("admin:s3cret-pw@db.example.com/svledger", "admin:***@db.example.com/svledger"),
        ("sqlite:///svledger.db", "sqlite:///svledger.db"),
        ("127.0.0.1:9092", "127.0.0.1:9092"),  # a broker's address, in the same log lines
        ("postgresql:///svledger?password=s3cret-pw", "postgresql:///svledger?password=***"),
        ("postgresql://admin:s3cret@pw@db/svledger", "postgresql://admin:***@db/svledger"),
        (
            "postgresql://admin:s3cret@pw@db/svledger?sslpassword=s3cret&password=pw",
            "postgresql://admin:***@db/svledger?sslpassword=***&password=***",
        ),
    ],
    ids=["url", "not-a-url", "sqlite", "address", "in-the-query", "unquoted-at-sign", "both"],
)
def test_logs_show_an_address_without_its_password(given: str, logged: str) -> None:
    assert shown(given) == logged


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # As for the Kafka settings (SVLEDGER_KAFKA_BOOTSTRAP= means the default broker).
    monkeypatch.setenv("SVLEDGER_SNAPSHOTS_FROM", "")
    monkeypatch.setenv("SVLEDGER_DATABASE_URL", "")
    assert build_parser().parse_args(["lease-gc"]).snapshots_from is None
    assert build_parser().parse_args(["project"]).db == "sqlite:///svledger.db"


UNREACHABLE_DB = "postgresql://svledger@127.0.0.1:1/svledger"  # nothing listens on port 1


@pytest.mark.parametrize(
    "argv",
    [
        ["db", "upgrade", "--db", UNREACHABLE_DB],
        ["explain", "apps.deployments", "--db", UNREACHABLE_DB],
        ["history", "apps.deployments", "--db", UNREACHABLE_DB],
    ],
    ids=["db-upgrade", "explain", "history"],
)
def test_an_unreachable_database_exits_69_naming_it_whatever_the_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 69
    error = capsys.readouterr().err
    assert "127.0.0.1" in error
    assert "usage:" not in error


def test_a_database_file_that_does_not_exist_is_a_usage_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.db"
    assert main(["explain", "apps.deployments", "--db", f"sqlite:///{missing}"]) == 2
    assert "svledger db upgrade" in capsys.readouterr().err


def test_a_bad_bootstrap_variable_is_named_before_anything_is_reached(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SVLEDGER_KAFKA_BOOTSTRAP", "garbage:")
    assert main(["topics", "create"]) == 2
    assert "SVLEDGER_KAFKA_BOOTSTRAP='garbage:'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["topics", "grow"], "topics grow needs --partitions N"),
        (["topics", "grow", "--partitions", "0"], "'0' is not a positive partition count"),
        (
            ["topics", "grow", "--partitions", "8", "--inbox", "east"],
            "--inbox is for topics create",
        ),
        (
            ["topics", "create", "--partitions", "8"],
            "topics create takes SVLEDGER_KAFKA_PARTITIONS",
        ),
    ],
)
def test_topics_grow_and_create_refuse_the_others_arguments_before_anything_is_reached(
    arguments: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*arguments, "--bootstrap", "127.0.0.1:1"]) == 2
    assert said in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: pathlib.Path) -> None:
    """``svledger history ... | head``: the rest of the output is not wanted."""
    url = f"sqlite:///{tmp_path / 'views.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    start = datetime(2024, 1, 1, tzinfo=UTC)
    events: list[Event] = [
        ApiserverHeartbeat(Meta.new("east", "a", start), "a", "a_1", "a", 3600, start)
    ]
    for n in range(3000):  # far more lines than a pipe buffers
        version = ("v1", "v2")[n % 2]
        events.append(
            StorageVersionReported(
                Meta.new("east", "a", start), "a", "", "pods", "Pod", version, ("v1", "v2"), ("v1",)
            )
        )
    records = [(event, Position(0, offset)) for offset, event in enumerate(events)]
    folded = fold_batch(Projection("views", "t", State(), {}), consumed_log(records))
    with engine(url).begin() as connection:
        store.write(connection, folded.batch)
    reading = subprocess.Popen(
        [sys.executable, "-m", "svledger", "history", "pods", "--db", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reading.stdout is not None and reading.stderr is not None
    reading.stdout.readline()
    reading.stdout.close()  # as head does once it has its lines
    error = reading.stderr.read().decode()
    assert reading.wait(60) == 1
    assert error == ""


def test_a_database_a_newer_svledger_wrote_is_refused_not_upgraded(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'views.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    with sqlite3.connect(tmp_path / "views.db") as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999'")
    capsys.readouterr()
    for argv in (["db", "upgrade", "--db", url], ["history", "apps.deployments", "--db", url]):
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert "at revision 9999, which this svledger does not know" in error
        assert "a newer svledger wrote it" in error


def test_unusable_tls_files_are_named_before_serving(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_pem = tmp_path / "server.pem"
    not_pem.write_text("not a certificate\n")
    for cert, key in ((not_pem, not_pem), (tmp_path / "missing.crt", tmp_path / "missing.key")):
        argv = ["serve", "--tls-cert-file", str(cert), "--tls-private-key-file", str(key)]
        # Nothing listens on port 1: the files are checked before Kafka is asked.
        assert main([*argv, "--bootstrap", "127.0.0.1:1", "--address", "127.0.0.1:0"]) == 2
        error = capsys.readouterr().err
        assert f"cannot serve TLS with --tls-cert-file {cert}" in error
        assert "give a PEM certificate" in error


def test_a_file_that_is_no_sqlite_database_is_a_usage_error_naming_it(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    assert main(["history", "apps.deployments", "--db", f"sqlite:///{text}"]) == 2
    assert f"cannot open sqlite:///{text}: file is not a database" in capsys.readouterr().err
    folder = tmp_path / "no-such-folder" / "views.db"
    assert main(["db", "upgrade", "--db", f"sqlite:///{folder}"]) == 2
    assert f"there is no folder {folder.parent}; create it" in capsys.readouterr().err


# Three services, each started as a user would (``{tmp}``: the test's folder).
def _stopped_as_it_started(service: subprocess.Popen[str], timeout: float) -> str:
    """SIGTERM ``service``, which must then exit 0 saying it stopped as it started; its
    standard error."""
    try:
        service.send_signal(signal.SIGTERM)
        _, errors = service.communicate(timeout=timeout)
    finally:
        service.kill()
    assert service.returncode == 0, errors
    assert "SIGTERM as it started: stopped" in errors
    return errors


# The command line a test runs as a user would, with logs a test can read.
SVLEDGER: Final = [sys.executable, "-m", "svledger", "--log-format", "text"]

SERVICES = pytest.mark.parametrize(
    "argv",
    [["project", "--db", "sqlite:///{tmp}/views.db"], ["migrator"], ["serve"]],
    ids=["project", "migrator", "serve"],
)


@SERVICES
def test_sigterm_while_kafka_does_not_answer_stops_at_once_and_cleanly(
    argv: list[str], tmp_path: pathlib.Path
) -> None:
    """Not after the 30 s connect timeout: Kubernetes' grace period is 30 s too."""
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    assert main(["db", "upgrade", "--db", f"sqlite:///{tmp_path}/views.db"]) == 0
    command = [*SVLEDGER, *argv]
    # Nothing listens on port 1: the service keeps asking for the broker.
    service = subprocess.Popen(
        [*command, "--bootstrap", "127.0.0.1:1"], stderr=subprocess.PIPE, text=True
    )
    assert service.stderr is not None
    seen = []
    try:
        # Its first failed attempt: the service runs, and its signal handlers are set (a
        # fixed sleep would send SIGTERM before them on a slow machine: killed, not stopped).
        for line in service.stderr:
            seen.append(line)
            if 'Unable connect to "127.0.0.1:1"' in line:
                break
        assert service.poll() is None, "".join(seen)
        service.send_signal(signal.SIGTERM)
        _, rest = service.communicate(timeout=10)
    finally:
        service.kill()
    errors = "".join(seen) + rest
    assert service.returncode == 0, errors
    assert "stopped while waiting for Kafka to answer" in errors


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its SigCgt mask says so)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@SERVICES
def test_sigterm_as_a_service_starts_stops_it_cleanly_before_it_begins(
    argv: list[str], tmp_path: pathlib.Path
) -> None:
    """Told to stop while still loading its modules, a service exits 0 without starting,
    as it would a second later: not killed by the signal (143)."""
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    command = [*SVLEDGER, *argv]
    service = subprocess.Popen(
        [*command, "--bootstrap", "127.0.0.1:1"], stderr=subprocess.PIPE, text=True
    )
    try:
        # The first moment SIGTERM is caught: the arguments are parsed, the service's
        # modules not loaded yet.
        while not _catches(service.pid, signal.SIGTERM) and service.poll() is None:
            time.sleep(0.001)
    except BaseException:
        service.kill()
        raise
    errors = _stopped_as_it_started(service, timeout=30)
    assert "Traceback" not in errors
    assert "127.0.0.1:1" not in errors  # it never asked Kafka


def test_sigterm_while_a_service_waits_for_its_database_to_answer_stops_it_at_once(
    tmp_path: pathlib.Path,
) -> None:
    """Preparing the database (``db upgrade``) comes before the service: a server that
    takes the connection and never answers must not make it deaf to SIGTERM."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        service = subprocess.Popen(
            [*SVLEDGER, "project", "--db", f"postgresql://user:secret@127.0.0.1:{port}/views"],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            silent.settimeout(30)
            connection, _ = silent.accept()  # it asks the database, which says nothing
        except BaseException:
            service.kill()
            raise
        with connection:
            _stopped_as_it_started(service, timeout=10)
