"""Real ``etcd``, ``kube-apiserver``, ``kube-controller-manager`` and ``kubectl``, from source.

No release tarball is downloaded: the binaries are compiled from the Go modules that the Go
module proxy serves, with the ``go`` toolchain on ``PATH`` (or ``/usr/local/go/bin/go``).

``k8s.io/kubernetes`` cannot be ``go install``-ed directly: its go.mod requires every
``k8s.io/<staging>`` module (``k8s.io/api``, ``k8s.io/apiserver``, ...) at ``v0.0.0`` and
replaces it with a directory of its own repository that the module zip does not hold. So each
Kubernetes release is built through a small wrapper module, generated in the cache, that
requires ``k8s.io/kubernetes v1.X.Y`` and replaces every staging module named in that
release's own go.mod (read from the module cache, never hard-coded) with the published
``v0.X.Y``. The release also requires staging modules that none of these binaries link
(``k8s.io/sample-controller``, ``k8s.io/sample-cli-plugin``, ...), and the proxy does not
serve every one of them at every release; such an unpublished module is replaced by an empty
local stub, which satisfies the module graph and would fail the build, rather than link other
code, if a package of it were ever imported. Each built binary's Go build info is checked to
name the requested ``k8s.io/kubernetes`` release.

The wrapper holds three commands: ``kube-apiserver`` is ``apiserver/main.go`` beside this
file, the upstream main plus identity-lease timings settable from the environment (see that
file); ``kube-controller-manager`` and ``kubectl`` are upstream's
``k8s.io/kubernetes/cmd/kube-controller-manager`` and ``cmd/kubectl`` as they are (the tests
read ``svledger serve`` with the release's own kubectl as well as the machine's). ``etcd``
is ``go.etcd.io/etcd/server/v3`` (its main package) at the version the release's go.mod
requires, which is the etcd the release is tested with, built in a second wrapper module.
Everything is built with ``CGO_ENABLED=0 -trimpath -ldflags=-s -w``, and the Kubernetes
binaries carry the release in ``k8s.io/component-base/version`` as upstream's own build
does, so ``/version`` reports ``v1.X.Y``.

One client is built too, on first use (:func:`metadata_client`): ``metadata-client``
(``metadataclient/main.go``), client-go's metadata client and metadata informer at the
release's staging version, which the tests point at ``svledger serve``.

Binaries go to ``${SVLEDGER_CACHE:-~/.cache/svledger}/kube/<version>/``, and a caller asks
for the ones it needs (:func:`binaries`' ``names``, ``fetch --binary``; all four by default):
the tests and demos use all four of the default release, but of the rolling upgrade's old
release only kube-apiserver and etcd (``LocalCluster`` asks for etcd and kube-apiserver when
it starts, for kube-controller-manager in ``start_controller_manager``; :func:`kubectl` for
kubectl). A stamp file in the directory holds a hash of the version, the build recipe and
the wrapper sources: every binary in a directory with a matching stamp was built by them and
is reused as is, by a fresh clone on the same machine too. A binary asked for later is built
beside the directory and renamed into it, whole, leaving the others as they are; a
directory without a matching stamp is built again aside, with the binaries asked for, then
swapped in and stamped last. A file lock makes concurrent callers wait for one build
instead of racing it.

On 2 cores a cold build of one release's four binaries (empty Go module and build caches)
takes 11 to 13 minutes, module downloads included: kube-apiserver 7.5 to 8, the
kube-controller-manager 2 to 3, kubectl 0.5 to 2 (most of its packages are kube-apiserver's
too), etcd 30 to 90 seconds. Without the kube-controller-manager and kubectl, which nothing
uses of the old release, v1.36.3 takes about 8 to 10.5 minutes instead of 10 to 13. Linking
kube-apiserver alone needs about 2 GiB of memory. Once Go's build cache is warm a rebuild
(a changed wrapper source, ``--rebuild``) takes 15 to 25 seconds, and a matching stamp
costs nothing. Both releases fill about 6.4 GiB of Go build cache and 1.5 GiB of module
cache; a release's four binaries take about 300 MB (kube-apiserver 105 to 120, the
kube-controller-manager 95 to 105, kubectl 60, etcd 25).

Stdlib only, so it runs before any virtualenv exists::

    python deploy/kube/build.py fetch                                  # v1.37.2, all four
    python deploy/kube/build.py fetch --kubernetes v1.36.3 --binary kube-apiserver --binary etcd
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
APISERVER_MAIN = HERE / "apiserver" / "main.go"
METADATA_CLIENT_MAIN = HERE / "metadataclient" / "main.go"

DEFAULT_VERSION = "v1.37.2"
BINARY_NAMES = ("kube-apiserver", "kube-controller-manager", "kubectl", "etcd")

# Part of the stamp: bump when the way binaries are built changes, so caches rebuild.
_RECIPE = "kube-build/2 CGO_ENABLED=0 -trimpath -ldflags=-s -w"
_STAMP_NAME = ".stamp"
_KUBERNETES_MODULE = "k8s.io/kubernetes"
_ETCD_MODULE = "go.etcd.io/etcd/server/v3"
# What each Kubernetes binary is built from, in the wrapper module (etcd has a wrapper of its own).
_KUBE_PACKAGES = {
    "kube-apiserver": "./cmd/kube-apiserver",
    "kube-controller-manager": f"{_KUBERNETES_MODULE}/cmd/kube-controller-manager",
    "kubectl": f"{_KUBERNETES_MODULE}/cmd/kubectl",
}
_WRAPPER_MODULE = "svledger.invalid/kube"
_ETCD_WRAPPER_MODULE = "svledger.invalid/etcd"
_CLIENT_WRAPPER_MODULE = "svledger.invalid/metadataclient"
_CLIENT_GO_MODULE = "k8s.io/client-go"
_VERSION_PATTERN = re.compile(r"^v1\.(?P<minor>\d+)\.(?P<patch>\d+)(?P<pre>-[0-9A-Za-z.-]+)?$")
_OUTPUT_TAIL_CHARS = 6000


class BuildError(RuntimeError):
    """The binaries could not be built."""


def cache_root() -> Path:
    """``${SVLEDGER_CACHE:-~/.cache/svledger}/kube``: where every release's binaries live."""
    base = os.environ.get("SVLEDGER_CACHE") or str(Path.home() / ".cache" / "svledger")
    return Path(base).expanduser() / "kube"


