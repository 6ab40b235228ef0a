"""Grant each svledger role the Kafka ACLs it needs and nothing more, with Kafka's own tool.

Every process of svledger logs in to Kafka as a principal of its own and runs as one
*role*; :func:`grants` says, for a role, which operations on which topics, consumer
groups and transactional IDs it needs. The names follow the code: the events topic
``T`` (``svledger.events`` unless ``--topic``), its dead-letter topic ``T.dlq``, its
placement topic ``T.placement`` (where each cluster's partition is recorded: the roles
that write a cluster's first event record it, those that look a cluster up read it), one
inbox topic ``T.inbox.<cluster>`` per cluster, and the groups and transactional IDs
each command uses (docs/production.md has the table). Kafka lets any principal with
Write on a topic produce idempotently (since 2.8), so no role needs IdempotentWrite
on the cluster. Read and Write imply Describe, which is still listed where the code
describes a topic, for whoever reads the ACLs; Create does not, and ``topics create``
describes the topics it created.

The ACLs are applied by ``kafka-acls`` (``org.apache.kafka.tools.AclCommand``), so
the broker's authorizer sees exactly what Kafka's own tooling would send. The tool is
``--kafka-acls`` if given, else ``kafka-acls.sh`` or ``kafka-acls`` on ``PATH``, else
the jars ``broker.py fetch`` put beside this file, run with ``java``. The topics
default to svledger's own settings, ``SVLEDGER_TOPIC`` and ``SVLEDGER_DLQ_TOPIC``. The admin's
connection settings are a Java client properties file (``--command-config``); the
principal running it must be allowed to alter ACLs (a super user, or Alter on the
cluster). Adding an ACL that exists changes nothing, so a second run is harmless.

The principal is whoever the broker says the client is: ``User:<name>`` for a SASL
user, and for a client certificate what the brokers' ``ssl.principal.mapping.rules``
make of its subject (``User:<CN>`` under the rule docs/production.md gives).

Stdlib only, like ``broker.py``::

    python deploy/kafka/acls.py --bootstrap-server kafka:9093 \\
        --command-config admin.properties --role projector --principal User:projector
    python deploy/kafka/acls.py ... --role reporter --cluster prod-eu-1 \\
        --principal User:reporter-prod-eu-1
    python deploy/kafka/acls.py --role worker --cluster prod-eu-1 --dry-run  # print, run nothing
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import itertools
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

LIB: Final = Path(__file__).resolve().parent / "lib"
DEFAULT_TOPIC: Final = "svledger.events"

# The consumer groups and transactional IDs of the code (consumers/, kube/collector.py,
# projections/projector.py); tests/unit/test_acls.py checks that they agree.
# The projector's group ends in its database's ID (projections.projector.group_id).
PROJECTOR_GROUP: Final = "svledger-projector.{topic}.views."
LEASE_GC: Final = "svledger-lease-gc"
MIGRATOR: Final = "svledger-migrator"
WORKER: Final = "svledger-worker"
COLLECTOR: Final = "svledger-collector"
ADMISSION: Final = "svledger-admission"
DEAD_LETTERS: Final = "svledger-dead-letters"  # ledger.kafka.DeadLetters' transactional IDs
AUDIT: Final = "svledger-audit"  # kube.auditor's transactional IDs

ROLES: Final = {
    "reporter": "an embedded reporter of one cluster (--cluster): writes its inbox topic only",
    "admission": "reads every inbox, appends admitted events to T and rejected ones to T.dlq",
    "projector": "svledger project and replay: reads T, dead-letters to T.dlq",
    "lease-gc": "svledger lease-gc",
    "migrator": "svledger migrator",
    "worker": "svledger worker (--cluster: that cluster's worker only)",
    "collector": "svledger collect (--cluster: that cluster's collector only; --group: that"
    " fleet's collectors only)",
    "operator": "svledger migrations request, storagestate reset, audit",
    "reader": "svledger serve and timeline: read T",
    "setup": "svledger topics create and grow: creates T, T.dlq, T.placement and (--inbox C)"
    " T.inbox.C; adds partitions to T",
}
_PER_CLUSTER: Final = frozenset({"reporter", "worker", "collector"})

LITERAL: Final = "literal"
PREFIXED: Final = "prefixed"


class AclError(RuntimeError):
    """The ACLs could not be applied; the message says which and why."""


@dataclasses.dataclass(frozen=True, order=True)
class Grant:
    """``operations`` on one resource: ``kind`` is kafka-acls' option name for its type."""

    kind: str  # "topic", "group" or "transactional-id"
    name: str
    pattern: str  # LITERAL or PREFIXED
    operations: tuple[str, ...]

    def __str__(self) -> str:
        match = "named" if self.pattern == LITERAL else "prefixed"
        return f"{', '.join(self.operations)} on {self.kind} {match} {self.name!r}"


