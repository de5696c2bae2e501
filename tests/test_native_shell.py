"""The sidecar's native-mode loop: learning hooks, publication policy, /state view."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from sidecar.core.config import Config, parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.core.weights import SliceWeights
from sidecar.shell.bootstrap_native import route_slices
from sidecar.shell.native import NativeRouting, material_change

if TYPE_CHECKING:
    from sidecar.shell.app import App
    from sidecar.shell.native_log import NativeFeed
from sidecar.shell.native_keys import route_name, runtime_key, slice_id

S = SliceKey("m", "interactive", "short", True)


def _config(**routing: Any) -> Config:
    return parse_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, n in enumerate("ab")],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "routing": {"mode": "native", **routing},
        "stats": {"subwindow_s": 1.0, "min_samples": 5},
    }, "native.yaml")


def _w(a: int, b: int, probes: tuple[str, ...] = ()) -> dict[SliceKey, SliceWeights]:
    return {S: SliceWeights(S, (("a", a), ("b", b)), probes)}


@pytest.mark.parametrize(("old", "new", "material"), [
    (_w(5000, 5000), _w(5000, 5000), False),
    (_w(5000, 5000), _w(5049, 4951), False),  # below 0.5 % of the scale
    (_w(5000, 5000), _w(5050, 4950), True),
    (_w(10000, 0), _w(9999, 1), True),  # a route coming back from zero always counts
    (_w(9500, 500), _w(9500, 500, ("b",)), True),  # probe status changed
    ({}, _w(5000, 5000), True),
    # a stale cluster's key published at 0 (NativeRouting.note_served)
    (_w(5000, 5000), {S: SliceWeights(S, (("a", 5000), ("b", 5000), ("old", 0)))}, True),
])
def test_material_change(old: dict[SliceKey, SliceWeights],
                         new: dict[SliceKey, SliceWeights], material: bool) -> None:
    assert material_change(old, new) is material


def test_keys_are_safe_and_unique_for_awkward_model_names() -> None:
    odd = SliceKey("meta/llama 3:8b", "interactive", "short", True)
    also = SliceKey("meta_llama_3_8b", "interactive", "short", True)
    assert slice_id(odd) != slice_id(also)
    assert all(ch.isalnum() or ch in "._-" for ch in runtime_key(odd, "a"))
    assert route_name(odd, "len").startswith("tailroute/")


def test_route_names_map_back_to_slices() -> None:
    cfg = _config()
    routes = route_slices(cfg)
    assert routes[route_name(S, "len")] == S
    assert len(set(routes.values())) == 1 * 3 * 3 * 2


def test_publish_skips_immaterial_changes_and_records_material_ones() -> None:
    cfg = _config()
    router = Router(cfg)
    native = NativeRouting(cfg, lambda: router)
    assert native.publish(0.0, force=True) and native.layer.version == 1
    assert not native.publish(1.0)  # nothing learned: same weights, no push
    for _ in range(20):
        router.observe(Observation("b", S, "error", 500), 1.5)
    router.tick(2.0)
    assert native.publish(2.0)
    assert native.weights[S].weight("b") == 0
    state = native.state(2.0)
    assert state["version"] == 2 and state["publications"][-1]["changed"][S.label()]["b"] == 0


def test_a_route_missing_its_budget_is_published_at_zero_and_counted_once() -> None:
    """Live misses in native mode: late answers' log entries make ``b`` missing; the
    next computation publishes it at 0 and counts it in ``tailroute_live_missing_total``
    -- once per slice computed, not for the slices whose weights were only kept."""
    cfg = _config()
    router = Router(cfg)
    native = NativeRouting(cfg, lambda: router)
    assert native.publish(0.0, force=True)
    for _ in range(6):
        router.live.outcome(Observation("b", S, "ok", 200, ttft_s=60.0, e2e_s=61.0), 0.5)
    native.on_logged(S, "a", 0.2)  # the slice carried load: recomputed between windows
    assert native.publish(0.6)
    assert native.weights[S].weight("b") == 0 and native.weights[S].missing == ("b",)
    assert router.counters[("live_missing", "b")] == 1
    assert native.state(0.6)["weights"][S.label()]["missing"] == ["b"]  # /state says why
    assert not native.publish(0.7)  # no load since: kept, not recomputed, not counted
    assert router.counters[("live_missing", "b")] == 1
    later = 0.5 + cfg.health.live_horizon_s + 0.5
    native.on_logged(S, "a", 0.2)
    assert native.publish(later) and native.weights[S].weight("b") > 0


def test_a_cluster_envoys_stale_route_serves_is_published_at_zero_when_safe() -> None:
    """Envoy's bootstrap lists "old" for m (the sidecar restarted without it): with no
    key for it, Envoy gives it the bootstrap's weight. Once its entries show it, its
    key is published at 0 -- but only while a cluster Envoy is known to route (one it
    served) keeps weight, else a route of only zeros would answer 404."""
    cfg = _config()
    router = Router(cfg)
    native = NativeRouting(cfg, lambda: router)
    assert native.publish(0.0, force=True)
    key = runtime_key(S, "old")
    native.note_served("m", "old", routable=False)  # not yet known Envoy routes a or b
    assert native.publish(0.1) is False and key not in native.layer.values
    native.note_served("m", "b", routable=True)
    assert native.publish(0.2)  # the new key alone is a material change
    assert native.layer.values[key] == 0
    assert all(native.layer.values[runtime_key(s, "old")] == 0 for s in native.weights)
    assert native.weights[S].total == native.weights[S].weight("a") + native.weights[S].weight(
        "b") > 0
    for _ in range(20):  # b quarantined: a, which Envoy never served, keeps it all
        router.observe(Observation("b", S, "error", 500), 0.5)
    router.tick(1.0)
    native.publish(1.0, force=True)
    assert native.weights[S].weight("b") == 0 and key not in native.layer.values
    native.note_served("m", "a", routable=True)
    reloaded = _config(publish_interval_s=0.5)  # the same routes: the 0 stays
    native._config = lambda: reloaded
    native.publish(3.0, force=True)
    assert native.layer.values[key] == 0
    other = parse_config({  # other routes: what Envoy's entries showed is forgotten
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, n in enumerate("abc")],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
        "routing": {"mode": "native"}, "stats": {"subwindow_s": 1.0, "min_samples": 5},
    }, "native.yaml")
    native._config = lambda: other
    native.publish(4.0, force=True)
    assert not native.stale and not native.served and key not in native.layer.values


def test_logged_requests_feed_load_and_mark_probes() -> None:
    cfg = _config()
    router = Router(cfg)
    native = NativeRouting(cfg, lambda: router)
    native.layer.publish(_w(9500, 500, ("b",)), 0.0)
    assert native.on_logged(S, "b", 0.2) is True
    assert native.on_logged(S, "a", 0.2) is False
    native.load.roll(0.0)
    native.on_logged(S, "a", 2.0)
    native.load.roll(1.0)
    assert native.load.last == {"a": 2.0}


def test_loop_publishes_at_start_and_after_transitions() -> None:
    cfg = _config(publish_interval_s=0.05)
    router = Router(cfg)
    native = NativeRouting(cfg, lambda: router)

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(native.loop(router.tick, stop))
        await asyncio.sleep(0.02)
        assert native.layer.version == 1
        now = asyncio.get_running_loop().time()
        for _ in range(20):
            router.observe(Observation("a", S, "error", 500), now)
        await asyncio.sleep(1.3)  # the window closes, a is quarantined, weights follow
        stop.set()
        await task

    asyncio.run(run())
    assert native.weights[S].weight("a") == 0


def test_metrics_show_weights_publications_and_envoys() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from sidecar.ops.native_metrics import NativeCollector

    cfg = _config()
    router = Router(cfg)
    native = NativeRouting(cfg, lambda: router)
    native.publish(0.0, force=True)
    reg = CollectorRegistry()
    reg.register(NativeCollector(native))
    text = generate_latest(reg).decode()
    assert f'tailroute_native_weight{{cluster="a",slice="{S.label()}"}} 5000.0' in text
    assert "tailroute_native_publications_total 1.0" in text
    assert 'tailroute_native_envoys{acked="false"} 0.0' in text


def test_native_feed_observes_slice_routes_and_passes_the_rest_on() -> None:
    from sidecar.core.envoy_log import LogRecord
    from sidecar.shell.app import App
    from sidecar.shell.native_log import NativeFeed

    cfg = _config()
    app = App.create(cfg)
    native = NativeRouting(lambda: app.config, lambda: app.router)
    passed: list[LogRecord] = []
    feed = NativeFeed(app, native, lambda rec, now: passed.append(rec))
    native.load.roll(0.0)
    ok = LogRecord(status=200, method="POST", path="/v1/chat/completions",
                   upstream_cluster="b", route_name=route_name(S, "len"), duration_s=0.05,
                   upstream_tx_s=0.001, first_body_s=0.02, end_s=0.04, tokens=3)
    feed(ok, 1.0)
    assert app.router.counters[("outcome", "ok")] == 1 and app.envoy["native"] == 1
    feed(LogRecord(status=200, route_name="tailroute_default", method="POST",
                   path="/v1/chat/completions"), 1.0)
    feed(LogRecord(status=200, rid="x-1", route_name=route_name(S, "len")), 1.0)
    assert len(passed) == 2  # the default route and a decided request are not native
    feed(LogRecord(status=503, route_name=route_name(S, "len"), upstream_cluster=""), 1.0)
    assert app.envoy["native_no_upstream"] == 1
    native.load.roll(2.0)
    assert native.load.last == {"b": pytest.approx(0.04 / 2.0)}


def _native_app() -> tuple[Config, App, NativeRouting, NativeFeed]:
    """A native-mode app over clusters a and b, a 30 s publication interval (so a
    publication within a test's second is one the loop was woken for), and its feed."""
    from sidecar.shell.app import App
    from sidecar.shell.native_log import NativeFeed

    cfg = parse_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}", "models": ["m"]}
                     for i, n in enumerate("ab")],
        "models": [{"name": "m", "candidates": ["a", "b"]}],
        "routing": {"mode": "native", "publish_interval_s": 30.0},
        "stats": {"subwindow_s": 30.0, "min_samples": 5},
    }, "native.yaml")
    app = App.create(cfg)
    native = NativeRouting(lambda: app.config, lambda: app.router)
    return cfg, app, native, NativeFeed(app, native, lambda rec, now: None)


