"""``hints:``: which of a caller's x-tailroute-* hints tailroute believes (sidecar.core.hints),
read the same way by the sidecar and by the Envoy config rendered for it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import ConfigError, parse_config
from sidecar.core.hints import HINT_HEADERS, HintsConfig, HintSource, apply_hints
from sidecar.devtools.harness import envoy_binary
from sidecar.shell.app import App
from sidecar.shell.bootstrap import render_bootstrap, to_yaml
from sidecar.shell.bootstrap_native import render_for_mode, render_native_bootstrap
from sidecar.shell.extproc import RouteStream
from tests.conftest import base_config_dict
from tests.streamharness import POST_CHAT, body_msg, body_only_msg, chat_request, headers_msg

CLAIMS = {"x-tailroute-class": "batch", "x-tailroute-priority": "1000",
          "x-tailroute-tenant": "mallory", "x-tailroute-fanout": "8"}


def _config(hints: Any, **more: Any) -> Any:
    return parse_config(base_config_dict(hints=hints, **more), "t.yaml")


@pytest.mark.parametrize(("hints", "want"), [
    (None, {}),
    ({}, {}),
    ({"priority": "client", "class": "ignore"}, {"class": HintSource("ignore")}),
    ({"tenant": {"header": "X-Auth-Tenant"}},
     {"tenant": HintSource("header", "x-auth-tenant", "envoy")}),
    ({"class": {"header": "x-jwt-tier", "set_by": "front"}, "explain": "ignore"},
     {"class": HintSource("header", "x-jwt-tier", "front"), "explain": HintSource("ignore")}),
])
def test_valid_sections(hints: Any, want: dict[str, HintSource]) -> None:
    assert _config(hints).hints == HintsConfig(want)


@pytest.mark.parametrize(("hints", "problem"), [
    ({"priority": "trusted"}, "hints.priority: must be client, ignore or {header: NAME}"),
    ({"fanout": {"header": "x-fan"}}, "hints.fanout: must be client or ignore"),
    ({"tenant": {}}, "hints.tenant.header: required field is missing"),
    ({"tenant": {"header": "x auth"}}, "hints.tenant.header: must be an HTTP header name"),
    ({"class": {"header": "x-tailroute-tier"}}, "hints.class.header: 'x-tailroute-tier' is not"),
    ({"class": {"header": "x-envoy-original-path"}}, "hints.class.header: 'x-envoy-original"),
    ({"priority": {"header": "Authorization"}}, "hints.priority.header: 'authorization' is"),
    ({"class": {"header": "x-a", "set_by": "proxy"}}, "hints.class.set_by: must be one of"),
    ({"class": {"header": "x-a", "sets_by": "front"}}, "hints.class: unknown field(s): sets_by"),
    ({"class": {"header": "x-a"}, "tenant": {"header": "X-A"}},
     "hints.tenant: header 'x-a' already carries class"),
    ({"tennant": "ignore"}, "hints: unknown field(s): tennant (did you mean tenant?)"),
    ("ignore", "hints: expected a mapping"),
])
def test_mistakes_name_file_and_field(hints: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(hints)
    assert f"t.yaml: {problem}" in str(err.value)


def test_apply_hints_drops_untrusted_and_reads_trusted() -> None:
    hints = _config({"priority": "ignore", "class": {"header": "x-auth-class"}}).hints
    got, dropped = apply_hints(hints, {**CLAIMS, "x-auth-class": "agentic", "x-request-id": "r"})
    assert dropped
    assert got == {"x-tailroute-class": "agentic", "x-tailroute-tenant": "mallory",
                   "x-tailroute-fanout": "8", "x-request-id": "r"}
    # no trusted header: the hint is absent, never the caller's
    got, dropped = apply_hints(hints, {"x-tailroute-class": "batch"})
    assert dropped and got == {}
    assert apply_hints(hints, {"x-tailroute-tenant": "t"}) == ({"x-tailroute-tenant": "t"}, False)


@given(st.dictionaries(st.sampled_from([*HINT_HEADERS.values(), "x-request-id", "x-other"]),
                       st.text(max_size=8)))
def test_the_default_believes_every_hint(headers: dict[str, str]) -> None:
    assert apply_hints(HintsConfig(), headers) == (headers, False)


@pytest.mark.parametrize("path", ["one-message", "rich"])
def test_the_sidecar_ignores_counts_and_reads_the_trusted_header(path: str) -> None:
    """The caller claims batch, priority 1000 and a tenant; only the class a trusted
    header names counts, the tenant and fan-out stay the caller's (believed)."""
    app = App.create(_config({"priority": "ignore", "class": {"header": "x-auth-class"}}),
                     seed=1)
    headers = {**CLAIMS, "x-auth-class": "agentic"}
    s = RouteStream(app)
    if path == "rich":
        s.on_message(headers_msg({**POST_CHAT, **headers}), 0.0)
        s.on_message(body_msg(chat_request()), 0.0)
    else:
        msg = body_only_msg(chat_request(), headers)
        attrs = msg.attributes["envoy.filters.http.ext_proc"]
        attrs.fields["request.headers['x-auth-class']"].string_value = "agentic"
        s.on_message(msg, 0.0)
    assert s.info is not None
    assert (s.info.klass, s.info.priority, s.info.tenant, s.info.fanout) == (
        "agentic", 8, "mallory", 8)
    assert app.errors["hint_ignored"] == 1


