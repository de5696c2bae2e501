"""How one outcome is judged against its class: a censored cancel, a probe's budget,
a hard failure. Pure functions of the config and the observation, read by the
router's intake (:mod:`sidecar.core.intake`) before anything is recorded.

A cancel (the client left, or a caller's own deadline passed) is judged by how long
it had waited::

    waited past the class budget        -> a timeout (the client gave up on a slow route;
                                           not on a TPOT class: a per-token budget
                                           bounds no wait)
    within it, first token measured     -> a cancel with its TTFT kept: a sample (below)
    within it, otherwise                -> a cancel without latencies: no evidence

A first token that came (``Observation.ttft_measured``: the access log's first body
byte plus the route's offset, or this very request's timed first token) is as fast
as it says whatever the client did next. The OpenAI SDK's default client, which
never asks for usage and closes at ``data: [DONE]``, makes Envoy log many complete
answers as cancels (the provider ends its body a little after ``[DONE]``;
docs/response-timing.md): read as no evidence, a route answering such clients was
seen only through its slow answers. Such a cancel is counted a cancel (never an
``ok``: its end, e2e and TPOT are unknown) whose TTFT is a sample, and for TTFT an
answer that came in time (success estimates, health windows: the sub-windows'
``first``, :class:`sidecar.core.subwindow.SubWindow`); for e2e and TPOT it is no
outcome. Only first attempts give samples
(:func:`sidecar.core.subwindow.latency_indices`).
"""

from __future__ import annotations

from sidecar.core.config import Config
from sidecar.core.types import Observation


def is_hard(obs: Observation) -> bool:
    """A hard failure for the fast path: a timeout, or an error with a 5xx or no status."""
    return obs.outcome == "timeout" or (
        obs.outcome == "error" and (obs.status is None or obs.status >= 500))


def judge_censored(config: Config, obs: Observation) -> Observation:
    """A cancel is a failure only if the wait already exceeded the class budget.

    Then it is a client-side timeout (the client gave up on a slow route);
    before that, a user pressing stop says nothing about the route, so its
    lower-bound latencies are dropped -- except a measured first token
    (``ttft_measured``): that came as fast as it says whatever the client did next
    (the OpenAI SDK's default client leaves every complete answer at ``[DONE]``,
    often logged as a cancel), so it stays a TTFT sample, a cancel's, never an
    ``ok`` (no e2e or TPOT: its end is unknown).
    """
    if obs.outcome != "cancel" or not obs.censored:
        return obs
    klass = config.workload_class(obs.slice.klass)
    value = None
    if klass is not None:
        # A TPOT budget is per token: a cancel's whole wait is no pace, and read against
        # it every answer a client left after ~budget (the OpenAI SDK's default client,
        # at [DONE]) was a timeout, a hard failure of the route. Nothing bounds it then.
        metric = klass.slo.metric
        value = obs.ttft_s if metric == "ttft" else None if metric == "tpot" else obs.e2e_s
    if klass is not None and value is not None and value * 1000.0 >= klass.slo.budget_ms:
        return obs.judged("timeout", obs.ttft_s, obs.e2e_s, censored=True)
    return obs.judged("cancel", obs.ttft_s if obs.ttft_measured else None, None,
                      censored=False)


def within_budget(config: Config, obs: Observation) -> bool:
    """Did a probe meet its class SLO budget (the metric it promises)?"""
    klass = config.workload_class(obs.slice.klass)
    if klass is None:
        return True
    metric = klass.slo.metric
    value = obs.ttft_s if metric == "ttft" else obs.tpot_s if metric == "tpot" else obs.e2e_s
    if value is None and metric == "ttft":
        value = obs.e2e_s  # a TTFT class served without streaming: its first token came then
    # A TPOT unknown (an answer without usage: the [DONE] mark's ok, an unstreamed one)
    # cannot be read against a per-token budget; its whole e2e is no pace.
    return value is None or value * 1000.0 <= klass.slo.budget_ms
