"""The plan of prefill/decode disaggregation and of the routing tier in front of the engines.

    plan_disaggregation(s, model, slo, surge) -> DisaggregationPlan | None
    plan_router(s, engine, rollout, disaggregation) -> RouterPlan

Each side of a disaggregated stack is an engine plan of its own (capacity.planner, on its
own pool and with its own layout), and its replica bounds default to what the performance
model asks at the design load: ``capacity.sizing.disaggregated`` sizes the prefill side so
that queueing keeps TTFT within the TTFT objective (M/D/1) and the decode side to hold
``rps x output x ITL`` sequences (Little's law) at the largest batch whose decode ITL meets
the ITL objective. Each side's count is read with that side's own layout.
"""

from __future__ import annotations

from types import MappingProxyType

from capacity.catalog import ModelSpec
from capacity.perf import Layout, gpu_perf, load_hardware
from capacity.planner import Plan
from capacity.sizing import Workload, disaggregated
from stacks.errors import Refusal
from stacks.nodepools import rdma_per_pod
from stacks.plan.pools import pool_hw, pool_mig
from stacks.plan.serving import plan_engine
from stacks.plan.types import DisaggregationPlan, PhasePlan, RolloutPlan, RouterPlan, Slo
from stacks.settings import StackSettings

PHASES = ("prefill", "decode")
PD_ROLE_LABEL = "deepseek-volc/pd-role"  # pod label: prefill or decode side of a disaggregated stack
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}  # vLLM 0.32 config/kv_transfer.py KVRole


def _phase_settings(s: StackSettings, role: str) -> StackSettings:
    """The settings one side is planned with: its pool and layout over the serving ones; its
    replica bounds are checked here, not by the aggregated planner."""
    ph = getattr(s.serving.disaggregation, role)
    sv, e = s.serving, s.serving.engine
    engine = e.model_copy(update={k: v for k, v in (("parallelism", ph.parallelism),
                                                    ("tensor_parallel_size", ph.tensor_parallel_size),
                                                    ("data_parallel_size", ph.data_parallel_size)) if v is not None})
    serving = sv.model_copy(update={"gpu_pool": ph.pool or sv.gpu_pool, "engine": engine, "replicas": 1})
    return s.model_copy(update={"serving": serving,
                                "autoscaling": s.autoscaling.model_copy(update={"enabled": False})})


def _modelled(s: StackSettings, model: ModelSpec, p: Plan, pool: str, slo: Slo) -> dict:
    d = s.serving.disaggregation
    hw = load_hardware()
    gpu = pool_hw(s.cluster.gpu_pools[pool])
    lay = Layout.from_plan(p, rdma_gb_s=hw.rdma_gb_s_per_gpu(s.cluster.gpu_pools[pool].instance_type,
                                                           gpu.gpus_per_node))
    w = Workload(d.input_tokens, d.output_tokens, target_rps=d.requests_per_second,
                 ttft_slo_s=slo.ttft_p99_seconds, itl_slo_s=slo.max_inter_token_seconds)
    return disaggregated(model, gpu_perf(p.gpu, hw), p, lay, w, hw)


