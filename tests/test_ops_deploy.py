"""deploy/ cannot run here (no container engine), so check it statically: every YAML
parses, the sidecar configs validate, the Envoy bootstraps are the renderer's output
and pass `envoy --mode validate`, the compose and Kubernetes wiring agree with
them, and every metric the dashboard and alert rules query is one the sidecar exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.devtools.harness import envoy_binary
from sidecar.ops.config_file import load_config
from sidecar.ops.metrics import HISTOGRAM_NAMES, METRIC_NAMES
from sidecar.shell.bootstrap import render_bootstrap, to_yaml
from tests.conftest import need_tool

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
COMPOSE_GRPC = "172.30.117.20:50051"
K8S_SOCKET = "/var/run/tailroute/extproc.sock"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_deploy_tree_is_complete() -> None:
    for rel in ("Dockerfile", "docker-compose.yaml", "compose/tailroute.yaml",
                "compose/envoy.yaml", "k8s/kustomization.yaml", "k8s/deployment.yaml",
                "k8s/tailroute.yaml", "k8s/envoy.yaml", "prometheus/alerts.yaml",
                "prometheus/prometheus.yml", "grafana/dashboards/tailroute.json"):
        assert (DEPLOY / rel).is_file(), rel


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize(("where", "grpc", "unix"), [("compose", COMPOSE_GRPC, None),
                                                     ("k8s", None, K8S_SOCKET)])
def test_envoy_bootstrap_is_rendered_from_the_config_and_validates(
    where: str, grpc: str | None, unix: str | None
) -> None:
    cfg = load_config(DEPLOY / where / "tailroute.yaml")
    boot = DEPLOY / where / "envoy.yaml"
    flag = f"--grpc {grpc}" if grpc else f"--unix {unix}"
    assert boot.read_text() == to_yaml(render_bootstrap(cfg, grpc_target=grpc,
                                                        unix_socket=unix)), (
        f"{boot} is stale: tailroute envoy-config --config deploy/{where}/tailroute.yaml "
        f"{flag} -o deploy/{where}/envoy.yaml")
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(boot)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_largest_timeouts_and_buffers_the_config_accepts_render_for_envoy(
    tmp_path: Path
) -> None:
    """The config's upper bounds are what Envoy can load: a class timeout of a week
    (rendered ``604800s``; ``f"{x:g}s"`` wrote 1,000,000 s as ``1e+06s``, which Envoy
    refuses), one with milliseconds (``1234.567s``, not rounded to ``1234.57s``) and
    the largest buffer Envoy's uint32 fields hold. One beyond a bound is a config error."""
    from sidecar.core.config import ConfigError, parse_config
    from sidecar.core.config_parse import UINT32_MAX
    from sidecar.core.config_routes import MAX_TIMEOUT_MS
    from tests.conftest import base_config_dict

    def config(timeout_ms: float, buffer: int) -> dict[str, Any]:
        return base_config_dict(
            classes={"long": {"slo": {"budget_ms": 1000, "timeout_ms": timeout_ms}},
                     "odd": {"slo": {"budget_ms": 1000, "timeout_ms": 1_234_567}}},
            envoy={"route_buffer_bytes": buffer})

    cfg = parse_config(config(MAX_TIMEOUT_MS, UINT32_MAX), "t.yaml")
    text = to_yaml(render_bootstrap(cfg, grpc_target="127.0.0.1:50051"))
    assert "604800s" in text and "1234.567s" in text and "e+" not in text
    boot = tmp_path / "envoy.yaml"
    boot.write_text(text)
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(boot)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for timeout_ms, buffer, field in [(MAX_TIMEOUT_MS + 1, UINT32_MAX, "timeout_ms"),
                                      (MAX_TIMEOUT_MS, UINT32_MAX + 1, "route_buffer_bytes")]:
        with pytest.raises(ConfigError, match=f"{field}: must be <= "):
            parse_config(config(timeout_ms, buffer), "t.yaml")


