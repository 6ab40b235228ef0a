"""Every code block of README.md and docs/*.md runs, and what a page shows is what it prints.

A page is a script: its blocks run in order, each by the rule for its language. A block
of any other language fails the test, so a new kind of block needs a rule here first.

* ``console``: a shell session. A line ``$ COMMAND`` is a command (a line ending in ``\\``
  continues it, and a here-document it opens, ``<<EOF`` or ``<<'EOF'``, is part of it up
  to its terminator line); the lines after it, up to the next ``$``, are what it prints
  on stdout (its logs go to stderr and are not shown). All console and python blocks of
  a page run in one bash process, in page order, so variables and background jobs
  (``COMMAND &``) carry over; every command must exit 0, and background jobs still
  running at the end are stopped with SIGTERM and must then exit 0 too.
* ``python``: a program, run with this interpreter as a step of the same script.
* ``sql``: a query, run against the walkthrough's views: on SQLite after a line
  ``SQLite:``, on PostgreSQL after ``PostgreSQL:``, else on both. A ``text`` block right
  after SQL blocks is their output in docs/sql.md's own sample history, which is not the
  walkthrough: its header must name the query's columns, its rows are not compared.
* ``sh``: commands shown but not run, because they need what this test does not have (a
  production cluster, a PostgreSQL host). Each line is checked instead: ``svledger``
  lines must parse with svledger's own argument parser, ``make`` lines must name a target
  of the Makefile. The README's two, ``make demo`` and ``make test``, are never run from
  here (they would run this test): ``make test`` is what CI runs (``.ci/run``), and
  ``make demo`` is ``deploy/demo.sh``, the walkthrough with both triggers, which
  ``tests/integration/test_simulation.py`` runs.
* ``yaml``, ``json``: parsed; a YAML scenario (it has a ``timeline``) must also pass the
  scenario checks of ``simulation.scenario``.
* ``text``: pictures and sample output; not run.

Comparing output: trailing blanks are dropped and runs of blanks (spaces, tabs) count
as one, so aligned columns may differ in width. ``...`` stands for text that varies from run to run
(times, log offsets after the walkthrough's first concurrent step, IDs derived from
them, durations): within a line it matches any text, and a line holding only ``...``
matches any number of lines. Pages use it only where a real run varies.

What each page runs in: a working directory of its own (with ``examples/`` linked to the
repository's), ``svledger`` on ``PATH`` running this checkout, ``HOME`` inside the
working directory (kubectl's cache; no kubeconfig), the session's broker as
``SVLEDGER_KAFKA_BOOTSTRAP`` and a topic of its own as ``SVLEDGER_TOPIC``, shown in
output as the default ``svledger.events``. The addresses ``127.0.0.1:8080`` and
``127.0.0.1:8443`` in commands and python blocks are replaced by free ports (and shown as
written).

A page that needs a Kubernetes cluster says so in its first line, exactly
``<!-- docs-test: kubernetes -->`` (an HTML comment, so not rendered). It then gets one
of its own, started before its first block and stopped after its background jobs: one
stock kube-apiserver of ``deploy.kube.cluster``'s default release (hostname
``kube-apiserver-0``, so its apiserver ID is always the same) and its etcd
(``LocalCluster(1)``, 3 to 5 s to start), its kubeconfig written as ``kubeconfig`` in
the working directory and named by ``KUBECONFIG``, where kubectl and ``svledger
collect`` and ``worker`` find it. Its address (a free port) is never shown, and its test
is marked ``kubernetes``. Every other page gets none, and shows what needs one in ``sh``
blocks.

The walkthrough: ``svledger simulate examples/kep-walkthrough.yaml --db
sqlite:///walkthrough.db`` runs once for this module (about 25 s). A page with that
command (maybe piped or redirected further) gets that run's output, its database and its
topic, so the pages that read the walkthrough share one simulated log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
import yaml
from sqlalchemy.engine import make_url

from deploy.kafka.broker import free_port
from deploy.kube.cluster import LocalCluster
from ledger.settings import KafkaSettings
from projections.replay import replay
from simulation import scenario
from svledger.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))]
WALKTHROUGH_COMMAND = (
    "svledger simulate examples/kep-walkthrough.yaml --db sqlite:///walkthrough.db"
)
SHOWN_TOPIC = "svledger.events"
SHOWN_ADDRESSES = ("127.0.0.1:8080", "127.0.0.1:8443")
KUBERNETES = "<!-- docs-test: kubernetes -->"  # a page's first line: it runs on a cluster
PAGE_TIMEOUT = 300
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
HEREDOC = re.compile(r"(?<!<)<<(?!<)\s*(['\"]?)(\w+)\1")


# --------------------------------------------------------------------------- reading pages


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, from 1
    language: str
    text: str
    label: str  # the last non-blank line before the fence, e.g. "SQLite:"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclasses.dataclass(frozen=True)
class Command:
    block: Block
    line: int
    text: str
    expected: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.block.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    source = (ROOT / page).read_text()
    found = []
    for match in FENCE.finditer(source):
        before = source[: match.start()].rstrip("\n").splitlines()
        label = next((line.strip() for line in reversed(before) if line.strip()), "")
        line = source.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match[1], match[2], label))
    return found


def needs_kubernetes(page: str) -> bool:
    return (ROOT / page).read_text().startswith(KUBERNETES + "\n")


def commands(block: Block) -> list[Command]:
    """The ``$`` commands of a console block, each with the output shown after it."""
    found: list[Command] = []
    text: list[str] = []
    expected: list[str] = []
    start = 0
    continued = False
    terminator: str | None = None  # of the here-document the command is in
    for number, line in enumerate(block.text.splitlines(), start=block.line + 1):
        if terminator is not None:
            text.append(line)
            terminator = None if line == terminator else terminator
            continue
        if continued:
            text.append(line)
        elif line.startswith("$ "):
            if text:
                found.append(Command(block, start, "\n".join(text), tuple(expected)))
            text, expected, start = [line[2:]], [], number
        elif text:
            expected.append(line)
        else:
            raise AssertionError(f"{block.page}:{number}: console output before any `$ ` command")
        is_command = continued or line.startswith("$ ")
        continued = line.endswith("\\")
        if is_command and (heredoc := HEREDOC.search(line)):
            terminator = heredoc[2]
    if terminator is not None:
        raise AssertionError(f"{block.where}: a here-document without its line {terminator}")
    if text:
        found.append(Command(block, start, "\n".join(text), tuple(expected)))
    return found


def normalized(lines: list[str] | tuple[str, ...]) -> list[str]:
    out = [re.sub(r"[ \t]+", " ", line.rstrip()) for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    """``actual`` is ``expected`` with each ``...`` standing for text that varies."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?"
        if line.strip() == "..."
        else r"[^\n]*?".join(re.escape(part) for part in line.split("...")) + r"\n"
        for line in expected
    )
    return re.fullmatch(pattern, "".join(line + "\n" for line in actual)) is not None


