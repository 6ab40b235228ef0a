"""Audit throughput: ``svledger audit`` reading 100,000 objects from a local etcd.

Starts a throwaway etcd (:func:`local_etcd`) and loads it through its JSON gateway, in
transactions of 1,000 puts, with ``--keys`` values (default 100,000) of about 500 bytes
each, as kube-apiserver writes them: 80% ConfigMaps in protobuf (built from one that
kube-apiserver v1.37.2 wrote, ``tests/unit/data/etcd/stored_values.json``, with its own
name, uid and data), 10% Secrets encrypted at rest (``k8s:enc:aescbc:v1:key1:`` then
random bytes), 10% custom resources in JSON, spread over 100 namespaces. Then it reads
them as the audit does (:class:`kube.etcd.EtcdStore`, :func:`kube.auditor.read_store`,
counted by :class:`kube.audit.Audit` and placed by :class:`kube.store_layout.Layout`),
with no Kafka:

* ``page_500`` and ``page_1000``: every key, in pages of 500 (the audit's default) and
  1,000, unpaced;
* ``page_10``: the 10,000 custom resources alone, in pages of 10, unpaced: what a
  request costs;
* ``default_pace``: every key as ``svledger audit`` reads it by default (500 keys a page,
  at most 20 pages a second);

each with keys/s, wall time, the range requests made (one count per prefix, then the
pages) and the bytes received (as the store estimates them from the values' size), this
process's CPU seconds, and etcd's own cost, from its ``/metrics`` before and after: the
Range calls it handled (``grpc_server_handled_total``; the JSON gateway calls etcd's
gRPC server, so each request is one), the bytes its gRPC server sent
(``etcd_network_client_grpc_sent_bytes_total``) and its CPU seconds. ``tally_only``
counts the same keys with :class:`kube.audit.Audit` from memory, no I/O (the median of
three runs). ``one_key_ms``: a Range of one key from the first key, the middle one and
the last to the end of the prefix: etcd counts every key left in the range for each
answer's ``count`` (there is no asking it not to), so a page costs etcd in proportion to
the keys after it, and a read of N keys in pages of P about N²/2P keys counted. Prints
one JSON object, and a summary to stderr.

:func:`local_etcd` is also the etcd of the audit's error tests
(``tests/integration/test_audit_errors.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import math
import random
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from deploy.kube.etcd import TXN_PUTS, gateway, local_etcd, put_all
from kube.audit import Audit
from kube.auditor import PAGE_SIZE, PAGES_PER_SECOND, read_store
from kube.etcd import EtcdSettings, EtcdStore
from kube.protobuf import BYTES, MAGIC, STRING, Fields, declare, parse, unwrap
from kube.store_layout import Layout
from svledger.options import positive

NAMESPACES: Final = 100
VALUE_BYTES: Final = 500
GROUP: Final = "capture.svledger.io"
LAYOUT: Final = Layout.of([("", "configmaps"), ("", "secrets")], [(GROUP, "widgets")])
CAPTURED: Final = Path(__file__).resolve().parent.parent / "tests/unit/data/etcd/stored_values.json"

# A ConfigMap as kube-apiserver stores it: the envelope (kube.protobuf), and of the object
# the fields the bench changes, with upstream's field numbers (k8s.io/api/core/v1 and
# apimachinery's meta/v1 generated.proto); the fields not declared are kept as read, in
# their place (ObjectMeta's are numbered after those declared).
_MESSAGES: Final[dict[str, Fields]] = {
    "TypeMeta": (("apiVersion", 1, STRING), ("kind", 2, STRING)),
    "Unknown": (
        ("typeMeta", 1, "TypeMeta"),
        ("raw", 2, BYTES),
        ("contentEncoding", 3, STRING),
        ("contentType", 4, STRING),
    ),
    "ObjectMeta": tuple(
        (name, number, STRING)
        for number, name in enumerate(
            ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion"), 1
        )
    ),
    "DataEntry": (("key", 1, STRING), ("value", 2, STRING)),  # one entry of its data map
    "ConfigMap": (("metadata", 1, "ObjectMeta"), ("data", 2, "DataEntry")),
}


# ---------------------------------------------------------------------- etcd


# ---------------------------------------------------------------------- the store


def _configmaps() -> tuple[Any, bytes]:
    """The message classes, and a ConfigMap kube-apiserver v1.37.2 stored."""
    classes = declare("svledger/bench-configmap.proto", "svledger.bench", _MESSAGES)
    captured = json.loads(CAPTURED.read_text())
    (value,) = [e["value"] for e in captured if e["key"] == "/registry/configmaps/default/cm"]
    return classes, base64.b64decode(value)


def values(keys: int, seed: int = 1) -> list[tuple[str, bytes]]:
    """``keys`` (key, value) pairs as kube-apiserver stores them (see the module doc)."""
    classes, captured = _configmaps()
    envelope = parse(classes["Unknown"], captured[len(MAGIC) :])
    configmap = parse(classes["ConfigMap"], unwrap(captured).raw)
    rng = random.Random(seed)
    pairs = []
    for i in range(keys):
        namespace = f"ns-{i % NAMESPACES:03d}"
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if i % 10 == 8:  # aescbc: a 16-byte IV, then whole 16-byte blocks
            name = f"secret-{i:06d}"
            key = f"/registry/secrets/{namespace}/{name}"
            value = b"k8s:enc:aescbc:v1:key1:" + rng.randbytes(VALUE_BYTES - 20)
        elif i % 10 == 9:
            name = f"widget-{i:06d}"
            key = f"/registry/{GROUP}/widgets/{namespace}/{name}"
            document: dict[str, Any] = {
                "apiVersion": f"{GROUP}/v1",
                "kind": "Widget",
                "metadata": {
                    "creationTimestamp": "2026-12-06T20:31:19Z",
                    "generation": 1,
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                },
            }
            pad = VALUE_BYTES - len(json.dumps(document, separators=(",", ":"))) - 22
            document["spec"] = {"size": rng.randrange(100), "text": "w" * pad}
            value = json.dumps(document, separators=(",", ":")).encode() + b"\n"
        else:
            name = f"cm-{i:06d}"
            key = f"/registry/configmaps/{namespace}/{name}"
            configmap.metadata.name, configmap.metadata.namespace = name, namespace
            configmap.metadata.uid = uid
            configmap.data.value = "v" * (VALUE_BYTES - 190)
            envelope.raw = configmap.SerializeToString()
            value = MAGIC + envelope.SerializeToString()
        pairs.append((key, value))
    return pairs


# ---------------------------------------------------------------------- measuring


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def etcd_metrics(url: str) -> dict[str, float]:
    """etcd's Range calls handled, bytes its gRPC server sent and CPU seconds, so far."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {"range_calls": 0.0, "grpc_sent_bytes": 0.0, "cpu_seconds": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "grpc_server_handled_total"
                and sample.labels.get("grpc_method") == "Range"
            ):
                found["range_calls"] += sample.value
            elif sample.name == "etcd_network_client_grpc_sent_bytes_total":
                found["grpc_sent_bytes"] += sample.value
            elif sample.name == "process_cpu_seconds_total":
                found["cpu_seconds"] += sample.value
    return found