def plan_disaggregation(s: StackSettings, model: ModelSpec, slo: Slo, surge: int) -> DisaggregationPlan | None:
    d = s.serving.disaggregation
    if not d.enabled:
        return None
    if s.serving.server != "vllm":
        raise Refusal("serving.disaggregation.enabled: prefill/decode groups run vLLM's own server (NixlConnector); "
                      f"expected serving.server: vllm, got {s.serving.server}")
    if s.gateway.canary_weight:
        raise Refusal(f"gateway.canary_weight: {s.gateway.canary_weight} with prefill/decode disaggregation: every "
                      "request needs a prefill and a decode group, which only the router pairs, so no canary track "
                      "can bypass it; expected 0 (roll each side out with rollout.partition / max_surge)")
    phases, figures = {}, {}
    for role in PHASES:
        path = f"serving.disaggregation.{role}"
        ph = getattr(d, role)
        pool = ph.pool or s.serving.gpu_pool
        if pool not in s.cluster.gpu_pools:
            raise Refusal(f"{path}.pool: {pool!r} is not a GPU pool; expected one of {', '.join(s.cluster.gpu_pools)}")
        if pool_mig(s.cluster.gpu_pools[pool]) is not None:
            raise Refusal(f"{path}.pool: {pool} serves from MIG slices; a disaggregated side needs whole GPUs "
                          "(NIXL registers the KV cache of whole devices)")
        try:
            engine = plan_engine(_phase_settings(s, role), model, slo)
        except Refusal as exc:
            raise Refusal(f"{path}: {exc}") from None
        fig = _modelled(s, model, engine, pool, slo)
        if not fig.get("feasible"):
            raise Refusal(f"serving.disaggregation.requests_per_second: the performance model finds no {role} "
                          f"sizing at {d.requests_per_second:g} req/s within the stack's objectives: {fig['reason']}")
        modelled = int(fig[f"{role}_replicas"])
        low = ph.min_replicas or modelled
        high = ph.max_replicas or max(low, 2 * low)
        if high < low:
            raise Refusal(f"{path}.max_replicas: {high} is below min_replicas ({low})")
        hw = pool_hw(s.cluster.gpu_pools[pool])
        per_pod = engine.total_gpus // engine.nodes
        phases[role] = PhasePlan(role=role, kv_role=KV_ROLES[role], engine=engine, pool=pool, min_replicas=low,
                                 max_replicas=high, modelled_replicas=modelled, gpus_per_pod=per_pod,
                                 rdma_per_pod=rdma_per_pod(per_pod, hw))
        figures[role] = MappingProxyType(dict(fig))
    _check_room(s, phases, surge)
    return DisaggregationPlan(prefill=phases["prefill"], decode=phases["decode"], side_channel_port=d.side_channel_port,
                              requests_per_second=float(d.requests_per_second), model=MappingProxyType(figures))


def _check_room(s: StackSettings, phases: dict[str, PhasePlan], surge: int) -> None:
    """The most groups of every side on a pool, each with a rollout's surge, fit its max_nodes
    (counted in GPUs: whole-node groups take whole nodes)."""
    by_pool: dict[str, list[PhasePlan]] = {}
    for ph in phases.values():
        by_pool.setdefault(ph.pool, []).append(ph)
    for pool, sides in by_pool.items():
        gp = s.cluster.gpu_pools[pool]
        room = gp.max_nodes * pool_hw(gp).gpus_per_node
        need = sum((ph.max_replicas + surge) * ph.engine.total_gpus for ph in sides)
        if need > room:
            parts = " + ".join(f"{ph.role} ({ph.max_replicas} + {surge} surge) x {ph.engine.total_gpus} GPUs"
                               for ph in sides)
            raise Refusal(f"cluster.gpu_pools.{pool}.max_nodes: {parts} = {need} GPUs, the pool holds {room} at "
                          f"max_nodes {gp.max_nodes}; raise max_nodes or lower "
                          + " / ".join(f"serving.disaggregation.{ph.role}.max_replicas" for ph in sides))


def plan_router(s: StackSettings, engine: Plan, rollout: RolloutPlan,
                d: DisaggregationPlan | None) -> RouterPlan:
    """On when set, else unless Argo Rollouts runs the canary; refused where it cannot work."""
    r = s.serving.router
    enabled = r.enabled if r.enabled is not None else not rollout.argo
    if enabled and not s.serving.in_cluster_gateway:
        if r.enabled:
            raise Refusal("serving.router.enabled: the router sits behind the in-cluster gateway (JWT, rate limits); "
                          "expected serving.in_cluster_gateway: true")
        enabled = False
    if enabled and rollout.argo:
        raise Refusal("serving.router.enabled: Argo Rollouts runs this stack's canary, and the router finds engines "
                      "by label, so it would send canary traffic outside Argo's split; expected rollout.enabled: "
                      "false with the router, or router.enabled unset/false")
    if d is not None and not enabled:
        raise Refusal("serving.router.enabled: prefill/decode disaggregation needs the router (it sends each "
                      "request to a prefill and then a decode group); expected true or unset")
    if d is not None:
        return RouterPlan(enabled=True, mode="pd", data_parallel_size=1)
    if engine.data_parallel_size > 1:
        return RouterPlan(enabled=enabled, mode="dp_aware", data_parallel_size=engine.data_parallel_size)
    return RouterPlan(enabled=enabled, mode="cache_aware", data_parallel_size=1)
