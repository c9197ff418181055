"""`build_plan`: every cross-section check and every decision derived from a stack's
settings, computed once into a `StackPlan`."""

from __future__ import annotations

import re
from dataclasses import replace
from types import MappingProxyType

from capacity.catalog import get_gpu
from capacity.suggest import did_you_mean
from stacks.addons import ADDONS, Addon
from stacks.constants import ENTRY_NAMESPACE, HTTP_PORT, entry_service
from stacks.errors import Refusal, SettingsError
from stacks.nodepools import rdma_per_pod
from stacks.plan.disaggregation import plan_disaggregation, plan_router
from stacks.plan.network import plan_network
from stacks.plan.pools import check_pool_zones, plan_pools
from stacks.plan.serving import (
    api_servers,
    check_pool_capacity,
    model_of,
    plan_engine,
    plan_kv_offload,
    plan_rollout,
    replica_bounds,
    replicas_per_pool,
    termination_grace,
)
from stacks.plan.types import EdgePlan, Names, ServingPlan, Slo, StackPlan, Upstream
from stacks.regions import apmplus_otlp_endpoint, cr_registry_host, tls_otlp_endpoint
from stacks.settings import StackSettings

# APIG takes one or two subnets (terraform-provider-volcenginecc docs/resources/apig_gateway.md
# at 3a525a11: subnet_ids "Length limit: 1-2").
APIG_MAX_SUBNETS = 2

# Defaults per model class (docs/operations.md, "Objectives per model class"). A chat model
# answers in seconds: 30 s covers a long answer at interactive speed. A reasoning model
# writes thousands of thinking tokens first (R1's answers run to minutes), so its
# end-to-end budget is long (8 min, under the gateway's 10 min request timeout) and what
# is held tight is the rate at which tokens flow.
SLO_CLASS_DEFAULTS = {
    "chat": {"e2e_p99_seconds": 30.0, "min_tokens_per_second": 20.0},
    "reasoning": {"e2e_p99_seconds": 480.0, "min_tokens_per_second": 10.0},
}
REASONING_MODEL = re.compile(r"(^|[-_/])r1([-_/.]|$)", re.I)


def infer_model_class(model: str) -> str:
    """`reasoning` for DeepSeek-R1 and the R1 distills, `chat` otherwise."""
    return "reasoning" if REASONING_MODEL.search(model) else "chat"


def build_plan(settings: StackSettings, source: str | None = None) -> StackPlan:
    """Check what needs more than one section and derive every decision, once. A refusal is
    a SettingsError (from `source`, the stack's file or name) whose line names the field."""
    try:
        return _derive(settings)
    except Refusal as exc:
        raise SettingsError(source or f"stack {settings.stack}", [str(exc)]) from None


def _derive(s: StackSettings) -> StackPlan:
    network = plan_network(s)
    check_pool_zones(s)
    _check_sections(s)
    model = model_of(s)
    slo = _slo(s)
    engine = plan_engine(s, model, slo)
    pools = plan_pools(s, engine)
    grace = termination_grace(s)
    rollout = plan_rollout(s, engine)
    if s.serving.disaggregation.enabled and rollout.argo:
        # each side rolls out as its own Deployment/LeaderWorkerSet update; Argo's canary
        # manages one workload, not two
        rollout = replace(rollout, argo=False, surge=s.rollout.max_surge)
    room = replicas_per_pool(s, engine)
    check_pool_capacity(s, engine, rollout, room)
    disaggregation = plan_disaggregation(s, model, slo, rollout.surge)
    pool = pools[s.serving.gpu_pool]
    low, high = replica_bounds(s)
    serving = ServingPlan(
        engine=engine, model=model, gpu=get_gpu(pool.gpu), pool=pool.name, min_replicas=low, max_replicas=high,
        replicas_per_pool=room, termination_grace_seconds=grace,
        rdma_per_pod=rdma_per_pod(pool.gpus_per_pod, pool.hardware) if pool.multi_node else 0,
        kv_offload=plan_kv_offload(s, model, engine, pool), api_servers=api_servers(model, engine),
    )
    names = _names(s)
    return StackPlan(
        settings=s,
        names=names,
        network=network,
        pools=pools,
        # the RDMA device plugin also where only a disaggregated side's pods take NICs (KV transfer)
        addons=_addons(s, serving.rdma_per_pod or max((ph.rdma_per_pod for ph in disaggregation.phases()), default=0)
                       if disaggregation else serving.rdma_per_pod),
        edge=EdgePlan(zones=tuple(s.gateway.zones or s.zones[:APIG_MAX_SUBNETS]), upstreams=_upstreams(s)),
        serving=serving,
        rollout=rollout,
        slo=slo,
        tags=MappingProxyType({"project": "deepseek-volc", "stack": s.stack, "environment": s.environment_class,
                               **s.tags}),
        policy_config=s.policy_config or f"policies/config/{s.environment_class}.json",
        trace_endpoint=_trace_endpoint(s),
        disaggregation=disaggregation,
        router=plan_router(s, engine, rollout, disaggregation),
    )