def test_an_ignored_explain_is_not_honoured() -> None:
    app = App.create(_config({"explain": "ignore"}), seed=1)
    s = RouteStream(app)
    s.on_message(headers_msg({**POST_CHAT, "x-tailroute-explain": "1"}), 0.0)
    s.on_message(body_msg(chat_request()), 0.0)
    assert s.info is not None and not s.info.explain
    assert app.errors["hint_ignored"] == 1


_TWO_CLUSTERS = {"clusters": base_config_dict()["clusters"][:2],
                 "models": [{"name": "m", "candidates": ["a", "b"]}]}


def _hcm(boot: dict[str, Any]) -> dict[str, Any]:
    tc: dict[str, Any] = boot["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"][0]["typed_config"]
    return tc


def _early(boot: dict[str, Any]) -> list[str]:
    return [m["remove"] for m in _hcm(boot)["early_header_mutation_extensions"][0][
        "typed_config"]["mutations"]]


def _filter(boot: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((f for f in _hcm(boot)["http_filters"] if f["name"] == name), None)


def test_default_renders_as_before() -> None:
    boot = render_bootstrap(_config(None))
    assert boot == render_bootstrap(_config({"class": "client", "tenant": "client"}))
    assert _early(boot) == ["x-tailroute-cluster", "x-tailroute-rid"]


def test_extproc_render_sends_trusted_headers_and_skips_the_rich_path_for_ignored() -> None:
    cfg = _config({"class": {"header": "x-auth-class"}, "tenant": {"header": "x-auth-tenant",
                   "set_by": "front"}, "deadline_ms": "ignore", "explain": "ignore"})
    boot = render_bootstrap(cfg)
    # a caller's x-auth-class is gone before any filter: only Envoy's own may set it,
    # before or after tailroute.strip_client_routing, which leaves it alone
    assert _early(boot) == ["x-tailroute-cluster", "x-tailroute-rid", "x-auth-class"]
    strip = _filter(boot, "tailroute.strip_client_routing")
    assert strip is not None and [m["remove"] for m in strip["typed_config"]["mutations"][
        "request_mutations"]] == ["x-tailroute-cluster", "x-tailroute-rid"]
    route = _filter(boot, "tailroute.route")
    assert route is not None and _filter(boot, "tailroute.route_rich") is None
    attrs = route["typed_config"]["request_attributes"]
    for h in ("x-auth-class", "x-auth-tenant", "x-tailroute-deadline-ms",
              "x-tailroute-explain"):
        assert f"request.headers['{h}']" in attrs
    # the client's hints are still removed before the upstream
    hints = _filter(boot, "tailroute.strip_client_hints")
    assert hints is not None


def test_native_routes_match_the_trusted_class_and_drop_the_callers() -> None:
    cfg = _config({"class": {"header": "x-auth-class"}, "priority": "ignore"},
                  routing={"mode": "hybrid", "per_request_classes": ["batch"]},
                  **_TWO_CLUSTERS)
    boot = render_native_bootstrap(cfg)
    assert _early(boot) == ["x-tailroute-cluster", "x-tailroute-rid", "x-auth-class",
                            "x-tailroute-class", "x-tailroute-priority"]
    text = repr(boot)
    # the slice routes' class (request metadata) and the hybrid matcher read x-auth-class
    assert "'header': 'x-auth-class'" in text and "'header_name': 'x-auth-class'" in text
    removed = text.replace("'remove': 'x-tailroute-class'", "").replace(
        "\"request.headers['x-tailroute-class']\"", "")  # sent, but gone at the listener
    assert "x-tailroute-class" not in removed


@pytest.mark.parametrize(("hints", "more"), [
    ({"explain": "ignore"}, {}),  # one rich-path header left: a single predicate
    ({"explain": "ignore", "deadline_ms": "ignore", "tenant": {"header": "x-auth-tenant"}},
     {}),  # no rich path at all
    ({"class": {"header": "x-auth-class"}, "step": "ignore"},
     {"routing": {"mode": "hybrid", "per_request_classes": ["interactive"]}, **_TWO_CLUSTERS}),
    ({"class": "ignore"}, {"routing": {"mode": "native"}, **_TWO_CLUSTERS}),
])
def test_rendered_hint_rules_pass_envoy_validate(tmp_path: Path, hints: Any,
                                                 more: dict[str, Any]) -> None:
    boot = render_for_mode(_config(hints, **more))
    path = tmp_path / "envoy.yaml"
    path.write_text(to_yaml(boot))
    r = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.parametrize(("hint", "more"), [
    ("class", {}),
    ("class", {"routing": {"mode": "native"}, **_TWO_CLUSTERS}),
    ("class", {"routing": {"mode": "hybrid", "per_request_classes": ["batch"]},
               **_TWO_CLUSTERS}),
    ("tenant", {"routing": {"mode": "hybrid", "per_request_classes": ["batch"]},
                **_TWO_CLUSTERS}),
])
def test_the_note_names_the_first_filter_that_reads_the_trusted_header(
        hint: str, more: dict[str, Any]) -> None:
    # check-config / envoy-config tell where the filter that sets the header must go;
    # a filter placed where the note says must come before every filter reading it.
    from sidecar.shell.hint_rules import trusted_header_notes

    cfg = _config({hint: {"header": "x-auth-claim"}}, **more)
    (note,) = trusted_header_notes(cfg)
    chain = _hcm(render_for_mode(cfg))["http_filters"]
    names = [f["name"] for f in chain]
    named = note.split(" before ", 1)[1].split(",", 1)[0]
    assert named in names, (named, names)
    readers = [f["name"] for f in chain if "x-auth-claim" in repr(f)]
    assert readers and names.index(named) <= min(names.index(r) for r in readers), (
        named, readers)