def grants(
    role: str,
    topic: str = DEFAULT_TOPIC,
    *,
    dlq_topic: str = "",
    cluster: str | None = None,
    group: str | None = None,
) -> list[Grant]:
    """The ACLs ``role`` needs on the events topic ``topic`` (its dead letters: ``dlq_topic``).

    ``cluster`` narrows a per-cluster role (reporter, worker, collector) to one
    cluster; the reporter needs it, the others then cover every cluster by prefix.
    ``group`` narrows the collector to the processes of one fleet (``svledger collect
    --fleet ... --group``); without ``cluster`` or ``group`` it may be any collector,
    one of a cluster or of a fleet in the default group.
    """
    if role not in ROLES:
        raise AclError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
    if role not in _PER_CLUSTER and cluster is not None:
        raise AclError(f"role {role} is not per cluster: drop --cluster {cluster}")
    if group is not None and (role != "collector" or cluster is not None):
        raise AclError(
            f"--group {group} names a fleet's collectors: give it with --role"
            " collector and without --cluster"
        )
    if role == "reporter" and cluster is None:
        raise AclError("role reporter writes one cluster's inbox: give --cluster")
    dlq = dlq_topic or f"{topic}.dlq"
    placement = f"{topic}.placement"
    read = ("Read", "Describe")
    write = ("Write", "Describe")
    read_write = ("Read", "Write", "Describe")

    def follower(group: str, transactional_prefix: str) -> list[Grant]:
        # A consumers.partitions.PartitionFollower: a group member that appends in
        # transactions whose IDs are the prefix and a partition number.
        return [
            Grant("topic", topic, LITERAL, read_write),
            Grant("group", group, LITERAL, ("Read",)),
            Grant("transactional-id", transactional_prefix, PREFIXED, write),
        ]

    def per_cluster(name: str, places: tuple[str, ...]) -> list[Grant]:
        # Its group is "<name>.<cluster>", its transactional IDs "<group>-<topic>-<n>";
        # it looks its cluster's partition up (``places``: Write records it).
        looks_up = Grant("topic", placement, LITERAL, places)
        if group is not None:  # a fleet's collectors: "<group>-<topic>-<n>"
            return [*follower(group, f"{group}-{topic}-"), looks_up]
        if cluster is not None:
            return [*follower(f"{name}.{cluster}", f"{name}.{cluster}-{topic}-"), looks_up]
        every = [
            Grant("topic", topic, LITERAL, read_write),
            Grant("group", f"{name}.", PREFIXED, ("Read",)),
            Grant("transactional-id", f"{name}.", PREFIXED, write),
            looks_up,
        ]
        if name == COLLECTOR:  # and the fleets' collectors of the default group
            every += follower(COLLECTOR, f"{COLLECTOR}-{topic}-")[1:]
        return every

    match role:
        case "reporter":
            return [Grant("topic", f"{topic}.inbox.{cluster}", LITERAL, write)]
        case "admission":
            return [
                Grant("topic", f"{topic}.inbox.", PREFIXED, read),
                Grant("group", ADMISSION, LITERAL, ("Read",)),
                Grant("topic", topic, LITERAL, write),
                Grant("topic", dlq, LITERAL, write),
                Grant("topic", placement, LITERAL, read_write),
                Grant("transactional-id", f"{ADMISSION}-", PREFIXED, write),
            ]
        case "projector":
            # Dead letters are sent once each: the sender reads the dead-letter topic
            # for what it has, then writes in transactions (ledger.kafka.DeadLetters).
            return [
                Grant("topic", topic, LITERAL, read),
                Grant("group", PROJECTOR_GROUP.format(topic=topic), PREFIXED, ("Read",)),
                Grant("topic", dlq, LITERAL, read_write),
                Grant("topic", placement, LITERAL, read),  # replay --cluster
                Grant("transactional-id", f"{DEAD_LETTERS}-{topic}-", PREFIXED, write),
            ]
        case "lease-gc":
            return follower(LEASE_GC, f"{LEASE_GC}-{topic}-")
        case "migrator":
            return follower(MIGRATOR, f"{MIGRATOR}-{topic}-")
        case "worker":
            return per_cluster(WORKER, read)
        case "collector":
            return per_cluster(COLLECTOR, read_write)
        case "operator":
            # svledger audit appends an audit's events in one transaction, its ID
            # "svledger-audit-<topic>-<cluster>" (kube.auditor).
            return [
                Grant("topic", topic, LITERAL, read_write),
                Grant("topic", placement, LITERAL, read_write),
                Grant("transactional-id", f"{AUDIT}-{topic}-", PREFIXED, write),
            ]
        case "reader":
            return [Grant("topic", topic, LITERAL, read), Grant("topic", placement, LITERAL, read)]
        case _:  # setup
            return [
                # DescribeConfigs: ``topics create`` checks an events topic it finds keeps
                # its records for ever
                # topics grow: Read (the records' clusters) and Alter (add partitions)
                Grant(
                    "topic",
                    topic,
                    LITERAL,
                    ("Create", "Describe", "DescribeConfigs", "Read", "Alter"),
                ),
                Grant("topic", dlq, LITERAL, ("Create", "Describe")),
                Grant("topic", placement, LITERAL, ("Create", "Read", "Write", "Describe")),
                Grant("topic", f"{topic}.inbox.", PREFIXED, ("Create", "Describe")),  # --inbox
            ]


