"""The worse routes share one route's weight: many slow alternatives must not outweigh the best.

Selection draws a route in proportion to its weight, and each weight says how
a route compares with the best one (a route one allowed share of violations
worse keeps 1/e of the best weight, a route twice as slow a quarter). That is
a comparison of two routes. Drawn among ``N`` candidates, the best route's
share is ``1 / (1 + sum of the others' relative weights)``, so nine routes
that are each clearly worse take together what no one of them would: beside
one good route and nine near-budget ones, the good route got ~55 % of the
traffic and the class missed its budget on 2.7 % of its calls, where sending
everything to the good route (which had room) missed 0.4 % (the lab's
``many_one_good`` case). With two candidates the draw is the pairwise
comparison the scores were made for; the count of alternatives only dilutes it.

So the routes that are clearly worse than the best pool their weight: the
weight they hold together is that of the heaviest of them, split among them in
proportion to their own. With ``s_i`` a candidate's static weight (the plan's
``base`` x its health weight) and ``top`` the best one's::

    m_i = min(1, ln(top / s_i))               membership: 0 for the best, 1 at or below top / e
    g   = max_j m_j s_j / sum_j m_j s_j       (1 when only one route is a member)
    base_i <- base_i * (1 - m_i (1 - g))

The pooled parts ``m_i s_i`` add up to the largest of them afterwards.
Membership grows smoothly from the best route's weight to ``top / e``, so a
route crossing that line moves the others' weights continuously; a route a
little worse than the best is a small member (at 0.9 x top, m = 0.1), so beside
it a lone clearly worse route gives up part of its weight too ([1, 0.9, 0.1]
becomes [1, 0.854, 0.051]). Routes equal to the best keep their weights, so
load balancing among alike routes is unchanged, and so is every choice between
two candidates. The exploration floor is left as it is (its share is the
health machine's and the fleet's evidence, :mod:`sidecar.core.light_load`);
shrinking it by the same factor moved the case by 0.02 points. The load and queue
scores and the floor apply per request afterwards as before, so a full best
route still spills to the others and every route keeps being sampled. For that
reason pooling applies only where the in-flight counts are live: native mode's
window weights (``SelectionContext.live_counts`` false) leave it out, as they
leave out the queue score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from sidecar.core.selection import Candidate

POOL: Final = "pool"  # the factor, in the candidate's scores (explain)


def pool_worse(cands: Sequence[Candidate]) -> None:
    """Multiply the ``base`` of each clearly worse candidate among ``cands`` by its
    pooling factor (formula in the module docstring); records ``scores["pool"]``
    where it is below 1."""
    static = [c.base * c.health.weight for c in cands]
    top = max(static, default=0.0)
    if top <= 0.0 or len(cands) < 3:
        return
    member = [min(1.0, math.log(top / s)) if s > 0.0 else 1.0 for s in static]
    held = [m * s for m, s in zip(member, static, strict=True)]
    total = sum(held)
    if total <= 0.0:
        return
    g = max(held) / total
    if g >= 1.0:
        return
    for cand, m in zip(cands, member, strict=True):
        factor = 1.0 - m * (1.0 - g)
        if factor < 1.0:
            cand.base *= factor
            cand.scores[POOL] = factor