async def read(
    url: str, prefixes: Sequence[str], page_size: int, pages_per_second: float = math.inf
) -> dict[str, Any]:
    """One read of ``prefixes`` as the audit reads, and what it cost etcd and this process."""
    before = etcd_metrics(url)
    cpu = _cpu_seconds()
    began = time.perf_counter()
    store = EtcdStore(url, EtcdSettings((url,)))
    try:
        audit = await read_store(store, LAYOUT, prefixes, page_size, pages_per_second)
    finally:
        await store.close()
    seconds = time.perf_counter() - began
    cpu = _cpu_seconds() - cpu
    after = etcd_metrics(url)
    spent = {name: after[name] - before[name] for name in before}
    return {
        "page_size": page_size,
        "pages_per_second": None if math.isinf(pages_per_second) else pages_per_second,
        "keys": audit.keys,
        "seconds": round(seconds, 3),
        "keys_per_second": round(audit.keys / seconds),
        "range_requests": len(prefixes) + audit.pages,
        "bytes_received": audit.bytes_read,
        "client_cpu_seconds": round(cpu, 2),
        "etcd": {
            "range_calls": int(spent["range_calls"]),
            "grpc_sent_bytes": int(spent["grpc_sent_bytes"]),
            "cpu_seconds": round(spent["cpu_seconds"], 2),
        },
    }


