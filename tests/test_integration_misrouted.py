"""A decision Envoy's bootstrap has no route for, through the real Envoy (extproc mode):
the sidecar restarted with a class the running Envoy's bootstrap was rendered without
(docs/operations.md: a restart takes any config). Every such request is misrouted,
whichever cluster Envoy's default route happens to reach."""

from __future__ import annotations

import json
import urllib.request

import pytest

from sidecar.devtools.harness import Stack, free_port
from tests.ops_stack import wait_for

pytestmark = pytest.mark.envoy

SLO = {"metric": "ttft", "percentile": 95, "budget_ms": 1_000, "timeout_ms": 30_000}


def _post(st: Stack, model: str) -> int:
    body = json.dumps({"model": model, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{st.ports['envoy']}/v1/chat/completions", body,
        {"content-type": "application/json", "x-tailroute-class": "bulk"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(r.status)


def test_a_class_the_bootstrap_lacks_is_misrouted_even_on_the_default_cluster() -> None:
    with Stack() as st:
        a, b = st.start_provider("a", "20", "2", seed=1), st.start_provider("b", "20", "2", seed=2)
        base = {"default_cluster": "a",
                "clusters": [{"name": "a", "address": f"127.0.0.1:{a}", "models": ["m", "only-a"]},
                             {"name": "b", "address": f"127.0.0.1:{b}", "models": ["m"]}],
                "models": [{"name": "m", "candidates": ["a", "b"]},
                           {"name": "only-a", "candidates": ["a"]}]}
        st.write_config({**base, "classes": {"interactive": {"slo": SLO}}}, name="before")
        st.ports["sidecar"] = free_port()  # the sidecar starts there, after Envoy
        st.start_envoy()
        st.start_sidecar(st.write_config(
            {**base, "classes": {"interactive": {"slo": SLO}, "bulk": {"slo": SLO}}}))
        # only-a: decided for a, the default cluster, so Envoy's default route reaches
        # the decided cluster and only the route it took tells; m: a or b.
        models = ["only-a"] * 6 + ["m"] * 6
        assert [_post(st, m) for m in models] == [200] * len(models)

        def logged() -> dict[str, int] | None:
            env = st.sidecar_state()["envoy"]
            return env if env["decided"] == len(models) and not env["pending"] else None

        env = wait_for(logged, "every entry to come")
        assert env["misrouted"] == len(models)  # was 3 of 12 in one run: those sent to b
        counters = st.sidecar_state()["counters"]
        assert not [k for k in counters if k.startswith("outcome:")], counters
        assert "has no route for that decision" in st.log("sidecar")
