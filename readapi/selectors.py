"""Label and field selectors, parsed and matched as Kubernetes parses and matches them.

A label selector (``labelSelector``) is upstream's ``labels.Parse`` syntax: ``=``,
``==``, ``!=``, ``in``, ``notin``, ``>``, ``<``, a key alone and ``!key``, with its keys
and values checked as label names (a 400 for one that is not). A field selector
(``fieldSelector``) is ``=``, ``==`` and ``!=``; its syntax is checked here, and which
fields a kind knows after the request's other options, as upstream's storage does
(:func:`readapi.kinds.check_field_selector`). A :class:`Selection` is which objects a
request is about: its namespace, a name, and both selectors.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Final

from ledger.validation import is_dns1123_subdomain
from readapi.gojson import JSON
from readapi.status import ApiError


@dataclasses.dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "=" | "in":
                return value in self.values
            case "!=" | "notin":
                return value not in self.values
            case "exists":
                return value is not None
            case ">" | "<":
                # As upstream's Gt and Lt: the label's value, read as an integer.
                if value is None or _INTEGER.fullmatch(value) is None:
                    return False
                (bound,) = self.values
                return int(value) > int(bound) if self.operator == ">" else int(value) < int(bound)
            case _:
                return value is None


_SET_REQUIREMENT: Final = re.compile(r"^\s*([^\s!=(),<>]+)\s+(in|notin)\s*\(([^()]*)\)\s*$")
_EQUALITY: Final = re.compile(r"^\s*([^\s!=(),<>]+)\s*(==|=|!=)\s*([^\s!=(),<>]*)\s*$")
_ORDER: Final = re.compile(r"^\s*([^\s!=(),<>]+)\s*([<>])\s*([^\s!=(),<>]*)\s*$")
_EXISTS: Final = re.compile(r"^\s*(!?)\s*([^\s!=(),<>]+)\s*$")
_INTEGER: Final = re.compile(r"[-+]?[0-9]+")


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """A label selector as Kubernetes writes one: ``a=b,c!=d,e in (f,g),h,!i,j>1``."""
    requirements = []
    parts = _split_selector(text)
    if text.strip() and any(not part.strip() for part in parts):
        raise ApiError(
            400,
            "BadRequest",
            f"unable to parse labelSelector {text!r}: found '', expected an identifier after ','",
        )
    for part in parts:
        if not part.strip():
            continue
        if match := _SET_REQUIREMENT.match(part):
            # As upstream's parser: "()" and a trailing "," stand for the empty value.
            values = frozenset(v.strip() for v in match[3].split(","))
            requirements.append(Requirement(match[1], match[2], values))
        elif match := _ORDER.match(part):
            if _INTEGER.fullmatch(match[3]) is None:
                raise ApiError(
                    400,
                    "BadRequest",
                    f"invalid requirement {part.strip()!r} of labelSelector {text!r}: for"
                    " '>' and '<' the value must be an integer",
                )
            requirements.append(Requirement(match[1], match[2], frozenset({match[3]})))
        elif match := _EQUALITY.match(part):
            operator = "!=" if match[2] == "!=" else "="
            requirements.append(Requirement(match[1], operator, frozenset({match[3]})))
        elif match := _EXISTS.match(part):
            requirements.append(Requirement(match[2], "!" if match[1] else "exists", frozenset()))
        else:
            raise ApiError(
                400,
                "BadRequest",
                f"unable to parse requirement {part.strip()!r} of labelSelector {text!r}: "
                "write key=value, key!=value, key in (a,b), key notin (a,b), key or !key",
            )
        _check_label(requirements[-1], text)
    return tuple(requirements)


_LABEL_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _check_label(requirement: Requirement, text: str) -> None:
    """Upstream's ``labels.Parse`` checks: a key is a qualified name (an optional DNS
    subdomain prefix and ``/``, then a name of at most 63 characters), a value empty
    or such a name."""
    prefix, slash, name = requirement.key.rpartition("/")
    if not (_is_label_name(name) and (not slash or is_dns1123_subdomain(prefix))):
        raise ApiError(
            400,
            "BadRequest",
            f"invalid label key {requirement.key!r} in labelSelector {text!r}: a name of at"
            " most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an"
            " alphanumeric one, with an optional DNS subdomain prefix and '/'"
            " (e.g. 'app' or 'kubernetes.io/hostname')",
        )
    for value in requirement.values if requirement.operator not in (">", "<") else ():
        if value and not _is_label_name(value):
            raise ApiError(
                400,
                "BadRequest",
                f"invalid label value {value!r} in labelSelector {text!r}: at most 63"
                " alphanumeric characters, '-', '_' or '.', starting and ending with an"
                " alphanumeric one, or empty",
            )


def _is_label_name(name: str) -> bool:
    return len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def _split_selector(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def parse_field_selector(text: str) -> tuple[Requirement, ...]:
    """A field selector's requirements (``=``, ``==``, ``!=``), its syntax checked; which
    fields a kind knows is checked after the request's options
    (:func:`readapi.kinds.check_field_selector`), as upstream's handler parses it before
    it validates them and its storage refuses an unknown field after."""
    requirements = []
    for part in _split_selector(text):
        if not part.strip():
            continue  # upstream's field selectors skip empty terms
        match = _EQUALITY.match(part)
        if match is None:
            raise ApiError(
                400,
                "BadRequest",
                f"invalid field selector {part.strip()!r}: write field=value or field!=value",
            )
        operator = "!=" if match[2] == "!=" else "="
        requirements.append(Requirement(match[1], operator, frozenset({match[3]})))
    return tuple(requirements)


@dataclasses.dataclass(frozen=True, slots=True)
class Selection:
    """Which objects a request is about: namespace, name, label and field selectors."""

    namespace: str | None = None
    name: str | None = None
    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, obj: JSON) -> bool:
        metadata = obj["metadata"]
        namespace = metadata.get("namespace", "")
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.name is not None and metadata["name"] != self.name:
            return False
        fields = {"metadata.name": metadata["name"], "metadata.namespace": namespace}
        return all(r.matches(metadata.get("labels", {})) for r in self.labels) and all(
            r.matches(fields) for r in self.fields
        )
