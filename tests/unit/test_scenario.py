"""Scenario files: what a valid one means, and how an invalid one is refused."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simulation import scenario
from simulation.scenario import Crash, Restart, ScenarioError, Start, Stop, Write

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

HEAD = """\
cluster: test
resources:
  - {group: apps, resource: deployments, kind: Deployment, objects: 5}
binaries:
  old:
    deployments.apps: {encoding: v1, decodable: [v1, v2]}
  new:
    deployments.apps: {encoding: v2, decodable: [v1, v2]}
apiservers:
  - {hostname: a, binary: old}
  - {hostname: b, binary: old}
"""


def parse(timeline: str, head: str = HEAD) -> scenario.Scenario:
    return scenario.parse(head + "timeline:\n" + textwrap.indent(timeline, "  "), "s.yaml")


def refused(timeline: str, head: str = HEAD) -> str:
    with pytest.raises(ScenarioError) as error:
        parse(timeline, head)
    return str(error.value)


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_a_valid_scenario(path: Path) -> None:
    loaded = scenario.load(path)
    assert loaded.timeline
    assert all(entry.at_seconds <= loaded.end_seconds for entry in loaded.timeline)


def test_the_walkthrough_upgrades_rolls_back_and_upgrades_again() -> None:
    walkthrough = scenario.load(EXAMPLES / "kep-walkthrough.yaml")
    lifecycle = [
        (entry.at_seconds // 60, entry.action)
        for entry in walkthrough.timeline
        if not isinstance(entry.action, Write)
    ]
    assert lifecycle == [
        (0, Start("apiserver-1", "1.29")),
        (0, Start("apiserver-2", "1.29")),
        (0, Start("apiserver-3", "1.29")),
        (3, Restart("apiserver-1", "1.30", "upgrade")),
        (12, Restart("apiserver-2", "1.30", "upgrade")),
        (18, Restart("apiserver-3", "1.30", "upgrade")),
        (22, Restart("apiserver-3", "1.29", "rollback")),
        (34, Restart("apiserver-3", "1.30", "upgrade")),
    ]
    assert walkthrough.end_seconds == 50 * 60


def test_timing_defaults_are_upstreams_and_can_be_overridden() -> None:
    defaults = parse("- {at: 0, start: a}\n- {at: 1, end: true}\n")
    assert (
        defaults.lease_duration_seconds,
        defaults.heartbeat_interval_seconds,
        defaults.lease_gc_check_period_seconds,
        defaults.discovery_poll_seconds,
        defaults.requests_per_second,
    ) == (3600, 10, 3600, 600, None)
    tuned = parse(
        "- {at: 0, start: a}\n- {at: 1, end: true}\n",
        HEAD + "lease_duration_seconds: 60\nlease_gc_check_period_seconds: 30\n"
        "requests_per_second: 2\n",
    )
    assert (tuned.lease_duration_seconds, tuned.lease_gc_check_period_seconds) == (60, 30)
    assert tuned.requests_per_second == 2.0


def test_lifecycle_resolves_binaries() -> None:
    parsed = parse(
        """\
- {at: 0, start: [a, b]}
- {at: 1, upgrade: a, to: new}
- {at: 2, crash: a}
- {at: 3, start: a}
- {at: 4, rollback: a}
- {at: 5, stop: b}
- {at: 6, upgrade: b, to: new}
- {at: 7, end: true}
"""
    )
    assert [entry.action for entry in parsed.timeline] == [
        Start("a", "old"),
        Start("b", "old"),
        Restart("a", "new", "upgrade"),
        Crash("a"),
        Start("a", "new"),  # a restarted server runs the binary it crashed on
        Restart("a", "old", "rollback"),
        Stop("b"),
        Restart("b", "new", "upgrade"),  # upgrading a stopped server starts it
    ]


def test_repeated_writes_expand_and_the_timeline_is_ordered_by_time() -> None:
    parsed = parse(
        """\
