from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from sidecar.core.config import ConfigError, parse_config
from tests.conftest import base_config_dict


def test_semantic_router_fragment_accepted_verbatim() -> None:
    data = base_config_dict()
    data["models"][0]["algorithm"] = {
        "type": "latency_aware",
        "latency_aware": {"tpot_percentile": 90, "ttft_percentile": 95, "description": "x"},
    }
    cfg = parse_config(data, "f.yaml")
    m = cfg.model("m")
    assert m is not None
    assert (m.latency_aware.ttft_percentile, m.latency_aware.tpot_percentile) == (95, 90)


def test_global_algorithm_applies_to_models() -> None:
    data = base_config_dict(
        algorithm={"type": "latency_aware", "latency_aware": {"ttft_percentile": 50}}
    )
    m = parse_config(data, "f.yaml").model("m")
    assert m is not None and m.latency_aware.ttft_percentile == 50
    assert m.latency_aware.tpot_percentile is None


def _with(path: str, value: Any) -> dict[str, Any]:
    data = base_config_dict()
    keys = path.split(".")
    target: Any = data
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]
    last = keys[-1]
    target[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "expect"),
    [
        ("clusters.0.max_concurrency", 0, "clusters[0].max_concurrency: must be >= 1"),
        ("clusters.1.address", "nope", "clusters[1].address: must be host:port"),
        ("clusters.0.colour", "red", "clusters[0]: unknown field(s): colour"),
        ("models.0.candidates", ["zz"], "models[0].candidates: unknown cluster 'zz'"),
        ("default_cluster", "zz", "default_cluster: unknown cluster 'zz'"),
        ("picker", "best", "picker: must be one of weighted_random, lowest_score"),
        ("stats", {"subwindows": "six"}, "stats.subwindows: must be a number"),
        (
            "models.0.algorithm",
            {"type": "latency_aware", "latency_aware": {"ttft_percentile": 101}},
            "models[0].algorithm.latency_aware.ttft_percentile: must be <= 100",
        ),
        ("classes", {"x": {"slo": {"metric": "p99"}}}, "classes.x.slo.metric: must be one of"),
        ("health", {"recover_ratio": 0.9}, "health: need recover_ratio < watch_ratio"),
        ("health", {"explore_share": 0}, "health.explore_share: must be >= 0.001"),
        ("classes", {"x": {"latency_exponent": 1}}, "classes.x.latency_exponent: must be >= 2"),
        ("classes", {"x": {"latency_exponent": "steep"}},
         "classes.x.latency_exponent: must be a number"),
        ("health", {"explore_share": 1.5}, "health.explore_share: must be <= 1"),
        ("classes", {"x": {"weights": {"queue": -1}}}, "classes.x.weights.queue: must be >= 0"),
        ("classes", {"x": {"pool_worse": "yes"}}, "classes.x.pool_worse: must be"),
        ("classes", {"x": {"weights": {"queue": 13}}}, "classes.x.weights.queue: must be <= 12"),
        # 4 x max_concurrency is an Envoy breaker threshold, a UInt32
        ("clusters.0.max_concurrency", 10**12,
         "clusters[0].max_concurrency: must be <= 1000000, got 1000000000000"),
        ("admission", {"queue_max": 10**10}, "admission.queue_max: must be <= 1000000"),
        # addresses are checked when the file is read, not when something binds or renders
        ("listen", {"admin": "127.0.0.1:70000"},
         "listen.admin: must be host:port with a port of 0..65535, got '127.0.0.1:70000'"),
        ("listen", {"grpc": "garbage"}, "listen.grpc: must be host:port, got 'garbage'"),
        ("listen", {"admin": ""}, "listen.admin: must be host:port, got ''"),
        ("envoy", {"listen": "xx"}, "envoy.listen: must be host:port, got 'xx'"),
        ("envoy", {"admin": "::1:9901"},
         "envoy.admin: must be host:port with an IPv6 host in brackets ([::1]:9901)"),
        ("envoy", {"listen": "[nope]:10000"},
         "envoy.listen: must be host:port with an IPv6 address in the brackets"),
        ("envoy", {"listen": "a b:10000"},
         "envoy.listen: must be host:port with a host name or IP address"),
        ("clusters.0.address", "127.0.0.1:0",  # Envoy connects there
         "clusters[0].address: must be host:port with a port of 1..65535, got '127.0.0.1:0'"),
        # a list item of the wrong YAML type: named by its index, never a TypeError
        ("models.0.candidates", [["a", "b"]],
         "models[0].candidates[0]: must be a string, got list ['a', 'b']"),
        ("models.0.candidates", ["a", {"b": None}],
         "models[0].candidates[1]: must be a string, got dict {'b': None}"),
        ("models.0.regions", ["eu", ["us"]], "models[0].regions[1]: must be a string, got list"),
        ("routing", {"per_request_classes": [5]},
         "routing.per_request_classes[0]: must be a string, got int 5"),
    ],
)
def test_errors_name_file_and_field(path: str, value: Any, expect: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_with(path, value), "conf/tailroute.yaml")
    msg = str(err.value)
    assert msg.startswith("conf/tailroute.yaml: "), msg
    assert expect in msg, msg


