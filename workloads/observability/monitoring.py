"""Monitoring of the serving workload: scrape configs, rules, alerts and a dashboard.

    render(ctx) -> list[dict]     Kubernetes objects (plain dicts), empty when disabled
    rule_file_content(ctx) -> str the same rules as one Prometheus rule file, for VMP
    rule_groups(ctx) -> dict      {"recording": [...groups], "alerts": [...groups]}
    dashboard(ctx) -> dict        the Grafana dashboard model
    all_queries(ctx)              every PromQL expression the workload ships, by origin
    metric_names(expr) -> set     metric names a PromQL expression reads

What is rendered, and where:

* dcgm-exporter as a DaemonSet in `settings.monitoring.namespace`, on GPU nodes only (it
  needs the NVIDIA driver; elsewhere it would crash-loop), with a PodMonitor;
* a PodMonitor for vLLM's `/metrics` in the serving namespace;
* PrometheusRule objects built from `workloads/observability/rules/*.yaml` (templates: `${name}` is
  filled from the settings at render time; the rendered text is what promtool checks);
* the Grafana dashboard `workloads/observability/dashboards/vllm.json` in a ConfigMap labelled
  `grafana_dashboard: "1"`, which the Grafana sidecar (kube-prometheus-stack) loads, with
  a request-id box and the searches that find that request's logs and trace
  (workloads/observability/telemetry.py).

Label conventions every query relies on (set by the PodMonitors below):

* vLLM series: `job="vllm"` (pod label app.kubernetes.io/name via `jobLabel`), the
  target's `namespace` and `pod`, plus `rollouts_pod_template_hash` (Argo Rollouts' pod
  label, which tells the canary's pods from the stable ones).
* DCGM series: `job="dcgm-exporter"`, `node` (the exporter pod's node), and, because the
  scrape honours the exporter's labels, `namespace`/`pod` of the pod *holding* the GPU
  (dcgm-exporter with DCGM_EXPORTER_KUBERNETES=true reads the kubelet's pod-resources).
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from typing import Any

import yaml

from runtime import gpu_health
from stacks.constants import ENTRY_NAMESPACE, GPU_MODEL_LABEL, GPU_RESOURCE, HTTP_PORT, MANAGED_BY, PART_OF, ROLE_LABEL
from workloads.supply_chain import mirror
from workloads.observability import telemetry
from stacks.plan.disaggregation import PD_ROLE_LABEL
from workloads.edge import gateway
from workloads.edge import router
from workloads.engine import triton
from workloads.supply_chain import versions
from workloads.engine.context import ServingContext
from workloads.engine.manifests import serving_selector
from workloads.platform.controllers import RATELIMIT_DEPLOYMENT, RATELIMIT_REPLICAS, REDIS_NAME, global_rate_limit
from workloads.observability.selectors import (  # noqa: F401  (re-exported: the selectors the rules use)
    DCGM_NAME,
    ROLLOUT_HASH_LABEL,
    ROLLOUT_HASH_POD_LABEL,
    VLLM_JOB,
    dcgm_selector,
    gpu_selector,
    hpa_name,
    vllm_selector,
)

# Upstream image (workloads/supply_chain/versions.py); pods pull the stack mirror's copy (workloads/supply_chain/mirror.py).
DCGM_EXPORTER_IMAGE = versions.DCGM_EXPORTER_IMAGE
DCGM_PORT = 9400
# Node labels and taint of the GPU pools (infra/cluster.py).
GPU_TAINT_KEY = GPU_RESOURCE
SCRAPE_INTERVAL = "15s"
# Envoy Gateway's proxies serve their stats in Prometheus format here (EnvoyProxy
# telemetry.metrics.prometheus, on by default; gateway.envoyproxy.io docs, "Proxy Metrics").
ENVOY_METRICS_PORT = 19001
ENVOY_METRICS_PATH = "/stats/prometheus"
ENVOY_JOB = "envoy-gateway"

RULE_FILES = ("recording", "alerts")
DASHBOARD_FILE = "vllm.json"

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


def _fmt_duration(minutes: int) -> str:
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def template_values(ctx: ServingContext) -> dict[str, str]:
    """What `${name}` stands for in the rule and dashboard templates."""
    m = ctx.settings.monitoring
    return {
        "ns": ctx.namespace,
        "release": ctx.release,
        "monitoring_ns": m.namespace,
        "vllm": vllm_selector(ctx),
        "router": router.selector(ctx),
        "gpu": gpu_selector(ctx),
        "dcgm": dcgm_selector(),
        "hpa": hpa_name(ctx),
        "model_class": ctx.plan.slo.model_class,
        "ttft_p99_seconds": _num(ctx.plan.slo.ttft_p99_seconds),
        "e2e_p99_seconds": _num(ctx.plan.slo.e2e_p99_seconds),
        "min_tokens_per_second": _num(ctx.plan.slo.min_tokens_per_second),
        "max_inter_token_seconds": _num(round(ctx.plan.slo.max_inter_token_seconds, 6)),
        "p99_regression_ratio": _num(m.p99_regression_ratio),
        "error_rate": _num(m.error_rate),
        "kv_cache_usage": _num(m.kv_cache_usage),
        "at_max_for": _fmt_duration(m.at_max_replicas_minutes),
        "triton_queue_seconds": _num(m.triton_queue_seconds),
        "entry_ns": ENTRY_NAMESPACE,
        "redis": REDIS_NAME,
        "ratelimit": RATELIMIT_DEPLOYMENT,
        "ratelimit_replicas": str(RATELIMIT_REPLICAS),
        "envoy": envoy_selector(),
        # the API listener's HTTP connection manager (Envoy Gateway names it http-<port>)
        "envoy_listener": f"http-{gateway.PROXY_CONTAINER_PORT}",
        # the XID classes of the controller's table, as label_replace regexes
        "xid_hardware": "|".join(map(str, gpu_health.xids_of(gpu_health.HARDWARE))),
        "xid_application": "|".join(map(str, gpu_health.xids_of(gpu_health.APPLICATION))),
    }


def envoy_selector() -> str:
    """Label matchers of the Envoy proxies' series (the PodMonitor below sets the job)."""
    return f'job="{ENVOY_JOB}",namespace="{ENTRY_NAMESPACE}"'


