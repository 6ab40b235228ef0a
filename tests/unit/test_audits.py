"""An audit of the store judged against the ledger (:mod:`projections.audits`), kept by the
fold and put into words by ``explain``: each case folded from a readable history."""

from __future__ import annotations

import copy

from ledger.events import Position, StorageAudited
from projections.audits import pollution, removable_keys
from projections.crds import stored_version_verdicts
from projections.history import explanation
from tests.unit.test_crds import GROUP, H1, H2, KEY, RESOURCE, Widgets, switched

V1, V2 = f"{GROUP}/v1", f"{GROUP}/v2"


def audited(
    s: Widgets,
    found: dict[str, int],
    *,
    keys: tuple[tuple[str, int], ...] = (),
    polluted: tuple[str, ...] = (),
    why: str | None = None,
) -> Position:
    hashes = {V1: H1, V2: H2}
    versions = tuple(sorted(found))
    return s.add(
        StorageAudited(
            s.meta("svledger-audit"), "audit-1", GROUP, RESOURCE, 42, len(s.entries),
            sum(found.values()) + sum(n for _, n in keys), 1000, versions,
            tuple(hashes[v] for v in versions), tuple(found[v] for v in versions),
            tuple(k for k, _ in keys), tuple(n for _, n in keys), 0, (), polluted, why,
        )
    )  # fmt: skip


def judged(
    s: Widgets, before: Widgets, found: dict[str, int]
) -> tuple[tuple[str, ...], str | None]:
    versions = tuple(sorted(found))
    hashes = tuple({V1: H1, V2: H2}[v] for v in versions)
    counts = tuple(found[v] for v in versions)
    return pollution(before.state, s.state, KEY, versions, hashes, counts, 42)


def test_objects_left_in_v1_after_a_migration_under_agreement_are_pollution() -> None:
    s = switched()
    s.migrate("m1")
    polluted, why = judged(s, s, {V1: 2, V2: 18})
    assert polluted == (V1,)
    assert why is not None and "2 in example.com/v1" in why and "migration m1" in why


def test_nothing_is_pollution_while_the_ledger_claims_nothing() -> None:
    s = switched()  # persisted holds Unknown: objects may be stored in any version
    assert judged(s, s, {V1: 5, V2: 5}) == ((), None)


def test_a_version_rewritten_while_etcd_was_read_is_not_pollution() -> None:
    s = switched()
    s.migrate("m0")
    s.report("b", "v1")  # b writes v1 again: the ledger holds both when the audit begins
    before = copy.deepcopy(s)
    s.report("b", "v2")
    s.migrate("m1")  # succeeded while etcd was read: the read predates the proof
    assert judged(s, before, {V1: 1, V2: 19}) == ((), None)


def test_a_version_reported_while_etcd_was_read_is_not_pollution() -> None:
    s = switched()
    s.migrate("m1")
    before = copy.deepcopy(s)
    s.report("b", "v1")  # a restarted apiserver reported v1 while etcd was read
    assert judged(s, before, {V1: 1, V2: 19}) == ((), None)


def test_the_audit_is_kept_and_explained_with_its_alarm() -> None:
    s = switched()
    s.migrate("m1")
    polluted, why = judged(s, s, {V1: 2, V2: 18})
    at = audited(s, {V1: 2, V2: 18}, polluted=polluted, why=why)
    audit = s.state.audits[KEY]
    assert (audit.revision, audit.polluted_versions) == (str(at), (V1,))
    text = explanation(s.facts(KEY))
    assert f"StorageAudited at {at}" in text
    assert f"2 stored in {V1} (hash {H1}): POLLUTION" in text
    assert f"18 stored in {V2} (hash {H2}): as the ledger holds" in text
    assert "ALARM: etcd holds objects" in text
    # The CRD's answer cites the audit.
    assert "the audit at etcd revision 42" in text and "found 2 objects stored in it" in text


def test_a_configured_key_that_encrypts_nothing_can_go_but_the_writing_one() -> None:
    s = switched()
    audited(s, {}, keys=(("aescbc:key2", 20), ("aescbc:key1", 0), ("identity", 0)))
    audit = s.state.audits[KEY]
    assert removable_keys(audit) == ("aescbc:key1", "identity")
    text = explanation(s.facts(KEY))
    assert "aescbc:key1 encrypts no object of this resource at etcd revision 42" in text
    assert "(aescbc:key2 writes)" in text
    audited(s, {}, keys=(("aescbc:key2", 0), ("aescbc:key1", 20)))
    assert removable_keys(s.state.audits[KEY]) == ()


def test_a_version_the_audit_found_objects_in_after_the_proof_cannot_go() -> None:
    s = switched()
    s.migrate("m1")
    assert stored_version_verdicts(s.state, KEY)[0].removable  # v1, proven empty
    polluted, why = judged(s, s, {V1: 2, V2: 18})
    at = audited(s, {V1: 2, V2: 18}, polluted=polluted, why=why)
    v1 = stored_version_verdicts(s.state, KEY)[0]
    assert not v1.removable
    assert f"StorageAudited at {at}) found 2 objects stored in v1" in v1.why


def test_an_audit_that_began_before_the_proof_does_not_hold_a_version() -> None:
    s = switched()
    audited(s, {V1: 20})  # every widget in v1, before the migration rewrote them
    s.migrate("m1")
    assert stored_version_verdicts(s.state, KEY)[0].removable
