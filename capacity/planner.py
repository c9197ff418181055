"""Capacity planner: will this model fit these GPUs under vLLM, and how?

The byte counts it plans with (weights per stage, KV per token, tokens per KV budget) are
`capacity.memory`'s; they are re-exported here.

Pure functions, no I/O. ``plan()`` picks (or checks) tensor/pipeline parallel sizes,
the number of nodes, ``max_model_len``, ``max_num_seqs`` and
``gpu_memory_utilization``, and reports the per-GPU memory breakdown together with
the reasons when a configuration cannot fit.

Memory model per GPU (the worst pipeline stage), as vLLM allocates it::

    budget   = gpu_memory_utilization x device memory
    KV cache = budget - weights - reserve          (must hold >= max_model_len tokens)

* weights: counted per tensor from the architecture, split the way vLLM shards them
  (vocab-parallel embedding and LM head; column/row-parallel attention and MLP;
  every MoE expert resident and sharded by TP; MLA's q_a/kv_a projections and the
  router replicated), with quantization overheads (FP8 128x128 block scales, AWQ
  int4 with a group-128 scale and zero point).
* reserve: activation peak of the profiling forward pass for
  ``max_num_batched_tokens`` tokens plus sampler logits for ``max_num_seqs``, CUDA
  context/workspaces, communication buffers and CUDA graphs (constants below,
  explained in README.md).
* KV per token per GPU: GQA ``2 x layers/pp x max(1, kv_heads/tp) x head_dim x bytes``;
  MLA ``layers/pp x (kv_lora_rank + rope_dim) x bytes`` (the latent is replicated on
  every tensor-parallel rank), plus DeepSeek-V3.2's sparse-attention indexer key
  (``ModelSpec.indexer_bytes_per_token``, FP8 whatever the KV dtype). An FP8 KV cache
  halves the latent. Tokens are counted in whole
  blocks exactly as vLLM does (``available // (page_bytes x layers) x block_size``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from capacity.params import (
    kv_heads_per_rank,
    count_parameters,
    experts_per_rank,
    layer_params,
    pp_layer_ranges,
)
from capacity.memory import (  # noqa: F401  (re-exported: the planner's public names)
    DEFAULT_BLOCK_SIZE,
    KV_CACHE_DTYPES,
    PlanError,
    QUANTIZATIONS,
    QUANT_GROUP,
    _QUANT_ALIASES,
    activation_bytes,
    checkpoint_bytes,
    kv_bytes_per_token_per_gpu,
    kv_bytes_per_token_per_layer,
    kv_cache_tokens_for_bytes,
    kv_element_bytes,
    max_stage_layers,
    mtp_weight_bytes,
    normalize_quantization,
    online_quantization,
    stage_weight_bytes,
    weight_bytes_per_param,
)
from capacity.specs import GiB, GPUSpec, MiB, ModelSpec, sparse_attention_problem

# ----------------------------------------------------------------------------
# Constants of the reserve estimate (see README.md for where they come from)
# ----------------------------------------------------------------------------
CUDA_CONTEXT_BYTES = 600 * MiB  # CUDA context + cuBLAS/cuDNN workspaces (non-torch memory)
COMM_BUFFER_BYTES = 512 * MiB  # NCCL channels + vLLM custom all-reduce buffers, when world > 1
CUDA_GRAPH_BYTES = 1 * GiB  # graph pools for the default capture sizes (up to 512)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM V1 default for the OpenAI server
DEFAULT_MAX_NUM_SEQS = 256  # vLLM default max_num_seqs
DEFAULT_PLANNING_CONTEXT = 32768  # context used to choose TP/PP when none is given
MIN_USEFUL_CONTEXT = 4096  # below this a deployment is reported as not fitting
HEADROOM_TARGET_BYTES = 2 * GiB  # memory left outside vLLM's budget (fragmentation, driver)
MAX_RECOMMENDED_UTILIZATION = 0.95
MAX_PIPELINE_STAGES = 32
# Expert parallel: all-to-all dispatch/combine buffers per GPU (DeepEP / pplx-style
# kernels allocate fixed send/receive buffers); an estimate, like the other reserves.
EP_ALL2ALL_BYTES = 1 * GiB
# Parallel layouts the planner chooses between (docs/planner.md):
#   tp_pp  tensor parallel within a node, pipeline stages across nodes; experts sharded by TP
#   tp_ep  attention tensor parallel (a DP group per node when multi-node), experts split
#          whole across all ranks (--enable-expert-parallel)
#   dp_ep  attention data parallel (one engine per GPU, each with its own KV cache), experts
#          split whole across all ranks: the vLLM DeepSeek throughput recipe
PARALLELISMS = ("tp_pp", "tp_ep", "dp_ep")

# ----------------------------------------------------------------------------
# Reserve (non-KV, non-weight memory)
# ----------------------------------------------------------------------------

def estimate_reserve(m: ModelSpec, tp: int, pp: int, max_num_batched_tokens: int,
                     max_num_seqs: int, ep: int | None = None, dp: int = 1) -> dict[str, int]:
    """Per-GPU non-KV memory besides weights, by component (bytes)."""
    t = max_num_batched_tokens
    b = activation_bytes(m)
    h = m.hidden_size
    hl = m.num_attention_heads / tp
    # Residual stream, normed input, attention output and MLP output live together.
    hidden_tmp = 4 * t * h * b
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        # prefill up-projects the latent: q, k, v and attention output per local head
        attn_tmp = t * (hl * (qk + qk + m.v_head_dim + m.v_head_dim)
                        + m.kv_lora_rank + m.qk_rope_head_dim) * b
    else:
        kvl = kv_heads_per_rank(m, tp)
        attn_tmp = t * (2 * hl + 2 * kvl) * m.head_dim * b
    mlp_tmp = t * 3 * m.intermediate_size / tp * b  # gate_up output + activation
    moe_tmp = 0.0
    if m.is_moe:
        # fused_moe intermediate caches: topk copies of gate_up, activation and down outputs
        # (with expert parallelism the experts are whole, not split by TP)
        width = m.moe_intermediate_size if ep else m.moe_intermediate_size / tp
        moe_tmp = t * m.num_experts_per_tok * (3 * width + h) * b
        moe_tmp += t * m.n_routed_experts * 4  # fp32 router logits
    activation = hidden_tmp + max(attn_tmp, mlp_tmp, moe_tmp)
    sampler = 2 * max_num_seqs * m.vocab_size * 4  # fp32 logits + probabilities
    world = tp * pp * dp
    return {
        "activation_peak": int(activation),
        "sampler_logits": int(sampler),
        "cuda_context": CUDA_CONTEXT_BYTES,
        "communication": (COMM_BUFFER_BYTES if world > 1 else 0) + (EP_ALL2ALL_BYTES if ep and ep > 1 else 0),
        "cuda_graphs": CUDA_GRAPH_BYTES,
    }


def recommended_gpu_memory_utilization(gpu: GPUSpec) -> float:
    """Leave ~2 GiB outside vLLM's budget, never more than 0.95 of the device."""
    frac = 1.0 - HEADROOM_TARGET_BYTES / gpu.memory_bytes
    return min(MAX_RECOMMENDED_UTILIZATION, math.floor(frac * 100) / 100)


