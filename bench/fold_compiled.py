"""The fold compiled by mypyc against the fold as it is, measured in one run.

``python bench/fold_compiled.py [--events N] [--rounds R]``: builds ``projections/fold.py``
and ``projections/thinning.py`` with mypyc (a minute or two) in a scratch copy of the
packages they import, then folds the same generated log (``bench/codec_bench.py``'s mix:
80% heartbeats, reports, migrations, lease ends) with :func:`projections.fold.fold` in a
fresh interpreter per round, alternating the code as it is and the compiled build. It
prints one JSON object: each build's microseconds per event in every round and their
medians, the speed-up (pure over compiled), whether both folds ended in the same state
(a digest of it), and the verdict: the compiled build is worth shipping only at a
speed-up of at least 1.5.

What is compiled is what an earlier trial found to work: compiling the event and state
classes too fails at run time, as mypyc checks the declared types (a list where a tuple
is declared) that the fold's callers do not keep to.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ("projections/fold.py", "projections/thinning.py")
PACKAGES = ("ledger", "projections", "bench")

# Run in each round's fresh interpreter, with the tree to import from first on sys.path.
ROUND = """
import hashlib, json, random, sys, time, uuid
sys.path.insert(0, sys.argv[1])
# The log's random UUIDs (holder identities) from a seed: every round folds the same log.
_seeded = random.Random(11)
uuid.uuid4 = lambda: uuid.UUID(int=_seeded.getrandbits(128), version=4)
import projections.fold as fold
from bench.codec_bench import generate
from ledger.events import Position
events = generate(int(sys.argv[2]), 7)
records = [(event, Position(i % 6, i)) for i, event in enumerate(events)]
started = time.perf_counter()
state = fold.fold(records)
seconds = time.perf_counter() - started
print(json.dumps({
    "compiled": fold.__file__.endswith(".so"),
    "us_per_event": seconds / len(records) * 1e6,
    "digest": hashlib.sha256(repr(state).encode()).hexdigest(),
}))
"""


def build(scratch: Path) -> float:
    """Copy the packages into ``scratch`` and compile :data:`COMPILED` there; seconds taken."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, scratch / package, ignore=shutil.ignore_patterns("*.so"))
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "mypyc", *COMPILED],
        cwd=scratch,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.monotonic() - started


class Round(TypedDict):
    compiled: bool
    us_per_event: float
    digest: str


def one_round(tree: Path, events: int) -> Round:
    done = subprocess.run(
        [sys.executable, "-c", ROUND, str(tree), str(events)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: Round = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000, help="events folded each round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each build, alternating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="svledger-mypyc-") as scratch:
        compile_seconds = build(Path(scratch))
        rounds: dict[str, list[Round]] = {"pure": [], "compiled": []}
        for _ in range(args.rounds):
            rounds["pure"].append(one_round(ROOT, args.events))
            rounds["compiled"].append(one_round(Path(scratch), args.events))
    assert not any(r["compiled"] for r in rounds["pure"]), "the pure rounds imported a build"
    assert all(r["compiled"] for r in rounds["compiled"]), "the compiled rounds imported source"
    medians = {
        kind: statistics.median(r["us_per_event"] for r in results)
        for kind, results in rounds.items()
    }
    speedup = medians["pure"] / medians["compiled"]
    digests = {r["digest"] for results in rounds.values() for r in results}
    print(
        json.dumps(
            {
                "bench": "fold_compiled",
                "events": args.events,
                "compiled_modules": list(COMPILED),
                "compile_seconds": round(compile_seconds, 1),
                "us_per_event": {
                    kind: [round(r["us_per_event"], 3) for r in results]
                    for kind, results in rounds.items()
                },
                "median_us_per_event": {k: round(v, 3) for k, v in medians.items()},
                "speedup": round(speedup, 3),
                "same_state": len(digests) == 1,
                "keep_compiled": speedup >= 1.5 and len(digests) == 1,
            }
        )
    )


if __name__ == "__main__":
    main()
