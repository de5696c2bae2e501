"""/state shows a cluster ejected as a whole (its entry has no series of its own)."""

from __future__ import annotations

from sidecar.core.config_parse import parse_config
from sidecar.core.router import Router
from sidecar.core.types import Observation, SliceKey
from sidecar.ops.state import state_json
from tests.conftest import base_config_dict

SHORT = SliceKey("m", "interactive", "short", True)


def test_a_cluster_ejected_as_a_whole_shows_in_the_clusters_view() -> None:
    r = Router(parse_config(base_config_dict(), "t.yaml"))
    for i in range(5):
        r.observe(Observation("a", SHORT, "error", status=503), 100.0 + i * 0.1)
    view = state_json(r, 101.0)["clusters"]
    assert view["a"]["state"] == "quarantined"
    assert view["a"]["last_transition"]["to"] == "quarantined"
    assert view["b"]["state"] == "healthy" and view["b"]["last_transition"] is None
