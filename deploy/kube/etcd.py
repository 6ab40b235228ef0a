"""A lone etcd on this machine, of the local cluster's release, and its JSON gateway.

For what reads etcd without a cluster around it: the audit's bench (``bench/audit_bench.py``)
and its error tests (``tests/integration/test_audit_errors.py``), which need an etcd of
their own, plain or serving mutual TLS, to load and to break.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from deploy.kube.cluster import DEFAULT_VERSION, binaries, etcd_command, free_port
from deploy.kube.processes import Process

STARTUP_SECONDS: Final = 60.0
TXN_PUTS: Final = 1000  # etcd's --max-txn-ops is raised to this; its default is 128


@contextlib.contextmanager
def local_etcd(
    workdir: Path, *args: str, tls: tuple[Path, Path, Path] | None = None
) -> Iterator[str]:
    """An etcd of the local cluster's release (``deploy/kube``) on a free 127.0.0.1 port,
    its data in ``workdir``, fsync off, until the block ends: its client URL. ``args`` are
    added to its command line. With ``tls`` (CA file, certificate, key) it serves https
    with that certificate and asks every client for one signed by that CA; the
    certificate must be good for ``127.0.0.1`` both as a server's and as a client's (it
    is the one its health is checked with)."""
    binary = binaries(DEFAULT_VERSION, ("etcd",)) / "etcd"
    client = f"{'https' if tls else 'http'}://127.0.0.1:{free_port()}"
    peer = f"http://127.0.0.1:{free_port()}"
    security: list[str] = []
    context = None
    if tls is not None:
        ca, cert, key = tls
        security = [
            f"--trusted-ca-file={ca}",
            f"--cert-file={cert}",
            f"--key-file={key}",
            "--client-cert-auth",
        ]
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(cert, key)
    process = Process("etcd", workdir / "etcd.log")
    process.start([*etcd_command(binary, workdir / "etcd", client, peer), *security, *args])
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            process.check_alive()
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=5, context=context):
                    break
            except (OSError, ValueError) as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"etcd did not answer at {client}/health within {STARTUP_SECONDS:g} s"
                        f" ({error}).\n{process.log_tail()}"
                    ) from None
            time.sleep(0.1)
        yield client
    finally:
        process.stop(10)


def gateway(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to etcd's JSON gateway at ``url`` (``/v3/kv/txn``, ...): its answer."""
    request = urllib.request.Request(
        f"{url}/v3/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        found: dict[str, Any] = json.loads(answer.read())
    return found


def put_all(url: str, pairs: Sequence[tuple[str, bytes]]) -> None:
    """Put every (key, value) through the gateway, :data:`TXN_PUTS` to a transaction."""
    for start in range(0, len(pairs), TXN_PUTS):
        puts = [
            {
                "request_put": {
                    "key": base64.b64encode(key.encode()).decode(),
                    "value": base64.b64encode(value).decode(),
                }
            }
            for key, value in pairs[start : start + TXN_PUTS]
        ]
        gateway(url, "kv/txn", {"success": puts})