def binary_dir(version: str = DEFAULT_VERSION) -> Path:
    """The directory that holds (or will hold) ``version``'s binaries; builds nothing."""
    _parse_version(version)
    return cache_root() / version


def is_built(version: str = DEFAULT_VERSION, names: Collection[str] = BINARY_NAMES) -> bool:
    """Whether ``binary_dir(version)`` holds ``names``, built from the current wrapper sources."""
    return not _to_build(binary_dir(version), _stamp_digest(version), _binary_names(names))


def binaries(
    version: str = DEFAULT_VERSION,
    names: Collection[str] = BINARY_NAMES,
    *,
    rebuild: bool = False,
) -> Path:
    """Return the directory of ``version``'s binaries, holding at least ``names`` (some of
    ``BINARY_NAMES``; all of them by default).

    Builds those of ``names`` that the cache lacks, or all of ``names`` if the cache holds no
    build of ``version`` from the current wrapper sources (or ``rebuild`` is true); binaries
    built earlier and not asked for are kept if they are current. Progress goes to stderr.
    """
    wanted = _binary_names(names)
    target = binary_dir(version)
    digest = _stamp_digest(version)
    if not rebuild and not _to_build(target, digest, wanted):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f".{version}.lock"):
        # Another process may have built them while this one waited.
        todo = wanted if rebuild else _to_build(target, digest, wanted)
        if not todo:
            return target
        started = time.monotonic()
        partial = target.parent / f".{version}.partial"
        try:
            _build(version, todo, partial)
            if _stamp_matches(target, digest):
                # The binaries already there are current: add (or replace) each new one by a
                # rename, so it is there whole or not at all for a caller that does not wait
                # for the lock; the stamp stays true throughout.
                for name in todo:
                    (partial / name).replace(target / name)
            else:
                # Swap the finished build in, stamp last: a directory without the stamp is
                # never used. Stale binaries not asked for go with the old directory.
                shutil.rmtree(target, ignore_errors=True)
                partial.rename(target)
                (target / _STAMP_NAME).write_text(digest + "\n")
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    elapsed = time.monotonic() - started
    _log(f"built {', '.join(todo)} of {version} in {elapsed:.0f} s into {target}")
    return target


