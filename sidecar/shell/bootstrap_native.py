"""Render the Envoy bootstrap for ``routing.mode: native`` and ``hybrid``.

Starts from the ext_proc bootstrap (:func:`sidecar.shell.bootstrap.render_bootstrap`:
listener, early and in-chain stripping of ``x-tailroute-cluster``, clusters, the
sidecar's gRPC cluster, the default route) and changes what picks the cluster:

* ``envoy.filters.http.json_to_metadata`` lifts ``model`` (string), ``stream``
  (bool, absent = false) and the output-token budget into dynamic metadata
  (namespace ``tailroute.request``). The budget is the first of
  ``max_completion_tokens``, ``max_tokens``, ``max_output_tokens`` that is
  present, else 256 -- as :func:`sidecar.core.classify.parse_body` reads it:
  later rules overwrite earlier ones, and a constant rule keyed on ``model``
  sets the default first.
* **One route per slice** (model x class x token profile x stream) matching that
  metadata, the LLM API paths and ``x-tailroute-class`` (lifted into the same
  namespace, its lines joined: ``sidecar.shell.hint_rules``). The default class's
  routes come first, for a header that is absent or names no other class (as
  the classifier reads it: unknown means the default class), so the common
  request -- one that sends no class -- is matched by the first routes Envoy
  tries instead of after every other class's.
  The token profile uses ``content-length`` as the input size (4 bytes per
  token, an upper bound for the prompt's characters) with a variant for
  requests without the header (input size unknown: profile by output budget).
  Each route's ``weighted_clusters`` lists the model's route candidates with
  equal static weights and ``runtime_key_prefix`` ``tailroute.w.<slice>``; the
  sidecar publishes the real weights as runtime keys over RTDS
  (:mod:`sidecar.shell.rtds`). Before the first publication, and after an
  Envoy restart while the sidecar is down, the static equal split applies.
  The class's ``slo.timeout_ms`` bounds an unstreamed answer (route timeout) and a
  stream's silences (route idle timeout, no total: its length is the client's).
* ``layered_runtime``: the RTDS layer ``tailroute_weights`` from the sidecar's
  gRPC cluster (a dropped stream keeps the last layer; reconnects with a short
  back-off), then an admin layer so an operator can override a weight with
  ``POST /runtime_modify`` (it then wins over the sidecar until removed).
* ``hybrid``: the ext_proc routing filter stays, wrapped in an
  ``ExtensionWithMatcher`` that skips it unless the request needs a
  per-request decision (``x-tailroute-deadline-ms``, ``x-tailroute-step``,
  ``x-tailroute-fanout``, ``x-tailroute-explain: 1``, or a class in
  ``routing.per_request_classes``);
  the header route that follows its decision comes first. If the sidecar is
  down those requests fail open onto the native slice routes.

Why RTDS, and the measurements behind it: docs/native-mode.md.
"""

from __future__ import annotations

from typing import Any

from sidecar.core.admission import stream_cap_s
from sidecar.core.classify import API_PATHS, CHARS_PER_TOKEN, DEFAULT_MAX_TOKENS, TOKEN_PROFILES
from sidecar.core.config import Config
from sidecar.core.types import SliceKey
from sidecar.core.weights import WEIGHT_SCALE, native_slices, route_candidates
from sidecar.shell import envoy_contract as ec
from sidecar.shell.bootstrap import render_bootstrap
from sidecar.shell.bootstrap_filters import BUFFER_FILTER, HINTS_FILTER, SIDECAR_CLUSTER
from sidecar.shell.hint_rules import class_header, class_to_metadata_filter, native_class_match
from sidecar.shell.native_keys import METADATA_NS, RUNTIME_LAYER, route_name, runtime_prefix

_TYPE = "type.googleapis.com/"
CLASS_HEADER = "x-tailroute-class"  # the caller's; hints: may name another (class_header)
# Headers that ask for a per-request decision in hybrid mode (value "1" for explain).
# A fan-out step is judged at a k-times stricter allowed share (fan-out aware quantiles):
# a per-request judgement a slice's weights (fan-out 1) cannot make.
PER_REQUEST_HEADERS = ("x-tailroute-deadline-ms", "x-tailroute-step", "x-tailroute-fanout")
EXPLAIN_REQUEST_HEADER = "x-tailroute-explain"
# Bodies json_to_metadata reads: application/json (case-insensitive, any parameters)
# or none at all, as the per-request path reads the body whatever the header says; other
# types (a multipart upload) are not buffered.
_JSON_TYPE_RE = r"(?i)application/json[ \t]*(;.*)?"
WEIGHTS_FETCH_TIMEOUT = "1s"
ACCESS_LOG_BUFFER_BYTES = 256 * 1024  # Envoy start-up waits at most this long for the first weights
_STRIP_FILTER = "tailroute.strip_client_routing"