async def _first_publication(native: NativeRouting) -> None:
    """Let the publishing loop compute its first weights: a step at a time, a few slices
    per turn of the event loop (sidecar.core.steps), so bounded in turns, not time."""
    for _ in range(1000):
        if native.layer.version:
            return
        await asyncio.sleep(0)
    raise AssertionError("no publication in 1,000 turns of the event loop")


def test_fast_ejection_is_published_at_once_not_at_the_next_interval() -> None:
    """A run of hard failures read from the log ejects the cluster; the weight-0
    version goes out on that transition, not a publication interval later."""
    from sidecar.core.envoy_log import LogRecord

    cfg, app, native, feed = _native_app()
    app.on_transitions = lambda _events: native.wake()
    failed = LogRecord(status=503, method="POST", path="/v1/chat/completions",
                       upstream_cluster="a", route_name=route_name(S, "len"),
                       duration_s=0.01, upstream_tx_s=0.001)

    async def run() -> list[int]:
        stop = asyncio.Event()
        task = asyncio.create_task(native.loop(app.tick, stop))
        await _first_publication(native)
        assert native.layer.version == 1 and native.weights[S].weight("a") > 0
        loop = asyncio.get_running_loop()
        for _ in range(cfg.health.eject_consecutive):
            feed(failed, loop.time())
        seen = []
        for _ in range(100):  # bounded: 1 s, a thirtieth of the interval
            await asyncio.sleep(0.01)
            seen.append(native.layer.version)
            if native.layer.version > 1:
                break
        stop.set()
        await task
        return seen

    versions = asyncio.run(run())
    assert versions[-1] == 2, versions
    assert native.weights[S].weight("a") == 0 and native.weights[S].total == 10_000
    assert any(t.new == "quarantined" and t.cluster == "a" for t in app.router.transitions)