def test_compose_wiring_matches_the_configs() -> None:
    compose = _load(DEPLOY / "docker-compose.yaml")
    services = compose["services"]
    assert {"envoy", "sidecar", "prometheus", "grafana"} <= set(services)
    ip = {name: s["networks"]["tailroute"]["ipv4_address"] for name, s in services.items()
          if isinstance(s.get("networks"), dict)}
    cfg = load_config(DEPLOY / "compose" / "tailroute.yaml")
    fakes = {n for n, s in services.items() if "fake-provider" in s.get("command", [])}
    assert len(fakes) == 3 and fakes == set(cfg.cluster_names)
    for c in cfg.clusters:  # Envoy's STATIC clusters point at the providers' fixed IPs
        assert c.address == f"{ip[c.name]}:8000"
    assert f"{ip['sidecar']}:{cfg.listen.grpc.rpartition(':')[2]}" == COMPOSE_GRPC
    for svc in services.values():  # bind mounts refer to files in deploy/
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), src
    for svc in services.values():  # published ports only on the loopback interface
        assert all(str(p).startswith("127.0.0.1:") for p in svc.get("ports", []))
    sidecar_cfg = services["sidecar"]["command"][services["sidecar"]["command"].index(
        "--config") + 1]
    assert sidecar_cfg == "/etc/tailroute/tailroute.yaml"
    prom = _load(DEPLOY / "prometheus" / "prometheus.yml")
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"sidecar:{cfg.listen.admin.rpartition(':')[2]}"]


def test_kubernetes_pod_shares_the_socket_between_envoy_and_sidecar() -> None:
    kust = _load(DEPLOY / "k8s" / "kustomization.yaml")
    for res in kust["resources"]:
        assert (DEPLOY / "k8s" / res).is_file()
    generated = {g["name"]: g["files"] for g in kust["configMapGenerator"]}
    assert generated == {"tailroute-config": ["tailroute.yaml"], "tailroute-envoy": ["envoy.yaml"]}
    dep = _load(DEPLOY / "k8s" / "deployment.yaml")
    pod = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}
    sidecar, envoy = containers["tailroute"], containers["envoy"]
    socket_dir = str(Path(K8S_SOCKET).parent)
    vols = {v["name"]: v for v in pod["volumes"]}

    def mount(c: dict[str, Any], path: str) -> str:
        return str(next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == path))

    shared = mount(sidecar, socket_dir)
    assert shared == mount(envoy, socket_dir) and "emptyDir" in vols[shared]
    assert vols[mount(sidecar, "/etc/tailroute")]["configMap"]["name"] == "tailroute-config"
    assert vols[mount(envoy, "/etc/envoy")]["configMap"]["name"] == "tailroute-envoy"
    assert sidecar["args"][sidecar["args"].index("--unix") + 1] == K8S_SOCKET
    assert sidecar["args"][sidecar["args"].index("--config") + 1] == "/etc/tailroute/tailroute.yaml"
    cfg = load_config(DEPLOY / "k8s" / "tailroute.yaml")
    assert cfg.listen.grpc_unix == K8S_SOCKET
    assert cfg.snapshot_path and Path(cfg.snapshot_path).parent == Path("/var/lib/tailroute")
    assert "emptyDir" in vols[mount(sidecar, "/var/lib/tailroute")]
    boot = _load(DEPLOY / "k8s" / "envoy.yaml")
    sidecar_cluster = next(c for c in boot["static_resources"]["clusters"]
                           if c["name"] == "tailroute_sidecar")
    endpoint = sidecar_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert endpoint["endpoint"]["address"] == {"pipe": {"path": K8S_SOCKET}}
    port = int(cfg.listen.admin.rpartition(":")[2])
    assert {"name": "admin", "containerPort": port} in sidecar["ports"]
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)


# ------------------------------------------------------------------ metric references

# Suffixes Prometheus adds to a histogram's series; counters are in METRIC_NAMES with _total.
_HIST_SUFFIXES = ("_bucket", "_sum", "_count")
_PROM_BUILTINS = {"up"}  # recorded by Prometheus for every scrape job


def _exported() -> set[str]:
    """Series names: histograms only as their _bucket/_sum/_count series."""
    names = set(METRIC_NAMES) - set(HISTOGRAM_NAMES)
    names |= {n + s for n in HISTOGRAM_NAMES for s in _HIST_SUFFIXES}
    return names


