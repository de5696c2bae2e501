"""``compat: semantic-router`` replays semantic-router's documented latency_aware cases
end to end: observations in through ``Router.observe``, the pick out of ``Router.decide``.

The cases are semantic-router's own (``pkg/selection/latency_aware_test.go``: the
selector; ``pkg/config/validator_test.go``: the config rules) plus the behaviours its
latency cache defines (``pkg/latency/cache.go``: EMA below 3 samples, interpolated
percentiles, the 1000-sample window, non-positive samples dropped), each built so
that a different statistic would pick a different winner.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.compat_sr import WINDOW, SrSeries, interpolated_percentile
from sidecar.core.config import Config, ConfigError, parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, RequestInfo, SliceKey

MODELS = ("model-a", "model-b", "model-c")  # semantic-router's candidate names, as clusters
SLICE = SliceKey("m", "interactive", "short", True)


def sr_config(latency_aware: dict[str, Any] | None, candidates: tuple[str, ...] = MODELS,
              kind: str = "latency_aware", **model: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": "m", "candidates": list(candidates), **model}
    if latency_aware is not None or kind != "latency_aware":
        m["algorithm"] = {"type": kind}
        if latency_aware is not None:
            m["algorithm"]["latency_aware"] = latency_aware
    return {
        "compat": "semantic-router",
        "clusters": [{"name": n, "address": f"127.0.0.1:{9001 + i}", "models": ["m"],
                      "region": "eu" if n != "model-c" else "us"}
                     for i, n in enumerate(MODELS)],
        "models": [m],
    }


def update(router: Router, metric: str, cluster: str, value: float, outcome: str = "ok",
           now: float = 0.0) -> None:
    """semantic-router's UpdateTTFT / UpdateTPOT, as the response that produces the sample.

    A TPOT sample is completion latency / completion tokens: one token over ``value``
    seconds; a TTFT sample is a stream's first chunk after ``value`` seconds.
    """
    if metric == "ttft":
        obs = Observation(cluster, SLICE, outcome, 200, ttft_s=value)  # type: ignore[arg-type]
    else:
        obs = Observation(cluster, SLICE, outcome, 200,  # type: ignore[arg-type]
                          e2e_s=value, output_tokens=1)
    router.observe(obs, now)


def request() -> RequestInfo:
    return RequestInfo(api="chat", model="m", stream=True, max_tokens=None, input_tokens=10,
                       klass="interactive", priority=10, tenant=None, slice=SLICE)


def decide(router: Router, seed: int = 1) -> tuple[str, str]:
    d = router.decide(request(), 1.0, random.Random(seed))
    return d.cluster, d.reason


Samples = list[tuple[str, str, float]]


def repeat(metric: str, cluster: str, *values: float, times: int = 1) -> Samples:
    return [(metric, cluster, v) for v in values] * times


# semantic-router's seedCombinedLatencyStats, in its order.
COMBINED: Samples = [("tpot", "model-a", 0.02), ("ttft", "model-a", 0.60),
                     ("tpot", "model-b", 0.05), ("ttft", "model-b", 0.20),
                     ("tpot", "model-c", 0.08), ("ttft", "model-c", 0.10)] * 3


CASES: list[tuple[str, dict[str, Any] | None, tuple[str, ...], Samples, str, str]] = [
    # --- semantic-router pkg/selection/latency_aware_test.go
    ("selects fastest TPOT", {"tpot_percentile": 50}, MODELS[:2],
     repeat("tpot", "model-a", 0.06, times=3) + repeat("tpot", "model-b", 0.03, times=3),
     "model-b", "scored"),
    ("selects fastest TTFT", {"ttft_percentile": 50}, MODELS[:2],
     repeat("ttft", "model-a", 0.30, times=3) + repeat("ttft", "model-b", 0.12, times=3),
     "model-b", "scored"),
    ("selects best combined latency", {"tpot_percentile": 50, "ttft_percentile": 50}, MODELS,
     COMBINED, "model-b", "scored"),
    ("default: no stats available", {"tpot_percentile": 50, "ttft_percentile": 50},
     MODELS[:2], [], "model-a", "no_data"),
    ("default: missing latency aware config", None, MODELS[:2],
     repeat("ttft", "model-b", 0.01, times=3), "model-a", "no_percentile"),
    # --- semantic-router pkg/latency/cache.go and the selector's rules
    # Fewer than 3 samples: the EMA (0.3 x 0.10 + 0.7 x 0.50 = 0.38), not the mean, the
    # last sample or an interpolated median (0.30 or 0.10 would pick model-a).
    ("EMA below 3 samples", {"ttft_percentile": 50}, MODELS[:2],
     repeat("ttft", "model-a", 0.50, 0.10) + repeat("ttft", "model-b", 0.35, times=3),
     "model-b", "scored"),
    # p90 of five: index 3.6 -> 0.4 x 0.4 + 1.0 x 0.6 = 0.76 (nearest rank would say 1.0).
    ("linearly interpolated percentile", {"ttft_percentile": 90}, MODELS[:2],
     repeat("ttft", "model-a", 0.1, 0.2, 0.3, 0.4, 1.0) + repeat("ttft", "model-b", 0.8,
                                                                   times=5),
     "model-a", "scored"),
    # The last 1000 samples only: the 1000 slow ones have left model-a's window.
    ("1000-sample window", {"ttft_percentile": 50}, MODELS[:2],
     repeat("ttft", "model-a", 5.0, times=WINDOW) + repeat("ttft", "model-a", 0.1, times=WINDOW)
     + repeat("ttft", "model-b", 1.0, times=3), "model-a", "scored"),
    ("cold candidate skipped, even the first", {"ttft_percentile": 95}, MODELS,
     repeat("ttft", "model-b", 5.0, times=3) + repeat("ttft", "model-c", 1.0, times=3),
     "model-c", "scored"),
    ("incomplete data skipped when both metrics are on",
     {"tpot_percentile": 50, "ttft_percentile": 50}, MODELS[:2],
     repeat("ttft", "model-a", 0.01, times=3) + repeat("ttft", "model-b", 0.5, times=3)
     + repeat("tpot", "model-b", 0.05, times=3), "model-b", "scored"),
    ("tie goes to the earlier candidate", {"ttft_percentile": 50}, MODELS[:2],
     repeat("ttft", "model-b", 0.2, times=3) + repeat("ttft", "model-a", 0.2, times=3),
     "model-a", "scored"),
    ("non-positive samples are dropped", {"ttft_percentile": 50}, MODELS[:2],
     repeat("ttft", "model-a", 0.0, times=3) + repeat("ttft", "model-b", 0.5), "model-b",
     "scored"),
    # 0 is semantic-router's "unset": TPOT does not count (with it, model-a would win).
    ("percentile 0 means unset", {"tpot_percentile": 0, "ttft_percentile": 50}, MODELS[:2],
     repeat("ttft", "model-a", 0.3, times=3) + repeat("tpot", "model-a", 0.01, times=3)
     + repeat("ttft", "model-b", 0.1, times=3) + repeat("tpot", "model-b", 0.09, times=3),
     "model-b", "scored"),
]


@pytest.mark.parametrize(("latency_aware", "candidates", "samples", "winner", "reason"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_semantic_router_cases_through_router_decide(
    latency_aware: dict[str, Any] | None, candidates: tuple[str, ...], samples: Samples,
    winner: str, reason: str,
) -> None:
    router = Router(parse_config(sr_config(latency_aware, candidates), "sr.yaml"))
    for metric, cluster, value in samples:
        update(router, metric, cluster, value)
    # Deterministic: no weighted random, exploration or probes under the profile.
    picks = {decide(router, seed) for seed in range(20)}
    assert picks == {(winner, reason)}


def test_failed_responses_are_not_samples() -> None:
    router = Router(parse_config(sr_config({"ttft_percentile": 50}, MODELS[:2]), "sr.yaml"))
    for outcome in ("error", "timeout", "cancel"):
        for _ in range(3):
            update(router, "ttft", "model-a", 0.01, outcome=outcome)
    update(router, "ttft", "model-b", 9.0)
    assert decide(router) == ("model-b", "scored")


def test_static_takes_the_first_candidate_whatever_the_data() -> None:
    router = Router(parse_config(sr_config(None, MODELS[:2], kind="static"), "sr.yaml"))
    for _ in range(3):
        update(router, "ttft", "model-a", 9.0)
        update(router, "ttft", "model-b", 0.1)
    assert decide(router) == ("model-a", "static")


def test_region_policy_still_applies() -> None:
    cfg = sr_config({"ttft_percentile": 50}, MODELS, regions=["us"])
    router = Router(parse_config(cfg, "sr.yaml"))
    assert decide(router) == ("model-c", "no_data")


def test_explain_shows_the_semantic_router_scores() -> None:
    router = Router(parse_config(sr_config({"ttft_percentile": 50}, MODELS[:2]), "sr.yaml"))
    for _ in range(3):
        update(router, "ttft", "model-a", 0.2)
        update(router, "ttft", "model-b", 0.1)
    req = request()
    from dataclasses import replace

    d = router.decide(replace(req, explain=True), 1.0, random.Random(1))
    assert d.explain is not None
    scores = {c.cluster: c.scores for c in d.explain.candidates}
    assert scores["model-a"]["latency_aware"] == pytest.approx(2.0)
    assert scores["model-b"] == {"ttft_s": pytest.approx(0.1), "latency_aware": 1.0}


def test_native_profile_is_unchanged_by_the_book() -> None:
    cfg = sr_config({"ttft_percentile": 50}, MODELS[:2])
    del cfg["compat"]
    router = Router(parse_config(cfg, "native.yaml"))
    update(router, "ttft", "model-a", 0.2)
    assert not router.compat_sr.series  # only models under the profile keep windows


def test_reload_keeps_windows_of_models_still_under_the_profile() -> None:
    router = Router(parse_config(sr_config({"ttft_percentile": 50}, MODELS[:2]), "sr.yaml"))
    for _ in range(3):
        update(router, "ttft", "model-b", 0.1)
    router.reload(parse_config(sr_config({"ttft_percentile": 50}, MODELS[:2]), "sr.yaml"))
    assert decide(router) == ("model-b", "scored")
    native = sr_config({"ttft_percentile": 50}, MODELS[:2])
    native["compat"] = "tailroute"
    router.reload(parse_config(native, "sr.yaml"))
    assert not router.compat_sr.series


# ------------------------------------------------------------------ config rules


@pytest.mark.parametrize("latency_aware", [
    {"tpot_percentile": 10, "ttft_percentile": 50}, {"tpot_percentile": 50},
    {"ttft_percentile": 50}, {"tpot_percentile": 1, "ttft_percentile": 100},
    {"tpot_percentile": 0, "ttft_percentile": 95}, {"ttft_percentile": None, "tpot_percentile": 5},
])
def test_semantic_router_accepts(latency_aware: dict[str, Any]) -> None:
    cfg = parse_config(sr_config(latency_aware), "sr.yaml")
    la = cfg.models[0].latency_aware
    assert la.tpot_percentile == (latency_aware.get("tpot_percentile") or None)
    assert la.ttft_percentile == (latency_aware.get("ttft_percentile") or None)


@pytest.mark.parametrize(("latency_aware", "kind", "message"), [
    ({}, "latency_aware", "must specify at least one of tpot_percentile"),
    ({"tpot_percentile": 0, "ttft_percentile": 0}, "latency_aware", "at least one of"),
    ({"tpot_percentile": 101}, "latency_aware", "tpot_percentile: must be an integer between"),
    ({"ttft_percentile": 200}, "latency_aware", "ttft_percentile: must be an integer between"),
    ({"ttft_percentile": -1}, "latency_aware", "ttft_percentile: must be an integer between"),
    ({"ttft_percentile": 9.5}, "latency_aware", "must be an integer"),
    (None, "latency_aware_without_block", "requires a latency_aware block"),
])
def test_semantic_router_rejects(latency_aware: dict[str, Any] | None, kind: str,
                                 message: str) -> None:
    cfg = sr_config(latency_aware)
    if kind == "latency_aware_without_block":
        cfg["models"][0]["algorithm"] = {"type": "latency_aware"}
    with pytest.raises(ConfigError, match=message) as err:
        parse_config(cfg, "sr.yaml")
    assert str(err.value).startswith("sr.yaml: models[0].algorithm")


def test_no_candidates_is_rejected() -> None:
    with pytest.raises(ConfigError, match="candidates: must list at least one cluster"):
        parse_config(sr_config({"ttft_percentile": 50}, ()), "sr.yaml")


def test_profile_per_model_overrides_the_global_one() -> None:
    cfg = sr_config({"ttft_percentile": 50})
    cfg["compat"] = "tailroute"
    cfg["models"][0]["compat"] = "semantic-router"
    cfg["models"].append({"name": "n", "candidates": ["model-a"]})
    cfg["clusters"][0]["models"].append("n")
    parsed: Config = parse_config(cfg, "sr.yaml")
    assert [m.compat for m in parsed.models] == ["semantic-router", "tailroute"]
    with pytest.raises(ConfigError, match="compat: must be one of tailroute, semantic-router"):
        parse_config({**cfg, "compat": "litellm"}, "sr.yaml")


def test_global_fragment_is_validated_under_the_global_profile() -> None:
    cfg = sr_config({"ttft_percentile": 50})
    cfg["algorithm"] = {"type": "latency_aware", "latency_aware": {}}
    with pytest.raises(ConfigError, match=r"sr\.yaml: algorithm\.latency_aware: must specify"):
        parse_config(cfg, "sr.yaml")


# ------------------------------------------------------------------ statistics


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=-1.0, max_value=100.0, allow_nan=False) |
                st.sampled_from([0.5, 1.0]), min_size=1, max_size=WINDOW + 300),
       st.integers(min_value=1, max_value=100))
def test_series_matches_semantic_routers_cache(values: list[float], p: int) -> None:
    """The incrementally sorted window and the EMA equal semantic-router's cache:
    positive samples only, last 1000, EMA below 3, sort-and-interpolate from 3 on."""
    s = SrSeries()
    for v in values:
        s.add(v)
    kept = [v for v in values if v > 0]
    if not kept:
        assert s.value(p) is None
        return
    ema = kept[0]
    for v in kept[1:]:
        ema = 0.3 * v + (1 - 0.3) * ema
    recent = kept[-WINDOW:]
    want = ema if len(recent) < 3 else interpolated_percentile(sorted(recent), p / 100.0)
    assert s.value(p) == want
