"""Building blocks of generated scenarios: providers, classes, workloads, sized to be solvable.

A generated scenario is a plain mapping in the scenario file format
(docs/scenarios.md), so it is validated by the same loader as a hand-written
file and can be written out as YAML unchanged. :class:`Base` draws the parts
every family shares; the families (:mod:`sidecar.sim.gen_families`) add the
trouble. Ranges (all uniform unless said otherwise; "log" = log-uniform):

* **providers**: 2-5 (a family may narrow it); TTFT median 200-600 ms (log),
  p99 / median 1.8-3.2; prefill 20-80 ms per 1000 input tokens; TPOT median
  12-35 ms, p99 / median 1.4-2.4; contention 0.1-0.4; cost 0.5-1.5 per 1k tokens.
* **traffic**: total rate 0.5-50 req/s (log); interactive streaming chat always,
  a non-streaming batch workload (10-30 % of the rate) in half the scenarios;
  input tokens median 300-900, p99 4-10x; output median 80-250, p99 3-6x;
  ``max_tokens: 1024`` (chat) -- all as a family may override.
* **SLOs**: interactive TTFT p95 with a budget of 1.15-1.6x the slowest
  provider's healthy TTFT p99 at the p95 input (contention at half load
  included), so every provider meets it when healthy; batch e2e p99 with a
  generous budget; timeouts 30 s / 120 s.
* **capacity**: the concurrency the load needs (rate x mean service time) is
  ``L``; each provider gets ``max(4, L x 1.6-2.5 / (n - 1))`` slots, so the
  load fits on the others when any one provider fails (at 40-60 % use).

"Solvable" is the point of the sizing: whatever a family breaks, some route
(or some share of routes) can still serve the traffic within its SLO, so a
clairvoyant policy attains nearly everything and the gap between policies is
about what they noticed, not about what was possible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

T = TypeVar("T")
# The longest scenario any family draws, in simulated seconds (bounds the size of a
# generated suite; sparse traffic needs the longest span to gather evidence).
MAX_SCENARIO_S: Final = 1800.0
PROVIDER_NAMES: Final = ("provider-a", "provider-b", "provider-c", "provider-d", "provider-e")
Z95: Final = 1.6448536269514722
Z99: Final = 2.3263478740408408


class Draw:
    """The family's random choices, from one ``random.Random`` per scenario."""

    def __init__(self, seed: str) -> None:
        self.rng = random.Random(seed)

    def uniform(self, lo: float, hi: float) -> float:
        return self.rng.uniform(lo, hi)

    def log(self, lo: float, hi: float) -> float:
        """Log-uniform in ``[lo, hi]`` (rates, magnitudes: each decade as likely)."""
        return math.exp(self.rng.uniform(math.log(lo), math.log(hi)))

    def int_(self, lo: int, hi: int) -> int:
        """Uniform integer in ``[lo, hi]``."""
        return self.rng.randint(lo, hi)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def sample(self, seq: Sequence[T], k: int) -> list[T]:
        return self.rng.sample(list(seq), k)


def r3(x: float) -> float:
    """Rounded to 3 significant digits: readable YAML, exactly reproducible."""
    if x == 0:
        return 0.0
    return float(f"{x:.3g}")