# --------------------------------------------------------------------------- running pages


@dataclasses.dataclass
class Workspace:
    """A working directory and the environment a page's commands run in."""

    directory: Path
    env: dict[str, str]
    topic: str

    @classmethod
    def create(cls, directory: Path, bootstrap: str, topic: str) -> Workspace:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "examples").symlink_to(ROOT / "examples")
        bin_dir = directory / ".bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "svledger"
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m svledger "$@"\n')
        wrapper.chmod(0o755)
        (directory / ".home").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SVLEDGER_", "KUBE"))}
        env.update(
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            PYTHONPATH=str(ROOT),
            HOME=str(directory / ".home"),
            SVLEDGER_KAFKA_BOOTSTRAP=bootstrap,
            SVLEDGER_TOPIC=topic,
        )
        return cls(directory, env, topic)

    def shown(self, text: str, addresses: dict[str, str]) -> list[str]:
        """What a command printed, as the page shows it: default topic, documented ports."""
        text = text.replace(self.topic, SHOWN_TOPIC)
        for documented, actual in addresses.items():
            text = text.replace(actual, documented)
        return normalized(text.splitlines())


@dataclasses.dataclass(frozen=True)
class Walkthrough:
    """The module's run of the walkthrough: its workspace holds the database and output."""

    workspace: Workspace

    @property
    def database(self) -> Path:
        return self.workspace.directory / "walkthrough.db"

    @property
    def output(self) -> Path:
        return self.workspace.directory / "walkthrough.out"