def _check_sections(s: StackSettings) -> None:
    """What one section asks of another."""
    a = s.autoscaling
    if a.enabled and a.min_replicas is None and s.serving.replicas > a.max_replicas:
        raise Refusal(f"autoscaling.max_replicas: {a.max_replicas} is below serving.replicas ({s.serving.replicas})")
    for i, zone in enumerate(s.gateway.zones or []):
        if zone not in s.zones:
            raise Refusal(f"gateway.zones[{i}]: {zone!r} is not a stack zone; expected one of {', '.join(s.zones)}")
    if s.gateway.zones and len(set(s.gateway.zones)) != len(s.gateway.zones):
        raise Refusal("gateway.zones: expected distinct zones")
    if s.observability.vmp_enabled and not s.monitoring.enabled:
        raise Refusal("observability.vmp_enabled: metrics reach VMP by the in-cluster Prometheus's remote "
                      "write; set monitoring.enabled: true, or vmp_enabled: false")
    if s.serving.gpu_pool not in s.cluster.gpu_pools:
        raise Refusal(f"serving.gpu_pool: {s.serving.gpu_pool!r} is not a GPU pool; expected one of "
                      f"{', '.join(s.cluster.gpu_pools)}{did_you_mean(s.serving.gpu_pool, s.cluster.gpu_pools)}")


def _slo(s: StackSettings) -> Slo:
    """Latency objectives: the settings where given, else the model class's defaults; the
    end-to-end objective below the edge's timeout (else its alert could never fire)."""
    m = s.monitoring
    cls = m.model_class or infer_model_class(s.serving.model)
    d = SLO_CLASS_DEFAULTS[cls]
    e2e = m.e2e_p99_seconds if m.e2e_p99_seconds is not None else d["e2e_p99_seconds"]
    timeout = s.gateway.request_timeout_seconds
    if e2e >= timeout:
        raise Refusal(
            f"monitoring.e2e_p99_seconds: {e2e:g}" + ("" if m.e2e_p99_seconds is not None else f" (the {cls} class default)")
            + f" must be below gateway.request_timeout_seconds ({timeout}): requests are cut at the timeout, "
            "so the alert could never fire")
    return Slo(
        model_class=cls, ttft_p99_seconds=m.ttft_p99_seconds, e2e_p99_seconds=e2e,
        min_tokens_per_second=m.min_tokens_per_second or d["min_tokens_per_second"],
        canary_p99_seconds=s.rollout.max_p99_latency_seconds or e2e,
    )


def _names(s: StackSettings) -> Names:
    prefix = f"deepseek-{s.stack}"
    registry = s.registry.name or prefix
    host = cr_registry_host(registry, s.region)
    return Names(
        prefix=prefix,
        cluster=s.cluster.name or prefix,
        bucket=s.weights.bucket_name or f"deepseek-volc-{s.stack}-weights",
        registry=registry,
        registry_host=host,
        image_repository=f"{host}/{s.registry.namespace}/{s.registry.repository}",
        log_project=f"{prefix}-logs",
        trace_instance=f"{prefix}-traces",
        node_group=f"{prefix}-nodes",
        log_collector=s.observability.logs.collector_identifier or f"{prefix}-nodes",
    )


def _addons(s: StackSettings, rdma_per_pod: int) -> tuple[Addon, ...]:
    """The add-ons to install, versions resolved (cluster.addon_versions over stacks/addons.py);
    rdma-device-plugin only where serving pods use RDMA, VKE's nvidia-device-plugin not where a
    pool is cut into MIG slices, cr-credential-controller where it supplies the pull credential,
    log-collector where container logs go to TLS."""
    names = ["cluster-autoscaler", "nvidia-device-plugin", "metrics-server"]
    if any(p.mig is not None for p in s.cluster.gpu_pools.values()):
        # a MIG pool runs NVIDIA's device plugin chart instead (workloads/platform/controllers.py), whose
        # per-node config gives MIG nodes the mixed strategy; two plugins on one node would
        # both advertise its GPUs
        names.remove("nvidia-device-plugin")
    if rdma_per_pod:
        names.append("rdma-device-plugin")
    if s.registry.pull_credentials == "cr-credential-controller":
        names.append("cr-credential-controller")
    if s.observability.logs.enabled:
        names.append("log-collector")
    pinned = s.cluster.addon_versions
    return tuple(replace(ADDONS[n], version=pinned.get(n, ADDONS[n].version)) for n in names)


def _upstreams(s: StackSettings) -> tuple[Upstream, ...]:
    """Where the APIG edge forwards. With the in-cluster gateway, one upstream (the split
    happens in the HTTPRoute); without it, stable and canary Services split by weight."""
    if s.serving.in_cluster_gateway:
        return (Upstream(role="gateway", namespace=ENTRY_NAMESPACE, service=entry_service(s.serving.name),
                         port=80, weight=100),)
    w = s.gateway.canary_weight
    ns, name = s.serving.namespace, s.serving.name
    return (
        Upstream(role="stable", namespace=ns, service=f"{name}-stable", port=HTTP_PORT, weight=100 - w),
        Upstream(role="canary", namespace=ns, service=f"{name}-canary", port=HTTP_PORT, weight=w),
    )


def _trace_endpoint(s: StackSettings) -> str:
    t = s.observability.tracing
    if t.endpoint:
        return t.endpoint
    return tls_otlp_endpoint(s.region) if t.backend == "tls" else apmplus_otlp_endpoint(s.region)
