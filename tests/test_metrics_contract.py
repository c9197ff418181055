"""Every metric name the workload reads exists where it is said to come from.

Two halves:

* offline, every stack: each name in every shipped query (autoscaler, canary analysis,
  recording and alert rules, dashboard) is one of
  - a vLLM 0.32 metric in tests/data/vllm-0.32-metrics.txt (a real scrape; histogram
    series add `_bucket`/`_sum`/`_count` to the listed name),
  - a counter of the deployed dcgm-exporter release (tests/data/dcgm-exporter/*.csv),
  - a series one of our own recording rules defines,
  - or one of ALLOWED below, each with where it comes from;
* live (integration): a real vLLM serving a tiny DeepSeek-V2 is sent a few requests,
  its /metrics is scraped, and every `vllm:` series our queries read is in it, as is
  the `http_requests_total` series the 5xx ratio relies on, with its `status` grouped
  as "2xx"/"4xx"/"5xx".
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
from pathlib import Path

import pytest

from stacks import load
from test_autoscaling import STACKS, ctx_for
from workloads.engine import engine_args
from workloads.observability import monitoring
from workloads.observability import queries
from stacks.plan import build_plan
from workloads.engine.context import build_context

DATA = Path(__file__).resolve().parent / "data"  # sources: data/SOURCES.md
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Not vLLM's `vllm:` family and not DCGM, each from a named exporter.
ALLOWED = {
    # Prometheus itself: 1 when the last scrape of a target succeeded.
    "up": "Prometheus",
    # vLLM's API server (prometheus-fastapi-instrumentator, vllm/entrypoints/serve/
    # instrumentator/metrics.py): responses by handler, method and status class. The
    # shared scrape lists only `vllm:` names; the live test below finds it on /metrics.
    "http_requests_total": "vLLM API server",
    # kube-state-metrics (https://github.com/kubernetes/kube-state-metrics/tree/main/docs/metrics)
    "kube_pod_container_status_restarts_total": "kube-state-metrics",
    "kube_pod_container_status_last_terminated_reason": "kube-state-metrics",
    "kube_horizontalpodautoscaler_status_current_replicas": "kube-state-metrics",
    "kube_horizontalpodautoscaler_spec_max_replicas": "kube-state-metrics",
    "kube_node_spec_taint": "kube-state-metrics",
    "kube_deployment_status_replicas_available": "kube-state-metrics",
    # docs/metrics/cluster/node-metrics.md (the gpu-health controller's capacity signal)
    "kube_node_status_capacity": "kube-state-metrics",
    "kube_node_status_allocatable": "kube-state-metrics",
    # docs/metrics/workload/pod-metrics.md (VllmTargetDown: only pods that were Ready)
    "kube_pod_status_ready": "kube-state-metrics",
    # Envoy's own statistics as its /stats/prometheus names them (envoy_ + the stat, dots
    # to underscores, the prefix or cluster as a label): HTTP connection manager statistics
    # (downstream_rq_total, downstream_rq_xx, downstream_rq_time), cluster statistics
    # (upstream_rq_pending_overflow) and the rate limit filter's (cluster.<c>.ratelimit.over_limit),
    # https://www.envoyproxy.io/docs/envoy/latest/configuration/observability/statistics
    "envoy_http_downstream_rq_total": "Envoy",
    "envoy_http_downstream_rq_xx": "Envoy",
    "envoy_http_downstream_rq_time_bucket": "Envoy",
    "envoy_cluster_upstream_rq_pending_overflow": "Envoy",
    "envoy_cluster_ratelimit_over_limit": "Envoy",
}


def vllm_reference() -> dict[str, str]:
    """name -> type, from the real scrape (lines `name type`)."""
    out = {}
    for line in (DATA / "vllm-0.32-metrics.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    assert len(out) > 50, "vllm-metrics.txt looks truncated"
    return out


def router_reference() -> dict[str, str]:
    """name -> type of vLLM Router 0.1.17's own exporter (a real scrape, data/SOURCES.md)."""
    out = dict(line.split() for line in (DATA / "vllm-router-0.1.17-metrics.txt").read_text().splitlines() if line.strip())
    assert "vllm_router_worker_health" in out
    return out


def dcgm_reference() -> set[str]:
    names = set()
    for csv in sorted((DATA / "dcgm-exporter").glob("*.csv")):
        for line in csv.read_text().splitlines():
            field = line.split(",", 1)[0].strip()
            if field.startswith("DCGM_FI_"):
                names.add(field)
    assert "DCGM_FI_DEV_GPU_UTIL" in names
    return names


def in_vllm(name: str, ref: dict[str, str]) -> bool:
    if name in ref:
        return True
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and ref.get(name[: -len(suffix)]) == "histogram":
            return True
    return False


def recorded_names(ctx) -> set[str]:
    return {r["record"] for g in monitoring.rule_groups(ctx)["recording"] for r in g["rules"]}


def referenced(ctx) -> dict[str, list[str]]:
    """metric name -> where it is read."""
    out: dict[str, list[str]] = {}
    for where, expr in queries.all_queries(ctx):
        for name in monitoring.metric_names(expr):
            out.setdefault(name, []).append(where)
    return out


