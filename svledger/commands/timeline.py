"""The timeline page: a resource's history in one cluster, drawn as an HTML file."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ledger.errors import UsageError
from svledger.options import (
    Subparsers,
    add_cluster_option,
    add_command,
    add_kafka_options,
    add_resource_argument,
    kafka_settings,
)


def add_timeline(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "timeline",
        _timeline,
        help="draw a resource's history as an HTML page",
        description=(
            "Draw RESOURCE's history in --cluster on one time axis (UTC), as a self-contained\n"
            "HTML page: when the apiservers agree and when their versions differ, the version\n"
            "each apiserver encodes and its lease (joins, restarts, releases, expiries), and\n"
            "every migration by phase. Hovering over an element shows the event that caused\n"
            "it, its log position and its time. Reads the cluster's partition of the log\n"
            "(not the SQL views). `svledger serve` serves the same page at\n"
            "/clusters/CLUSTER/timeline/RESOURCE."
        ),
    )
    add_resource_argument(parser)
    add_cluster_option(parser, "the cluster whose history to draw", required=True)
    parser.add_argument(
        "--html", required=True, metavar="FILE", help="where to write the page; - for stdout"
    )
    add_kafka_options(parser, "reader")


def _timeline(args: argparse.Namespace) -> int:
    from readapi.ledger import timeline_page

    page_file = Path(args.html)
    if args.html != "-":  # said before the log is read, not after
        if not page_file.parent.is_dir():
            raise UsageError(f"cannot write --html {args.html}: no folder {page_file.parent}")
        if page_file.is_dir():
            raise UsageError(f"cannot write --html {args.html}: it is a folder; give a file's path")
    page = asyncio.run(timeline_page(kafka_settings(args), args.cluster, args.resource))
    if args.html == "-":
        sys.stdout.write(page)
    else:
        try:
            Path(args.html).write_text(page, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write --html {args.html}: {error.strerror}") from error
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