def kubectl(version: str = DEFAULT_VERSION) -> Path:
    """Return the path of ``version``'s own ``kubectl``, building it first if needed."""
    return binaries(version, ("kubectl",)) / "kubectl"


def metadata_client(version: str = DEFAULT_VERSION) -> Path:
    """Return the path of ``metadata-client`` (``metadataclient/main.go`` beside this file):
    client-go's metadata client and informer at ``version``'s staging release (``v0.X.Y``).

    Built on first use, apart from the release's server binaries (their stamp does not
    change with it), into ``cache_root()/<version>-clients/``, with a stamp of its own;
    2 min 16 s on an empty Go build cache, 4 s once the releases' builds have filled it.
    """
    target = cache_root() / f"{version}-clients"
    binary = target / "metadata-client"
    digest = hashlib.sha256(
        b"\0".join([_RECIPE.encode(), version.encode(), METADATA_CLIENT_MAIN.read_bytes()])
    ).hexdigest()

    def built() -> bool:
        stamp = target / _STAMP_NAME
        return binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest

    if built():
        return binary
    target.mkdir(parents=True, exist_ok=True)
    with locked(target / ".lock"):
        if built():
            return binary
        go, env = _find_go(), _go_env()
        work = cache_root() / f".{version}-clients.work"
        _parse_version(version)
        staging = _staging_version(version)
        info = _download(go, env, [f"{_CLIENT_GO_MODULE}@{staging}"], work)[0]
        _write_wrapper(
            work,
            _CLIENT_WRAPPER_MODULE,
            {_CLIENT_GO_MODULE: staging, "k8s.io/apimachinery": staging},
            Path(info["GoMod"]).read_text(),
        )
        shutil.copyfile(METADATA_CLIENT_MAIN, work / "main.go")
        _go_build(go, env, work, ".", binary, "-s -w")
        (target / _STAMP_NAME).write_text(digest + "\n")
    return binary


@dataclass(frozen=True)
class _ReleaseModule:
    """What the wrapper needs from one ``k8s.io/kubernetes`` release's go.mod."""

    go_directive: str
    godebug: tuple[str, ...]
    staging_modules: tuple[str, ...]
    etcd_version: str


def _build(version: str, names: Sequence[str], out: Path) -> None:
    """Build ``names`` of ``version`` into ``out``, emptied first, each checked from its Go
    build info to be of the release (etcd: of the etcd version the release requires)."""
    go = _find_go()
    env = _go_env()
    work = out.parent / f".{version}.work"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    _log(f"resolving {_KUBERNETES_MODULE}@{version}")
    kube_info = _download(go, env, [f"{_KUBERNETES_MODULE}@{version}"], work)[0]
    release = _parse_release_go_mod(Path(kube_info["GoMod"]).read_text(), version)
    kube_names = [name for name in names if name in _KUBE_PACKAGES]
    if kube_names:
        unpublished = _unpublished_staging_modules(go, env, release.staging_modules, version, work)
        if unpublished:
            _log(
                f"not on the module proxy at {_staging_version(version)}, so replaced by "
                f"empty stubs (no binary links them): {', '.join(unpublished)}"
            )
        kube_work = work / "kubernetes"
        _write_kube_wrapper(kube_work, version, release, unpublished)
        ldflags = _kube_ldflags(version)
        for name in kube_names:
            _go_build(go, env, kube_work, _KUBE_PACKAGES[name], out / name, ldflags)
            _check_build_info(go, env, out / name, _KUBERNETES_MODULE, version)

    if "etcd" in names:
        etcd_work = work / "etcd"
        etcd_info = _download(go, env, [f"{_ETCD_MODULE}@{release.etcd_version}"], work)[0]
        _write_etcd_wrapper(etcd_work, release.etcd_version, Path(etcd_info["GoMod"]).read_text())
        _go_build(go, env, etcd_work, _ETCD_MODULE, out / "etcd", "-s -w")
        _check_build_info(go, env, out / "etcd", _ETCD_MODULE, release.etcd_version)


