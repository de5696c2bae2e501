"""Load and validate a scenario YAML file into a :class:`~sidecar.sim.scenario.Scenario`.

Every error names the file and the field path (see :mod:`sidecar.sim.validate`).
The embedded tailroute config is validated by the core's own
:func:`~sidecar.core.config.parse_config`, its errors re-rooted under ``config.``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from sidecar.core.config import Config, ConfigError, parse_config
from sidecar.ops.config_file import read_yaml
from sidecar.sim import bounds
from sidecar.sim.loader_dists import parse_errors, parse_latency_ms
from sidecar.sim.loader_workloads import resolve, workload
from sidecar.sim.replica_spec import parse_replicas
from sidecar.sim.scenario import EventSpec, ProviderSpec, Scenario, SliceMatch, WorkloadSpec
from sidecar.sim.validate import Reader, ScenarioError

PROFILES: Final = ("short", "medium", "long")
_CFG_TOKEN: Final = "\x00tailroute-config"


def load_scenario(
    path: str | Path,
    *,
    duration: float | None = None,
    seed: int | None = None,
    trace: str | Path | None = None,
) -> Scenario:
    """Read ``path``; ``duration``/``seed``/``trace`` override the file (CLI, tests)."""
    p = Path(path)
    data = read_yaml(p, "scenario", ScenarioError, max_bytes=bounds.MAX_FILE_BYTES)
    return parse_scenario(data, str(p), base=p.parent, duration=duration, seed=seed, trace=trace)


def parse_scenario(
    data: Any,
    source: str,
    *,
    base: Path | None = None,
    duration: float | None = None,
    seed: int | None = None,
    trace: str | Path | None = None,
) -> Scenario:
    """Validate a parsed YAML mapping. ``base`` resolves relative paths."""
    from sidecar.sim.policies import POLICY_NAMES  # late: policies import the engine types

    base = base or Path(".")
    root = Reader(data, source, "")
    cfg = _config(root, base)
    name = root.str_("name", Path(source).stem)
    dur = root.num("duration_s", lo=1, hi=bounds.MAX_DURATION_S)
    if duration is not None:
        dur = _duration_override(root, duration)
    warm = root.num("warmup_s", 0.0, lo=0)
    if duration is not None:
        warm = min(warm, dur * 0.2)
    if warm >= dur:
        root.fail(f"must be < duration_s ({dur:g}), got {warm:g}", "warmup_s")
    providers = _providers(root, cfg)
    events = tuple(
        _event(root.item("events", i, raw), cfg, providers)
        for i, raw in enumerate(root.list_("events"))
    )
    workloads: list[WorkloadSpec] = []
    for i, raw in enumerate(root.list_("workloads", required=True)):
        wl = workload(root.item("workloads", i, raw), cfg, base, trace)
        if any(w.name == wl.name for w in workloads):
            root.fail(f"duplicate workload name {wl.name!r}", f"workloads[{i}].name")
        workloads.append(wl)
    if not workloads:
        root.fail("must define at least one workload", "workloads")
    policies = root.str_list("policies")
    for i, pol in enumerate(policies):
        if pol not in POLICY_NAMES:
            root.fail(f"unknown policy {pol!r} (known: {', '.join(POLICY_NAMES)})",
                      f"policies[{i}]")
    drain = root.num("drain_s", _default_drain(cfg), lo=0, hi=bounds.MAX_DRAIN_S)
    bucket = root.num("bucket_s", 10.0, gt=0)
    _check_size(root, dur, drain, bucket, events, workloads)
    sc = Scenario(
        name=name,
        description=root.str_("description", ""),
        source=source,
        seed=root.int_("seed", 1, lo=0) if seed is None else _override(root, "seed", seed),
        duration=dur,
        warmup=warm,
        bucket=bucket,
        drain=drain,
        config=cfg,
        providers=providers,
        events=events,
        workloads=tuple(workloads),
        policies=policies,
        tags=root.str_list("tags"),
        replicas=parse_replicas(root),
    )
    root.done()
    return sc


def _duration_override(root: Reader, duration: float) -> float:
    """``--duration``: the file's own duration_s bounds, checked here for every caller."""
    d = float(duration)
    if not 0.0 < d <= bounds.MAX_DURATION_S:  # NaN fails too
        raise ScenarioError(f"{root.source}: --duration: must be a number of seconds above 0 "
                            f"and at most {bounds.MAX_DURATION_S:g}, got {duration!r}")
    return d


