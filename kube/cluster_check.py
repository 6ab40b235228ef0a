"""Whether a worker's kubeconfig reaches the cluster it runs migrations for.

A worker runs one cluster's migrations (``--cluster``) through the API server its
kubeconfig reaches, and nothing in a kubeconfig says which of the ledger's clusters
that is. Given another cluster's, the worker would rewrite that cluster's objects and
record the migrations as done for ``--cluster``, whose StorageStates would then say
its objects are in versions nobody rewrote them to.

So before it starts a migration, the worker compares the holders of the target's
kube-apiserver identity Leases (``kube-system``, label
``apiserver.kubernetes.io/identity=kube-apiserver``) with the holders of the ledger's
leases of the cluster, which the collector copies from the same Leases. A holder
identity (``<apiserver ID>_<uuid>``) is made at random when an apiserver creates its
lease (from 1.35 at every start; before, a restart keeps the lease and its holder), so
one in common means the same cluster; the apiservers of two clusters may share IDs (the same
hostnames), never holders. With none in common the migration waits and is tried again
(:data:`~consumers.worker.CHECK_RETRY_SECONDS`): just after every apiserver of a
cluster restarted, the target holds the new holders a moment before the ledger has them.

Apiservers that report through svledger's reporter have no identity Lease of theirs
in the target; a worker for such a cluster runs with ``--skip-identity-check``.
"""

from __future__ import annotations

from kube.client import ApiError, ClusterUnreachable, Kube
from kube.upstream import NotUpstream, parse_lease
from ledger.identity import IDENTITY_SELECTOR, LEASE_NAMESPACE
from projections.state import State


class IdentityCheck:
    """Says why the target of ``kube`` may not be the ledger's cluster, if it may not."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    async def __call__(self, state: State, cluster: str) -> str | None:
        """None if the target holds a lease holder the ledger's ``cluster`` holds, else why
        its migrations must wait."""
        ledger = {
            lease.holder_identity for lease in state.leases.values() if lease.cluster == cluster
        }
        try:
            target = await self._holders()
        except (ApiError, ClusterUnreachable) as error:
            return (
                f"cannot list the identity Leases of {self._kube.host} to check that it is"
                f" cluster {cluster!r}: {error}; grant the worker `list` on leases in"
                f" {LEASE_NAMESPACE}, or run it with --skip-identity-check"
            )
        return mismatch(ledger, target, cluster, self._kube.host)

    async def _holders(self) -> set[str]:
        page = await self._kube.list(
            "coordination.k8s.io", "v1", "leases", LEASE_NAMESPACE, label_selector=IDENTITY_SELECTOR
        )
        holders = set()
        for item in page.get("items") or ():
            try:
                holders.add(parse_lease(item).holder_identity)
            except NotUpstream:
                continue
        return holders


def mismatch(ledger: set[str], target: set[str], cluster: str, host: str) -> str | None:
    """Why the apiservers holding ``target`` may not be ``cluster``'s, whose leases in the
    ledger are held by ``ledger``; None if they hold one in common."""
    if (ledger & target) - {""}:  # a Lease without a holder is recorded as held by ""
        return None
    return (
        f"the kubeconfig's API server {host} may not be cluster {cluster!r}: its"
        f" kube-apiservers' identity Leases are held by {_listed(target)}, the ledger's"
        f" leases of {cluster!r} by {_listed(ledger)}, none in common. Its migrations wait"
        " until they share one (an apiserver that just restarted is recorded by the"
        " collector within seconds): check --kubeconfig and --context, or run with"
        " --skip-identity-check if the cluster's apiservers report through svledger's"
        " reporter"
    )


def _listed(holders: set[str]) -> str:
    return ", ".join(sorted(holders)) if holders else "nobody"