@pytest.mark.parametrize(("section", "value"), [
    ("listen", {"grpc": "", "grpc_unix": "/tmp/t.sock"}),  # TCP off
    ("listen", {"grpc": "[::1]:0", "admin": "localhost:0"}),  # 0: any free port
    ("envoy", {"listen": "0.0.0.0:10000", "admin": "[::]:9901"}),
    ("clusters", [{"name": "a", "address": "[fd00::1]:8001", "models": ["m"]},
                  {"name": "b", "address": "api.example.com:443", "models": ["m"]},
                  {"name": "c", "address": "10.0.0.3:8003", "models": ["m"]}]),
])
def test_valid_addresses(section: str, value: Any) -> None:
    parse_config(_with(section, value), "t.yaml")


def _rename_cluster(name: str) -> dict[str, Any]:
    data = base_config_dict(default_cluster=name)
    data["clusters"][0]["name"] = name
    data["models"][0]["candidates"][0] = name
    return data


def _rename_class(name: Any) -> dict[str, Any]:
    return base_config_dict(classes={name: {}, "batch": {}}, default_class=str(name),
                            routing={"per_request_classes": [str(name)]})


def _rename_model(name: str) -> dict[str, Any]:
    data = base_config_dict()
    data["models"][0]["name"] = name
    for c in data["clusters"]:
        c["models"] = [name]
    return data


@pytest.mark.parametrize(("data", "problem"), [
    (_rename_cluster("tailroute_sidecar"), "clusters[0].name: 'tailroute_sidecar' is "
     "reserved: the rendered Envoy bootstrap's cluster for the sidecar has that name"),
    (_rename_cluster("a|b"), "clusters[0].name: must be 1-128 letters, digits or "
     ". _ : / @ + -, got 'a|b'"),
    (_rename_cluster("a b"), "clusters[0].name: must be 1-128 letters"),
    (_rename_cluster("*"), "clusters[0].name: must be 1-128 letters"),
    (_rename_class("a|b"), "classes.a|b: class name must be 1-128 letters, digits or "
     ". _ : / @ + - (what the x-tailroute-class header accepts; '|' separates slice "
     "labels), got 'a|b'"),
    (_rename_class("*"), "classes.*: class name '*' is reserved: the sidecar's own slices "
     "use it"),
    (_rename_class("_overflow"), "classes._overflow: class name '_overflow' is reserved"),
    (_rename_class(""), "classes.: class name must be 1-128 letters"),
    (_rename_class("two words"), "classes.two words: class name must be 1-128 letters"),
    (_rename_class(True), "classes.True: class name must be a string, but YAML read True "
     "as bool: quote it as written"),
    (_rename_class(1.5), "classes.1.5: class name must be a string, but YAML read 1.5 as "
     "float"),
    (_rename_class("x" * 300), "classes." + "x" * 300 + ": class name must be 1-128 "
     "letters"),
    (_rename_model("a|b"), "models[0].name: must not contain '|' or control characters, "
     "got 'a|b'"),
    (_rename_model("m\n"), "models[0].name: must not contain '|' or control characters"),
    (_rename_model("*"), "models[0].name: '*' is reserved: the sidecar's own slices use it"),
    (_rename_model("_unknown"), "models[0].name: '_unknown' is reserved"),
    (_rename_model(""), "models[0].name: must be a non-empty string, got ''"),
])
def test_reserved_names_and_characters(data: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "t.yaml")
    assert len(err.value.problems) == 1, err.value.problems  # references stay quiet
    assert err.value.problems[0].startswith(f"t.yaml: {problem}"), err.value.problems


