"""The ACL script's roles: the names they grant are the ones the code uses, and nothing else.

Whether the grants are enough is shown on a broker that enforces them
(tests/integration/test_kafka_security.py); here, that they name the consumer groups and
transactional IDs the code builds, and how they become kafka-acls invocations.
"""

from __future__ import annotations

import pytest

from consumers import admission, lease_gc, migrator, worker
from deploy.kafka import acls
from deploy.kafka.acls import LITERAL, PREFIXED, Grant, grants
from kube import auditor, collector
from ledger import kafka
from projections.projector import DEFAULT_PROJECTION, group_id

TOPIC = "svledger.events"


def test_the_group_names_are_the_code_s() -> None:
    assert acls.LEASE_GC == lease_gc.GROUP_ID
    assert acls.MIGRATOR == migrator.GROUP_ID
    assert acls.WORKER == worker.GROUP_ID
    assert acls.COLLECTOR == collector.GROUP_ID
    assert acls.ADMISSION == admission.GROUP_ID
    assert acls.DEAD_LETTERS == kafka.DEAD_LETTER_SENDERS
    assert acls.AUDIT == auditor.SOURCE
    named = group_id("t", DEFAULT_PROJECTION, "0123456789ab")  # by its database's ID
    assert named.startswith(acls.PROJECTOR_GROUP.format(topic="t"))


def _covers(grant: Grant, name: str) -> bool:
    if grant.pattern == LITERAL:
        return grant.name == name
    return name.startswith(grant.name)


@pytest.mark.parametrize(
    ("role", "narrowed", "group", "transactional_id"),
    [
        ("lease-gc", {}, "svledger-lease-gc", f"svledger-lease-gc-{TOPIC}-3"),
        ("migrator", {}, "svledger-migrator", f"svledger-migrator-{TOPIC}-0"),
        ("worker", {"cluster": "east"}, "svledger-worker.east", f"svledger-worker.east-{TOPIC}-5"),
        ("worker", {}, "svledger-worker.east", f"svledger-worker.east-{TOPIC}-5"),
        (
            "collector",
            {"cluster": "east"},
            "svledger-collector.east",
            f"svledger-collector.east-{TOPIC}-1",
        ),
        ("collector", {}, "svledger-collector.west", f"svledger-collector.west-{TOPIC}-1"),
        # svledger collect --fleet, in the default group and in one of its own
        ("collector", {}, "svledger-collector", f"svledger-collector-{TOPIC}-2"),
        ("collector", {"group": "eu-fleet"}, "eu-fleet", f"eu-fleet-{TOPIC}-2"),
    ],
)
def test_a_follower_may_read_its_group_and_write_its_transactions(
    role: str, narrowed: dict[str, str], group: str, transactional_id: str
) -> None:
    granted = grants(role, TOPIC, **narrowed)
    topic_grants = [g for g in granted if g.kind == "topic" and g.name == TOPIC]
    assert topic_grants == [Grant("topic", TOPIC, LITERAL, ("Read", "Write", "Describe"))]
    assert [g.operations for g in granted if g.kind == "group" and _covers(g, group)] == [("Read",)]
    txn = [g for g in granted if g.kind == "transactional-id"]
    assert [g.operations for g in txn if _covers(g, transactional_id)] == [("Write", "Describe")]


@pytest.mark.parametrize(
    ("role", "operations"),
    [
        # They write a cluster's first event: they record its partition.
        ("admission", {"Read", "Write"}),
        ("collector", {"Read", "Write"}),
        ("operator", {"Read", "Write"}),
        ("setup", {"Create", "Read", "Write"}),
        # They look a cluster's partition up.
        ("worker", {"Read"}),
        ("projector", {"Read"}),
        ("reader", {"Read"}),
        # They write only to the partition they read, or to an inbox.
        ("lease-gc", set()),
        ("migrator", set()),
        ("reporter", set()),
    ],
)
def test_who_records_a_clusters_partition_and_who_reads_it(role: str, operations: set[str]) -> None:
    cluster = "east" if role == "reporter" else None
    placement = f"{TOPIC}.placement"
    granted = [g for g in grants(role, TOPIC, cluster=cluster) if _covers(g, placement)]
    assert {op for g in granted for op in g.operations} - {"Describe"} == operations


