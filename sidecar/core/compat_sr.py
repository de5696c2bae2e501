"""``compat: semantic-router``: semantic-router's ``latency_aware`` choices, reproduced exactly.

A model (or, from the top level, every model) under this profile is routed the
way vllm-project/semantic-router routes a decision with ``algorithm.type:
latency_aware`` -- its own statistics, its own percentile, its own pick -- and
none of tailroute's machinery (no health states, probes, load or cost scores,
slices or weighted random). The facts, from semantic-router's source
(``pkg/latency/cache.go``: the TTFT/TPOT caches; ``pkg/selection/latency_aware.go``:
the selector; ``pkg/config/validator_decision.go``: the config check):

Samples, per candidate (semantic-router keys them by model; here by model x cluster)
    * TTFT: streams, the time to the first chunk; non-streaming responses,
      semantic-router takes the time to the response headers -- the nearest an
      observation carries is the end-to-end time, used instead.
    * TPOT: completion latency / completion tokens, the latency counted from the
      request's start (so TTFT is inside it); only when tokens > 0.
    * Only positive values; only successful responses (an error carries no
      latency in tailroute's observations).
Statistics
    * the last :data:`WINDOW` (1000) samples per metric, no time decay, never expired;
    * an EMA (alpha :data:`EMA_ALPHA` = 0.3, seeded with the first sample) of every sample;
    * the value at percentile p (1..100): with fewer than :data:`MIN_FOR_PERCENTILE` (3)
      samples the EMA (the last sample if the EMA is not positive); else the sorted
      window linearly interpolated at index i = p/100 x (n - 1):
      ``v[floor(i)] x (1 - w) + v[floor(i) + 1] x w``, w = i - floor(i)
      (the last value when floor(i) + 1 = n).
Selection
    * metrics with a percentile set (0 / absent = unset); none: the first candidate
      (reason ``no_percentile``);
    * a candidate without a value for *every* enabled metric is skipped (cold start);
      none left: the first candidate (``no_data``);
    * score = mean over the enabled metrics (TPOT, then TTFT) of value / the smallest
      value among the scored candidates; the lowest score wins, ties go to the
      earlier candidate (``scored``);
    * ``algorithm.type: static``: always the first candidate (``static``).

The only tailroute rule that still applies is a model's ``regions`` (a data
policy, not a routing preference); admission control runs as configured
(disable it for semantic-router's behaviour under overload too). The windows
live in memory only, as semantic-router's do: a restart starts them empty.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from sidecar.core.config import SEMANTIC_ROUTER, ClassConfig, Config, ModelConfig
from sidecar.core.explain import decision_for
from sidecar.core.latency_aware import enabled_metrics, latency_aware_scores, pick_lowest
from sidecar.core.types import CandidateExplain, Decision, Explain, Observation, RequestInfo

WINDOW: Final = 1000
EMA_ALPHA: Final = 0.3
MIN_FOR_PERCENTILE: Final = 3
# semantic-router's score sums the TPOT ratio first; the order of a float sum matters for ties.
_SCORE_ORDER: Final = ("tpot", "ttft")


def interpolated_percentile(ordered: Sequence[float], fraction: float) -> float:
    """Linear interpolation between order statistics, written as semantic-router does."""
    index = fraction * float(len(ordered) - 1)
    lower = int(index)
    upper = lower + 1
    if upper >= len(ordered):
        return ordered[-1]
    weight = index - float(lower)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


class SrSeries:
    """One metric of one candidate: the last WINDOW samples (kept sorted too) and the EMA.

    The window is kept sorted incrementally (insert, and remove the sample that
    falls out) so a percentile is O(1) per decision instead of a sort.
    """

    __slots__ = ("_arrival", "_sorted", "ema", "last")

    def __init__(self) -> None:
        self._arrival: deque[float] = deque()
        self._sorted: list[float] = []
        self.ema = 0.0
        self.last = 0.0

    def __len__(self) -> int:
        return len(self._arrival)

    def add(self, v: float) -> None:
        if v <= 0:
            return  # semantic-router drops non-positive samples
        self.ema = v if not self._arrival else EMA_ALPHA * v + (1 - EMA_ALPHA) * self.ema
        self.last = v
        if len(self._arrival) == WINDOW:
            old = self._arrival.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._arrival.append(v)
        insort(self._sorted, v)

    def value(self, percentile: int) -> float | None:
        if not self._arrival or not 1 <= percentile <= 100:
            return None
        if len(self._arrival) < MIN_FOR_PERCENTILE:
            return self.ema if self.ema > 0 else self.last
        return interpolated_percentile(self._sorted, float(percentile) / 100.0)


def samples(obs: Observation) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) samples semantic-router would take from one observed response."""
    if obs.outcome != "ok":
        return None, None
    ttft = obs.ttft_s if obs.slice.streaming else obs.e2e_s
    tokens = obs.output_tokens
    tpot = obs.e2e_s / tokens if obs.e2e_s is not None and tokens else None
    return ttft, tpot