def _rule(key: str, target: str, kind: str, missing: Any = None) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "selectors": [{"key": key}],
        "on_present": {"metadata_namespace": METADATA_NS, "key": target, "type": kind},
    }
    if missing is not None:
        rule["on_missing"] = {"metadata_namespace": METADATA_NS, "key": target, "value": missing}
    return rule


def json_to_metadata_filter() -> dict[str, Any]:
    """The body fields the slice routes match on (module docstring)."""
    budget = [_rule(k, "max_tokens", "NUMBER")
              for k in ("max_output_tokens", "max_tokens", "max_completion_tokens")]
    default_budget = {
        "selectors": [{"key": "model"}],
        "on_present": {"metadata_namespace": METADATA_NS, "key": "max_tokens",
                       "value": DEFAULT_MAX_TOKENS},
    }
    return {
        "name": "envoy.filters.http.json_to_metadata",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.json_to_metadata.v3.JsonToMetadata",
            "request_rules": {
                "rules": [
                    _rule("model", "model", "STRING"),
                    _rule("stream", "stream", "PROTOBUF_VALUE", missing=False),
                    default_budget,
                    *budget,
                ],
                "allow_content_types": ["application/json"],
                "allow_content_types_regex": {"regex": _JSON_TYPE_RE},
                "allow_empty_content_type": True,
            },
        },
    }


def _meta(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"filter": METADATA_NS, "path": [{"key": key}], "value": value}


def _profile_variants() -> list[tuple[str, float | None, int | None, bool]]:
    """(profile, max output tokens, max content-length bytes, needs the header), in match order."""
    out: list[tuple[str, float | None, int | None, bool]] = []
    for name, out_cap, in_cap in TOKEN_PROFILES:
        out.append((name, out_cap, in_cap * CHARS_PER_TOKEN, True))
        out.append((name, out_cap, None, False))  # no content-length: by output budget only
    out.append(("long", None, None, True))
    return out


def _path_regex() -> str:
    alts = "|".join(p.removeprefix("/") for p in API_PATHS)
    return f"/({alts})/?"


