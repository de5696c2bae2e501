"""Slices beyond ``stats.max_slices`` fold into an overflow slice: the metrics and
/state say so, per cluster, and stop saying so once the overflow slice goes stale."""

from __future__ import annotations

import pytest

from sidecar.core.config import parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.ops.metrics import build_registry
from sidecar.ops.state import state_json
from tests.conftest import base_config_dict

_T0 = 1000.0


def _router() -> Router:
    return Router(parse_config(base_config_dict(stats={"max_slices": 2,
                                                       "stale_after_s": 60.0}), "t.yaml"))


def _slices(router: Router, cluster: str, n: int, now: float) -> None:
    for i in range(n):
        s = SliceKey("m", f"k{i}", "short", True)
        router.observe(Observation(cluster, s, "ok", ttft_s=0.2, e2e_s=0.5), now)


def _gauge(router: Router, now: float, cluster: str, kind: str) -> float | None:
    registry = build_registry(lambda: router, lambda: now, dict).registry
    return registry.get_sample_value("tailroute_stats_slices",
                                     {"cluster": cluster, "kind": kind})


@pytest.mark.parametrize(("seen", "narrow", "overflow"), [(0, 0, 0), (2, 2, 0), (5, 2, 1)])
def test_folding_shows_in_the_metrics_and_state(seen: int, narrow: int, overflow: int) -> None:
    router = _router()
    _slices(router, "a", seen, _T0)
    _slices(router, "b", 1, _T0)
    assert (_gauge(router, _T0, "a", "narrow"), _gauge(router, _T0, "a", "overflow")) == (
        narrow, overflow)
    assert (_gauge(router, _T0, "b", "narrow"), _gauge(router, _T0, "b", "overflow")) == (1, 0)
    clusters = state_json(router, _T0)["clusters"]
    assert clusters["a"]["slices"] == {"narrow": narrow, "max": 2, "overflow": overflow}
    assert clusters["c"]["slices"] == {"narrow": 0, "max": 2, "overflow": 0}


def test_the_overflow_count_falls_back_once_the_folded_slices_go_quiet() -> None:
    router = _router()
    _slices(router, "a", 5, _T0)
    assert _gauge(router, _T0, "a", "overflow") == 1
    # Only the first two slices keep coming; the folded ones go stale and are pruned.
    later = _T0 + 120.0
    for t in range(int(_T0) + 10, int(later), 10):
        _slices(router, "a", 2, float(t))
        router.tick(float(t))
    router.tick(later)
    assert (_gauge(router, later, "a", "narrow"), _gauge(router, later, "a", "overflow")) == (
        2, 0)
