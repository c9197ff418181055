"""Canary rollout of new serving versions with Argo Rollouts.

    render(ctx) -> list[dict]   Rollout + AnalysisTemplate, or [] (disabled / multi-node)
    steps(ctx) -> list[dict]    the canary steps (setWeight / pause) from settings.rollout
    analysis_template(ctx)      the AnalysisTemplate with the two Prometheus metrics
    with_args(query, hash)      an analysis query with its `{{args.*}}` filled, as PromQL

Why Argo Rollouts (and not weights on the gateway driven by our own loop): the abort
has to happen without us. Argo Rollouts owns the whole loop: it scales a canary
ReplicaSet from the lead's pod template, moves traffic in steps by editing the weights
of the in-cluster HTTPRoute (Gateway API plugin), runs the analysis in the background,
and on failure sets the canary weight back to 0 and scales it away, leaving the stable
pods, which were never scaled down, serving everything.

The Rollout points at the serving Deployment (`workloadRef`), so the pod template lives
in one place (workloads/engine/manifests.py); Argo scales that Deployment down as the Rollout
takes over (`scaleDown: progressively`). Multi-node models run as a LeaderWorkerSet,
which Argo cannot manage: they use LWS's own rolling update, group by group, with
`rollout.partition` for a staged release (docs/operations.md).

Which pods the stable and canary Services select (`service_selectors`). Under Argo both
start from the same selector and Argo adds its `rollouts-pod-template-hash` to each during
a rollout. A LeaderWorkerSet has no such controller, and both Services selected the same
leaders, so the canary weight and the A/B header reached every group alike. Its pod
templates carry TRACK_LABEL instead: `canary` while `rollout.partition` holds groups back,
`stable` otherwise. The groups below the partition keep the template they were started
with (`stable`), the groups the update replaced carry `canary`, and during a staged
release each Service selects its own track. With no partition there is no canary: both
Services select every leader (a plain rolling update's new and old groups alike, as
Argo's Services do between rollouts). Promoting (`partition: 0`) changes the label back
to `stable`, which restarts the canary groups once more with the rest.

The A/B header (`gateway.ab_header`) reaches the canary through a header route Argo adds
after its first canary weight and removes at its end (`setHeaderRoute`, `managedRoutes`);
`pulumi up` leaves the route's weights to Argo (workloads/edge/gateway.py
`ignored_changes`).

What the analysis measures, on the canary's pods only (Prometheus label
`rollouts_pod_template_hash`, copied from Argo's pod label by the vLLM PodMonitor):

* 5xx ratio: `http_requests_total{status="5xx"}` over all `/v1/...` requests, as counted
  by vLLM's own API server (prometheus-fastapi-instrumentator, status grouped as
  2xx/4xx/5xx). Chosen over `vllm:request_success_total{finished_reason="error"}`, which
  counts only engine-side failures that reached the output stage, and over the gateway's
  Envoy metrics, which name the upstream by a generated cluster name and would need the
  gateway's own monitor. A canary that never becomes Ready receives no traffic and is
  caught by `progressDeadlineAbort` instead.
* P99 end-to-end latency from `vllm:e2e_request_latency_seconds_bucket`.

No traffic in the window reads as 0 (pass): at 5% weight a quiet hour would otherwise
fail a healthy canary. The next, larger step gets the traffic and the verdict.
"""

from __future__ import annotations

from stacks.constants import TRACK_LABEL
from workloads.engine.context import ServingContext
from workloads.edge.gateway import AB_RULE
from workloads.observability.selectors import ROLLOUT_HASH_LABEL, vllm_selector

GATEWAY_API_PLUGIN = "argoproj-labs/gatewayAPI"
HASH_ARG = "canary-hash"


def staged(ctx: ServingContext) -> bool:
    """A staged multi-node release is running: groups below the partition are held back."""
    return ctx.multi_node and ctx.settings.rollout.partition > 0


def track_labels(ctx: ServingContext) -> dict[str, str]:
    """Labels of a multi-node group's pod templates: the track the groups this template
    starts belong to (nothing for single-node replicas, where Argo tells them apart)."""
    if not ctx.multi_node:
        return {}
    return {TRACK_LABEL: "canary" if staged(ctx) else "stable"}


def service_selectors(ctx: ServingContext, serving: dict[str, str]) -> dict[str, dict[str, str]]:
    """Selector of the stable and canary Services, from the selector of the pods that
    answer HTTP: narrowed to each track during a staged multi-node release, else the same
    (Argo narrows its own)."""
    if not staged(ctx):
        return {ctx.stable_service: dict(serving), ctx.canary_service: dict(serving)}
    return {ctx.stable_service: {**serving, TRACK_LABEL: "stable"},
            ctx.canary_service: {**serving, TRACK_LABEL: "canary"}}


def template_name(ctx: ServingContext) -> str:
    return f"{ctx.release}-canary"


def _window(ctx: ServingContext) -> str:
    # Two analysis intervals, at least 2 minutes (8 scrapes at 15 s), so a rate always
    # has enough samples and each measurement overlaps the previous one.
    return f"{max(2 * ctx.settings.rollout.analysis_interval_seconds, 120)}s"


