"""A real Kubernetes control plane on 127.0.0.1 (etcd, N kube-apiservers) for tests and demos.

The binaries are the ones ``build.py`` beside this file compiles and caches (see there),
each asked for when first needed, so that a release's others are never built for nothing:
etcd and kube-apiserver of the cluster's release at ``start()``, kube-apiserver of the
release an apiserver restarts into, kube-controller-manager in ``start_controller_manager()``.
``LocalCluster`` starts one etcd (data in a fresh temporary directory, fsync off: nothing
here outlives the instance) and N kube-apiservers against it, each on a free port, and
returns only once every apiserver answers ``/readyz``. ``stop()`` ends every process (SIGTERM,
then SIGKILL if one hangs) and deletes the directory.

Each apiserver runs in its own UTS namespace under its own hostname (``kube-apiserver-0``,
``kube-apiserver-1``, ...), because an apiserver's identity (its ``APIServerID``, the name of
its identity lease ``kube-system/apiserver-<hash>`` and its ``apiServerID`` in
StorageVersion objects) is a hash of the hostname: several apiservers on one host would
otherwise share one identity. The namespace comes from ``unshare --uts`` (as root) or
``unshare --user --map-root-user --uts`` (otherwise, where user namespaces are allowed).
``restart_apiserver(i)`` keeps apiserver ``i``'s hostname and port, so it comes back with the
same identity, possibly running another release (a rolling upgrade).

Every apiserver runs as upstream's defaults have it, as the clusters people run do: the
StorageVersion API (the ``StorageVersionAPI`` gate and ``internal.apiserver.k8s.io/v1alpha1``,
alpha and off by default) is not served, the APIServerIdentity gate is left at its default
(on: each apiserver keeps an identity lease), and built-in kinds are stored in etcd as
protobuf (custom resources as JSON), as without ``--storage-media-type``. The one departure
is ``storagemigration.k8s.io`` on v1.36 (the ``StorageVersionMigrator`` gate and
``storagemigration.k8s.io/v1beta1``, a beta API off by default; served by default from
v1.37), because svledger's in-tree executor and kube-controller-manager's migrator need it
on both releases of the rolling upgrade. ``LocalCluster(storage_version_api=True)`` turns
the alpha StorageVersion API on (gate and runtime config), for the tests about it. Each
apiserver also authenticates a random admin token (group ``system:masters``) from a
static token file, authorizes with RBAC, signs service-account tokens with a key pair shared
by all apiservers, and serves TLS with a certificate for ``127.0.0.1`` from a CA of its own
(``ca_file``), so clients can verify it. A shutdown takes about two seconds
(``--shutdown-watch-termination-grace-period=2s``, no shutdown delay). The identity-lease
timings (upstream: 3600 s leases renewed every 10 s, expired ones collected hourly) are
constructor parameters, passed to the wrapper main through environment variables.

``start_controller_manager()`` adds a kube-controller-manager running the storage version
migrator, the garbage collector it needs and, with the StorageVersion API on, the
StorageVersion garbage collector, which removes an apiserver's entries from StorageVersion
objects once its identity lease is gone (it runs with the apiservers' gates; without the
API it disables itself).

``etcd_get_prefix()`` reads raw keys and values through etcd's v3 JSON gateway
(``POST /v3/kv/range``), so no etcdctl is needed. The values are the bytes kube-apiserver
wrote, protobuf for built-in kinds: ``kube.stored.decode`` (the product's decoder) tells the
kind and version each one was stored as. Each process logs to a file in the
temporary directory; a process that fails to start or exits raises ``ProcessError`` with the
end of its log (``processes.py`` beside this file: the children, forked so that they end
with the Python process).

Stdlib only (plus ``openssl`` and ``unshare`` on PATH)::

    # print a kubeconfig path, serve until SIGINT/SIGTERM:
    python deploy/kube/cluster.py run --apiservers 3 [--controller-manager] [--storage-version-api]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent


def _load_script(name: str, path: Path) -> ModuleType:
    # build.py, processes.py and the broker's script are loaded by path, not as package
    # modules, so that this file works however it is run (python cluster.py, runpy, an
    # import from tests).
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_BUILD = _load_script("svledger_kube_build", HERE / "build.py")
DEFAULT_VERSION: str = _BUILD.DEFAULT_VERSION
free_port = _load_script("svledger_kafka_broker", HERE.parent / "kafka" / "broker.py").free_port
if TYPE_CHECKING:  # the same module, as mypy finds it
    from deploy.kube.processes import Process, ProcessError
else:
    _PROCESSES = _load_script("svledger_kube_processes", HERE / "processes.py")
    Process, ProcessError = _PROCESSES.Process, _PROCESSES.ProcessError

#: The controllers ``start_controller_manager()`` runs unless told otherwise.
DEFAULT_CONTROLLERS = (
    "storage-version-migrator-controller",
    "garbage-collector-controller",
    "storageversion-garbage-collector-controller",
)

_ADMIN_USER = "svledger-admin"
_HOSTNAME_PREFIX = "kube-apiserver"
_SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ClusterError(ProcessError):
    """The local cluster could not be started or used. A process of it that is not
    running or exited raises the base class, :class:`ProcessError`, with its log's end."""


