"""The native sink's shortcut (entries read straight from the wire) learns exactly what
the record path learns: same observations, counters and load, entry by entry."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.core.config import parse_config
from sidecar.core.types import Observation, SliceKey
from sidecar.core.weights import SliceWeights
from sidecar.ops import genai_metrics, snapshot
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.pb.envoy.service.accesslog.v3 import als_pb2
from sidecar.shell import envoy_contract as ec
from sidecar.shell.access_log import AccessLogService
from sidecar.shell.app import App
from sidecar.shell.native import NativeRouting
from sidecar.shell.native_keys import route_name
from sidecar.shell.native_log import NativeFeed
from sidecar.shell.outcomes import OutcomeFeed

S = SliceKey("m", "interactive", "short", True)
PLAIN = SliceKey("m", "interactive", "short", False)  # a non-streaming slice
# %RESPONSE_FLAGS% short names of the flags used here.
_SHORT = {"upstream_remote_reset": "UR", "downstream_remote_reset": "DR",
          "upstream_request_timeout": "UT", "stream_idle_timeout": "SI"}


def _config(observe_share: float = 1.0) -> Any:
    return parse_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, n in enumerate("abc")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "routing": {"mode": "native"},
        "stats": {"subwindow_s": 5.0, "min_samples": 3, "observe_share": observe_share},
    }, "native.yaml")


def entry(route: str = route_name(S, "len"), cluster: str = "a", status: int = 200,
          first_us: str | None = "2100", end_us: str | None = "9000",
          tokens: float | None = 4, rid: str | None = None, details: str = "via_upstream",
          flags: tuple[str, ...] = (), tailroute_ns: bool = False,
          entry_tag: bool = True, stream_error: bool = False, error_value: str | None = None,
          attempts: int = 1, body_bytes: int = 180) -> al.HTTPAccessLogEntry:
    """An entry as Envoy logs it: with the native bootstrap's one tag, or
    (``entry_tag=False``) with the ext_proc bootstrap's two duration tags;
    ``error_value``: the lifted ``error`` field of a marked stream; ``attempts``:
    upstream attempts (Envoy's retries)."""
    e = al.HTTPAccessLogEntry()
    c = e.common_properties
    c.time_to_first_upstream_tx_byte.FromMicroseconds(300)
    c.duration.FromMicroseconds(12_000)
    c.route_name, c.upstream_cluster = route, cluster
    if entry_tag:  # as Envoy formats it: "-" for no flag, "" for what is missing
        count = "" if tokens is None else (
            str(int(tokens)) if float(tokens).is_integer() else repr(tokens))
        c.custom_tags[ec.TAG_ENTRY] = "|".join((
            str(status), ",".join(_SHORT[f] for f in flags) or "-", first_us or "",
            end_us or "", count, rid or "", "1" if stream_error else ""))
    else:
        if first_us is not None:
            c.custom_tags[ec.TAG_FIRST_BODY_US] = first_us
        if end_us is not None:
            c.custom_tags[ec.TAG_END_US] = end_us
    for f in flags:
        setattr(c.response_flags, f, True)
    fm = c.metadata.filter_metadata
    fm["tailroute.request"].fields["model"].string_value = "m"
    if tokens is not None:
        fm["tailroute.usage"].fields["output_tokens"].number_value = tokens
    if stream_error:
        fm["tailroute.usage"].fields["stream_error"].number_value = 1
        if error_value is not None:
            fm["tailroute.usage"].fields["error_value.error"].string_value = error_value
    c.upstream_request_attempt_count = attempts
    if rid is not None:
        fm["tailroute"].fields["rid"].string_value = rid
    elif tailroute_ns:
        fm["tailroute"].fields["slice"].string_value = S.label()
    e.request.request_method = 3
    e.request.path = "/v1/chat/completions"
    e.request.request_body_bytes = body_bytes  # Envoy logs what it received
    if status:
        e.response.response_code.value = status
    e.response.response_code_details = details
    return e


class Side:
    """One sink stack (as ``tailroute serve`` builds it), recording what the router
    learns: the observations it is handed one by one, and everything it holds after."""

    def __init__(self, shortcut: bool, observe_share: float = 1.0) -> None:
        self.app = app = App.create(_config(observe_share), seed=7)
        self.native = NativeRouting(lambda: app.config, lambda: app.router)
        # b holds only the probe share of S; c's first body byte says nothing (blind).
        self.native.layer.publish({S: SliceWeights(S, (("a", 9000), ("b", 500), ("c", 500)),
                                                    ("b",))}, 0.0)
        for _ in range(8):
            app.offsets.add("c", S, 0.010)
        self.seen: list[Observation] = []
        real = app.router.observe

        def observe(obs: Observation, now: float) -> Any:
            self.seen.append(obs)
            return real(obs, now)

        app.router.observe = observe  # type: ignore[method-assign]
        # The GenAI client histograms, wired as `tailroute serve` wires them.
        self.registry = CollectorRegistry()
        genai = genai_metrics.attach(self.registry, lambda: app.router.config)
        app.on_observation, app.on_ok_samples = genai.record, genai.record_ok
        feed = NativeFeed(app, self.native, OutcomeFeed(app))
        self.service = AccessLogService(feed, app.envoy, feed.batch if shortcut else None)

    def feed(self, entries: list[al.HTTPAccessLogEntry], now: float) -> None:
        msg = als_pb2.StreamAccessLogsMessage()
        msg.http_logs.log_entry.extend(entries)
        self.service.consume(als_pb2.StreamAccessLogsMessage.FromString(
            msg.SerializeToString()), now)

    def view(self) -> tuple[Any, ...]:
        """What the router learned (statistics, health and transitions as a warm-restart
        snapshot holds them, each series' version and last sample, the live-miss
        books' outcomes and misses), its counters, the sidecar's counters, the
        interval's load and the GenAI histograms' exposition."""
        self.native.load.roll(100.0)
        router = self.app.router
        series = {k: (rs.version, rs.last_seen) for k, rs in router.stats.items()}
        books = {k: (b.m, b.k) for k, b in router.live.books.items()}
        return (snapshot.build(router, 100.0, 0.0), series, books, dict(router.counters),
                dict(self.app.envoy), dict(self.native.counters), self.native.load.demand,
                generate_latest(self.registry).decode())


def _both(batches: list[list[al.HTTPAccessLogEntry]], observe_share: float = 1.0) -> None:
    """The shortcut side learns what the record path learns (which sees every entry
    as one observation, in order)."""
    fast, slow = Side(True, observe_share), Side(False, observe_share)
    for i, b in enumerate(batches):
        for side in (fast, slow):
            side.feed(b, 10.0 + 0.1 * i)
    assert fast.view() == slow.view()
    assert len(slow.seen) >= len(fast.seen)  # successes reach the router a route at a time


@pytest.mark.parametrize("e", [
    pytest.param(entry(), id="streamed ok"),
    pytest.param(entry(tokens=None), id="no usage"),
    pytest.param(entry(tokens=1), id="one token"),
    pytest.param(entry(tokens=2.5e9), id="implausible tokens"),
    pytest.param(entry(first_us=None), id="no first body"),
    pytest.param(entry(first_us="30000"), id="first after end"),
    pytest.param(entry(end_us=None), id="no end"),
    pytest.param(entry(end_us="garbled"), id="garbled end"),
    pytest.param(entry(cluster="b"), id="probe"),
    pytest.param(entry(cluster="c"), id="blind route"),
    pytest.param(entry(cluster="zz"), id="unknown cluster"),
    pytest.param(entry(cluster=""), id="no cluster"),
    pytest.param(entry(route=route_name(PLAIN, "nolen")), id="not streamed"),
    pytest.param(entry(route="tailroute_default"), id="default route"),
    pytest.param(entry(status=204), id="204"),
    pytest.param(entry(status=503), id="503"),
    pytest.param(entry(status=429), id="429"),
    pytest.param(entry(status=504), id="504"),
    pytest.param(entry(status=404), id="404"),
    pytest.param(entry(status=0), id="no response"),
    pytest.param(entry(flags=("upstream_remote_reset",)), id="upstream reset"),
    pytest.param(entry(flags=("downstream_remote_reset",), end_us=None), id="client reset"),
    pytest.param(entry(flags=("upstream_request_timeout",), status=504), id="upstream timeout"),
    pytest.param(entry(rid="r-1"), id="decided"),
    pytest.param(entry(tailroute_ns=True), id="tailroute metadata, no rid"),
    pytest.param(entry(details="tailroute_defer"), id="answered by tailroute"),
    pytest.param(entry(entry_tag=False), id="bootstrap without the entry tag"),
    pytest.param(entry(entry_tag=False, end_us=None), id="no entry tag, no end"),
    pytest.param(entry(stream_error=True), id="error event in a 200 stream"),
    pytest.param(entry(stream_error=True, entry_tag=False), id="error event, no entry tag"),
    pytest.param(entry(stream_error=True, error_value="boom"), id="a string error field"),
    pytest.param(entry(stream_error=True, error_value=""), id="an empty error field"),
    pytest.param(entry(attempts=3), id="Envoy retried"),
])
def test_each_kind_of_entry_is_learned_alike_on_both_paths(e: al.HTTPAccessLogEntry) -> None:
    _both([[e, entry()]])


@pytest.mark.parametrize("shortcut", [True, False])
def test_native_requests_reach_the_genai_histograms(shortcut: bool) -> None:
    """Native requests are learned from their entries without App.observe, so the GenAI
    client histograms stayed empty in native and hybrid mode: the dashboard's upstream
    latency panels and TailrouteUpstreamTTFTOverBudget saw nothing. Now each observed
    entry is recorded once, as the per-request path records its observation."""
    completion = entry(route=route_name(PLAIN, "len"), tokens=3)
    completion.request.path = "/v1/completions"
    side = Side(shortcut)
    side.feed([entry(), entry(), entry(cluster="b"), entry(status=503), completion,
               entry(tokens=1)], 10.0)
    fams = {f.name: f for f in text_string_to_metric_families(
        generate_latest(side.registry).decode())}
    counts = {(s.labels["cluster"], s.labels["gen_ai_operation_name"],
               s.labels.get("error_type")): s.value
              for s in fams["gen_ai_client_operation_duration_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {("a", "chat", None): 3, ("b", "chat", None): 1,
                      ("a", "chat", "503"): 1, ("a", "text_completion", None): 1}
    first = [s for s in fams["gen_ai_client_operation_time_to_first_chunk_seconds"].samples
             if s.name.endswith("_count")]
    assert sum(s.value for s in first) == 4  # the streamed successes
    chunks = [s for s in fams["gen_ai_client_operation_time_per_output_chunk_seconds"].samples
              if s.name.endswith("_count")]
    assert sum(s.value for s in chunks) == 3 * 3  # three streams of 4 tokens: 3 intervals


def test_the_common_entry_takes_the_shortcut_and_the_rest_the_record_path() -> None:
    side = Side(True)
    take = side.service.reader(10.0)  # type: ignore[misc]
    assert take(entry()) and take(entry(cluster="b")) and take(entry(tokens=None))
    assert not any(take(e) for e in (entry(status=503), entry(rid="r-1"), entry(end_us=None),
                                     entry(flags=("upstream_remote_reset",)),
                                     entry(route="tailroute_default"),
                                     entry(entry_tag=False), entry(stream_error=True),
                                     entry(attempts=2)))


def test_an_empty_error_field_is_ok_and_no_stream_error() -> None:
    side = Side(True)
    side.feed([entry(stream_error=True, error_value=""), entry()], 10.0)
    assert [o.outcome for o in side.seen][:1] == ["ok"]
    assert side.app.router.counters[("outcome", "ok")] == 2
    assert side.app.stream_errors == {}


def test_envoys_retries_are_counted_per_cluster() -> None:
    side = Side(True)
    side.feed([entry(attempts=3), entry(), entry(cluster="b", attempts=2)], 10.0)
    assert side.app.upstream_retries == {"a": 2, "b": 1}
    counters = side.app.shell_counters()
    assert counters["upstream_retry:a"] == 2 and counters["upstream_retry:b"] == 1
    # The request itself is learned once, by its last attempt, and each retried
    # attempt as an error of its route (evidence, not an outcome).
    assert side.app.router.counters[("outcome", "ok")] == 3
    assert ("outcome", "error") not in side.app.router.counters
    assert sorted((o.cluster, o.outcome) for o in side.seen if o.attempt) == [
        ("a", "error"), ("a", "error"), ("b", "error")]


def test_an_error_event_in_a_200_stream_is_learned_as_an_error() -> None:
    side = Side(True)
    side.feed([entry(stream_error=True), entry()], 10.0)
    outcomes = [o.outcome for o in side.seen]
    assert outcomes[0] == "error" and side.app.router.counters[("outcome", "error")] == 1
    assert side.app.stream_errors == {"a": 1}
    assert side.app.shell_counters()["stream_error:a"] == 1


def test_an_entry_tag_without_the_stream_error_part_still_takes_the_shortcut() -> None:
    """An Envoy on a bootstrap rendered before the part existed (six parts)."""
    old = entry()
    c = old.common_properties
    c.custom_tags[ec.TAG_ENTRY] = c.custom_tags[ec.TAG_ENTRY].rpartition("|")[0]
    take = Side(True).service.reader(10.0)  # type: ignore[misc]
    assert take(old)
    c.custom_tags[ec.TAG_ENTRY] += "|x|y"  # neither the old nor the new format
    assert not take(old)


@pytest.mark.parametrize(("first", "end"), [("2100", "9000"), (None, "9000"), ("2100", None),
                                            ("x", "")])
def test_the_entry_tag_gives_the_record_the_same_durations(first: str | None,
                                                            end: str | None) -> None:
    from sidecar.shell.access_log import record_from_entry

    assert (record_from_entry(entry(first_us=first, end_us=end))
            == record_from_entry(entry(first_us=first, end_us=end, entry_tag=False)))


def test_fast_ejection_and_counts_hold_over_many_batches() -> None:
    failing = [entry(status=503, cluster="a") for _ in range(6)]
    fine = [entry(cluster=c) for c in "aabc" * 5]
    _both([fine, failing, fine, fine])
    side = Side(True)
    side.feed(fine, 10.0)
    side.feed(failing, 10.1)
    assert side.app.envoy["native"] == len(fine) + len(failing)
    assert any(t.cluster == "a" and t.new == "quarantined"
               for t in side.app.router.transitions)


_entries = st.builds(
    entry,
    route=st.sampled_from([route_name(S, "len"), route_name(PLAIN, "len"), "other"]),
    cluster=st.sampled_from(["a", "b", "c", "zz"]),
    status=st.sampled_from([0, 200, 201, 404, 429, 500, 503, 504]),
    first_us=st.one_of(st.none(), st.integers(0, 50_000).map(str), st.just("x")),
    end_us=st.one_of(st.none(), st.integers(0, 50_000).map(str)),
    tokens=st.one_of(st.none(), st.integers(0, 9), st.sampled_from([2.5, 1e10])),
    rid=st.one_of(st.none(), st.just("r-1")),
    flags=st.lists(st.sampled_from(["upstream_remote_reset", "downstream_remote_reset",
                                    "stream_idle_timeout"]), max_size=1).map(tuple),
    entry_tag=st.booleans(),
    stream_error=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_entries, min_size=1, max_size=8), min_size=1, max_size=4),
       st.sampled_from([1.0, 0.5]))
