"""The serving plan: the engine layout from the capacity planner, and what follows from it
(replicas a pool holds, rollout surge, termination grace); refused where it cannot run."""

from __future__ import annotations

from capacity import kv_offload, planner, wide_ep
from capacity.catalog import GPUS, ModelSpec, get_gpu, get_model
from capacity.instances import INSTANCE_TYPES
from capacity.mig import slice_gpu
from capacity.perf import PerfDataError
from capacity.planner import Plan, PlanError
from capacity.sizing import WORKLOAD_DEFAULTS, Workload, max_concurrency, rank_layouts
from stacks.errors import Refusal
from stacks.nodepools import instance_type_rdma
from stacks.plan.pools import pool_hw, pool_mig
from stacks.plan.types import PoolPlan, RolloutPlan, Slo
from stacks.settings import StackSettings
from stacks.vllm_flags import extra_args_problems

# Kept on top of preStop + drain in a serving pod's termination grace: the kubelet's own
# stop work and vLLM's teardown after the last request.
GRACE_MARGIN_SECONDS = 30


def replica_bounds(s: StackSettings) -> tuple[int, int]:
    """(fewest, most) serving replicas: the autoscaler's bounds, else serving.replicas."""
    a, sv = s.autoscaling, s.serving
    if not a.enabled:
        return sv.replicas, sv.replicas
    return a.min_replicas or sv.replicas, a.max_replicas


def model_of(s: StackSettings) -> ModelSpec:
    try:
        return get_model(s.serving.model)
    except KeyError as exc:
        raise Refusal(f"serving.model: {exc.args[0]}") from None
    except (OSError, ValueError) as exc:
        raise Refusal(f"serving.model: {exc}") from None


def stack_workload(s: StackSettings, slo: Slo) -> Workload:
    """The request the engine is sized for (serving.workload, else the model class's
    defaults, capacity/sizing.py WORKLOAD_DEFAULTS) at the monitoring SLOs: TTFT at its P99
    objective, ITL at 1 / min_tokens_per_second."""
    wl, sv = s.serving.workload, s.serving
    d = WORKLOAD_DEFAULTS[slo.model_class]
    return Workload(input_tokens=wl.input_tokens or d["input_tokens"],
                    output_tokens=wl.output_tokens or sv.max_output_tokens or d["output_tokens"],
                    concurrency=wl.concurrency, ttft_slo_s=slo.ttft_p99_seconds,
                    itl_slo_s=slo.max_inter_token_seconds)