def test_a_cluster_narrows_a_worker_to_its_own_group_and_transactions() -> None:
    granted = grants("worker", TOPIC, cluster="east")
    assert not any(_covers(g, "svledger-worker.west") for g in granted if g.kind == "group")
    assert not any(
        _covers(g, f"svledger-worker.west-{TOPIC}-0")
        for g in granted
        if g.kind == "transactional-id"
    )


def test_a_fleet_group_narrows_the_collector_to_that_fleet() -> None:
    granted = grants("collector", TOPIC, group="eu-fleet")
    assert not any(_covers(g, "svledger-collector") for g in granted if g.kind == "group")
    assert not any(_covers(g, "svledger-collector.east") for g in granted if g.kind == "group")
    with pytest.raises(acls.AclError, match="--group eu-fleet names a fleet's collectors"):
        grants("collector", TOPIC, cluster="east", group="eu-fleet")
    with pytest.raises(acls.AclError, match="--role collector"):
        grants("worker", TOPIC, group="eu-fleet")


def test_a_reporter_may_write_its_own_inbox_only() -> None:
    assert grants("reporter", TOPIC, cluster="east") == [
        Grant("topic", f"{TOPIC}.inbox.east", LITERAL, ("Write", "Describe"))
    ]


def test_readers_and_the_projector_never_write_the_events_topic() -> None:
    for role in ("reader", "projector", "admission", "reporter"):
        for grant in grants(role, TOPIC, cluster="east" if role == "reporter" else None):
            if grant.kind == "topic" and _covers(grant, TOPIC):
                assert ("Write" in grant.operations) == (role == "admission"), (role, grant)


def test_the_projector_writes_dead_letters_where_they_are_sent_once() -> None:
    granted = grants("projector", "t", dlq_topic="t-dead")
    # It reads the dead letters sent already, and sends in transactions of its own.
    assert Grant("topic", "t-dead", LITERAL, ("Read", "Write", "Describe")) in granted
    assert Grant("topic", "t", LITERAL, ("Read", "Describe")) in granted
    assert Grant(
        "transactional-id", "svledger-dead-letters-t-", PREFIXED, ("Write", "Describe")
    ) in (granted)


def test_admission_reads_every_inbox_and_appends_in_transactions() -> None:
    granted = grants("admission", TOPIC)
    assert Grant("topic", f"{TOPIC}.inbox.", PREFIXED, ("Read", "Describe")) in granted
    assert Grant("group", "svledger-admission", LITERAL, ("Read",)) in granted
    assert Grant("transactional-id", "svledger-admission-", PREFIXED, ("Write", "Describe")) in (
        granted
    )


@pytest.mark.parametrize(
    ("role", "cluster", "message"),
    [
        ("reporter", None, "give --cluster"),
        ("projector", "east", "not per cluster"),
        ("admin", None, "unknown role 'admin'"),
    ],
)
def test_a_wrong_role_or_cluster_is_refused(role: str, cluster: str | None, message: str) -> None:
    with pytest.raises(acls.AclError, match=message):
        grants(role, TOPIC, cluster=cluster)


def _operations(*names: str) -> list[str]:
    return [word for name in names for word in ("--operation", name)]


def test_one_kafka_acls_run_per_pattern_and_operations() -> None:
    commands = acls.acl_commands(
        ["kafka-acls.sh"], "kafka:9093", "admin.properties", "User:p", grants("projector", "t")
    )
    assert commands == [
        [
            "kafka-acls.sh",
            "--bootstrap-server",
            "kafka:9093",
            "--command-config",
            "admin.properties",
            "--add",
            "--allow-principal",
            "User:p",
            "--resource-pattern-type",
            *operands,
        ]
        for operands in (
            ["literal", "--topic", "t", "--topic", "t.placement", *_operations("Read", "Describe")],
            ["literal", "--topic", "t.dlq", *_operations("Read", "Write", "Describe")],
            ["prefixed", "--group", "svledger-projector.t.views.", "--operation", "Read"],
            [
                "prefixed",
                "--transactional-id",
                "svledger-dead-letters-t-",
                *_operations("Write", "Describe"),
            ],
        )
    ]


def test_dry_run_prints_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert acls.main(["--role", "reader", "--topic", "t", "--dry-run"]) == 0
    assert capsys.readouterr().out == (
        "kafka-acls.sh --bootstrap-server HOST:PORT --add --allow-principal User:NAME"
        " --resource-pattern-type literal --topic t --topic t.placement --operation Read"
        " --operation Describe\n"
    )