def test_any_batches_are_learned_alike_on_both_paths(
        batches: list[list[al.HTTPAccessLogEntry]], share: float) -> None:
    _both(batches, share)


@pytest.mark.parametrize(("path", "status", "counted"), [
    ("/v1/chat/completions", 200, True),
    ("/v1/responses", 200, True),
    ("/v1/messages", 200, False),  # another API: its message_start has a top-level message
    ("/v1/chat/completions", 500, False),  # a status error already: not a 200 stream
])
def test_stream_errors_are_counted_on_2xx_llm_entries(path: str, status: int,
                                                      counted: bool) -> None:
    from sidecar.core.envoy_log import LogRecord

    app = App.create(_config(1.0), seed=7)
    OutcomeFeed(app)(LogRecord(status=status, method="POST", path=path,
                               upstream_cluster="a", stream_error=True), 1.0)
    assert app.stream_errors == ({"a": 1} if counted else {})


@pytest.mark.parametrize(("e", "kind"), [
    # No slice route matched (a model no route serves, a body json_to_metadata could
    # not read): the native path's default route, not the sidecar failing open (it
    # used to page TailrouteEnvoyFailOpen at 100 %: native requests never ask).
    (entry(route="tailroute_default"), "native_default"),
    (entry(route="tailroute_default", status=400), "native_default"),
    (entry(route="tailroute_default", rid="r-9"), "decided"),  # a per-request decision
    (entry(route="tailroute_default", cluster=""), "unrouted"),  # Envoy's own 413
    # A POST without a body: nothing to route on any path (its own upstream's 400).
    (entry(route="tailroute_default", status=400, body_bytes=0), "not_routed"),
    (entry(), "native"),
])
def test_the_native_default_route_is_no_sidecar_fail_open(e: al.HTTPAccessLogEntry,
                                                         kind: str) -> None:
    side = Side(shortcut=True)
    side.feed([e], 10.0)
    envoy = side.app.envoy
    assert envoy["fail_open"] == 0 and envoy[kind] == 1 and envoy["entries"] == 1
    counters = side.app.shell_counters()
    assert ("failopen:native_default" in counters) == (kind == "native_default")
    assert "failopen:envoy" not in counters
    assert side.app.envoy_view(10.0)["native_default"] == envoy["native_default"]


