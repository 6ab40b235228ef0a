"""What replication costs: the projector and reaction latency benches on RF 1 and RF 3.

Both benches run on one broker (replication factor 1) and on three (replication factor 3,
``min.insync.replicas`` 2) in one run, their figures side by side.

For each cluster in turn, one node then three, this starts a fresh ``LocalKafka`` (the
local brokers of ``deploy/kafka/broker.py``; ``SVLEDGER_KAFKA_BOOTSTRAP`` is not used, as
the comparison needs both sizes), runs :mod:`bench.projector_bench` and then
:mod:`bench.reaction_latency` on it with the same options, and stops it, so the two
clusters never run at once. ``svledger topics create``'s rule gives the topics
``min(3, brokers)`` replicas, and every producer appends with ``acks=all``: on three
brokers an append, and a transaction's commit, is acknowledged once every in-sync replica
holds it. Prints one JSON object::

    {"machine": {"cpus": 2, ...}, "pairs": 1,
     "rf1": {"events_per_second": {"produce": ..., "fetch_only": ..., ...},
             "latency_ms": {"p50_ms": ..., "p99_ms": ...}},
     "rf3": {...},
     "ratio": {"events_per_second": {...}, "latency_ms": {...}},
     "runs": [{"rf1": {"brokers": 1, "projector": {...}, "reaction_latency": {...},
                       "load_average": [...]},
               "rf3": {...}, "ratio": {...}}]}

``rf1`` and ``rf3`` are the figures side by side: the projector bench's rates (its
``produce`` included) and the reaction latency's p50 and p99; ``ratio`` is RF 3 over RF
1, figure by figure (a rate below 1, or a latency above 1, is slower). ``runs`` holds the
two benches' own reports (``topic`` in each names the replication it ran with) and
``load_average`` the machine's 1-minute load before and after each cluster's benches (a
busy machine shows). With ``--pairs 3`` the two clusters run in turn three times (1, 3,
1, 3, 1, 3): each figure is the median of its three, and each ratio the median of the
three taken within a pair, so a machine whose speed wanders from minute to minute
compares like with like.

    python -m bench.replication_bench [--events 200000] [--stages ...] [--probes 100] ...

The options are the two benches' own, with smaller defaults, as both run twice: 200,000
events and the stages ``fetch_only,consume_decode,project_postgresql`` (the projector's
``produce``, its fill of the topic, is always measured: the appends, where replication
costs most), 100 probes after a 15 s warm-up (the projector bench warmed the brokers).

Measured with ``--pairs 3``, twice (12 to 13.5 minutes each), on a 2-core AMD EPYC virtual
machine (23 GiB) that other work kept busy (load average 10 to 37), where the rates
wandered by up to nine times from pair to pair: RF 3 over RF 1 within each of the six
pairs, appends (``produce``) 0.43 to 0.81 (once 6.0, the one broker's run in a slow
minute); the projector into PostgreSQL 0.67 to 2.2 (median 1.07) and fetch only 0.42 to
3.0 (median 1.0), as reading is from the leader alone; the reaction's p50 9.2 to 32 ms
on RF 1 against 120 to 217 ms on RF 3 (4.6 to 13 times, median 7.2), as the migrator's
answer is a transaction whose every step waits for the followers. The three brokers ran
on the same two cores as the benches, so RF 3 paid for its followers' CPU too; a cluster
whose brokers each have a machine pays the followers' round trips instead. See
``docs/production.md``, "What replication costs".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bench import projector_bench, reaction_latency
from deploy.kafka.broker import LocalKafka
from svledger.options import positive

CLUSTERS = {"rf1": 1, "rf3": 3}  # report key: brokers (the topics get min(3, brokers) replicas)
LATENCIES = ("p50_ms", "p99_ms")


def _on_cluster(brokers: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both benches' reports on a fresh cluster of ``brokers`` nodes."""
    before = os.getloadavg()[0]
    with LocalKafka(brokers=brokers) as kafka:
        projector = projector_bench.run(kafka.bootstrap, args)
        reaction = reaction_latency.run(kafka.bootstrap, args)
    return {
        "brokers": brokers,
        "projector": projector,
        "reaction_latency": reaction,
        "load_average": [round(before, 1), round(os.getloadavg()[0], 1)],
    }


def figures(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A cluster's run in brief: each of the projector bench's rates (its ``produce``
    included) and the reaction latency's percentiles (none without probes)."""
    return {
        "events_per_second": {
            stage: result["events_per_second"]
            for stage, result in run["projector"].items()
            if isinstance(result, dict) and "events_per_second" in result
        },
        "latency_ms": {
            name: run["reaction_latency"][name]
            for name in LATENCIES
            if run["reaction_latency"][name] is not None
        },
    }


def ratio(rf1: dict[str, dict[str, float]], rf3: dict[str, dict[str, float]]) -> dict[str, Any]:
    """RF 3 over RF 1, figure by figure (:func:`figures`)."""
    return {
        kind: {name: round(rf3[kind][name] / value, 3) for name, value in rf1[kind].items()}
        for kind in rf1
    }


def medians(each: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Figure by figure, the median of ``each`` (the lower middle of an even count)."""
    return {
        kind: {name: statistics.median_low(e[kind][name] for e in each) for name in names}
        for kind, names in each[0].items()
    }


def _machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line),
        "unknown",
    )
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(memory, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    projector_bench.arguments(parser)
    reaction_latency.arguments(parser)
    # Smaller than the benches' own defaults, as each runs twice; the projector's other
    # stages (replays, several processes) read the log again as these do.
    parser.set_defaults(
        events=200_000,
        stages="fetch_only,consume_decode,project_postgresql",
        probes=100,
        warmup_seconds=15.0,
    )
    parser.add_argument(
        "--pairs",
        type=positive(int, "number of pairs"),
        default=1,
        help=(
            "run the two clusters in turn this many times (1, 3, 1, 3, ...) and report each"
            " figure's median, each ratio as the median of the pairs' (default: 1; 3 or"
            " more on a machine whose speed wanders)"
        ),
    )
    args = parser.parse_args()
    runs = []
    for _ in range(args.pairs):
        pair = {name: _on_cluster(brokers, args) for name, brokers in CLUSTERS.items()}
        pair["ratio"] = ratio(figures(pair["rf1"]), figures(pair["rf3"]))
        runs.append(pair)
    report = {
        "machine": _machine(),
        "pairs": args.pairs,
        **{name: medians([figures(pair[name]) for pair in runs]) for name in CLUSTERS},
        "ratio": medians([pair["ratio"] for pair in runs]),
        "runs": runs,
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
