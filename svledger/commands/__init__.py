"""The subcommands, one module per family; :data:`COMMANDS` in the order ``--help`` lists them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from svledger.commands import log, operators, serve, services, simulate, timeline, tools
from svledger.options import Subparsers

COMMANDS: Final[tuple[Callable[[Subparsers], None], ...]] = (
    simulate.add_simulate,
    log.add_topics,
    log.add_db,
    log.add_project,
    services.add_collect,
    services.add_admit,
    services.add_lease_gc,
    services.add_migrator,
    services.add_worker,
    operators.add_migrations,
    operators.add_storagestate,
    operators.add_audit,
    log.add_replay,
    log.add_history,
    log.add_explain,
    timeline.add_timeline,
    serve.add_serve,
    tools.add_hash,
    tools.add_apiserver_id,
)
