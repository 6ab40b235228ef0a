"""The simulated HA control plane."""

from __future__ import annotations

import argparse
import asyncio

from ledger.errors import Unavailable, UsageError
from svledger.options import (
    Subparsers,
    add_command,
    add_db_option,
    add_kafka_options,
    kafka_settings,
)


def add_simulate(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "simulate",
        _simulate,
        help="simulate an HA control plane's rolling upgrade on the real log",
        description=(
            "Run SCENARIO.yaml (see docs/scenarios.md): simulated apiservers embedding the\n"
            "real reporter and write gate, clients writing through a load balancer, and the\n"
            "real projector, lease GC, migrator and worker, on Kafka and SQL, in virtual time.\n"
            "Prints a timeline and a pollution check; with the agreement trigger, exits 1 if\n"
            "objects were left in a version outside the persisted hashes or a migration ran\n"
            "while apiservers disagreed (the discovery-hash trigger is expected to do both,\n"
            "and exits 0). Use a topic of its own: its lease GC runs on virtual time."
        ),
    )
    parser.add_argument("scenario", metavar="SCENARIO.yaml", help="the scenario file")
    add_kafka_options(parser, None)
    add_db_option(parser)
    parser.add_argument(
        "--trigger",
        choices=["agreement", "discovery-hash"],
        default="agreement",
        help=(
            "agreement: the ledger's migrator (default); discovery-hash: the old way, "
            "polling one apiserver's discovery every discovery_poll_seconds of the scenario"
            " (default 600), for comparison"
        ),
    )


def _simulate(args: argparse.Namespace) -> int:
    from simulation.run import simulate

    settings = kafka_settings(args)
    try:
        result = asyncio.run(simulate(args.scenario, settings, args.db, trigger=args.trigger))
    except Unavailable:
        raise  # Kafka or the database: exits 69, as every command does
    except OSError as error:  # the scenario file
        raise UsageError(str(error)) from error
    if args.trigger == "agreement":
        return int(bool(result.polluted_objects or result.migrations_while_disagreeing))
    return 0