def acl_commands(
    tool: Sequence[str],
    bootstrap: str,
    command_config: str | None,
    principal: str,
    role_grants: Sequence[Grant],
    *,
    remove: bool = False,
) -> list[list[str]]:
    """kafka-acls invocations granting (or revoking) ``role_grants`` to ``principal``.

    One per pattern type and set of operations, naming every resource it applies to:
    each invocation starts a JVM, the costly part.
    """
    commands = []

    def key(grant: Grant) -> tuple[str, tuple[str, ...]]:
        return grant.pattern, grant.operations

    for (pattern, operations), same in itertools.groupby(sorted(role_grants, key=key), key=key):
        command = [*tool, "--bootstrap-server", bootstrap]
        if command_config:
            command += ["--command-config", command_config]
        command += ["--remove", "--force"] if remove else ["--add"]
        command += ["--allow-principal", principal, "--resource-pattern-type", pattern]
        for grant in same:
            command += [f"--{grant.kind}", grant.name]
        for operation in operations:
            command += ["--operation", operation]
        commands.append(command)
    return commands


def find_tool(given: str | None) -> list[str]:
    """The kafka-acls command: ``given``, one on PATH, else AclCommand from ``lib/``."""
    if given:
        return [given]
    for name in ("kafka-acls.sh", "kafka-acls"):
        found = shutil.which(name)
        if found:
            return [found]
    java = shutil.which("java")
    if java and any(LIB.glob("kafka-tools-*.jar")):
        return [
            java,
            "-Xshare:auto",
            "-XX:TieredStopAtLevel=1",  # a short-lived tool starts faster without C2
            "-XX:+UseSerialGC",
            "-cp",
            f"{LIB}/*",
            "org.apache.kafka.tools.AclCommand",
        ]
    raise AclError(
        "no kafka-acls tool: put kafka-acls.sh on PATH, give --kafka-acls PATH, or run "
        "`python deploy/kafka/broker.py fetch` (needs java) to use Kafka's jars"
    )


def apply(commands: Sequence[list[str]], *, jobs: int = 2) -> None:
    """Run the kafka-acls ``commands``, ``jobs`` at a time; AclError names the first failure."""

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(run, commands))
    for command, result in zip(commands, results, strict=True):
        if result.returncode != 0 or "Error while executing" in result.stdout + result.stderr:
            raise AclError(
                f"kafka-acls failed (exit code {result.returncode}): {shlex.join(command)}\n"
                f"{result.stdout}{result.stderr}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="roles:\n" + "\n".join(f"  {role:10}  {what}" for role, what in ROLES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--role", required=True, choices=ROLES, metavar="ROLE")
    parser.add_argument(
        "--principal", help="who gets the ACLs, e.g. User:projector (required unless --dry-run)"
    )
    parser.add_argument("--cluster", help="the cluster of a reporter, worker or collector")
    parser.add_argument(
        "--group", help="the consumer group of a fleet's collectors (svledger collect --group)"
    )
    parser.add_argument(
        "--topic",
        default=os.environ.get("SVLEDGER_TOPIC") or DEFAULT_TOPIC,
        help=f"the events topic (default: $SVLEDGER_TOPIC or {DEFAULT_TOPIC})",
    )
    parser.add_argument(
        "--dlq-topic",
        default=os.environ.get("SVLEDGER_DLQ_TOPIC", ""),
        help="the dead-letter topic (default: $SVLEDGER_DLQ_TOPIC or <topic>.dlq)",
    )
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT", help="the Kafka cluster")
    parser.add_argument(
        "--command-config", metavar="FILE", help="Java client properties of the admin's login"
    )
    parser.add_argument("--kafka-acls", metavar="PATH", help="the kafka-acls.sh to run")
    parser.add_argument("--remove", action="store_true", help="revoke the ACLs instead")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--jobs", type=int, default=2, help="kafka-acls runs at once (2)")
    args = parser.parse_args(argv)
    try:
        role_grants = grants(
            args.role, args.topic, dlq_topic=args.dlq_topic, cluster=args.cluster, group=args.group
        )
        principal = args.principal or "User:NAME"
        if not args.dry_run and not (args.principal and args.bootstrap_server):
            raise AclError("give --principal and --bootstrap-server (or --dry-run)")
        tool = ["kafka-acls.sh"] if args.dry_run else find_tool(args.kafka_acls)
        commands = acl_commands(
            tool,
            args.bootstrap_server or "HOST:PORT",
            args.command_config,
            principal,
            role_grants,
            remove=args.remove,
        )
        if args.dry_run:
            print("\n".join(shlex.join(command) for command in commands))
            return 0
        apply(commands, jobs=args.jobs)
    except AclError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    verb = "revoked from" if args.remove else "granted to"
    for grant in role_grants:
        print(f"{verb} {principal}: {grant}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