def plan_engine(s: StackSettings, model: ModelSpec, slo: Slo) -> Plan:
    """Fill unset engine sizes from the planner, sized for the stack's workload (the layout:
    the one the performance model ranks best when none is stated); refuse settings that
    cannot fit. `dsvolc size --stack` and `dsvolc preview` both plan through here."""
    sv, e = s.serving, s.serving.engine
    w = stack_workload(s, slo)
    if e.max_model_len is not None and (s.serving.workload.input_tokens or s.serving.workload.output_tokens) \
            and w.input_tokens + w.output_tokens > e.max_model_len:
        raise Refusal(f"serving.workload: input_tokens + output_tokens = {w.input_tokens:,} + {w.output_tokens:,} "
                      f"exceed serving.engine.max_model_len {e.max_model_len:,}; expected at most that in all")
    if sv.server != "triton" and (problems := extra_args_problems(e.extra_args)):
        # checked against vLLM's own parser, vendored (stacks/vllm_flags.json); Triton takes none
        raise Refusal("serving.engine.extra_args: " + "; ".join(problems))
    pool = s.cluster.gpu_pools[sv.gpu_pool]
    hw, mig = pool_hw(pool), pool_mig(pool)
    gpu_name, per_node = hw.gpu, hw.gpus_per_node
    gpu, tp, pp = get_gpu(gpu_name), e.tensor_parallel_size, e.pipeline_parallel_size
    if mig is not None:
        # A CUDA process sees one MIG device: a replica is one slice, unsplit.
        for name, value in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp)):
            if value not in (None, 1):
                raise Refusal(f"serving.engine.{name}: pool {sv.gpu_pool} serves from MIG {mig.name} slices "
                              f"and a replica runs on one slice; expected 1 or unset, got {value}")
        gpu, tp, pp = slice_gpu(gpu, mig), 1, 1
    settings = dict(
        context=e.max_model_len,
        quantization=e.quantization,
        kv_cache_dtype=e.kv_cache_dtype,
        max_num_seqs=e.max_num_seqs,
        gpu_memory_utilization=e.gpu_memory_utilization,
        max_num_batched_tokens=e.max_num_batched_tokens,
        speculative_tokens=e.speculative_tokens,
    )
    rdma = instance_type_rdma(pool.instance_type)
    layout_given = (mig is not None or e.parallelism != "auto"
                    or any(v is not None for v in (tp, pp, e.data_parallel_size)))
    try:
        if layout_given:
            p = planner.plan(model, gpu, gpus_per_node=1 if mig is not None else per_node,
                             tensor_parallel_size=tp, pipeline_parallel_size=pp, parallelism=e.parallelism,
                             data_parallel_size=e.data_parallel_size, rdma=rdma,
                             sequence_tokens=w.input_tokens + w.output_tokens, **settings)
        else:
            p = rank_layouts(model, gpu, w, gpus_per_node=per_node, rdma=rdma, instance_type=pool.instance_type,
                             max_nodes=pool.max_nodes if sv.multi_node else 1,
                             admissible=lambda c: _fits_pool(s, c), **settings)
    except (PlanError, PerfDataError) as exc:
        raise Refusal(f"serving.engine: {exc}") from None
    if mig is not None:
        p.why["layout"] = f"TP1 on one MIG {mig.name} slice: a CUDA process sees one MIG device"
    if not p.fits and p.nodes > 1 and all("needs RDMA" in r for r in p.reasons):
        raise Refusal(
            f"cluster.gpu_pools.{sv.gpu_pool}.instance_type: one replica of {model.name} needs {p.nodes} nodes of "
            f"{gpu_name} x {per_node} ({p.describe_layout()}), and a replica across nodes needs RDMA between them, "
            f"which {pool.instance_type} does not have; serve it from an RDMA instance type (ecs.hpc*/ecs.ebmhpc*) "
            f"or from a larger pool: {_single_node_hint(s, model)}")
    if not p.fits:
        where = (f"a MIG {mig.name} slice of {gpu_name} ({mig.memory_mib / 1024:.1f} GiB)" if mig is not None
                 else f"{gpu_name} x {per_node} per node")
        raise Refusal(
            f"serving.engine: {model.name} does not fit on {where} (pool {sv.gpu_pool}): " + "; ".join(p.reasons)
        )
    if p.nodes > 1 and not sv.multi_node:
        raise Refusal(_multi_node_refusal(s, model, gpu_name, per_node, p))
    # EPLB's redundant experts (expert-parallel layouts) leave the KV cache: the plan says so
    p = wide_ep.with_redundant_experts(model, p)
    held = max_concurrency(p, w)
    if w.concurrency is not None and w.concurrency > held:
        raise Refusal(
            f"serving.workload.concurrency: {w.concurrency} sequences of {w.input_tokens + w.output_tokens:,} tokens "
            f"per replica, but the KV cache ({p.replica_kv_cache_tokens:,} tokens over {p.data_parallel_size} "
            f"engine(s), max_num_seqs {p.max_num_seqs}) holds {held}; expected at most {held}, or a shorter "
            "workload, or more KV cache per replica")
    low, _ = replica_bounds(s)
    if mig is not None:
        slices = per_node * mig.per_gpu
        needed = -(-low // slices)
        if needed > pool.max_nodes:
            raise Refusal(
                f"cluster.gpu_pools.{sv.gpu_pool}.max_nodes: {low} replica(s) on {slices} {mig.name} slices per "
                f"node need {needed} nodes, the pool allows {pool.max_nodes}"
            )
    else:
        # each warm placeholder holds one serving pod's GPUs (a pipeline stage's when multi-node)
        warm = s.resilience.warm_capacity.replicas
        warm_nodes = -(-warm * (p.total_gpus // p.nodes) // per_node)
        needed = low * p.nodes + warm_nodes
        if needed > pool.max_nodes and warm and low * p.nodes <= pool.max_nodes:
            raise Refusal(
                f"resilience.warm_capacity.replicas: {low} replica(s) x {p.nodes} node(s) plus {warm} "
                f"placeholder(s) on {warm_nodes} node(s) need {needed} nodes, pool {sv.gpu_pool} allows "
                f"{pool.max_nodes}"
            )
        if needed > pool.max_nodes:
            raise Refusal(
                f"cluster.gpu_pools.{sv.gpu_pool}.max_nodes: {low} replica(s) x {p.nodes} node(s) each need "
                f"{needed} nodes, the pool allows {pool.max_nodes}"
            )
    if sv.server == "triton":
        _check_triton(s, p)
    return p


def _fits_pool(s: StackSettings, p: Plan) -> bool:
    """The pool holds the stack's replicas, and a rollout's surge, in layout ``p``."""
    try:
        check_pool_capacity(s, p, plan_rollout(s, p), replicas_per_pool(s, p))
    except Refusal:
        return False
    return True


def _check_triton(s: StackSettings, p: Plan) -> None:
    sv = s.serving
    if p.nodes > 1:
        raise Refusal(f"serving.server: triton serves one node per replica here; {sv.model} needs "
                      f"{p.nodes} nodes per replica: expected vllm (a LeaderWorkerSet) for it")
    if sv.engine.extra_args:
        raise Refusal("serving.engine.extra_args: Triton's model.json takes engine fields, not command-line "
                      "flags; expected none with server: triton")
    if sv.triton.default_max_tokens > p.max_model_len:
        raise Refusal(f"serving.triton.default_max_tokens: {sv.triton.default_max_tokens} exceeds the "
                      f"engine's max_model_len {p.max_model_len}; expected at most that")


def _single_node_hint(s: StackSettings, model: ModelSpec) -> str:
    """The smallest catalogued node shape on which one replica fits alone, in words."""
    e = s.serving.engine
    options = planner.single_node_options(
        model, GPUS, INSTANCE_TYPES, context=e.max_model_len, quantization=e.quantization,
        kv_cache_dtype=e.kv_cache_dtype, tensor_parallel_size=e.tensor_parallel_size,
        max_num_seqs=e.max_num_seqs, gpu_memory_utilization=e.gpu_memory_utilization,
        max_num_batched_tokens=e.max_num_batched_tokens)
    if options:
        smallest = options[0]
        where = (f"the smallest pool on which it fits on one node is {smallest.describe()}"
                 + (f" (instance type not in the catalog: state gpu: {smallest.gpu} and "
                    f"gpus_per_node: {smallest.gpus_per_node})" if smallest.instance_type is None else ""))
    else:
        where = "no catalogued node shape holds it on one node"
    return where


def _multi_node_refusal(s: StackSettings, model: ModelSpec, gpu_name: str, per_node: int, p: Plan) -> str:
    """One replica would span several nodes: say so, and name the smallest node shape on
    which it would fit alone."""
    where = _single_node_hint(s, model)
    return (f"serving.multi_node: one replica of {model.name} needs {p.nodes} nodes of {gpu_name} x "
            f"{per_node} (pool {s.serving.gpu_pool}: TP{p.tensor_parallel_size} x "
            f"PP{p.pipeline_parallel_size}" + (f", {p.describe_layout()}" if p.parallelism != "tp_pp" else "")
            + "); set serving.multi_node: true to run each replica across "
            f"nodes (a LeaderWorkerSet, pipeline parallel over the network), or serve it from a larger "
            f"pool: {where}")


def termination_grace(s: StackSettings) -> int:
    """Time a stopping serving pod gets: the preStop delay, then vLLM drains in-flight
    requests for `serving.inflight_drain_seconds` (`--shutdown-timeout`); refused when set
    shorter than that."""
    sv = s.serving
    need = sv.drain_seconds + sv.inflight_drain_seconds
    if sv.termination_grace_seconds is None:
        return need + GRACE_MARGIN_SECONDS
    if sv.termination_grace_seconds < need:
        raise Refusal(
            f"serving.termination_grace_seconds: {sv.termination_grace_seconds} s is shorter than "
            f"serving.drain_seconds ({sv.drain_seconds}) + serving.inflight_drain_seconds "
            f"({sv.inflight_drain_seconds}) = {need} s: the kubelet would kill the drain of requests in flight; "
            f"expected at least {need}, or leave it unset"
        )
    return sv.termination_grace_seconds


def plan_rollout(s: StackSettings, engine: Plan) -> RolloutPlan:
    """Argo Rollouts runs the canary when enabled, one node per replica (it cannot manage a
    LeaderWorkerSet) and the in-cluster HTTPRoute it moves traffic on. A rollout adds one
    replica at its peak under Argo (dynamicStableScale scales the stable down as the canary
    scales up), else rollout.max_surge."""
    argo = s.rollout.enabled and s.serving.in_cluster_gateway and engine.nodes == 1
    if argo and s.gateway.canary_weight:
        raise Refusal(
            f"gateway.canary_weight: {s.gateway.canary_weight} while Argo Rollouts owns the canary split "
            "(rollout.enabled, in-cluster gateway): Argo sets the weights during a rollout and back to 0 "
            "after it; expected 0 (traffic steps are rollout.steps)"
        )
    if s.rollout.partition and engine.nodes == 1:
        raise Refusal(
            "rollout.partition: applies to multi-node replicas (a LeaderWorkerSet) only; single-node "
            "replicas roll out as an Argo canary or a Deployment update. Expected 0"
        )
    return RolloutPlan(argo=argo, surge=max(1, s.rollout.max_surge) if argo else s.rollout.max_surge)


def replicas_per_pool(s: StackSettings, engine: Plan) -> int:
    """Serving replicas the pool holds at max_nodes: whole nodes per replica when a replica
    spans nodes, else replicas side by side on each node's GPUs."""
    pool = s.cluster.gpu_pools[s.serving.gpu_pool]
    if engine.nodes > 1:
        return pool.max_nodes // engine.nodes
    per_node = pool_hw(pool).gpus_per_node
    mig = pool_mig(pool)
    if mig is not None:  # one replica per MIG slice (capacity/mig.py)
        return pool.max_nodes * per_node * mig.per_gpu
    return pool.max_nodes * (per_node // engine.total_gpus)


def check_pool_capacity(s: StackSettings, engine: Plan, rollout: RolloutPlan, room: int) -> None:
    """The most replicas, plus a rollout's surge, fit the pool: else a rollout while scaled
    out would stall."""
    a, sv = s.autoscaling, s.serving
    upper, field = (a.max_replicas, "autoscaling.max_replicas") if a.enabled else (sv.replicas, "serving.replicas")
    surge = rollout.surge
    if upper + surge <= room:
        return
    pool = s.cluster.gpu_pools[sv.gpu_pool]
    mig = pool_mig(pool)
    unit = (f"{engine.nodes} nodes each" if engine.nodes > 1 else
            f"one {mig.name} MIG slice each" if mig is not None else f"{engine.total_gpus} GPU(s) each")
    fixes = [f"lower {field} to {max(room - surge, 0)}", f"raise cluster.gpu_pools.{sv.gpu_pool}.max_nodes"]
    if surge and not rollout.argo:
        fixes.append("set rollout.max_surge: 0 (replace one replica at a time)")
    raise Refusal(
        f"{field}: {upper} replica(s) ({unit}) + a rollout surge of {surge} need room for {upper + surge} "
        f"replicas, but pool {sv.gpu_pool} holds {room} at max_nodes {pool.max_nodes}: a rollout while "
        f"scaled out would stall; {', or '.join(fixes)}"
    )


def api_servers(model: ModelSpec, engine: Plan) -> int:
    """API server processes in front of a replica's engines (capacity.wide_ep), else one."""
    w = wide_ep.decide(model, engine)
    return w.api_server_count if w is not None else 1


def plan_kv_offload(s: StackSettings, model: ModelSpec, engine: Plan, pool: PoolPlan) -> kv_offload.KvOffload | None:
    """Each serving pod's KV offload buffers, sized from the node's RAM (capacity.kv_offload);
    refused when a set size does not fit the node."""
    e = s.serving.engine
    if e.kv_offload and s.serving.disaggregation.enabled:
        raise Refusal("serving.engine.kv_offload: prefill/decode disaggregation connects the engines with "
                      "NixlConnector, and vLLM 0.32's --kv-offloading-size replaces the configured connector with "
                      "its OffloadingConnector (vllm/config/vllm.py); expected kv_offload off with "
                      "serving.disaggregation (a MultiConnector of both is not rendered)")
    hw = pool.hardware
    if pool.mig is not None:
        pods_per_node = hw.gpus_per_node * pool.mig.per_gpu
    else:
        pods_per_node = 1 if engine.nodes > 1 else max(hw.gpus_per_node // pool.gpus_per_pod, 1)
    try:
        return kv_offload.plan(
            enabled=e.kv_offload, gib=e.kv_offload_gib,
            node_ram_gib=hw.record.memory_gib if hw.record is not None else None,
            instance_type=hw.instance_type, pods_per_node=pods_per_node,
            pod_host_bytes=kv_offload.host_bytes(pool.gpus_per_pod, pool.mig is not None,
                                                 api_servers(model, engine)),
            engines=kv_offload.engines_per_pod(engine.tensor_parallel_size, engine.pipeline_parallel_size,
                                               pool.gpus_per_pod))
    except PlanError as exc:
        raise Refusal(str(exc)) from None