def binaries(version: str, names: Sequence[str]) -> Path:
    """The directory holding ``version``'s binaries ``names``, built first if need be."""
    try:
        directory: Path = _BUILD.binaries(version, names)
    except _BUILD.BuildError as error:
        raise ClusterError(
            f"could not build {', '.join(names)} of Kubernetes {version}: {error}"
        ) from error
    return directory


def minor_version(version: str) -> int:
    """``v1.37.2`` -> ``37``."""
    parts = version.removeprefix("v").split(".")
    if len(parts) < 2 or parts[0] != "1" or not (parts[1].isascii() and parts[1].isdigit()):
        raise ClusterError(
            f"{version!r} is not a Kubernetes release version like {DEFAULT_VERSION}"
        )
    return int(parts[1])


def apiserver_feature_gates(version: str, storage_version_api: bool = False) -> dict[str, bool]:
    """The ``--feature-gates`` a kube-apiserver of ``version`` runs with: upstream's
    defaults but for those named here."""
    gates: dict[str, bool] = {}
    if minor_version(version) < 37:
        # GA (and on by default) from v1.37; a beta gate, off by default, before.
        gates["StorageVersionMigrator"] = True
    if storage_version_api:
        gates["StorageVersionAPI"] = True  # alpha, off by default
    return gates


def apiserver_runtime_config(version: str, storage_version_api: bool = False) -> dict[str, bool]:
    """The ``--runtime-config`` a kube-apiserver of ``version`` runs with: upstream's
    defaults but for those named here."""
    config: dict[str, bool] = {}
    minor = minor_version(version)
    if minor < 37:
        # storagemigration.k8s.io/v1 is served by default from v1.37; v1beta1 (1.35,
        # 1.36) and v1alpha1 (1.30 to 1.34, which know no v1beta1) are off by default.
        config[f"storagemigration.k8s.io/{'v1beta1' if minor >= 35 else 'v1alpha1'}"] = True
    if storage_version_api:
        config["internal.apiserver.k8s.io/v1alpha1"] = True
    return config


def controller_manager_feature_gates(
    version: str, storage_version_api: bool = False
) -> dict[str, bool]:
    """The ``--feature-gates`` of ``start_controller_manager()``'s kube-controller-manager."""
    # The apiservers' gates: the StorageVersion GC controller runs only with
    # StorageVersionAPI (and APIServerIdentity, on by default) and disables itself
    # without; the migrator needs its own gate before v1.37, and before v1.35 client-go's
    # InformerResourceVersion (alpha).
    gates = apiserver_feature_gates(version, storage_version_api)
    if minor_version(version) < 35:
        gates["InformerResourceVersion"] = True
    return gates


