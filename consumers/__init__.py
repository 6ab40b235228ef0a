"""Processes that react to the log by appending events: lease GC, migrator, worker, simulation."""
