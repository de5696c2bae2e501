"""Microbenchmark of the access-log sink in native mode: CPU per logged request (not a test).

Usage::

    python bench/bench_access_log.py [--entries N] [--batch B] [--repeat K]
                                     [--observe-share S] [--grpc]

Synthesises the entries Envoy's gRPC access logger sends for the native slice
route of ``tailroute bench load`` (the same fields, metadata namespaces and
custom tags as an entry recorded from Envoy 1.40: ~600 bytes each), serialises
them into ``StreamAccessLogsMessage`` batches of ``B`` entries, and then:

* **in process** (default): parses each batch from its bytes (as grpc does)
  and hands it to the sink stack ``tailroute serve`` builds in native mode
  (:class:`~sidecar.shell.access_log.AccessLogService` batch handling ->
  :class:`~sidecar.shell.native.NativeFeed` -> router), advancing the clock by
  one flush interval per batch. Prints process CPU per entry (``time.process_time``),
  the least and the median of ``K`` repeats, for the stages: decode, decode +
  the full conversion to a ``LogRecord``, the whole sink, and the router's
  share of it (the router fed the same calls: ``observe`` per observation,
  ``observe_ok`` per route and batch).
* ``--grpc``: starts the real sidecar (``tailroute serve``, native mode) and
  streams the same batches to it over the Access Log Service from this
  process, one batch every ``--interval-ms``, then prints the sidecar's CPU per
  entry from ``/proc`` (gRPC receive, event loop and publication included).

Figures on a shared machine are noisy: compare the stages within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from sidecar.core.config import parse_config  # noqa: E402
from sidecar.devtools.bench import cpu_seconds  # noqa: E402
from sidecar.devtools.bench_load import _config  # noqa: E402
from sidecar.ops import genai_metrics  # noqa: E402
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al  # noqa: E402
from sidecar.pb.envoy.service.accesslog.v3 import als_pb2  # noqa: E402
from sidecar.shell import envoy_contract as ec  # noqa: E402
from sidecar.shell.access_log import AccessLogService  # noqa: E402
from sidecar.shell.app import App  # noqa: E402
from sidecar.shell.native import NativeRouting  # noqa: E402
from sidecar.shell.outcomes import OutcomeFeed  # noqa: E402

try:  # the feed's module since the batch reader; before it, sidecar.shell.native
    from sidecar.shell.native_log import NativeFeed
except ImportError:  # a baseline checkout
    from sidecar.shell.native import NativeFeed  # type: ignore[attr-defined,no-redef]

ROUTE = "tailroute/bench-model.interactive.short.stream/len"
FLUSH_S = 0.1
LAUNCHER = [sys.executable, "-m", "sidecar.cli"]


def synth_entry(i: int, e: al.HTTPAccessLogEntry) -> None:
    """One native entry like Envoy's (values vary a little per request)."""
    c = e.common_properties
    c.start_time.FromMicroseconds(1_796_135_760_000_000 + i * 1000)
    us = 15_000 + (i * 7919) % 4000
    for name, v in (("time_to_last_rx_byte", 39), ("time_to_first_upstream_tx_byte", 103),
                    ("time_to_last_upstream_tx_byte", 106),
                    ("time_to_first_upstream_rx_byte", 8_800),
                    ("time_to_last_upstream_rx_byte", us + 100),
                    ("time_to_first_downstream_tx_byte", 8_830),
                    ("time_to_last_downstream_tx_byte", us + 130), ("duration", us + 140)):
        getattr(c, name).FromMicroseconds(v)
    c.upstream_cluster = "p"
    fm = c.metadata.filter_metadata
    fm["tailroute.usage"].fields["output_tokens"].number_value = 4
    req = fm["tailroute.request"].fields
    req["stream"].bool_value = True
    req["model"].string_value = "bench-model"
    req["max_tokens"].number_value = 4
    c.route_name = ROUTE
    if hasattr(ec, "TAG_ENTRY"):  # the native bootstrap's one tag
        parts = ["200", "-", str(us - 130), str(us), "4", "", ""]  # no rid, no stream error
        c.custom_tags[ec.TAG_ENTRY] = "|".join(parts[:ec.ENTRY_TAG_FORMAT.count("|") + 1])
    else:  # a baseline checkout: the two duration tags
        c.custom_tags["tr_first_body_us"] = str(us - 130)
        c.custom_tags["tr_end_us"] = str(us)
    c.upstream_request_attempt_count = 1
    sid = f"7b828367-13ff-4092-bce8-{i:012x}"
    c.stream_id = sid
    c.access_log_type = 5  # DownstreamEnd
    e.protocol_version = al.HTTPAccessLogEntry.HTTP11
    r = e.request
    r.request_method = 3  # POST
    r.scheme, r.authority, r.path, r.request_id = "http", "bench", "/v1/chat/completions", sid
    r.request_headers_bytes, r.request_body_bytes = 211, 304
    p = e.response
    p.response_code.value = 200
    p.response_headers_bytes, p.response_body_bytes = 150, 1482
    p.response_code_details = "via_upstream"


