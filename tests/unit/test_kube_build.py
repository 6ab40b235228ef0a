"""Which Kubernetes binaries ``deploy/kube/build.py`` builds: those asked for, each once.

The Go builds themselves (minutes each) run for the tests that start clusters; here the
build is replaced by one that writes placeholder files, and the tests check what is built,
what is kept and what the cache directory holds afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from deploy.kube import build

VERSION = "v1.36.3"


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """The binaries of each build, in order, with an empty cache in ``tmp_path``."""
    monkeypatch.setenv("SVLEDGER_CACHE", str(tmp_path))
    builds: list[tuple[str, ...]] = []

    def placeholder_build(version: str, names: Sequence[str], out: Path) -> None:
        builds.append(tuple(names))
        out.mkdir()
        for name in names:
            (out / name).write_text(f"{version} {name}\n")

    monkeypatch.setattr(build, "_build", placeholder_build)
    return builds


def _contents(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_only_the_binaries_asked_for_are_built_and_others_are_added_later(
    built: list[tuple[str, ...]],
) -> None:
    directory = build.binaries(VERSION, ["etcd", "kube-apiserver"])
    assert built == [("kube-apiserver", "etcd")]
    assert _contents(directory) == [".stamp", "etcd", "kube-apiserver"]
    assert build.is_built(VERSION, ["kube-apiserver", "etcd"])
    assert not build.is_built(VERSION)
    apiserver = (directory / "kube-apiserver").stat().st_ino

    assert build.binaries(VERSION, ["kube-controller-manager", "etcd"]) == directory
    assert built[1:] == [("kube-controller-manager",)]
    assert (directory / "kube-apiserver").stat().st_ino == apiserver  # kept, not rebuilt
    assert _contents(directory) == [".stamp", "etcd", "kube-apiserver", "kube-controller-manager"]

    build.binaries(VERSION, ["etcd", "kube-controller-manager"])
    assert len(built) == 2


def test_a_stale_build_is_replaced_by_the_binaries_asked_for(
    built: list[tuple[str, ...]],
) -> None:
    directory = build.binary_dir(VERSION)
    directory.mkdir(parents=True)
    for name in build.BINARY_NAMES:
        (directory / name).write_text("built from other wrapper sources\n")
    (directory / ".stamp").write_text("a digest of other wrapper sources\n")

    build.binaries(VERSION, ["etcd"])
    assert built == [("etcd",)]
    assert _contents(directory) == [".stamp", "etcd"]
    assert (directory / "etcd").read_text() == f"{VERSION} etcd\n"
    assert build.is_built(VERSION, ["etcd"])


def test_fetch_builds_the_binaries_named_and_all_four_by_default(
    built: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    named = ["--binary", "etcd", "--binary", "kube-apiserver"]
    assert build.main(["fetch", "--kubernetes", VERSION, *named]) == 0
    assert build.main(["fetch", "--kubernetes", VERSION]) == 0
    assert built == [("kube-apiserver", "etcd"), ("kube-controller-manager", "kubectl")]
    assert capsys.readouterr().out.splitlines() == [str(build.binary_dir(VERSION))] * 2


def test_a_binary_this_build_does_not_make_is_refused(
    built: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(build.BuildError, match="cannot build 'kubelet'"):
        build.binaries(VERSION, ["kubelet", "etcd"])
    with pytest.raises(SystemExit):
        build.main(["fetch", "--binary", "kubelet"])
    assert "invalid choice: 'kubelet'" in capsys.readouterr().err
    assert built == []
