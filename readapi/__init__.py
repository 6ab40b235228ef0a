"""The read side a Kubernetes user knows: a Kubernetes-style HTTP API over the ledger's
views (``svledger serve``), now and at any past log position, and the timeline page.

Above the projections and below the command line; it never appends to the log.
"""

from typing import Final

# Defaults of ``svledger serve``, here so the command line can show them without
# importing the server (:mod:`readapi.ledger` uses them).
CHECKPOINT_EVERY: Final = 20_000  # records of a partition between two kept folds
RECENT_CHECKPOINTS: Final = 16  # kept at that spacing; older ones twice as sparse, and so on
WATCH_WINDOW: Final = 2_000  # changes per cluster kept for watches, at most
WATCH_BUDGET: Final = 200_000  # changes kept for watches across all clusters, at most
WATCH_FLOOR: Final = 100  # changes each cluster keeps whatever the budget (upstream's least)
