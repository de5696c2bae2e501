"""A decision Envoy's bootstrap has no route for, through the real Envoy: the sidecar
restarted with a class the running Envoy's bootstrap was rendered without
(docs/operations.md: a restart takes any config). Every such request is misrouted,
whichever cluster the route Envoy took instead happens to reach: the default route in
extproc mode, a slice route (by its weights) in hybrid mode."""

from __future__ import annotations

import json
import urllib.request

import pytest

from sidecar.devtools.harness import Stack, free_port
from tests.ops_stack import wait_for

pytestmark = pytest.mark.envoy

SLO = {"metric": "ttft", "percentile": 95, "budget_ms": 1_000, "timeout_ms": 30_000}


def _post(st: Stack, model: str, headers: dict[str, str]) -> int:
    body = json.dumps({"model": model, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{st.ports['envoy']}/v1/chat/completions", body,
        {"content-type": "application/json", "x-tailroute-class": "bulk", **headers})
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(r.status)


@pytest.mark.parametrize("mode", ["extproc", "hybrid"])
def test_a_class_the_bootstrap_lacks_is_misrouted_even_to_the_decided_cluster(
        mode: str) -> None:
    with Stack() as st:
        a, b = st.start_provider("a", "20", "2", seed=1), st.start_provider("b", "20", "2", seed=2)
        base = {"default_cluster": "a", "routing": {"mode": mode},
                "clusters": [{"name": "a", "address": f"127.0.0.1:{a}", "models": ["m", "only-a"]},
                             {"name": "b", "address": f"127.0.0.1:{b}", "models": ["m"]}],
                "models": [{"name": "m", "candidates": ["a", "b"]},
                           {"name": "only-a", "candidates": ["a"]}]}
        st.write_config({**base, "classes": {"interactive": {"slo": SLO}}}, name="before")
        st.ports["sidecar"] = free_port()  # the sidecar starts there, after Envoy
        st.start_envoy()
        st.start_sidecar(st.write_config(
            {**base, "classes": {"interactive": {"slo": SLO}, "bulk": {"slo": SLO}}}))
        # only-a: decided for a, which the route Envoy takes instead reaches too (the
        # default cluster; a slice route of a's only), so only that route tells; m: a or b.
        # Hybrid asks the sidecar for a request with a deadline.
        hint = {"x-tailroute-deadline-ms": "20000"} if mode == "hybrid" else {}
        models = ["only-a"] * 6 + ["m"] * 6
        assert [_post(st, m, hint) for m in models] == [200] * len(models)

        def logged() -> dict[str, int] | None:
            env = st.sidecar_state()["envoy"]
            return env if env["decided"] == len(models) and not env["pending"] else None

        env = wait_for(logged, "every entry to come")
        # Counted by cluster alone, one run: 3 of 12 (extproc), 2 of 12 (hybrid).
        assert env["misrouted"] == len(models)
        counters = st.sidecar_state()["counters"]
        assert not [k for k in counters if k.startswith("outcome:")], counters
        assert "has no route for that decision" in st.log("sidecar")
