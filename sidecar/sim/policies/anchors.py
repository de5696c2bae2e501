"""The anchors' latency-based routers, as their code actually behaves.

semantic-router ``latency_aware`` (vllm-project/semantic-router,
``src/semantic-router/pkg/latency/cache.go``: the TTFT/TPOT caches;
``src/semantic-router/pkg/selection/latency_aware.go``: the selection; the
sidecar's ``compat: semantic-router`` profile, :mod:`sidecar.core.compat_sr`,
follows the same facts):

* per candidate (here: per model and cluster) the **last 1000** TTFT and TPOT
  samples of *successful* responses, no time decay, never expired;
* with **fewer than 3** samples the value is an **EMA** (alpha = 0.3: 30 % new
  value, 70 % history, seeded with the first sample); from 3 samples on, the
  configured percentile, **linearly interpolated** between order statistics
  (index = p x (n - 1));
* score = mean over the enabled metrics of value / best value among candidates
  with data for *every* enabled metric; candidates without data are
  **skipped**; lowest score wins; no candidate with data: the **first
  candidate**; no health, no error handling, no probing. The percentiles are
  the model's ``algorithm.latency_aware`` from the embedded tailroute config
  (the scoring itself reuses :mod:`sidecar.core.latency_aware`).
* TTFT of a non-streaming response is its full time (first body byte); TPOT of
  one is end-to-end / completion tokens.

LiteLLM latency-based routing (``router_strategy/lowest_latency.py``,
``router_utils/cooldown_handlers.py``):

* per deployment the **last 10** values (``max_latency_list_size``) of
  latency **per completion token** (response time / completion tokens) and,
  for streams, TTFT per completion token;
* ranking value: the **mean** of the TTFT list for streaming requests (when it
  has samples), else of the latency list -- divided by the length of the
  *latency* list, as upstream does; an unused deployment counts as 0, so it is
  tried first;
* a request timeout appends a **1000 s** penalty to the latency list (not to
  the TTFT list, so streaming ranking ignores timeouts -- an upstream quirk kept
  on purpose);
* ``lowest_latency_buffer`` (default **0**): random choice among deployments
  within ``(1 + buffer) x`` the lowest value;
* **cooldown 5 s** when, in the current minute, > 50 % of a deployment's calls
  failed with >= 5 calls, or at once on a 429 -- only when the model group
  has more than one deployment. All deployments cooling down: LiteLLM answers
  429 "no deployments available" (retry after 5 s).

``litellm_ttft_p`` keeps all of that but ranks by a **percentile** (the model's
``ttft_percentile``, default 95) of the same 10-sample window of raw TTFT
(streams) or raw latency (non-streaming), not divided by tokens. Upstream
LiteLLM has no such option: the variant isolates what a tail statistic alone
buys inside LiteLLM's machinery.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Final

from sidecar.core.latency_aware import enabled_metrics, latency_aware_scores, pick_lowest
from sidecar.core.types import Decision
from sidecar.sim.policies import BasePolicy, PolicyContext
from sidecar.sim.policies.simple import _Window
from sidecar.sim.records import ROUTE, Attempt

SR_WINDOW: Final = 1000
SR_EMA_ALPHA: Final = 0.3
SR_MIN_FOR_PERCENTILE: Final = 3


class _SrSeries:
    __slots__ = ("_memo", "ema", "window")

    def __init__(self) -> None:
        self.window = _Window(SR_WINDOW)
        self.ema: float | None = None
        self._memo: tuple[int, float | None] | None = None  # (percentile, value) until add()

    def add(self, v: float) -> None:
        self.ema = v if self.ema is None else SR_EMA_ALPHA * v + (1 - SR_EMA_ALPHA) * self.ema
        self.window.add(v)
        self._memo = None

    def value(self, percentile: int) -> float | None:
        memo = self._memo
        if memo is not None and memo[0] == percentile:
            return memo[1]
        if len(self.window) < SR_MIN_FOR_PERCENTILE:
            v = self.ema
        else:
            v = self.window.percentile(percentile / 100.0)
        self._memo = (percentile, v)
        return v


class SemanticRouter(BasePolicy):
    name = "semantic_router"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.series: dict[tuple[str, str, str], _SrSeries] = {}
        self.metrics = {m.name: enabled_metrics(m.latency_aware) for m in ctx.config.models}

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        call = att.call
        metrics = self.metrics[call.model]
        cands = call.candidates
        values: dict[str, dict[str, float | None]] = {}
        for c in cands:
            row: dict[str, float | None] = {}
            for metric, pct in metrics:
                s = self.series.get((call.model, c, metric))
                row[metric] = None if s is None else s.value(pct)
            values[c] = row
        scores = latency_aware_scores(cands, values, [m for m, _ in metrics]).scores
        return pick_lowest(cands, scores)

    def on_result(self, att: Attempt, now: float) -> None:
        if att.outcome != "ok":
            return
        e2e = att.e2e_s
        if e2e is None:
            return
        call = att.call
        ttft = att.ttft_s if call.stream else e2e
        tpot = att.tpot_s if call.stream else e2e / max(att.tokens_done, 1)
        for metric, v in (("ttft", ttft), ("tpot", tpot)):
            if v is None or v <= 0:
                continue  # upstream drops non-positive samples
            key = (call.model, att.cluster, metric)
            s = self.series.get(key)
            if s is None:
                s = self.series[key] = _SrSeries()
            s.add(v)


class _Deployment:
    __slots__ = ("cool_until", "fails", "latency", "minute", "ok", "ttft")

    def __init__(self, size: int) -> None:
        self.latency: deque[float] = deque(maxlen=size)
        self.ttft: deque[float] = deque(maxlen=size)
        self.minute = -1
        self.ok = 0
        self.fails = 0
        self.cool_until = -1.0


class LiteLLM(BasePolicy):
    name = "litellm"
    WINDOW = 10
    BUFFER = 0.0
    COOLDOWN_S = 5.0
    FAIL_SHARE = 0.5
    MIN_CALLS = 5
    TIMEOUT_PENALTY = 1000.0

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.deps: dict[tuple[str, str], _Deployment] = {}
        self.cooldowns = 0

    def _dep(self, model: str, cluster: str) -> _Deployment:
        d = self.deps.get((model, cluster))
        if d is None:
            d = self.deps[(model, cluster)] = _Deployment(self.WINDOW)
        return d

    def value(self, d: _Deployment, stream: bool, model: str) -> float:
        if not d.latency:
            return 0.0  # unused deployment: upstream seeds it with latency 0
        src = d.ttft if stream and d.ttft else d.latency
        return sum(src) / len(d.latency)

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        call = att.call
        healthy = [c for c in call.candidates if self._dep(call.model, c).cool_until <= now]
        if not healthy:
            return Decision(call.candidates[0], "no_deployments", admission="defer", status=429,
                            retry_after_s=int(self.COOLDOWN_S))
        vals = [(self.value(self._dep(call.model, c), call.stream, call.model), c)
                for c in healthy]
        lowest = min(v for v, _ in vals)
        valid = [c for v, c in vals if v <= lowest + self.BUFFER * lowest]
        return valid[0] if len(valid) == 1 else valid[int(rng.random() * len(valid))]

    def on_result(self, att: Attempt, now: float) -> None:
        call = att.call
        d = self._dep(call.model, att.cluster)
        minute = int(now // 60.0)
        if minute != d.minute:
            d.minute, d.ok, d.fails = minute, 0, 0
        if att.outcome == "ok":
            d.ok += 1
            self._sample(d, att)
            return
        if att.outcome == "cancel":
            return  # the caller went away: not a deployment failure
        if att.outcome == "timeout" and att.deadline_kind == ROUTE:
            d.latency.append(self.TIMEOUT_PENALTY)
        d.fails += 1
        if len(call.candidates) < 2:
            return  # upstream never cools down a single-deployment group
        total = d.ok + d.fails
        if att.status == 429 or (d.fails / total > self.FAIL_SHARE and total >= self.MIN_CALLS):
            if d.cool_until <= now:
                self.cooldowns += 1
            d.cool_until = now + self.COOLDOWN_S

    def _sample(self, d: _Deployment, att: Attempt) -> None:
        e2e = att.e2e_s
        if e2e is None:
            return
        tokens = max(att.tokens_done, 1)
        d.latency.append(e2e / tokens)
        ttft = att.ttft_s
        if ttft is not None:
            d.ttft.append(ttft / tokens)

    def stats(self) -> dict[str, int]:
        return {"cooldowns": self.cooldowns}


class LiteLLMTtftPercentile(LiteLLM):
    name = "litellm_ttft_p"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.pct = {m.name: (m.latency_aware.ttft_percentile or 95) / 100.0
                    for m in ctx.config.models}

    def value(self, d: _Deployment, stream: bool, model: str) -> float:
        src = d.ttft if stream and d.ttft else d.latency
        if not src:
            return 0.0
        s = sorted(src)
        idx = self.pct[model] * (len(s) - 1)
        lo = int(idx)
        if lo + 1 >= len(s):
            return s[-1]
        w = idx - lo
        return s[lo] * (1.0 - w) + s[lo + 1] * w

    def _sample(self, d: _Deployment, att: Attempt) -> None:
        e2e = att.e2e_s
        if e2e is None:
            return
        d.latency.append(e2e)
        if att.ttft_s is not None:
            d.ttft.append(att.ttft_s)
