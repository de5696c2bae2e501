"""tailroute as k replicas in the policy lab: traffic split, isolated or shared state.

Each replica is its own core :class:`~sidecar.core.router.Router`, driven like
:class:`~sidecar.sim.policies.tailroute.Tailroute`. Every attempt goes to a
replica drawn uniformly at random (its own stream, ``"<seed>:replicas"``: a
load balancer in front of k Envoy+sidecar pods, retries included), so each
sees about 1/k of the traffic; the attempt's start, result and any admission
hold stay with the replica that decided it.

* ``isolated``: replicas never talk (today's standalone fleet).
* ``shared``: each replica runs the production sync,
  :class:`~sidecar.fleet.sync.FleetSync`, against an in-process
  :class:`~sidecar.fleet.memory.MemoryStore` every ``push_interval_s`` of
  virtual time, replica ``i`` phase-shifted by ``i / k`` of an interval (their
  cycles are not aligned). So the push-interval delay, the lease ownership,
  the followed states and the forwarded probes are exactly what the sidecars
  do; only the store round trip is instantaneous.

The policy records every health transition as ``(time, replica, cluster, slice,
new state)``; :func:`detection_times` turns them into time-to-detect per
degradation event. :func:`compare` runs one scenario as one replica with all
the traffic, as k isolated and as k shared replicas.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from typing import Any, Final

from sidecar.core.router import Router
from sidecar.core.types import Decision, TransitionEvent
from sidecar.fleet.memory import MemoryStore
from sidecar.fleet.sync import FleetSync
from sidecar.sim.policies import BasePolicy, Policy, PolicyContext, live_entries
from sidecar.sim.policies.tailroute import SAMPLE_SEED, Tailroute, TailrouteNoAdmission
from sidecar.sim.records import Attempt, Call
from sidecar.sim.replica_spec import ReplicaSpec
from sidecar.sim.scenario import Scenario

#: States in which a replica has moved latency-sensitive traffic off a route.
MOVED: Final = frozenset({"degraded", "restricted", "quarantined", "probing"})
_BASES: Final[dict[str, type[Tailroute]]] = {"tailroute": Tailroute,
                                             "tailroute_no_admission": TailrouteNoAdmission}


def replicated(policy: str, ctx: PolicyContext, spec: ReplicaSpec, seed: int) -> Policy | None:
    """The replicated form of ``policy`` (None for policies that are not tailroute's)."""
    base = _BASES.get(policy)
    return None if base is None else Replicas(ctx, spec, seed, base, policy)


class Replicas(BasePolicy):
    needs_tick = True

    def __init__(self, ctx: PolicyContext, spec: ReplicaSpec, seed: int,
                 base: type[Tailroute] = Tailroute, name: str = "tailroute") -> None:
        super().__init__(ctx)
        self.name = name  # base's (the caller knows it: a class attribute read stays plain)
        self.spec = spec
        config = base.effective_config(ctx.config)
        self.routers = [Router(config) for _ in range(spec.count)]
        self._rng = random.Random(f"{seed}:replicas")
        self.sample_rng = random.Random(SAMPLE_SEED)  # timed streams (live_entries)
        self._of: dict[int, int] = {}  # id(attempt) -> replica
        self._held: dict[str, int] = {}  # admission ticket -> replica
        self.log: list[tuple[float, int, str, str, str]] = []
        self.transitions: Counter[str] = Counter()
        self.store = MemoryStore()
        self.syncs: list[FleetSync] = []
        self._next_sync: list[float] = []
        if spec.state == "shared":
            ttl = config.stats.subwindow_s * config.stats.subwindows
            lease = max(3.0, 3 * spec.push_interval_s)
            self.syncs = [FleetSync(r, f"replica-{i}", ttl, lease)
                          for i, r in enumerate(self.routers)]
            self._next_sync = [spec.push_interval_s * (1.0 + i / spec.count)
                               for i in range(spec.count)]

    # ------------------------------------------------------------ routing

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        i = self._rng.randrange(len(self.routers))
        ticket = _ticket(att.call)
        i = self._held.pop(ticket, i)  # a held request re-asks the replica holding it
        d = self.routers[i].decide(att.request_info(now), now, rng, ticket=ticket)
        if d.admission == "queue":
            self._held[ticket] = i
        self._of[id(att)] = i
        return d

    def queue_until(self, call: Call) -> float | None:
        i = self._held.get(_ticket(call))
        return None if i is None else self.routers[i].queue_until(_ticket(call))

    def withdraw(self, call: Call) -> None:
        i = self._held.pop(_ticket(call), None)
        if i is not None:
            self.routers[i].withdraw(_ticket(call))

    def on_start(self, att: Attempt, now: float) -> None:
        router = self.routers[self._of[id(att)]]
        att.sent_load = router.started(att.cluster, att.low)
        live_entries.track(router, att, now, self.sample_rng)

    def on_result(self, att: Attempt, now: float) -> None:
        i = self._of.pop(id(att))
        router = self.routers[i]
        router.finished(att.cluster, att.low)
        obs = att.observation()
        live_entries.resolve(router, att, obs, now)
        if obs is not None:
            self._record(i, router.observe(obs, now))

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        for i, router in enumerate(self.routers):
            self._record(i, router.tick(now))
        for i, sync in enumerate(self.syncs):
            if now >= self._next_sync[i]:
                reply = self.store.exchange(sync.outgoing(now), now * 1000.0)
                self._record(i, sync.incoming(reply, now))
                self._next_sync[i] = now + self.spec.push_interval_s

    def next_deadline(self) -> float | None:
        times = [t for r in self.routers if (t := r.next_deadline()) is not None]
        times += self._next_sync
        return min(times) if times else None

    def _record(self, i: int, events: list[TransitionEvent]) -> None:
        for e in events:
            self.transitions[e.new] += 1
            self.log.append((e.at, i, e.cluster, e.slice, e.new))

    def stats(self) -> dict[str, Any]:
        decisions: Counter[str] = Counter()
        for r in self.routers:
            for (kind, label), n in r.counters.items():
                if kind == "decision":
                    decisions[label] += n
        return {"decisions": dict(sorted(decisions.items())),
                "transitions": dict(sorted(self.transitions.items())),
                "replicas": {"count": self.spec.count, "state": self.spec.state,
                             "push_interval_s": self.spec.push_interval_s,
                             "store_commands": self.store.commands},
                "transition_log": [list(x) for x in self.log]}


def _ticket(call: Call) -> str:
    return f"c{call.id}.{call.attempts}"


# ---------------------------------------------------------------- measuring


def detection_times(sc: Scenario, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per degradation event: seconds from its start until each replica moved off
    the degraded cluster (first transition into :data:`MOVED` for any slice, within
    the event); ``mean_s``/``max_s`` over replicas, None where one never did."""
    stats = result.get("policy_stats") or {}
    log = stats.get("transition_log", [])
    count = stats.get("replicas", {}).get("count", 1)
    out = []
    for ev in sc.events:
        for start, end in ev.windows(sc.duration):
            per = []
            for i in range(count):
                hits = [t for t, r, c, _, new in log
                        if r == i and c == ev.provider and new in MOVED and start <= t < end]
                per.append(min(hits) - start if hits else None)
            got = [x for x in per if x is not None]
            out.append({"provider": ev.provider, "label": ev.label, "start_s": start,
                        "per_replica_s": per,
                        "mean_s": sum(got) / len(got) if len(got) == len(per) else None,
                        "max_s": max(got) if len(got) == len(per) else None})
    return out


def compare(sc: Scenario, count: int = 4, push_interval_s: float = 1.0) -> dict[str, Any]:
    """One replica with all the traffic vs ``count`` isolated vs ``count`` shared replicas."""
    from sidecar.sim.engine import Simulation
    from sidecar.sim.runner import violation_rate

    rows: dict[str, Any] = {}
    for label, spec in (("single", ReplicaSpec(1, "isolated")),
                        ("isolated", ReplicaSpec(count, "isolated", push_interval_s)),
                        ("shared", ReplicaSpec(count, "shared", push_interval_s))):
        res = Simulation(dataclasses.replace(sc, replicas=spec), "tailroute").run()
        det = detection_times(sc, res)
        first = det[0] if det else None
        rows[label] = {
            "detect_s": None if first is None else first["mean_s"],
            "detect_max_s": None if first is None else first["max_s"],
            "violation_rate": round(violation_rate(res), 4),
            "violations": sum(c["violations"] for c in res["classes"].values()),
            "events": det,
            "store_commands": res["policy_stats"]["replicas"]["store_commands"],
        }
    single = rows["single"]["detect_s"]
    for label in ("isolated", "shared"):
        d = rows[label]["detect_s"]
        rows[label]["detect_ratio"] = (None if single is None or d is None or single <= 0
                                       else round(d / single, 3))
    return {"scenario": sc.name, "replicas": count, "push_interval_s": push_interval_s,
            "modes": rows}


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: detection time (mean over replicas, s; ratio to one replica) and violations."""
    lines = ["| scenario | detect: 1 replica | isolated x k | shared x k | violations: 1 | "
             "isolated | shared |", "|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["modes"]

        def det(label: str, m: dict[str, Any] = m) -> str:
            d = m[label]["detect_s"]
            if d is None:
                return "not detected" if label == "single" else "not by all"
            ratio = m[label].get("detect_ratio")
            return f"{d:.1f} s" + (f" ({ratio:.2f}x)" if ratio is not None else "")

        lines.append(f"| {r['scenario']} | {det('single')} | {det('isolated')} | "
                     f"{det('shared')} | {_pct(m['single'])} | {_pct(m['isolated'])} | "
                     f"{_pct(m['shared'])} |")
    return "\n".join(lines)


def _pct(row: dict[str, Any]) -> str:
    return f"{row['violations']} ({row['violation_rate'] * 100:.2f} %)"


def main(argv: list[str] | None = None) -> int:
    """``python -m sidecar.sim.replicas [--replicas K] [--push S] [SCENARIO ...]``:
    the comparison table for the given (default: shipped, with events) scenarios."""
    import argparse
    import json
    import sys

    from sidecar.sim.loader import load_scenario
    from sidecar.sim.runner import scenario_files

    p = argparse.ArgumentParser(prog="python -m sidecar.sim.replicas", description=main.__doc__)
    p.add_argument("scenarios", nargs="*")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--push", type=float, default=1.0, help="push interval (s)")
    p.add_argument("--json", action="store_true", help="JSON lines, one per scenario")
    ns = p.parse_args(argv)
    files = ns.scenarios or [str(f) for f in scenario_files(None)]
    results = []
    for f in files:
        sc = load_scenario(f)
        if not sc.events:
            continue
        sys.stderr.write(f"{sc.name}\n")
        results.append(compare(sc, ns.replicas, ns.push))
        if ns.json:  # one line per scenario as it finishes: long suites keep what they did
            print(json.dumps(results[-1], default=_nan_safe), flush=True)
    if not ns.json:
        print(table(results))
    return 0


def _nan_safe(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else str(x)


if __name__ == "__main__":
    raise SystemExit(main())