def error_rate_query(ctx: ServingContext) -> str:
    w = _window(ctx)
    if ctx.settings.serving.server == "triton":
        # Behind Triton there is no HTTP status counter: failed over all requests Triton saw.
        sel = f'{vllm_selector(ctx)},{ROLLOUT_HASH_LABEL}="{{{{args.{HASH_ARG}}}}}"'
        return (
            f"(sum(rate(nv_inference_request_failure{{{sel}}}[{w}])) or vector(0))\n"
            f"  / (sum(rate(nv_inference_request_success{{{sel}}}[{w}])) + "
            f"(sum(rate(nv_inference_request_failure{{{sel}}}[{w}])) or vector(0)) > 0)\n"
            f"or vector(0)"
        )
    sel = f'{vllm_selector(ctx)},{ROLLOUT_HASH_LABEL}="{{{{args.{HASH_ARG}}}}}",handler=~"/v1/.+"'
    return (
        f'(sum(rate(http_requests_total{{{sel},status="5xx"}}[{w}])) or vector(0))\n'
        f"  / (sum(rate(http_requests_total{{{sel}}}[{w}])) > 0)\n"
        f"or vector(0)"
    )


def p99_latency_query(ctx: ServingContext) -> str:
    sel = f'{vllm_selector(ctx)},{ROLLOUT_HASH_LABEL}="{{{{args.{HASH_ARG}}}}}"'
    # `>= 0` drops the NaN histogram_quantile returns when no request finished.
    return (
        f"(histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{{{sel}}}"
        f"[{_window(ctx)}]))) >= 0)\n"
        f"or vector(0)"
    )


def with_args(query: str, canary_hash: str = "5d8f9c7b6") -> str:
    """The query as Argo sends it once `{{args.canary-hash}}` is resolved."""
    return query.replace(f"{{{{args.{HASH_ARG}}}}}", canary_hash)


def analysis_template(ctx: ServingContext) -> dict:
    r = ctx.settings.rollout
    address = ctx.settings.monitoring.prometheus_url

    def metric(name: str, query: str, limit: float) -> dict:
        return {
            "name": name,
            "interval": f"{r.analysis_interval_seconds}s",
            "failureLimit": r.failure_limit,
            # Both queries end in `or vector(0)`, so result always has one element.
            "successCondition": f"result[0] <= {limit:g}",
            "provider": {"prometheus": {"address": address, "query": query}},
        }

    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": ctx.metadata(template_name(ctx), "rollout"),
        "spec": {
            "args": [{"name": HASH_ARG}],
            "metrics": [
                metric("error-rate", error_rate_query(ctx), r.max_error_rate),
                metric("p99-latency", p99_latency_query(ctx), ctx.plan.slo.canary_p99_seconds),
            ],
        },
    }


def header_route_step(ctx: ServingContext) -> dict:
    """The A/B rule, as a route Argo manages: from the first canary weight on, requests with
    the A/B header go to the canary pods; when the rollout ends (promoted or aborted) Argo
    removes the rule and they follow the weighted split again (all stable)."""
    ab = ctx.settings.gateway.ab_header
    return {"setHeaderRoute": {"name": AB_RULE, "match": [{"headerName": ab.name, "headerValue": {"exact": ab.value}}]}}


def steps(ctx: ServingContext) -> list[dict]:
    """setWeight / pause per rollout.steps, with the A/B header route added right after the
    first weight: by then the canary pods exist (Argo scales them with the first weight
    and waits for them), so header requests never meet an empty canary Service."""
    r = ctx.settings.rollout
    out: list[dict] = []
    for i, weight in enumerate(r.steps):
        out.append({"setWeight": weight})
        if i == 0:
            out.append(header_route_step(ctx))
        if i < len(r.steps) - 1:  # after the last (100%) step the Rollout is promoted
            out.append({"pause": {"duration": f"{r.pause_seconds}s"}})
    return out


def rollout(ctx: ServingContext) -> dict:
    spec: dict = {
        "selector": {"matchLabels": ctx.selector("server")},
        "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": ctx.release,
                        "scaleDown": "progressively"},
        "revisionHistoryLimit": 3,
        # A canary pod may take the whole startup budget to load the model; past that,
        # give up and abort rather than sit half-rolled-out.
        "progressDeadlineSeconds": ctx.settings.serving.startup_timeout_seconds + 600,
        "progressDeadlineAbort": True,
        "strategy": {
            "canary": {
                "canaryService": ctx.canary_service,
                "stableService": ctx.stable_service,
                "trafficRouting": {
                    "managedRoutes": [{"name": AB_RULE}],
                    "plugins": {GATEWAY_API_PLUGIN: {
                        "httpRoutes": [{"name": ctx.release, "useHeaderRoutes": True}],
                        "namespace": ctx.namespace,
                    }},
                },
                # Scale the stable down as its traffic share falls, so a rollout needs one
                # replica of room in the GPU pool, not a second fleet (settings check it).
                "dynamicStableScale": True,
                "analysis": {
                    "templates": [{"templateName": template_name(ctx)}],
                    # Start once the first weight is set: step 0 is that setWeight, step 1 the
                    # header route, step 2 the pause.
                    "startingStep": 1,
                    "args": [{"name": HASH_ARG, "valueFrom": {"podTemplateHashValue": "Latest"}}],
                },
                "steps": steps(ctx),
            }
        },
    }
    if not ctx.settings.autoscaling.enabled:
        # With autoscaling on, KEDA owns spec.replicas (its HPA lifts it to the minimum).
        spec["replicas"] = ctx.settings.serving.replicas
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": ctx.metadata(ctx.release, "rollout"),
        "spec": spec,
    }


def render(ctx: ServingContext) -> list[dict]:
    if not ctx.plan.rollout.argo:
        return []
    return [rollout(ctx), analysis_template(ctx)]
