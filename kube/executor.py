"""The in-tree executor: kube-controller-manager migrates, svledger decides when.

Kubernetes ships its own storage version migration (KEP-4192): a cluster-scoped
``storagemigration.k8s.io/v1`` StorageVersionMigration names a resource
(``spec.resource: {group, resource}``) and kube-controller-manager's
``storage-version-migrator-controller`` rewrites every object of it (a no-op patch
per object, from the garbage collector's cache), then sets the ``Succeeded`` or
``Failed`` condition. Nothing upstream creates such objects at the right moment:
svledger is the agreement-aware trigger that upstream lacks.

``svledger worker --executor storagemigration`` runs each requested migration as one
such object, named ``svledger-<migration ID>``, in the version of the API the cluster
prefers (``v1`` from 1.37; ``v1beta1`` in 1.35 and 1.36 and ``v1alpha1`` from 1.30 to
1.34, where it must be enabled). ``v1alpha1`` names the version of the resource too, and
its controller finds the resource only in the version discovery prefers (the garbage
collector's cache holds no other), so that is the version it is given, as the
``rewrite`` executor addresses it (:func:`kube.target.served_version`):

* a cluster that does not serve the API (``404``) fails the migration with reason
  ``NotServed`` and a message that says how to enable it;
* create it (an object that exists already is this migration's, from an earlier run
  of the worker: it is followed, not created again) and append ``MigrationStarted``;
* follow its status conditions: ``Succeeded=True`` -> ``MigrationSucceeded``,
  ``Failed=True`` -> ``MigrationFailed`` with the condition's reason and message (the
  migrator then requests it again after its back-off, as a new object); an object
  deleted by someone else fails the migration;
* an API server whose certificate the kubeconfig's CA does not verify fails the
  migration with reason ``RequestFailed``, as the ``rewrite`` executor does: asking
  again would be refused again until the kubeconfig is mended;
* an object no controller has taken (``status.resourceVersion``, which
  kube-controller-manager sets as soon as it runs the object) after
  ``controller_wait_seconds`` is deleted and its migration fails with reason
  ``ControllerNotRunning``: before 1.37 the controller must be enabled, and a migration
  waiting for ever would hold the worker's slot. Unless it is queued: from 1.36 the
  controller runs one object per resource at a time, the oldest first (its
  ``Running`` condition), and sets ``status.resourceVersion`` only on the one it runs
  (1.35 set it on every object at once); while another object of the resource runs
  (one an operator made, say), the wait starts again;
* once its outcome is appended, delete the object: the ledger keeps the record, and
  objects of an alpha version left in etcd break the API after an upgrade (1.35 cannot
  read 1.34's ``v1alpha1`` ones, and every list of them fails); an object that is
  gone because its version is no longer served (an upgrade meanwhile) fails the
  migration with reason ``NotServed``, not ``Deleted``;
* ``events`` (core and ``events.k8s.io``) are rewritten by svledger itself, with the
  ``rewrite`` executor: kube-controller-manager's garbage collector ignores them, and
  its migrator, which lists objects from the collector's cache, can never migrate them
  (it fails, or stays Running for ever);
* on ``MigrationCancelled`` (the apiservers stopped agreeing), delete the object, as
  upstream's trigger deletes a migration it no longer wants. kube-controller-manager's
  controller does not look again at an object it is already running: its pass over
  the resource goes on to the end and only its final status update fails. Rewrites
  are no-op updates, so that pass writes objects in whatever version each apiserver
  encodes; the persisted hashes stay as they were (no success is folded for a
  cancelled migration) and the next migration, requested once the apiservers agree
  again, rewrites every object after it.

The controller's progress is not exposed object by object, so no
``MigrationProgressed`` is appended; a migration stays Running until the garbage
collector's cache has caught up with the resource, measured at 40-80 s, and longer while
another object for the same resource runs (the controller runs one at a time per
resource, the oldest first).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from consumers.targets import TargetError, Transient
from consumers.worker import Append, Executor
from kube.client import ApiError, CertificateError, ClusterUnreachable, Kube
from kube.target import served_version
from ledger.clock import Clock
from ledger.events import Meta, MigrationFailed, MigrationStarted, MigrationSucceeded
from projections.state import Migration

log = logging.getLogger(__name__)

SOURCE: Final = "svledger-worker"
GROUP: Final = "storagemigration.k8s.io"
ALPHA: Final = f"{GROUP}/v1alpha1"
NOT_FOUND: Final = 404
CONFLICT: Final = 409
DELETE_ATTEMPTS: Final = 30  # a poll apart: a minute with the worker's 2 s
# Resources kube-controller-manager's garbage collector ignores (graph_builder.go's
# ignoredResources): its storage version migrator cannot list them.
UNMIGRATABLE: Final = frozenset({("", "events"), ("events.k8s.io", "events")})
# What each release needs for the in-tree migrator, said where it is missing.
ENABLE: Final = (
    f"before 1.37 run every kube-apiserver with --runtime-config={GROUP}/v1beta1=true"
    f" (1.35, 1.36; {GROUP}/v1alpha1=true from 1.30 to 1.34) and"
    " --feature-gates=StorageVersionMigrator=true, and kube-controller-manager with that"
    " gate too (from 1.30 to 1.34 also InformerResourceVersion=true)"
)


def object_name(migration: Migration) -> str:
    """The StorageVersionMigration of a ledger migration: its ID is a UUID, a valid name."""
    return f"svledger-{migration.migration_id}"


def migration_object(
    migration: Migration, group_version: str, version: str | None
) -> dict[str, Any]:
    """The StorageVersionMigration of ``migration`` in ``group_version``; ``version``, the
    resource's version, for ``v1alpha1``, whose ``spec.resource`` requires one."""
    resource = {"group": migration.group, "resource": migration.resource}
    if version is not None:
        resource["version"] = version
    return {
        "apiVersion": group_version,
        "kind": "StorageVersionMigration",
        "metadata": {
            "name": object_name(migration),
            "labels": {"app.kubernetes.io/managed-by": "svledger"},
            "annotations": {
                "svledger.io/target-version": migration.target_version,
                "svledger.io/target-hash": migration.target_hash,
                "svledger.io/storage-version-revision": migration.storage_version_revision,
            },
        },
        "spec": {"resource": resource},
    }