- {at: 0, start: a}
- {at: 1, write: deployments.apps, count: 3, every: 0.5, until: 2}
- {at: 1.5, stop: a}
- {at: 2, end: true}
"""
    )
    assert [(e.at_seconds, e.action) for e in parsed.timeline] == [
        (0, Start("a", "old")),
        (60, Write("deployments.apps", 3)),
        (90, Write("deployments.apps", 3)),
        (90, Stop("a")),
        (120, Write("deployments.apps", 3)),
    ]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 9)), min_size=1, max_size=12))
def test_entries_keep_file_order_among_equal_times(writes: list[tuple[int, int]]) -> None:
    timeline = "".join(
        f"- {{at: {at}, write: deployments.apps, count: {count}}}\n" for at, count in writes
    )
    parsed = parse(timeline + "- {at: 6, end: true}\n")
    expected = sorted(writes, key=lambda write: write[0])
    assert [(e.at_seconds // 60, e.action) for e in parsed.timeline] == [
        (at, Write("deployments.apps", count)) for at, count in expected
    ]


@pytest.mark.parametrize(
    ("timeline", "needle", "expected"),
    [
        (
            "- {at: 0, start: a}\n- {at: 1, upgrade: c, to: new}\n- {at: 2, end: true}\n",
            "upgrade: c",
            "timeline[1].upgrade: 'c' is not an apiserver of this scenario; declared: a, b",
        ),
        (
            "- {at: 0, start: a}\n- {at: 1, stop: b}\n- {at: 2, end: true}\n",
            "stop: b",
            "timeline[1].stop: 'b' is not running at minute 1",
        ),
        (
            "- {at: 0, start: a}\n- {at: 1, rollback: a}\n- {at: 2, end: true}\n",
            "rollback: a",
            "timeline[1].rollback: 'a' has run no other binary than 'old'",
        ),
        (
            "- {at: 0, start: a}\n- {at: 1, start: [b, a]}\n- {at: 2, end: true}\n",
            "start: [b, a]",
            "timeline[1].start: 'a' is already running at minute 1",
        ),
        (
            "- {at: 0, start: a}\n- {at: 1, upgrade: a, to: newer}\n- {at: 2, end: true}\n",
            "newer",
            "timeline[1].to: unknown binary 'newer'; declared: old, new",
        ),
        (
            "- {at: 0, start: a}\n- {at: 3, stop: a}\n- {at: 2, end: true}\n",
            "at: 3",
            "timeline[1].at: minute 3 is after the end (minute 2)",
        ),
        (
            "- {at: 0, start: a}\n",
            "timeline:",
            "timeline: the timeline needs an entry 'end: true'",
        ),
        (
            "- {at: 0, strat: a}\n- {at: 2, end: true}\n",
            "strat",
            "timeline[0]: an entry has exactly one action of start, upgrade,",
        ),
        (
            "- {at: 0, start: a, to: new}\n- {at: 2, end: true}\n",
            "to: new",
            "timeline[0].to: unknown key 'to'; allowed: at, start, note",
        ),
        (
            "- {at: 0.001, start: a}\n- {at: 2, end: true}\n",
            "0.001",
            "timeline[0].at: 0.001 minutes is not a whole number of seconds",
        ),
        (
            "- {at: 0, write: pods}\n- {at: 2, end: true}\n",
            "pods",
            "timeline[0].write: unknown resource 'pods'; declared: deployments.apps",
        ),
        (
            "- {at: 0, write: deployments.apps, count: 0}\n- {at: 2, end: true}\n",
            "count: 0",
            "timeline[0].count: expected a whole number >= 1, got 0",
        ),
    ],
)
def test_timeline_errors_name_line_key_and_value(timeline: str, needle: str, expected: str) -> None:
    message = refused(timeline)
    text = HEAD + "timeline:\n" + textwrap.indent(timeline, "  ")
    assert message.startswith(f"s.yaml:{line_of(text, needle)}: ")
    assert expected in message


@pytest.mark.parametrize(
    ("head", "needle", "expected"),
    [
        (
            HEAD.replace("{encoding: v2, decodable: [v1, v2]}", "{encoding: v3, decodable: [v1]}"),
            "v3",
            "binaries.new.deployments.apps.decodable: the encoding version 'v3' must be"
            " decodable; got ['v1']",
        ),
        (
            HEAD.replace("    deployments.apps: {encoding: v2, decodable: [v1, v2]}\n", "").replace(
                "  new:\n", "  new: {}\n"
            ),
            "new: {}",
            "binaries.new: expected a non-empty mapping, got {}",
        ),
        (
            HEAD.replace("binary: old}\n  - {hostname: b", "binary: older}\n  - {hostname: b"),
            "older",
            "apiservers[0].binary: unknown binary 'older'; declared: old, new",
        ),
        (
            HEAD + "lease_duration_seconds: 20\n",
            "lease_duration_seconds",
            "lease_duration_seconds: 20 is too short",
        ),
        (
            HEAD + "heartbeat_seconds: 5\n",
            "heartbeat_seconds",
            "unknown key 'heartbeat_seconds'",
        ),
        (
            HEAD.replace("objects: 5", "objects: -1"),
            "objects: -1",
            "resources[0].objects: expected a whole number >= 1, got -1",
        ),
        (
            HEAD + "requests_per_second: .nan\n",
            "requests_per_second",
            "requests_per_second: expected a finite number > 0, got nan",
        ),
        (
            HEAD + "requests_per_second: .inf\n",
            "requests_per_second",
            "requests_per_second: expected a finite number > 0, got inf",
        ),
    ],
)
def test_declaration_errors_name_line_key_and_value(head: str, needle: str, expected: str) -> None:
    message = refused("- {at: 0, start: a}\n- {at: 1, end: true}\n", head)
    assert message.startswith(f"s.yaml:{line_of(head, needle)}: ")
    assert expected in message


def test_a_binary_must_say_how_it_stores_every_resource() -> None:
    head = HEAD.replace(
        "  - {group: apps, resource: deployments, kind: Deployment, objects: 5}\n",
        "  - {group: apps, resource: deployments, kind: Deployment, objects: 5}\n"
        "  - {group: '', resource: pods, kind: Pod}\n",
    ).replace(
        "    deployments.apps: {encoding: v1, decodable: [v1, v2]}\n",
        "    deployments.apps: {encoding: v1, decodable: [v1, v2]}\n    pods: {encoding: v1}\n",
    )
    message = refused("- {at: 0, start: a}\n- {at: 1, end: true}\n", head)
    assert "binaries.new: binary 'new' does not say how it stores 'pods'" in message


def test_not_yaml_and_not_a_mapping_are_refused() -> None:
    with pytest.raises(ScenarioError, match=r"s\.yaml: not valid YAML"):
        scenario.parse("cluster: [", "s.yaml")
    with pytest.raises(ScenarioError, match=r"s\.yaml: a scenario is a YAML mapping, got"):
        scenario.parse(yaml.safe_dump([1, 2]), "s.yaml")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError, match=f"cannot read scenario '{missing}'"):
        scenario.load(missing)


def test_a_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    binary = tmp_path / "scenario.yaml"
    binary.write_bytes(b"cluster: c\n\xff\xfe")
    with pytest.raises(ScenarioError, match=f"scenario '{binary}' is not UTF-8 text .byte 11"):
        scenario.load(binary)


def test_the_documented_example_is_the_example_file() -> None:
    # docs/scenarios.md shows examples/kep-walkthrough.yaml as "the" walkthrough.
    docs = (EXAMPLES.parent / "docs" / "scenarios.md").read_text()
    block = docs.split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = scenario.parse(block, "docs/scenarios.md")
    assert documented == scenario.load(EXAMPLES / "kep-walkthrough.yaml")