def _num(x: float) -> str:
    """A float as PromQL reads it, without binary noise (0.02, not 0.020000000000000004)."""
    return repr(float(x)).removesuffix(".0")


def fill(template: Any, values: dict[str, str]) -> Any:
    """Replace `${name}` in every string of a parsed YAML/JSON tree. Unknown names fail:
    a typo must not ship as a literal `${...}` inside a query."""

    def sub(s: str) -> str:
        def one(m: re.Match) -> str:
            if m.group(1) not in values:
                raise KeyError(f"unknown placeholder ${{{m.group(1)}}}; expected one of {sorted(values)}")
            return values[m.group(1)]

        return _PLACEHOLDER.sub(one, s)

    if isinstance(template, str):
        return sub(template)
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    if isinstance(template, dict):
        return {k: fill(v, values) for k, v in template.items()}
    return template


# ----------------------------------------------------------------------------- rules


def _package_text(*parts: str) -> str:
    return resources.files("workloads.observability").joinpath(*parts).read_text()


def _rules_file(name: str) -> dict:
    """A rules file as parsed, by libyaml's parser where PyYAML has it (the same document,
    several times faster: every preview reads them once per deploy phase)."""
    return yaml.load(_package_text("rules", f"{name}.yaml"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def rule_groups(ctx: ServingContext) -> dict[str, list[dict]]:
    """The rule groups of each file in workloads/observability/rules/, filled from the settings.

    Without autoscaling there is no HPA, so the replicas-at-max group is left out; without
    the global rate limit there is no Redis to watch."""
    values = template_values(ctx)
    out = {}
    for name in RULE_FILES:
        groups = fill(_rules_file(name)["groups"], values)
        if not ctx.settings.autoscaling.enabled:
            groups = [g for g in groups if g["name"] != "serving.autoscaling"]
        if not global_rate_limit(ctx.settings):  # no Redis without the global rate limit
            groups = [g for g in groups if g["name"] != "gateway.ratelimit"]
        if not ctx.settings.serving.in_cluster_gateway:  # no Envoy proxies to read
            groups = [g for g in groups if g["name"] not in ("gateway.recording", "gateway.slo")]
        if not router.enabled(ctx):  # no routing tier to watch
            groups = [g for g in groups if g["name"] != "serving.router"]
        out[name] = groups
    if triton.enabled(ctx):
        out = _for_triton(out, values)
    return out


def _for_triton(files: dict[str, list[dict]], values: dict[str, str]) -> dict[str, list[dict]]:
    """Behind Triton: leave out every rule that reads a vLLM series Triton does not export
    (or a recorded series so left out), and add workloads/observability/rules/triton.yaml."""
    dropped: set[str] = set()

    def readable(rule: dict) -> bool:
        for name in metric_names(rule["expr"]):
            if name in dropped or name == "http_requests_total":
                return False
            if name.startswith("vllm:") and not triton.exports(name):
                return False
        return True

    out = {}
    for name, groups in files.items():  # recording first: alerts read what it records
        kept = []
        for g in groups:
            rules = []
            for r in g["rules"]:
                if readable(r):
                    rules.append(r)
                elif "record" in r:
                    dropped.add(r["record"])
            if rules:
                kept.append({**g, "rules": rules})
        out[name] = kept
    extra = fill(_rules_file("triton")["groups"], values)
    out["recording"] += [g for g in extra if not any("alert" in r for r in g["rules"])]
    out["alerts"] += [g for g in extra if any("alert" in r for r in g["rules"])]
    return out


def rule_file_content(ctx: ServingContext) -> str:
    """All groups as one Prometheus rule file (the format VMP's RuleFile takes)."""
    groups = [g for gs in rule_groups(ctx).values() for g in gs]
    # libyaml's emitter when PyYAML has it (the same text, a tenth of the time)
    return yaml.dump({"groups": groups}, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                     sort_keys=False, width=1000)


def alert_names(ctx: ServingContext) -> list[str]:
    return [r["alert"] for g in rule_groups(ctx)["alerts"] for r in g["rules"] if "alert" in r]


# ----------------------------------------------------------------------------- dashboard


def dashboard(ctx: ServingContext) -> dict:
    """The Grafana dashboard, its namespace variable defaulting to the serving namespace."""
    model = json.loads(_package_text("dashboards", DASHBOARD_FILE))
    for var in model["templating"]["list"]:
        if var["name"] == "namespace":
            var["current"] = {"selected": True, "text": ctx.namespace, "value": ctx.namespace}
    return telemetry.add_request_links(model, ctx.plan)


def dashboard_queries(model: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target, plus the template variables' queries."""
    out = []
    for panel in model["panels"]:
        for t in panel.get("targets", []):
            out.append((panel["title"], t["expr"]))
    for var in model["templating"]["list"]:
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"variable {var['name']}", q))
    return out


# Grafana variables in dashboard queries, and what stands in for them when the queries
# are checked as plain PromQL (promtool and the metric-name test).
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$namespace": "deepseek-serving",
    "$model_name": "deepseek",
    "$node": "node-0",
}
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$", re.S)


