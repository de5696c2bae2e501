"""/state: a cluster ejected as a whole (its entry has no series of its own), and each
route's share of its slice's requests."""

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


def test_each_route_shows_its_share_of_the_slices_requests() -> None:
    """A route can stay healthy at weight 1 while the scores send its traffic elsewhere;
    the share says so. Shares add up to 1 per slice; a slice without requests has none."""
    r = Router(parse_config(base_config_dict(), "t.yaml"))
    for i in range(30):
        cluster = "a" if i % 3 else "b"  # a: 20, b: 10
        r.observe(Observation(cluster, SHORT, "ok", 200, 0.2, 0.02, 1.0, 50), 100.0 + i)
    routes = [x for x in state_json(r, 130.0)["routes"] if x["narrow"]]
    share = {x["cluster"]: x["share"] for x in routes if x["slice"] == SHORT.label()}
    assert share["a"] == round(20 / 30, 4) and share["b"] == round(10 / 30, 4)
    assert all(x["state"] == "healthy" for x in routes)
