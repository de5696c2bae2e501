"""A reload that changes ``stats`` keeps every route's statistics unless the
sub-window length changes: the kept store then reads exactly as a store built
with the new settings from the same observations would."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.core.config import Config, parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.ops.metrics import METRIC_NAMES, build_registry
from sidecar.ops.reload import ConfigReloader
from sidecar.shell.app import App
from tests.conftest import base_config_dict

_SLICE = SliceKey("m", "interactive", "short", True)
_T0 = 86400.0
_SUB = 10.0


def _config(**stats: Any) -> Config:
    # No shift test: a store's shift state depends on the history it was tested along
    # (a rebuilt decayed window, as after a reload or a warm restart, is not retested).
    return parse_config(base_config_dict(stats={"subwindow_s": _SUB, "shift_alpha": 0.0,
                                                **stats}), "t.yaml")


def _feed(router: Router, windows: int, seed: int = 7) -> float:
    """Sub-windows of changing size and latency on a, with a few errors; the time after."""
    rng = random.Random(seed)
    now = _T0
    for w in range(windows):
        n = rng.randrange(3, 40)
        for i in range(n):
            now = _T0 + w * _SUB + i * _SUB / (n + 1)
            ok = rng.random() > 0.05
            ttft = rng.lognormvariate(-1.0 + 0.1 * w, 0.5)
            router.observe(Observation("a", _SLICE, "ok" if ok else "error",
                                       ttft_s=ttft if ok else None, e2e_s=ttft + 0.4), now)
    return _T0 + windows * _SUB + 0.5 * _SUB


def _reading(router: Router, now: float) -> list[tuple[float | None, int]]:
    out = []
    for s in (_SLICE, *_SLICE.broader()):
        for metric in ("ttft", "e2e"):
            v = router.latency("a", s, metric, 99.0, now, fresh=True)
            out.append((v.value, v.samples))
    return out


@pytest.mark.parametrize("change", [
    {"min_samples": 5},
    {"min_samples": 60},
    {"decay": 0.6},
    {"min_aging": 0.9},
    {"enough_samples": 50.0},
    {"prior_samples": 2.0},
    {"observe_share": 0.2},
    {"stale_after_s": 900.0},
    {"subwindows": 4},  # shorter ring: the newest four sub-windows stay
    {"subwindows": 60},  # longer ring: all of them (they are all inside the old one)
    {"min_samples": 8, "decay": 0.7, "subwindows": 12},
])
def test_a_stats_change_keeps_the_evidence_read_by_the_new_settings(
    change: dict[str, Any],
) -> None:
    reloaded = Router(_config())
    now = _feed(reloaded, 20)
    store = reloaded.stats
    reloaded.reload(_config(**change))
    assert reloaded.stats is store  # not started afresh: the policy keeps its evidence
    fresh = Router(_config(**change))
    assert _feed(fresh, 20) == now
    # Read now, and again after three more sub-windows of the same traffic to both.
    for later in (0.0, 3 * _SUB):
        for i in range(int(later)):
            for router in (reloaded, fresh):
                router.observe(Observation("a", _SLICE, "ok", ttft_s=0.3 + i / 100,
                                           e2e_s=0.9), now + i)
        got, want = _reading(reloaded, now + later), _reading(fresh, now + later)
        assert [n for _, n in got] == [n for _, n in want]
        assert [v for v, _ in got] == pytest.approx([v for v, _ in want], rel=1e-9)
        assert any(v is not None for v, _ in got)


def test_max_slices_applies_to_slices_seen_after_the_reload() -> None:
    router = Router(_config(max_slices=4))
    slices = [SliceKey("m", f"k{i}", "short", True) for i in range(3)]
    for s in slices:
        router.observe(Observation("a", s, "ok", ttft_s=0.2, e2e_s=0.5), _T0)
    router.reload(_config(max_slices=2))
    assert {router.stats.key_of("a", s) for s in slices} == set(slices)
    new = SliceKey("m", "new", "short", True)
    assert router.stats.key_of("a", new).klass == "_overflow"
    # Raised again: a slice that folded gets its own series from the next observation.
    router.reload(_config(max_slices=8))
    assert router.stats.key_of("a", new) == new


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_new_sub_window_length_starts_afresh_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "tailroute.yaml"
    data = base_config_dict(stats={"subwindow_s": 10.0, "min_samples": 20})
    _write(path, data)
    app = App.create(parse_config(data, str(path)))
    rl = ConfigReloader(app, path)
    _feed(app.router, 5)
    store = app.router.stats
    data["stats"]["min_samples"] = 10
    _write(path, data)
    with caplog.at_level(logging.WARNING, logger="tailroute.reload"):
        assert rl.reload("test")
    assert app.router.stats is store and not caplog.records
    data["stats"]["subwindow_s"] = 20.0
    _write(path, data)
    with caplog.at_level(logging.WARNING, logger="tailroute.reload"):
        assert rl.reload("test")
    assert app.router.stats is not store and len(app.router.stats) == 0
    [line] = [r.getMessage() for r in caplog.records]
    assert "stats.subwindow_s 10.0 -> 20.0" in line and "start afresh" in line
    assert rl.view()["stats_resets"] == 1 and rl.counters()["reload:stats_reset"] == 1
    registry = build_registry(lambda: app.router, lambda: _T0, rl.counters).registry
    assert registry.get_sample_value("tailroute_config_stats_resets_total") == 1
    assert "tailroute_config_stats_resets_total" in METRIC_NAMES  # the rules may query it
