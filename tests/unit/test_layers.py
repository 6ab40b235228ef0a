"""The import rules of the code base, checked on the source with ``ast``.

An import hidden in a function counts too. The rules:

* Layers point one way: ``svledger -> readapi -> simulation -> kube -> consumers ->
  projections -> ledger`` (the command line on top; the read API serves the views; the
  simulation drives the consumers as they run against a cluster; the code that speaks to
  real Kubernetes serves the consumers).
* The pure core imports no I/O library: the fold and its state, the codec, hashing,
  identity, names, validation, the event types and the Kafka record format are
  functions of their arguments.
* Each third-party client is fenced in its own module: aiokafka only in
  ``ledger/kafka/`` (and ``ledger/settings.py``, which builds its TLS context),
  psycopg only in ``projections/postgres.py``, the Kubernetes client only in ``kube/``,
  prometheus_client only in ``ledger/metrics.py`` (which defines every metric).
* No module imports itself through others: the project's modules import one another
  without cycles, so each can be read (and loaded) after what it builds on.
* Within ``ledger/kafka/`` the modules import one way, each only those before it in
  ``KAFKA``: the record format, the errors, connecting, topics, then what produces and
  reads; the package's ``__init__`` re-exports them all, and none imports it.
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
    "ledger/kafka/records.py",
    "ledger/names.py",
    "ledger/validation.py",
    "kube/audit.py",
    "kube/protobuf.py",
    "kube/store_layout.py",
    "kube/stored.py",
    "projections/agreement.py",
    "projections/audits.py",
    "projections/crds.py",
    "projections/fold.py",
    "projections/state.py",
)
IO_LIBRARIES = frozenset(
    {"asyncio", "socket", "aiokafka", "sqlalchemy", "psycopg", "alembic", "kubernetes_asyncio"}
)
FENCES = {
    "aiokafka": {"ledger/kafka/", "ledger/settings.py"},
    "psycopg": {"projections/postgres.py"},
    "kubernetes_asyncio": {"kube/"},
    "prometheus_client": {"ledger/metrics.py"},
}
KAFKA = (  # ledger/kafka/'s modules, each importing only those before it
    "records",
    "errors",
    "connection",
    "topics",
    "placement",
    "producers",
    "transactions",
    "dead_letters",
    "assignor",
    "readers",
    "members",
)


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


def module_name(path: Path) -> str:
    """The dotted name a source is imported by: ``ledger/kafka/__init__.py`` is ``ledger.kafka``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sources()}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules (of ``known``) a source imports, by absolute or relative name.

    ``from package import x`` imports the module ``package.x`` if there is one, else a
    name of ``package``; ``import a.b.c`` imports the longest of ``a.b.c``, ``a.b``, ``a``
    that is a module of the project. The packages a module's import loads on the way
    (``a`` and ``a.b`` for ``a.b.c``) are not counted: loading them first is Python's
    order, not the module's choice.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_name(path)
    package = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                prefixes = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
                found.update([prefix for prefix in prefixes if prefix in known][:1])
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = ".".join(part for part in (module, alias.name) if part)
                if submodule in known:
                    found.add(submodule)
                elif module in known:
                    found.add(module)
    return found - {here}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


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


def test_no_modules_import_each_other_in_a_cycle() -> None:
    known = modules()
    graph = {module: imported_modules(path, set(known)) for module, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_check_resolves_relative_and_absolute_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {
        "pkg/__init__.py": "from . import a\n",
        "pkg/a.py": "from .b import thing\n\ndef later():\n    import pkg.c.d.nothing\n",
        "pkg/b.py": "thing = 1\n",
        "pkg/c/__init__.py": "",
        "pkg/c/d.py": "from ..b import thing\nfrom . import e\n",
        "pkg/c/e.py": "import os\nfrom pkg import a\n",
    }
    for file, text in files.items():
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    paths = {module_name(tmp_path / file): tmp_path / file for file in files}
    graph = {module: imported_modules(path, set(paths)) for module, path in paths.items()}
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.c.d"},
        "pkg.b": set(),
        "pkg.c": set(),
        "pkg.c.d": {"pkg.b", "pkg.c.e"},
        "pkg.c.e": {"pkg.a"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.c.d", "pkg.c.e"]]


def test_the_kafka_package_lists_each_module_in_its_order() -> None:
    found = {path.stem for path in (ROOT / "ledger/kafka").glob("*.py")} - {"__init__"}
    assert sorted(KAFKA) == sorted(found)


@pytest.mark.parametrize("module", KAFKA)
def test_a_kafka_module_imports_only_those_before_it(module: str) -> None:
    known = set(modules())
    imported = imported_modules(ROOT / "ledger/kafka" / f"{module}.py", known)
    inside = {m for m in imported if m == "ledger.kafka" or m.startswith("ledger.kafka.")}
    before = {f"ledger.kafka.{m}" for m in KAFKA[: KAFKA.index(module)]}
    assert inside - before == set()
