"""Prefill/decode disaggregation: a prefill side and a decode side, each its own workload.

    router -> prefill group (kv_producer: computes the prompt's KV cache, answers 1 token)
           -> decode group  (kv_consumer: pulls that KV from the prefill group over NIXL and
                             generates; its prompt tokens are never computed again)

Each side renders like the aggregated workload (workloads/engine/manifests.py): a
Deployment when a group fits one node, a LeaderWorkerSet when it spans nodes, from its own
engine plan (stacks/plan/disaggregation.py), named `<release>-prefill` / `<release>-decode`
and labelled `deepseek-volc/pd-role`. On top of the aggregated pod:

* `--kv-transfer-config {"kv_connector": "NixlConnector", "kv_role": ...}` (vLLM 0.32
  config/kv_transfer.py; NixlConnector deprecates kv_both, so each side has its role), and
  on an expert-parallel side the all-to-all of its phase (capacity.wide_ep.backend_for_phase);
* the NIXL handshake listener (`VLLM_NIXL_SIDE_CHANNEL_HOST` = the pod's IP, so the address
  the decode side receives in `kv_transfer_params` is reachable;
  `VLLM_NIXL_SIDE_CHANNEL_PORT` + the engine's data-parallel index is each engine's port,
  vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py), with a headless
  Service naming those ports;
* UCX over the pod's RDMA NICs on RDMA pools (UCX_TLS with rc/dc and the CUDA transports,
  UCX_NET_DEVICES = the pod's HCAs, RoCE v2 GID index, zero-copy rendezvous: NVIDIA Dynamo's
  disaggregation communication guide), the RDMA resource, pod-networks annotation and
  IPC_LOCK of workloads/engine/rdma.py; TCP where the pool has no RDMA;
* a PodDisruptionBudget and a KEDA ScaledObject per side, on the side's own signal: prefill
  on its queue and TTFT, decode on its KV cache usage and inter-token latency.
"""

from __future__ import annotations

import json
from dataclasses import replace

from capacity.catalog import get_gpu
from stacks.plan.disaggregation import PD_ROLE_LABEL, PHASES, PhasePlan
from workloads.engine import autoscaling, manifests, rdma
from workloads.engine.context import ServingContext
from workloads.observability.selectors import vllm_selector

PROM_ROLE_LABEL = "deepseek_volc_pd_role"  # PD_ROLE_LABEL as Prometheus sanitises it (PodMonitor podTargetLabels)
UCX_TLS_RDMA = "rc_x,rc,dc_x,dc,cuda_copy,cuda_ipc"  # Dynamo disagg-communication-guide, production configuration
UCX_TLS_TCP = "tcp,cuda_copy,cuda_ipc"  # no RDMA NICs: host-staged over the pod network
QUANTILE = 0.9  # the latency quantile each side scales on


def enabled(ctx: ServingContext) -> bool:
    return ctx.plan.disaggregation is not None


def phase(ctx: ServingContext, role: str) -> PhasePlan:
    return getattr(ctx.plan.disaggregation, role)


def workload_name(ctx: ServingContext, role: str) -> str:
    return f"{ctx.release}-{role}"


def kv_transfer_config(ph: PhasePlan) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": ph.kv_role}, separators=(",", ":"))


def phase_flags(ph: PhasePlan) -> list[str]:
    """The flags one side adds to the aggregated engine arguments. Its all-to-all backend
    (DeepEP high-throughput for prefill, low-latency for decode) comes with the other wide-EP
    flags from capacity.wide_ep, for the side's phase (`phase_context` sets it)."""
    return ["--kv-transfer-config", kv_transfer_config(ph)]


def phase_context(ctx: ServingContext, role: str) -> ServingContext:
    """The aggregated context with this side's engine plan, pool and replica count, and the
    KV transfer flag among the engine arguments: the aggregated renderers then render it."""
    ph = phase(ctx, role)
    s = ctx.settings
    sv = s.serving
    engine_settings = sv.engine.model_copy(
        update={"extra_args": [*sv.engine.extra_args, *phase_flags(ph)]})
    settings = s.model_copy(update={"serving": sv.model_copy(
        update={"gpu_pool": ph.pool, "engine": engine_settings, "replicas": ph.min_replicas})})
    pool = replace(ctx.plan.pools[ph.pool], gpus_per_pod=ph.gpus_per_pod, multi_node=ph.multi_node)
    serving = replace(ctx.plan.serving, engine=ph.engine, pool=ph.pool, gpu=get_gpu(pool.gpu),
                      min_replicas=ph.min_replicas, max_replicas=ph.max_replicas, rdma_per_pod=ph.rdma_per_pod)
    plan = replace(ctx.plan, settings=settings, serving=serving, pools={**ctx.plan.pools, ph.pool: pool})
    return replace(ctx, plan=plan, phase=role)


