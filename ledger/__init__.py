"""The log: event types, Avro codec, Kafka I/O, the embedded reporter, hashing, identity.

``ledger`` imports neither ``projections`` nor ``consumers``.
"""
