"""The OpenTelemetry GenAI client histograms as a scraper sees them: parsed back from the
exposition with prometheus_client's parsers (type, unit, buckets, attributes)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from sidecar.core.config import Config, parse_config
from sidecar.core.envoy_log import LogRecord
from sidecar.core.types import Api, Observation, SliceKey
from sidecar.ops.genai_metrics import (
    FAMILIES,
    SECONDS_BUCKETS,
    TOKEN_BUCKETS,
    GenAIClientMetrics,
    exported_name,
)
from sidecar.ops.metrics import build_registry
from sidecar.shell.app import App
from sidecar.shell.extproc import RouteStream
from sidecar.shell.outcomes import OutcomeFeed
from tests.conftest import base_config_dict
from tests.streamharness import body_only_msg, chat_request, routed_cluster

DURATION = "gen_ai_client_operation_duration_seconds"
FIRST_CHUNK = "gen_ai_client_operation_time_to_first_chunk_seconds"
PER_CHUNK = "gen_ai_client_operation_time_per_output_chunk_seconds"
TOKENS = "gen_ai_client_token_usage"
STREAM = SliceKey("m", "interactive", "short", True)
UNARY = SliceKey("m", "interactive", "short", False)


@pytest.fixture
def cfg() -> Config:
    data = base_config_dict()
    data["clusters"][1]["provider"] = "azure.ai.openai"
    return parse_config(data, "test.yaml")


def _scrape(metrics: GenAIClientMetrics) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both expositions, parsed: (Prometheus text 0.0.4, OpenMetrics)."""
    reg = CollectorRegistry()
    reg.register(metrics)
    text = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    om = {f.name: f for f in parse_openmetrics(generate_openmetrics(reg).decode())}
    return text, om


def _series(fam: Any, suffix: str) -> list[Any]:
    return [s for s in fam.samples if s.name == fam.name + suffix]


def _ok(cluster: str = "a", **kw: Any) -> Observation:
    base: dict[str, Any] = {"status": 200, "ttft_s": 0.15, "tpot_s": 0.02, "e2e_s": 0.55,
                            "output_tokens": 21}
    return Observation(cluster, kw.pop("slice", STREAM), "ok", **{**base, **kw})


def test_families_are_histograms_with_otel_units_and_recommended_buckets(cfg: Config) -> None:
    m = GenAIClientMetrics(lambda: cfg)
    m.record(_ok(), "chat")
    text, om = _scrape(m)
    expected = {DURATION: ("seconds", SECONDS_BUCKETS), FIRST_CHUNK: ("seconds", SECONDS_BUCKETS),
                PER_CHUNK: ("seconds", SECONDS_BUCKETS), TOKENS: ("", TOKEN_BUCKETS)}
    assert {exported_name(f) for f in FAMILIES} == set(expected)
    for name, (unit, bounds) in expected.items():
        assert text[name].type == "histogram", name
        assert om[name].type == "histogram" and om[name].unit == unit, name
        les = [float(s.labels["le"]) for s in _series(text[name], "_bucket")]
        assert les == [*bounds, float("inf")], name
        counts = [s.value for s in _series(text[name], "_bucket")]
        assert counts == sorted(counts)  # cumulative
        (count,) = _series(text[name], "_count")
        assert count.value == counts[-1]


def test_attributes_follow_the_conventions_mapped_to_prometheus(cfg: Config) -> None:
    m = GenAIClientMetrics(lambda: cfg)
    m.record(_ok("c"), "chat")
    m.record(_ok("b", slice=UNARY, ttft_s=None, tpot_s=None), "completions")
    text, _ = _scrape(m)
    by_cluster = {s.labels["cluster"]: s.labels for s in _series(text[DURATION], "_count")}
    assert by_cluster["c"] == {
        "cluster": "c", "gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai",
        "gen_ai_request_model": "m-upstream",  # the name sent upstream, after the rewrite
        "server_address": "127.0.0.1", "server_port": "9003"}
    assert by_cluster["b"]["gen_ai_operation_name"] == "text_completion"
    assert by_cluster["b"]["gen_ai_provider_name"] == "azure.ai.openai"
    tokens = _series(text[TOKENS], "_count")
    assert {s.labels["cluster"] for s in tokens} == {"b", "c"}
    assert all(s.labels["gen_ai_token_type"] == "output" for s in tokens)
    assert all("error_type" not in s.labels for s in text[DURATION].samples)


@pytest.mark.parametrize(("obs", "error_type"), [
    (Observation("a", STREAM, "timeout", None, ttft_s=30.0, e2e_s=30.0, censored=True),
     "timeout"),
    (Observation("a", STREAM, "cancel", 200, e2e_s=2.5, censored=True), "cancelled"),
    (Observation("a", UNARY, "error", 503, e2e_s=0.2), "503"),
])
def test_failed_operations_carry_error_type_and_only_a_duration(
    cfg: Config, obs: Observation, error_type: str
) -> None:
    m = GenAIClientMetrics(lambda: cfg)
    m.record(obs, "chat")
    text, _ = _scrape(m)
    (count,) = _series(text[DURATION], "_count")
    assert count.labels["error_type"] == error_type and count.value == 1
    (total,) = _series(text[DURATION], "_sum")
    assert total.value == pytest.approx(obs.e2e_s)
    for name in (FIRST_CHUNK, PER_CHUNK, TOKENS):  # no latency or usage from a failure
        assert not text[name].samples