@pytest.mark.parametrize("retry_after_s", [
    0.3,   # a declared wait holds the cluster for 0.3 s
    None,  # an undeclared quota's 429 (nothing in flight): push-back's own 1 s backoff
])
def test_a_hold_takes_the_route_out_at_once_and_back_when_it_ends(
    retry_after_s: float | None,
) -> None:
    """A 429 read from the log that holds the cluster full (sidecar.core.pushback),
    by its Retry-After or as a quota's: the weight-0 version goes out at once, not a
    publication interval later, and the version that gives the route back goes out
    when the hold ends (the loop wakes at the router's next deadline)."""
    from sidecar.core.envoy_log import LogRecord

    _, app, native, feed = _native_app()
    app.on_holds = native.wake  # as serve.py wires it
    refused = LogRecord(status=429, method="POST", path="/v1/chat/completions",
                        upstream_cluster="a", route_name=route_name(S, "len"),
                        duration_s=0.01, upstream_tx_s=0.001, retry_after_s=retry_after_s)

    async def run() -> list[int]:
        stop = asyncio.Event()
        task = asyncio.create_task(native.loop(app.tick, stop))
        await _first_publication(native)
        weights = [native.weights[S].weight("a")]
        feed(refused, asyncio.get_running_loop().time())
        for _ in range(300):  # bounded: 3 s, a tenth of the interval
            await asyncio.sleep(0.01)
            w = native.weights[S].weight("a")
            if not weights or weights[-1] != w:
                weights.append(w)
            if len(weights) == 3:
                break
        stop.set()
        await task
        return weights

    weights = asyncio.run(run())
    assert len(weights) == 3, weights  # out, then back, both before the next interval
    assert weights[0] > 0 and weights[1] == 0 and weights[2] > 0, weights