def as_promql(expr: str) -> str:
    """A dashboard query as PromQL: variables substituted, `label_values(q, l)` -> q."""
    for var, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    m = _LABEL_VALUES.match(expr.strip())
    if m:
        expr = m.group(1) or "up"
    return expr


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:]|\s*\()")
_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2", "start", "end",
}


def metric_names(expr: str) -> set[str]:
    """Metric names read by a PromQL expression.

    Strips string literals, label matchers, range/subquery brackets and grouping label
    lists; what is left that is an identifier not followed by `(` (a function call) and
    not a keyword is a metric name. Enough for the expressions we write (tested in
    tests/test_metrics_contract.py against hand-listed answers)."""
    s = _STRING.sub('""', expr)
    s = _MATCHERS.sub("", s)
    s = _RANGE.sub("", s)
    s = _GROUPING.sub("", s)
    s = re.sub(r"\boffset\s+-?\w+", "", s)
    return {n for n in _IDENT.findall(s) if n.lower() not in _KEYWORDS}


# ----------------------------------------------------------------------------- objects


def _monitor_labels(ctx: ServingContext, component: str) -> dict[str, str]:
    # Extra labels so the Prometheus' rule/monitor selectors pick these objects up.
    return {**ctx.labels(component), **ctx.settings.monitoring.selector_labels}