@pytest.mark.parametrize("data", [
    _rename_cluster("eu-west.provider_a:v2"), _rename_class(7), _rename_class("tier/gold@2"),
    _rename_model("meta-llama/Llama-3.1-8B Instruct"),
])
def test_names_clients_and_envoy_can_use(data: dict[str, Any]) -> None:
    parse_config(data, "t.yaml")


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(("path", "value", "expect"), [
    ("stats", {"subwindow_s": NAN}, "stats.subwindow_s: must be a finite number, got nan"),
    ("stats", {"enough_samples": INF}, "stats.enough_samples: must be a finite number, got inf"),
    ("health", {"degraded_weight": NAN}, "health.degraded_weight: must be a finite number"),
    ("health", {"cooldown_s": INF, "cooldown_max_s": INF},
     "health.cooldown_s: must be a finite number, got inf"),
    ("classes", {"x": {"slo": {"budget_ms": NAN}}},
     "classes.x.slo.budget_ms: must be a finite number, got nan"),
    ("classes", {"x": {"weights": {"latency": -INF}}},
     "classes.x.weights.latency: must be a finite number, got -inf"),
    ("clusters.0.cost_per_1k_tokens", INF,
     "clusters[0].cost_per_1k_tokens: must be a finite number, got inf"),
    ("clusters.0.max_concurrency", NAN,  # an integer field
     "clusters[0].max_concurrency: must be a finite number, got nan"),
    ("admission", {"queue_wait_ms": NAN}, "admission.queue_wait_ms: must be a finite number"),
    ("envoy", {"usage_sample": NAN}, "envoy.usage_sample: must be a finite number"),
    ("models.0.algorithm", {"latency_aware": {"ttft_percentile": NAN}},
     "models[0].algorithm.latency_aware.ttft_percentile: must be a finite number"),
    ("stats", {"prior_samples": 10**400},
     "stats.prior_samples: must be a finite number, got an integer of 401 digits"),
    ("compat", "semantic-router", None),  # below: semantic-router's own percentile reader
])
def test_non_finite_numbers_are_rejected(path: str, value: Any, expect: str | None) -> None:
    data = _with(path, value)
    if expect is None:
        for bad in (NAN, INF, 10**400):
            data["algorithm"] = {"latency_aware": {"ttft_percentile": bad}}
            with pytest.raises(ConfigError, match="ttft_percentile: must be an integer "
                               "between 1 and 100"):
                parse_config(data, "t.yaml")
        return
    with pytest.raises(ConfigError) as err:
        parse_config(data, "t.yaml")
    problems = err.value.problems
    assert problems[0].startswith(f"t.yaml: {expect}"), problems
    assert all("must be a finite number" in p for p in problems), problems  # no follow-on