def selector(ctx: ServingContext, role: str) -> dict[str, str]:
    return {**ctx.selector("server"), PD_ROLE_LABEL: role}


def http_selector(ctx: ServingContext, role: str) -> dict[str, str]:
    """Pods of one side that answer HTTP: every pod, or the group leaders when it spans nodes."""
    sel = selector(ctx, role)
    if phase(ctx, role).multi_node:
        sel[manifests.LEADER_LABEL] = "leader"
    return sel


def side_channel_ports(ctx: ServingContext, role: str) -> list[int]:
    """The NIXL handshake port of each engine of a group (base + data-parallel index)."""
    base = ctx.plan.disaggregation.side_channel_port
    return [base + i for i in range(phase(ctx, role).engine.data_parallel_size)]


def nixl_env(ctx: ServingContext, role: str) -> list[dict]:
    ph = phase(ctx, role)
    env = [
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(ctx.plan.disaggregation.side_channel_port)},
    ]
    if ph.rdma_per_pod:
        env += [
            {"name": "UCX_TLS", "value": UCX_TLS_RDMA},
            {"name": "UCX_NET_DEVICES", "value": rdma.hca_list(ph.rdma_per_pod)},
            {"name": "UCX_IB_GID_INDEX", "value": rdma.NCCL_IB_GID_INDEX},  # RoCE v2 on VKE
            # KV blocks are large: rendezvous for every message, the receiver pulling by RDMA read
            {"name": "UCX_RNDV_SCHEME", "value": "get_zcopy"},
            {"name": "UCX_RNDV_THRESH", "value": "0"},
        ]
    else:
        env.append({"name": "UCX_TLS", "value": UCX_TLS_TCP})
    return env


def _label_template(template: dict, role: str) -> None:
    template["metadata"]["labels"] = {**template["metadata"]["labels"], PD_ROLE_LABEL: role}
    for tsc in template["spec"].get("topologySpreadConstraints", []):
        tsc["labelSelector"]["matchLabels"] = {**tsc["labelSelector"]["matchLabels"], PD_ROLE_LABEL: role}


def _add_nixl(ctx: ServingContext, template: dict, role: str) -> None:
    c = template["spec"]["containers"][0]
    c["env"] = c["env"] + nixl_env(ctx, role)
    c["ports"] = c.get("ports", []) + [{"name": f"nixl-{i}", "containerPort": p, "protocol": "TCP"}
                                       for i, p in enumerate(side_channel_ports(ctx, role))]


def workload(ctx: ServingContext, role: str, role_trn: str | None = None) -> dict:
    pctx = phase_context(ctx, role)
    role_env = {"name": "VOLCENGINE_OIDC_ROLE_TRN", "value": role_trn if role_trn is not None else ""}
    if pctx.multi_node:
        obj = manifests.leader_worker_set(pctx, role_env)
        templates = [obj["spec"]["leaderWorkerTemplate"][k] for k in ("leaderTemplate", "workerTemplate")]
    else:
        obj = manifests.deployment(pctx, role_env)
        template = obj["spec"]["template"]
        # a group on one node still moves its KV to other nodes: the RDMA NICs, when the pool has them
        manifests.with_rdma(pctx, template)
        obj["spec"]["selector"]["matchLabels"] = selector(ctx, role)
        templates = [template]
    obj["metadata"]["name"] = workload_name(ctx, role)
    obj["metadata"]["labels"] = {**obj["metadata"]["labels"], PD_ROLE_LABEL: role}
    for t in templates:
        _label_template(t, role)
        _add_nixl(ctx, t, role)
    return obj


