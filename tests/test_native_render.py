"""Native and hybrid bootstraps: valid for Envoy 1.40, and config mistakes named."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.admission import stream_cap_s
from sidecar.core.config import Config, ConfigError, parse_config
from sidecar.devtools.harness import envoy_binary
from sidecar.shell.bootstrap import to_yaml
from sidecar.shell.bootstrap_done import DONE_FILTER
from sidecar.shell.bootstrap_filters import SAMPLE_FILTER, USAGE_FILTER, usage_share
from sidecar.shell.bootstrap_native import render_for_mode, render_native_bootstrap


def _data(**routing: Any) -> dict[str, Any]:
    return {
        "clusters": [
            {"name": "a", "address": "127.0.0.1:9001", "models": ["m", "m2"], "region": "eu"},
            {"name": "b", "address": "127.0.0.1:9002", "models": ["m", "m2"], "region": "us"},
        ],
        "models": [{"name": "m", "candidates": ["a", "b"]},
                   {"name": "m2", "candidates": ["a", "b"], "regions": ["us"]}],
        "routing": routing,
    }


def _cfg(**routing: Any) -> Config:
    return parse_config(_data(**routing), "t.yaml")


def _hcm(boot: dict[str, Any]) -> dict[str, Any]:
    tc: dict[str, Any] = (
        boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"])
    return tc


@pytest.mark.parametrize("routing", [
    {"mode": "native"},
    {"mode": "hybrid"},
    {"mode": "hybrid", "per_request_classes": ["batch"]},
    {"mode": "hybrid", "per_request_classes": ["interactive"]},  # the default class
    {"mode": "hybrid", "per_request_classes": ["interactive", "agentic", "batch"]},
])
def test_rendered_native_bootstrap_passes_envoy_validate(
    tmp_path: Path, routing: dict[str, Any]
) -> None:
    _assert_envoy_accepts(tmp_path, render_native_bootstrap(_cfg(**routing)))


def _assert_envoy_accepts(tmp_path: Path, boot: dict[str, Any]) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(to_yaml(boot))
    r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_slice_routes_never_render_all_zero_and_respect_region_policy() -> None:
    routes = _hcm(render_native_bootstrap(_cfg(mode="native")))["route_config"][
        "virtual_hosts"][0]["routes"]
    sliced = [r for r in routes if "weighted_clusters" in r["route"]]
    assert len(sliced) == 2 * 3 * 2 * 5
    for r in sliced:
        clusters = r["route"]["weighted_clusters"]["clusters"]
        model = r["match"]["dynamic_metadata"][0]["value"]["string_match"]["exact"]
        # m2 may only go to its regions: a (eu) is its candidate but never its route.
        assert [c["name"] for c in clusters] == (["a", "b"] if model == "m" else ["b"])
        assert all(c["weight"] > 0 for c in clusters)
    assert routes[-1]["name"] == "tailroute_default"


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_slice_routes_bound_a_streams_silence_not_its_length(mode: str) -> None:
    """The class timeout (interactive 30 s, agentic 60 s, batch 300 s by default) is an
    unstreamed answer's route timeout; a streaming slice has none (a steady answer
    longer than it was cut mid-stream), only the idle timeout at the class timeout.
    tests/test_integration_class_timeouts.py checks both on the real Envoy."""
    cfg = _cfg(mode=mode)
    routes = _hcm(render_native_bootstrap(cfg))["route_config"]["virtual_hosts"][0]["routes"]
    by_class = {c.name: f"{c.slo.timeout_ms // 1000}s" for c in cfg.classes}
    cap = {c.name: f"{20 * c.slo.timeout_ms // 1000}s" for c in cfg.classes}
    sliced = [r for r in routes if "weighted_clusters" in r["route"]]
    assert {r["name"].split("/")[1].split(".")[-1] for r in sliced} == {"stream", "unary"}
    for r in sliced:
        klass, streaming = r["name"].split("/")[1].split(".")[1], ".stream/" in r["name"]
        assert r["route"]["idle_timeout"] == by_class[klass], r["name"]
        assert r["route"]["timeout"] == ("0s" if streaming else by_class[klass]), r["name"]
        assert r["route"].get("max_stream_duration") == (  # a stream's safety net
            {"max_stream_duration": cap[klass]} if streaming else None), r["name"]


@pytest.mark.parametrize("mode", ["extproc", "hybrid"])
def test_decided_routes_bound_a_streams_silence_and_an_unstreamed_answers_length(
    mode: str,
) -> None:
    """The per-request path's routes: every route key, sampled or not, has a bounded
    variant first (metadata ``unary``: unstreamed answers, and streams whose caller's
    deadline the timeout header sets), with the class timeout as its route timeout and
    no safety net; the key's own route (other streams, and requests from a sidecar that
    does not mark them) has none, only the idle timeout at the class timeout and the
    safety net on its length."""
    cfg = _cfg(mode=mode)
    routes = _hcm(render_for_mode(cfg))["route_config"]["virtual_hosts"][0]["routes"]
    by_class = {c.name: f"{c.slo.timeout_ms // 1000}s" for c in cfg.classes}
    cap = {c.name: f"{20 * c.slo.timeout_ms // 1000}s" for c in cfg.classes}
    decided = [r for r in routes if r["name"].startswith("tailroute|")]
    assert len(decided) == 4 * len(cfg.cluster_names) * len(cfg.classes)
    assert {r["name"].split("|")[3] for r in decided} == {"n", "s"}
    for i, r in enumerate(decided):
        klass, unary = r["name"].split("|")[2], r["name"].endswith("|unary")
        keys = [m["path"][0]["key"] for m in r["match"]["dynamic_metadata"]]
        assert keys == (["route", "unary"] if unary else ["route"]), r["name"]
        assert r["route"]["idle_timeout"] == by_class[klass], r["name"]
        assert r["route"]["timeout"] == (by_class[klass] if unary else "0s"), r["name"]
        assert r["route"].get("max_stream_duration") == (  # a stream's safety net
            None if unary else {"max_stream_duration": cap[klass]}), r["name"]
        if unary:  # matched before the stream route of the same key
            assert decided[i + 1]["name"] == r["name"].removesuffix("|unary")


@pytest.mark.parametrize("mode", ["extproc", "native", "hybrid"])
def test_a_class_sets_its_own_stream_safety_net(mode: str) -> None:
    """``slo.max_stream_ms`` replaces the 20 class timeouts on every stream route of
    its class, in every mode; the other classes keep theirs."""
    data = _data(mode=mode)
    data["classes"] = {
        "interactive": {"slo": {"metric": "ttft", "percentile": 95, "budget_ms": 1000,
                                "timeout_ms": 30000, "max_stream_ms": 5_400_000}},
        "chat": {"slo": {"metric": "ttft", "percentile": 95, "budget_ms": 900,
                         "timeout_ms": 20000}}}
    routes = _hcm(render_for_mode(parse_config(data, "t.yaml")))[
        "route_config"]["virtual_hosts"][0]["routes"]
    nets: dict[str, set[str]] = {}
    for r in routes:
        if "max_stream_duration" in r["route"]:
            klass = next(k for k in ("interactive", "chat") if k in r["name"])
            nets.setdefault(klass, set()).add(r["route"]["max_stream_duration"][
                "max_stream_duration"])
    assert nets == {"interactive": {"5400s"}, "chat": {"400s"}}


@pytest.mark.parametrize(
    ("value", "problem"),
    [(0, "must be >= 1"), ("long", "must be a number"), (True, "must be a number"),
     (700_000_000_000, "must be <= ")],
)
def test_a_bad_stream_net_names_the_file_and_field(value: Any, problem: str) -> None:
    data = _data(mode="extproc")
    data["classes"] = {"interactive": {"slo": {"max_stream_ms": value}}}
    with pytest.raises(ConfigError, match=r"t\.yaml: classes\.interactive\.slo\."
                       r"max_stream_ms: " + problem):
        parse_config(data, "t.yaml")


def test_a_null_stream_net_is_the_default() -> None:
    data = _data(mode="extproc")
    data["classes"] = {"interactive": {"slo": {"max_stream_ms": None}}}
    klass = parse_config(data, "t.yaml").workload_class("interactive")
    assert klass is not None and klass.slo.max_stream_ms is None
    assert stream_cap_s(klass) == 600.0


def test_native_has_no_ext_proc_and_hybrid_skips_it_for_native_requests() -> None:
    native = [f["name"] for f in _hcm(render_native_bootstrap(_cfg(mode="native")))[
        "http_filters"]]
    assert "tailroute.route" not in native
    assert "envoy.filters.http.json_to_metadata" in native
    hybrid = _hcm(render_native_bootstrap(_cfg(mode="hybrid")))["http_filters"]
    route = next(f for f in hybrid if f["name"] == "tailroute.route")
    assert route["typed_config"]["@type"].endswith("ExtensionWithMatcher")


def test_extproc_mode_and_envoy_alone_render_the_ext_proc_bootstrap() -> None:
    assert "layered_runtime" not in render_for_mode(_cfg())
    alone = render_for_mode(_cfg(mode="native"), with_sidecar=False)
    assert "layered_runtime" not in alone


def _sampled(mode: str, usage_sample: float | None = None) -> Config:
    data = _data(mode=mode)
    if usage_sample is not None:
        data["envoy"] = {"usage_sample": usage_sample}
    return parse_config(data, "t.yaml")


def _filters(mode: str, usage_sample: float | None = None) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = _hcm(render_for_mode(_sampled(mode, usage_sample)))[
        "http_filters"]
    return filters


@pytest.mark.parametrize(("mode", "asked", "share", "regex"), [
    ("extproc", None, 1.0, None),
    ("native", None, 0.25, "[456789abcdefABCDEF].*"),
    ("hybrid", None, 0.25, "[456789abcdefABCDEF].*"),
    ("native", 1.0, 1.0, None),
    ("extproc", 0.5, 0.5, "[89abcdefABCDEF].*"),
    ("native", 0.0625, 0.0625, "[123456789abcdefABCDEF].*"),
    ("native", 0.3, 0.3125, "[56789abcdefABCDEF].*"),  # rounded to sixteenths
])
def test_usage_is_parsed_on_the_configured_share(
    mode: str, asked: float | None, share: float, regex: str | None
) -> None:
    assert usage_share(_sampled(mode, asked)) == share
    filters = _filters(mode, asked)
    names = [f["name"] for f in filters]
    usage = filters[names.index(USAGE_FILTER)]["typed_config"]
    if regex is None:
        assert SAMPLE_FILTER not in names and usage["@type"].endswith("SseToMetadata")
        return
    # the id is copied into metadata first, then the usage filter skips the rest
    assert names.index(SAMPLE_FILTER) < names.index(USAGE_FILTER)
    matcher = usage["xds_matcher"]["matcher_list"]["matchers"][0]["predicate"]
    value = matcher["single_predicate"]["custom_match"]["typed_config"]["value"]
    assert value["string_match"]["safe_regex"]["regex"] == regex
    # The [DONE] mark runs on the very same requests: the same matcher.
    done = filters[names.index(DONE_FILTER)]["typed_config"]
    assert done["xds_matcher"] == usage["xds_matcher"]


@pytest.mark.parametrize("mode", ["extproc", "native", "hybrid"])
@pytest.mark.parametrize("mark", [True, False])
def test_the_done_mark_follows_the_usage_filter_unless_turned_off(mode: str,
                                                                   mark: bool) -> None:
    data = _data(mode=mode)
    data["timing"] = {"done_mark": mark}
    cfg = parse_config(data)
    boot = render_for_mode(cfg)
    names = [f["name"] for f in _hcm(boot)["http_filters"]]
    assert (DONE_FILTER in names) is mark
    if mark:  # on the response path Envoy runs it before the usage filter
        assert names.index(USAGE_FILTER) < names.index(DONE_FILTER) < names.index(
            "envoy.filters.http.router")


@pytest.mark.parametrize(("value", "message"), [
    (0, "t.yaml: envoy.usage_sample: must be >= 0.0625"),
    (1.5, "t.yaml: envoy.usage_sample: must be <= 1"),
    ("half", "t.yaml: envoy.usage_sample: must be a number"),
])
def test_usage_sample_errors_name_the_field(value: object, message: str) -> None:
    data = _data()
    data["envoy"] = {"usage_sample": value}
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "t.yaml")
    assert str(exc.value).startswith(message), str(exc.value)


def test_native_drops_the_buffer_filter_and_hybrid_keeps_it() -> None:
    assert "envoy.filters.http.buffer" not in [f["name"] for f in _filters("native")]
    assert "envoy.filters.http.buffer" in [f["name"] for f in _filters("hybrid")]
    assert "envoy.filters.http.buffer" in [f["name"] for f in _filters("extproc")]


def test_a_sampled_extproc_bootstrap_passes_envoy_validate(tmp_path: Path) -> None:
    _assert_envoy_accepts(tmp_path, render_for_mode(_sampled("extproc", 0.5)))


@pytest.mark.parametrize(("change", "message"), [
    ({"routing": {"mode": "native"}, "rename": True},
     "t.yaml: routing.mode: native routing cannot rewrite the request body"),
    ({"routing": {"mode": "hybrid", "per_request_classes": ["nope"]}},
     "t.yaml: routing.per_request_classes: unknown class 'nope'"),
    ({"routing": {"mode": "sideways"}}, "t.yaml: routing.mode: must be one of"),
    ({"routing": {"mode": "native", "publish_interval_s": 11}},
     "t.yaml: routing.publish_interval_s: must be <= 10.0"),
    ({"routing": {"mode": "native", "weights": 1}}, "t.yaml: routing: unknown field(s): weights"),
])
def test_routing_config_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    data = _data()
    data["routing"] = change["routing"]
    if change.get("rename"):
        data["clusters"][1]["models"] = {"m": "m-upstream", "m2": "m2"}
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "t.yaml")
    assert str(exc.value).startswith(message), str(exc.value)
