"""The read side a Kubernetes user knows: a Kubernetes-style HTTP API over the ledger's
views (``svledger serve``), now and at any past log position, and the timeline page.

Above the projections and below the command line; it never appends to the log.
"""