def slice_route(config: Config, s: SliceKey,
                common: dict[str, Any]) -> list[dict[str, Any]]:
    """The routes of one slice: one per content-length variant of its profile."""
    model = config.model(s.model)
    klass = config.workload_class(s.klass)
    assert model is not None and klass is not None
    cands = route_candidates(config, model)
    static = [{"name": c, "weight": max(WEIGHT_SCALE // len(cands), 1)} for c in cands]
    timeout = ec.duration(klass.slo.timeout_ms / 1000)
    # A stream's length is the client's max_tokens, not the provider's health: Envoy's
    # route timeout covers the whole response, so a steady answer longer than it was
    # cut mid-stream (200, no [DONE]) and read as a hard failure, and three such ejected
    # a healthy cluster. A streaming slice bounds only the silence (before the first
    # byte and between events) by the class timeout; an unstreamed answer is all silence.
    total = "0s" if s.streaming else timeout
    common = {**common, "timeout": total, "idle_timeout": timeout}
    if s.streaming:  # the safety net for a stream that never ends
        common["max_stream_duration"] = {"max_stream_duration": ec.duration(stream_cap_s(klass))}
    routes = []
    klass_match = native_class_match(config, s.klass)
    for profile, out_cap, in_bytes, with_length in _profile_variants():
        if profile != s.profile:
            continue
        headers: list[dict[str, Any]] = []
        if in_bytes is not None:
            headers.append({"name": "content-length",
                            "range_match": {"start": 0, "end": in_bytes + 1}})
        elif not with_length:
            headers.append({"name": "content-length", "present_match": True,
                            "invert_match": True})
        meta = [_meta("model", {"string_match": {"exact": s.model}}),
                _meta("stream", {"bool_match": bool(s.streaming)}),
                *([] if klass_match is None else [klass_match])]
        if out_cap is not None:
            meta.append(_meta("max_tokens", {"double_match": {
                "range": {"start": 0, "end": out_cap + 1}}}))
        variant = "any" if with_length and in_bytes is None else (
            "len" if with_length else "nolen")
        route: dict[str, Any] = {
            "name": route_name(s, variant),
            "match": {"safe_regex": {"regex": _path_regex()}, "dynamic_metadata": meta},
            "route": {
                "weighted_clusters": {"runtime_key_prefix": runtime_prefix(s),
                                      "clusters": static},
                **common,
            },
        }
        if headers:
            route["match"]["headers"] = headers
        routes.append(route)
    return routes


def native_routes(config: Config, common: dict[str, Any],
                  extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Every slice route, the default class's first per model (their class matcher
    excludes the other classes, so the order only decides how soon Envoy finds
    the common request's route)."""
    slices = native_slices(config)
    out: list[dict[str, Any]] = []
    for model in config.models:
        mine = [s for s in slices if s.model == model.name]
        ordered = ([s for s in mine if s.klass == config.default_class]
                   + [s for s in mine if s.klass != config.default_class])
        for s in ordered:
            for r in slice_route(config, s, common):
                out.append({**r, **extra})
    return out


def route_slices(config: Config) -> dict[str, SliceKey]:
    """Route name -> slice, for reading the access log's ``route_name``."""
    out: dict[str, SliceKey] = {}
    for s in native_slices(config):
        for variant in ("len", "nolen", "any"):
            out[route_name(s, variant)] = s
    return out


def _header_is(name: str, match: dict[str, Any]) -> dict[str, Any]:
    return {"single_predicate": {
        "input": {"name": name, "typed_config": {
            "@type": _TYPE + "envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
            "header_name": name}},
        "value_match": match,
    }}


def per_request_predicate(config: Config) -> dict[str, Any]:
    """Matcher predicate: this request needs a per-request decision (hybrid)."""
    preds = [_header_is(h, {"safe_regex": {"google_re2": {}, "regex": ".*"}})
             for h in PER_REQUEST_HEADERS]
    preds.append(_header_is(EXPLAIN_REQUEST_HEADER, {"exact": "1"}))
    per_class = set(config.routing.per_request_classes)
    klass = class_header(config)
    for name in sorted(per_class):
        preds.append(_header_is(klass, {"exact": name}))
    if config.default_class in per_class:
        # Unknown or absent class header means the default class: per-request
        # unless the header names a known class that is not per-request.
        others = [c.name for c in config.classes if c.name not in per_class]
        known_other = {"or_matcher": {"predicate": [
            _header_is(klass, {"exact": n}) for n in others]}} if len(others) > 1 else (
            _header_is(klass, {"exact": others[0]}) if others else None)
        if known_other is not None:
            preds.append({"not_matcher": known_other})
        else:
            return {"single_predicate": {"input": {"name": "any", "typed_config": {
                "@type": _TYPE + "envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                "header_name": ":path"}}, "value_match": {"prefix": "/"}}}
    return {"or_matcher": {"predicate": preds}}


_MATCHED = _TYPE + "envoy.extensions.common.matching.v3.ExtensionWithMatcher"
_SKIP = _TYPE + "envoy.extensions.filters.common.matcher.action.v3.SkipFilter"


def _only_per_request(config: Config, flt: dict[str, Any]) -> dict[str, Any]:
    """Skip ``flt`` unless the request needs a per-request decision.

    A filter that is already an ``ExtensionWithMatcher`` with one skip rule keeps
    it: it is then skipped when its own rule matches *or* the request is native.
    """
    native = {"not_matcher": per_request_predicate(config)}
    tc = flt["typed_config"]
    if tc.get("@type") == _MATCHED:
        matchers = tc["xds_matcher"]["matcher_list"]["matchers"]
        if len(matchers) != 1 or matchers[0]["on_match"]["action"]["typed_config"].get(
                "@type") != _SKIP:
            raise RuntimeError(f"cannot combine the matcher of filter {flt['name']!r}")
        own = matchers[0]["predicate"]
        matchers[0] = {**matchers[0], "predicate": {"or_matcher": {"predicate": [own, native]}}}
        return flt
    skip = {"name": "skip", "typed_config": {"@type": _SKIP}}
    return {
        "name": flt["name"],
        "typed_config": {
            "@type": _MATCHED,
            "extension_config": flt,
            "xds_matcher": {"matcher_list": {"matchers": [{
                "predicate": native, "on_match": {"action": skip},
            }]}},
        },
    }


def _runtime_layers() -> dict[str, Any]:
    source = {
        "api_type": "GRPC",
        "transport_api_version": "V3",
        "grpc_services": [{"envoy_grpc": {
            "cluster_name": SIDECAR_CLUSTER,
            # Envoy's default re-connect back-off is 1 s growing to 10 s; weights
            # should come back within a window of the sidecar's return.
            "retry_policy": {"retry_back_off": {"base_interval": "0.25s",
                                                "max_interval": "2s"}},
        }}],
    }
    return {"layers": [
        {"name": RUNTIME_LAYER, "rtds_layer": {"name": RUNTIME_LAYER, "rtds_config": {
            "resource_api_version": "V3", "initial_fetch_timeout": WEIGHTS_FETCH_TIMEOUT,
            "api_config_source": source}}},
        {"name": "operator_overrides", "admin_layer": {}},
    ]}


def _hcm(boot: dict[str, Any]) -> dict[str, Any]:
    try:
        hcm: dict[str, Any] = (
            boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"])
    except (KeyError, IndexError) as exc:
        raise RuntimeError(f"unexpected ext_proc bootstrap layout: {exc!r}") from exc
    return hcm


_EXT_PROC_FILTERS = (ec.ROUTE_FILTER, ec.RICH_FILTER, ec.OBSERVE_FILTER)


def render_native_bootstrap(
    config: Config,
    grpc_target: str | None = None,
    unix_socket: str | None = None,
    listen: str | None = None,
    admin: str | None = None,
) -> dict[str, Any]:
    """The native or hybrid bootstrap (``config.routing.mode``), as a plain mapping."""
    mode = config.routing.mode
    if mode == "extproc":
        raise ValueError("routing.mode is extproc: use sidecar.shell.bootstrap.render_bootstrap")
    boot = render_bootstrap(config, grpc_target=grpc_target, unix_socket=unix_socket,
                            listen=listen, admin=admin)
    hcm = _hcm(boot)
    filters: list[dict[str, Any]] = []
    for f in hcm["http_filters"]:
        if f["name"] == HINTS_FILTER:
            continue  # the slice routes match x-tailroute-class at the router
        if f["name"] in _EXT_PROC_FILTERS and mode == "native":
            continue  # native: no ext_proc at all
        if f["name"] == BUFFER_FILTER and mode == "native":
            # json_to_metadata already holds the request until its body is complete
            # (and answers 413 past the buffer limit), so the route is matched on
            # the body's metadata without it; only ext_proc's one-message path
            # (hybrid) needs the buffer. Saves Envoy ~7 us per request.
            continue
        if f["name"] == ec.ROUTE_FILTER:
            # hybrid: the one-message path only for requests that need a decision
            # (the rich path already runs only for deadline / explain requests).
            f = _only_per_request(config, f)
        filters.append(f)
        if f["name"] == _STRIP_FILTER:
            if len(config.classes) > 1:  # one class: no route matches a class
                filters.append(class_to_metadata_filter(config))
            filters.append(json_to_metadata_filter())
    hcm["http_filters"] = filters
    vhost = hcm["route_config"]["virtual_hosts"][0]
    decided = [r for r in vhost["routes"] if r["name"] != ec.DEFAULT_ROUTE]
    default = next(r for r in vhost["routes"] if r["name"] == ec.DEFAULT_ROUTE)
    if mode == "native":
        default.pop("typed_per_filter_config", None)  # no observing filter to configure
    extra = {k: v for k, v in default.items() if k not in ("name", "match", "route")}
    routes = native_routes(config, {}, extra)
    vhost["routes"] = [*(decided if mode == "hybrid" else []), *routes, default]
    for entry in hcm.get("access_log", []):
        # Every native request is learned from its log entry: larger batches cost the
        # sidecar less per entry (Envoy's default flushes at 16 KiB, ~25 entries), and
        # one tag carries what the common entry's reading needs (envoy_contract.TAG_ENTRY).
        common = entry["typed_config"]["common_config"]
        common["buffer_size_bytes"] = ACCESS_LOG_BUFFER_BYTES
        common["custom_tags"] = [{"tag": ec.TAG_ENTRY, "value": ec.ENTRY_TAG_FORMAT}]
    boot["layered_runtime"] = _runtime_layers()
    boot.setdefault("node", {"id": "tailroute-envoy", "cluster": "tailroute"})
    return boot


def render_for_mode(config: Config, **kw: Any) -> dict[str, Any]:
    """The bootstrap for the config's routing mode (ext_proc, native or hybrid);
    ``with_sidecar=False`` is Envoy alone (the benchmarks' baseline) in every mode."""
    if config.routing.mode == "extproc" or not kw.get("with_sidecar", True):
        return render_bootstrap(config, **kw)
    kw.pop("with_sidecar", None)
    return render_native_bootstrap(config, **kw)


__all__ = ["render_for_mode", "render_native_bootstrap", "route_slices"]