def test_values_land_in_the_right_buckets(cfg: Config) -> None:
    m = GenAIClientMetrics(lambda: cfg)
    m.record(_ok(ttft_s=0.08, e2e_s=1.28, tpot_s=0.03, output_tokens=11), "chat")
    text, _ = _scrape(m)

    def cumulative(name: str, le: str) -> float:
        return next(s.value for s in _series(text[name], "_bucket") if s.labels["le"] == le)

    assert cumulative(FIRST_CHUNK, "0.04") == 0 and cumulative(FIRST_CHUNK, "0.08") == 1  # le
    assert cumulative(DURATION, "0.64") == 0 and cumulative(DURATION, "1.28") == 1
    # Per output chunk: the response's 10 intervals at its mean, so _sum and _count are exact.
    assert cumulative(PER_CHUNK, "0.02") == 0 and cumulative(PER_CHUNK, "0.04") == 10
    assert _series(text[PER_CHUNK], "_sum")[0].value == pytest.approx(0.3)
    assert cumulative(TOKENS, "4.0") == 0 and cumulative(TOKENS, "16.0") == 1


def test_streaming_only_metrics_skip_unary_responses(cfg: Config) -> None:
    m = GenAIClientMetrics(lambda: cfg)
    m.record(_ok(slice=UNARY, ttft_s=None, tpot_s=None), "chat")
    text, _ = _scrape(m)
    assert _series(text[DURATION], "_count")[0].value == 1
    assert not text[FIRST_CHUNK].samples and not text[PER_CHUNK].samples
    assert _series(text[TOKENS], "_count")[0].value == 1


def test_label_values_come_from_config_only(cfg: Config) -> None:
    m = GenAIClientMetrics(lambda: cfg)
    unknown = SliceKey("_unknown", "interactive", "short", True)
    m.record(_ok(slice=unknown), "chat")  # a model the config does not know
    m.record(_ok("gone"), "chat")  # a cluster a reload removed mid-request
    text, _ = _scrape(m)
    (count,) = _series(text[DURATION], "_count")
    assert count.labels["cluster"] == "a" and "gen_ai_request_model" not in count.labels


def test_reload_relabels_new_observations_and_keeps_old_series(cfg: Config) -> None:
    live = {"cfg": cfg}
    m = GenAIClientMetrics(lambda: live["cfg"])
    m.record(_ok(), "chat")
    data = base_config_dict()
    data["clusters"][0]["address"] = "10.0.0.7:443"
    live["cfg"] = parse_config(data, "test.yaml")
    m.record(_ok(), "chat")
    text, _ = _scrape(m)
    assert {(s.labels["server_address"], s.value) for s in _series(text[DURATION], "_count")} \
        == {("127.0.0.1", 1), ("10.0.0.7", 1)}


def test_shell_feeds_the_histograms_for_each_finished_response() -> None:
    """Wiring: a routed request whose access-log entry arrives reaches /metrics."""
    # No first-token sampling: the entry alone finishes the request.
    data = base_config_dict(timing={"token_sample_share": 0.0, "token_sample_min": 0})
    app = App.create(parse_config(data, "test.yaml"), seed=1)
    registry = build_registry(lambda: app.router, lambda: 20.0, app.shell_counters).registry
    from sidecar.ops import genai_metrics

    app.on_observation = genai_metrics.attach(registry, lambda: app.router.config).record
    rs = RouteStream(app)
    cluster = routed_cluster(rs.on_message(body_only_msg(chat_request()), 10.0))  # type: ignore[arg-type]
    rs.close(10.3, cancelled=False)
    OutcomeFeed(app)(LogRecord(status=200, details="via_upstream", method="POST",
                               path="/v1/chat/completions", duration_s=0.31, upstream_tx_s=0.0,
                               first_body_s=0.2, end_s=0.3, tokens=2, rid=rs.rid), 10.4)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    (count,) = _series(fams[FIRST_CHUNK], "_count")
    assert count.value == 1 and count.labels["cluster"] == cluster
    assert _series(fams[FIRST_CHUNK], "_sum")[0].value == pytest.approx(0.2)
    assert _series(fams[DURATION], "_sum")[0].value == pytest.approx(0.3)


_value = st.one_of(st.none(), st.floats(0.0, 100.0), st.sampled_from([0.01, 81.92, 1e6]))
_samples = st.lists(st.tuples(_value, _value, _value, st.one_of(st.none(), st.integers(0, 9))),
                    max_size=12)


@settings(max_examples=80, deadline=None)
@given(_samples, st.sampled_from([STREAM, UNARY]),
       st.lists(st.sampled_from(["chat", "responses", "completions", "other"]), min_size=12,
                max_size=12))
def test_a_batch_of_successes_records_as_one_observation_each(
        samples: list[tuple[float | None, float | None, float | None, int | None]],
        slice: SliceKey, apis: list[Api]) -> None:
    """Native mode hands the histograms a route's successes of one access-log batch at
    once (``record_ok``): the exposition is the one of ``record`` called per success."""
    cfg = parse_config(base_config_dict(), "test.yaml")
    one, batch = GenAIClientMetrics(lambda: cfg), GenAIClientMetrics(lambda: cfg)
    for (ttft, tpot, e2e, tokens), api in zip(samples, apis, strict=False):
        one.record(Observation("a", slice, "ok", 200, ttft, tpot, e2e, tokens), api)
    batch.record_ok("a", slice, samples, apis[:len(samples)])
    assert _scrape(batch) == _scrape(one)
