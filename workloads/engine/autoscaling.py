"""Replica autoscaling of the serving workload: a KEDA ScaledObject on Prometheus.

    render(ctx) -> list[dict]       the ScaledObject, or [] when autoscaling is disabled
    scale_target(ctx) -> dict       the object KEDA scales (apiVersion, kind, name)
    triggers(ctx) -> list[dict]     the Prometheus triggers

Signals, in the order they matter (settings.autoscaling):

1. waiting requests per replica (`vllm:num_requests_waiting`): requests the engine has
   accepted but cannot schedule, because the batch or the KV cache is full. This is the
   signal that users are about to wait; it is zero while there is headroom.
2. request rate per replica (finished requests/s, `vllm:request_success_total`): scales
   ahead of the queue when traffic ramps.
3. KV cache usage (`vllm:kv_cache_usage_perc`, the share of KV blocks held by running
   requests), the saturation signal: it grows with the tokens in flight, and past ~90%
   the engine stops admitting and starts preempting. GPU utilisation is no such signal:
   vLLM keeps a GPU near 100% busy with a single request decoding
   (NVIDIA/dcgm-exporter#301), so it cannot tell one user from a thousand.

The HPA KEDA creates takes the largest replica count any trigger asks for. The first two
are `AverageValue` targets: the query returns the release's total and the HPA divides by
the current replica count, i.e. the threshold is per replica. The KV trigger is a `Value`
target on the mean over the release's engines (desired = current x mean / target).

Blind is not idle. A Prometheus that answers with no series (restarted empty, its scrape
of the engines broken) read as 0 under KEDA's default `ignoreNullValues: true`, and after
the scale-down window the fleet went to its minimum on no data. Here an empty answer is a
failure, like an unreachable Prometheus, and `fallback` (behaviour
`currentReplicasIfHigher`, replicas = the minimum) makes KEDA report, after
`autoscaling.fallback_after_failures` failed polls, the value that keeps the current count
for that trigger: the fleet stays where it is (never below the minimum) and the triggers
that still answer may scale it up. Before the threshold the HPA itself refuses to scale
down on a failed metric (kubernetes pkg/controller/podautoscaler/horizontal.go).

A scale-down stabilisation window longer than a model load (settings default 30 min;
a 671B model takes ~10-20 min to load) keeps a replica that is still loading, or just
loaded, from being removed by a lull that its own absence caused. New GPU nodes for
new replicas come from the GPU node pools' autoscaling (infra/cluster.py): pods that do
not fit stay Pending and the pool grows up to its max_nodes.
"""

from __future__ import annotations

from workloads.engine.context import ServingContext
from workloads.observability.selectors import hpa_name, vllm_selector

# Window of the request-rate query: long enough to hold 8 scrapes at 15 s, short enough
# to follow a ramp within the scale-up stabilisation.
RATE_WINDOW = "2m"


def scale_target(ctx: ServingContext) -> dict:
    """What KEDA scales: the LeaderWorkerSet for multi-node models (Argo Rollouts cannot
    manage one; it has a scale subresource and its own rolling update), else the Argo
    Rollout when canaries are on, else the Deployment."""
    if ctx.multi_node:
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": ctx.release}
    if ctx.plan.rollout.argo:
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": ctx.release}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": ctx.release}


def min_replicas(ctx: ServingContext) -> int:
    a = ctx.settings.autoscaling
    return a.min_replicas if a.min_replicas is not None else ctx.settings.serving.replicas


def _threshold(x: float) -> str:
    # KEDA reads trigger metadata as strings; keep "4" for 4.0 and "0.5" for 0.5.
    return f"{x:g}"


def triggers(ctx: ServingContext) -> list[dict]:
    a = ctx.settings.autoscaling
    server = ctx.settings.monitoring.prometheus_url
    vllm = vllm_selector(ctx)

    def prometheus(name: str, query: str, threshold: float, metric_type: str) -> dict:
        return {
            "type": "prometheus",
            "name": name,
            "metricType": metric_type,
            "metadata": {
                "serverAddress": server,
                "query": query,
                "threshold": _threshold(threshold),
                # No series is a failure, not 0: every engine exports these series from its
                # first scrape, so an empty answer means nothing is scraped (Prometheus
                # restarted empty, the scrape broken), and 0 would scale the fleet to its
                # minimum on no data. Failures hold the count (`fallback`).
                "ignoreNullValues": "false",
            },
        }

    if ctx.settings.serving.server == "triton":
        # Triton's names (docs/user_guide/metrics.md): requests received but not yet taken
        # by the backend, and successful requests; the vLLM backend re-exports neither
        # vLLM's queue nor its per-request success counter.
        waiting = f"sum(nv_inference_pending_request_count{{{vllm}}})"
        rate = f"sum(rate(nv_inference_request_success{{{vllm}}}[{RATE_WINDOW}]))"
        # nor vLLM's KV cache usage: behind Triton the pending count is the saturation signal
        saturation = []
    else:
        waiting = f"sum(vllm:num_requests_waiting{{{vllm}}})"
        rate = f"sum(rate(vllm:request_success_total{{{vllm}}}[{RATE_WINDOW}]))"
        # saturation: a replica whose KV cache is near full is about to queue and preempt
        # (GPU utilisation reads ~100% at one request and cannot tell load apart)
        saturation = [prometheus("kv-cache-usage", f"avg(vllm:kv_cache_usage_perc{{{vllm}}})", a.kv_cache_usage,
                                 "Value")]
    return [
        prometheus("waiting-requests", waiting, a.waiting_per_replica, "AverageValue"),
        prometheus("request-rate", rate, a.requests_per_second_per_replica, "AverageValue"),
        *saturation,
    ]


def behavior(ctx: ServingContext) -> dict:
    a = ctx.settings.autoscaling
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": a.scale_up_stabilization_seconds,
            # At most double per minute: each new replica needs whole GPU nodes.
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 60}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": a.scale_down_stabilization_seconds,
            # One replica at a time, no faster than one model load apart, so the cost of
            # a wrong guess is one replica, not the fleet.
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 600}],
        },
    }


def fallback(ctx: ServingContext) -> dict:
    """What KEDA reports while Prometheus fails: the current count, or the minimum if that
    is higher (KEDA pkg/fallback: currentReplicasIfHigher takes max(current, replicas))."""
    return {"failureThreshold": ctx.settings.autoscaling.fallback_after_failures,
            "replicas": min_replicas(ctx), "behavior": "currentReplicasIfHigher"}


def render(ctx: ServingContext) -> list[dict]:
    a = ctx.settings.autoscaling
    if not a.enabled:
        return []
    return [
        {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": ctx.metadata(ctx.release, "autoscaler"),
            "spec": {
                "scaleTargetRef": scale_target(ctx),
                "pollingInterval": a.polling_interval_seconds,
                "minReplicaCount": min_replicas(ctx),
                "maxReplicaCount": a.max_replicas,
                "advanced": {
                    "horizontalPodAutoscalerConfig": {"name": hpa_name(ctx), "behavior": behavior(ctx)},
                },
                "triggers": triggers(ctx),
                "fallback": fallback(ctx),
            },
        }
    ]
