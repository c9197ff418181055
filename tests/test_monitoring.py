"""Monitoring objects: schemas, placement, selectors that match the serving pods,
rules filled from settings, the dashboard, and the operations doc kept in step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from stacks.constants import GPU_MODEL_LABEL, GPU_TAINT
from k8s_schema import validate_all
from test_autoscaling import STACKS, ctx_for
from workloads.engine import manifests
from workloads.observability import monitoring

ROOT = Path(__file__).resolve().parents[1]


def by_kind(objs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.mark.parametrize("stack", STACKS)
def test_objects_pass_their_schemas(stack):
    ctx = ctx_for(stack)
    objs = monitoring.render(ctx)
    assert {o["kind"] for o in objs} == {"PodMonitor", "ServiceAccount", "DaemonSet", "PrometheusRule", "ConfigMap"}
    validate_all(objs, ctx.settings.cluster.kubernetes_version)


def test_placement_cluster_wide_in_monitoring_namespace_scrape_config_with_the_pods():
    ctx = ctx_for("dev", monitoring__namespace="observability")
    objs = by_kind(monitoring.render(ctx))
    assert objs[("PodMonitor", f"{ctx.release}-vllm")]["metadata"]["namespace"] == ctx.namespace
    for key in [("DaemonSet", "dcgm-exporter"), ("PodMonitor", "dcgm-exporter"),
                ("PrometheusRule", f"{ctx.release}-alerts"), ("PrometheusRule", f"{ctx.release}-recording"),
                ("ConfigMap", f"{ctx.release}-dashboard")]:
        assert objs[key]["metadata"]["namespace"] == "observability", key


def test_dcgm_exporter_runs_on_gpu_nodes_only_with_a_pinned_image():
    ds = by_kind(monitoring.render(ctx_for("dev")))[("DaemonSet", "dcgm-exporter")]["spec"]["template"]["spec"]
    terms = ds["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # Every term demands the label only GPU pools carry (infra/cluster.py).
    assert terms and all({"key": GPU_MODEL_LABEL, "operator": "Exists"} in t["matchExpressions"] for t in terms)
    tol = ds["tolerations"]
    assert any(t["key"] == GPU_TAINT["key"] and t["effect"] == GPU_TAINT["effect"]
               and (t["operator"] == "Exists" or t.get("value") == GPU_TAINT["value"]) for t in tol)
    (c,) = ds["containers"]
    # the stack mirror's copy of the upstream image, by its pinned tag (digest once recorded)
    repo, _, tag = c["image"].rpartition(":")
    assert repo.endswith("/mirror/nvidia/k8s/dcgm-exporter") and tag == "4.2.3-4.1.3-ubuntu22.04"
    assert {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"} in c["env"]


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_vllm_pod_monitor_selects_the_serving_pods_on_their_port():
    ctx = ctx_for("dev")
    pm = by_kind(monitoring.render(ctx))[("PodMonitor", f"{ctx.release}-vllm")]["spec"]
    dep = next(o for o in manifests.render(ctx) if o["kind"] == "Deployment")
    tmpl = dep["spec"]["template"]
    assert _matches(pm["selector"], tmpl["metadata"]["labels"])
    ports = [p["containerPort"] for c in tmpl["spec"]["containers"] for p in c.get("ports", [])]
    (ep,) = pm["podMetricsEndpoints"]
    assert ep["portNumber"] in ports and ep["path"] == "/metrics"
    # The labels the queries rely on: job="vllm" and the canary's template hash.
    assert tmpl["metadata"]["labels"][pm["jobLabel"]] == monitoring.VLLM_JOB
    assert monitoring.ROLLOUT_HASH_POD_LABEL in pm["podTargetLabels"]


def test_multi_node_pod_monitor_scrapes_leaders_not_workers():
    ctx = ctx_for("prod")
    assert ctx.multi_node
    pm = by_kind(monitoring.render(ctx))[("PodMonitor", f"{ctx.release}-vllm")]["spec"]
    lws = next(o for o in manifests.render(ctx) if o["kind"] == "LeaderWorkerSet")
    t = lws["spec"]["leaderWorkerTemplate"]
    assert _matches(pm["selector"], t["leaderTemplate"]["metadata"]["labels"])
    assert not _matches(pm["selector"], t["workerTemplate"]["metadata"]["labels"])


def test_selector_labels_reach_monitors_and_rules():
    ctx = ctx_for("dev", monitoring__selector_labels={"release": "kps"})
    for o in monitoring.render(ctx):
        if o["kind"] in ("PodMonitor", "PrometheusRule"):
            assert o["metadata"]["labels"]["release"] == "kps", o["metadata"]["name"]


def _alerts(ctx) -> dict[str, dict]:
    return {r["alert"]: r for g in monitoring.rule_groups(ctx)["alerts"] for r in g["rules"]}


def test_alert_thresholds_come_from_settings():
    ctx = ctx_for("dev", monitoring__ttft_p99_seconds=1.25, monitoring__e2e_p99_seconds=45,
                  monitoring__p99_regression_ratio=1.75, monitoring__error_rate=0.03,
                  monitoring__kv_cache_usage=0.85, monitoring__at_max_replicas_minutes=90)
    a = _alerts(ctx)
    assert a["VllmTimeToFirstTokenP99High"]["expr"].endswith("> 1.25")
    assert a["VllmEndToEndLatencyP99High"]["expr"].endswith("> 45")
    assert a["VllmLatencyP99Regression"]["expr"].count("> 1.75 *") == 2
    assert a["VllmErrorRateHigh"]["expr"].endswith("> 0.03")
    assert a["VllmKVCacheHigh"]["expr"].endswith("> 0.85")
    assert a["VllmQueueGrowingWhileKVCacheFull"]["expr"].strip().endswith(">= 0.85")
    assert a["ServingReplicasAtMax"]["for"] == "90m"
    assert 'horizontalpodautoscaler="keda-hpa-deepseek"' in a["ServingReplicasAtMax"]["expr"]


def test_every_alert_has_severity_summary_and_runbook():
    for name, rule in _alerts(ctx_for("prod")).items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert len(rule["annotations"]["runbook"].splitlines()) >= 2, name
        assert "${" not in json.dumps(rule), name  # every placeholder filled


def test_replicas_at_max_only_with_autoscaling():
    assert "ServingReplicasAtMax" in _alerts(ctx_for("dev"))
    assert "ServingReplicasAtMax" not in _alerts(ctx_for("dev", autoscaling__enabled=False))


def test_an_unknown_placeholder_is_an_error_not_a_literal():
    with pytest.raises(KeyError, match="thresold"):
        monitoring.fill({"expr": "x > ${thresold}"}, {"threshold": "1"})


def test_rule_file_for_vmp_holds_the_same_groups():
    ctx = ctx_for("prod")
    doc = yaml.safe_load(monitoring.rule_file_content(ctx))
    groups = monitoring.rule_groups(ctx)
    assert doc["groups"] == groups["recording"] + groups["alerts"]
    rules = by_kind(monitoring.render(ctx))
    assert rules[("PrometheusRule", f"{ctx.release}-alerts")]["spec"]["groups"] == groups["alerts"]


def test_dashboard_configmap_is_picked_up_by_the_grafana_sidecar():
    ctx = ctx_for("staging")
    cm = by_kind(monitoring.render(ctx))[("ConfigMap", f"{ctx.release}-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    model = json.loads(text)
    ns_var = next(v for v in model["templating"]["list"] if v["name"] == "namespace")
    assert ns_var["current"]["value"] == ctx.namespace


# What the issue asks the dashboard to show, and a metric that proves each is there.
DASHBOARD_MUST_SHOW = {
    "request rate": "vllm:request_success_total",
    "TTFT": "vllm:time_to_first_token_seconds_bucket",
    "ITL": "vllm:inter_token_latency_seconds_bucket",
    "end-to-end latency": "vllm:e2e_request_latency_seconds_bucket",
    "tokens/s in": "vllm:prompt_tokens_total",
    "tokens/s out": "vllm:generation_tokens_total",
    "queue": "vllm:num_requests_waiting",
    "KV usage": "vllm:kv_cache_usage_perc",
    "preemptions": "vllm:num_preemptions_total",
    "GPU utilisation": "DCGM_FI_DEV_GPU_UTIL",
    "GPU memory": "DCGM_FI_DEV_FB_USED",
    "GPU power": "DCGM_FI_DEV_POWER_USAGE",
}


def test_dashboard_shows_every_figure_per_pod_and_per_node():
    model = monitoring.dashboard(ctx_for("dev"))
    panels = [p for p in model["panels"] if p["type"] != "row"]
    read = {n for p in panels for t in p["targets"] for n in monitoring.metric_names(monitoring.as_promql(t["expr"]))}
    missing = {k: v for k, v in DASHBOARD_MUST_SHOW.items() if v not in read}
    assert not missing
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"):
        groupings = {m for p in panels for t in p["targets"] if metric in t["expr"]
                     for m in re.findall(r"by \((\w+)\)", t["expr"])}
        assert {"pod", "node"} <= groupings, metric
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))


def test_operations_doc_lists_exactly_the_alerts():
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^### `?(\w+)`?", section, re.M))
    # over the shipped stacks: the routing tier's alerts exist where it is on (prod)
    shipped = {a for stack in STACKS for a in _alerts(ctx_for(stack))}
    assert listed == shipped, f"missing from doc: {shipped - listed}; not shipped: {listed - shipped}"


@pytest.mark.parametrize("model, cls, e2e, tps", [
    ("deepseek-r1", "reasoning", 480.0, 10.0),
    ("deepseek-r1-distill-qwen-7b", "reasoning", 480.0, 10.0),
    ("deepseek-coder-v2-lite", "chat", 30.0, 20.0),
    ("deepseek-v2-lite", "chat", 30.0, 20.0),
])
def test_objectives_follow_the_model_class(model, cls, e2e, tps):
    from stacks.plan import SLO_CLASS_DEFAULTS, infer_model_class

    assert infer_model_class(model) == cls
    assert SLO_CLASS_DEFAULTS[cls] == {"e2e_p99_seconds": e2e, "min_tokens_per_second": tps}


def test_reasoning_alerts_get_the_long_budget_and_the_token_rate_objective():
    a = _alerts(ctx_for("dev"))  # an R1 distill
    assert a["VllmEndToEndLatencyP99High"]["expr"].endswith("> 480")
    assert a["VllmTokenRateLow"]["expr"].endswith("> 0.1")
    c = _alerts(ctx_for("dev", monitoring__model_class="chat"))
    assert c["VllmEndToEndLatencyP99High"]["expr"].endswith("> 30")
    assert c["VllmTokenRateLow"]["expr"].endswith("> 0.05")
    # explicit settings win over the class, and the canary analysis follows the budget
    x = ctx_for("dev", monitoring__e2e_p99_seconds=200, monitoring__min_tokens_per_second=8)
    assert _alerts(x)["VllmEndToEndLatencyP99High"]["expr"].endswith("> 200")
    assert _alerts(x)["VllmTokenRateLow"]["expr"].endswith("> 0.125")
    assert x.plan.slo.canary_p99_seconds == 200


def test_the_envoy_proxies_are_scraped_on_their_stats_port_with_the_job_the_rules_read():
    from workloads.edge import gateway

    ctx = ctx_for("dev")
    pm = by_kind(monitoring.render(ctx))[("PodMonitor", f"{ctx.release}-envoy")]
    assert pm["metadata"]["namespace"] == ctx.settings.monitoring.namespace
    spec = pm["spec"]
    assert spec["selector"] == {"matchLabels": gateway.proxy_selector(ctx)}
    assert spec["namespaceSelector"] == {"matchNames": [monitoring.ENTRY_NAMESPACE]}
    (ep,) = spec["podMetricsEndpoints"]
    assert (ep["portNumber"], ep["path"]) == (19001, "/stats/prometheus")  # Envoy Gateway's proxy metrics
    (relabel,) = ep["relabelings"]
    assert (relabel["targetLabel"], relabel["replacement"]) == ("job", monitoring.ENVOY_JOB)
    # every rule reading Envoy series selects that job, the proxies' namespace and the API listener
    envoy_rules = [r for gs in monitoring.rule_groups(ctx).values() for g in gs for r in g["rules"]
                   if any(n.startswith("envoy_") for n in monitoring.metric_names(r["expr"]))]
    assert len(envoy_rules) == 4  # three recorded at the gateway, the breaker alert
    for r in envoy_rules:
        assert f'job="{monitoring.ENVOY_JOB}",namespace="{monitoring.ENTRY_NAMESPACE}"' in r["expr"], r
    assert 'envoy_http_conn_manager_prefix="http-10080"' in monitoring.rule_file_content(ctx)


def test_without_the_in_cluster_gateway_nothing_reads_envoy():
    ctx = ctx_for("dev", serving__in_cluster_gateway=False)
    assert ("PodMonitor", f"{ctx.release}-envoy") not in by_kind(monitoring.render(ctx))
    assert "envoy_" not in monitoring.rule_file_content(ctx)
    assert not {"GatewayErrorRateHigh", "GatewayLatencyP99High"} & set(_alerts(ctx))


@pytest.mark.parametrize("stack", STACKS)
def test_the_rule_file_is_the_text_pyyamls_own_emitter_writes(stack):
    """The rule file is written with libyaml's emitter where PyYAML has it (a tenth of the
    time of a preview's slowest project step); its text is the pure-Python emitter's."""
    ctx = ctx_for(stack)
    groups = [g for gs in monitoring.rule_groups(ctx).values() for g in gs]
    assert monitoring.rule_file_content(ctx) == yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000)