class SrLatencyBook:
    """The windows of every (model, cluster, metric) under the profile."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str], SrSeries] = {}
        self._config: Config | None = None
        self._models: frozenset[str] = frozenset()

    def _compat_models(self, cfg: Config) -> frozenset[str]:
        if cfg is not self._config:
            self._config = cfg
            self._models = frozenset(m.name for m in cfg.models if m.compat == SEMANTIC_ROUTER)
        return self._models

    def covers(self, model: str, cfg: Config) -> bool:
        """Whether ``model``'s responses feed this book (its profile is semantic-router)."""
        return model in self._compat_models(cfg)

    def observe(self, obs: Observation, cfg: Config) -> None:
        model = obs.slice.model
        if model not in self._compat_models(cfg):
            return
        for metric, v in zip(("ttft", "tpot"), samples(obs), strict=True):
            if v is not None:
                key = (model, obs.cluster, metric)
                s = self.series.get(key)
                if s is None:
                    s = self.series[key] = SrSeries()
                s.add(v)

    def value(self, model: str, cluster: str, metric: str, percentile: int) -> float | None:
        s = self.series.get((model, cluster, metric))
        return None if s is None else s.value(percentile)

    def retain(self, cfg: Config) -> None:
        """After a reload: keep the windows of (model, cluster) pairs still under the profile."""
        keep = {(m.name, c) for m in cfg.models if m.compat == SEMANTIC_ROUTER
                for c in m.candidates}
        self.series = {k: s for k, s in self.series.items() if (k[0], k[1]) in keep}


@dataclass(frozen=True, slots=True)
class SrChoice:
    cluster: str
    reason: str  # scored | no_data | no_percentile | static
    scores: dict[str, float]  # candidates that were scored
    values: dict[str, dict[str, float | None]]  # candidate -> metric -> value


def eligible(model: ModelConfig, cfg: Config) -> list[str]:
    """The candidates in config order, after the model's region policy."""
    return [c for c in model.candidates if cfg.has_cluster(c)
            and (not model.regions or cfg.cluster(c).region in model.regions)]


def select(model: ModelConfig, candidates: Sequence[str], book: SrLatencyBook) -> SrChoice:
    """semantic-router's pick among ``candidates`` (non-empty, config order)."""
    first = candidates[0]
    if model.algorithm == "static":
        return SrChoice(first, "static", {}, {})
    metrics = enabled_metrics(model.latency_aware)
    if not metrics:
        return SrChoice(first, "no_percentile", {}, {})
    values = {c: {m: book.value(model.name, c, m, p) for m, p in metrics} for c in candidates}
    order = [m for m in _SCORE_ORDER if any(m == e for e, _ in metrics)]
    result = latency_aware_scores(candidates, values, order)
    if not result.scores:
        return SrChoice(first, "no_data", {}, values)
    return SrChoice(pick_lowest(candidates, result.scores), "scored", result.scores, values)


def explain(req: RequestInfo, choice: SrChoice, candidates: Sequence[str]) -> Explain:
    """The explain record of a semantic-router pick (no filters, states or weights)."""
    cands = []
    for c in candidates:
        scores = {f"{m}_s": round(v, 6) for m, v in choice.values.get(c, {}).items()
                  if v is not None}
        if c in choice.scores:
            scores["latency_aware"] = round(choice.scores[c], 6)
        cands.append(CandidateExplain(cluster=c, scores=scores))
    return Explain(req.slice.label(), tuple(cands), "semantic-router latency_aware",
                   (f"compat: semantic-router ({choice.reason})",))


def decide(req: RequestInfo, model: ModelConfig, klass: ClassConfig, cfg: Config,
           book: SrLatencyBook) -> Decision:
    """The router's decision for a model under this profile: semantic-router's pick,
    exactly, with its explain record when the request asked for one."""
    candidates = eligible(model, cfg)
    if not candidates:
        return Decision(cfg.default_cluster, "no_candidate",
                        detail="no candidate in the model's regions")
    choice = select(model, candidates, book)
    decision = decision_for(cfg, "", req, choice.cluster, choice.reason, klass, None)
    if req.explain:
        decision = replace(decision, explain=explain(req, choice, candidates))
    return decision
