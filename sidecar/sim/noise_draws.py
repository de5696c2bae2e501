"""One policy on one scenario over several noise draws, pooled.

A generated scenario is short (often a few thousand scored calls), so one run's
violation rate carries sampling noise of the same size as the differences the
summary figures compare: tailroute on family seed 1 is within 1.1x (+0.1 point)
of *its own rate on another noise draw* in only about 83 % of pairs
(docs/policy-lab.md, "How noisy one run is"). ``--noise-seeds K`` runs each
policy ``K`` times on the same traffic (arrivals, prompts and events are the
scenario's; only the providers' service draws and the policy's own randomness
change, as :class:`~sidecar.sim.engine.Simulation`'s ``noise_seed`` does) and
pools the counts::

    rate = sum_i violations_i / sum_i scored_i        (i = 0 .. K-1)

Draw 0 is the ordinary run (the scenario's own seed), so ``K = 1`` is exactly
the single-run document; draw ``i >= 1`` uses noise seed ``seed + i * STRIDE``.
The policy's result is draw 0's, with a ``noise_draws`` entry holding the
pooled counts and each draw's rate; :func:`sidecar.sim.runner.violation_rate`
reads the pooled counts, so every summary figure is on the pooled rate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from sidecar.sim.engine import Simulation
from sidecar.sim.scenario import Scenario

# Far apart so that draw i of seed s is not draw 0 of a nearby seed s + i.
STRIDE: Final = 1_000_003


def noise_seed(seed: int, draw: int) -> int | None:
    """The noise seed of ``draw`` (None for draw 0: the scenario's own seed)."""
    return None if draw == 0 else seed + draw * STRIDE


def counts(result: dict[str, Any]) -> tuple[int, int]:
    """``(scored, violations)`` of one run, all classes together."""
    classes = result["classes"].values()
    return sum(c["scored"] for c in classes), sum(c["violations"] for c in classes)


def pooled_counts(result: dict[str, Any]) -> tuple[int, int]:
    """``(scored, violations)`` pooled over the noise draws when there were several,
    else the one run's."""
    pooled = result.get("noise_draws")
    if pooled is None:
        return counts(result)
    return int(pooled["scored"]), int(pooled["violations"])


def run_draws(sc: Scenario, policy: str, draws: int,
              progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """``policy`` on ``sc`` over ``draws`` noise draws (module docstring); progress
    reports draw 0 only."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    first = Simulation(sc, policy, progress).run()
    if draws == 1:
        return first
    scored, bad = counts(first)
    rates = [bad / scored if scored else 0.0]
    for i in range(1, draws):
        s, v = counts(Simulation(sc, policy, noise_seed=noise_seed(sc.seed, i)).run())
        scored += s
        bad += v
        rates.append(v / s if s else 0.0)
    first["noise_draws"] = {"draws": draws, "scored": scored, "violations": bad,
                            "rates": [round(r, 6) for r in rates]}
    return first