def vllm_pod_monitor(ctx: ServingContext) -> dict:

    # The pods that answer HTTP: with a LeaderWorkerSet only the group leaders run the
    # API server; the workers have no /metrics and would show as targets down.
    selector: dict[str, Any] = {"matchLabels": serving_selector(ctx)}
    if ctx.plan.disaggregation is not None:
        # each side spans nodes or not on its own: every serving pod but a group's workers
        selector = {"matchLabels": ctx.selector("server"),
                    "matchExpressions": [{"key": ROLE_LABEL, "operator": "NotIn", "values": ["worker"]}]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": f"{ctx.release}-vllm",
            "namespace": ctx.namespace,
            "labels": _monitor_labels(ctx, "monitoring"),
        },
        "spec": {
            "selector": selector,
            "jobLabel": "app.kubernetes.io/name",  # job="vllm"
            # the side of a disaggregated stack (deepseek_volc_pd_role): each side scales on its own series
            "podTargetLabels": [ROLLOUT_HASH_POD_LABEL, "app.kubernetes.io/instance", PD_ROLE_LABEL],
            "podMetricsEndpoints": [
                {"portNumber": HTTP_PORT, "path": "/metrics", "interval": SCRAPE_INTERVAL,
                 # Triton labels its series `model`; vLLM (and every rule) says `model_name`.
                 **({"metricRelabelings": [{"sourceLabels": ["model"], "regex": "(.+)", "targetLabel": "model_name",
                                            "replacement": "$1", "action": "replace"}]}
                    if triton.enabled(ctx) else {})},
            ],
        },
    }


def _dcgm_labels(ctx: ServingContext) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": DCGM_NAME,
        "app.kubernetes.io/instance": f"{ctx.release}-{DCGM_NAME}",
        "app.kubernetes.io/component": "gpu-metrics",
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


# What dcgm-exporter runs with, and why (docs/operations.md "dcgm-exporter privileges"):
#   runAsUser 0   the kubelet's pod-resources socket (which pod holds which GPU) is root's;
#   SYS_ADMIN     only for DCGM's profiling (DCP) fields, and only when the stack asks for
#                 them: NVIDIA's manifest adds it for those alone (NVIDIA/dcgm-exporter
#                 dcgm-exporter.yaml and docker/dcgm-exporter-entrypoint.sh at tag 4.2.3-4.1.3,
#                 commit dcbb9276f0a5f380030dc129f043e5d9c25c3045; issue #165 for NVIDIA's
#                 explanation); without it the exporter logs that it skips them and serves the
#                 rest;
#   everything else is dropped; no privilege escalation; the runtime's default seccomp.
# The root filesystem stays writable: the image's entrypoint runs `ldconfig` (rewrites
# /etc/ld.so.cache, to find the driver's libraries the NVIDIA runtime mounts) and, unless
# NO_SETCAP is set, `setcap` on its binary, both under `set -e`.
DCGM_PROFILING_CAPABILITIES = ("SYS_ADMIN",)


def dcgm_security(profiling: bool) -> dict:
    caps: dict = {"drop": ["ALL"]}
    if profiling:
        caps["add"] = list(DCGM_PROFILING_CAPABILITIES)
    return {"runAsNonRoot": False, "runAsUser": 0, "allowPrivilegeEscalation": False,
            "capabilities": caps, "seccompProfile": {"type": "RuntimeDefault"}}


