"""The ``hints:`` section: which of a caller's ``x-tailroute-*`` hints tailroute believes.

Any caller who reaches Envoy's listener can send ``x-tailroute-priority: 1000`` or
the latency-sensitive class, and admission, shedding and the retry budgets act on
what it claims. On a shared gateway the operator says, per hint:

* ``client`` (the default): the caller's header, as sent (screened as always);
* ``ignore``: the caller's header is not read; the hint is absent (the default
  class, the class's priority, no tenant, no deadline ...);
* ``{header: NAME}`` (class, priority and tenant only): the value comes from
  ``NAME``, a header set after authentication (a JWT claim copied by Envoy's
  ``jwt_authn`` ``claim_to_headers``, an ``ext_authz`` answer, a front proxy), and
  the caller's ``x-tailroute-*`` header is not read. ``set_by: envoy`` (the default):
  a filter of this Envoy sets it, so the rendered bootstrap removes a caller's
  ``NAME`` before any filter runs (early header mutation); ``set_by: front``: a
  proxy in front of Envoy sets it (and removes the caller's), left alone.

A caller's hint that is not read is counted (``tailroute_errors_total{kind=
"hint_ignored"}``, once per request) where the sidecar sees it. Pure: the shell
applies :func:`apply_hints` to the headers before they are classified, and the
bootstrap renderer reads the same object (``sidecar.shell.hint_rules``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from sidecar.core.fields import ConfigReader, shown

Trust = Literal["client", "ignore", "header"]
SetBy = Literal["envoy", "front"]

# Config key -> the caller's header (sidecar.core.classify reads these names).
HINT_HEADERS: Final[dict[str, str]] = {
    "class": "x-tailroute-class",
    "priority": "x-tailroute-priority",
    "tenant": "x-tailroute-tenant",
    "deadline_ms": "x-tailroute-deadline-ms",
    "step": "x-tailroute-step",
    "fanout": "x-tailroute-fanout",
    "explain": "x-tailroute-explain",
}
# Who the caller is decides these; the others describe one request of a workflow,
# which only the caller knows: those can be believed or ignored, not looked up.
FROM_HEADER: Final = ("class", "priority", "tenant")
# An HTTP field name (RFC 9110 token), lower case as Envoy hands it over.
_TOKEN: Final = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]{1,128}$")
# Headers that are not an authenticated identity, or that Envoy and tailroute own.
_RESERVED_PREFIXES: Final = ("x-tailroute-", "x-envoy-")
_RESERVED: Final = frozenset({"host", "content-length", "content-type", "x-request-id",
                              "x-stainless-retry-count", "transfer-encoding", "connection",
                              "te", "upgrade", "authorization", "cookie"})


@dataclass(frozen=True, slots=True)
class HintSource:
    trust: Trust = "client"
    header: str | None = None  # trust "header": where the value comes from (lower case)
    set_by: SetBy = "envoy"


CLIENT: Final = HintSource()


@dataclass(frozen=True, slots=True)
class HintsConfig:
    """Per hint (a key of :data:`HINT_HEADERS`), where its value comes from; a hint
    absent from ``sources`` is the caller's (``client``)."""

    sources: Mapping[str, HintSource] = field(default_factory=dict)
    # Derived once from ``sources``, as every request reads them (apply_hints, the
    # routing stream's header map): the caller's hint headers not read, and trusted
    # header -> the hint header it stands for.
    untrusted: frozenset[str] = field(init=False, compare=False, repr=False)
    trusted_map: Mapping[str, str] = field(init=False, compare=False, repr=False)
    trusted_names: frozenset[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        trusted = {s.header: HINT_HEADERS[h] for h, s in self.sources.items()
                   if s.trust == "header" and s.header is not None}
        object.__setattr__(self, "untrusted",
                           frozenset(HINT_HEADERS[h] for h in self.sources))
        object.__setattr__(self, "trusted_map", trusted)
        object.__setattr__(self, "trusted_names", frozenset(trusted))

    def source(self, hint: str) -> HintSource:
        return self.sources.get(hint, CLIENT)

    @property
    def all_client(self) -> bool:
        return not self.sources

    def not_from_client(self) -> tuple[str, ...]:
        """The caller's hint headers tailroute does not read, in :data:`HINT_HEADERS` order."""
        return tuple(HINT_HEADERS[h] for h in self.sources)

    def trusted(self) -> dict[str, str]:
        """Trusted header -> the hint header it stands for."""
        return dict(self.trusted_map)

    def strip_early(self) -> tuple[str, ...]:
        """Trusted headers a filter of this Envoy sets: a caller's copy is removed
        before any filter runs (``set_by: envoy``)."""
        return tuple(s.header for s in self.sources.values()
                     if s.trust == "header" and s.header is not None and s.set_by == "envoy")


def apply_hints(hints: HintsConfig, headers: Mapping[str, str],
                ) -> tuple[Mapping[str, str], bool]:
    """``(headers as classify should read them, whether a caller's hint was dropped)``:
    the caller's hints that are not believed removed, a trusted header's value put
    under the hint's own name (and the trusted header itself dropped)."""
    if hints.all_client:  # the default: nothing to drop or move, and no copy either
        return headers, False
    untrusted, trusted = hints.untrusted, hints.trusted_map
    out: dict[str, str] = {}
    dropped = False
    for name, value in headers.items():
        if name in untrusted:
            dropped = True
        elif name not in trusted:
            out[name] = value
    for name, hint_header in trusted.items():
        if (given := headers.get(name)) is not None:
            out[hint_header] = given
    return out, dropped


def _source(r: ConfigReader, hint: str) -> HintSource | None:
    """One hint's source, None for ``client``; a problem is recorded, the hint stays
    the caller's."""
    raw = r.raw(hint)
    if raw is None or raw == "client":
        return None
    if raw == "ignore":
        return HintSource("ignore")
    choices = ("client, ignore or {header: NAME}" if hint in FROM_HEADER
               else "client or ignore")
    if not isinstance(raw, Mapping) or hint not in FROM_HEADER:
        return r.bad(f"must be {choices}, got {shown(raw)}", hint, None)
    sub = r.sub(hint)
    name = sub.opt_str("header")
    set_by: SetBy = sub.choice("set_by", "envoy", ("envoy", "front"))
    sub.done()
    if name is None:
        return sub.bad("required field is missing (the header that carries the "
                       f"authenticated {hint})", "header", None)
    low = name.strip().lower()
    if not _TOKEN.match(low):
        return sub.bad(f"must be an HTTP header name, got {shown(name)}", "header", None)
    if low in _RESERVED or low.startswith(_RESERVED_PREFIXES) or low in HINT_HEADERS.values():
        return sub.bad(f"{low!r} is not a header that carries an identity (x-tailroute-* and "
                       "x-envoy-* are tailroute's and Envoy's, the rest say nothing about "
                       "the caller)", "header", None)
    return HintSource("header", low, set_by)


def parse_hints(r: ConfigReader) -> HintsConfig:
    sources: dict[str, HintSource] = {}
    owner: dict[str, str] = {}
    for hint in HINT_HEADERS:
        s = _source(r, hint)
        if s is None:
            continue
        if s.header is not None and s.header in owner:
            r.bad(f"header {s.header!r} already carries {owner[s.header]}: each hint needs "
                  "its own", hint, None)
            continue
        if s.header is not None:
            owner[s.header] = hint
        sources[hint] = s
    r.done()
    return HintsConfig(sources)