@pytest.mark.parametrize(
    "expr, expected",
    [
        ('sum(rate(vllm:request_success_total{namespace="a",job="vllm"}[2m]))', {"vllm:request_success_total"}),
        ("histogram_quantile(0.99, sum by (namespace, le) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))",
         {"vllm:e2e_request_latency_seconds_bucket"}),
        ('a:b:c{x="sum(up)"} > 1.5e-3 * (d offset 1d) and on (pod) e unless ignoring(le) f',
         {"a:b:c", "d", "e", "f"}),
        ('label_replace(x > 2, "latency", "ttft", "", "") or vector(0)', {"x"}),
        ("max by (node, gpu, UUID) (DCGM_FI_DEV_XID_ERRORS{job=\"dcgm-exporter\"}) > 0", {"DCGM_FI_DEV_XID_ERRORS"}),
        ("deriv(w[10m:1m]) > 0 and w > 0", {"w"}),
    ],
)
def test_metric_names_are_extracted(expr, expected):
    assert monitoring.metric_names(expr) == expected


@pytest.mark.parametrize("stack", STACKS)
def test_every_metric_read_exists_in_its_source(stack):
    ctx = ctx_for(stack)
    vllm, dcgm, recorded = vllm_reference(), dcgm_reference(), recorded_names(ctx)
    router = router_reference()
    unknown = {
        name: where
        for name, where in referenced(ctx).items()
        if not (in_vllm(name, vllm) or in_vllm(name, router) or name in dcgm or name in recorded or name in ALLOWED)
    }
    assert not unknown, f"metrics that exist nowhere we know: {unknown}"


def test_the_check_rejects_a_renamed_metric():
    # vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc: the old name
    # must not pass, nor a histogram suffix on a gauge.
    ref = vllm_reference()
    assert not in_vllm("vllm:gpu_cache_usage_perc", ref)
    assert in_vllm("vllm:kv_cache_usage_perc", ref)
    assert not in_vllm("vllm:kv_cache_usage_perc_bucket", ref)
    assert in_vllm("vllm:inter_token_latency_seconds_bucket", ref)


def test_every_recorded_series_read_is_defined():
    ctx = ctx_for("dev")
    recorded = recorded_names(ctx)
    read = {n for n in referenced(ctx) if n.count(":") >= 2 or n.startswith(("namespace", "node"))}
    assert read - recorded == set()


# ----------------------------------------------------------------------------- live


@pytest.fixture(scope="module")
def server(vllm_server, tiny_deepseek_v2):
    # The same arguments as tests/test_serving_vllm.py (the dev stack's rendered engine
    # arguments), so the session's server pool starts one server for both.
    s = load("dev")
    ctx = build_context(build_plan(s), image_repository="r.example/ns/repo")
    cfg = json.loads((tiny_deepseek_v2 / "config.json").read_text())
    a = engine_args.from_context(ctx, str(tiny_deepseek_v2))
    a = dataclasses.replace(a, max_model_len=cfg["max_position_embeddings"])
    args = engine_args.without_flags(engine_args.render(a), engine_args.GPU_ONLY_FLAGS | {"--host", "--port"})
    return ctx, vllm_server(tiny_deepseek_v2, args=args)


def _stream(url: str, body: dict) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        chunks = [line for line in r if line.startswith(b"data:")]
    return len(chunks)


@pytest.mark.integration
def test_live_vllm_exposes_every_vllm_metric_we_read(server):
    from prometheus_client.parser import text_string_to_metric_families

    ctx, srv = server
    name = ctx.served_model_name
    for i in range(3):
        status, _ = srv.post_json("/v1/completions", {"model": name, "prompt": "the quick brown fox",
                                                      "max_tokens": 8 + i, "temperature": 0})
        assert status == 200
    # A streamed request, and one refused as a client error (unknown model -> 404).
    assert _stream(srv.url + "/v1/completions", {"model": name, "prompt": "hello world", "max_tokens": 6,
                                                 "stream": True}) > 1
    status, _ = srv.post_json("/v1/completions", {"model": "no-such-model", "prompt": "x", "max_tokens": 1})
    assert 400 <= status < 500

    status, text = srv.get("/metrics")
    assert status == 200
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    scraped = {s.name for s in samples}

    wanted = {n for n in referenced(ctx) if n.startswith("vllm:")}
    assert len(wanted) >= 10
    assert wanted - scraped == set(), f"named in our queries but not served: {sorted(wanted - scraped)}"

    # The latency histograms actually counted the requests (not just declared).
    counts = {s.name: s.value for s in samples if s.name == "vllm:e2e_request_latency_seconds_count"}
    assert counts and sum(counts.values()) >= 4
    # Labels the queries rely on.
    waiting = [s for s in samples if s.name == "vllm:num_requests_waiting"]
    assert waiting and all(s.labels.get("model_name") == name for s in waiting)
    reasons = {s.labels.get("finished_reason") for s in samples if s.name == "vllm:request_success_total"}
    assert {"stop", "length"} <= reasons

    # http_requests_total: per handler, with status classes; our 5xx ratio reads "5xx".
    http = {(s.labels.get("handler"), s.labels.get("status")): s.value
            for s in samples if s.name == "http_requests_total"}
    assert http.get(("/v1/completions", "2xx"), 0) >= 4
    assert http.get(("/v1/completions", "4xx"), 0) >= 1
    assert all(re.fullmatch(r"[1-5]xx", status) for _, status in http), http
