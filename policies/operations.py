"""Operations: the model server autoscales within sane bounds, and someone is paged when
latency or errors go bad."""

from __future__ import annotations

import re

from .common import (
    cfg,
    dig,
    items,
    k8s_kind,
    name_of,
    number,
    of_kind,
    serving_workloads,
    stack_policy,
)


def _scalers_for(resources, w) -> list:
    """ScaledObjects / HPAs whose target is the workload or the Rollout owning its pods."""
    kind = k8s_kind(w.resource_type)
    name = dig(w.props, "metadata", "name")
    ns = dig(w.props, "metadata", "namespace")
    targets = {(kind, name)}
    for r in of_kind(resources, "Rollout"):
        ref = dig(r.props, "spec", "workloadRef", default={})
        if dig(ref, "name") == name and dig(ref, "kind", default="Deployment") == kind:
            targets.add(("Rollout", dig(r.props, "metadata", "name")))
    out = []
    for s in of_kind(resources, "ScaledObject") + of_kind(resources, "HorizontalPodAutoscaler"):
        ref = dig(s.props, "spec", "scaleTargetRef", default={})
        if dig(s.props, "metadata", "namespace") == ns and (
                dig(ref, "kind", default="Deployment"), dig(ref, "name")) in targets:
            out.append(s)
    return out


def _bounds(s) -> tuple[float, float]:
    if k8s_kind(s.resource_type) == "ScaledObject":
        # KEDA defaults: minReplicaCount 0, maxReplicaCount 100
        return number(dig(s.props, "spec", "minReplicaCount"), 0.0), number(dig(s.props, "spec", "maxReplicaCount"), 100.0)
    return number(dig(s.props, "spec", "minReplicas"), 1.0), number(dig(s.props, "spec", "maxReplicas"), 0.0)


def _autoscaler(args, report):
    for w in serving_workloads(args.resources):
        scalers = _scalers_for(args.resources, w)
        if not scalers:
            report(f"{k8s_kind(w.resource_type)} {name_of(w.props)} has no autoscaler: a traffic spike queues "
                   "until someone notices. Fix: set autoscaling.enabled: true (a KEDA ScaledObject on queue "
                   "depth).", w.urn)
            continue
        for s in scalers:
            lo, hi = _bounds(s)
            no_trigger = k8s_kind(s.resource_type) == "ScaledObject" and not items(dig(s.props, "spec", "triggers"))
            if lo > hi or hi < 1 or no_trigger:
                report(f"{k8s_kind(s.resource_type)} {name_of(s.props)} scales between {lo:g} and {hi:g} replicas "
                       "(or has no trigger). Fix: autoscaling.min_replicas <= autoscaling.max_replicas, max >= 1, "
                       "with at least one trigger.", s.urn)


def _alerts(args, report):
    latency = re.compile(cfg(args, "latencyPattern", r"time_to_first_token|e2e_request_latency|inter_token_latency"))
    errors = re.compile(cfg(args, "errorPattern", r"5xx|error|finished_reason=\"abort\""))
    found = {"latency": [], "errors": []}
    for rule in of_kind(args.resources, "PrometheusRule"):
        for group in items(dig(rule.props, "spec", "groups")):
            for r in items(dig(group, "rules")):
                if dig(r, "alert") is None:
                    continue
                expr = str(dig(r, "expr", default=""))
                if not dig(r, "labels", "severity"):
                    continue  # an alert nobody routes
                if latency.search(expr):
                    found["latency"].append(dig(r, "alert"))
                if errors.search(expr):
                    found["errors"].append(dig(r, "alert"))
    if not serving_workloads(args.resources):
        return
    for what, alerts in found.items():
        if not alerts:
            report(f"no alert with a severity label watches serving {what}: a broken model server pages nobody. "
                   "Fix: set monitoring.enabled: true (workloads/observability/rules/alerts.yaml holds the latency and error "
                   "alerts).")


HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


def _critical_receivers(route, inherited: str | None = None) -> set[str]:
    """Receivers a `severity="critical"` alert reaches in an Alertmanager route tree."""
    receiver = str(dig(route, "receiver", default=inherited or ""))
    found: set[str] = set()
    for child in items(dig(route, "routes")):
        matchers = [str(m).replace(" ", "") for m in items(dig(child, "matchers"))]
        if any(m.startswith("severity") and m not in ('severity="critical"', 'severity=~"critical"',
                                                         "severity=critical") for m in matchers):
            continue  # a route for another severity
        if any(not m.startswith("severity") for m in matchers):
            continue  # narrower than "every critical" (Watchdog, one alert)
        got = _critical_receivers(child, receiver)
        found |= got
        if got and dig(child, "continue") is not True:
            return found
    return found or ({receiver} if receiver else set())


def _alerts_delivered(args, report):
    if not of_kind(args.resources, "PrometheusRule"):
        return  # nothing alerts (alerts-latency-and-errors says so)
    for rel in args.resources:
        chart = str(dig(rel.props, "chart", default=""))
        if rel.resource_type != HELM_RELEASE or chart.rsplit("/", 1)[-1] != "kube-prometheus-stack":
            continue  # (the chart is named, or referenced in an OCI registry)
        route = dig(rel.props, "values", "alertmanager", "config", "route")
        receivers = _critical_receivers(route) - {"null", ""} if route is not None else set()
        if not receivers:
            report("Alertmanager routes critical alerts to no receiver (\"null\"): the alerts fire and nobody "
                   "is paged. Fix: define alerting.receivers and list the pager in alerting.critical "
                   "(docs/operations.md, Alert delivery).", rel.urn)


POLICIES = [
    stack_policy(
        "alerts-delivered",
        "Alertmanager sends critical alerts to at least one receiver.",
        _alerts_delivered,
        fix="Set alerting.receivers and alerting.critical.",
        tags=["operations"],
    ),
    stack_policy(
        "autoscaler-present",
        "The model server has an autoscaler with min <= max and a trigger.",
        _autoscaler,
        fix="Enable autoscaling with min_replicas <= max_replicas.",
        tags=["operations"],
    ),
    stack_policy(
        "alerts-latency-and-errors",
        "Alerts (with a severity) exist for serving latency and for errors.",
        _alerts,
        fix="Enable monitoring; keep the latency and error alert groups.",
        config={
            "latencyPattern": {"type": "string", "description": "regex an alert expression about latency matches",
                               "default": r"time_to_first_token|e2e_request_latency|inter_token_latency"},
            "errorPattern": {"type": "string", "description": "regex an alert expression about errors matches",
                             "default": r"5xx|error|finished_reason=\"abort\""},
        },
        tags=["operations"],
    ),
]
