"""Routing policies compared by the policy lab, behind one small protocol.

Every policy sees the same thing a router in the request path would see:

* ``choose(att, now, rng)`` for each attempt (first tries and retries) returns a
  cluster name -- or, for policies that also decide admission, timeouts and
  probes (tailroute), a core :class:`~sidecar.core.types.Decision`;
* ``on_start(att, now)`` when the attempt is released to that cluster;
* ``on_result(att, now)`` when it is over, with the outcome the sidecar would
  have measured (``att`` exposes the fields of
  :class:`~sidecar.core.types.Observation`: ``cluster``, ``outcome``,
  ``status``, ``ttft_s`` (streams only), ``tpot_s``, ``e2e_s``,
  ``output_tokens``, ``is_retry``; ``att.observation()`` builds the core object);
* ``tick(now)`` at the times ``next_deadline()`` asks for (only when
  ``needs_tick``);
* optionally ``queue_until(call)`` / ``withdraw(call)``, for policies whose
  ``choose`` may answer ``queue`` (see :mod:`sidecar.sim.engine`);
* optionally ``route_state(cluster, slice) -> (state, weight) | None``: how the
  policy sees a route (a pure read), sampled at the end of every time bucket
  for the ``route_state`` series.

Policies must draw randomness only from the ``rng`` they are given (or one
they were built with), so a run is reproducible for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from sidecar.core.config import Config
from sidecar.core.types import Decision

if TYPE_CHECKING:
    from sidecar.sim.provider import Provider
    from sidecar.sim.records import Attempt

#: Every policy the lab knows, in report order.
POLICY_NAMES: Final[tuple[str, ...]] = (
    "round_robin",
    "random",
    "least_inflight",
    "p50_only",
    "semantic_router",
    "litellm",
    "litellm_ttft_p",
    "envoy_outlier",
    "tailroute",
    "tailroute_no_admission",
    "tailroute_native",
    "tailroute_hybrid",
    "oracle",
    "oracle_routing",
)
#: What ``simulate`` runs when neither the CLI nor the scenario names policies.
#: Variants (tailroute with admission off or in another routing mode, the lab's
#: first oracle) run only when named.
VARIANTS: Final[tuple[str, ...]] = (
    "tailroute_no_admission", "tailroute_native", "tailroute_hybrid", "oracle_routing",
)
DEFAULT_POLICIES: Final[tuple[str, ...]] = tuple(p for p in POLICY_NAMES if p not in VARIANTS)
#: Policies compared against tailroute in the summary (everything real that is not tailroute).
BASELINES: Final[tuple[str, ...]] = tuple(
    p for p in POLICY_NAMES if not p.startswith("tailroute") and not p.startswith("oracle")
)


class Policy(Protocol):
    name: str
    needs_tick: bool

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision: ...

    def on_start(self, att: Attempt, now: float) -> None: ...

    def on_result(self, att: Attempt, now: float) -> None: ...

    def tick(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may be built from. Only the oracle looks at ``providers``."""

    config: Config
    providers: Mapping[str, Provider]


class BasePolicy:
    """No-op defaults; subclasses override what they need."""

    name = "base"
    needs_tick = False

    def __init__(self, ctx: PolicyContext) -> None:
        self.config = ctx.config
        self.candidates: dict[str, tuple[str, ...]] = {
            m.name: m.candidates for m in ctx.config.models
        }

    def choose(self, att: Attempt, now: float, rng: random.Random) -> str | Decision:
        raise NotImplementedError

    def on_start(self, att: Attempt, now: float) -> None:
        return None

    def on_result(self, att: Attempt, now: float) -> None:
        return None

    def tick(self, now: float) -> None:
        return None

    def next_deadline(self) -> float | None:
        return None


def make_policy(name: str, ctx: PolicyContext) -> Policy:
    """Build a fresh policy by name (see :data:`POLICY_NAMES`)."""
    factories = _factories()
    if name not in factories:
        raise KeyError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    return factories[name](ctx)


def _factories() -> dict[str, Callable[[PolicyContext], Policy]]:
    from sidecar.sim.policies.anchors import LiteLLM, LiteLLMTtftPercentile, SemanticRouter
    from sidecar.sim.policies.envoy import EnvoyOutlier
    from sidecar.sim.policies.oracle import Oracle
    from sidecar.sim.policies.oracle_routing import RoutingOracle
    from sidecar.sim.policies.simple import LeastInflight, P50Only, RandomPick, RoundRobin
    from sidecar.sim.policies.tailroute import Tailroute, TailrouteNoAdmission
    from sidecar.sim.policies.tailroute_native import TailrouteHybrid, TailrouteNative

    return {
        "round_robin": RoundRobin,
        "random": RandomPick,
        "least_inflight": LeastInflight,
        "p50_only": P50Only,
        "semantic_router": SemanticRouter,
        "litellm": LiteLLM,
        "litellm_ttft_p": LiteLLMTtftPercentile,
        "envoy_outlier": EnvoyOutlier,
        "tailroute": Tailroute,
        "tailroute_no_admission": TailrouteNoAdmission,
        "tailroute_native": TailrouteNative,
        "tailroute_hybrid": TailrouteHybrid,
        "oracle": Oracle,
        "oracle_routing": RoutingOracle,
    }