def test_load_config_reports_yaml_line(tmp_path: Any) -> None:
    from sidecar.ops.config_file import load_config

    p = tmp_path / "bad.yaml"
    p.write_text("clusters: [\n  {name: a\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+: invalid YAML"):
        load_config(p)


@pytest.mark.parametrize(("content", "expect"), [
    (b"default_cluster: a\n# caf\xe9\n",
     "line 2: byte 0xe9 at offset 24 is not UTF-8 (save the file as UTF-8)"),
    (b"\xff\xfedefault_cluster: a\n", "line 1: byte 0xff at offset 0 is not UTF-8"),
    (b"default_cluster: a\nmodels: []\ndefault_cluster: b\n",
     "line 3, column 1: invalid YAML: duplicate key 'default_cluster' (first given on line 1"),
    (b"clusters:\n  - name: a\n    address: x:1\n    name: b\n",
     "line 4, column 5: invalid YAML: duplicate key 'name' (first given on line 2"),
    (b"default_cluster: " + b"9" * 5000 + b"\n",
     "line 1, column 18: invalid YAML: integer of 5000 digits is too long"),
    (b"default_cluster: a\nregion: u\x07s\n",
     "line 2, column 10: invalid YAML: character U+0007 is not allowed"),
    (b"default_cluster: a\nregion: \x00\n",
     "line 2, column 9: invalid YAML: character U+0000 is not allowed"),
    (b"classes:\n  on: {}\n",
     "line 2, column 3: invalid YAML: key on reads as True in YAML, not as written: "
     "quote it ('on')"),
    (b"classes:\n  010: {}\n", "line 2, column 3: invalid YAML: key 010 reads as 8"),
    (b"models:\n  - name: m\n    candidates: {~: a}\n",
     "line 3, column 18: invalid YAML: key ~ reads as None"),
])
def test_load_config_file_problems_name_the_file(tmp_path: Any, content: bytes,
                                                 expect: str) -> None:
    from sidecar.ops.config_file import load_config

    p = tmp_path / "tailroute.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value).startswith(f"{p}: {expect}"), str(err.value)


@pytest.mark.parametrize("depth", [300, 500, 2000])
def test_a_deeply_nested_value_is_a_config_error(tmp_path: Any, depth: int) -> None:
    """Python's stack ends some 400 levels into the pure-Python YAML parser (it raised
    RecursionError out of check-config); libyaml stops at 1,000 levels itself. Either
    way a config error, and the value it quotes is cut short."""
    from sidecar.ops.config_file import load_config

    p = tmp_path / "tailroute.yaml"
    p.write_text(yaml.safe_dump(base_config_dict())
                 + "snapshot_path: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    text = str(err.value)
    assert text.startswith(f"{p}: ") and len(text) < 300, text
    assert "snapshot_path: must be a string" in text or "invalid YAML" in text, text


def test_flow_style_keys_as_written_stay_keys(tmp_path: Any) -> None:
    from sidecar.ops.config_file import parse_yaml

    assert parse_yaml("a: {7: x, '010': y, \"on\": z, 1.5: w}\n", tmp_path) == {
        "a": {7: "x", "010": "y", "on": "z", 1.5: "w"}}


def test_a_key_a_merge_brought_in_may_be_overridden(tmp_path: Any) -> None:
    from sidecar.ops.config_file import read_yaml

    p = tmp_path / "merge.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  x: 3\n")
    assert read_yaml(p)["m"] == {"x": 3, "y": 2}


def test_example_config_is_valid() -> None:
    from pathlib import Path

    from sidecar.ops.config_file import load_config

    cfg = load_config(Path(__file__).parents[1] / "deploy" / "local" / "tailroute.yaml")
    assert cfg.default_cluster == "provider-a"


