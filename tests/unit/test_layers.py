"""The import rules of the code base, checked on the source with ``ast``.

An import hidden in a function counts too. The rules:

* Layers point one way: ``svledger -> readapi -> simulation -> kube -> consumers ->
  projections -> ledger`` (the command line on top; the read API serves the views; the
  simulation drives the consumers as they run against a cluster; the code that speaks to
  real Kubernetes serves the consumers).
* The pure core imports no I/O library: the fold and its state, the codec, hashing,
  identity, names, validation and the event types are functions of their arguments.
* Each third-party client is fenced in its own module: aiokafka only in
  ``ledger/kafka.py`` (and ``ledger/settings.py``, which builds its TLS context),
  psycopg only in ``projections/postgres.py``, the Kubernetes client only in ``kube/``,
  prometheus_client only in ``ledger/metrics.py`` (which defines every metric).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("ledger", "projections", "consumers", "kube", "simulation", "readapi", "svledger")
PURE = (
    "ledger/codec.py",
    "ledger/events.py",
    "ledger/hashing.py",
    "ledger/identity.py",
    "ledger/names.py",
    "ledger/validation.py",
    "projections/fold.py",
    "projections/state.py",
)
IO_LIBRARIES = frozenset(
    {"asyncio", "socket", "aiokafka", "sqlalchemy", "psycopg", "alembic", "kubernetes_asyncio"}
)
FENCES = {
    "aiokafka": {"ledger/kafka.py", "ledger/settings.py"},
    "psycopg": {"projections/postgres.py"},
    "kubernetes_asyncio": {"kube/"},
    "prometheus_client": {"ledger/metrics.py"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def sources() -> list[Path]:
    return sorted(path for layer in LAYERS for path in (ROOT / layer).rglob("*.py"))


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_layers_below_it(layer: str) -> None:
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    offenders = {
        name(path): sorted(imported_packages(path) & above)
        for path in sorted((ROOT / layer).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("module", PURE)
def test_the_pure_core_does_no_io(module: str) -> None:
    assert imported_packages(ROOT / module) & IO_LIBRARIES == set()


@pytest.mark.parametrize("library", sorted(FENCES))
def test_a_client_library_is_imported_only_behind_its_fence(library: str) -> None:
    allowed = FENCES[library]
    importers = {name(path) for path in sources() if library in imported_packages(path)}
    assert {m for m in importers if not any(m.startswith(a) for a in allowed)} == set()
