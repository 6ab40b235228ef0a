"""Hostile input where it enters by hand: scenario files and command-line arguments.

A scenario either loads or is refused with a :class:`ScenarioError` naming where and
what; command-line arguments either parse or end in exit code 2 with one ``error:``
line naming the argument, never a traceback. (The codec's fuzzing is in
``test_codec.py``, the read API's in ``tests/integration/test_serve_fuzz.py``.)
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulation import scenario
from simulation.scenario import ScenarioError
from svledger import cli

WALKTHROUGH = Path(__file__).resolve().parents[2] / "examples" / "kep-walkthrough.yaml"

# --------------------------------------------------------------------------- scenarios

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["v1", "v2", "1.29", "apps", "deployments.apps", "apiserver-1", "-1"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def _mutations(document: object) -> st.SearchStrategy[object]:
    """The walkthrough with one value somewhere replaced by anything."""

    def paths(node: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        found = [prefix]
        if isinstance(node, dict):
            for key, child in node.items():
                found += paths(child, (*prefix, key))
        elif isinstance(node, list):
            for index, child in enumerate(node):
                found += paths(child, (*prefix, index))
        return found

    def replace(node: object, path: tuple[object, ...], value: object) -> object:
        if not path:
            return value
        head, rest = path[0], path[1:]
        if isinstance(node, dict):
            return {k: replace(v, rest, value) if k == head else v for k, v in node.items()}
        assert isinstance(node, list)
        return [replace(v, rest, value) if i == head else v for i, v in enumerate(node)]

    return st.builds(replace, st.just(document), st.sampled_from(paths(document)), values)


WALKTHROUGH_DOCUMENT = yaml.safe_load(WALKTHROUGH.read_text())


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_mutations(WALKTHROUGH_DOCUMENT), values))
def test_a_scenario_loads_or_is_refused_with_a_clear_error(document: object) -> None:
    text = yaml.safe_dump(document)
    try:
        scenario.parse(text, "fuzz.yaml")
    except ScenarioError as error:
        assert str(error).startswith("fuzz.yaml"), error


@pytest.mark.parametrize("at", [float("nan"), float("inf"), 3e306])
def test_a_time_that_is_no_number_of_minutes_is_refused_naming_it(at: float) -> None:
    # YAML's .nan and .inf, and a number of minutes whose seconds overflow.
    document = copy.deepcopy(WALKTHROUGH_DOCUMENT)
    document["timeline"][1]["at"] = at
    with pytest.raises(ScenarioError, match=r"^fuzz\.yaml.*expected minutes >= 0"):
        scenario.parse(yaml.safe_dump(document), "fuzz.yaml")


@given(st.text(max_size=200))
def test_any_text_is_a_scenario_or_a_clear_error(text: str) -> None:
    with contextlib.suppress(ScenarioError):
        scenario.parse(text, "fuzz.yaml")


# --------------------------------------------------------------------------- arguments

COMMANDS = sorted(cli.build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
OPTIONS = sorted(
    {
        option
        for parser in cli.build_parser()._subparsers._group_actions[0].choices.values()  # type: ignore[union-attr]
        for action in parser._actions
        for option in action.option_strings
        if option not in ("-h", "--help")
    }
)
words = st.one_of(
    st.sampled_from(OPTIONS),
    st.text(max_size=12),
    st.sampled_from(["-1", "0", "1e9", "nan", "sqlite:///x.db", "a:b", "127.0.0.1:0", ""]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COMMANDS), st.lists(words, max_size=6))
def test_arguments_parse_or_exit_2_naming_the_problem(command: str, argv: list[str]) -> None:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.build_parser().parse_args([command, *argv])
        except SystemExit as stop:
            assert stop.code in (0, 2), stop.code
            if stop.code == 2:
                assert "error:" in stderr.getvalue()
    assert "Traceback" not in stderr.getvalue()


@pytest.mark.parametrize("command", ["hash", "apiserver-id"])
@given(argv=st.lists(st.text(max_size=16), max_size=4))
def test_pure_commands_answer_or_exit_2_for_any_argument(command: str, argv: list[str]) -> None:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main([command, "--", *argv])
    assert code in (0, 2)
    assert "Traceback" not in stderr.getvalue()
    if code == 2:
        assert "error:" in stderr.getvalue()
