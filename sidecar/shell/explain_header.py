"""The opt-in ``x-tailroute-explain-result`` response header (rich path, asked for with
``x-tailroute-explain: 1``): one line of JSON saying where the request went and why.

Header values must stay small (Envoy's and clients' header limits), so the text is at
most :data:`EXPLAIN_MAX_CHARS` characters and always whole JSON: candidates that do
not fit are left out from the end of the list (the selection's order) and counted in
``candidates_omitted``, then notes likewise in ``notes_omitted``; both keys are
present only when something was left out. ``/explain`` on the admin port has every
candidate.
"""

from __future__ import annotations

import json
from typing import Any, Final

from sidecar.core.types import CandidateExplain, Decision

EXPLAIN_HEADER: Final = "x-tailroute-explain-result"
EXPLAIN_MAX_CHARS: Final = 4000


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _candidate(c: CandidateExplain) -> dict[str, Any]:
    return {"c": c.cluster, "state": c.state, "w": c.weight, "scores": c.scores,
            "drop": next((v for v in c.verdicts.values() if v != "pass"), None),
            "stats": c.stats_slice, "fallback": c.fell_back}


def _prefix_within(items: list[str], budget: int) -> int:
    """How many of ``items``, from the first, fit in ``budget`` characters joined by commas."""
    used = -1  # n items take n - 1 commas
    for n, item in enumerate(items):
        used += len(item) + 1
        if used > budget:
            return n
    return len(items)


def explain_json(decision: Decision, cap: int = EXPLAIN_MAX_CHARS) -> str:
    """Compact one-line explain for the response header: valid JSON of at most ``cap``
    characters (the head alone, cluster and reason, always fits: both come from config
    and a closed set)."""
    ex = decision.explain
    if ex is None:
        return _dumps({"cluster": decision.cluster, "reason": decision.reason})
    head = _dumps({"cluster": decision.cluster, "reason": decision.reason, "slice": ex.slice})
    candidates = [_dumps(_candidate(c)) for c in ex.candidates]
    notes = [_dumps(n) for n in ex.notes]
    # '{...head...,"candidates":[...],"notes":[...],"candidates_omitted":N,"notes_omitted":M}'
    reserve = len(',"candidates":[],"notes":[]') + len(
        f',"candidates_omitted":{len(candidates)},"notes_omitted":{len(notes)}')
    budget = cap - len(head) - reserve
    kept = _prefix_within(candidates, budget)
    budget -= len(",".join(candidates[:kept]))
    kept_notes = _prefix_within(notes, budget)
    text = (f'{head[:-1]},"candidates":[{",".join(candidates[:kept])}],'
            f'"notes":[{",".join(notes[:kept_notes])}]')
    if kept < len(candidates):
        text += f',"candidates_omitted":{len(candidates) - kept}'
    if kept_notes < len(notes):
        text += f',"notes_omitted":{len(notes) - kept_notes}'
    return text + "}"
