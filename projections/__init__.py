"""Pure folds of the log into views, their SQL schema and migrations, the projector, replay.

Depends on ``ledger`` only; never on ``consumers``.
"""