def dcgm_exporter(ctx: ServingContext) -> list[dict]:
    ns = ctx.settings.monitoring.namespace
    profiling = ctx.settings.monitoring.dcgm_profiling_metrics
    labels = _dcgm_labels(ctx)
    selector = {"app.kubernetes.io/name": DCGM_NAME}
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": DCGM_NAME, "namespace": ns, "labels": labels},
        "automountServiceAccountToken": False,
    }
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": DCGM_NAME, "namespace": ns, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": DCGM_NAME,
                    "automountServiceAccountToken": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "priorityClassName": "system-node-critical",
                    # GPU nodes only: the pools carry the gpu-model label and the GPU taint.
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchExpressions": [{"key": GPU_MODEL_LABEL, "operator": "Exists"}]}
                                ]
                            }
                        }
                    },
                    # The GPU taint, and the gpu-health quarantine: the exporter must keep
                    # reporting a quarantined node (a restarted exporter pod must land there
                    # again), or the node's signals would vanish instead of clearing.
                    "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
                                    {"key": gpu_health.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": DCGM_NAME,
                            "image": mirror.ref(ctx.plan, "dcgm-exporter"),
                            "env": [
                                {"name": "DCGM_EXPORTER_LISTEN", "value": f":{DCGM_PORT}"},
                                # Label each GPU's series with the pod holding it.
                                {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
                                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                # Without SYS_ADMIN the entrypoint's setcap can only fail: skip it.
                                *([] if profiling else [{"name": "NO_SETCAP", "value": "1"}]),
                            ],
                            "ports": [{"name": "metrics", "containerPort": DCGM_PORT}],
                            "securityContext": dcgm_security(profiling),
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "256Mi"},
                                "limits": {"cpu": "500m", "memory": "1Gi"},
                            },
                            "readinessProbe": {"httpGet": {"path": "/health", "port": DCGM_PORT},
                                               "initialDelaySeconds": 15, "periodSeconds": 10},
                            "livenessProbe": {"httpGet": {"path": "/health", "port": DCGM_PORT},
                                              "initialDelaySeconds": 30, "periodSeconds": 20,
                                              "timeoutSeconds": 5, "failureThreshold": 6},
                            "volumeMounts": [{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                              "readOnly": True}],
                        }
                    ],
                    "volumes": [{"name": "pod-resources",
                                 "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}}],
                },
            },
        },
    }
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": DCGM_NAME, "namespace": ns, "labels": _monitor_labels(ctx, "monitoring")},
        "spec": {
            "selector": {"matchLabels": selector},
            "jobLabel": "app.kubernetes.io/name",  # job="dcgm-exporter"
            "podMetricsEndpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": SCRAPE_INTERVAL,
                    # Keep the exporter's namespace/pod/container: they name the pod holding
                    # the GPU, which is what the autoscaler and dashboards select on.
                    "honorLabels": True,
                    "relabelings": [
                        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
                         "action": "replace"}
                    ],
                }
            ],
        },
    }
    return [sa, ds, monitor]


def envoy_pod_monitor(ctx: ServingContext) -> list[dict]:
    """Envoy Gateway's proxies of our Gateway (in its namespace), on their stats port: what
    clients see, including the answers the gateway gives itself (401, 429, 500, 503, 504)."""
    if not ctx.settings.serving.in_cluster_gateway:
        return []
    return [{
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": f"{ctx.release}-envoy", "namespace": ctx.settings.monitoring.namespace,
                     "labels": _monitor_labels(ctx, "monitoring")},
        "spec": {
            "selector": {"matchLabels": gateway.proxy_selector(ctx)},
            "namespaceSelector": {"matchNames": [ENTRY_NAMESPACE]},
            "podMetricsEndpoints": [{
                "portNumber": ENVOY_METRICS_PORT, "path": ENVOY_METRICS_PATH, "interval": SCRAPE_INTERVAL,
                "relabelings": [{"targetLabel": "job", "replacement": ENVOY_JOB, "action": "replace"}],
            }],
        },
    }]


def prometheus_rules(ctx: ServingContext) -> list[dict]:
    ns = ctx.settings.monitoring.namespace
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": f"{ctx.release}-{name}", "namespace": ns, "labels": _monitor_labels(ctx, "monitoring")},
            "spec": {"groups": copy.deepcopy(groups)},
        }
        for name, groups in rule_groups(ctx).items()
    ]


def dashboard_configmap(ctx: ServingContext) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{ctx.release}-dashboard",
            "namespace": ctx.settings.monitoring.namespace,
            # The label kube-prometheus-stack's Grafana sidecar watches for by default.
            "labels": {**ctx.labels("monitoring"), "grafana_dashboard": "1"},
        },
        "data": {f"{ctx.release}-vllm.json": json.dumps(dashboard(ctx), indent=1, sort_keys=True)},
    }


def render(ctx: ServingContext) -> list[dict]:
    if not ctx.settings.monitoring.enabled:
        return []
    return [
        vllm_pod_monitor(ctx),
        *envoy_pod_monitor(ctx),
        *dcgm_exporter(ctx),
        *prometheus_rules(ctx),
        dashboard_configmap(ctx),
    ]
