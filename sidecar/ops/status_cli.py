"""`tailroute status`: the admin server's /state as a terminal table.

Reads ``GET /state`` from a running sidecar (so it shows exactly what the
status page and Prometheus see) and prints one row per cluster x slice::

    CLUSTER     SLICE                        STATE     WEIGHT  SAMPLES  TTFT p50 ...
    provider-a  demo-model|interactive|s|stream  healthy   1.00     212     61.2 ...

``--watch`` redraws every ``--interval`` seconds until Ctrl-C.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.request
from typing import Any, TextIO

COLUMNS = ("CLUSTER", "SLICE", "STATE", "WEIGHT", "SHARE", "SAMPLES", "TTFT p50", "TTFT p95",
           "TTFT p99", "E2E p95", "ERR", "LAST TRANSITION")
_RIGHT = {"WEIGHT", "SHARE", "SAMPLES", "TTFT p50", "TTFT p95", "TTFT p99", "E2E p95", "ERR"}


def fetch_state(admin: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """``GET http://<admin>/state`` as a dict; raises OSError/ValueError on failure."""
    url = admin if admin.startswith("http") else f"http://{admin}"
    with urllib.request.urlopen(f"{url.rstrip('/')}/state", timeout=timeout_s) as r:
        data = json.loads(r.read())
    if not isinstance(data, dict) or "routes" not in data:
        raise ValueError(f"{url}/state did not return tailroute state")
    return data


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _limit(cluster: dict[str, Any], now: float) -> str:
    """``max_concurrency``, or ``limit (of max, why)`` while 429s or queueing have
    lowered it, and the time left of a hold (``held``) while the cluster waits out a
    declared wait or, its 429s read as a quota's, a backoff."""
    cap, limit = cluster["max_concurrency"], cluster.get("concurrency_limit")
    why = "queueing" if cluster.get("limit_source") == "queueing" else "429s"
    out = str(cap) if limit is None or limit >= cap else f"{limit} (of {cap}, {why})"
    held = cluster.get("held_until")
    if held is None:
        return f"{out}, 429s: quota" if cluster.get("quota_429") else out
    why = "429 quota" if cluster.get("quota_429") else "Retry-After"
    return f"{out}, held {max(held - now, 0.0):.0f}s ({why})"


def _row(r: dict[str, Any], now: float) -> tuple[str, ...]:
    lat = r["latency"]
    # e2e is measured for every successful request; ttft only for streamed ones.
    samples = max(lat["e2e"]["samples"], lat["ttft"]["samples"])
    err = r.get("error_rate")
    t = r.get("last_transition")
    last = "-" if not t else f"{t['from']}->{t['to']} {_ago(now - t['at'])}: {t['reason']}"
    share = r.get("share")  # the slice's requests that went here (older states: absent)
    return (r["cluster"], r["slice"], r["state"], f"{r['weight']:.2f}",
            "-" if share is None else f"{100 * share:.0f}%", str(samples),
            _ms(lat["ttft"]["p50_ms"]), _ms(lat["ttft"]["p95_ms"]), _ms(lat["ttft"]["p99_ms"]),
            _ms(lat["e2e"]["p95_ms"]), "-" if err is None else f"{100 * err:.1f}%", last)


def render(state: dict[str, Any], show_all: bool = False, width: int | None = None) -> str:
    """The table as text, each line cut to ``width`` columns if given. Latencies in ms."""
    now = float(state.get("now", 0.0))
    routes = [r for r in state["routes"] if show_all or r.get("narrow", True)]
    routes.sort(key=lambda r: (r["slice"], r["cluster"]))
    rows = [COLUMNS, *(_row(r, now) for r in routes)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = []
    for row in rows:
        cells = [c.rjust(w) if name in _RIGHT else c.ljust(w)
                 for c, w, name in zip(row, widths, COLUMNS, strict=False)]
        lines.append(("  ".join([*cells, row[-1]]))[:width].rstrip())  # [:None] keeps all
    clusters = state.get("clusters", {})
    head = "clusters: " + ("  ".join(
        f"{c} {v['inflight']}/{_limit(v, now)} in flight" for c, v in clusters.items()
    ) or "none")
    if not routes:
        lines.append("(no routes with observations yet)")
    return "\n".join([head[:width], "", *lines]) + "\n"


def run_status(admin: str, watch: bool = False, interval_s: float = 2.0,
               show_all: bool = False, out: TextIO | None = None) -> int:
    """Print the table once (exit 1 if the sidecar is unreachable) or redraw until Ctrl-C."""
    out = out or sys.stdout
    while True:
        # Cut lines only on a terminal; piped output (grep, files) keeps full reasons.
        width = shutil.get_terminal_size((160, 40)).columns if out.isatty() else None
        try:
            text = render(fetch_state(admin), show_all, width)
            ok = True
        except (OSError, ValueError) as exc:
            text = f"tailroute status: cannot read state from {admin}: {exc}\n"
            ok = False
        if not watch:
            (out if ok else sys.stderr).write(text)
            return 0 if ok else 1
        if out.isatty():
            out.write("\x1b[H\x1b[2J")  # redraw in place rather than scrolling
        out.write(f"tailroute status {admin}  {time.strftime('%H:%M:%S')}\n{text}")
        out.flush()
        try:
            time.sleep(interval_s)
        except KeyboardInterrupt:
            return 0
