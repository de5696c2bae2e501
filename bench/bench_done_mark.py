"""A/B of Envoy's ``[DONE]`` mark: Envoy CPU per 1,000 streamed chunks (not a test).

Usage::

    PYTHONPATH=. python bench/bench_done_mark.py [SECONDS_PER_ROUND] [ROUNDS] [--floor]

One sidecar and one fake provider (64-token streams, ``--tpot-ms 1``: about one event
per chunk, ~67 a stream), two Envoys from the same rendered bootstrap: ``envoy`` with
the Lua ``tailroute.done`` filter (sidecar.shell.bootstrap_done) and ``plain`` without
it; ``--floor`` adds a third whose Lua only iterates the chunks. Rounds alternate the
order; each streams from 6 client threads for SECONDS_PER_ROUND and reads the Envoy
process's utime+stime from /proc (10 ms ticks: keep rounds >= 3 s). Results in
docs/response-timing.md, "The [DONE] mark". Keep the whole run short on a shared host.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
from typing import Any
from urllib.parse import urlparse

from sidecar.devtools.harness import Stack
from sidecar.shell.bootstrap_done import DONE_FILTER

CONC = 6
TICK = os.sysconf("SC_CLK_TCK")
FLOOR = """
function envoy_on_response(handle)
  local ct = handle:headers():get("content-type")
  if ct == nil or not ct:lower():find("text/event-stream", 1, true) then return end
  for _ in handle:bodyChunks() do
  end
end
"""


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICK


def load(url: str, seconds: float) -> tuple[int, int]:
    """Streams for ``seconds`` from CONC threads: (streams, events)."""
    stop = time.monotonic() + seconds
    counts = [0, 0]
    lock = threading.Lock()
    u = urlparse(url)
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hi"}]})

    def worker() -> None:
        c = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
        while time.monotonic() < stop:
            c.request("POST", u.path + "/chat/completions", body,
                      {"content-type": "application/json"})
            n = sum(1 for line in c.getresponse() if line.startswith(b"data:"))
            with lock:
                counts[0] += 1
                counts[1] += n
        c.close()

    threads = [threading.Thread(target=worker) for _ in range(CONC)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts[0], counts[1]


def _filters(boot: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters: list[dict[str, Any]] = hcm["typed_config"]["http_filters"]
    return filters


def drop_done(boot: dict[str, Any]) -> None:
    filters = _filters(boot)
    filters[:] = [f for f in filters if f["name"] != DONE_FILTER]


def floor_done(boot: dict[str, Any]) -> None:
    for f in _filters(boot):
        if f["name"] == DONE_FILTER:
            f["typed_config"]["default_source_code"]["inline_string"] = FLOOR


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seconds = float(args[0]) if args else 3.0
    rounds = int(args[1]) if len(args) > 1 else 4
    with Stack() as st:
        port = st.start_provider("p", ttft_ms="5", tpot_ms="1", extra=["--max-tokens", "64"])
        st.start_sidecar(st.write_config({
            "default_cluster": "p",
            "clusters": [{"name": "p", "address": f"127.0.0.1:{port}", "models": ["m"]}],
            "models": [{"name": "m", "candidates": ["p"]}],
            "timing": {"token_sample_min": 0, "token_sample_share": 0.0},
        }))
        st.start_envoy(name="envoy")
        st.start_envoy(name="plain", edit=drop_done)
        names = ["envoy", "plain"]
        if "--floor" in sys.argv:
            st.start_envoy(name="floor", edit=floor_done)
            names.append("floor")
        totals = {n: [0.0, 0, 0] for n in names}
        for n in names:
            load(st.url(n), 0.5)  # warm up
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                pid = st.ports[f"{name}_pid"]
                before = cpu_s(pid)
                streams, events = load(st.url(name), seconds)
                used = cpu_s(pid) - before
                for i, v in enumerate((used, streams, events)):
                    totals[name][i] += v
                print(f"round {r} {name:6s} streams {streams:5d} events {events:6d} "
                      f"cpu {used:.2f} s = {1e6 * used / events:.1f} ms per 1k events",
                      flush=True)
        for name, (used, streams, events) in totals.items():
            print(f"TOTAL {name:6s} streams {streams:.0f} events {events:.0f} cpu {used:.2f} s"
                  f" -> {1e6 * used / events:.1f} ms per 1k events, "
                  f"{1e6 * used / streams:.0f} us per stream")


if __name__ == "__main__":
    main()
