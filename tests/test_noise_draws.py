"""Pooling a policy's runs over noise draws, and the "within 1.1x" test's own noise floor."""

from __future__ import annotations

import json

import pytest

from sidecar.sim.cli import main
from sidecar.sim.engine import Simulation, run_once
from sidecar.sim.gen_run import _agreement, family_figures, generate_one
from sidecar.sim.loader import parse_scenario
from sidecar.sim.noise_draws import STRIDE, counts, noise_seed, run_draws
from sidecar.sim.runner import run_scenario, violation_rate
from sidecar.sim.scenario import Scenario


def _scenario() -> Scenario:
    g = generate_one("spike", 3, 0)
    return parse_scenario(g.data, f"{g.name}.yaml", duration=150)


def test_one_draw_is_the_ordinary_run() -> None:
    sc = _scenario()
    assert run_draws(sc, "least_inflight", 1) == run_once(sc, "least_inflight")
    assert noise_seed(sc.seed, 0) is None
    assert noise_seed(sc.seed, 2) == sc.seed + 2 * STRIDE


def test_draws_pool_the_counts_of_independent_runs() -> None:
    sc = _scenario()
    pooled = run_draws(sc, "least_inflight", 3)
    runs = [Simulation(sc, "least_inflight", noise_seed=noise_seed(sc.seed, i)).run()
            for i in range(3)]
    first = dict(pooled)
    nd = first.pop("noise_draws")
    assert first == runs[0]  # the details are draw 0's
    per = [counts(r) for r in runs]
    assert nd["draws"] == 3
    assert (nd["scored"], nd["violations"]) == (sum(s for s, _ in per), sum(v for _, v in per))
    assert nd["rates"] == [round(v / s, 6) for s, v in per]
    assert len({r["calls"] for r in runs}) == 1  # the same traffic every draw
    assert violation_rate(pooled) == nd["violations"] / nd["scored"]
    assert violation_rate(runs[0]) == per[0][1] / per[0][0]


def test_run_scenario_summarises_the_pooled_rates() -> None:
    sc = _scenario()
    doc = run_scenario(sc, ["round_robin", "oracle"], noise_seeds=2)
    for p in ("round_robin", "oracle"):
        nd = doc["policies"][p]["noise_draws"]
        assert doc["summary"]["violation_rate"][p] == round(nd["violations"] / nd["scored"], 6)


def test_no_draws_is_an_error() -> None:
    with pytest.raises(ValueError, match="draws must be >= 1"):
        run_draws(_scenario(), "round_robin", 0)


@pytest.mark.parametrize(("rates", "share"), [
    ([0.01, 0.01], 1.0),
    ([0.0, 0.02], 0.5),  # 0 passes against 2 %, 2 % fails against 0 (+0.1 point)
    ([0.0, 0.0009], 1.0),  # inside the slack both ways
    ([0.010, 0.0115, 0.030], 4 / 6),  # 1.15 % vs 1 %: 1.1 % + 0.1 point passes
])
def test_agreement_counts_ordered_pairs(rates: list[float], share: float) -> None:
    assert _agreement(rates) == pytest.approx(share)


def test_family_figures_give_the_noise_floor_only_with_draws() -> None:
    def sc(tr_rates: list[float] | None) -> dict[str, object]:
        tr: dict[str, object] = {"classes": {"chat": {"violations": 10, "scored": 1000}}}
        if tr_rates is not None:
            tr["noise_draws"] = {"draws": len(tr_rates), "scored": 2000, "violations": 30,
                                 "rates": tr_rates}
        rr = {"classes": {"chat": {"violations": 20, "scored": 1000}}}
        return {"name": "x", "policies": {"tailroute": tr, "round_robin": rr},
                "summary": {"violation_rate": {"tailroute": 0.015, "round_robin": 0.02},
                            "best_baseline": "round_robin"}}

    assert "within_1.1x_of_itself" not in family_figures([sc(None)])
    figs = family_figures([sc([0.01, 0.02]), sc([0.01, 0.01])])
    assert figs["within_1.1x_of_itself"] == pytest.approx((0.5 + 1.0) / 2)
    assert figs["violations"]["tailroute"] == 60  # pooled counts
    assert figs["violations"]["round_robin"] == 40


def test_cli_noise_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--generate", "2", "--family", "spike", "--policy", "round_robin",
               "tailroute", "oracle", "--duration", "120", "--noise-seeds", "2", "--json",
               "-q"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["generated"]["noise_seeds"] == 2
    for s in doc["scenarios"]:
        assert all(r["noise_draws"]["draws"] == 2 for r in s["policies"].values())
    assert 0.0 <= doc["families"]["all"]["within_1.1x_of_itself"] <= 1.0
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--generate", "2", "--noise-seeds", "0", "-q"])
    assert exc.value.code == 2
    assert "--noise-seeds: must be an integer from 1 to 100, got 0" in capsys.readouterr().err
