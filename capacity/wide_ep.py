"""Wide expert parallelism: the vLLM settings the published DeepSeek-scale deployments run
with, decided per layout from the capacity plan (capacity.planner.Plan).

Only expert-parallel layouts (tp_ep, dp_ep) get any of this; a TP x PP replica has no
all-to-all to tune. Each decision names the recipe it follows (read 2026-12-01):

* vLLM's expert-parallel deployment guide (`VLLM_EP_GUIDE`): DeepEP high-throughput
  kernels for multi-node prefill, low-latency kernels for multi-node decode, EPLB with
  `num_redundant_experts` ("32 in large scale use cases"), `--api-server-count` on the node
  that serves requests ("scaling this out to total ranks").
* vLLM's dual-batch-overlap design note (`VLLM_DBO`): DBO needs DP > 1, EP and a DeepEP
  backend; the two token thresholds.
* llm-d's wide-EP guide for DeepSeek-R1 on LeaderWorkerSets (`LLMD_WIDE_EP`: its
  manifests/modelserver/base decode.yaml and prefill.yaml): DP16 per phase,
  `--async-scheduling`, `--enable-dbo` with a threshold of 32 tokens in each phase, EPLB
  with 32 redundant experts, "on DeepSeekV3 eplb uses an extra 2GB per redundant expert per
  GPU", "(256 + redundant) must be divisible by the number of GPUs".
* DeepSeek's own inference system (`DEEPSEEK_SYSTEM`): 32 redundant routed experts for
  prefill (EP32) and decode (EP144), dual micro-batch overlap in both phases.

What vLLM 0.32 itself does was read in its source: `deepep_high_throughput` turns CUDA
graphs off with DP > 1 (vllm/config/compilation.py, set_splitting_ops_for_v1); EPLB needs
`(routed + redundant) % EP == 0` (vllm/model_executor/layers/fused_moe/layer.py); the
DeepSeek models implement its MixtureOfExperts interface (model_executor/models/
deepseek_v2.py, deepseek_mtp.py); `vllm serve` (not `python -m
vllm.entrypoints.openai.api_server`, which runs one server) starts `--api-server-count`
API processes (vllm/entrypoints/cli/serve.py).

Pure functions, no I/O. `backend_for_phase` is what a prefill/decode split renders per
pool; `decide` gives every flag of one engine group; `with_redundant_experts` puts the EPLB
replicas' memory into the plan, so the KV cache the plan reports is what vLLM allocates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from capacity.memory import kv_cache_tokens_for_bytes, normalize_quantization, weight_bytes_per_param
from capacity.planner import DEFAULT_MAX_NUM_SEQS, Plan
from capacity.specs import GiB, ModelSpec

VLLM_EP_GUIDE = "https://docs.vllm.ai/en/latest/serving/expert_parallel_deployment/"
VLLM_DBO = "https://docs.vllm.ai/en/stable/design/dbo/"
VLLM_BLOG = "https://blog.vllm.ai/2025/12/17/large-scale-serving.html"
LLMD_WIDE_EP = "https://github.com/llm-d/llm-d/tree/main/guides/wide-ep-lws"
DEEPSEEK_SYSTEM = ("https://github.com/deepseek-ai/open-infra-index/blob/main/202502OpenSourceWeek/"
                   "day_6_one_more_thing_deepseekV3R1_inference_system_overview.md")
VLLM_SOURCE = "vLLM 0.32 source"

PHASES = ("prefill", "decode", "aggregated")
DEFAULT_ALL2ALL = "allgather_reducescatter"  # vLLM 0.32's default (vllm/config/parallel.py)
DEEPEP_HIGH_THROUGHPUT = "deepep_high_throughput"
DEEPEP_LOW_LATENCY = "deepep_low_latency"

# EPLB: the recipes' redundant experts (vLLM guide, llm-d, DeepSeek), window and interval
# at vLLM's defaults (the vLLM guide's and llm-d's examples use the same values).
RECIPE_REDUNDANT_EXPERTS = 32
EPLB_WINDOW_SIZE = 1000
EPLB_STEP_INTERVAL = 3000
# Redundant replicas take GPU memory from the KV cache: at most this share of it (llm-d's
# 32 on DP16 H200 costs ~2 GB per replica per GPU; on a 96 GB H20 the share is the limit).
MAX_EPLB_KV_SHARE = 0.2
# vLLM models with its MixtureOfExperts interface (EPLB) among the catalog's architectures
EPLB_ARCHITECTURES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32"})

# DBO token thresholds: a batch above them is split in two micro-batches. llm-d renders
# 32 in each phase of a P/D split; an aggregated engine keeps vLLM's prefill default (512):
# a mixed batch with a small prefill chunk is not worth splitting (vllm/config/parallel.py).
DBO_DECODE_TOKENS = 32
DBO_PREFILL_TOKENS = {"prefill": 32, "aggregated": 512}
DBO_MICROBATCHES = 2  # vLLM refuses thresholds below the number of micro-batches


@dataclass(frozen=True)
class Choice:
    """One decision: the flag it renders, its value, why, and the recipe it follows."""

    flag: str
    value: str | None
    reason: str
    recipe: str


@dataclass(frozen=True)
class WideEP:
    """The wide-EP flags of one expert-parallel engine group."""

    phase: str
    all2all_backend: str
    eplb: bool
    redundant_experts: int
    dbo: bool
    dbo_decode_token_threshold: int
    dbo_prefill_token_threshold: int
    async_scheduling: bool
    api_server_count: int
    choices: tuple[Choice, ...]

    @property
    def deepep(self) -> bool:
        return self.all2all_backend.startswith("deepep")

    def eplb_config(self) -> str:
        return ('{"window_size":%d,"step_interval":%d,"num_redundant_experts":%d}'
                % (EPLB_WINDOW_SIZE, EPLB_STEP_INTERVAL, self.redundant_experts))

    def vllm_args(self) -> list[str]:
        """The flags, as vLLM 0.32's `vllm serve` spells them (vllm/engine/arg_utils.py)."""
        args = ["--all2all-backend", self.all2all_backend]
        if self.eplb:
            args += ["--enable-eplb", "--eplb-config", self.eplb_config()]
        if self.dbo:
            args += ["--enable-dbo", "--dbo-decode-token-threshold", str(self.dbo_decode_token_threshold),
                     "--dbo-prefill-token-threshold", str(self.dbo_prefill_token_threshold)]
        if self.async_scheduling:
            args.append("--async-scheduling")
        args += ["--api-server-count", str(self.api_server_count)]
        return args