def _check_size(root: Reader, dur: float, drain: float, bucket: float,
                events: tuple[EventSpec, ...], workloads: list[WorkloadSpec]) -> None:
    """The run's size within :mod:`sidecar.sim.bounds`: time buckets, event windows and
    expected requests (before anything is allocated or simulated)."""
    horizon = dur + drain
    n_buckets = math.ceil(horizon / bucket)
    if n_buckets > bounds.MAX_BUCKETS:
        root.fail(f"too small for duration_s + drain_s = {horizon:g} s: {n_buckets:,} time "
                  f"buckets, more than {bounds.MAX_BUCKETS:,} (use bucket_s >= "
                  f"{horizon / bounds.MAX_BUCKETS:.3g})", "bucket_s")
    for i, ev in enumerate(events):
        if ev.every is None or ev.at >= horizon:
            continue
        n = min(ev.count, math.ceil((horizon - ev.at) / ev.every))
        if n > bounds.MAX_EVENT_WINDOWS:
            root.fail(f"{n:,} windows within duration_s + drain_s = {horizon:g} s, more than "
                      f"{bounds.MAX_EVENT_WINDOWS:,} (raise every_s or set count)",
                      f"events[{i}].repeat")
    problem = bounds.calls_problem(workloads, dur)
    if problem is not None:
        root.fail(problem, "workloads")


# ---------------------------------------------------------------- config


def _config(root: Reader, base: Path) -> Config:
    has_inline, has_file = root.has("config"), root.has("config_file")
    if has_inline == has_file:
        root.fail("give exactly one of 'config' (inline tailroute config) or 'config_file'")
    if has_file:
        path = resolve(base, root.str_("config_file"))
        return parse_config(read_yaml(path, max_bytes=bounds.MAX_FILE_BYTES), str(path))
    try:
        return parse_config(root.raw("config"), _CFG_TOKEN)
    except ConfigError as exc:
        msg = str(exc)
        prefix = f"{_CFG_TOKEN}: "
        if msg.startswith(prefix):
            rest = msg[len(prefix):]
            if rest.startswith("<root>"):
                rest = "config" + rest[len("<root>"):]
            else:
                rest = "config." + rest
            raise ScenarioError(f"{root.source}: {rest}") from None
        raise


def _override(root: Reader, key: str, value: int) -> int:
    """An override from the command line; the file's value is still validated."""
    root.int_(key, 1, lo=0)
    return int(value)


def _default_drain(cfg: Config) -> float:
    """Long enough for the slowest class's timeout to fire after the last arrival."""
    return max(c.slo.timeout_ms for c in cfg.classes) / 1000.0 + 30.0


# ---------------------------------------------------------------- providers


def _providers(root: Reader, cfg: Config) -> dict[str, ProviderSpec]:
    raw = root.mapping("providers", required=True)
    out: dict[str, ProviderSpec] = {}
    for name in raw:
        if not cfg.has_cluster(str(name)):
            root.fail(f"unknown cluster {name!r} (config clusters: "
                      f"{', '.join(cfg.cluster_names)})", f"providers.{name}")
    for cluster in cfg.clusters:
        if cluster.name not in raw:
            root.fail(f"missing provider for cluster {cluster.name!r}", "providers")
        r = Reader(raw[cluster.name], root.source, f"providers.{cluster.name}")
        cap = r.int_("capacity", cluster.max_concurrency, lo=1)
        out[cluster.name] = ProviderSpec(
            name=cluster.name,
            capacity=cap,
            queue_limit=r.int_("queue_limit", 256, lo=0),
            contention=r.num("contention", 0.3, lo=0, hi=100),
            ttft=parse_latency_ms(r, "ttft_ms", None),
            prefill_per_1k=r.num("prefill_ms_per_1k", 0.0, lo=0) / 1000.0,
            tpot=parse_latency_ms(r, "tpot_ms", None),
            error_rate=r.num("error_rate", 0.0, lo=0, hi=1),
            error_status=r.int_("error_status", 503, lo=400, hi=599),
            error_after=r.num("error_after_ms", 50.0, lo=0) / 1000.0,
            stall_rate=r.num("stall_rate", 0.0, lo=0, hi=1),
            keeps_working_on_cancel=r.bool_("keeps_working_on_cancel", False),
            cost_per_1k_tokens=cluster.cost_per_1k_tokens,
            errors=parse_errors(r),
        )
        r.done()
        spec = out[cluster.name]
        if spec.error_rate + sum(e.rate for e in spec.errors) > 1.0 + 1e-9:
            r.fail("error_rate plus the rates of errors add up to more than 1", "errors")
    return out


