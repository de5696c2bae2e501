"""The policy lab: a discrete-event simulator that drives tailroute's pure core.

Layout:

* :mod:`~sidecar.sim.scenario` / :mod:`~sidecar.sim.loader` (+ ``loader_workloads``) /
  :mod:`~sidecar.sim.validate`: the scenario file format (docs/scenarios.md),
  parsed and validated;
* :mod:`~sidecar.sim.dists`, :mod:`~sidecar.sim.traffic`: latency and token
  distributions, arrival processes and trace replay;
* :mod:`~sidecar.sim.provider`: providers with slots, a FIFO queue, contention
  and degradation events;
* :mod:`~sidecar.sim.records`, :mod:`~sidecar.sim.engine`, :mod:`~sidecar.sim.workflows`:
  calls, attempts, clients (timeouts, retries, cancels, admission holds), the
  event loop and agentic workflows;
* :mod:`~sidecar.sim.policies`: the policies compared (tailroute, the anchors,
  simple baselines and an oracle);
* :mod:`~sidecar.sim.metrics`, :mod:`~sidecar.sim.runner`, :mod:`~sidecar.sim.tables`,
  :mod:`~sidecar.sim.report`, :mod:`~sidecar.sim.cli`: outcomes, suites,
  tables, the markdown/PNG report and the command line (docs/policy-lab.md).
"""