def applies(plan: Plan) -> bool:
    """Wide-EP settings belong to expert-parallel layouts only."""
    return plan.expert_parallel and plan.expert_parallel_size > 1


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase: expected one of {', '.join(PHASES)}, got {phase!r}")


def backend_for_phase(plan: Plan, phase: str) -> tuple[str, str]:
    """(`--all2all-backend`, why) for an engine group of `plan` serving `phase`: prefill,
    decode, or aggregated (both on the same engines)."""
    _check_phase(phase)
    if not applies(plan):
        return DEFAULT_ALL2ALL, "no expert parallelism: no all-to-all"
    if plan.nodes == 1 or not plan.rdma:
        return DEFAULT_ALL2ALL, (
            "the EP group stays within one node's NVLink; vLLM's guide gives the DeepEP kernels to multi-node "
            "EP (its backend selection guide), so vLLM's default all-to-all stays")
    if phase == "prefill":
        return DEEPEP_HIGH_THROUGHPUT, (
            "prefill across nodes: DeepEP's high-throughput kernels (grouped GEMM, continuous layout), the vLLM "
            "guide's and llm-d's choice for prefill")
    if phase == "decode":
        return DEEPEP_LOW_LATENCY, (
            "decode across nodes: DeepEP's low-latency kernels (CUDA graphs, masked layout), the vLLM guide's and "
            "llm-d's choice for decode")
    return DEEPEP_LOW_LATENCY, (
        "aggregated engines run decode and prefill chunks in the same steps; vLLM turns CUDA graphs off for "
        "deepep_high_throughput with DP > 1 (vllm/config/compilation.py), which would run every decode step "
        "eagerly, so the low-latency kernels, the decode recipe, serve both (prefill chunks pay for it)")


def expert_bytes_per_layer(model: ModelSpec, quantization: str | None) -> float:
    """GPU bytes of one routed expert of one MoE layer (gate, up and down projections)."""
    quant = normalize_quantization(model, quantization)
    return 3 * model.hidden_size * model.moe_intermediate_size * weight_bytes_per_param(quant)


def _moe_layers(model: ModelSpec, plan: Plan) -> int:
    # the MTP module's MoE layer is balanced too (vLLM's deepseek_mtp implements MixtureOfExperts)
    return model.num_moe_layers + (model.mtp_layers if plan.speculative_tokens else 0)


