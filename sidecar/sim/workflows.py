"""Agentic workflows: stages of parallel calls sharing one end-to-end deadline.

A workflow's stages run in order; a stage sends ``fanout`` calls in parallel
and completes when all of them are over. Every call carries the workflow's
absolute deadline (the client never waits past it, and the request tells the
router the remaining budget and whether the step is ``critical`` or
``optional``). Rules:

* a **critical** call that ends in anything but ``ok`` fails the workflow at
  once (calls still running finish but no longer matter);
* an **optional** stage is skipped by the caller when less than its
  ``min_budget_ms`` remains (its calls count as ``skipped``, never sent); the
  router may also answer ``skip``; a failed optional call is ignored;
* the workflow **completes** when its last stage completes (necessarily before
  the deadline, since no call outlives it).

Token counts of every call are drawn when the workflow arrives, so each policy
faces the very same workflows (common random numbers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.sim.records import Call, Workflow
from sidecar.sim.scenario import StepSpec
from sidecar.sim.traffic import Source

if TYPE_CHECKING:
    from sidecar.sim.engine import Simulation


class WorkflowRunner:
    """Drives the workflows of one simulation run."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def start(self, src: Source, inp: int | None, out: int | None, scored: bool,
              ordinal: int = 0) -> None:
        """A workflow arrives now; ``inp``/``out`` are trace token counts, if any;
        ``ordinal`` is its arrival ordinal (its calls' draw keys derive from it)."""
        sim = self.sim
        wl = src.wl
        spec = wl.workflow
        assert spec is not None
        wf = Workflow(wl, sim.now, sim.now + spec.deadline, scored)
        wf.key = ordinal * sum(st.fanout for st in spec.steps)
        rng = src.tok_rng
        for st in spec.steps:
            calls = []
            for _ in range(st.fanout):
                wi, wo = (inp, out) if inp is not None and out is not None else src.tokens()
                i = st.input_tokens.sample(rng) if st.input_tokens else wi
                o = st.output_tokens.sample(rng) if st.output_tokens else wo
                calls.append((i, o))
            wf.plan.append(calls)
        sim.active += 1
        sim.metrics.workflow_started(wf)
        self._stage(wf)

    def call_done(self, wf: Workflow, call: Call, kind: str) -> None:
        step = call.step
        if kind not in ("ok", "skipped") and step is not None and step.kind == "critical":
            self._finish(wf, completed=False)
            return
        wf.pending -= 1
        if wf.pending == 0:
            wf.stage += 1
            self._stage(wf)

    def _stage(self, wf: Workflow) -> None:
        sim = self.sim
        steps = wf.wl.workflow.steps  # type: ignore[union-attr]
        src = sim._sources[wf.wl.name]
        while True:
            if wf.stage >= len(steps):
                self._finish(wf, completed=True)
                return
            st = steps[wf.stage]
            remaining = wf.deadline - sim.now
            if remaining <= 0:
                self._finish(wf, completed=False)
                return
            first = wf.key + sum(len(p) for p in wf.plan[:wf.stage])
            calls = [self._step_call(src, wf, st, i, o, first + j)
                     for j, (i, o) in enumerate(wf.plan[wf.stage])]
            if st.kind == "optional" and remaining < st.min_budget:
                for c in calls:  # the caller skips it: counted, never sent
                    c.workflow = None
                    sim.finish_call(c, "skipped", None)
                wf.stage += 1
                continue
            wf.pending = len(calls)
            for c in calls:
                if wf.done:
                    sim.active -= 1  # never sent: the workflow already failed
                    continue
                sim.send(c)
            return

    def _step_call(self, src: Source, wf: Workflow, st: StepSpec, inp: int, out: int,
                   key: int) -> Call:
        wl = wf.wl
        call = self.sim.new_call(src, st.klass or wl.klass,
                                 wl.stream if st.stream is None else st.stream, inp, out,
                                 st.max_tokens if st.max_tokens is not None else wl.max_tokens,
                                 wf.scored, key)
        call.workflow, call.step, call.deadline = wf, st, wf.deadline
        return call

    def _finish(self, wf: Workflow, completed: bool) -> None:
        wf.done = True
        self.sim.active -= 1
        self.sim.metrics.workflow_done(wf, completed, self.sim.now)