def side_channel_service(ctx: ServingContext, role: str) -> dict:
    """Headless: one DNS record per pod of the side, naming the handshake ports (the decode
    side dials the address the prefill side put in kv_transfer_params)."""
    md = ctx.metadata(f"{workload_name(ctx, role)}-nixl", "server")
    md["labels"][PD_ROLE_LABEL] = role
    return {"apiVersion": "v1", "kind": "Service", "metadata": md,
            "spec": {"clusterIP": "None", "selector": selector(ctx, role), "publishNotReadyAddresses": False,
                     "ports": [{"name": f"nixl-{i}", "port": p, "targetPort": p, "protocol": "TCP"}
                               for i, p in enumerate(side_channel_ports(ctx, role))]}}


def pod_disruption_budget(ctx: ServingContext, role: str) -> dict:
    """One group of each side down at a time (over every pod of a group, like the aggregated
    budget: evicting any pod takes its group down)."""
    md = ctx.metadata(workload_name(ctx, role), "server")
    md["labels"][PD_ROLE_LABEL] = role
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": md,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(ctx, role)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def series(ctx: ServingContext, role: str) -> str:
    return f'{vllm_selector(ctx)},{PROM_ROLE_LABEL}="{role}"'


def _quantile(metric: str, sel: str) -> str:
    return (f"histogram_quantile({QUANTILE}, sum by (le) (rate({metric}_bucket{{{sel}}}"
            f"[{autoscaling.RATE_WINDOW}])))")


def triggers(ctx: ServingContext, role: str) -> list[dict]:
    """Prefill: its queue (per group) and its TTFT against the TTFT objective; decode: its
    KV cache usage and its inter-token latency against the ITL objective. Latency triggers
    are `Value` targets: desired = current x observed / objective."""
    a = ctx.settings.autoscaling
    sel = series(ctx, role)

    def prom(name: str, query: str, threshold: float, metric_type: str) -> dict:
        return {"type": "prometheus", "name": name, "metricType": metric_type,
                "metadata": {"serverAddress": ctx.settings.monitoring.prometheus_url, "query": query,
                             "threshold": f"{threshold:g}", "ignoreNullValues": "true"}}

    if role == "prefill":
        return [prom("waiting-requests", f"sum(vllm:num_requests_waiting{{{sel}}})", a.waiting_per_replica,
                     "AverageValue"),
                prom("ttft", _quantile("vllm:time_to_first_token_seconds", sel), ctx.plan.slo.ttft_p99_seconds,
                     "Value")]
    return [prom("kv-cache-usage", f"avg(vllm:kv_cache_usage_perc{{{sel}}})", a.kv_cache_usage, "Value"),
            prom("itl", _quantile("vllm:inter_token_latency_seconds", sel),
                 round(ctx.plan.slo.max_inter_token_seconds, 6), "Value")]


def scaled_object(ctx: ServingContext, role: str) -> dict:
    ph = phase(ctx, role)
    target = ({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet"} if ph.multi_node
              else {"apiVersion": "apps/v1", "kind": "Deployment"})
    a = ctx.settings.autoscaling
    md = ctx.metadata(workload_name(ctx, role), "autoscaler")
    md["labels"][PD_ROLE_LABEL] = role
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": md,
        "spec": {
            "scaleTargetRef": {**target, "name": workload_name(ctx, role)},
            "pollingInterval": a.polling_interval_seconds,
            "minReplicaCount": ph.min_replicas,
            "maxReplicaCount": ph.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {
                "name": f"keda-hpa-{workload_name(ctx, role)}", "behavior": autoscaling.behavior(ctx)}},
            "triggers": triggers(ctx, role),
        },
    }


def render(ctx: ServingContext, role_trn: str | None = None) -> list[dict]:
    """Both sides' workloads, handshake Services and budgets."""
    if not enabled(ctx):
        return []
    out = []
    for role in PHASES:
        out += [workload(ctx, role, role_trn), side_channel_service(ctx, role), pod_disruption_budget(ctx, role)]
    return out


def render_autoscaling(ctx: ServingContext) -> list[dict]:
    if not enabled(ctx) or not ctx.settings.autoscaling.enabled:
        return []
    return [scaled_object(ctx, role) for role in PHASES]


def replaces(ctx: ServingContext, obj: dict) -> bool:
    """An aggregated object the sides replace: the release's workload and its budget."""
    return (enabled(ctx) and obj["metadata"].get("name") == ctx.release
            and obj["kind"] in ("Deployment", "LeaderWorkerSet", "PodDisruptionBudget"))