def redundant_bytes_per_gpu(model: ModelSpec, plan: Plan, redundant: int) -> int:
    """GPU memory the EPLB replicas take on the busiest GPU: its extra expert slots in every
    MoE layer."""
    ep = plan.expert_parallel_size
    slots = -(-(model.n_routed_experts + redundant) // ep)
    extra = max(slots - plan.experts_per_gpu, 0)
    return int(extra * _moe_layers(model, plan) * expert_bytes_per_layer(model, plan.quantization_requested))


def _kv_tokens(model: ModelSpec, plan: Plan, kv_bytes: int) -> int:
    return kv_cache_tokens_for_bytes(model, kv_bytes, tensor_parallel_size=plan.tensor_parallel_size,
                                     pipeline_parallel_size=plan.pipeline_parallel_size,
                                     kv_cache_dtype=plan.kv_cache_dtype, block_size=plan.block_size,
                                     mtp=plan.speculative_tokens > 0)


def _kv_without_replicas(model: ModelSpec, plan: Plan) -> int:
    """The plan's KV cache per GPU before any EPLB replicas were counted in."""
    return plan.kv_cache_bytes_per_gpu + redundant_bytes_per_gpu(model, plan, plan.redundant_experts or 0)


def redundant_experts(model: ModelSpec, plan: Plan) -> tuple[int, str]:
    """(`num_redundant_experts`, why), sized by the plan: the most up to the recipes' 32 (or
    one per GPU when the EP group is wider) that keep `(routed + redundant) % EP == 0` and
    cost at most MAX_EPLB_KV_SHARE of the planned KV cache, which must still hold
    `max_model_len`. The same answer for a plan that already counts them."""
    if model.architecture not in EPLB_ARCHITECTURES:
        return 0, f"vLLM's EPLB is not known to support {model.architecture}"
    ep, routed = plan.expert_parallel_size, model.n_routed_experts
    ceiling = max(RECIPE_REDUNDANT_EXPERTS, ep)
    kv = _kv_without_replicas(model, plan)
    budget = int(MAX_EPLB_KV_SHARE * kv)
    for r in range(ceiling, 0, -1):
        if (routed + r) % ep:
            continue
        cost = redundant_bytes_per_gpu(model, plan, r)
        left = _kv_tokens(model, plan, kv - cost)
        if cost > budget or left < plan.max_model_len:
            continue
        if _seqs_given(plan) and plan.sequence_tokens and left < plan.max_num_seqs * plan.sequence_tokens:
            continue  # a stated max_num_seqs must still hold the workload's sequences
        return r, (f"{r} redundant experts ({(routed + r) // ep} slots per GPU for {routed} routed experts over "
                   f"EP{ep}) cost {cost / GiB:.1f} GiB per GPU, {cost / kv:.0%} of the KV cache (at most "
                   f"{MAX_EPLB_KV_SHARE:.0%}); the recipes run {RECIPE_REDUNDANT_EXPERTS}")
    return 0, (f"no redundant expert count up to {ceiling} divides evenly over EP{ep} within "
               f"{MAX_EPLB_KV_SHARE:.0%} of the KV cache: EPLB only rearranges the experts")


def _seqs_given(plan: Plan) -> bool:
    return plan.why.get("max_num_seqs", "").endswith(": given")


def _resized_seqs(plan: Plan, tokens: int, redundant: int) -> tuple[int, dict[str, str]]:
    """max_num_seqs by the planner's rule (capacity/planner.py) for the KV cache left after
    the replicas; a stated one stays."""
    if _seqs_given(plan):
        return plan.max_num_seqs, plan.why
    if plan.sequence_tokens:
        seqs = max(1, min(DEFAULT_MAX_NUM_SEQS, tokens // plan.sequence_tokens))
        why = (f"{seqs}: the sequences of {plan.sequence_tokens:,} tokens (the workload's input + output) the KV "
               f"cache of {tokens:,} tokens per engine holds after EPLB's {redundant} redundant experts")
    else:
        seqs = max(1, min(DEFAULT_MAX_NUM_SEQS, tokens // 1024))
        why = f"{seqs}: min({DEFAULT_MAX_NUM_SEQS}, KV cache tokens // 1024) after EPLB's {redundant} redundant experts"
    return seqs, {**plan.why, "max_num_seqs": why}


def with_redundant_experts(model: ModelSpec, plan: Plan) -> Plan:
    """The plan with the EPLB replicas `decide` renders counted: their bytes leave the KV
    cache, whose token counts are recomputed. Other layouts come back unchanged."""
    if not applies(plan) or plan.redundant_experts is not None:
        return plan
    r, _ = redundant_experts(model, plan)
    cost = redundant_bytes_per_gpu(model, plan, r)
    if not cost:
        return replace(plan, redundant_experts=r)
    kv = plan.kv_cache_bytes_per_gpu - cost
    tokens = _kv_tokens(model, plan, kv)
    ctx = plan.context
    seqs, why = _resized_seqs(plan, tokens, r)
    return replace(
        plan, redundant_experts=r, max_num_seqs=seqs, why=why, weights_bytes_per_gpu=plan.weights_bytes_per_gpu + cost,
        kv_cache_bytes_per_gpu=kv, kv_cache_tokens=tokens, replica_kv_cache_tokens=tokens * plan.data_parallel_size,
        concurrency_at_context=plan.data_parallel_size * (tokens // ctx) if ctx > 0 else 0,
        notes=[*plan.notes, f"EPLB: {r} redundant experts take {cost / GiB:.1f} GiB per GPU from the KV cache"])


def _dbo(plan: Plan, backend: str, phase: str) -> tuple[bool, int, int, str]:
    prefill = DBO_PREFILL_TOKENS["prefill" if phase == "prefill" else "aggregated"]
    if not backend.startswith("deepep"):
        return False, DBO_DECODE_TOKENS, prefill, f"vLLM runs dual-batch overlap with the DeepEP backends only, not {backend}"
    if plan.data_parallel_size < 2:
        return False, DBO_DECODE_TOKENS, prefill, "dual-batch overlap needs data parallel attention (DP > 1)"
    return True, DBO_DECODE_TOKENS, prefill, (
        f"overlap each micro-batch's all-to-all with the other's compute; batches over {DBO_DECODE_TOKENS} decode "
        f"tokens or {prefill} tokens with a prefill are split in two (llm-d: 32 per phase; vLLM's prefill default "
        "512 for mixed batches)")


def decide(model: ModelSpec, plan: Plan, phase: str = "aggregated") -> WideEP | None:
    """Every wide-EP flag of an engine group of `plan` serving `phase`; None for a layout
    without expert parallelism."""
    _check_phase(phase)
    if not applies(plan):
        return None
    backend, why_backend = backend_for_phase(plan, phase)
    r, why_r = redundant_experts(model, plan)
    eplb = model.architecture in EPLB_ARCHITECTURES
    dbo, dbo_decode, dbo_prefill, why_dbo = _dbo(plan, backend, phase)
    servers = plan.data_parallel_size
    choices = (
        Choice("--all2all-backend", backend, why_backend, VLLM_EP_GUIDE if backend.startswith("deepep") else VLLM_SOURCE),
        Choice("--enable-eplb", str(eplb).lower(),
               "EPLB moves (and replicates) the hottest experts across the EP ranks from their measured load"
               if eplb else why_r, VLLM_EP_GUIDE),
        Choice("--eplb-config", str(r) if eplb else None, why_r, f"{VLLM_EP_GUIDE}, {LLMD_WIDE_EP}, {DEEPSEEK_SYSTEM}"),
        Choice("--enable-dbo", str(dbo).lower(), why_dbo, f"{VLLM_DBO}, {LLMD_WIDE_EP}"),
        Choice("--async-scheduling", "true",
               "schedule step n+1 while step n runs on the GPU; vLLM 0.32 turns it on only when nothing conflicts, "
               "the flag makes a conflict fail at start instead of running without it (vllm/config/vllm.py)",
               f"{LLMD_WIDE_EP}, {VLLM_BLOG}"),
        Choice("--api-server-count", str(servers),
               f"the leader's API servers front all {plan.data_parallel_size} engines (internal load balancing; the "
               "other nodes run headless): one API process per engine, as the vLLM guide recommends and `vllm "
               "serve` defaults to; hybrid load balancing (an API server per node) needs a router that reaches "
               "every node's pods", VLLM_EP_GUIDE),
    )
    return WideEP(phase=phase, all2all_backend=backend, eplb=eplb, redundant_experts=r if eplb else 0, dbo=dbo,
                  dbo_decode_token_threshold=dbo_decode, dbo_prefill_token_threshold=dbo_prefill,
                  async_scheduling=True, api_server_count=servers, choices=choices)