# ----------------------------------------------------------------------------
# Plan
# ----------------------------------------------------------------------------

@dataclass
class Plan:
    model: str
    gpu: str
    fits: bool
    tensor_parallel_size: int
    pipeline_parallel_size: int
    nodes: int
    gpus_per_node: int
    total_gpus: int
    quantization: str
    quantization_requested: str | None
    kv_cache_dtype: str
    block_size: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    weights_bytes_per_gpu: int
    reserve_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_cache_bytes_per_gpu: int
    headroom_bytes_per_gpu: int
    kv_cache_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    context: int
    concurrency_at_context: int
    reserve_breakdown: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # reasons the TP x PP layout itself is invalid (then no memory figure means anything)
    layout_problems: list[str] = field(default_factory=list)
    # Expert/data parallelism and speculative decoding (defaults: plain TP x PP).
    parallelism: str = "tp_pp"
    data_parallel_size: int = 1  # engines (attention replicas) in one serving replica
    expert_parallel: bool = False
    expert_parallel_size: int = 1  # ranks the routed experts are split across (TP x DP)
    experts_per_gpu: int = 0  # routed experts resident on each GPU (per MoE layer)
    rdma: bool = False  # the nodes of a replica talk over RDMA
    speculative_tokens: int = 0  # MTP draft tokens per step (0: off)
    mtp_bytes_per_gpu: int = 0  # weights of the MTP modules on the GPUs that hold them
    replica_kv_cache_tokens: int = 0  # tokens of KV cache across the replica's engines
    # the request the engine is sized for (the workload's input + output tokens; 0: not stated)
    sequence_tokens: int = 0
    # why each default was chosen: {"layout": ..., "max_model_len": ..., "max_num_seqs": ...}
    why: dict[str, str] = field(default_factory=dict)
    # vLLM's --quantization when the engine quantises at load time (online FP8 of a 16-bit
    # checkpoint); None when the checkpoint's config.json carries its method (vLLM detects it)
    online_quantization: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def vllm_args(self) -> list[str]:
        """Engine arguments matching this plan (for renderers and docs)."""
        args = [
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--pipeline-parallel-size", str(self.pipeline_parallel_size),
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:.2f}",
        ]
        if self.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.online_quantization:
            args += ["--quantization", self.online_quantization]
        if self.data_parallel_size > 1:
            args += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.expert_parallel:
            args += ["--enable-expert-parallel"]
        if self.speculative_tokens:
            args += ["--speculative-config", speculative_config(self.speculative_tokens)]
        return args

    def describe_layout(self) -> str:
        """E.g. `DP16 + EP16 (attention data parallel, 16 experts per GPU), 2 nodes`."""
        if self.parallelism == "dp_ep":
            what = (f"DP{self.data_parallel_size}" + (f" x TP{self.tensor_parallel_size}"
                                                      if self.tensor_parallel_size > 1 else "")
                    + f" + EP{self.expert_parallel_size}")
        elif self.parallelism == "tp_ep":
            what = (f"TP{self.tensor_parallel_size}" + (f" x DP{self.data_parallel_size}"
                                                        if self.data_parallel_size > 1 else "")
                    + f" + EP{self.expert_parallel_size}")
        else:
            what = f"TP{self.tensor_parallel_size} x PP{self.pipeline_parallel_size}"
        extra = f", {self.experts_per_gpu} routed experts per GPU" if self.expert_parallel else ""
        mtp = f", MTP {self.speculative_tokens} token(s)" if self.speculative_tokens else ""
        return f"{what}{extra}{mtp} on {self.nodes} node(s)"


