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
  is removed from the caller's request at the listener too, so only that filter
  (``jwt_authn``, ``ext_authz``, ``lua``, placed before tailroute's) can set it.

With every hint the caller's (the default), all of this renders as before.
"""

from __future__ import annotations

from sidecar.core.config import Config
from sidecar.core.hints import HINT_HEADERS
from sidecar.shell import envoy_contract as ec


def _attr(header: str) -> str:
    return f"request.headers['{header}']"


def listener_removed(config: Config) -> tuple[str, ...]:
    """Headers removed from every request before routing and before any filter:
    tailroute's own (``x-tailroute-cluster``, ``-rid``), trusted headers set in this
    Envoy, and in native or hybrid mode the caller's hints that are not believed."""
    hints = config.hints
    out = [*ec.STRIPPED_HEADERS, *hints.strip_early()]
    if config.routing.mode != "extproc":
        out.extend(hints.not_from_client())
    return tuple(dict.fromkeys(out))


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