def test_a_publication_lets_the_event_loop_run_between_slices() -> None:
    """With many slices one computation takes seconds on the event loop (a thousand
    slices: about 1 s, four times that when it plans the load), so it pauses every
    few slices; what it publishes is what the computation at once gives."""
    from sidecar.core.weights import STEP_SLICES, native_slices

    cfg = parse_config({
        "clusters": [{"name": n, "address": f"127.0.0.1:{9000 + i}",
                      "models": [f"m{j}" for j in range(8)]} for i, n in enumerate("ab")],
        "models": [{"name": f"m{j}", "candidates": ["a", "b"]} for j in range(8)],
        "routing": {"mode": "native"},
    }, "native.yaml")
    slices = len(native_slices(cfg))
    assert slices > 4 * STEP_SLICES
    router = Router(cfg)
    at_once = NativeRouting(cfg, lambda: router)
    at_once.publish(0.0, force=True)
    stepped = NativeRouting(cfg, lambda: router)
    turns: list[int] = []

    async def run() -> None:
        done = False

        async def other() -> None:  # anything else the loop serves meanwhile
            while not done:
                turns.append(stepped.layer.version)
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await stepped.publish_async(0.0, force=True)
        done = True
        await task

    asyncio.run(run())
    assert turns.count(0) >= slices // STEP_SLICES - 1  # it ran while nothing was published
    assert stepped.weights == at_once.weights and stepped.layer.version == 1