def _binary_names(names: Collection[str]) -> list[str]:
    """``names`` once each, in ``BINARY_NAMES`` order (the order they are built in)."""
    unknown = sorted(set(names) - set(BINARY_NAMES))
    if unknown or not names:
        raise BuildError(
            f"cannot build {', '.join(map(repr, unknown)) or 'nothing'} (asked for "
            f"{names!r}); name one or more of {', '.join(BINARY_NAMES)}"
        )
    return [name for name in BINARY_NAMES if name in names]


def _parse_version(version: str) -> re.Match[str]:
    match = _VERSION_PATTERN.match(version)
    if match is None:
        raise BuildError(
            f"{version!r} is not a Kubernetes release version; "
            f"give one like {DEFAULT_VERSION} (with the leading v)"
        )
    return match


def _staging_version(version: str) -> str:
    """``v1.37.2`` -> ``v0.37.2``: the version the staging modules are published under."""
    return "v0." + version.removeprefix("v1.")


def _stamp_digest(version: str) -> str:
    _parse_version(version)
    digest = hashlib.sha256()
    for part in (_RECIPE, version):
        digest.update(part.encode() + b"\0")
    for source in (APISERVER_MAIN,):
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()


def _stamp_matches(directory: Path, digest: str) -> bool:
    """Whether every binary in ``directory`` was built as ``digest`` says."""
    stamp = directory / _STAMP_NAME
    return stamp.is_file() and stamp.read_text().strip() == digest


def _to_build(directory: Path, digest: str, names: Sequence[str]) -> list[str]:
    """Those of ``names`` that ``directory`` lacks: all of them unless its stamp is ``digest``."""
    if not _stamp_matches(directory, digest):
        return list(names)
    return [name for name in names if not (directory / name).is_file()]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (made if missing) for the block, across processes."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _find_go() -> str:
    found = shutil.which("go")
    if found is not None:
        return found
    fallback = Path("/usr/local/go/bin/go")
    if fallback.is_file():
        return str(fallback)
    raise BuildError(
        "`go` is not on PATH (nor at /usr/local/go/bin/go); building etcd and Kubernetes "
        "needs the Go toolchain that the release's go.mod names (Go 1.26 for v1.37)"
    )


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env["GOWORK"] = "off"
    env["GO111MODULE"] = "on"
    # The wrapper go.mod files list only direct requirements: let go fill in the rest.
    env["GOFLAGS"] = " ".join([*env.get("GOFLAGS", "").split(), "-mod=mod"])
    return env


def _download(
    go: str, env: Mapping[str, str], modules: Sequence[str], cwd: Path
) -> list[dict[str, Any]]:
    """``go mod download -json`` for ``modules`` (``path@version``); raise if any is missing."""
    infos = _download_lenient(go, env, modules, cwd)
    failed = [info for info in infos if info.get("Error")]
    if failed:
        details = "\n".join(
            f"  {info['Path']}@{info['Version']}: {info['Error']}" for info in failed
        )
        raise BuildError(
            "the Go module proxy did not serve these modules; check the version and that "
            f"the proxy (GOPROXY) is reachable:\n{details}"
        )
    return infos