def _selectors(expr: str) -> set[str]:
    """Metric names in a PromQL expression: our prefixes, plus any name before ``{``."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values may contain anything
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # label names (gen_ai_token_type) are not metrics
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    ours = set(re.findall(r"\b(?:tailroute|gen_ai)_[a-z0-9_]+", expr))
    braced = set(re.findall(r"\b([a-zA-Z_][a-zA-Z0-9_]*)\s*\{", expr))
    return ours | braced


def _dashboard_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "tailroute.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def _rule_exprs() -> tuple[list[str], set[str]]:
    rules = [r for g in _load(DEPLOY / "prometheus" / "alerts.yaml")["groups"] for r in g["rules"]]
    return [r["expr"] for r in rules], {r["record"] for r in rules if "record" in r}


def test_dashboard_queries_reference_exported_metrics() -> None:
    exprs = _dashboard_exprs()
    assert len(exprs) >= 10
    used = set().union(*map(_selectors, exprs))
    unknown = used - _exported()
    assert not unknown, f"dashboard queries metrics the sidecar does not export: {unknown}"
    # The dashboard covers the headline series of the issue.
    for name in ("tailroute_decisions_total", "tailroute_route_state",
                 "tailroute_route_ttft_seconds", "tailroute_fail_open_total",
                 "gen_ai_client_operation_time_to_first_chunk_seconds_bucket",
                 "gen_ai_client_operation_duration_seconds_count",
                 "tailroute_extproc_phase_seconds_bucket", "tailroute_config_last_reload_ok"):
        assert name in used, name


def test_alert_rules_reference_exported_metrics() -> None:
    exprs, recorded = _rule_exprs()
    used = set().union(*map(_selectors, exprs))
    unknown = used - _exported() - _PROM_BUILTINS - recorded
    assert not unknown, f"alert rules query metrics the sidecar does not export: {unknown}"
    rules = [r for g in _load(DEPLOY / "prometheus" / "alerts.yaml")["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    for name in ("TailrouteErrorBudgetBurnFast", "TailrouteRouteQuarantined",
                 "TailrouteSidecarDown", "TailrouteFailOpen"):
        assert name in alerts
        assert alerts[name]["labels"]["severity"] and alerts[name]["annotations"]["summary"]
    assert 'tailroute_route_state{state="quarantined"}' in alerts[
        "TailrouteRouteQuarantined"]["expr"]


def test_a_fleet_replica_on_its_own_or_skipping_records_alerts() -> None:
    """A replica that lost its fleet store keeps serving on local state, so nothing else
    shows it; nor records it skips. Before, no rule watched either."""
    rules = [r for g in _load(DEPLOY / "prometheus" / "alerts.yaml")["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert "tailroute_fleet_store_up" in alerts["TailrouteFleetStoreDown"]["expr"]
    assert "tailroute_fleet_skipped_records_total" in alerts[
        "TailrouteFleetRecordsSkipped"]["expr"]


def test_alert_rules_pass_promtool() -> None:
    promtool = need_tool("promtool")
    out = subprocess.run([promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yaml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_rules_do_what_they_say_in_promtools_unit_tests() -> None:
    """deploy/prometheus/alerts_test.yaml: which alerts fire on series as the sidecar
    exports them, and which stay quiet when idle. Among them: with no target of the
    job at all (pods gone from discovery, another job name) `up == 0` has nothing to
    compare, so nothing fired while every rule was blind (TailrouteSidecarAbsent)."""
    promtool = need_tool("promtool")
    out = subprocess.run([promtool, "test", "rules",
                          str(DEPLOY / "prometheus" / "alerts_test.yaml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    tests = _load(DEPLOY / "prometheus" / "alerts_test.yaml")["tests"]
    tested = {c["alertname"] for t in tests for c in t.get("alert_rule_test", [])}
    assert {"TailrouteSidecarDown", "TailrouteSidecarAbsent", "TailrouteErrorBudgetBurnFast",
            "TailrouteNoHealthyRoute", "TailrouteEnvoyFailOpen", "TailrouteShedding",
            "TailrouteFailOpen", "TailrouteUnknownModel"} <= tested


def test_a_model_no_route_serves_is_its_own_alert_not_a_fail_open() -> None:
    """The reasons TailrouteFailOpen leaves out are exactly the ones TailrouteUnknownModel
    takes, and the sidecar exports them: one client's typo kept TailrouteFailOpen
    firing as if the sidecar failed open."""
    from sidecar.core.config import parse_config
    from sidecar.shell.app import App
    from tests.conftest import base_config_dict

    rules = [r for g in _load(DEPLOY / "prometheus" / "alerts.yaml")["groups"] for r in g["rules"]]
    exprs = {r["alert"]: r["expr"] for r in rules if "alert" in r}

    def reasons(alert: str, op: str) -> set[str]:
        return {v for m in re.findall(rf'reason{op}"([^"]*)"', exprs[alert])
                for v in m.split("|")}

    left_out = reasons("TailrouteFailOpen", "!~")
    assert left_out == reasons("TailrouteUnknownModel", "=~") == {"unknown_model",
                                                                  "native_default"}
    app = App.create(parse_config(base_config_dict(), "t.yaml"))
    app.router.counters[("decision", "unknown_model")] += 1
    app.envoy["native_default"] += 1
    assert {f"failopen:{r}" for r in left_out} <= set(app.shell_counters())


def test_the_admission_outcomes_the_shedding_alert_names_are_the_sidecars() -> None:
    """TailrouteShedding matches label values, which the name check above cannot see:
    they must be outcomes the sidecar exports."""
    from typing import get_args

    from sidecar.core.types import Admission

    rules = [r for g in _load(DEPLOY / "prometheus" / "alerts.yaml")["groups"] for r in g["rules"]]
    expr = next(r["expr"] for r in rules if r.get("alert") == "TailrouteShedding")
    named = {v for m in re.findall(r'outcome!?=~?"([^"]*)"', expr) for v in m.split("|")}
    assert named == {"defer", "shed", "queue"} and named <= set(get_args(Admission))


@pytest.mark.parametrize(("seconds", "fires"), [(0.002, False), (0.07, True), (0.2, True),
                                                (0.8, True)])
def test_the_slow_decision_alert_fires_on_the_buckets_the_sidecar_exports(
        tmp_path: Path, seconds: float, fires: bool) -> None:
    """TailrouteDecisionSlow (p99 of request_body handling > 50 ms) on the phase
    histogram as the sidecar exports it. Its highest bound was 0.05: any slower p99
    fell in +Inf, which histogram_quantile reads as that bound, and 0.05 > 0.05 is
    false, so the alert could never fire, least of all when decisions were slowest."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sidecar.core.config import parse_config
    from sidecar.ops.metrics import build_registry
    from sidecar.shell.app import App
    from tests.conftest import base_config_dict

    promtool = need_tool("promtool")
    app = App.create(parse_config(base_config_dict(), "t.yaml"), seed=1)
    registry, phase, _ = build_registry(lambda: app.router, lambda: 1.0, app.shell_counters)
    for _ in range(100):  # one scrape interval's decisions, all as slow
        phase.labels("request_body").observe(seconds)
    buckets = [(s.labels["le"], s.value)
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               if f.name == "tailroute_extproc_phase_seconds" for s in f.samples
               if s.name.endswith("_bucket")]
    series = [{"series": f'tailroute_extproc_phase_seconds_bucket{{phase="request_body", '
                         f'le="{le}"}}', "values": f"0+{n:g}x40"} for le, n in buckets]
    case = {"rule_files": [str(DEPLOY / "prometheus" / "alerts.yaml")],
            "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                {"eval_time": "30m", "alertname": "TailrouteDecisionSlow",
                 "exp_alerts": [{"exp_labels": {"severity": "warning"}, "exp_annotations": {
                     "summary": "p99 routing decision time above 50 ms"}}] if fires else []}]}]}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "case.yaml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _route_states(failing: str) -> list[dict[str, str]]:
    """``tailroute_route_state`` as the sidecar exports it after the clusters in
    ``failing`` answered 503 to everything for 30 s and the others answered fine."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sidecar.core.config import parse_config
    from sidecar.core.types import Observation, SliceKey
    from sidecar.ops.metrics import build_registry
    from sidecar.shell.app import App
    from tests.conftest import base_config_dict

    app = App.create(parse_config(base_config_dict(), "t.yaml"), seed=1)
    slices = [SliceKey("m", "interactive", p, s) for p in ("short", "medium") for s in (1, 0)]
    now = 100.0
    for _ in range(60):
        for s in slices:
            for c in "abc":
                app.observe(Observation(c, s, "error", 503, e2e_s=0.05) if c in failing
                            else Observation(c, s, "ok", 200, 0.1, 0.01, 0.3, 20), now, "chat")
        now += 0.5
        app.tick(now)
    registry = build_registry(lambda: app.router, lambda: now, app.shell_counters).registry
    return [s.labels for f in text_string_to_metric_families(generate_latest(registry).decode())
            if f.name == "tailroute_route_state" for s in f.samples]


@pytest.mark.parametrize(("failing", "paged"), [
    ("a", set()),  # a is ejected whole; b and c serve every slice
    ("abc", {"m|interactive|short|stream", "m|interactive|short|unary",
             "m|interactive|medium|stream", "m|interactive|medium|unary"}),
])
def test_no_healthy_route_pages_on_the_states_the_sidecar_exports(
        tmp_path: Path, failing: str, paged: set[str]) -> None:
    """TailrouteNoHealthyRoute on route states as the sidecar exports them. A cluster
    ejected whole has its own entry, slice ``*|*|*|*``, and its routes keep their own
    states. Counted as one more slice, one ejected cluster paged "every route of slice
    *|*|*|* is restricted or quarantined" while the others served everything; and with
    every cluster failing, no slice paged (the last cluster's routes restricted, the
    others' own entries healthy)."""
    promtool = need_tool("promtool")
    states = _route_states(failing)
    assert {"cluster": "a", "slice": "*|*|*|*"}.items() <= next(
        s for s in states if s["slice"] == "*|*|*|*").items()  # the ejection is exported
    series = [{"series": "tailroute_route_state{" + ", ".join(
        f'{k}="{v}"' for k, v in s.items()) + "}", "values": "1x20"} for s in states]
    summary = "Every route of slice {} is restricted or quarantined, or its cluster is"
    case = {"rule_files": [str(DEPLOY / "prometheus" / "alerts.yaml")],
            "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                {"eval_time": "10m", "alertname": "TailrouteNoHealthyRoute", "exp_alerts": [
                    {"exp_labels": {"severity": "page", "slice": s},
                     "exp_annotations": {"summary": summary.format(s)}}
                    for s in sorted(paged)]}]}]}
    (tmp_path / "case.yaml").write_text(yaml.safe_dump(case))
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "case.yaml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_fleet_store_is_wired_in_compose_and_kubernetes() -> None:
    from urllib.parse import urlsplit

    compose = _load(DEPLOY / "docker-compose.yaml")["services"]
    fleet = load_config(DEPLOY / "compose" / "tailroute.yaml").fleet
    assert fleet is not None
    url = urlsplit(fleet.url)
    assert url.hostname == compose["redis"]["networks"]["tailroute"]["ipv4_address"]
    assert url.port == 6379 and "redis" in compose["sidecar"]["depends_on"]
    assert not compose["redis"].get("ports")  # the store is not published on the host
    kfleet = load_config(DEPLOY / "k8s" / "tailroute.yaml").fleet
    assert kfleet is not None
    kurl = urlsplit(kfleet.url)
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "redis.yaml").read_text()) if d]
    svc = next(d for d in docs if d["kind"] == "Service")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert "redis.yaml" in _load(DEPLOY / "k8s" / "kustomization.yaml")["resources"]
    assert kurl.hostname == svc["metadata"]["name"]
    assert kurl.port in [p["port"] for p in svc["spec"]["ports"]]
    assert svc["spec"]["selector"] == dep["spec"]["template"]["metadata"]["labels"]
    assert _load(DEPLOY / "k8s" / "deployment.yaml")["spec"]["replicas"] >= 2
