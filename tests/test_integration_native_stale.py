"""Native mode on the real Envoy 1.40: a sidecar restarted with other candidates than the
bootstrap Envoy runs.

A hot reload that changes Envoy's routes is refused (sidecar.ops.envoy_drift), but a
restart takes any config. Envoy's slice route still lists the dropped cluster, and the
runtime layer the new sidecar publishes has no key for it, so Envoy gives it the
bootstrap's equal weight. The sidecar cannot change that route: it says so, and once
Envoy's entries show the cluster it publishes the cluster's key at 0.
"""

from __future__ import annotations

import http.client
import time
from collections import Counter
from typing import Any

import pytest

from sidecar.core.types import SliceKey
from sidecar.devtools import http_load
from sidecar.devtools.harness import Stack, http_json
from sidecar.shell.native_keys import runtime_key

pytestmark = pytest.mark.envoy

MODEL = "bench-model"


def _config(ports: dict[str, int], candidates: list[str]) -> dict[str, Any]:
    return {"clusters": [{"name": n, "address": f"127.0.0.1:{p}", "models": [MODEL]}
                         for n, p in ports.items()],
            "models": [{"name": MODEL, "candidates": candidates}],
            "routing": {"mode": "native", "publish_interval_s": 0.5}}


def _send(st: Stack, n: int) -> Counter[str]:
    body = http_load.request_bytes(True, 2).split(b"\r\n\r\n", 1)[1]
    conn = http.client.HTTPConnection("127.0.0.1", st.ports["envoy"], timeout=30)
    got: Counter[str] = Counter()
    try:
        for _ in range(n):
            conn.request("POST", "/v1/chat/completions", body,
                         {"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            got[r.getheader("x-fake-provider") or str(r.status)] += 1
    finally:
        conn.close()
    return got


def _runtime(st: Stack) -> dict[str, str]:
    rt = http_json(f"http://127.0.0.1:{st.ports['envoy_admin']}/runtime")
    return {k: v["final_value"] for k, v in rt["entries"].items() if k.startswith("tailroute.")}


def test_envoy_routing_to_a_dropped_candidate_is_counted_named_and_weighted_zero() -> None:
    with Stack() as st:
        ports = {n: st.start_provider(n, "20", "2", seed=i) for i, n in enumerate("abc")}
        st.start_sidecar(st.write_config(_config(ports, ["a", "b", "c"]), "old"))
        st.start_envoy()
        st.stop_sidecar()
        new = st.write_config(_config(ports, ["a", "b"]), "new")
        st.start_sidecar(new)
        deadline = time.monotonic() + 30
        while not st.sidecar_state()["native"]["envoys"] and time.monotonic() < deadline:
            time.sleep(0.1)  # Envoy re-subscribed: the new layer is in force
        sent = _send(st, 120)
        assert sent["c"] > 0, sent  # what the sidecar cannot prevent: the stale route
        deadline = time.monotonic() + 30
        while (st.sidecar_state()["envoy"]["misrouted"] < sent["c"]
               and time.monotonic() < deadline):
            time.sleep(0.1)
        assert st.sidecar_state()["envoy"]["misrouted"] == sent["c"]
        assert not [r for r in st.sidecar_state()["routes"] if r["cluster"] == "c"]  # no evidence
        assert f"{new}: models[0].candidates does not route model {MODEL} to cluster c" \
            in st.log("sidecar")
        # Once its entries showed c, c's key is published at 0: Envoy's route reads that
        # instead of its bootstrap weight, and a and b take the slice.
        key = runtime_key(SliceKey(MODEL, "interactive", "short", True), "c")
        deadline = time.monotonic() + 30
        while _runtime(st).get(key) != "0" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _runtime(st).get(key) == "0", _runtime(st)
        after = _send(st, 120)
        assert after["c"] == 0 and after["a"] + after["b"] == 120, after