@dataclass
class Base:
    """The shared skeleton of one generated scenario (see the module docstring)."""

    d: Draw
    n_providers: int
    rate: float  # total requests per second
    duration: float
    batch: bool
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # what the family chose
    # each provider's TTFT body {median, p99}: sizing and budgets use it even when a
    # family gives the provider a heavier-tailed distribution
    body: dict[str, dict[str, float]] = field(default_factory=dict)
    chat_max_tokens: int = 1024
    input_median: float = 600.0
    input_p99: float = 4000.0
    output_median: float = 150.0
    output_p99: float = 800.0
    budget_factor: float = 1.3
    capacity_factor: float = 2.0
    agentic_budget_ms: float | None = None  # set by families with agentic workflows

    @property
    def names(self) -> list[str]:
        return list(PROVIDER_NAMES[: self.n_providers])

    def draw_providers(self) -> None:
        d = self.d
        for name in self.names:
            med = d.log(200, 600)
            self.providers[name] = {
                "ttft_ms": {"median": r3(med), "p99": r3(med * d.uniform(1.8, 3.2))},
                "prefill_ms_per_1k": r3(d.uniform(20, 80)),
                "tpot_ms": (lambda m: {"median": r3(m), "p99": r3(m * d.uniform(1.4, 2.4))})(
                    d.uniform(12, 35)),
                "contention": r3(d.uniform(0.1, 0.4)),
            }
            self.body[name] = dict(self.providers[name]["ttft_ms"])
        self.budget_factor = d.uniform(1.15, 1.6)
        self.capacity_factor = d.uniform(1.6, 2.5)

    def chat(self, rate: float, **extra: Any) -> dict[str, Any]:
        """The interactive streaming workload."""
        return {
            "name": "chat", "class": "interactive", "stream": True,
            "arrival": {"process": "poisson", "rate_per_s": r3(rate)},
            "input_tokens": {"median": r3(self.input_median), "p99": r3(self.input_p99)},
            "output_tokens": {"median": r3(self.output_median), "p99": r3(self.output_p99)},
            "max_tokens": self.chat_max_tokens, **extra,
        }

    def batch_workload(self, rate: float) -> dict[str, Any]:
        return {
            "name": "batch", "class": "batch", "stream": False,
            "arrival": {"process": "poisson", "rate_per_s": r3(rate)},
            "input_tokens": {"median": 1500, "p99": 8000},
            "output_tokens": {"median": 300, "p99": 1200},
            "max_tokens": 2048,
        }

    def default_workloads(self) -> None:
        """Chat at the whole rate, or chat plus a batch share."""
        if self.batch:
            share = self.d.uniform(0.1, 0.3)
            self.workloads = [self.chat(self.rate * (1 - share)),
                              self.batch_workload(self.rate * share)]
        else:
            self.workloads = [self.chat(self.rate)]

    # ------------------------------------------------------------ sizing

    def _healthy(self) -> list[tuple[dict[str, Any], dict[str, float]]]:
        return [(self.providers[n], self.body[n]) for n in self.names]

    def _mean_service_s(self, p: dict[str, Any], ttft_body: dict[str, float],
                        wl: dict[str, Any]) -> float:
        """Mean service time of one request of ``wl`` on provider ``p`` (seconds, healthy)."""
        inp, out = _mean_tokens(wl["input_tokens"]), _mean_tokens(wl["output_tokens"])
        if isinstance(wl.get("max_tokens"), int):
            out = min(out, float(wl["max_tokens"]))
        ttft = _lognormal_mean(ttft_body) + float(p["prefill_ms_per_1k"]) * inp / 1000.0
        tpot = _lognormal_mean(p["tpot_ms"])
        calls = 1.0
        wf = wl.get("workflow")
        if wf is not None:
            calls = float(sum(s.get("fanout", 1) for s in wf["steps"]))
        return calls * (ttft + tpot * max(out - 1.0, 0.0)) / 1000.0

    def load(self) -> float:
        """Concurrency the traffic needs on the slowest provider (Little's law)."""
        worst = 0.0
        for p, body in self._healthy():
            busy = 0.0
            for wl in self.workloads:
                busy += _rate_of(wl) * self._mean_service_s(p, body, wl)
            worst = max(worst, busy)
        return worst

    def capacities(self) -> dict[str, int]:
        """Slots per provider: the load fits on the others when one fails."""
        n = max(self.n_providers - 1, 1)
        cap = max(4, math.ceil(self.load() * self.capacity_factor / n))
        return dict.fromkeys(self.names, cap)

    def interactive_budget_ms(self) -> float:
        """1.15-1.6x the slowest healthy TTFT p99 at the p95 input, with half-load contention."""
        sigma_in = math.log(self.input_p99 / self.input_median) / Z99
        inp95 = self.input_median * math.exp(sigma_in * Z95)
        worst = max(
            (body["p99"] + p["prefill_ms_per_1k"] * inp95 / 1000.0)
            * (1.0 + p["contention"] * 0.5)
            for p, body in self._healthy())
        return float(max(round(worst * self.budget_factor / 50.0) * 50.0, 300.0))

    def e2e_ms(self, inp: float, out: float) -> float:
        """A generous healthy end-to-end time on the slowest provider for ``inp`` input and
        ``out`` output tokens: TTFT p99 + prefill + TPOT at its p99/median midpoint."""
        worst = 0.0
        for p, body in self._healthy():
            tp = p["tpot_ms"]
            tpot = tp["median"] * math.sqrt(tp["p99"] / tp["median"])
            v = (body["p99"] + p["prefill_ms_per_1k"] * inp / 1000.0 + tpot * out) \
                * (1.0 + p["contention"] * 0.5)
            worst = max(worst, v)
        return worst

    def batch_budget_ms(self) -> float:
        """1.5x the slowest healthy end-to-end time of a p99 batch request."""
        return float(math.ceil(self.e2e_ms(8000, 1200) * 1.5 / 1000.0) * 1000.0)

    # ------------------------------------------------------------ the scenario

    def build(self, name: str, family: str, seed: int, description: str) -> dict[str, Any]:
        caps = self.capacities()
        for n, c in caps.items():
            self.providers[n]["capacity"] = c
        classes: dict[str, Any] = {
            "interactive": {
                "slo": {"metric": "ttft", "percentile": 95,
                        "budget_ms": self.interactive_budget_ms(), "timeout_ms": 30000},
                "priority": 10,
                "weights": {"latency": 1.0, "cost": 0.0, "quality": 0.0, "capacity": 0.5},
            },
            "batch": {
                "slo": {"metric": "e2e", "percentile": 99, "budget_ms": self.batch_budget_ms(),
                        "timeout_ms": max(120000.0, 2.0 * self.batch_budget_ms())},
                "priority": 1, "latency_sensitive": False,
                "weights": {"latency": 0.2, "cost": 1.0, "quality": 0.0, "capacity": 1.0},
            },
        }
        if self.agentic_budget_ms is not None:
            classes["agentic"] = {
                "slo": {"metric": "e2e", "percentile": 95,
                        "budget_ms": self.agentic_budget_ms, "timeout_ms": 60000},
                "priority": 8,
                "weights": {"latency": 1.0, "cost": 0.1, "quality": 0.2, "capacity": 0.5},
            }
        clusters = [
            {"name": n, "address": f"127.0.0.1:{8001 + i}", "models": ["chat-model"],
             "max_concurrency": caps[n],
             "cost_per_1k_tokens": r3(self.d.uniform(0.5, 1.5))}
            for i, n in enumerate(self.names)
        ]
        self.params.setdefault("providers", self.n_providers)
        self.params.setdefault("rate_per_s", r3(self.rate))
        return {
            "name": name,
            "description": description,
            "tags": ["generated", family],
            "seed": seed,
            "duration_s": self.duration,
            "warmup_s": 60,
            "config": {
                "default_cluster": self.names[0],
                "clusters": clusters,
                "models": [{"name": "chat-model", "candidates": self.names}],
                "classes": classes,
            },
            "providers": self.providers,
            "events": self.events,
            "workloads": self.workloads,
        }


def _lognormal_mean(lat: Any) -> float:
    if isinstance(lat, int | float):
        return float(lat)
    sigma = math.log(lat["p99"] / lat["median"]) / Z99
    return float(lat["median"]) * math.exp(sigma * sigma / 2.0)


def _mean_tokens(t: Any) -> float:
    return _lognormal_mean(t)


def _rate_of(wl: dict[str, Any]) -> float:
    a = wl["arrival"]
    rates = [a.get("rate_per_s", 0.0)] + [c["rate_per_s"] for c in a.get("rate_changes", [])]
    return float(max(rates))
