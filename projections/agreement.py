"""Agreement: the common encoding version and condition of a StorageVersion's entries.

Pure, like the fold that uses it (:mod:`projections.fold`): upstream's
``SetCommonEncodingVersion`` (the common version, the ``AllEncodingVersionsEqual``
condition and when it transitions), and what svledger adds to it: every live apiserver
must report (:func:`unreported`), the sources of one apiserver must agree, and a version
nobody can name agrees with none. ``explain`` replays it along a resource's history
(:mod:`projections.history`); the migrator and the metrics read :func:`unreported`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime

from ledger.hashing import UNNAMED_VERSION
from projections.state import (
    CONDITION_TYPE,
    MESSAGE_SET,
    MESSAGE_UNSET,
    REASON_SET,
    REASON_UNKNOWN,
    REASON_UNSET,
    Condition,
    ConditionStatus,
    ResourceKey,
    ServerStorageVersion,
    State,
)


def agreement(
    entries: Iterable[ServerStorageVersion],
    previous_common: str | None,
    previous_condition: Condition | None,
    now: datetime,
    unreported: Collection[str] = (),
) -> tuple[str | None, Condition]:
    """The common encoding version and ``AllEncodingVersionsEqual`` condition of ``entries``.

    As upstream's ``SetCommonEncodingVersion``: the common version is set iff every
    entry has the same encoding version; the condition's ``last_transition_time`` is
    ``now`` when there was no condition, when its status flips, or when the common
    version moves from one value to another, and is kept otherwise.

    Beyond upstream: ``unreported`` are the apiservers that hold a live lease in the
    cluster but report nothing (:func:`unreported`). Agreement is then unknown, not true: the
    common version is unset and the condition ``Unknown``
    (:data:`~projections.state.REASON_UNKNOWN`), naming them, unless the entries
    disagree already (``False``, upstream's). Upstream computes agreement over the
    entries it has, so an apiserver that never wrote its entry (or whose entry the GC
    removed) counts for nothing there; here every member must have said what it writes,
    as an apiserver nobody asked may write anything. A message names an apiserver
    whose sources name different versions (:data:`~ledger.events.SOURCES`).
    """
    entries = tuple(entries)
    versions = {entry.encoding_version for entry in entries}
    unnamed = sorted({e.apiserver_id for e in entries if e.encoding_version == UNNAMED_VERSION})
    agreed = len(versions) == 1 and not unreported and not unnamed
    common = next(iter(versions)) if agreed else None
    status: ConditionStatus
    if len(versions) > 1 or unnamed:
        message = MESSAGE_UNSET + _conflicts(entries)
        if unnamed:
            message += f"; stored in a version no one can name by {', '.join(unnamed)}"
        status, reason = "False", REASON_UNSET
    elif unreported:
        status, reason = "Unknown", REASON_UNKNOWN
        message = (
            "Common encoding version unknown: no storage version reported by"
            f" {', '.join(sorted(unreported))}, holding a live lease"
        )
    else:
        status, reason, message = "True", REASON_SET, MESSAGE_SET
    if previous_condition is None or transitions(
        previous_common, previous_condition, common, status
    ):
        transition = now
    else:
        transition = previous_condition.last_transition_time
    return common, Condition(CONDITION_TYPE, status, reason, message, transition)


def source_conflicts(entries: Iterable[ServerStorageVersion]) -> dict[str, dict[str, str]]:
    """Each apiserver whose sources name different encoding versions, with the version
    each source names (``""``: its own report)."""
    by_apiserver: dict[str, dict[str, str]] = {}
    for entry in entries:
        by_apiserver.setdefault(entry.apiserver_id, {})[entry.source] = entry.encoding_version
    return {a: by for a, by in by_apiserver.items() if len(set(by.values())) > 1}


def _conflicts(entries: tuple[ServerStorageVersion, ...]) -> str:
    """``: <apiserver>: discovery v1, storageversion v1beta1; ...`` for each apiserver
    whose sources name different encoding versions; "" when there is none."""
    conflicts = [
        f"{apiserver_id}: "
        + ", ".join(f"{source or 'reported'} {version}" for source, version in sorted(by.items()))
        for apiserver_id, by in source_conflicts(entries).items()
    ]
    return f"; sources disagree: {'; '.join(conflicts)}" if conflicts else ""


def transitions(
    previous_common: str | None,
    previous: Condition | None,
    common: str | None,
    status: ConditionStatus,
) -> bool:
    """Whether the condition transitions as the common version goes from
    ``previous_common`` to ``common`` and its status to ``status``: there was none, its
    status changes, or the common version moves from one value to another."""
    moved = previous_common is not None and common is not None and previous_common != common
    return previous is None or previous.status != status or moved


def unreported(state: State, key: ResourceKey, entries: Iterable[ServerStorageVersion]) -> set[str]:
    """The members of ``key``'s cluster (apiservers with a lease) that report nothing: no
    entry in ``entries`` nor in any StorageVersion of the cluster.

    A member that reports other resources but not this one does not serve it (the
    reporter reports, and the collector reads from discovery, an apiserver's whole set of
    resources at once, and withdraws what leaves it), so it cannot write it either.
    """
    cluster = key[0]
    members = state.members_by_cluster.get(cluster, set())
    reporting = {entry.apiserver_id for entry in entries}
    return {
        apiserver_id
        for apiserver_id in members - reporting
        if (cluster, apiserver_id) not in state.resources_by_apiserver
    }
