"""The read API's pure parts: object shapes, tables, selectors, paging, kubectl's ages."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.hashing import hash_of_stored
from projections.state import (
    UNKNOWN_HASH,
    Condition,
    Lease,
    Migration,
    ServerStorageVersion,
    State,
    StorageState,
    StorageVersion,
)
from readapi import conversions, discovery, kinds, lists, selectors
from readapi.kinds import (
    LEASES,
    STORAGE_STATES,
    STORAGE_VERSION_MIGRATIONS,
    STORAGE_VERSIONS,
    View,
)
from readapi.selectors import Selection
from readapi.status import ApiError

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def storage_version(common: str | None = "apps/v2") -> StorageVersion:
    return StorageVersion(
        cluster="c",
        group="apps",
        resource="deployments",
        kind="Deployment",
        entries=(
            ServerStorageVersion("apiserver-a", "apps/v2", ("apps/v1", "apps/v2"), ("apps/v2",)),
            ServerStorageVersion("apiserver-b", "apps/v1", ("apps/v1", "apps/v2"), ("apps/v1",)),
        ),
        common_encoding_version=common,
        condition=Condition(
            "AllEncodingVersionsEqual",
            "True" if common else "False",
            "CommonEncodingVersionSet" if common else "CommonEncodingVersionUnset",
            "m",
            T0,
        ),
        revision="0:7",
        created_revision="0:3",
        created_at=T0,
    )


def view(state: State, *, at: datetime = T0 + timedelta(minutes=5)) -> View:
    return View(cluster="c", offset=42, time=at, state=state)


def test_a_storage_version_has_upstreams_shape() -> None:
    state = State(storage_versions={("c", "apps", "deployments"): storage_version(None)})
    ((_, obj),) = STORAGE_VERSIONS.selected(view(state))
    assert obj["apiVersion"] == "internal.apiserver.k8s.io/v1alpha1"
    assert obj["metadata"]["name"] == "apps.deployments"
    assert obj["metadata"]["resourceVersion"] == "7"
    assert obj["metadata"]["creationTimestamp"] == "2026-11-02T10:00:00Z"
    assert "commonEncodingVersion" not in obj["status"]  # omitempty, as upstream
    assert obj["status"]["storageVersions"][1] == {
        "apiServerID": "apiserver-b",
        "encodingVersion": "apps/v1",
        "decodableVersions": ["apps/v1", "apps/v2"],
        "servedVersions": ["apps/v1"],
    }
    assert obj["status"]["conditions"][0]["status"] == "False"


def test_empty_fields_are_left_out_and_the_status_is_in_upstreams_order() -> None:
    # Upstream's types: servedVersions, GroupResource.group and
    # StorageVersionMigrationStatus.conditions are omitempty; StorageVersionStatus
    # lists storageVersions, commonEncodingVersion, conditions.
    agreed = dataclasses.replace(
        storage_version("v1"),
        entries=tuple(
            dataclasses.replace(entry, served_versions=())
            for entry in storage_version("v1").entries
        ),
    )
    core_state = StorageState("c", "", "pods", (UNKNOWN_HASH,), None, "0:1", "0:1", T0)
    pending = dataclasses.replace(migration("Pending"), group="", resource="pods")
    state = State(
        storage_versions={("c", "apps", "deployments"): agreed},
        storage_states={core_state.key: core_state},
        migrations={pending.key: pending},
    )
    ((_, sv),) = STORAGE_VERSIONS.selected(view(state))
    assert list(sv["status"]) == ["storageVersions", "commonEncodingVersion", "conditions"]
    assert all("servedVersions" not in entry for entry in sv["status"]["storageVersions"])
    ((_, storage_state),) = STORAGE_STATES.selected(view(state))
    assert storage_state["spec"] == {"resource": {"resource": "pods"}}
    ((_, svm),) = STORAGE_VERSION_MIGRATIONS.selected(view(state))
    assert svm["spec"]["resource"] == {"version": "v2", "resource": "pods"}
    assert svm["status"] == {}


def test_a_uid_is_stable_and_new_for_a_row_created_again() -> None:
    state = State(storage_versions={("c", "apps", "deployments"): storage_version()})
    first = STORAGE_VERSIONS.selected(view(state))[0][1]["metadata"]["uid"]
    again = STORAGE_VERSIONS.selected(view(state))[0][1]["metadata"]["uid"]
    row = dataclasses.replace(storage_version(), created_revision="0:9")
    reborn = view(State(storage_versions={row.key: row}))
    assert first == again != STORAGE_VERSIONS.selected(reborn)[0][1]["metadata"]["uid"]


def test_a_lease_is_in_kube_system_with_upstreams_labels() -> None:
    lease = Lease(
        "c", "apiserver-x", "apiserver-x_1", "host-1", 3600, T0, "v1.37.2", "0:1", "0:1", T0
    )
    ((_, obj),) = LEASES.selected(view(State(leases={lease.key: lease})))
    assert obj["metadata"]["namespace"] == "kube-system"
    assert obj["metadata"]["labels"] == {
        "apiserver.kubernetes.io/identity": "kube-apiserver",
        "kubernetes.io/hostname": "host-1",
    }
    assert obj["spec"] == {
        "holderIdentity": "apiserver-x_1",
        "leaseDurationSeconds": 3600,
        "renewTime": "2026-11-02T10:00:00.000000Z",
    }
    # Collected from an object without a holder: none shown, as upstream's object.
    holderless = dataclasses.replace(lease, holder_identity="")
    ((_, obj),) = LEASES.selected(view(State(leases={lease.key: holderless})))
    assert "holderIdentity" not in obj["spec"]


def test_discovery_gives_each_kind_upstreams_storage_version_hash() -> None:
    hashes = {
        entry["name"]: entry["storageVersionHash"]
        for group, version in (
            ("coordination.k8s.io", "v1"),
            ("internal.apiserver.k8s.io", "v1alpha1"),
            ("migration.k8s.io", "v1alpha1"),
        )
        for entry in (discovery.resource_list(group, version) or {})["resources"]
    }
    # As a v1.37 kube-apiserver's discovery shows them (computed by its code).
    assert hashes == {
        "leases": "gqkMMb/YqFM=",
        "storageversions": "c8YZt5U0nPk=",
        "storagestates": "7abAo0yHdNM=",
        "storageversionmigrations": "X3bkZSayqxI=",
    }


def migration(phase: str, reason: str | None = None) -> Migration:
    return Migration(
        "c", "m-1", "apps", "deployments", "apps/v2", "h", "0:3", phase,  # type: ignore[arg-type]
        12, None, reason, None, T0, T0, "0:9", "0:3", T0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("phase", "reason", "conditions"),
    [
        ("Pending", None, []),
        ("Running", None, [("Running", None)]),
        ("Succeeded", None, [("Succeeded", None)]),
        ("Failed", "Forbidden", [("Failed", "Forbidden")]),
        ("Cancelled", "EncodingVersionsDisagree", [("Failed", "EncodingVersionsDisagree")]),
    ],
)
def test_a_migration_phase_is_one_of_upstreams_conditions(
    phase: str, reason: str | None, conditions: list[tuple[str, str | None]]
) -> None:
    row = migration(phase, reason)
    ((_, obj),) = STORAGE_VERSION_MIGRATIONS.selected(view(State(migrations={row.key: row})))
    assert obj["spec"]["resource"] == {"group": "apps", "version": "v2", "resource": "deployments"}
    got = [(c["type"], c.get("reason")) for c in obj["status"].get("conditions", [])]
    assert got == conditions
    assert obj["metadata"]["labels"]["svledger.io/phase"] == phase


def test_a_storage_state_table_names_the_version_of_each_hash() -> None:
    v1, v2 = hash_of_stored("apps/v1", "Deployment"), hash_of_stored("apps/v2", "Deployment")
    row = StorageState("c", "apps", "deployments", (v1, v2, "Unknown"), v2, "0:5", "0:3", T0)
    state = State(
        storage_versions={("c", "apps", "deployments"): storage_version()},
        storage_states={row.key: row},
    )
    served = kinds.served_storage_state(state, row)
    table = conversions.table(STORAGE_STATES, [(served, {"metadata": {}})], view(state))
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", 0), ("Current", 0), ("Persisted", 0), ("Age", 0), ("Removable", 1),
        ("Audited", 1),
    ]  # fmt: skip
    assert table["rows"][0]["cells"] == [
        "deployments.apps",
        f"{v2} (apps/v2)",
        f"{v1} (apps/v1), {v2} (apps/v2), Unknown",
        "5m",
        "",  # no CustomResourceDefinition: nothing to remove
        "",  # never audited
    ]


def test_a_past_view_shows_ages_as_they_were() -> None:
    state = State(storage_versions={("c", "apps", "deployments"): storage_version()})
    row = state.storage_versions[("c", "apps", "deployments")]
    late = conversions.table(
        STORAGE_VERSIONS, [(row, {"metadata": {}})], view(state, at=T0 + timedelta(days=3))
    )
    assert late["rows"][0]["cells"][3] == "3d"


def test_a_storage_version_table_has_upstreams_columns_then_the_ledgers() -> None:
    # pkg/printers/internalversion: NAME, COMMONENCODINGVERSION, STORAGEVERSIONS, AGE;
    # at most three entries, "ID=VERSION" each in their order, "<unset>" for none.
    def cells(row: StorageVersion) -> list[object]:
        state = State(storage_versions={row.key: row})
        table = conversions.table(STORAGE_VERSIONS, [(row, {"metadata": {}})], view(state))
        assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
            ("Name", 0), ("CommonEncodingVersion", 0), ("StorageVersions", 0), ("Age", 0),
            ("Agreed", 1), ("Servers", 1),
        ]  # fmt: skip
        return list(table["rows"][0]["cells"])

    two = storage_version(common=None)
    assert cells(two) == [
        "apps.deployments",
        "<unset>",
        "apiserver-a=apps/v2,apiserver-b=apps/v1",
        "5m",
        "False",
        2,
    ]
    entry = two.entries[0]
    five = dataclasses.replace(
        two,
        entries=tuple(dataclasses.replace(entry, apiserver_id=f"s{i}") for i in (5, 1, 4, 2, 3)),
    )
    assert cells(five)[2] == "s5=apps/v2,s1=apps/v2,s4=apps/v2 + 2 more..."
    assert cells(dataclasses.replace(two, entries=()))[2] == "<unset>"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"), (-0.5, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (125, "2m5s"),
        (600, "10m"), (10_799, "179m"), (10_800, "3h"), (3 * 3600 + 60, "3h1m"),
        (8 * 3600, "8h"), (47 * 3600, "47h"), (48 * 3600, "2d"), (50 * 3600, "2d2h"),
        (8 * 86400, "8d"), (729 * 86400, "729d"), (730 * 86400, "2y"), (731 * 86400, "2y1d"),
        (8 * 365 * 86400, "8y"),
    ],
)  # fmt: skip
def test_ages_read_as_kubectl_prints_them(seconds: float, shown: str) -> None:
    assert kinds.human_duration(seconds) == shown


LABELS = {"app": "x", "tier": "db", "kubernetes.io/hostname": "h1", "replicas": "3", "empty": ""}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("app=x", True), ("app==x", True), ("app!=x", False), ("app", True), ("!app", False),
        ("missing", False), ("!missing", True), ("tier in (db,web)", True),
        ("tier notin (db)", False), ("app=x,tier=web", False), ("app = x , tier in ( db )", True),
        ("kubernetes.io/hostname=h1", True), ("", True),
        # Upstream's Gt and Lt compare integers; "()" is the empty value.
        ("replicas>2", True), ("replicas<3", False), ("replicas>-1", True), ("app>1", False),
        ("missing<9", False), ("empty in ()", True), ("app in ()", False),
        # "(" ends a word, as every symbol does in upstream's lexer.
        ("tier in(db,web)", True), ("tier notin(db)", False), ("app in(x),tier notin(web)", True),
    ],
)  # fmt: skip
def test_label_selectors_read_as_kubernetes_writes_them(selector: str, matches: bool) -> None:
    requirements = selectors.parse_label_selector(selector)
    assert all(r.matches(LABELS) for r in requirements) is matches


@pytest.mark.parametrize(
    "selector",
    # The last ones parse, but name no label (upstream's apiserver_test: <invalid> is a 400).
    [
        "a in (",
        "=x",
        "a b",
        "a in b",
        "ain (b)",
        "<invalid>",
        "-app",
        "a/b/c",
        "app=-x",
        "x" * 64,
        "app=x,",
        ",",
        "a>b",
        "a<",
    ],
)
def test_a_malformed_selector_is_a_400_naming_it(selector: str) -> None:
    with pytest.raises(ApiError) as refused:
        selectors.parse_label_selector(selector)
    assert refused.value.code == 400 and selector.split()[0] in str(refused.value)


def test_field_selectors_know_name_and_namespace_only() -> None:
    obj = {"metadata": {"name": "n1", "namespace": "kube-system"}}
    selection = Selection(fields=selectors.parse_field_selector("metadata.name=n1"))
    assert selection.matches(obj)
    assert not Selection(fields=selectors.parse_field_selector("metadata.name!=n1")).matches(obj)
    spec = selectors.parse_field_selector("spec.x=1")
    with pytest.raises(ApiError, match=r"field label not supported: spec\.x"):
        kinds.check_field_selector(spec, "migration.k8s.io", True)
    # A built-in kind's words (upstream's DefaultMetaV1FieldSelectorConversion).
    with pytest.raises(ApiError) as builtin:
        kinds.check_field_selector(spec, "coordination.k8s.io", True)
    assert str(builtin.value) == (
        '"spec.x" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )
    # A cluster-scoped custom resource has no namespace to select on.
    namespace = selectors.parse_field_selector("metadata.namespace=x")
    with pytest.raises(ApiError, match=r"field label not supported: metadata\.namespace"):
        kinds.check_field_selector(namespace, "migration.k8s.io", False)
    kinds.check_field_selector(namespace, "migration.k8s.io", True)


@given(st.integers(min_value=0), st.text())
def test_a_continue_token_round_trips(offset: int, name: str) -> None:
    assert lists.parse_continue(lists.continue_token(offset, name)) == (offset, name)


@given(st.text())
def test_any_other_continue_token_is_a_clear_400(token: str) -> None:
    try:
        lists.parse_continue(token)
    except ApiError as error:
        assert error.code == 400 and "continue token" in str(error)


@given(
    st.lists(st.text(alphabet="abcdef", min_size=1, max_size=4), unique=True),
    st.integers(min_value=1, max_value=5),
    st.sampled_from(["", "a", "b"]),
)
def test_pages_cover_every_selected_item_once_in_order(
    names: list[str], limit: int, prefix: str
) -> None:
    items = [{"metadata": {"name": name}} for name in sorted(names)]

    def selected(obj: dict[str, Any]) -> bool:
        return str(obj["metadata"]["name"]).startswith(prefix)

    seen: list[str] = []
    after = ""
    while True:
        chosen, last = lists.page(items, after, limit, selected)
        assert len(chosen) <= limit
        seen += [obj["metadata"]["name"] for obj in chosen]
        if last is None:
            break
        after = last
    assert seen == sorted(name for name in names if name.startswith(prefix))


def test_a_page_filled_by_a_selector_continues_while_any_item_remains() -> None:
    # Upstream's store test "filter returning only one item, ensure only a single page
    # returned": a continue token, and the next page is empty.
    items = [{"metadata": {"name": name}} for name in ("a", "b", "c")]

    def is_a(obj: dict[str, Any]) -> bool:
        return bool(obj["metadata"]["name"] == "a")

    assert lists.page(items, "", 1, is_a) == ([items[0]], "a")
    assert lists.page(items, "a", 1, is_a) == ([], None)
    assert lists.page(items, "", 3, is_a) == ([items[0]], None)


def test_aggregated_discovery_lists_every_kind_with_its_scope() -> None:
    body = discovery.aggregated_discovery("apidiscovery.k8s.io/v2", core=False)
    found = {
        (group["metadata"]["name"], version["version"], r["resource"], r["scope"])
        for group in body["items"]
        for version in group["versions"]
        for r in version["resources"]
    }
    assert found == {
        ("internal.apiserver.k8s.io", "v1alpha1", "storageversions", "Cluster"),
        ("coordination.k8s.io", "v1", "leases", "Namespaced"),
        ("migration.k8s.io", "v1alpha1", "storagestates", "Cluster"),
        ("migration.k8s.io", "v1alpha1", "storageversionmigrations", "Cluster"),
    }
    # The core group's one version, v1, as the legacy /api says, with no kinds here.
    assert discovery.aggregated_discovery("apidiscovery.k8s.io/v2", core=True)["items"] == [
        {"metadata": {}, "versions": [{"version": "v1", "resources": [], "freshness": "Current"}]}
    ]
    # As a real kube-apiserver 1.37's: a built-in kind's response kind is in the
    # resource's own group and version (empty); a custom resource's names them.
    assert {
        (r["responseKind"]["group"], r["responseKind"]["version"], r["responseKind"]["kind"])
        for group in body["items"]
        for version in group["versions"]
        for r in version["resources"]
    } == {
        ("", "", "StorageVersion"),
        ("", "", "Lease"),
        ("migration.k8s.io", "v1alpha1", "StorageState"),
        ("migration.k8s.io", "v1alpha1", "StorageVersionMigration"),
    }


def test_the_legacy_core_discovery_reads_as_upstreams() -> None:
    # kube-apiserver 1.37: /api names where it is reached; /api/v1 has no apiVersion.
    assert discovery.api_versions("127.0.0.1:6443")["serverAddressByClientCIDRs"] == [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}
    ]
    assert list(discovery.core_resources()) == ["kind", "groupVersion", "resources"]


def test_a_built_in_kinds_list_items_carry_no_type_and_a_custom_resources_do() -> None:
    # Upstream encodes a built-in kind's list with bare items (the list names their
    # kind once); a CRD's objects are unstructured and keep their kind and apiVersion.
    core_state = StorageState("c", "", "pods", (UNKNOWN_HASH,), None, "0:1", "0:1", T0)
    state = State(
        storage_versions={("c", "apps", "deployments"): storage_version("v1")},
        storage_states={core_state.key: core_state},
    )
    for kind, typed in [(STORAGE_VERSIONS, False), (STORAGE_STATES, True)]:
        items = [obj for _, obj in kind.selected(view(state))]
        listed = lists.object_list(kind, items, 42, "", None)
        assert (listed["kind"], listed["apiVersion"]) == (f"{kind.kind}List", kind.api_version)
        (item,) = listed["items"]
        assert ("kind" in item, "apiVersion" in item) == (typed, typed)
        assert item["metadata"] == items[0]["metadata"]
        assert items[0]["kind"] == kind.kind  # a single object keeps its type


def test_a_lease_shows_its_peer_advertise_address_as_upstream_annotates_it() -> None:
    lease = Lease("c", "apiserver-a", "apiserver-a_1", "cp-0", 15, T0, None, "0:4", "0:3", T0)
    addressed = dataclasses.replace(lease, peer_advertise_address="10.0.0.1:6443")
    for row, shown in [
        (lease, None),
        (addressed, {"kubernetes.io/peer-advertise-address": "10.0.0.1:6443"}),
    ]:
        ((_, obj),) = LEASES.selected(view(State(leases={row.key: row})))
        assert obj["metadata"].get("annotations") == shown


def test_the_group_list_holds_each_group_as_served_alone_without_its_type() -> None:
    # kube-apiserver's /apis: the items of an APIGroupList carry no kind or apiVersion.
    listed = discovery.group_list()
    assert (listed["kind"], listed["apiVersion"]) == ("APIGroupList", "v1")
    for group in listed["groups"]:
        alone = discovery.group_of(group["name"])
        assert (alone["kind"], alone["apiVersion"]) == ("APIGroup", "v1")
        assert group == {k: v for k, v in alone.items() if k not in ("kind", "apiVersion")}
