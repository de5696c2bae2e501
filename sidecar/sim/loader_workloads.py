"""Parsing of ``workloads[]``: arrival processes, token counts, clients and workflows.

Part of :mod:`sidecar.sim.loader` (split for size); the format is documented in
docs/scenarios.md and every error names the file and the field path.
"""

from __future__ import annotations

from pathlib import Path

from sidecar.core.config import Config
from sidecar.sim.bounds import MAX_RATE_PER_S
from sidecar.sim.loader_dists import parse_tokens
from sidecar.sim.scenario import (
    Arrival,
    ClientSpec,
    MaxTokens,
    Mmpp,
    OnOff,
    Poisson,
    StepSpec,
    Trace,
    WorkflowSpec,
    WorkloadSpec,
)
from sidecar.sim.validate import Reader


def resolve(base: Path, text: str) -> Path:
    """A path from a scenario file: absolute, or relative to the file's directory."""
    p = Path(text).expanduser()
    return p if p.is_absolute() else (base / p)


def workload(r: Reader, cfg: Config, base: Path, trace: str | Path | None) -> WorkloadSpec:
    name = r.str_("name")
    klass = r.str_("class", cfg.default_class)
    if cfg.workload_class(klass) is None:
        r.fail(f"unknown class {klass!r} (known: {', '.join(c.name for c in cfg.classes)})",
               "class")
    model = r.str_("model", cfg.models[0].name)
    if cfg.model(model) is None:
        r.fail(f"unknown model {model!r} (known: {', '.join(m.name for m in cfg.models)})",
               "model")
    arrival = _arrival(r.sub("arrival"), base, trace)
    if isinstance(arrival, Trace):
        for key in ("input_tokens", "output_tokens"):
            if r.has(key):
                r.fail("tokens come from the trace for trace arrivals; remove this field", key)
        input_tokens = parse_tokens(r, "input_tokens", 1)
        output_tokens = parse_tokens(r, "output_tokens", 1)
    else:
        input_tokens = parse_tokens(r, "input_tokens", None)
        output_tokens = parse_tokens(r, "output_tokens", None)
    wl = WorkloadSpec(
        name=name,
        klass=klass,
        model=model,
        stream=r.bool_("stream", True),
        arrival=arrival,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        max_tokens=_max_tokens(r, "max_tokens"),
        client=_client(r.sub("client")),
        workflow=_workflow(r.sub("workflow"), cfg) if r.has("workflow") else None,
        start=r.num("start_s", 0.0, lo=0),
        end=r.opt_num("end_s", gt=0),
    )
    r.raw("workflow")
    r.done()
    if wl.end is not None and wl.end <= wl.start:
        r.fail(f"must be > start_s ({wl.start:g})", "end_s")
    return wl


def _max_tokens(r: Reader, key: str) -> MaxTokens:
    v = r.raw(key)
    if v is None or v == "output":
        return v  # type: ignore[no-any-return]
    if isinstance(v, str):
        r.fail(f"must be a positive integer or 'output', got {v!r}", key)
    return r.int_(key, lo=1)


def _arrival(r: Reader, base: Path, trace: str | Path | None) -> Arrival:
    kind = r.choice("process", None, ("poisson", "onoff", "mmpp", "trace"))
    out: Arrival
    if kind == "poisson":
        changes: list[tuple[float, float]] = []
        for i, raw in enumerate(r.list_("rate_changes")):
            c = r.item("rate_changes", i, raw)
            changes.append((c.num("at_s", lo=0), c.num("rate_per_s", lo=0, hi=MAX_RATE_PER_S)))
            c.done()
            if len(changes) > 1 and changes[-1][0] <= changes[-2][0]:
                c.fail("at_s must increase from one change to the next", "at_s")
        shape = r.choice("interpolate", "step", ("step", "linear"))
        out = Poisson(r.num("rate_per_s", gt=0, hi=MAX_RATE_PER_S), tuple(changes),
                      linear=shape == "linear")
    elif kind == "onoff":
        out = OnOff(r.num("rate_on", gt=0, hi=MAX_RATE_PER_S),
                    r.num("rate_off", 0.0, lo=0, hi=MAX_RATE_PER_S), r.num("on_s", gt=0),
                    r.num("off_s", gt=0), r.num("phase_s", 0.0, lo=0))
    elif kind == "mmpp":
        states: list[tuple[float, float]] = []
        for i, raw in enumerate(r.list_("states", required=True)):
            s = r.item("states", i, raw)
            states.append((s.num("rate_per_s", lo=0, hi=MAX_RATE_PER_S), s.num("mean_s", gt=0)))
            s.done()
        if len(states) < 2:
            r.fail("needs at least two states", "states")
        out = Mmpp(tuple(states))
    else:
        where = r.where("path")
        path = Path(trace) if trace is not None else resolve(base, r.str_("path"))
        r.raw("path")
        out = Trace(path, r.num("speedup", 1.0, gt=0), r.num("offset_s", 0.0, lo=0), where)
    r.done()
    return out


def _client(r: Reader) -> ClientSpec:
    t = r.opt_num("timeout_ms", gt=0)
    retry_on = r.str_list("retry_on") if r.has("retry_on") else ("error", "timeout")
    for i, v in enumerate(retry_on):
        if v not in ("error", "timeout"):
            r.fail(f"must be 'error' or 'timeout', got {v!r}", f"retry_on[{i}]")
    ft = r.opt_num("first_token_timeout_ms", gt=0)
    c = ClientSpec(
        timeout=None if t is None else t / 1000.0,
        first_token_timeout=None if ft is None else ft / 1000.0,
        retries=r.int_("retries", 0, lo=0, hi=20),
        backoff=r.num("backoff_ms", 500.0, lo=0) / 1000.0,
        backoff_factor=r.num("backoff_factor", 2.0, lo=1),
        jitter=r.num("jitter", 0.2, lo=0, hi=1),
        retry_on=frozenset(retry_on),
        cancel_rate=r.num("cancel_rate", 0.0, lo=0, hi=1),
    )
    r.done()
    return c


def _workflow(r: Reader, cfg: Config) -> WorkflowSpec:
    deadline = r.num("deadline_ms", gt=0) / 1000.0
    steps: list[StepSpec] = []
    for i, raw in enumerate(r.list_("steps", required=True)):
        s = r.item("steps", i, raw)
        klass = s.opt_str("class")
        if klass is not None and cfg.workload_class(klass) is None:
            s.fail(f"unknown class {klass!r}", "class")
        stream = s.raw("stream")
        if stream is not None and not isinstance(stream, bool):
            s.fail(f"must be true or false, got {stream!r}", "stream")
        steps.append(StepSpec(
            name=s.str_("name", f"step{i}"),
            kind="optional" if s.choice("step", "critical", ("critical", "optional"))
            == "optional" else "critical",
            fanout=s.int_("fanout", 1, lo=1, hi=256),
            input_tokens=parse_tokens(s, "input_tokens", None) if s.has("input_tokens") else None,
            output_tokens=(parse_tokens(s, "output_tokens", None) if s.has("output_tokens")
                           else None),
            max_tokens=_max_tokens(s, "max_tokens"),
            min_budget=s.num("min_budget_ms", 0.0, lo=0) / 1000.0,
            klass=klass,
            stream=stream,
        ))
        s.raw("input_tokens")
        s.raw("output_tokens")
        s.done()
    if not steps:
        r.fail("must list at least one step", "steps")
    r.done()
    return WorkflowSpec(deadline, tuple(steps))