@pytest.mark.parametrize(("path", "value", "expect"), [
    # Empty where nothing could be routed: an error naming the field.
    ("models", [], "models: must define at least one model (with none, tailroute routes "
     "nothing: every request goes to default_cluster)"),
    ("clusters", [], "clusters: must define at least one cluster"),
    ("classes", {}, "classes: must be a non-empty mapping of class name -> settings"),
    ("models.0.candidates", [], "models[0].candidates: must list at least one cluster"),
    # Empty with a documented meaning: accepted.
    ("models.0.regions", [], None),  # any region
    ("routing", {"per_request_classes": []}, None),  # the default
    ("clusters.0.models", [], None),  # a cluster only the default route uses
])
def test_lists_that_must_not_be_empty(path: str, value: Any, expect: str | None) -> None:
    data = _with(path, value)
    if path == "clusters.0.models":
        data["models"][0]["candidates"] = ["b", "c"]
    if expect is None:
        parse_config(data, "conf/tailroute.yaml")
        return
    with pytest.raises(ConfigError) as err:
        parse_config(data, "conf/tailroute.yaml")
    assert err.value.problems[0] == f"conf/tailroute.yaml: {expect}", err.value.problems


def test_no_models_is_reported_with_the_other_problems() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(base_config_dict(models=[], picker="best"), "t.yaml")
    assert [p.split(":")[1].strip() for p in err.value.problems] == ["models", "picker"]


def _regions(regions: list[Any]) -> dict[str, Any]:
    data = base_config_dict()
    for c, region in zip(data["clusters"], ("eu", "eu", "us"), strict=True):
        c["region"] = region
    data["models"][0]["candidates"] = ["a", "b"]  # both in eu; c (us) is no candidate
    data["models"][0]["regions"] = regions
    return data


@pytest.mark.parametrize(("regions", "problems"), [
    (["eu"], []),
    ([], []),  # any region
    (["eu", "eu-west"], ["models[0].regions[1]: no candidate of this model is in region "
                         "'eu-west' (no cluster has region 'eu-west'); candidates' regions: "
                         "a (eu), b (eu)"]),
    (["us"], ["models[0].regions[0]: no candidate of this model is in region 'us' (only "
              "clusters that are not candidates of this model are there)"]),
    (["a"], ["models[0].regions[0]: no candidate of this model is in region 'a' (that is a "
             "cluster name; regions lists clusters[].region labels)"]),
    ([""], ["models[0].regions[0]: no candidate of this model is in region ''"]),
    (["eu", 5, "mars"], ["models[0].regions[1]: must be a string, got int 5",
                         "models[0].regions[2]: no candidate of this model is in region "
                         "'mars'"]),
])
def test_regions_name_a_region_of_a_candidate(regions: list[Any],
                                              problems: list[str]) -> None:
    if not problems:
        parse_config(_regions(regions), "t.yaml")
        return
    with pytest.raises(ConfigError) as err:
        parse_config(_regions(regions), "t.yaml")
    assert len(err.value.problems) == len(problems), err.value.problems
    for got, want in zip(err.value.problems, problems, strict=True):
        assert got.startswith(f"t.yaml: {want}"), got


def test_regions_of_a_model_with_a_broken_candidate_say_nothing_more() -> None:
    data = _regions(["eu-west"])
    data["clusters"][0]["address"] = "nope"  # a structural mistake: cluster a is left out
    with pytest.raises(ConfigError) as err:
        parse_config(data, "t.yaml")
    assert [p.split(": ")[1] for p in err.value.problems] == ["clusters[0].address"]


def test_replacing_a_field_leaves_the_original_lookups_alone() -> None:
    """dataclasses.replace builds the copy's lookups afresh; the original keeps its own."""
    cfg = parse_config(base_config_dict(), "t.yaml")
    k = cfg.workload_class("interactive")
    assert k is not None
    steep = dataclasses.replace(k, latency_exponent=6.0)
    other = dataclasses.replace(
        cfg, classes=tuple(steep if c.name == k.name else c for c in cfg.classes))
    assert other.workload_class("interactive") == steep
    assert cfg.workload_class("interactive") == k