@pytest.fixture(scope="module")
def walkthrough(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Walkthrough:
    """The walkthrough simulated once, by the very command the pages show."""
    topic = f"svledger-test.docs.walkthrough.{uuid.uuid4().hex[:8]}"
    workspace = Workspace.create(tmp_path_factory.mktemp("walkthrough"), kafka_bootstrap, topic)
    done = subprocess.run(
        ["bash", "-c", WALKTHROUGH_COMMAND],
        cwd=workspace.directory,
        env=workspace.env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = Walkthrough(workspace)
    run.output.write_text(done.stdout)
    return run


def uses_walkthrough(page: str) -> bool:
    return any(
        is_walkthrough(command.text)
        for block in blocks(page)
        if block.language == "console"
        for command in commands(block)
    )


@dataclasses.dataclass(frozen=True)
class Step:
    block: Block
    command: Command | None  # None for a python block
    script: str  # the shell text that runs it

    @property
    def where(self) -> str:
        return self.command.where if self.command else self.block.where

    @property
    def shown(self) -> str:
        return self.command.text if self.command else "(the python block)"


def script_steps(
    page: str, walkthrough: Walkthrough | None, addresses: dict[str, str], out: Path
) -> list[Step]:
    steps = []
    for block in blocks(page):
        if block.language == "python":
            program = out / f"block-{block.line}.py"
            program.write_text(with_addresses(block.text, addresses))
            steps.append(Step(block, None, f"{shlex.quote(sys.executable)} {program}"))
        elif block.language == "console":
            for command in commands(block):
                text = command.text
                if is_walkthrough(text):
                    # The module's run stands in for the command; a pipe or redirection
                    # after it applies to the run's output.
                    assert walkthrough is not None
                    text = (
                        f"cp {walkthrough.database} walkthrough.db; cat {walkthrough.output}"
                        + text[len(WALKTHROUGH_COMMAND) :]
                    )
                steps.append(Step(block, command, with_addresses(text, addresses)))
    return steps


def is_walkthrough(command: str) -> bool:
    rest = command.removeprefix(WALKTHROUGH_COMMAND)
    return rest != command and (not rest or rest[0] == " ")


def with_addresses(text: str, addresses: dict[str, str]) -> str:
    for documented, actual in addresses.items():
        text = text.replace(documented, actual)
    return text


def run_page(page: str, workspace: Workspace, walkthrough: Walkthrough | None) -> None:
    addresses = {documented: f"127.0.0.1:{free_port()}" for documented in SHOWN_ADDRESSES}
    out = workspace.directory / ".steps"
    out.mkdir()
    steps = script_steps(page, walkthrough, addresses, out)
    lines = [
        "set -u",
        # Stop what the page left running; each must exit 0 on SIGTERM.
        'stop_jobs() { for job in $(jobs -p); do kill -TERM "$job" 2>/dev/null;'
        f' wait "$job"; echo "$job $?" >>{out}/jobs; done; }}',
        "trap stop_jobs EXIT",
    ]
    for number, step in enumerate(steps):
        lines += [
            f"# {step.where}",
            "{ " + step.script,
            f"}} >{out}/{number}.out 2>{out}/{number}.err",
            f"echo $? >{out}/{number}.rc",
            *([f"echo $! >{out}/{number}.pid"] if step.script.rstrip().endswith("&") else []),
            f'[ "$(cat {out}/{number}.rc)" = 0 ] || exit 1',
        ]
    (out / "page.sh").write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(
        ["bash", str(out / "page.sh")],
        cwd=workspace.directory,
        env=workspace.env,
        start_new_session=True,
    )
    try:
        process.wait(timeout=PAGE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    check_steps(steps, out, workspace, addresses)


def check_steps(
    steps: list[Step], out: Path, workspace: Workspace, addresses: dict[str, str]
) -> None:
    def stderr(number: int) -> str:
        path = out / f"{number}.err"
        return path.read_text()[-3000:] if path.exists() else ""

    background: dict[str, int] = {}
    mismatches: list[str] = []
    for number, step in enumerate(steps):
        rc = out / f"{number}.rc"
        if not rc.exists():
            pytest.fail(f"{step.where}: not done in {PAGE_TIMEOUT} s: {step.shown}", False)
        if (code := int(rc.read_text())) != 0:
            pytest.fail(f"{step.where}: exit code {code}: {step.shown}\n{stderr(number)}", False)
        if step.command is None:
            continue
        expected = normalized(step.command.expected)
        pid_file = out / f"{number}.pid"
        if pid_file.exists():
            # A background job shows no output; how it stopped is checked below.
            assert expected == [], f"{step.where}: a background job shows no output"
            background[pid_file.read_text().strip()] = number
            continue
        actual = workspace.shown((out / f"{number}.out").read_text(), addresses)
        if not matches(expected, actual):
            diff = "\n".join(difflib.unified_diff(expected, actual, "page", "run", lineterm=""))
            mismatches.append(f"{step.where}: `{step.shown}` printed otherwise:\n{diff}")
    if mismatches:
        pytest.fail("\n\n".join(mismatches), pytrace=False)
    jobs = out / "jobs"
    for line in jobs.read_text().splitlines() if jobs.exists() else []:
        job, status = line.split()
        started = background.get(job)
        if started is not None and status != "0":
            step = steps[started]
            pytest.fail(
                f"{step.where}: exit code {status} on SIGTERM: {step.shown}\n{stderr(started)}",
                False,
            )


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, marks=pytest.mark.kubernetes) if needs_kubernetes(page) else page
        for page in PAGES
    ],
)
def test_page_runs_as_shown(
    page: str, kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    walkthrough: Walkthrough | None = None
    if uses_walkthrough(page):
        walkthrough = request.getfixturevalue("walkthrough")
        topic = walkthrough.workspace.topic
    else:
        topic = f"svledger-test.docs.{uuid.uuid4().hex[:8]}"
    workspace = Workspace.create(tmp_path / "page", kafka_bootstrap, topic)
    for block in blocks(page):
        check_block(block)
    with contextlib.ExitStack() as stack:
        if needs_kubernetes(page):
            cluster = stack.enter_context(LocalCluster(1))
            kubeconfig = cluster.write_kubeconfig(workspace.directory / "kubeconfig")
            workspace.env["KUBECONFIG"] = str(kubeconfig)
        run_page(page, workspace, walkthrough)


# --------------------------------------------------------------------------- blocks not run


RUN = frozenset({"console", "python"})  # run_page runs these
CHECKED_ELSEWHERE = frozenset({"sql"})  # test_sql_runs_on_the_walkthroughs_views
PICTURES = frozenset({"text"})


def check_block(block: Block) -> None:
    """The checks of a block that is not run as a step of its page."""
    if block.language in RUN | CHECKED_ELSEWHERE | PICTURES:
        return
    if block.language == "sh":
        check_sh(block)
    elif block.language == "yaml":
        document = yaml.safe_load(block.text)
        if isinstance(document, dict) and "timeline" in document:
            scenario.parse(block.text, block.where)
    elif block.language == "json":
        json.loads(block.text)
    else:
        raise AssertionError(
            f"{block.where}: a ```{block.language or '(no language)'} block; give it one of"
            f" {sorted(RUN | CHECKED_ELSEWHERE | PICTURES | {'sh', 'yaml', 'json'})}"
            " (see this test's docstring)"
        )


class ParseError(Exception):
    pass


def _refuse(message: str) -> NoReturn:
    raise ParseError(message)


def check_sh(block: Block) -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    parser = build_parser()
    for each in (parser, *_subparsers(parser).values()):
        each.error = _refuse  # type: ignore[method-assign]
    for line in block.text.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        if argv[0] == "make":
            assert len(argv) == 2 and argv[1] in targets, f"{block.where}: no such target: {line}"
        elif argv[0] == "svledger":
            try:
                parser.parse_args(argv[1:])
            except ParseError as error:
                raise AssertionError(f"{block.where}: `{line}`: {error}") from None
        else:
            raise AssertionError(
                f"{block.where}: ```sh blocks hold svledger and make commands, checked but not"
                f" run; show `{line}` in a ```console block, where it runs"
            )


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


# --------------------------------------------------------------------------- SQL


def sql_blocks() -> list[tuple[Block, Block | None]]:
    """Every SQL block with the text block that shows its output, if one follows."""
    found: list[tuple[Block, Block | None]] = []
    for page in PAGES:
        pending: list[Block] = []
        for block in blocks(page):
            if block.language == "sql":
                pending.append(block)
                continue
            output = block if block.language == "text" else None
            found += [(query, output) for query in pending]
            pending = []
        found += [(query, None) for query in pending]
    return found


@pytest.fixture
def views(walkthrough: Walkthrough, postgres_url: str) -> Iterator[dict[str, Any]]:
    """DB-API connections to the walkthrough's views on SQLite and on PostgreSQL."""
    settings = KafkaSettings(
        bootstrap_servers=walkthrough.workspace.env["SVLEDGER_KAFKA_BOOTSTRAP"],
        topic=walkthrough.workspace.topic,
    )
    asyncio.run(replay(settings, postgres_url, progress=False))
    libpq = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with (
        contextlib.closing(sqlite3.connect(walkthrough.database)) as lite,
        psycopg.connect(libpq) as postgres,
    ):
        yield {"SQLite": lite, "PostgreSQL": postgres}


def test_sql_runs_on_the_walkthroughs_views(views: dict[str, Any]) -> None:
    checked = 0
    for query, output in sql_blocks():
        dialects = [query.label[:-1]] if query.label in ("SQLite:", "PostgreSQL:") else list(views)
        for dialect in dialects:
            connection = views[dialect]
            try:
                cursor = connection.execute(query.text)
                cursor.fetchall()
            except Exception as error:
                raise AssertionError(f"{query.where} on {dialect}: {error}") from error
            finally:
                if dialect == "PostgreSQL":
                    connection.rollback()
            columns = [column[0] for column in cursor.description]
            if output is not None:
                header = [cell.strip() for cell in output.text.splitlines()[0].split("|")]
                assert header == columns, f"{output.where}: shows {header}, query has {columns}"
            checked += 1
    assert checked


# --------------------------------------------------------------------------- the pages together


def test_the_readme_starts_with_the_two_commands_and_links_every_page() -> None:
    first = blocks("README.md")[0]
    assert (first.language, first.text) == ("sh", "make demo\nmake test\n")
    readme = (ROOT / "README.md").read_text()
    unlinked = [page for page in PAGES[1:] if f"]({page})" not in readme]
    assert unlinked == [], "README.md links every docs page"


def test_every_command_and_option_is_in_the_production_guide() -> None:
    guide = (ROOT / "docs" / "production.md").read_text()
    parser = build_parser()
    missing = [
        f"{name} {option}"
        for name, subparser in _subparsers(parser).items()
        for action in subparser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help" and option not in guide
    ]
    missing += [
        f"svledger {name}" for name in _subparsers(parser) if f"svledger {name}" not in guide
    ]
    assert missing == []


def test_no_page_hides_a_command_in_an_indented_block() -> None:
    # An indented code block would escape the rules above: every code block is fenced.
    for page in PAGES:
        last, blank = "", False
        for line in FENCE.sub("", (ROOT / page).read_text()).splitlines():
            if not line.strip():
                blank = True
                continue
            in_list = re.match(r"(\s*[*-] |\s*\d+\. |  )", last) is not None
            assert not (blank and line.startswith("    ") and not in_list), (
                f"{page}: an indented code block ({line.strip()!r}); fence it with a language"
            )
            last, blank = line, False


def test_links_between_pages_resolve() -> None:
    broken = []
    for page in PAGES:
        source = FENCE.sub("", (ROOT / page).read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", source):
            if re.match(r"[a-z]+:", target):
                continue  # another site
            path, _, anchor = target.partition("#")
            linked = (ROOT / page).parent / path if path else ROOT / page
            if not linked.exists():
                broken.append(f"{page}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page}: {target} (no such heading)")
    assert broken == []


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