def _download_lenient(
    go: str, env: Mapping[str, str], modules: Sequence[str], cwd: Path
) -> list[dict[str, Any]]:
    cwd.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [go, "mod", "download", "-json", *modules],
        cwd=_module_free_dir(cwd),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    infos = _json_stream(result.stdout)
    if len(infos) != len(modules):
        raise BuildError(
            f"`go mod download` failed (exit code {result.returncode}):\n"
            f"{_tail(result.stdout + result.stderr)}"
        )
    return infos


def _module_free_dir(work: Path) -> Path:
    """A directory under ``work`` with no go.mod, so ``go mod download`` runs outside a module."""
    path = work / "download"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _json_stream(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    values: list[dict[str, Any]] = []
    index = 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return values
        value, index = decoder.raw_decode(text, index)
        values.append(value)


def _parse_release_go_mod(text: str, version: str) -> _ReleaseModule:
    go_directive = re.search(r"^go (\S+)\s*$", text, re.MULTILINE)
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", text, re.MULTILINE)
    etcd = re.search(rf"^\s*{re.escape(_ETCD_MODULE)}\s+(v\S+)", text, re.MULTILINE)
    if go_directive is None or not staging or etcd is None:
        raise BuildError(
            f"the go.mod of {_KUBERNETES_MODULE}@{version} lacks the go directive, the "
            f"./staging replace directives or the {_ETCD_MODULE} requirement this build "
            "reads; this build does not know how to wrap that release"
        )
    godebug = tuple(re.findall(r"^(godebug\s+.+?)\s*$", text, re.MULTILINE))
    return _ReleaseModule(go_directive.group(1), godebug, tuple(staging), etcd.group(1))


def _unpublished_staging_modules(
    go: str, env: Mapping[str, str], modules: Sequence[str], version: str, work: Path
) -> list[str]:
    """The staging modules whose ``v0.X.Y`` the Go module proxy does not serve."""
    wanted = _staging_version(version)
    infos = _download_lenient(go, env, [f"{module}@{wanted}" for module in modules], work)
    return [module for module, info in zip(modules, infos, strict=True) if info.get("Error")]


def _write_kube_wrapper(
    work: Path, version: str, release: _ReleaseModule, unpublished: Sequence[str]
) -> None:
    work.mkdir(parents=True, exist_ok=True)
    pinned = _staging_version(version)
    replaces: list[str] = []
    for module in sorted(release.staging_modules):
        if module in unpublished:
            # The release requires the module (at v0.0.0) but none of its packages are
            # built here; a stub with no packages satisfies the module graph, and a build
            # that did import from it would fail instead of linking other code.
            stub = work / "stubs" / module
            stub.mkdir(parents=True, exist_ok=True)
            (stub / "go.mod").write_text(f"module {module}\n")
            replaces.append(f"\t{module} => ./stubs/{module}")
        else:
            replaces.append(f"\t{module} => {module} {pinned}")
    lines = [
        f"module {_WRAPPER_MODULE}",
        "",
        f"go {release.go_directive}",
        "",
        *release.godebug,
        "",
        f"require {_KUBERNETES_MODULE} {version}",
        "",
        "replace (",
        *replaces,
        ")",
    ]
    _write_go_mod(work, "\n".join(lines) + "\n")
    main = work / "cmd" / "kube-apiserver" / "main.go"
    main.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(APISERVER_MAIN, main)


def _write_etcd_wrapper(work: Path, etcd_version: str, etcd_go_mod: str) -> None:
    _write_wrapper(work, _ETCD_WRAPPER_MODULE, {_ETCD_MODULE: etcd_version}, etcd_go_mod)


def _write_wrapper(work: Path, module: str, requires: Mapping[str, str], main_go_mod: str) -> None:
    """A wrapper module requiring ``requires`` (path: version), at the go version of
    ``main_go_mod``, the go.mod of the first of them."""
    work.mkdir(parents=True, exist_ok=True)
    go_directive = re.search(r"^go (\S+)\s*$", main_go_mod, re.MULTILINE)
    first = next(iter(requires.items()))
    if go_directive is None:
        raise BuildError(f"the go.mod of {first[0]}@{first[1]} has no go directive")
    if len(requires) == 1:
        required = f"require {first[0]} {first[1]}\n"
    else:
        lines = "".join(f"\t{path} {version}\n" for path, version in requires.items())
        required = f"require (\n{lines})\n"
    _write_go_mod(work, f"module {module}\n\ngo {go_directive.group(1)}\n\n{required}")


def _write_go_mod(work: Path, text: str) -> None:
    """Write the generated go.mod into ``work`` unless the last one generated there is the same.

    ``go build -mod=mod`` completes go.mod with the indirect requirements and go.sum with
    their hashes; keeping both across builds spares resolving them again.
    """
    generated = work / "go.mod.generated"
    if generated.is_file() and generated.read_text() == text and (work / "go.mod").is_file():
        return
    (work / "go.sum").unlink(missing_ok=True)
    (work / "go.mod").write_text(text)
    generated.write_text(text)


def _kube_ldflags(version: str) -> str:
    match = _parse_version(version)
    values = {
        "gitVersion": version,
        "gitMajor": "1",
        "gitMinor": match.group("minor"),
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{key}={value}" for key, value in values.items()]
    return " ".join(flags)


def _go_build(
    go: str, env: Mapping[str, str], cwd: Path, package: str, output: Path, ldflags: str
) -> None:
    _log(f"go build {output.name} ({package}) ...")
    started = time.monotonic()
    command = [go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(output), package]
    nice = shutil.which("nice")
    if nice is not None:
        command = [nice, "-n", "10", *command]
    with tempfile.TemporaryFile("w+") as log:
        code = subprocess.run(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=False
        ).returncode
        if code != 0:
            log.seek(0)
            raise BuildError(
                f"`go build {package}` in {cwd} failed (exit code {code}); a killed build on "
                "a small machine usually means too little memory (kube-apiserver needs about "
                f"2.5 GiB):\n{_tail(log.read())}"
            )
    _log(f"built {output.name} in {time.monotonic() - started:.0f} s")


def _check_build_info(
    go: str, env: Mapping[str, str], binary: Path, module: str, version: str
) -> None:
    """Check from its Go build info that ``binary`` is built from ``module`` at ``version``."""
    result = subprocess.run(
        [go, "version", "-m", str(binary)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(f"`go version -m {binary}` failed:\n{_tail(result.stderr)}")
    linked = None
    for line in result.stdout.splitlines():
        fields = line.split()
        # "mod" is the module of the main package, "dep" a dependency of it.
        if len(fields) >= 3 and fields[0] in ("mod", "dep") and fields[1] == module:
            linked = fields[2]
    if linked != version:
        raise BuildError(
            f"{binary} is built from {module} {linked}, not {version}; "
            "the wrapper module resolved the wrong release"
        )


def _tail(text: str) -> str:
    return text if len(text) <= _OUTPUT_TAIL_CHARS else "..." + text[-_OUTPUT_TAIL_CHARS:]


def _log(message: str) -> None:
    print(f"[kube build] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser(
        "fetch", help="build (or reuse) the binaries and print the directory of each release"
    )
    fetch.add_argument(
        "--kubernetes",
        action="append",
        metavar="VERSION",
        help=f"Kubernetes release, repeatable (default {DEFAULT_VERSION})",
    )
    fetch.add_argument(
        "--binary",
        action="append",
        choices=BINARY_NAMES,
        metavar="NAME",
        help=f"binary to build, repeatable (default all: {', '.join(BINARY_NAMES)})",
    )
    fetch.add_argument(
        "--rebuild",
        action="store_true",
        help="build the binaries asked for even if the cache holds a matching build",
    )
    args = parser.parse_args(argv)
    try:
        for version in args.kubernetes or [DEFAULT_VERSION]:
            print(binaries(version, args.binary or BINARY_NAMES, rebuild=args.rebuild), flush=True)
        return 0
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
