"""The rules a storage-version report must satisfy before anything is sent.

Kubernetes names these things with DNS-1123 and DNS-1035 rules (the API server and
CRD validation apply them); a report that breaks them, or that claims to encode in a
version it cannot decode, would only be rejected by the fold later. Checking at the
reporter turns that into an error at the caller, with nothing half-sent.

* group: a DNS-1123 subdomain, or ``""`` for the core group. ``"core"`` is refused:
  it would share the StorageVersion name ``core.<resource>`` with the core group.
* resource: a DNS-1035 label (lowercase plural, e.g. ``deployments``): upstream's
  ``ValidateStorageVersionName`` holds the resource segment of a StorageVersion's name
  to that rule (a CRD's plural too), so a resource cannot start with a digit.
* version: group-qualified as upstream writes it, ``<group>/<version>`` or ``<version>``
  for the core group (``apps/v1``, ``v1``); the version part a DNS-1035 label (``v1``,
  ``v1beta2``, a CRD's ``v2alpha1``), the group part a DNS-1123 subdomain. A resource
  may be stored in another group's version (events.k8s.io events are stored as core
  ``v1``), so the group part need not be the resource's own.
* kind: its lowercase form is a DNS-1035 label, as for CRDs (``Deployment``).
* encoding_version and every served version must be among decodable_versions, as in
  upstream's StorageVersion validation (``ValidateServerStorageVersion``): a server
  cannot write or serve a version it cannot read back.
* apiserver_id (where given): a DNS-1123 subdomain, as upstream validates it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

from ledger.errors import UsageError
from ledger.names import CORE_GROUP_ALIAS

_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL: Final = re.compile(_LABEL)
_DNS1123_SUBDOMAIN: Final = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS1035_LABEL: Final = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_MAX: Final = 63
SUBDOMAIN_MAX: Final = 253


#: The longest lease a Lease object can hold: its leaseDurationSeconds is an int32.
LEASE_DURATION_MAX: Final = 2**31 - 1


class InvalidReport(UsageError):
    """A report field breaks a rule; names the field, the value and the rule.

    ``more``: the other rules the same report breaks, as upstream's validation lists
    every error it finds; the message names them all.
    """

    def __init__(
        self, field: str, value: object, rule: str, *, more: Sequence[InvalidReport] = ()
    ) -> None:
        message = f"invalid {field} {value!r}: {rule}"
        super().__init__("; ".join([message, *map(str, more)]))
        self.field = field
        self.value = value
        self.rule = rule
        self.more = tuple(more)


def is_dns1123_label(name: str) -> bool:
    return len(name) <= LABEL_MAX and _DNS1123_LABEL.fullmatch(name) is not None


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def is_dns1035_label(name: str) -> bool:
    return len(name) <= LABEL_MAX and _DNS1035_LABEL.fullmatch(name) is not None


def check_group(group: str) -> None:
    if group == CORE_GROUP_ALIAS:
        raise InvalidReport("group", group, "the core group is written as the empty string ''")
    if group and not is_dns1123_subdomain(group):
        raise InvalidReport(
            "group",
            group,
            "must be '' (core) or a DNS-1123 subdomain: lowercase letters, digits, '-' "
            f"and '.', starting and ending alphanumeric, at most {SUBDOMAIN_MAX} characters",
        )


def check_resource(resource: str) -> None:
    if not is_dns1035_label(resource):
        raise InvalidReport(
            "resource",
            resource,
            "must be a DNS-1035 label: lowercase letters, digits and '-', starting with a "
            f"letter and ending alphanumeric, at most {LABEL_MAX} characters "
            "(e.g. 'deployments')",
        )


def check_version(field: str, version: str) -> None:
    """Refuse a version that is not ``<group>/<version>`` or ``<version>``, naming each
    part that breaks its rule, as upstream's ``isValidAPIVersion`` lists both."""
    form = "must be <group>/<version> or <version> for the core group (e.g. 'apps/v1', 'v1')"
    if version.count("/") > 1:
        raise InvalidReport(field, version, f"{form}, with one '/' at most")
    group, slash, bare = version.rpartition("/")
    broken = []
    if slash and not is_dns1123_subdomain(group):
        broken.append(
            "the group a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', "
            f"starting and ending alphanumeric, at most {SUBDOMAIN_MAX} characters"
        )
    if not is_dns1035_label(bare):
        broken.append(
            "the version a DNS-1035 label: a lowercase letter, then lowercase letters, "
            f"digits and '-', at most {LABEL_MAX} characters (e.g. 'v1beta2')"
        )
    if broken:
        raise InvalidReport(field, version, f"{form}; {' and '.join(broken)}")


def check_apiserver_id(apiserver_id: str) -> None:
    if not is_dns1123_subdomain(apiserver_id):
        raise InvalidReport(
            "apiserver_id",
            apiserver_id,
            "must be a DNS-1123 subdomain (upstream's IDs are 'apiserver-<base32>')",
        )


def check_kind(kind: str) -> None:
    if not is_dns1035_label(kind.lower()):
        raise InvalidReport(
            "kind",
            kind,
            "lowercased, must be a DNS-1035 label: a letter, then letters, digits and '-', "
            f"at most {LABEL_MAX} characters (e.g. 'Deployment')",
        )


def check_report(
    group: str,
    resource: str,
    kind: str,
    encoding_version: str,
    decodable_versions: Sequence[str],
    served_versions: Sequence[str],
    apiserver_id: str | None = None,
    storage_version_hash: str | None = None,
) -> None:
    """Raise :class:`InvalidReport` naming every rule the report breaks, in the order
    upstream's ``validateServerStorageVersion`` checks them (the first one's field,
    value and rule are the error's own).

    An empty ``encoding_version`` with a ``storage_version_hash`` is an apiserver storing
    in a version nobody could name but by its hash (:data:`ledger.hashing.UNNAMED_VERSION`):
    the rules on the encoding version do not apply to it."""
    unnamed = encoding_version == "" and bool(storage_version_hash)
    problems: list[InvalidReport] = []

    def check(rule: Callable[..., None], *arguments: str) -> None:
        try:
            rule(*arguments)
        except InvalidReport as problem:
            problems.append(problem)

    if apiserver_id is not None:
        check(check_apiserver_id, apiserver_id)
    check(check_group, group)
    check(check_resource, resource)
    check(check_kind, kind)
    if not unnamed:
        check(check_version, "encoding_version", encoding_version)
    for version in decodable_versions:
        check(check_version, "decodable_versions", version)
    if not unnamed and encoding_version not in decodable_versions:
        problems.append(
            InvalidReport(
                "decodable_versions",
                list(decodable_versions),
                f"must include encoding_version {encoding_version!r}: a server cannot"
                " write a version it cannot read back",
            )
        )
    for version in served_versions:
        check(check_version, "served_versions", version)
        if version not in decodable_versions:
            problems.append(
                InvalidReport(
                    "served_versions",
                    version,
                    f"must be one of decodable_versions {list(decodable_versions)}: "
                    "a server cannot serve a version it cannot decode",
                )
            )
    if problems:
        first, *more = problems
        raise InvalidReport(first.field, first.value, first.rule, more=more)
