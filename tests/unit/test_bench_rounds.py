"""The projector benchmark's rounds: each ratio to ``fetch_only`` is taken within a round."""

from __future__ import annotations

from typing import Any

from bench.projector_bench import _summary


def _round(fetch: int, project: int, until: str) -> dict[str, Any]:
    return {
        "fetch_only": {"events_per_second": fetch},
        "project_postgresql": {"events_per_second": project, "seconds": 1_000_000 / project},
        "replay_until": {"same_views": True, "from": until},
    }


def test_one_round_is_reported_as_measured() -> None:
    summary = _summary([_round(400_000, 100_000, "snapshots")])
    assert summary["project_postgresql"] == {"events_per_second": 100_000, "seconds": 10.0}
    assert summary["ratio_to_fetch_only"] == {"project_postgresql": 0.25}
    assert "rounds" not in summary


def test_several_rounds_report_the_median_round_and_the_median_of_same_round_ratios() -> None:
    # The machine's speed wanders from round to round: the ratio of the medians
    # (100k/300k, 0.333) would pair rates measured at different speeds.
    rounds = [
        _round(400_000, 100_000, "first"),
        _round(200_000, 90_000, "second"),
        _round(300_000, 140_000, "third"),
    ]
    summary = _summary(rounds)
    assert summary["fetch_only"] == {"events_per_second": 300_000}
    assert summary["project_postgresql"]["events_per_second"] == 100_000
    assert summary["ratio_to_fetch_only"] == {"project_postgresql": 0.45}
    assert summary["replay_until"] == {"same_views": True, "from": "third"}  # the last round's
    assert summary["rounds"] == {
        "count": 3,
        "events_per_second": {
            "fetch_only": [400_000, 200_000, 300_000],
            "project_postgresql": [100_000, 90_000, 140_000],
        },
        "ratio_to_fetch_only": {"project_postgresql": [0.25, 0.45, 0.467]},
    }