def _flags(name: str, values: Mapping[str, bool]) -> list[str]:
    """``--name=key=value,...``, or nothing when ``values`` is empty (upstream's defaults)."""
    if not values:
        return []
    return [f"--{name}=" + ",".join(f"{key}={str(value).lower()}" for key, value in values.items())]


@dataclass
class _APIServer:
    index: int
    hostname: str
    port: int
    version: str
    process: Process
    cert_dir: Path
    extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


class LocalCluster:
    """etcd and ``apiservers`` kube-apiservers on free 127.0.0.1 ports, from start() to stop().

    ``version`` is the release every apiserver starts with (each can be restarted with
    another) and whose etcd is used. The identity-lease parameters override upstream's
    3600 s lease duration, 10 s renew interval and 3600 s expired-lease GC period (seconds;
    ``None`` keeps upstream's). ``storage_version_api`` serves the alpha StorageVersion API
    (``internal.apiserver.k8s.io/v1alpha1``), off by default as upstream's. ``extra_apiserver_args``
    are appended to every apiserver's command line, after the defaults, so they can override
    them.
    """

    def __init__(
        self,
        apiservers: int = 1,
        *,
        version: str = DEFAULT_VERSION,
        identity_lease_duration_seconds: int | None = None,
        identity_lease_renew_interval: float | None = None,
        identity_lease_gc_period: float | None = None,
        storage_version_api: bool = False,
        extra_apiserver_args: Sequence[str] = (),
        startup_timeout: float = 180.0,
        shutdown_timeout: float = 60.0,
    ) -> None:
        if apiservers < 1:
            raise ClusterError("a cluster needs at least one apiserver")
        minor_version(version)
        self._count = apiservers
        self._version = version
        self._lease_env = _lease_environment(
            identity_lease_duration_seconds, identity_lease_renew_interval, identity_lease_gc_period
        )
        self._storage_version_api = storage_version_api
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._startup_timeout = startup_timeout
        self._shutdown_timeout = shutdown_timeout
        self._workdir: Path | None = None
        self._token = ""
        self._etcd: Process | None = None
        self._etcd_port = 0
        self._apiservers: list[_APIServer] = []
        self._controller_manager: Process | None = None
        self._controller_manager_port = 0

    # ----- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        """Start etcd and every apiserver; return once each apiserver's ``/readyz`` is ok."""
        if self._workdir is not None:
            raise ClusterError("the cluster is already started")
        binary_dir = binaries(self._version, ("etcd", "kube-apiserver"))
        for tool in ("openssl", "unshare"):
            _require_tool(tool)
        self._workdir = Path(tempfile.mkdtemp(prefix="svledger-kube-"))
        try:
            self._token = secrets.token_hex(24)
            self._write_credentials()
            self._start_etcd(binary_dir / "etcd")
            self._apiservers = [
                _APIServer(
                    index=index,
                    hostname=f"{_HOSTNAME_PREFIX}-{index}",
                    port=free_port(),
                    version=self._version,
                    process=Process(
                        f"kube-apiserver {index}", self._workdir / f"apiserver-{index}.log"
                    ),
                    cert_dir=self._workdir / f"apiserver-{index}",
                )
                for index in range(self._count)
            ]
            for server in self._apiservers:
                self._spawn_apiserver(server)
            deadline = time.monotonic() + self._startup_timeout
            for server in self._apiservers:
                self._wait_until_ready(server, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process and delete the cluster's directory; safe to repeat."""
        if self._controller_manager is not None:
            self._controller_manager.stop(self._shutdown_timeout)
        # Signal every apiserver first so they shut down side by side, then wait for each.
        for server in self._apiservers:
            server.process.terminate()
        for server in self._apiservers:
            server.process.stop(self._shutdown_timeout)
        if self._etcd is not None:
            self._etcd.stop(self._shutdown_timeout)
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise ClusterError, with the end of its log, if a process that should run has exited."""
        self._require_started()
        assert self._etcd is not None
        self._etcd.check_alive()
        for server in self._apiservers:
            if server.process.popen is not None:
                server.process.check_alive()
        if self._controller_manager is not None and self._controller_manager.popen is not None:
            self._controller_manager.check_alive()

    # ----- apiservers --------------------------------------------------------------------

    def start_apiserver(self, index: int, version: str | None = None) -> None:
        """Start stopped apiserver ``index`` and wait for its ``/readyz``.

        It runs ``version``, by default the release it ran last.
        """
        server = self._server(index)
        if server.process.running:
            raise ClusterError(f"kube-apiserver {index} is already running at {server.url}")
        if version is not None:
            minor_version(version)
            server.version = version
        self._spawn_apiserver(server)
        self._wait_until_ready(server, time.monotonic() + self._startup_timeout)

    def stop_apiserver(self, index: int) -> None:
        """Stop apiserver ``index`` gracefully (SIGTERM) and wait until it has exited."""
        self._server(index).process.stop(self._shutdown_timeout)

    def kill_apiserver(self, index: int) -> None:
        """Kill apiserver ``index`` (SIGKILL): no graceful shutdown, its lease is left to expire."""
        self._server(index).process.kill()

    def pause_apiserver(self, index: int) -> None:
        """Freeze apiserver ``index`` (SIGSTOP): it neither serves nor renews its lease
        until :meth:`resume_apiserver`, and it keeps its state (no restart, no
        re-registration of its StorageVersion entries)."""
        self._server(index).process.signal(signal.SIGSTOP)

    def resume_apiserver(self, index: int) -> None:
        """Let a paused apiserver ``index`` run on (SIGCONT)."""
        self._server(index).process.signal(signal.SIGCONT)

    def restart_apiserver(self, index: int, version: str | None = None) -> None:
        """Stop apiserver ``index`` and start it again, same hostname (identity) and port."""
        self.stop_apiserver(index)
        self.start_apiserver(index, version)

    def is_running(self, index: int) -> bool:
        """Whether apiserver ``index``'s process is running."""
        return self._server(index).process.running

    @property
    def workdir(self) -> Path:
        """The cluster's temporary directory: logs, keys, etcd data; deleted by ``stop()``."""
        return self._require_started()

    @property
    def urls(self) -> list[str]:
        """Each apiserver's URL, ``https://127.0.0.1:PORT``, by index (running or not)."""
        self._require_started()
        return [server.url for server in self._apiservers]

    @property
    def apiserver_hostnames(self) -> list[str]:
        """Each apiserver's hostname, by index (label ``kubernetes.io/hostname`` of its lease)."""
        self._require_started()
        return [server.hostname for server in self._apiservers]

    @property
    def apiserver_versions(self) -> list[str]:
        """The release each apiserver runs (or last ran), by index."""
        self._require_started()
        return [server.version for server in self._apiservers]

    def apiserver_log(self, index: int) -> Path:
        """The log file of apiserver ``index`` (all its runs, appended)."""
        return self._server(index).process.log_path

    @property
    def token(self) -> str:
        """The admin bearer token (user ``svledger-admin``, group ``system:masters``)."""
        self._require_started()
        return self._token

    @property
    def ca_file(self) -> Path:
        """The CA certificate that signed every apiserver's serving certificate."""
        return self._require_started() / "pki" / "ca.crt"

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts the apiservers' CA."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def write_kubeconfig(self, path: Path | str, server_index: int | None = None) -> Path:
        """Write a kubeconfig: one context per apiserver (``apiserver-<i>``), the admin token.

        The current context is ``apiserver-<server_index>``, or that of the first running
        apiserver when ``server_index`` is None.
        """
        self._require_started()
        if server_index is None:
            running = [server.index for server in self._apiservers if server.process.running]
            server_index = running[0] if running else 0
        self._server(server_index)
        ca_data = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": f"apiserver-{server.index}",
                    "cluster": {"server": server.url, "certificate-authority-data": ca_data},
                }
                for server in self._apiservers
            ],
            "users": [{"name": _ADMIN_USER, "user": {"token": self._token}}],
            "contexts": [
                {
                    "name": f"apiserver-{server.index}",
                    "context": {"cluster": f"apiserver-{server.index}", "user": _ADMIN_USER},
                }
                for server in self._apiservers
            ],
            "current-context": f"apiserver-{server_index}",
        }
        target = Path(path)
        target.write_text(json.dumps(config, indent=2) + "\n")
        target.chmod(0o600)
        return target

    def request(
        self,
        path: str,
        *,
        server_index: int = 0,
        method: str = "GET",
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        """One HTTP request as the admin to apiserver ``server_index``; returns (status, body)."""
        server = self._server(server_index)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(
            server.url + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(
                request, timeout=timeout, context=self.ssl_context()
            ) as response:
                status: int = response.status
                return status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def get_json(self, path: str, *, server_index: int = 0) -> Any:
        """GET ``path`` from apiserver ``server_index`` as JSON; raise ClusterError unless 200."""
        status, payload = self.request(path, server_index=server_index)
        if status != 200:
            raise ClusterError(
                f"GET {path} on apiserver {server_index}: HTTP {status}: {payload[:500]!r}"
            )
        return json.loads(payload)

    # ----- etcd --------------------------------------------------------------------------

    @property
    def etcd_url(self) -> str:
        """etcd's client URL, ``http://127.0.0.1:PORT``."""
        self._require_started()
        return f"http://127.0.0.1:{self._etcd_port}"

    def etcd_get_prefix(self, prefix: str | bytes) -> list[tuple[str, bytes]]:
        """Every (key, raw value) under ``prefix`` in etcd, by key, read via the v3 JSON gateway.

        Kubernetes keeps objects under ``/registry/<resource>/...``, each value as the
        apiserver stored it: protobuf (``k8s\\0`` and a ``runtime.Unknown``) for built-in
        kinds, JSON for custom resources; ``kube.stored.decode`` reads either.
        """
        key = prefix.encode() if isinstance(prefix, str) else prefix
        body = {
            "key": base64.b64encode(key).decode(),
            "range_end": base64.b64encode(_prefix_end(key)).decode(),
        }
        request = urllib.request.Request(
            f"{self.etcd_url}/v3/kv/range",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            result = json.loads(response.read())
        return [
            (
                base64.b64decode(item["key"]).decode("utf-8", errors="surrogateescape"),
                base64.b64decode(item.get("value", "")),
            )
            for item in result.get("kvs", [])
        ]

    # ----- kube-controller-manager -----------------------------------------------------

    def start_controller_manager(
        self,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        *,
        server_index: int = 0,
        version: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        """Start a kube-controller-manager running ``controllers``, talking to ``server_index``.

        Returns once its ``/healthz`` answers. ``version`` defaults to the cluster's.
        """
        workdir = self._require_started()
        if self._controller_manager is not None and self._controller_manager.running:
            raise ClusterError("the kube-controller-manager is already running")
        version = version or self._version
        binary = binaries(version, ("kube-controller-manager",)) / "kube-controller-manager"
        kubeconfig = self.write_kubeconfig(workdir / "controller-manager.kubeconfig", server_index)
        self._controller_manager_port = free_port()
        gates = controller_manager_feature_gates(version, self._storage_version_api)
        command = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            # Bearer tokens only: no client-certificate or front-proxy authentication, so
            # no need to read them from kube-system/extension-apiserver-authentication.
            "--authentication-skip-lookup",
            f"--controllers={','.join(controllers)}",
            *_flags("feature-gates", gates),
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self._controller_manager_port}",
            f"--cert-dir={workdir / 'controller-manager'}",
            "--v=2",
            *extra_args,
        ]
        process = Process("kube-controller-manager", workdir / "controller-manager.log")
        self._controller_manager = process
        process.start(command)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{self._controller_manager_port}/healthz"
        self._poll(process, url, insecure, {}, time.monotonic() + self._startup_timeout)

    def stop_controller_manager(self) -> None:
        """Stop the kube-controller-manager (SIGTERM); safe to repeat."""
        if self._controller_manager is not None:
            self._controller_manager.stop(self._shutdown_timeout)

    # ----- internals ---------------------------------------------------------------------

    def _require_started(self) -> Path:
        if self._workdir is None:
            raise ClusterError("the cluster is not running: call start() first")
        return self._workdir

    def _server(self, index: int) -> _APIServer:
        self._require_started()
        if not 0 <= index < len(self._apiservers):
            raise ClusterError(f"no apiserver {index}: the cluster has {len(self._apiservers)}")
        return self._apiservers[index]

    def _write_credentials(self) -> None:
        workdir = self._require_started()
        pki = workdir / "pki"
        pki.mkdir()
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        (pki / "serving.ext").write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        )
        for command in (
            ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
             "-subj", "/CN=svledger-local-kube-ca"],
            ["req", "-new", *ec, "-keyout", "serving.key", "-out", "serving.csr",
             "-subj", "/CN=kube-apiserver"],
            ["x509", "-req", "-in", "serving.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "serving.crt", "-days", "30", "-extfile", "serving.ext"],
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", "service-account.key"],
            ["pkey", "-in", "service-account.key", "-pubout", "-out", "service-account.pub"],
        ):  # fmt: skip
            _run(["openssl", *command], pki, "openssl could not create the cluster's keys")
        (workdir / "tokens.csv").write_text(
            f'{self._token},{_ADMIN_USER},{_ADMIN_USER},"system:masters"\n'
        )

    def _start_etcd(self, binary: Path) -> None:
        workdir = self._require_started()
        self._etcd_port = free_port()
        peer = f"http://127.0.0.1:{free_port()}"
        client = f"http://127.0.0.1:{self._etcd_port}"
        self._etcd = Process("etcd", workdir / "etcd.log")
        self._etcd.start(etcd_command(binary, workdir / "etcd", client, peer))
        self._poll(
            self._etcd, f"{client}/health", None, {}, time.monotonic() + self._startup_timeout
        )

    def _apiserver_command(self, server: _APIServer) -> list[str]:
        workdir = self._require_started()
        pki = workdir / "pki"
        binary = binaries(server.version, ("kube-apiserver",)) / "kube-apiserver"
        svapi = self._storage_version_api
        args = [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={server.port}",
            f"--cert-dir={server.cert_dir}",
            f"--tls-cert-file={pki / 'serving.crt'}",
            f"--tls-private-key-file={pki / 'serving.key'}",
            f"--token-auth-file={workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={_SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'service-account.pub'}",
            f"--service-account-signing-key-file={pki / 'service-account.key'}",
            *_flags("feature-gates", apiserver_feature_gates(server.version, svapi)),
            *_flags("runtime-config", apiserver_runtime_config(server.version, svapi)),
            "--shutdown-delay-duration=0s",
            "--shutdown-watch-termination-grace-period=2s",
            # The "kubernetes" Service's endpoints cannot point at a loopback address.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
            *self._extra_apiserver_args,
        ]
        # unshare gives the apiserver a UTS namespace of its own, the shell names it, and
        # exec keeps one process (the Popen pid is the apiserver's) for signals.
        namespace = (
            ["unshare", "--uts"]
            if os.geteuid() == 0
            else ["unshare", "--user", "--map-root-user", "--uts"]
        )
        return [
            *namespace,
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            server.hostname,
            str(binary),
            *args,
        ]

    def _spawn_apiserver(self, server: _APIServer) -> None:
        command = self._apiserver_command(server)
        server.cert_dir.mkdir(parents=True, exist_ok=True)
        server.process.start(command, env={**os.environ, **self._lease_env})

    def _wait_until_ready(self, server: _APIServer, deadline: float) -> None:
        self._poll(
            server.process,
            f"{server.url}/readyz",
            self.ssl_context(),
            {"Authorization": f"Bearer {self._token}"},
            deadline,
        )

    def _poll(
        self,
        process: Process,
        url: str,
        context: ssl.SSLContext | None,
        headers: Mapping[str, str],
        deadline: float,
    ) -> None:
        last = "no answer yet"
        while time.monotonic() < deadline:
            process.check_alive()
            request = urllib.request.Request(url, headers=dict(headers))
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as error:
                last = f"HTTP {error.code}: {error.read()[-300:]!r}"
            except (OSError, ValueError) as error:
                last = str(error)
            time.sleep(0.25)
        raise ClusterError(
            f"{process.name} was not ready at {url} within {self._startup_timeout:g} s "
            f"(last: {last}); raise startup_timeout on a slow machine.\n{process.log_tail()}"
        )


def _lease_environment(
    duration_seconds: int | None, renew_interval: float | None, gc_period: float | None
) -> dict[str, str]:
    env: dict[str, str] = {}
    if duration_seconds is not None:
        if duration_seconds < 1:
            raise ClusterError("identity_lease_duration_seconds must be at least 1")
        env["SVLEDGER_IDENTITY_LEASE_DURATION_SECONDS"] = str(int(duration_seconds))
    for name, seconds in (
        ("SVLEDGER_IDENTITY_LEASE_RENEW_INTERVAL", renew_interval),
        ("SVLEDGER_IDENTITY_LEASE_GC_PERIOD", gc_period),
    ):
        if seconds is not None:
            if seconds <= 0:
                raise ClusterError(f"{name.lower()} must be positive")
            env[name] = f"{round(seconds * 1000)}ms"
    return env


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # an empty prefix: every key


def _run(command: list[str], cwd: Path, failure: str) -> None:
    result = subprocess.run(
        command, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ClusterError(
            f"{failure} (exit code {result.returncode}):\n{result.stdout}{result.stderr}"
        )


def _require_tool(name: str) -> None:
    if shutil.which(name) is None:
        package = {"openssl": "openssl", "unshare": "util-linux"}[name]
        raise ClusterError(
            f"`{name}` is not on PATH; the local cluster needs it (Debian package {package})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="start a cluster, print a kubeconfig path, serve until SIGINT/SIGTERM"
    )
    run.add_argument(
        "--apiservers", type=int, default=1, help="number of kube-apiservers (default 1)"
    )
    run.add_argument(
        "--kubernetes",
        default=DEFAULT_VERSION,
        metavar="VERSION",
        help=f"release (default {DEFAULT_VERSION})",
    )
    run.add_argument(
        "--kubeconfig",
        type=Path,
        help="where to write the kubeconfig (default: in the cluster's directory)",
    )
    run.add_argument(
        "--controller-manager",
        action="store_true",
        help="also run a kube-controller-manager with the storage version controllers",
    )
    run.add_argument(
        "--storage-version-api",
        action="store_true",
        help="serve the alpha StorageVersion API (off by default, as upstream's)",
    )
    run.add_argument("--identity-lease-duration", type=int, metavar="SECONDS")
    run.add_argument("--identity-lease-renew-interval", type=float, metavar="SECONDS")
    run.add_argument("--identity-lease-gc-period", type=float, metavar="SECONDS")
    args = parser.parse_args(argv)
    stop_requested = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: stop_requested.set())
    try:
        with LocalCluster(
            args.apiservers,
            version=args.kubernetes,
            identity_lease_duration_seconds=args.identity_lease_duration,
            identity_lease_renew_interval=args.identity_lease_renew_interval,
            identity_lease_gc_period=args.identity_lease_gc_period,
            storage_version_api=args.storage_version_api,
        ) as cluster:
            if args.controller_manager:
                cluster.start_controller_manager()
            kubeconfig = args.kubeconfig or cluster.workdir / "kubeconfig"
            print(cluster.write_kubeconfig(kubeconfig), flush=True)
            while not stop_requested.wait(1.0):
                cluster.check_alive()
        return 0
    except ProcessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


def etcd_command(binary: Path, data_dir: Path, client: str, peer: str) -> list[str]:
    """A lone etcd member's command line: serving ``client``, its data in ``data_dir``,
    fsync off (a test's or a bench's store, thrown away after)."""
    return [
        str(binary),
        "--name=svledger",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=svledger={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]