def outcome(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """``("Succeeded" | "Failed", reason, message)`` once the object has ended, else None."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") in ("Succeeded", "Failed") and condition.get("status") == "True":
            return condition["type"], condition.get("reason", ""), condition.get("message", "")
    return None


def _running(obj: Mapping[str, Any]) -> bool:
    """Whether a controller marked the object as the one of its resource it runs."""
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Running" and c.get("status") == "True" for c in conditions)


def _group_resource(obj: Mapping[str, Any]) -> tuple[str, str]:
    resource = (obj.get("spec") or {}).get("resource") or {}
    return resource.get("group", ""), resource.get("resource", "")


@dataclasses.dataclass(frozen=True, slots=True)
class StorageMigrationExecutor:
    """Runs a migration as a StorageVersionMigration and follows it (see the module doc)."""

    kube: Kube
    clock: Clock
    #: Runs the migrations of :data:`UNMIGRATABLE` resources (the rewrite executor).
    rewriter: Executor
    poll_seconds: float = 2.0
    #: How long an object may wait for a controller to take it (see :meth:`run`).
    controller_wait_seconds: float = 300.0

    async def run(
        self, migration: Migration, *, append: Append, cancelled: Callable[[], bool]
    ) -> None:
        def meta() -> Meta:
            return Meta.new(migration.cluster, SOURCE, self.clock.now())

        if (migration.group, migration.resource) in UNMIGRATABLE:
            log.info(
                "rewriting %s.%s itself: kube-controller-manager's migrator cannot list them",
                migration.resource,
                migration.group or "core",
            )
            await self.rewriter.run(migration, append=append, cancelled=cancelled)
            return
        try:
            await self._run(migration, append, meta, cancelled)
        except CertificateError as error:  # as the rewrite target's RequestFailed
            await append([self._failed(migration, meta(), "RequestFailed", str(error))])

    async def _run(
        self,
        migration: Migration,
        append: Append,
        meta: Callable[[], Meta],
        cancelled: Callable[[], bool],
    ) -> None:
        name = object_name(migration)
        # Waiting for the cluster, here and below, ends with the migration: a cancelled
        # one must not hold the worker's slot while its cluster is away.
        try:
            group_version = await self._served_version(cancelled)
        except ApiError as error:  # 404: the cluster does not serve the API
            message = (
                f"the cluster does not serve {GROUP} ({error}): from 1.37 it does by default;"
                f" {ENABLE}; or use --executor rewrite"
            )
            await append([self._failed(migration, meta(), "NotServed", message)])
            return
        if group_version is None:
            return
        path = f"/apis/{group_version}/storageversionmigrations"
        if migration.phase == "Pending":
            if not await self._create(migration, group_version, name, append, meta, cancelled):
                return
            await append([MigrationStarted(meta(), migration.migration_id)])
        # kube-controller-manager's controllers set status.resourceVersion first, once
        # they run the object. An object still without it after controller_wait_seconds
        # has no controller, unless it is queued behind another of its resource: before
        # 1.37 the controller must be enabled, and a migration that waited for ever
        # would hold the worker's slot.
        following = self.clock.now()
        taken = False
        while True:
            if cancelled():
                await self._delete(path, name, "cancelled")
                return
            try:
                obj = await self.kube.get(f"{path}/{name}")
            except ApiError as error:
                if error.status == NOT_FOUND:
                    reason, message = await self._gone(group_version, name, cancelled)
                    if not cancelled():  # a cancelled migration has its end already
                        await append([self._failed(migration, meta(), reason, message)])
                    return
                log.warning("reading %s: %s; retrying", name, error)
                obj = {}
            except ClusterUnreachable as error:
                log.warning("reading %s: %s; retrying", name, error)
                obj = {}
            ended = outcome(obj)
            if ended is not None:
                kind, reason, message = ended
                if kind == "Succeeded":
                    await append([MigrationSucceeded(meta(), migration.migration_id)])
                else:
                    await append([self._failed(migration, meta(), reason, message)])
                await self._delete(path, name, kind.lower())
                return
            # From 1.36 the controller marks the object it runs Running, then sets its
            # status.resourceVersion; either says a controller took it.
            taken = taken or _running(obj) or bool((obj.get("status") or {}).get("resourceVersion"))
            waited = (self.clock.now() - following).total_seconds()
            if obj and not taken and waited >= self.controller_wait_seconds:
                try:
                    ahead = await self._ahead(path, name, obj)
                except ClusterUnreachable as error:
                    log.warning("listing %s: %s; retrying", path, error)
                    await self.clock.sleep(self.poll_seconds)
                    continue
                if ahead is not None:
                    log.warning(
                        "%s is queued behind %s, which a controller has been running for"
                        " over %.0f s; waiting on",
                        name,
                        ahead,
                        waited,
                    )
                    following = self.clock.now()
                    await self.clock.sleep(self.poll_seconds)
                    continue
                await self._delete(path, name, "not taken")
                message = (
                    f"no controller took {name} in {waited:.0f} s (its status has no"
                    " resourceVersion): run kube-controller-manager with its"
                    f" storage-version-migrator-controller and garbage collector ({ENABLE}),"
                    " or use --executor rewrite"
                )
                await append([self._failed(migration, meta(), "ControllerNotRunning", message)])
                return
            await self.clock.sleep(self.poll_seconds)

    async def _ahead(self, path: str, name: str, obj: Mapping[str, Any]) -> str | None:
        """Another object of ``obj``'s resource that a controller runs (``Running=True``,
        not ended), which ``name`` is queued behind, if one is. Refused the list (a role
        without ``list``), it cannot tell: none, so a migration no controller takes
        still ends."""
        resource = _group_resource(obj)
        try:
            listed = await self.kube.get(path)
        except ApiError as error:
            log.warning("listing %s to find a queue: %s", path, error)
            return None
        for item in listed.get("items") or ():
            other = (item.get("metadata") or {}).get("name")
            if other == name or _group_resource(item) != resource or outcome(item) is not None:
                continue
            if _running(item):
                return str(other)
        return None

    async def _served_version(self, cancelled: Callable[[], bool]) -> str | None:
        """The group version of StorageVersionMigration the cluster prefers (see the
        module docstring), asked until the cluster answers; None if the migration is
        cancelled meanwhile. Raises the :class:`ApiError` of a 404: not served."""
        while not cancelled():
            try:
                group = await self.kube.get(f"/apis/{GROUP}")
                version: str = group["preferredVersion"]["groupVersion"]
                return version
            except (ApiError, ClusterUnreachable) as error:
                if isinstance(error, ApiError) and error.status == NOT_FOUND:
                    raise
                log.warning("asking for %s: %s; asking again", GROUP, error)
                await self.clock.sleep(self.poll_seconds)
        return None

    async def _create(
        self,
        migration: Migration,
        group_version: str,
        name: str,
        append: Append,
        meta: Callable[[], Meta],
        cancelled: Callable[[], bool],
    ) -> bool:
        """Create the migration's object; False if the migration is over instead (it
        failed to be created, or was cancelled while the cluster was away: an attempt
        that reached the cluster unanswered may have created it, and the in-tree
        migrator then rewrites the resource once more, which changes no object)."""
        path = f"/apis/{group_version}/storageversionmigrations"
        while True:
            if cancelled():
                return False
            try:
                version = None
                if group_version == ALPHA:
                    version = await served_version(self.kube, migration.group, migration.resource)
                body = migration_object(migration, group_version, version)
                await self.kube.request("POST", path, body)
                break
            except (ClusterUnreachable, Transient) as error:  # an apiserver restarting
                log.warning("creating %s: %s; retrying", name, error)
                await self.clock.sleep(self.poll_seconds)
            except (ApiError, TargetError) as error:  # TargetError: discovery's refusals
                if isinstance(error, ApiError) and error.status == CONFLICT:
                    return True  # created by an earlier run of this worker: follow it
                failed = self._failed(
                    migration, meta(), "CreateFailed", f"creating {name}: {error}"
                )
                await append([failed])
                return False
        log.info("created StorageVersionMigration %s", name, extra={"migration": name})
        return True

    async def _gone(
        self, group_version: str, name: str, cancelled: Callable[[], bool]
    ) -> tuple[str, str]:
        """Why ``name`` is not found: its API version is no longer served (the cluster
        was upgraded meanwhile), or someone deleted it. The reason and message to fail
        its migration with."""
        try:
            served = await self._served_version(cancelled)
        except ApiError:
            served = None
        if served == group_version:
            return "Deleted", f"{name} was deleted"
        now = f"serves {GROUP} as {served}" if served else f"no longer serves {GROUP}"
        return "NotServed", (
            f"{name} is gone: the cluster {now}, not {group_version} (upgraded meanwhile?);"
            " the migrator requests the migration again after its back-off"
        )

    async def _delete(self, path: str, name: str, why: str) -> None:
        """Delete ``name``, trying again for a while if the cluster is away: its migration
        has ended, and must not hold the worker's slot for long over a leftover."""
        for attempt in range(DELETE_ATTEMPTS):
            try:
                await self.kube.request("DELETE", f"{path}/{name}")
            except ClusterUnreachable as error:  # an apiserver restarting: try again
                if attempt + 1 == DELETE_ATTEMPTS:
                    log.warning(
                        "could not delete StorageVersionMigration %s (%s): %s; delete it"
                        " by hand (kubectl delete storageversionmigrations %s)",
                        name,
                        why,
                        error,
                        name,
                    )
                    return
                log.warning("deleting %s: %s; retrying", name, error)
                await self.clock.sleep(self.poll_seconds)
                continue
            except (ApiError, CertificateError) as error:
                if not isinstance(error, ApiError) or error.status != NOT_FOUND:
                    log.warning("deleting %s: %s", name, error)
            else:
                log.info("deleted StorageVersionMigration %s: %s", name, why)
            return

    @staticmethod
    def _failed(migration: Migration, meta: Meta, reason: str, message: str) -> MigrationFailed:
        return MigrationFailed(
            meta,
            migration.migration_id,
            migration.objects_migrated,
            migration.continue_token,
            reason=reason or "Failed",
            message=message,
        )