def _event(r: Reader, cfg: Config, providers: Mapping[str, ProviderSpec]) -> EventSpec:
    prov = r.str_("provider")
    if prov not in providers:
        r.fail(f"unknown provider {prov!r} (known: {', '.join(providers)})", "provider")
    every: float | None = None
    count = 1
    if r.has("repeat"):
        rr = r.sub("repeat")
        every = rr.num("every_s", gt=0)
        count = rr.int_("count", 1_000_000, lo=1)
        rr.done()
    match = _match(r.sub("match"), cfg) if r.has("match") else None
    r.raw("match")
    ev = EventSpec(
        provider=prov,
        at=r.num("at_s", lo=0),
        duration=r.opt_num("duration_s", gt=0),
        every=every,
        count=count,
        match=match,
        ttft_factor=r.num("ttft_factor", 1.0, gt=0),
        tpot_factor=r.num("tpot_factor", 1.0, gt=0),
        error_rate=r.opt_num("error_rate", lo=0, hi=1),
        stall_rate=r.opt_num("stall_rate", lo=0, hi=1),
        tail_rate=r.num("tail_rate", 0.0, lo=0, hi=1),
        tail_ttft_factor=r.num("tail_ttft_factor", 1.0, gt=0),
        tail_tpot_factor=r.num("tail_tpot_factor", 1.0, gt=0),
        outage=r.bool_("outage", False),
        capacity=r.opt_int("capacity", lo=0),
        label=r.str_("label", ""),
        errors=parse_errors(r),
        ramp_in=r.num("ramp_s", 0.0, lo=0),
        ramp_out=r.num("ramp_out_s", 0.0, lo=0),
    )
    r.done()
    _check_ramps(r, ev)
    if every is not None and (ev.duration is None or ev.duration >= every):
        r.fail("a repeating event needs duration_s < repeat.every_s", "duration_s")
    if match is not None and ev.capacity is not None:
        r.fail("capacity changes apply to the whole provider; remove 'match'", "capacity")
    tail = ev.tail_rate > 0 and (ev.tail_ttft_factor != 1.0 or ev.tail_tpot_factor != 1.0)
    if (ev.ttft_factor == 1.0 and ev.tpot_factor == 1.0 and ev.error_rate is None
            and ev.stall_rate is None and not ev.outage and ev.capacity is None and not tail
            and not ev.errors):
        r.fail("event changes nothing (set ttft_factor, tpot_factor, tail_rate with a "
               "tail factor, error_rate, errors, stall_rate, outage or capacity)")
    return ev


def _check_ramps(r: Reader, ev: EventSpec) -> None:
    """Ramps shape gradual changes; a capacity change or an outage is a step."""
    if not (ev.ramp_in or ev.ramp_out):
        return
    key = "ramp_s" if ev.ramp_in else "ramp_out_s"
    if ev.capacity is not None or ev.outage:
        r.fail("capacity changes and outages are steps; remove the ramp (model a gradual "
               "failure with a ramped error_rate)", key)
    if ev.ramp_out and ev.duration is None:
        r.fail("needs duration_s (a window that never ends never fades out)", "ramp_out_s")
    if ev.duration is not None and ev.ramp_in + ev.ramp_out > ev.duration:
        r.fail(f"ramp_s + ramp_out_s ({ev.ramp_in + ev.ramp_out:g}) must be <= duration_s "
               f"({ev.duration:g})", key)


def _match(r: Reader, cfg: Config) -> SliceMatch:
    klass = r.opt_str("class")
    if klass is not None and cfg.workload_class(klass) is None:
        r.fail(f"unknown class {klass!r}", "class")
    model = r.opt_str("model")
    if model is not None and cfg.model(model) is None:
        r.fail(f"unknown model {model!r}", "model")
    profile = r.opt_str("profile")
    if profile is not None and profile not in PROFILES:
        r.fail(f"must be one of {', '.join(PROFILES)}; got {profile!r}", "profile")
    stream_raw = r.raw("stream")
    if stream_raw is not None and not isinstance(stream_raw, bool):
        r.fail(f"must be true or false, got {stream_raw!r}", "stream")
    m = SliceMatch(
        klass=klass,
        model=model,
        stream=stream_raw,
        profile=profile,
        min_input_tokens=r.int_("min_input_tokens", 0, lo=0),
        min_output_tokens=r.int_("min_output_tokens", 0, lo=0),
    )
    r.done()
    return m
