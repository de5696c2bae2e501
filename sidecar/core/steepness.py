"""How sharply a class's selection prefers the better route: one place for the curves.

    latency score  s = r ** -E          E = 2 + (E_max - 2) n / (n + 50)
    load score     s = max(1 - u, 0.02) ** (k_capacity * E_max / 2)

``E_max`` is the class's ``latency_exponent`` (default 2: the gentle curve, where a
route 10 % slower than the best keeps 0.83 of its weight and one twice as slow 1/4);
``r >= 1`` is the route's semantic-router latency ratio, ``n`` the fewest samples
behind it, ``u`` its in-flight share of ``max_concurrency``.

Why a steeper curve is offered: every request over budget counts, and with the
gentle curve a route twice as slow as the best keeps 11-16 % of the traffic, whose
tail supplied much of the violations that herding baselines avoided on generated
scenarios (docs/policy-lab.md, "Concentration": ``E_max = 6`` cut summed violations
by 4-7 % there). Why it is not the default: on the shipped ``burst_queueing`` and
``overload`` it piled more of a burst onto the fastest route's queue (mean over four
noise seeds 13.4 -> 18.4 % and 12.2 -> 13.4 %).

The two refinements that make the steep curve usable at all:

* ``E`` grows with the evidence: a percentile of a few samples is noisy, and a
  steep curve on noise moves traffic at random between routes that are alike
  (three near-equal routes at 0.5 req/s did with ``E = 6`` at once);
* the load score is a latency multiplier (a queue's waiting time grows as
  ``1 / (1 - u)``) set against a ratio measured at past load, so its exponent takes
  the same factor ``E_max / 2``; without it a steep latency score piled
  ``burst_queueing``'s bursts onto one queue (13.6 -> 18.4 %).
"""

from __future__ import annotations

from typing import Final

from sidecar.core.config import ClassConfig

GENTLE: Final = 2.0  # E of a route without samples, and of every route of a default class
HALF_SAMPLES: Final = 50.0  # samples at which E is halfway from GENTLE to the class's maximum


def latency_exponent(klass: ClassConfig, samples: int) -> float:
    """``E`` of ``s = r ** -E`` for a route whose ratio rests on ``samples`` samples."""
    top = klass.latency_exponent
    if top <= GENTLE:
        return GENTLE
    return GENTLE + (top - GENTLE) * samples / (samples + HALF_SAMPLES)


def latency_score(klass: ClassConfig, ratio: float, samples: int) -> float:
    """``s = r ** -E`` for a route with latency ratio ``ratio >= 1`` on ``samples``."""
    e = latency_exponent(klass, samples)
    # 1 / r**2 exactly as before for the default curve: same decisions, bit for bit.
    return 1.0 / (ratio * ratio) if e == GENTLE else ratio ** -e


def load_factor(klass: ClassConfig) -> float:
    """The class's capacity weight is multiplied by this in the load score's exponent."""
    return max(klass.latency_exponent, GENTLE) / GENTLE
