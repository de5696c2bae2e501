"""The plan cache's small helpers: the low-priority variant of a reused decision."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.core import plan_cache
from sidecar.core.plan_cache import LowVariants
from sidecar.core.types import Decision, Explain


@pytest.mark.parametrize("decision", [
    Decision("a", "scored"),
    Decision("b", "probe", is_probe=True, timeout_ms=1500.0),
    Decision("c", "only_candidate", upstream_model="m-2", detail="why"),
])
def test_the_low_variant_is_replace_with_low_set(decision: Decision) -> None:
    low = LowVariants().of(decision)
    assert low == replace(decision, low=True)
    assert not decision.low  # the original is left alone


def test_the_same_decision_gets_the_same_variant_and_an_equal_one_its_own() -> None:
    variants = LowVariants()
    d = Decision("a", "scored")
    first = variants.of(d)
    assert variants.of(d) is first
    twin = Decision("a", "scored")  # equal, but another object: its own entry
    assert variants.of(twin) == first and variants.of(twin) is not first


def test_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_cache, "LOW_VARIANTS_MAX", 4)
    variants = LowVariants()
    kept = [Decision(f"c{i}", "scored") for i in range(10)]
    for d in kept:
        assert variants.of(d).low
        assert len(variants._memo) <= 4



def test_an_explained_decision_is_not_kept() -> None:
    # An explain is built for one request: keeping it would only hold memory.
    variants = LowVariants()
    why = Explain("m|interactive|short|s", (), "weighted_random")
    explained = Decision("a", "scored", explain=why)
    low = variants.of(explained)
    assert low.low and low.explain is explained.explain
    assert not variants._memo
    assert variants.of(Decision("a", "scored")).low and len(variants._memo) == 1
