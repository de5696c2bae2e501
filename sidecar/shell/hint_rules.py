"""What the rendered Envoy config does with a caller's hints under ``hints:``
(:mod:`sidecar.core.hints`), so Envoy and the sidecar believe the same ones.

* ``extproc`` mode: the sidecar reads every hint header it is sent and drops (and
  counts) those it does not believe; Envoy sends it the trusted headers as request
  attributes, and an ignored ``x-tailroute-deadline-ms`` or ``-explain`` no longer
  sends a request down the rich path (it is still sent as an attribute, to be counted).
* ``native`` and ``hybrid`` mode: Envoy itself acts on hints (the slice routes match
  the class, the hybrid matcher the per-request hints), so a caller's hints that are
  not believed are removed at the listener, before any filter runs (uncounted: the
  sidecar never sees them); the slice routes match the trusted class header.
* either mode: a trusted header that a filter of this Envoy sets (``set_by: envoy``)
  is removed from the caller's request at the listener too (the early header
  mutation, before any filter runs), so only a filter (``jwt_authn``, ``ext_authz``,
  ``lua``) can set it: before the first filter that reads it (:func:`first_reader`:
  ``tailroute.route``, or for the class in native and hybrid mode
  ``tailroute.class_to_metadata``, early in the chain).

With every hint the caller's (the default), all of this renders as before.
"""

from __future__ import annotations

import re
from typing import Any

from sidecar.core.config import Config
from sidecar.core.hints import HINT_HEADERS
from sidecar.shell import envoy_contract as ec
from sidecar.shell.native_keys import METADATA_NS

_TYPE = "type.googleapis.com/"
CLASS_KEY = "class"  # the class header's value in native mode's request metadata
CLASS_FILTER = "tailroute.class_to_metadata"


def _attr(header: str) -> str:
    return f"request.headers['{header}']"


def listener_removed(config: Config, early: bool = True) -> tuple[str, ...]:
    """Headers removed from every request: tailroute's own (``x-tailroute-cluster``,
    ``-rid``), in native or hybrid mode the caller's hints that are not believed, and
    (``early``: the connection manager's early header mutation, before any filter)
    the trusted headers a filter of this Envoy sets. The in-chain removal
    (``tailroute.strip_client_routing``, ``early=False``) leaves those alone, so the
    filter that sets one (``jwt_authn``, ``ext_authz``, ``lua``) may come before it
    or after it."""
    hints = config.hints
    out = [*ec.STRIPPED_HEADERS, *(hints.strip_early() if early else ())]
    if config.routing.mode != "extproc":
        out.extend(hints.not_from_client())
    return tuple(dict.fromkeys(out))


def first_reader(config: Config, hint: str) -> str | None:
    """The first filter of the rendered chain that reads ``hint``'s trusted header: the
    filter that sets it must come before this one. In native and hybrid mode the class
    is lifted into metadata by ``tailroute.class_to_metadata``, right after
    ``tailroute.strip_client_routing`` and well before ``tailroute.route`` (which native
    mode has not at all); None: nothing reads it (native mode routes by the class alone)."""
    mode = config.routing.mode
    if mode != "extproc" and hint == "class" and len(config.classes) > 1:
        return CLASS_FILTER
    return None if mode == "native" else ec.ROUTE_FILTER


def trusted_header_notes(config: Config) -> list[str]:
    """What ``check-config`` and ``envoy-config`` say of each header ``set_by: envoy``:
    the rendered bootstrap removes it and nothing in it sets it again; the filter that
    sets it must come before the first that reads it (:func:`first_reader`)."""
    notes = []
    for hint, s in config.hints.sources.items():
        if s.header is None or s.set_by != "envoy":
            continue
        reader = first_reader(config, hint)
        where = (f"before {reader}, or no request has a {hint}" if reader is not None
                 else f"(in {config.routing.mode} mode nothing in Envoy reads the {hint})")
        notes.append(f"{config.source}: hints.{hint}: read from {s.header}, which the "
                     "rendered Envoy removes from callers' requests; add the filter that "
                     f"sets it (jwt_authn claim_to_headers, ext_authz, lua) {where}")
    return notes


def attribute_exprs(config: Config) -> list[str]:
    """The one-message path's request attributes: the classifier's headers, the
    trusted headers, and the ignored rich-path hints (counted, not believed)."""
    hints = config.hints
    extra = [*hints.trusted(),
             *(h for h in hints.not_from_client() if h in ec.RICH_HEADERS)]
    return [*ec.ATTRIBUTE_HEADERS, *(_attr(h) for h in extra)]


def rich_headers(config: Config) -> tuple[str, ...]:
    """The headers that send a request down the rich path: the believed ones only."""
    ignored = set(config.hints.not_from_client())
    return tuple(h for h in ec.RICH_HEADERS if h not in ignored)


def class_header(config: Config) -> str:
    """The header Envoy's native slice routes and hybrid matcher read the class from:
    the trusted one, else the caller's (removed at the listener when ignored, so
    every request is then of the default class)."""
    return config.hints.source("class").header or HINT_HEADERS["class"]


def class_to_metadata_filter(config: Config) -> dict[str, Any]:
    """Native and hybrid mode: the class header's value into request metadata, where the
    slice routes match it (:func:`native_class_match`).

    Why not a header match at the router: Envoy's route header matcher (1.40) matches a
    header sent on several lines when any one line matches, so ``x-tailroute-class:
    interactive`` + ``x-tailroute-class: batch`` took the batch routes natively, where
    the per-request path (and the hybrid matcher, which joins the lines) read the list
    ``interactive,batch``: no class, the default class (README, "What the sidecar
    answers"). ``header_to_metadata`` joins the lines with ``,`` as they do."""
    return {
        "name": CLASS_FILTER,
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.header_to_metadata.v3.Config",
            "request_rules": [{"header": class_header(config), "on_header_present": {
                "metadata_namespace": METADATA_NS, "key": CLASS_KEY, "type": "STRING"}}],
        },
    }


def native_class_match(config: Config, klass: str) -> dict[str, Any] | None:
    """The class matcher of a slice route (request metadata, :func:`class_to_metadata_filter`).

    A non-default class: the value names it. The default class: the value is absent,
    empty or names none of the other classes -- one regex over the other names,
    inverted (an absent key matches no regex). ``None`` when the default class is the
    only one.
    """
    path = [{"key": CLASS_KEY}]
    if klass != config.default_class:
        return {"filter": METADATA_NS, "path": path, "value": {"string_match": {"exact": klass}}}
    others = [c.name for c in config.classes if c.name != config.default_class]
    if not others:
        return None
    regex = "|".join(re.escape(n) for n in others)
    return {"filter": METADATA_NS, "path": path, "invert": True,
            "value": {"string_match": {"safe_regex": {"regex": regex}}}}