def batches(entries: int, batch: int) -> list[bytes]:
    out = []
    for start in range(0, entries, batch):
        msg = als_pb2.StreamAccessLogsMessage()
        if start == 0:
            msg.identifier.node.id = "bench-envoy"
            msg.identifier.log_name = "tailroute"
        for i in range(start, min(start + batch, entries)):
            synth_entry(i, msg.http_logs.log_entry.add())
        out.append(msg.SerializeToString())
    return out


def _app(observe_share: float) -> App:
    data = _config(9, 9, "native")
    data["stats"] = {"observe_share": observe_share}
    return App.create(parse_config(data, "bench.yaml"), seed=1)


def _service(app: App) -> AccessLogService:
    """The access-log service over the native sink, as ``tailroute serve`` wires it
    (the GenAI client histograms included)."""
    genai: Any = genai_metrics.attach(CollectorRegistry(), lambda: app.router.config)
    if hasattr(genai, "record_ok"):
        app.on_observation, app.on_ok_samples = genai.record, genai.record_ok
    else:  # a baseline checkout: attach returned the one hook, which native mode never called
        app.on_observation = genai
    native = NativeRouting(lambda: app.config, lambda: app.router)
    feed = NativeFeed(app, native, OutcomeFeed(app))
    reader = getattr(feed, "batch", None)
    if reader is None:  # a baseline checkout
        return AccessLogService(feed, app.envoy)
    return AccessLogService(feed, app.envoy, reader)


def _sink_stack(observe_share: float) -> tuple[AccessLogService, App]:
    app = _app(observe_share)
    return _service(app), app


def _consume_compat(service: Any) -> Any:
    """Batch handling of a version without ``AccessLogService.consume`` (baselines)."""
    from sidecar.shell.access_log import record_from_entry

    def consume(msg: Any, now: float) -> None:
        for e in msg.http_logs.log_entry:
            service.sink(record_from_entry(e), now)
    return consume


def in_process(raw: list[bytes], n: int, batch: int, repeat: int, observe_share: float) -> None:
    """Each stage's process CPU per entry; set-up is outside the timed part."""
    parse = als_pb2.StreamAccessLogsMessage.FromString

    def decode() -> float:
        t0 = time.process_time()
        for b in raw:
            for _e in parse(b).http_logs.log_entry:
                pass
        return time.process_time() - t0

    def convert() -> float:
        from sidecar.shell.access_log import record_from_entry

        t0 = time.process_time()
        for b in raw:
            for e in parse(b).http_logs.log_entry:
                record_from_entry(e)
        return time.process_time() - t0

    def sink() -> float:
        service, app = _sink_stack(observe_share)
        consume = getattr(service, "consume", None) or _consume_compat(service)
        now = 1000.0
        t0 = time.process_time()
        for b in raw:
            now += FLUSH_S
            consume(parse(b), now)
        cpu = time.process_time() - t0
        assert app.envoy["native"] == n, app.envoy
        return cpu

    def router_only() -> float:
        _, app = _sink_stack(observe_share)
        calls = _router_calls(raw, app)
        router = app.router
        t0 = time.process_time()
        for name, args in calls:
            getattr(router, name)(*args)
        return time.process_time() - t0

    print(f"{n} entries in batches of {batch}; CPU per entry (µs), least and median of "
          f"{repeat} (contention only adds: the least is the steadiest figure):")
    for name, fn in (("decode", decode), ("decode + LogRecord", convert),
                     ("whole sink", sink), ("of which the router", router_only)):
        xs = [fn() / n * 1e6 for _ in range(repeat)]
        print(f"  {name:24} {min(xs):7.2f}  (median {statistics.median(xs):.2f})")