@pytest.mark.parametrize("shortcut", [True, False])
def test_a_slice_route_sending_to_a_cluster_the_config_does_not_route_is_misrouted(
        shortcut: bool, caplog: pytest.LogCaptureFixture) -> None:
    """The sidecar restarted with c dropped from the model's candidates (and zz gone),
    Envoy not: its slice route still lists them, the layer no longer has their keys, so
    Envoy gives them the bootstrap's equal weight (a real Envoy sent 47 of 150 requests
    to the dropped cluster). Before, c's entries were learned as evidence about a route
    the config does not have and zz's counted as `native_no_upstream`, without a word."""
    import logging

    cfg = parse_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, n in enumerate("abc")],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "routing": {"mode": "native"},
        "stats": {"subwindow_s": 5.0, "min_samples": 3},
    }, "native.yaml")
    app = App.create(cfg, seed=7)
    native = NativeRouting(lambda: app.config, lambda: app.router)
    feed = NativeFeed(app, native, OutcomeFeed(app))
    service = AccessLogService(feed, app.envoy, feed.batch if shortcut else None)
    msg = als_pb2.StreamAccessLogsMessage()
    msg.http_logs.log_entry.extend([entry(cluster="c"), entry(cluster="zz"), entry(),
                                    entry(cluster="c", status=503)])
    with caplog.at_level(logging.WARNING, logger="tailroute"):
        service.consume(msg, 10.0)
    assert app.envoy["native"] == 4 and app.envoy["misrouted"] == 3
    assert app.envoy["native_no_upstream"] == 0
    assert {cluster for (cluster, _), _ in app.router.stats.items()} == {"a"}
    native.load.roll(100.0)
    assert {c for (_, c) in native.load.demand} <= {"a"}
    assert not [t for t in app.router.transitions if t.cluster != "a"]
    lines = [r.getMessage() for r in caplog.records if r.name == "tailroute"]
    assert any(m.startswith("native.yaml: models[0].candidates does not route model m to "
                            "cluster c, but Envoy's route tailroute/") and "re-render" in m
               for m in lines), lines


def test_native_entries_are_a_kind_of_access_log_entry_in_the_metrics() -> None:
    """In native mode nearly every entry is `native`, which /state showed and the
    metric's kinds left out: summed by kind, tailroute_access_log_entries_total read
    about 0 however much Envoy served."""
    from sidecar.ops.metrics import build_registry

    side = Side(shortcut=True)
    side.feed([entry(), entry(status=503), entry(route="tailroute_default")], 10.0)
    registry = build_registry(lambda: side.app.router, lambda: 10.0,
                              side.app.shell_counters).registry
    kinds = {s.labels["kind"]: s.value
             for f in text_string_to_metric_families(generate_latest(registry).decode())
             if f.name == "tailroute_access_log_entries" for s in f.samples
             if s.name.endswith("_total")}
    assert kinds["native"] == 2 and kinds["native_default"] == 1
