"""What a reloaded config would change in the Envoy bootstrap rendered from it.

Envoy routes a decided request by the route named after the decision
(``<cluster>|<class>|<n|s>``) in the bootstrap it was started with; the sidecar
cannot change that bootstrap. So a hot reload that adds or removes a cluster or
a class, or moves a class timeout or the default route, would make the two
disagree: Envoy would send such requests down its default route while the
sidecar counts them against the cluster it chose. Those reloads are refused
(:class:`~sidecar.ops.reload.ConfigReloader`): re-render the bootstrap with
``tailroute envoy-config``, then restart Envoy and tailroute.

Other bootstrap differences (a cluster's address, TLS or circuit breaker, buffer
sizes, the decision timeout) leave every decision routable: the reload applies,
with a warning that Envoy keeps its old settings until it is re-rendered.

Both bootstraps are rendered with the same fixed addresses for the sidecar, the
listener and the admin, which are restart-only settings of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sidecar.core.config import Config
from sidecar.shell.bootstrap_native import render_for_mode

_FIXED = {"grpc_target": "127.0.0.1:1", "listen": "127.0.0.1:2", "admin": "127.0.0.1:3"}


def _routes(node: Any) -> Iterator[tuple[str, str]]:
    """``(name, what the route does)`` for every named route in a bootstrap."""
    if isinstance(node, dict):
        action = node.get("route")
        if isinstance(node.get("name"), str) and isinstance(action, dict):
            yield node["name"], json.dumps(action, sort_keys=True)
        for value in node.values():
            yield from _routes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _routes(value)


def _clusters(boot: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: json.dumps(c, sort_keys=True)
            for c in boot.get("static_resources", {}).get("clusters", [])}


def _names(names: set[str], limit: int = 4) -> str:
    shown = sorted(names)
    more = f" and {len(shown) - limit} more" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


def envoy_drift(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """``(blocking, advisory)``: how the bootstrap rendered from ``new`` differs from
    the one rendered from ``old`` (module docstring); empty lists when it does not."""
    a, b = render_for_mode(old, **_FIXED), render_for_mode(new, **_FIXED)
    if a == b:
        return [], []
    ra, rb = dict(_routes(a)), dict(_routes(b))
    blocking = []
    if added := set(rb) - set(ra):
        blocking.append(f"routes added: {_names(added)}")
    if removed := set(ra) - set(rb):
        blocking.append(f"routes removed: {_names(removed)}")
    if changed := {n for n in set(ra) & set(rb) if ra[n] != rb[n]}:
        blocking.append(f"routes changed (cluster or timeout): {_names(changed)}")
    if unguarded := set(new.hints.strip_early()) - set(old.hints.strip_early()):
        # The running Envoy lets a caller's copy of that header through: the sidecar
        # would believe a forged class, priority or tenant until Envoy is re-rendered.
        blocking.append(f"hints would trust {_names(unguarded)}, which the running Envoy "
                        "does not remove from callers")
    ca, cb = _clusters(a), _clusters(b)
    advisory = []
    if moved := {n for n in set(ca) & set(cb) if ca[n] != cb[n]}:
        advisory.append(f"clusters changed (address, TLS or circuit breaker): {_names(moved)}")
    if set(ca) != set(cb) and not blocking:
        blocking.append(f"clusters added or removed: {_names(set(ca) ^ set(cb))}")
    rest_a = {k: v for k, v in a.items() if k != "static_resources"}
    rest_b = {k: v for k, v in b.items() if k != "static_resources"}
    if not blocking and not advisory and (
            rest_a != rest_b or a["static_resources"].get("listeners")
            != b["static_resources"].get("listeners")):
        advisory.append("listener or runtime settings (buffers, timeouts, access log, the "
                        "headers hints: reads or removes)")
    return blocking, advisory
