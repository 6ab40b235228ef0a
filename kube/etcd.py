"""A cluster's etcd, read only, for ``svledger audit``: the only module that talks to etcd.

Through etcd's gRPC-JSON gateway (``/v3/``, on by default on every etcd, kubeadm's
included) with ``etcd3gw``, OpenStack's maintained client, rather than through gRPC: it
needs neither grpcio nor generated protobuf code (the gRPC clients pin protobuf
versions, and the asyncio ones are unmaintained or lack TLS or paging), has no 4 MiB
answer limit, and its TLS failures carry Python's own reasons
(``TLSV1_ALERT_UNKNOWN_CA``, ``CERTIFICATE_VERIFY_FAILED``) where gRPC's say
``TSI_DATA_CORRUPTED``. What it costs is measured by ``bench/audit_bench.py`` alone
(``docs/development.md``): 100,000 keys of ~500 bytes at one revision from a local etcd
over plain HTTP, unpaced, in pages of 1,000 about 28,000 to 29,000 keys/s, in pages of
500 about 18,700; the audit's default pace (20 pages a second) allows 10,000 keys/s. No
gRPC client was measured here, so whether one would read faster is not known. It is
synchronous: each request runs in a thread.

Only reads are made: the current revision (``Maintenance.Status``), and ranges at a
given revision, counted (``count_only``) or paged (``limit``), never sorted (a sorted
limited range makes etcd read the rest of it first). The client gets a session of its
own that ignores the environment: ``REQUESTS_CA_BUNDLE`` would silently replace the CA
given, and a proxy has no business between an auditor and etcd.

Every failure is an :class:`EtcdError` that names the server and says what to check:
unreachable, no answer in time, TLS refused (the reason kept: a client certificate etcd
does not accept, a CA that does not verify etcd's, a file that cannot be read), a
revision compacted meanwhile (audit again), the gateway off. With several
``--etcd-servers``, the first that answers the revision is read, as one member's
revision is every member's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import urlsplit

import requests
from etcd3gw import Etcd3Client
from etcd3gw import exceptions as gateway

from ledger.errors import UsageError

TIMEOUT_SECONDS: Final = 30.0
# What Python says of a TLS handshake etcd ended for the client's certificate: none given
# (TLS 1.3), or one of a CA etcd does not trust (etcd 3.7 closes the connection without
# an alert under TLS 1.3; older servers send one).
_CERTIFICATE_REFUSED: Final = (
    "CERTIFICATE_REQUIRED",
    "EOF occurred in violation of protocol",
    "ALERT_BAD_CERTIFICATE",
    "ALERT_UNKNOWN_CA",
)


class EtcdError(UsageError):
    """etcd could not be read; the message names the server and what to check."""


@dataclasses.dataclass(frozen=True, slots=True)
class EtcdSettings:
    """kube-apiserver's ``--etcd-servers``, ``--etcd-cafile``, ``--etcd-certfile``,
    ``--etcd-keyfile``."""

    servers: tuple[str, ...]
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    timeout: float = TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if not self.servers:
            raise EtcdError("--etcd-servers names no server: give etcd's client URL")
        for server in self.servers:
            parts = urlsplit(server)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise EtcdError(
                    f"--etcd-servers {server!r} is not an etcd client URL such as"
                    " https://127.0.0.1:2379"
                )
            if parts.scheme == "https" and not self.cafile:
                raise EtcdError(
                    f"{server} is https: give --etcd-cafile (and --etcd-certfile and"
                    " --etcd-keyfile, as kube-apiserver has them)"
                )
        if (self.certfile is None) != (self.keyfile is None):
            raise EtcdError("--etcd-certfile and --etcd-keyfile go together: give both")


class EtcdStore:
    """Read-only requests to one etcd server (see the module doc)."""

    def __init__(self, server: str, settings: EtcdSettings) -> None:
        parts = urlsplit(server)
        session = requests.Session()
        session.trust_env = False
        if parts.scheme == "https":
            session.verify = settings.cafile or True
            if settings.certfile and settings.keyfile:
                session.cert = (settings.certfile, settings.keyfile)
        self.server = server
        self._cafile = settings.cafile
        self._certfile = settings.certfile
        self._client = Etcd3Client(
            host=parts.hostname or "",
            port=parts.port or 2379,
            protocol=parts.scheme,
            timeout=settings.timeout,
            session=session,
            api_path="/v3/",
        )
        self._session = session

    async def revision(self) -> int:
        status = await self._call(self._client.status)
        return int(status["header"]["revision"])

    async def count(self, start: bytes, end: bytes, revision: int) -> int:
        body = {
            "key": base64.b64encode(start).decode(),
            "range_end": base64.b64encode(end).decode(),
            "revision": revision,
            "count_only": True,
        }
        answer = await self._call(self._client.post, self._client.get_url("/kv/range"), json=body)
        return int(answer.get("count", 0))

    async def page(
        self, start: bytes, end: bytes, revision: int, limit: int
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        found = await self._call(
            self._client.get, start, metadata=True, range_end=end, revision=revision, limit=limit
        )
        pairs = [(meta["key"], value) for value, meta in found]
        # The gateway's JSON carries each key and value in base64: a third more than they.
        size = sum(len(key) + len(value) for key, value in pairs) * 4 // 3
        return pairs, size

    async def close(self) -> None:
        self._session.close()

    async def _call(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except gateway.ConnectionTimeoutError as error:
            raise EtcdError(
                f"etcd at {self.server} did not answer within its timeout: {_detail(error)}"
            ) from None
        except gateway.ConnectionFailedError as error:
            detail = _detail(error)
            if any(reason in detail for reason in _CERTIFICATE_REFUSED):
                given = (
                    f"the client certificate {self._certfile}"
                    if self._certfile
                    else "a client without a certificate"
                )
                raise EtcdError(
                    f"etcd at {self.server} did not accept {given} ({detail}): give"
                    " --etcd-certfile and --etcd-keyfile as kube-apiserver has them, a"
                    " certificate signed by a CA etcd trusts (its --trusted-ca-file)"
                ) from None
            if "CERTIFICATE_VERIFY_FAILED" in detail:
                raise EtcdError(
                    f"etcd at {self.server} has a certificate that --etcd-cafile {self._cafile}"
                    f" does not verify ({detail}): give the CA that signed it, as kube-apiserver's"
                    " --etcd-cafile"
                ) from None
            raise EtcdError(
                f"cannot reach etcd at {self.server}: {detail}; check --etcd-servers and,"
                " for TLS, --etcd-cafile, --etcd-certfile and --etcd-keyfile"
            ) from None
        except gateway.Etcd3Exception as error:
            detail = _detail(error)
            if "compacted" in detail:
                raise EtcdError(
                    f"etcd at {self.server} compacted past the audit's revision while it read"
                    f" ({detail}): audit again (a larger --page-size or a higher"
                    " --requests-per-second reads faster)"
                ) from None
            if "404" in detail:
                raise EtcdError(
                    f"etcd at {self.server} serves no gRPC gateway ({detail}): run etcd with"
                    " --enable-grpc-gateway (its default)"
                ) from None
            raise EtcdError(f"etcd at {self.server} refused a read: {detail}") from None
        except OSError as error:  # a TLS file that cannot be read
            raise EtcdError(
                f"etcd at {self.server}: {error}; check --etcd-cafile, --etcd-certfile and"
                " --etcd-keyfile"
            ) from None


def _detail(error: gateway.Etcd3Exception) -> str:
    """The words an etcd3gw exception carries (its ``str`` is often empty)."""
    text = str(getattr(error, "detail_text", "") or error or type(error).__name__)
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text).get("message", text))
    return text.strip()


@contextlib.asynccontextmanager
async def open_store(settings: EtcdSettings) -> AsyncIterator[EtcdStore]:
    """The first of ``settings.servers`` that answers; :class:`EtcdError` if none does."""
    failures = []
    for server in settings.servers:
        store = EtcdStore(server, settings)
        try:
            await store.revision()
        except EtcdError as error:
            await store.close()
            failures.append(str(error))
            continue
        try:
            yield store
        finally:
            await store.close()
        return
    raise EtcdError("; ".join(failures))
