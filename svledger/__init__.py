"""The ``svledger`` command: the public face over ``ledger``, ``projections`` and ``consumers``."""