def tally_only(pairs: Sequence[tuple[str, bytes]], page_size: int = PAGE_SIZE) -> dict[str, Any]:
    """Counting ``pairs`` with :class:`Audit` alone, from memory: the median of 3 runs."""
    runs = []
    for _ in range(3):
        audit = Audit(LAYOUT, 1)
        began = time.perf_counter()
        for start in range(0, len(pairs), page_size):
            audit.add_page(pairs[start : start + page_size])
        runs.append(time.perf_counter() - began)
    seconds = statistics.median(runs)
    return {
        "keys": len(pairs),
        "seconds": round(seconds, 3),
        "keys_per_second": round(len(pairs) / seconds),
    }


def one_key(url: str, start: str, end: str) -> float:
    """Milliseconds a Range of one key (``limit`` 1) from ``start`` to ``end`` takes, the
    median of 20: etcd counts every key in the range for its answer's ``count``, so this
    is what a page costs beyond its keys."""
    body = {
        "key": base64.b64encode(start.encode()).decode(),
        "range_end": base64.b64encode(end.encode()).decode(),
        "limit": 1,
    }
    runs = []
    for _ in range(20):
        began = time.perf_counter()
        gateway(url, "kv/range", body)
        runs.append(time.perf_counter() - began)
    return round(statistics.median(runs) * 1000, 2)


async def measure(url: str, keys: int) -> dict[str, Any]:
    pairs = values(keys)
    # Held to the end, for tally_only: out of the collector's way, as a real audit holds
    # one page at a time.
    gc.freeze()
    began = time.perf_counter()
    put_all(url, pairs)
    loaded = time.perf_counter() - began
    everything = LAYOUT.prefixes()
    ordered = sorted(key for key, _ in pairs)
    end = everything[0][:-1] + "0"  # the first key after the prefix's (its "/" + 1)
    widgets = LAYOUT.prefixes([(GROUP, "widgets")])
    return {
        "keys": keys,
        "value_bytes": round(sum(len(v) for _, v in pairs) / len(pairs)),
        "load": {"seconds": round(loaded, 2), "keys_per_second": round(keys / loaded)},
        "page_500": await read(url, everything, 500),
        "page_1000": await read(url, everything, 1000),
        "page_10": await read(url, widgets, 10),
        "default_pace": await read(url, everything, PAGE_SIZE, PAGES_PER_SECOND),
        "tally_only": tally_only(pairs),
        "one_key_ms": {
            "from_the_first_key": one_key(url, ordered[0], end),
            "from_the_middle": one_key(url, ordered[len(ordered) // 2], end),
            "from_the_last_key": one_key(url, ordered[-1], end),
        },
    }


def summary(result: dict[str, Any]) -> str:
    lines = [f"{result['keys']} keys of {result['value_bytes']} bytes on average"]
    for stage in ("page_500", "page_1000", "page_10", "default_pace"):
        r = result[stage]
        lines.append(
            f"{stage}: {r['keys']} keys in {r['seconds']:.2f} s, {r['keys_per_second']} keys/s,"
            f" {r['range_requests']} requests ({r['etcd']['range_calls']} Range calls in etcd),"
            f" {r['bytes_received'] / 2**20:.1f} MiB received"
            f" ({r['etcd']['grpc_sent_bytes'] / 2**20:.1f} MiB sent by etcd's gRPC server);"
            f" CPU: this process {r['client_cpu_seconds']} s, etcd {r['etcd']['cpu_seconds']} s"
        )
    tally, one = result["tally_only"], result["one_key_ms"]
    lines.append(f"tally_only: {tally['keys_per_second']} keys/s ({tally['seconds']} s)")
    lines.append(
        f"one key from the first, middle, last key: {one['from_the_first_key']},"
        f" {one['from_the_middle']}, {one['from_the_last_key']} ms"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=positive(int, "number of keys"), default=100_000)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="svledger-audit-bench-") as workdir,
        local_etcd(Path(workdir), f"--max-txn-ops={TXN_PUTS}") as url,
    ):
        result = asyncio.run(measure(url, args.keys))
    print(json.dumps({"benchmark": "audit", **result}))
    print(summary(result), file=sys.stderr)


if __name__ == "__main__":
    main()