def _router_calls(raw: list[bytes], app: App) -> list[tuple[str, tuple[Any, ...]]]:
    """The router calls the sink makes for these batches (for timing the router alone):
    ``observe`` per observation, ``observe_ok`` per route and batch where it has it."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    router = app.router
    names = [n for n in ("observe", "observe_ok") if hasattr(router, n)]
    for name in names:
        def keep(*args: Any, _name: str = name) -> list[Any]:
            seen.append((_name, args))
            return []
        setattr(router, name, keep)
    service = _service(app)
    consume = getattr(service, "consume", None) or _consume_compat(service)
    now = 1000.0
    for b in raw:
        now += FLUSH_S
        consume(als_pb2.StreamAccessLogsMessage.FromString(b), now)
    for name in names:
        delattr(router, name)
    return seen


async def _stream(port: int, raw: list[bytes], interval_s: float) -> None:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_unary(
            "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)

        async def gen() -> Any:
            for b in raw:
                yield b
                await asyncio.sleep(interval_s)

        await call(gen())


def over_grpc(raw: list[bytes], n: int, interval_s: float, observe_share: float) -> None:
    from sidecar.devtools.harness import free_port, http_json

    work = Path(tempfile.mkdtemp(prefix="bench-als-"))
    port = free_port()
    data = _config(9, port, "native")
    data["stats"] = {"observe_share": observe_share}
    (work / "c.yaml").write_text(yaml.safe_dump(data))
    ready = work / "ready"
    proc = subprocess.Popen(
        [*LAUNCHER, "serve", "--config", str(work / "c.yaml"),
         "--ready-file", str(ready), "--admin", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work,
        # this checkout's sidecar, not the installed one
        env={**os.environ,
             "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    try:
        for _ in range(300):
            if ready.exists() and ready.read_text().strip():
                break
            time.sleep(0.1)
        admin = int(ready.read_text().split()[1])
        asyncio.run(_stream(port, raw[:2], 0.01))  # warm up (connection, first batches)
        time.sleep(0.5)
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        asyncio.run(_stream(port, raw, interval_s))
        for _ in range(100):
            if http_json(f"http://127.0.0.1:{admin}/state")["envoy"]["native"] >= n:
                break
            time.sleep(0.05)
        cpu, wall = cpu_seconds(proc.pid) - c0, time.monotonic() - t0
        got = http_json(f"http://127.0.0.1:{admin}/state")["envoy"]["native"]
        print(f"over gRPC: {n} entries ({got} learned incl. warm-up) in {len(raw)} batches "
              f"every {interval_s * 1e3:g} ms, {wall:.1f} s: sidecar CPU "
              f"{cpu / n * 1e6:.1f} µs per entry ({cpu / wall * 100:.0f} % of a core)")
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=70, help="entries per message (c=16: ~70)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--observe-share", type=float, default=1.0)
    ap.add_argument("--grpc", action="store_true", help="through the real sidecar process")
    ap.add_argument("--interval-ms", type=float, default=20.0,
                    help="--grpc: pause between batches")
    a = ap.parse_args()
    raw = batches(a.entries, a.batch)
    if a.grpc:
        over_grpc(raw, a.entries, a.interval_ms / 1000, a.observe_share)
    else:
        in_process(raw, a.entries, a.batch, a.repeat, a.observe_share)


if __name__ == "__main__":
    main()
