"""Every PromQL query the workload ships, gathered for the checks that read them all
(metric names exist, promtool parses them).

May import: the renderers whose queries it gathers.
"""

from __future__ import annotations

from workloads.engine import autoscaling
from workloads.engine import rollout
from workloads.engine.context import ServingContext
from workloads.observability.monitoring import as_promql, dashboard, dashboard_queries, rule_groups


def all_queries(ctx: ServingContext) -> list[tuple[str, str]]:
    """(where, PromQL) for every query the workload ships: autoscaler triggers, canary
    analysis, recording and alert rules, dashboard panels (variables substituted)."""
    out: list[tuple[str, str]] = []
    for obj in autoscaling.render(ctx):
        for t in obj["spec"]["triggers"]:
            if t["type"] == "prometheus":
                out.append((f"ScaledObject trigger {t['name']}", t["metadata"]["query"]))
    for obj in rollout.render(ctx):
        if obj["kind"] == "AnalysisTemplate":
            for metric in obj["spec"]["metrics"]:
                q = metric["provider"]["prometheus"]["query"]
                out.append((f"AnalysisTemplate metric {metric['name']}", rollout.with_args(q)))
    for file, groups in rule_groups(ctx).items():
        for g in groups:
            for r in g["rules"]:
                out.append((f"{file} {g['name']} {r.get('record') or r.get('alert')}", r["expr"]))
    for title, q in dashboard_queries(dashboard(ctx)):
        out.append((f"dashboard {title}", as_promql(q)))
    return out