def speculative_config(tokens: int) -> str:
    """vLLM's --speculative-config for DeepSeek's own MTP modules."""
    return '{"method":"deepseek_mtp","num_speculative_tokens":%d}' % tokens


def _gib(x: float) -> str:
    return f"{x / GiB:,.1f} GiB"


def _positive_int(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{name}: expected a positive integer, got {value!r}")
    return value


def tp_problems(model: ModelSpec, tp: int, quant: str, expert_parallel: bool = False) -> list[str]:
    """Why ``tp`` is not a valid tensor-parallel size for this model (empty if valid). With
    expert parallelism the routed experts are not split by TP, so their width is no
    constraint (the shared experts still are)."""
    out = []
    if model.num_attention_heads % tp:
        out.append(f"tensor_parallel_size={tp} does not divide num_attention_heads="
                   f"{model.num_attention_heads}")
    if not model.is_mla and model.num_kv_heads % tp and tp % model.num_kv_heads:
        out.append(f"tensor_parallel_size={tp} neither divides nor is a multiple of "
                   f"num_kv_heads={model.num_kv_heads}")
    sizes = [("intermediate_size", model.intermediate_size)]
    if model.is_moe and (not expert_parallel or model.n_shared_experts):
        sizes.append(("moe_intermediate_size", model.moe_intermediate_size))
    rule = quant_tile(model, quant)
    for fname, size in sizes:
        if size % tp:
            out.append(f"tensor_parallel_size={tp} does not divide {fname}={size}")
        elif rule and (size // tp) % rule[1]:
            out.append(f"{fname}/tensor_parallel_size = {size}/{tp} = {size // tp} is not a "
                       f"multiple of the {rule[0]} size {rule[1]}")
    return out


def quant_tile(model: ModelSpec, quant: str) -> tuple[str, int] | None:
    """The quantisation unit a tensor-parallel shard of an MLP must hold whole: the FP8
    weight block of a block-quantised checkpoint (config.json weight_block_size; vLLM's
    validate_fp8_block_shape), or the int4 group of an AWQ / W4A16 checkpoint. None for
    online FP8 of a 16-bit checkpoint and FP8 checkpoints with per-tensor or per-channel
    scales: their scales do not tile the weight."""
    if quant == "fp8":
        block = model.fp8_block_size if model.native_dtype == "fp8" else None
        return ("FP8 weight block", max(block)) if block else None
    if quant in ("awq", "w4a16"):
        group = model.quant.group_size if model.quant and model.quant.group_size else QUANT_GROUP
        return (f"{quant.upper()} group", group)
    return None


def _evaluate(model: ModelSpec, gpu: GPUSpec, *, tp: int, pp: int, gpus_per_node: int,
              quant: str, requested: str | None, kv_cache_dtype: str, context: int | None, target: int,
              max_num_seqs: int | None, util: float | None, mnbt: int | None,
              block_size: int, dp: int = 1, ep: bool = False, rdma: bool = False,
              spec_tokens: int = 0, sequence_tokens: int | None = None) -> Plan:
    layout_problems = list(tp_problems(model, tp, quant, ep))
    reasons = list(layout_problems)
    notes: list[str] = []
    ep_size = tp * dp if ep else None
    mtp = spec_tokens > 0
    if ep and not model.is_moe:
        reasons.append(f"expert parallelism needs a mixture-of-experts model; {model.name} is dense")
        ep_size = None
    if ep and pp > 1:
        reasons.append("expert parallelism is planned within one pipeline stage: expected pipeline_parallel_size 1")
    if ep_size and ep_size > model.n_routed_experts:
        reasons.append(f"expert_parallel_size {ep_size} exceeds the {model.n_routed_experts} routed experts")
    if mtp and not model.mtp_layers:
        reasons.append(f"speculative_tokens={spec_tokens}: {model.name} ships no MTP module "
                       "(config.json num_nextn_predict_layers is 0)")
        mtp = False
    if pp > model.num_layers:
        layout_problems.append(f"pipeline_parallel_size={pp} exceeds num_layers={model.num_layers}")
        reasons.append(layout_problems[-1])
        pp_eff = model.num_layers
    else:
        pp_eff = pp
    util_eff = util if util is not None else recommended_gpu_memory_utilization(gpu)
    seqs_cap = max_num_seqs or DEFAULT_MAX_NUM_SEQS
    batched = mnbt or max(DEFAULT_MAX_NUM_BATCHED_TOKENS, seqs_cap)
    weights = max(stage_weight_bytes(model, quant, tp, pp_eff, ep_size, mtp))
    mtp_bytes = mtp_weight_bytes(model, quant, tp, pp_eff, ep_size) if mtp else 0
    reserve_parts = estimate_reserve(model, tp, pp_eff, batched, seqs_cap, ep_size, dp)
    reserve = sum(reserve_parts.values())
    budget = int(util_eff * gpu.memory_bytes)
    kv_bytes = budget - weights - reserve
    kv_tok_bytes = kv_bytes_per_token_per_gpu(model, tp, pp_eff, kv_cache_dtype, mtp)
    tokens = kv_cache_tokens_for_bytes(model, max(kv_bytes, 0), tensor_parallel_size=tp,
                                       pipeline_parallel_size=pp_eff,
                                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, mtp=mtp)
    parallelism = ("dp_ep" if tp == 1 or dp > tp else "tp_ep") if ep else "tp_pp"
    where = (f"TP={tp}, PP={pp} on {gpu.name}" if not ep and dp == 1
             else f"TP={tp}, DP={dp}{', EP' if ep else ''} on {gpu.name}")
    if weights + reserve > budget:
        reasons.append(
            f"weights need {_gib(weights)} per GPU and the reserve {_gib(reserve)}, but "
            f"gpu_memory_utilization {util_eff:.2f} x {_gib(gpu.memory_bytes)} = {_gib(budget)} "
            f"({where}); short by {_gib(weights + reserve - budget)}")
    if context is not None and context > model.max_context:
        reasons.append(f"context={context} exceeds the model's maximum context "
                       f"(max_position_embeddings={model.max_context})")
    if context is not None:
        max_len = context
    else:
        max_len = min(model.max_context, tokens)
        if max_len >= 1024:
            max_len -= max_len % 1024
    if tokens < target and weights + reserve <= budget:
        need = target * kv_tok_bytes
        reasons.append(
            f"KV cache holds {tokens:,} tokens ({_gib(max(kv_bytes, 0))} per GPU at "
            f"{kv_tok_bytes:,} bytes/token/GPU) but max_model_len={target:,} needs "
            f"{_gib(need)} ({where})")
    ctx = context or min(model.max_context, DEFAULT_PLANNING_CONTEXT)
    ctx = min(ctx, max_len) if context is None and max_len > 0 else ctx
    concurrency = dp * (tokens // ctx) if ctx > 0 else 0
    whys: dict[str, str] = {}
    # the request the engine is sized for: the workload's, never longer than the context
    seq = min(sequence_tokens, max_len) if sequence_tokens and max_len > 0 else 0
    holds = tokens // seq if seq else 0
    if max_num_seqs is None and seq:
        seqs = max(1, min(DEFAULT_MAX_NUM_SEQS, holds))
        whys["max_num_seqs"] = (f"{seqs}: the sequences of {seq:,} tokens (the workload's input + output) the KV "
                               f"cache of {tokens:,} tokens per engine holds"
                               + (f", capped at vLLM's default {DEFAULT_MAX_NUM_SEQS}"
                                  if holds > DEFAULT_MAX_NUM_SEQS else ""))
    elif max_num_seqs is None:
        seqs = max(1, min(DEFAULT_MAX_NUM_SEQS, tokens // 1024))
        whys["max_num_seqs"] = f"{seqs}: min({DEFAULT_MAX_NUM_SEQS}, KV cache tokens // 1024) (no workload stated)"
    else:
        seqs = max_num_seqs
        whys["max_num_seqs"] = f"{seqs}: given"
    if context is not None:
        whys["max_model_len"] = f"{max_len:,}: given"
    else:
        whys["max_model_len"] = f"{max_len:,}: the largest the KV cache holds (no workload stated)"
    if mnbt is not None and mnbt < max_len and context is not None:
        notes.append(f"max_num_batched_tokens={mnbt} < max_model_len={max_len}: "
                     f"long prompts are prefilled in chunks (chunked prefill)")
    if max_num_seqs is not None and mnbt is not None and mnbt < max_num_seqs:
        reasons.append(f"max_num_batched_tokens={mnbt} must be >= max_num_seqs={max_num_seqs}")
    if (why := sparse_attention_problem(model, gpu)) is not None:
        reasons.append(why)
    if quant == "fp8" and not gpu.fp8:
        notes.append(f"{gpu.name} has no FP8 tensor cores: vLLM runs FP8 weights with "
                     f"weight-only FP8 (Marlin) kernels, slower than on Hopper")
    if kv_element_bytes(model, kv_cache_dtype) == 1 and not gpu.fp8:
        notes.append(f"FP8 KV cache on {gpu.name} is stored in FP8 but computed in 16-bit")
    total = tp * pp * dp
    nodes = max(1, math.ceil(total / gpus_per_node))
    if tp > gpus_per_node:
        notes.append(f"tensor_parallel_size={tp} spans {math.ceil(tp / gpus_per_node)} nodes: "
                     f"all-reduce crosses the network on every layer")
    if nodes > 1 and total % gpus_per_node:
        reasons.append(f"{total} GPUs do not fill whole nodes of {gpus_per_node}: a multi-node replica takes "
                       "every GPU of its nodes")
    if ep and nodes > 1 and not rdma:
        reasons.append(f"expert parallelism across {nodes} nodes sends every MoE layer's tokens all-to-all "
                       "between nodes: it needs RDMA between them (an RDMA pool); without it, a node shape "
                       "that holds one replica alone")
    elif nodes > 1 and not rdma:
        reasons.append(
            f"TP{tp} x PP{pp} spans {nodes} nodes of {gpus_per_node} {gpu.name}: the stages pass activations "
            "between nodes on every step, which needs RDMA between them; use an instance type with RDMA "
            "(ecs.hpc*/ecs.ebmhpc*; `dsvolc size --rdma`), or a node shape that holds one replica alone "
            "(`dsvolc size --compare` lists them)")
    if mtp and pp_eff > 1:
        notes.append("MTP with pipeline stages: the MTP module keeps its own embedding and LM head "
                     "(vLLM shares the target's only without PP)")
    return Plan(
        model=model.name, gpu=gpu.name, fits=not reasons,
        tensor_parallel_size=tp, pipeline_parallel_size=pp, nodes=nodes,
        gpus_per_node=gpus_per_node, total_gpus=total, quantization=quant,
        quantization_requested=requested,
        kv_cache_dtype=kv_cache_dtype, block_size=block_size,
        gpu_memory_bytes=gpu.memory_bytes, gpu_memory_utilization=util_eff,
        weights_bytes_per_gpu=weights, reserve_bytes_per_gpu=reserve,
        kv_bytes_per_token_per_gpu=kv_tok_bytes, kv_cache_bytes_per_gpu=max(kv_bytes, 0),
        headroom_bytes_per_gpu=gpu.memory_bytes - budget, kv_cache_tokens=tokens,
        max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
        context=ctx, concurrency_at_context=concurrency, reserve_breakdown=reserve_parts,
        reasons=reasons, notes=notes, layout_problems=layout_problems,
        parallelism=parallelism, data_parallel_size=dp, expert_parallel=ep,
        expert_parallel_size=ep_size or 1,
        experts_per_gpu=(experts_per_rank(model, ep_size) if ep_size else
                         (model.n_routed_experts if model.is_moe else 0)),
        rdma=rdma, speculative_tokens=spec_tokens if mtp else 0, mtp_bytes_per_gpu=mtp_bytes,
        replica_kv_cache_tokens=tokens * dp, sequence_tokens=seq, why=whys,
    )


MAX_EP_NODES = 8  # nodes the layout search tries for an expert-parallel replica


def plan(model: ModelSpec, gpu: GPUSpec, *, gpus_per_node: int = 8, context: int | None = None,
         quantization: str | None = None, kv_cache_dtype: str = "auto",
         tensor_parallel_size: int | None = None, pipeline_parallel_size: int | None = None,
         max_num_seqs: int | None = None, gpu_memory_utilization: float | None = None,
         max_num_batched_tokens: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
         parallelism: str = "auto", data_parallel_size: int | None = None, rdma: bool = False,
         speculative_tokens: int = 0, sequence_tokens: int | None = None) -> Plan:
    """Plan a vLLM deployment of ``model`` on ``gpu`` nodes.

    Layouts (``parallelism``; PARALLELISMS): ``tp_pp`` (tensor parallel within a node,
    pipeline stages across nodes), ``tp_ep`` and ``dp_ep`` (experts split whole across all
    ranks, attention tensor or data parallel). ``auto`` chooses (docs/planner.md):

    * a model that fits part of a node runs there with the smallest TP (no EP: a replica
      on a few GPUs needs no all-to-all);
    * otherwise, for the fewest nodes that hold the planning context, an MoE model takes
      DP + EP if its replicated parts (attention, dense layers, shared experts,
      embeddings) plus its share of the experts fit each GPU, else TP + EP, else TP x PP;
      across nodes the EP layouts need ``rdma`` (their all-to-all crosses nodes every
      layer), so without it only TP x PP spans nodes (activations cross once per stage);
    * given ``tensor_parallel_size``/``pipeline_parallel_size`` keep the TP x PP search
      (sizes kept and checked, the missing one chosen).

    ``speculative_tokens`` > 0 loads the model's MTP modules (DeepSeek-V3/R1) for MTP
    speculative decoding, with their weights and KV cache counted. Raises PlanError for
    malformed input; an infeasible but well-formed request returns ``fits=False`` with
    ``reasons``.

    ``sequence_tokens``: the request the engine is sized for (a workload's input + output
    tokens). Unset ``context`` is then that length (capped at the model's), unset
    ``max_num_seqs`` the sequences of that length the KV cache holds (at most 256), and a
    given ``max_num_seqs`` above that is refused. Without it: the largest context the KV
    cache holds and ``min(256, KV tokens // 1024)`` sequences. ``Plan.why`` says which.
    """
    _positive_int("sequence_tokens", sequence_tokens)
    derived = context is None and sequence_tokens is not None and isinstance(model, ModelSpec)
    p = _plan(model, gpu, gpus_per_node=gpus_per_node,
              context=min(sequence_tokens, model.max_context) if derived else context,
              quantization=quantization, kv_cache_dtype=kv_cache_dtype,
              tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
              max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization,
              max_num_batched_tokens=max_num_batched_tokens, block_size=block_size, parallelism=parallelism,
              data_parallel_size=data_parallel_size, rdma=rdma, speculative_tokens=speculative_tokens,
              sequence_tokens=sequence_tokens)
    holds = p.kv_cache_tokens // p.sequence_tokens if p.sequence_tokens else 0
    if p.fits and max_num_seqs is not None and p.sequence_tokens and max_num_seqs > holds:
        # checked on the layout chosen (by memory for the context), not a reason to grow it
        p.fits = False
        p.reasons.append(
            f"max_num_seqs={max_num_seqs} exceeds what the KV cache holds: {p.kv_cache_tokens:,} tokens per engine "
            f"hold {holds} sequence(s) of {p.sequence_tokens:,} tokens (the workload's input + output); expected "
            f"at most {max(holds, 1)}, or a shorter workload, or more KV cache (more GPUs, an FP8 KV cache)")
    if derived:
        capped = " (capped at the model's maximum)" if sequence_tokens > model.max_context else ""
        p.why["max_model_len"] = f"{p.max_model_len:,}: the workload's input + output tokens{capped}"
    given = [f"{k} {v}" for k, v in (("parallelism", parallelism if parallelism != "auto" else None),
                                      ("tensor_parallel_size", tensor_parallel_size),
                                      ("pipeline_parallel_size", pipeline_parallel_size),
                                      ("data_parallel_size", data_parallel_size)) if v is not None]
    p.why["layout"] = (f"{p.describe_layout()}: given ({', '.join(given)})" if given else
                       f"{p.describe_layout()}: the fewest GPUs whose memory holds the context (the planner's "
                       "search, docs/planner.md Decisions)")
    return p


def _plan(model: ModelSpec, gpu: GPUSpec, *, gpus_per_node: int, context: int | None,
          quantization: str | None, kv_cache_dtype: str, tensor_parallel_size: int | None,
          pipeline_parallel_size: int | None, max_num_seqs: int | None, gpu_memory_utilization: float | None,
          max_num_batched_tokens: int | None, block_size: int, parallelism: str,
          data_parallel_size: int | None, rdma: bool, speculative_tokens: int,
          sequence_tokens: int | None) -> Plan:
    if not isinstance(model, ModelSpec):
        raise PlanError(f"model: expected a ModelSpec, got {type(model).__name__}")
    if not isinstance(gpu, GPUSpec):
        raise PlanError(f"gpu: expected a GPUSpec, got {type(gpu).__name__}")
    _positive_int("gpus_per_node", gpus_per_node, allow_none=False)
    _positive_int("context", context)
    _positive_int("tensor_parallel_size", tensor_parallel_size)
    _positive_int("pipeline_parallel_size", pipeline_parallel_size)
    _positive_int("data_parallel_size", data_parallel_size)
    _positive_int("max_num_seqs", max_num_seqs)
    _positive_int("max_num_batched_tokens", max_num_batched_tokens)
    _positive_int("block_size", block_size, allow_none=False)
    if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int) or speculative_tokens < 0:
        raise PlanError(f"speculative_tokens: expected an integer >= 0, got {speculative_tokens!r}")
    if parallelism not in ("auto", *PARALLELISMS):
        raise PlanError(f"parallelism: expected auto or one of {', '.join(PARALLELISMS)}, got {parallelism!r}")
    if gpu_memory_utilization is not None and (
            isinstance(gpu_memory_utilization, bool)
            or not isinstance(gpu_memory_utilization, (int, float))
            or not 0.0 < gpu_memory_utilization <= 1.0):
        raise PlanError(f"gpu_memory_utilization: expected a number in (0, 1], "
                        f"got {gpu_memory_utilization!r}")
    quant = normalize_quantization(model, quantization)  # refuses a format the checkpoint cannot give
    online = online_quantization(model, quant)
    kv_dtype = (kv_cache_dtype or "auto").strip().lower()
    kv_element_bytes(model, kv_dtype)  # validates

    if context is not None:
        targets = [context]
    else:
        preferred = min(model.max_context, DEFAULT_PLANNING_CONTEXT)
        targets = [preferred] + ([min(preferred, MIN_USEFUL_CONTEXT)]
                                 if preferred > MIN_USEFUL_CONTEXT else [])

    def ev(tp: int, pp: int, target: int, dp: int = 1, ep: bool = False) -> Plan:
        return replace(_ev(tp, pp, target, dp, ep), online_quantization=online)

    def _ev(tp: int, pp: int, target: int, dp: int = 1, ep: bool = False) -> Plan:
        return _evaluate(model, gpu, tp=tp, pp=pp, gpus_per_node=gpus_per_node, quant=quant,
                         requested=_QUANT_ALIASES[quantization.strip().lower()
                                                  if isinstance(quantization, str) else None],
                         kv_cache_dtype=kv_dtype, context=context, target=target,
                         max_num_seqs=max_num_seqs, util=gpu_memory_utilization,
                         mnbt=max_num_batched_tokens, block_size=block_size, dp=dp, ep=ep, rdma=rdma,
                         spec_tokens=speculative_tokens, sequence_tokens=sequence_tokens)

    if why := sparse_attention_problem(model, gpu):  # missing kernels, not memory: no layout helps
        valid = [t for t in range(1, gpus_per_node + 1) if not tp_problems(model, t, quant)] or [1]
        return replace(ev(tensor_parallel_size or valid[-1], pipeline_parallel_size or 1, targets[0]),
                       fits=False, reasons=[why])
    sizes_given = tensor_parallel_size is not None or pipeline_parallel_size is not None
    if parallelism == "tp_pp" or (parallelism == "auto" and (not model.is_moe or sizes_given)):
        if data_parallel_size not in (None, 1):
            raise PlanError(f"data_parallel_size: {data_parallel_size} needs parallelism tp_ep or dp_ep "
                            "(data-parallel attention with expert parallelism)")
        return _plan_tp_pp(model, quant, gpus_per_node, tensor_parallel_size, pipeline_parallel_size, targets, ev)

    if parallelism == "auto":
        # A replica on part of a node: the smallest TP that fits, no EP.
        for target in targets:
            for tp in [t for t in range(1, gpus_per_node) if not tp_problems(model, t, quant)]:
                p = ev(tp, 1, target)
                if p.fits:
                    return p

    def layouts(n: int) -> list[tuple[int, int, int, bool]]:
        """(tp, pp, dp, ep) candidates on n nodes, in order of preference."""
        gpus = n * gpus_per_node
        out = []
        if parallelism in ("auto", "dp_ep"):
            tp = tensor_parallel_size or 1
            dp = data_parallel_size or max(gpus // tp, 1)
            out.append((tp, 1, dp, True))
        if parallelism in ("auto", "tp_ep"):
            tp = tensor_parallel_size or gpus_per_node
            dp = data_parallel_size or max(gpus // tp, 1)
            out.append((tp, 1, dp, True))
        if parallelism == "auto":
            valid = [t for t in range(1, gpus_per_node + 1) if not tp_problems(model, t, quant)]
            if valid:
                out.append((valid[-1], n, 1, False))
        return out

    explicit_dp = data_parallel_size is not None and parallelism != "auto"
    node_counts = [None] if explicit_dp else list(range(1, MAX_EP_NODES + 1))
    last: Plan | None = None
    blocked: Plan | None = None  # the first layout whose memory fits but needs RDMA
    for target in targets:
        for n in node_counts:
            for tp, pp, dp, ep in layouts(n or 1):
                if ep and parallelism == "auto" and (n or 1) > 1 and not rdma:
                    continue  # no all-to-all across nodes without RDMA
                p = ev(tp, pp, target, dp, ep)
                if p.fits:
                    return p
                if blocked is None and all("needs RDMA" in r for r in p.reasons):
                    blocked = p
                last = p if last is None or parallelism != "auto" or ep else last
    assert last is not None
    return blocked or last


def _plan_tp_pp(model: ModelSpec, quant: str, gpus_per_node: int, tensor_parallel_size: int | None,
                pipeline_parallel_size: int | None, targets: list[int], ev) -> Plan:
    """The TP x PP search: given sizes kept, missing ones chosen (the smallest valid TP
    within one node whose KV cache holds the planning context, else full-node TP with the
    fewest pipeline stages, one node per stage)."""
    if tensor_parallel_size is not None and pipeline_parallel_size is not None:
        return ev(tensor_parallel_size, pipeline_parallel_size, targets[-1])

    if tensor_parallel_size is not None:
        if tp_problems(model, tensor_parallel_size, quant):
            # an invalid TP stays invalid at any pipeline depth: report it as asked
            return ev(tensor_parallel_size, pipeline_parallel_size or 1, targets[-1])
        tp_options = [tensor_parallel_size]
    else:
        tp_options = [t for t in range(1, gpus_per_node + 1) if not tp_problems(model, t, quant)]
        if not tp_options:
            # nothing valid within a node: report the node-sized attempt with its reasons
            return ev(gpus_per_node, pipeline_parallel_size or 1, targets[-1])
    if pipeline_parallel_size is not None:
        pp_options = [pipeline_parallel_size]
    else:
        pp_options = list(range(1, min(MAX_PIPELINE_STAGES, model.num_layers) + 1))

    blocked: Plan | None = None  # the first layout whose memory fits but whose nodes need RDMA
    for target in targets:
        for pp in pp_options:
            # beyond one stage, stages are whole nodes: use the widest valid TP
            tps = tp_options if pp == 1 or tensor_parallel_size is not None else tp_options[-1:]
            for tp in tps:
                p = ev(tp, pp, target)
                if p.fits:
                    return p
                if blocked is None and p.reasons and all("needs RDMA" in r for r in p.reasons):
                    blocked = p
    # Nothing fits: the layout that would with RDMA, else the largest tried at the preferred target.
    return blocked or ev(tp_options[-1], pp_options[-1], targets[0])


__all__ = [
    "Plan", "PlanError", "plan", "PARALLELISMS", "checkpoint_bytes", "speculative_config", "kv_cache_tokens_for_bytes", "kv_bytes_per_token_per_gpu",
    "kv_bytes_per_token_per_layer", "stage_weight_bytes", "count_parameters", "estimate_reserve",
    "recommended_gpu_memory_utilization", "tp_problems", "pp_layer_ranges", "layer_params",
    "normalize_quantization", "weight_bytes_per_param", "QUANTIZATIONS", "KV_CACHE_DTYPES",
]


# ----------------------------------------------------------------------------
# Where a model fits on one node
# ----------------------------------------------------------------------------

NODE_SIZES = (1, 2, 4, 8)  # GPUs per node of the common GPU instance families


@dataclass(frozen=True)
class NodeOption:
    """A node shape on which one replica fits without leaving the node."""

    gpu: str
    gpus_per_node: int
    instance_type: str | None  # a catalogued VolcEngine instance type of that shape, if any
    plan: Plan

    def describe(self) -> str:
        where = f" ({self.instance_type})" if self.instance_type else ""
        return f"{self.gpu} x {self.gpus_per_node}{where}: TP{self.plan.tensor_parallel_size}"


def single_node_options(model: ModelSpec, gpus: dict[str, GPUSpec],
                        instance_types: dict[str, tuple[str, int]], **plan_kwargs: Any) -> list[NodeOption]:
    """Node shapes (catalog GPU x 1/2/4/8, and every catalogued instance type) on which the
    model fits on one node with the given engine settings: catalogued instance types first
    (they can be ordered as they are), then by total GPU memory, smallest first."""
    shapes: dict[tuple[str, int], str | None] = {}
    for itype, (gpu_key, count) in sorted(instance_types.items()):
        shapes.setdefault((gpu_key, count), itype)
    for gpu_key in gpus:
        for count in NODE_SIZES:
            shapes.setdefault((gpu_key, count), None)
    kwargs = {k: v for k, v in plan_kwargs.items() if k not in ("pipeline_parallel_size", "gpus_per_node")}
    out = []
    for (gpu_key, count), itype in shapes.items():
        if kwargs.get("tensor_parallel_size") and kwargs["tensor_parallel_size"] > count:
            continue
        try:
            p = plan(model, gpus[gpu_key], gpus_per_node=count, pipeline_parallel_size=1, **kwargs)
        except PlanError:
            continue
        if p.fits and p.nodes == 1:
            out.append(NodeOption(gpu_key, count, itype, p))
    out.sort(key=lambda o: (o.instance_type is None, o.gpus_per_node * gpus[o.gpu].memory_bytes, o.gpu))
    return out
