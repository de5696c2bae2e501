"""What the shell reports of itself: the counters behind its metrics and the
access-log view of Envoy on the status page (/state ``envoy``). Read-only
functions of an :class:`~sidecar.shell.app.App`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.shell.app import App


def shell_counters(app: App) -> dict[str, int]:
    """Shell-side counters for metrics: ``error:<kind>``, ``failopen:<reason>``
    and ``envoy:<what>`` (the access-log view of Envoy)."""
    out = {f"error:{k}": v for k, v in app.errors.items()}
    # Requests the sidecar itself sent to the default route without a decision.
    for reason in ("body_too_large", "handler_exception", "stream_ended_before_body"):
        if app.errors[reason]:
            out[f"failopen:{reason}"] = app.errors[reason]
    for reason in ("unknown_model", "no_candidate"):
        n = app.router.counters[("decision", reason)]
        if reason == "unknown_model":
            # An oversize body is not parsed, so its decision reads "unknown model":
            # one request, already counted as body_too_large above.
            n = max(n - app.errors["body_too_large"], 0)
        if n:
            out[f"failopen:{reason}"] = n
    # Requests Envoy served without asking (sidecar down, slow or overflowing).
    if app.envoy["fail_open"]:
        out["failopen:envoy"] = app.envoy["fail_open"]
    # native/hybrid: LLM requests no slice route matched (sidecar.shell.native_log).
    if app.envoy["native_default"]:
        out["failopen:native_default"] = app.envoy["native_default"]
    out.update({f"envoy:{k}": v for k, v in app.envoy.items()})
    out.update({f"first_token:{k}": v for k, v in app.first_token_samples.items()})
    out.update({f"stream_error:{k}": v for k, v in app.stream_errors.items()})
    out.update({f"upstream_retry:{k}": v for k, v in app.upstream_retries.items()})
    out.update(app.retry_after.counters())
    if app.forwards.dropped:
        out["error:forward_dropped"] = app.forwards.dropped
    # Access-log entries the sink raised on (a sidecar bug): skipped, so not evidence;
    # a decided one then ends lost, a native one unseen but for this count.
    if app.envoy["log_entry_errors"]:
        out["error:access_log_entry"] = app.envoy["log_entry_errors"]
    out["outcome:lost"] = app.envoy["lost"]
    out["envoy:oldest_wait_ms"] = int(app.waiting.oldest_wait(app.last_tick) * 1000)
    return out


def access_log_status(app: App, now: float) -> str:
    """``silent``: finished requests wait longer than :meth:`App.silent_after_s` for their
    entries and no entry at all came for as long (outcomes are blind; a few requests
    whose entries never come — those of an Envoy that restarted — are ``lost``, not
    silence); ``no_stream``: no access-log stream is connected (Envoy opens it at its
    first flush with entries: normal before any traffic); ``ok``: entries flow."""
    quiet = app.silent_after_s()
    if app.waiting.oldest_wait(now) > quiet and (
            app.last_entry is None or now - app.last_entry > quiet):
        return "silent"
    return "ok" if app.envoy["log_streams_open"] > 0 else "no_stream"


def envoy_view(app: App, now: float) -> dict[str, object]:
    """The access-log view of Envoy for /state: whether entries flow, what it
    logged, how much of it tailroute decided, and the measured first-token offsets."""
    env = app.envoy
    llm = env["decided"] + env["fail_open"]
    return {
        "access_log": access_log_status(app, now),
        "log_streams_open": env["log_streams_open"],
        "oldest_wait_s": round(app.waiting.oldest_wait(now), 3),
        "entries": env["entries"],
        "decided": env["decided"],
        "fail_open": env["fail_open"],
        "unrouted": env["unrouted"],  # LLM requests Envoy answered before routing
        "misrouted": env["misrouted"],  # decided, but Envoy sent them to another cluster
        "not_routed": env["not_routed"],
        "orphan": env["orphan"],
        "elsewhere": env["elsewhere"],  # decided here, entry received by another process
        "native": env["native"],  # routed by Envoy's weights (routing.mode native/hybrid)
        "native_default": env["native_default"],  # native path, no slice route matched
        "decided_share": round(env["decided"] / llm, 6) if llm else None,
        "lost": env["lost"],
        "late": env["late"],
        "pending": len(app.pending),
        "awaiting_entry": len(app.waiting),
        "first_token_offsets": app.offsets.summary(),
        "first_token_samples": dict(app.first_token_samples),
        "stream_errors": dict(app.stream_errors),  # error events in 2xx streams
        "upstream_retries": dict(app.upstream_retries),  # Envoy's own retries
        "retry_after": app.retry_after.view(),  # 429s' and 503s' declared waits
    }
