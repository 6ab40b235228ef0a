"""How Kubernetes spells groups, resources and versions, in one place.

* The core group is the empty string; ``core`` stands for it where a name cannot be
  empty (a StorageVersion's name, a command-line argument).
* A StorageVersion is named ``<group>.<resource>`` (``core.pods``), a StorageState
  ``<resource>.<group>`` (``pods``), as the migration KEP names it, which is also
  Kubernetes' ``GroupResource.String()``.
* A version in a storage version report is group-qualified as upstream writes it
  (``apps/v1``; core ``v1``): ``GroupVersion.String()``.
"""

from __future__ import annotations

from typing import Final

CORE_GROUP_ALIAS: Final = "core"


def parse_group(text: str) -> str:
    """A group as a user writes it: ``core`` (or ``""``) is the core group ``""``."""
    return "" if text == CORE_GROUP_ALIAS else text


def resource_name(group: str, resource: str) -> str:
    """A StorageVersion's name, ``<group>.<resource>``, with ``core`` for the empty group."""
    return f"{group or CORE_GROUP_ALIAS}.{resource}"


def group_resource_string(group: str, resource: str) -> str:
    """Kubernetes' ``GroupResource.String()``: ``<resource>.<group>``, or ``<resource>``."""
    return f"{resource}.{group}" if group else resource


def storage_state_name(group: str, resource: str) -> str:
    """A StorageState's name, ``<resource>.<group>`` as in the migration KEP."""
    return group_resource_string(group, resource)


def group_version(group: str, version: str) -> str:
    """Kubernetes' ``GroupVersion.String()``: ``<group>/<version>``, or ``<version>`` for core."""
    return f"{group}/{version}" if group else version


def split_group_version(text: str) -> tuple[str, str]:
    """The (group, version) of a group-qualified version: ``apps/v1``, or ``v1`` for core.

    Raises ValueError for more than one ``/`` or an empty part.
    """
    group, _, version = text.rpartition("/")
    if not version or "/" in group or (text.startswith("/")):
        raise ValueError(
            f"version {text!r} is not <group>/<version> or <version> (core), e.g. apps/v1 or v1"
        )
    return group, version
