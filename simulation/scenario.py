"""Simulation scenarios: a YAML file describing an HA control plane and what happens to it.

A scenario names the resources, the apiserver binaries (for each resource: the version it
encodes objects in and the versions it can decode), the apiservers, the timing knobs
(lease duration, heartbeat interval, lease-GC check period, the discovery poll period of the
old-way trigger, the simulation step) and a timeline of actions at virtual minutes. The
reference is ``docs/scenarios.md``.

Parsing is pure: :func:`parse` turns YAML text into a frozen :class:`Scenario` and
:func:`load` reads a file. Validation walks the timeline once with the apiservers' lifecycle
(which are running, on which binary, which binary they ran before), so an impossible
scenario — stopping a server that is not running, rolling back a server that was never
upgraded — is refused up front with the file, line, key and value, instead of failing
half-way through a run. The walk also resolves every action to its binary, so the
simulation never has to decide what ``start`` or ``rollback`` means.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeAlias

import yaml

from ledger.errors import UsageError
from ledger.names import storage_state_name


class ScenarioError(UsageError):
    """A scenario that cannot be run; the message names file, line, key and value."""


@dataclasses.dataclass(frozen=True, slots=True)
class Resource:
    group: str
    resource: str
    kind: str
    objects: int  # size of the pool of object names clients write to

    @property
    def name(self) -> str:
        """``<resource>.<group>``, as kubectl and the StorageState name it."""
        return storage_state_name(self.group, self.resource)

    def object_name(self, index: int) -> str:
        return f"{self.kind.lower()}-{index}"


@dataclasses.dataclass(frozen=True, slots=True)
class Encoding:
    """What one binary does with one resource."""

    encoding_version: str
    decodable_versions: tuple[str, ...]
    served_versions: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Binary:
    name: str
    encodings: Mapping[str, Encoding]  # by Resource.name; covers every resource


@dataclasses.dataclass(frozen=True, slots=True)
class Apiserver:
    hostname: str
    binary: str  # the binary of its first start


@dataclasses.dataclass(frozen=True, slots=True)
class Start:
    hostname: str
    binary: str


@dataclasses.dataclass(frozen=True, slots=True)
class Restart:
    """Graceful stop, then start on another binary (the new process has a new holder)."""

    hostname: str
    binary: str
    kind: Literal["upgrade", "rollback"]


@dataclasses.dataclass(frozen=True, slots=True)
class Crash:
    """The process dies: heartbeats stop, nothing is released; lease GC must expire it."""

    hostname: str


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    """Graceful shutdown: the lease is released."""

    hostname: str


@dataclasses.dataclass(frozen=True, slots=True)
class Write:
    """``count`` client writes of random objects of a resource, through the load balancer."""

    resource: str  # Resource.name
    count: int


Action: TypeAlias = Start | Restart | Crash | Stop | Write


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    at_seconds: int
    action: Action
    note: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    cluster: str
    seed: int
    resources: tuple[Resource, ...]
    binaries: Mapping[str, Binary]
    apiservers: tuple[Apiserver, ...]
    timeline: tuple[Entry, ...]  # sorted by time, file order among equal times
    end_seconds: int
    step_seconds: int
    lease_duration_seconds: int
    heartbeat_interval_seconds: int
    lease_gc_check_period_seconds: int
    discovery_poll_seconds: int
    requests_per_second: float | None  # the migration target's rate limit; None: unlimited

    def resource(self, name: str) -> Resource:
        return next(r for r in self.resources if r.name == name)


DEFAULTS: Mapping[str, int] = {
    "step_seconds": 10,
    "lease_duration_seconds": 3600,
    "heartbeat_interval_seconds": 10,
    "lease_gc_check_period_seconds": 3600,
    "discovery_poll_seconds": 600,
}

_ACTIONS = ("start", "upgrade", "rollback", "crash", "stop", "write", "end")


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError(f"cannot read scenario {str(path)!r}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ScenarioError(
            f"scenario {str(path)!r} is not UTF-8 text (byte {error.start}:"
            f" {error.object[error.start : error.start + 1]!r}); a scenario is a YAML file"
        ) from None
    return parse(text, source=str(path))


def parse(text: str, source: str = "<scenario>") -> Scenario:
    try:
        document = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        raise ScenarioError(f"{source}: not valid YAML: {error}") from None
    if not isinstance(document, _Map):
        raise ScenarioError(f"{source}: a scenario is a YAML mapping, got {document!r}")
    return _Reader(source).scenario(_Node(document, "", source))


# --- YAML with line numbers --------------------------------------------------------------


class _Map(dict[str, Any]):
    """A YAML mapping that remembers the line of itself and of each key."""

    line: int
    key_lines: dict[str, int]


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    result = _Map({str(k): v for k, v in loader.construct_mapping(node, deep=True).items()})
    result.line = node.start_mark.line + 1
    result.key_lines = {str(key.value): key.start_mark.line + 1 for key, _ in node.value}
    return result


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)


@dataclasses.dataclass(frozen=True)
class _Node:
    """A mapping being read, with its path (``timeline[3]``) for error messages."""

    data: _Map
    path: str
    source: str

    def fail(self, key: str | None, problem: str) -> NoReturn:
        line = self.data.key_lines.get(key, self.data.line) if key else self.data.line
        where = f"{self.path}.{key}" if key and self.path else (key or self.path or "scenario")
        raise ScenarioError(f"{self.source}:{line}: {where}: {problem}")

    def allow(self, *keys: str) -> None:
        unknown = sorted(set(self.data) - set(keys))
        if unknown:
            self.fail(unknown[0], f"unknown key {unknown[0]!r}; allowed: {', '.join(keys)}")

    def required(self, key: str) -> Any:
        if key not in self.data:
            self.fail(None, f"missing required key {key!r}")
        return self.data[key]

    def text(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default) if default is not None else self.required(key)
        if not isinstance(value, str | int | float) or isinstance(value, bool) or value == "":
            self.fail(key, f"expected a non-empty string, got {value!r}")
        return str(value)

    def integer(self, key: str, default: int | None = None, minimum: int = 0) -> int:
        value = self.data.get(key, default) if default is not None else self.required(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(key, f"expected a whole number >= {minimum}, got {value!r}")
        return value

    def minutes(self, key: str) -> int:
        """A time in virtual minutes (fractions allowed), returned in whole seconds."""
        value = self.required(key)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not value >= 0  # NaN too
            or not math.isfinite(value * 60)
        ):
            self.fail(key, f"expected minutes >= 0 (e.g. 3 or 2.5), got {value!r}")
        seconds = value * 60
        if not math.isclose(seconds, round(seconds)):
            self.fail(key, f"{value!r} minutes is not a whole number of seconds")
        return round(seconds)

    def strings(self, key: str, default: tuple[str, ...] | None = None) -> tuple[str, ...]:
        if key not in self.data and default is not None:
            return default
        value = self.required(key)
        items = [value] if isinstance(value, str) else value
        if (
            not isinstance(items, list)
            or not items
            or not all(isinstance(i, str) and i for i in items)
        ):
            self.fail(key, f"expected a name or a non-empty list of names, got {value!r}")
        return tuple(items)

    def children(self, key: str) -> Iterator[_Node]:
        value = self.required(key)
        if not isinstance(value, list) or not value:
            self.fail(key, f"expected a non-empty list, got {value!r}")
        for index, item in enumerate(value):
            if not isinstance(item, _Map):
                self.fail(key, f"item {index} must be a mapping, got {item!r}")
            yield _Node(item, f"{key}[{index}]", self.source)

    def child(self, key: str) -> _Node:
        value = self.required(key)
        if not isinstance(value, _Map) or not value:
            self.fail(key, f"expected a non-empty mapping, got {value!r}")
        return _Node(value, f"{self.path}.{key}" if self.path else key, self.source)


@dataclasses.dataclass
class _Reader:
    source: str

    def scenario(self, root: _Node) -> Scenario:
        root.allow(
            "cluster",
            "seed",
            "resources",
            "binaries",
            "apiservers",
            "timeline",
            "requests_per_second",
            *DEFAULTS,
        )
        timing = {key: root.integer(key, default, minimum=1) for key, default in DEFAULTS.items()}
        if timing["lease_duration_seconds"] < 3 * max(
            timing["heartbeat_interval_seconds"], timing["step_seconds"]
        ):
            root.fail(
                "lease_duration_seconds",
                f"{timing['lease_duration_seconds']} is too short: a lease must outlive at"
                " least three heartbeats and three simulation steps, or live apiservers"
                " would be expired; raise it or lower heartbeat_interval_seconds/step_seconds",
            )
        rate = root.data.get("requests_per_second")
        if rate is not None and (
            not isinstance(rate, int | float)
            or isinstance(rate, bool)
            or not 0 < rate < math.inf  # NaN too
        ):
            root.fail("requests_per_second", f"expected a finite number > 0, got {rate!r}")
        resources = tuple(self.resource(node) for node in root.children("resources"))
        names = [r.name for r in resources]
        for duplicate in {n for n in names if names.count(n) > 1}:
            root.fail("resources", f"resource {duplicate!r} is declared twice")
        binaries_node = root.child("binaries")
        binaries = {
            str(name): self.binary(str(name), binaries_node, resources)
            for name in binaries_node.data
        }
        apiservers = tuple(self.apiserver(node, binaries) for node in root.children("apiservers"))
        hostnames = [a.hostname for a in apiservers]
        for duplicate in {h for h in hostnames if hostnames.count(h) > 1}:
            root.fail("apiservers", f"hostname {duplicate!r} is declared twice")
        timeline, end_seconds = self.timeline(root, resources, binaries, apiservers)
        return Scenario(
            cluster=root.text("cluster"),
            seed=root.integer("seed", 0),
            resources=resources,
            binaries=binaries,
            apiservers=apiservers,
            timeline=timeline,
            end_seconds=end_seconds,
            requests_per_second=None if rate is None else float(rate),
            **timing,
        )

    def resource(self, node: _Node) -> Resource:
        node.allow("group", "resource", "kind", "objects")
        group = node.data.get("group", "")
        if not isinstance(group, str):
            node.fail("group", f"expected a string ('' for the core group), got {group!r}")
        return Resource(
            group=group,
            resource=node.text("resource"),
            kind=node.text("kind"),
            objects=node.integer("objects", 20, minimum=1),
        )

    def binary(self, name: str, parent: _Node, resources: tuple[Resource, ...]) -> Binary:
        node = parent.child(name)
        node.allow(*(r.name for r in resources))
        encodings = {}
        for resource in resources:
            if resource.name not in node.data:
                node.fail(None, f"binary {name!r} does not say how it stores {resource.name!r}")
            encoding = node.child(resource.name)
            encoding.allow("encoding", "decodable", "served")
            version = encoding.text("encoding")
            decodable = encoding.strings("decodable", (version,))
            if version not in decodable:
                encoding.fail(
                    "decodable",
                    f"the encoding version {version!r} must be decodable; got {list(decodable)}",
                )
            encodings[resource.name] = Encoding(
                version, decodable, encoding.strings("served", decodable)
            )
        return Binary(name, encodings)

    def apiserver(self, node: _Node, binaries: Mapping[str, Binary]) -> Apiserver:
        node.allow("hostname", "binary")
        binary = node.text("binary")
        if binary not in binaries:
            node.fail("binary", f"unknown binary {binary!r}; declared: {', '.join(binaries)}")
        return Apiserver(node.text("hostname"), binary)

    def timeline(
        self,
        root: _Node,
        resources: tuple[Resource, ...],
        binaries: Mapping[str, Binary],
        apiservers: tuple[Apiserver, ...],
    ) -> tuple[tuple[Entry, ...], int]:
        located: list[tuple[int, _Node, Action]] = []
        end: tuple[int, _Node] | None = None
        for node in root.children("timeline"):
            at = node.minutes("at")
            present = [key for key in _ACTIONS if key in node.data]
            if len(present) != 1:
                node.fail(
                    None,
                    f"an entry has exactly one action of {', '.join(_ACTIONS)};"
                    f" got {present or 'none'}",
                )
            action = present[0]
            if action == "end":
                node.allow("at", "end", "note")
                if node.data["end"] is not True:
                    node.fail("end", f"write 'end: true', got {node.data['end']!r}")
                if end is not None:
                    node.fail("end", "the timeline has two 'end' entries")
                end = (at, node)
            elif action == "write":
                located.extend((t, node, w) for t, w in self.writes(node, at, resources))
            else:
                node.allow(
                    "at", action, "note", *(["to"] if action in ("upgrade", "rollback") else [])
                )
                for hostname in node.strings(action):
                    if hostname not in {a.hostname for a in apiservers}:
                        node.fail(
                            action,
                            f"{hostname!r} is not an apiserver of this scenario;"
                            f" declared: {', '.join(a.hostname for a in apiservers)}",
                        )
                    if "to" in node.data and node.text("to") not in binaries:
                        node.fail(
                            "to",
                            f"unknown binary {node.data['to']!r}; declared: {', '.join(binaries)}",
                        )
                    # Binaries are resolved by the lifecycle walk below; "" is a placeholder.
                    located.append((at, node, _placeholder(action, hostname)))
        if end is None:
            root.fail("timeline", "the timeline needs an entry 'end: true' saying when to stop")
        end_seconds, end_node = end
        if end_seconds == 0:
            end_node.fail("at", "the end must come after minute 0")
        located.sort(key=lambda item: item[0])  # stable: file order among equal times
        for at, node, _ in located:
            if at > end_seconds:
                node.fail(
                    "at", f"minute {at / 60:g} is after the end (minute {end_seconds / 60:g})"
                )
        return self.lifecycle(located, apiservers), end_seconds

    def writes(
        self, node: _Node, at: int, resources: tuple[Resource, ...]
    ) -> Iterator[tuple[int, Write]]:
        node.allow("at", "write", "count", "every", "until", "note")
        name = node.text("write")
        if name not in {r.name for r in resources}:
            node.fail(
                "write",
                f"unknown resource {name!r}; declared: {', '.join(r.name for r in resources)}",
            )
        count = node.integer("count", 1, minimum=1)
        if "every" not in node.data:
            if "until" in node.data:
                node.fail("until", "'until' needs 'every' (minutes between repetitions)")
            yield at, Write(name, count)
            return
        every, until = node.minutes("every"), node.minutes("until")
        if every == 0:
            node.fail("every", "must be more than 0 minutes")
        if until < at:
            node.fail("until", f"minute {until / 60:g} is before 'at' (minute {at / 60:g})")
        for time in range(at, until + 1, every):
            yield time, Write(name, count)

    def lifecycle(
        self, located: list[tuple[int, _Node, Action]], apiservers: tuple[Apiserver, ...]
    ) -> tuple[Entry, ...]:
        history = {a.hostname: [a.binary] for a in apiservers}  # binaries run, in order
        running: set[str] = set()
        started: set[str] = set()
        entries = []
        for at, node, action in located:
            note = node.data.get("note")
            if note is not None and not isinstance(note, str):
                node.fail("note", f"expected text, got {note!r}")
            if isinstance(action, Write):
                entries.append(Entry(at, action, note))
                continue
            host = action.hostname
            runs = history[host]
            if isinstance(action, Start):
                if host in running:
                    node.fail("start", f"{host!r} is already running at minute {at / 60:g}")
                action = Start(host, runs[-1])
            elif isinstance(action, Crash | Stop):
                key = "crash" if isinstance(action, Crash) else "stop"
                if host not in running:
                    node.fail(key, f"{host!r} is not running at minute {at / 60:g}")
            elif isinstance(action, Restart):
                binary = node.text("to") if "to" in node.data else None
                if binary is None and action.kind == "upgrade":
                    node.fail(None, "'upgrade' needs 'to': the binary to upgrade to")
                if binary is None:
                    if len(runs) < 2:
                        node.fail(
                            "rollback",
                            f"{host!r} has run no other binary than"
                            f" {runs[-1]!r}; say which one with 'to'",
                        )
                    binary = runs[-2]
                if binary == runs[-1] and host in started:
                    node.fail(
                        "to" if "to" in node.data else action.kind,
                        f"{host!r} already runs {binary!r}",
                    )
                action = Restart(host, binary, action.kind)
            if isinstance(action, Start | Restart):
                running.add(host)
                started.add(host)
                if action.binary != runs[-1]:
                    runs.append(action.binary)
            else:
                running.discard(host)
            entries.append(Entry(at, action, note))
        return tuple(entries)


def _placeholder(action: str, hostname: str) -> Action:
    if action == "start":
        return Start(hostname, "")
    if action == "crash":
        return Crash(hostname)
    if action == "stop":
        return Stop(hostname)
    assert action in ("upgrade", "rollback")
    return Restart(hostname, "", "upgrade" if action == "upgrade" else "rollback")
