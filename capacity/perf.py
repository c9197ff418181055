"""Performance model: decode and prefill speed of a vLLM layout, from first principles.

Pure functions. Per engine step (docs/planner.md, "The performance model"):

* **decode step** (one token for each of ``B`` sequences; with MTP ``1 + n`` tokens
  verified): per GPU, linear layers take ``max(weight bytes read / HBM, linear FLOPs /
  GEMM rate)`` and attention ``max(KV bytes read / HBM, attention FLOPs / attention
  rate)``; communication adds the tensor-parallel all-reduces (two per layer, ring, over
  NVLink or PCIe) and the expert all-to-all (dispatch FP8 + combine BF16 per routed copy,
  the share leaving the node over RDMA, the rest over NVLink); with two-batch overlap a
  fraction of the shorter of compute and communication is hidden; a fixed step overhead
  is added. Only the routed experts that some token of the step selects are read, and
  the busiest expert-parallel rank (``moe_imbalance`` x the mean) sets the pace.
* **prefill** of ``N`` tokens: linear FLOPs (plus the quadratic attention term) at the
  GEMM and attention rates, never faster than reading the weights once; communication as
  above, the all-to-all sent once per destination node (DeepEP normal kernels).
* Rates are datasheet rates times few shared efficiency factors (capacity/hardware.yaml);
  ``physical_bound`` is the same arithmetic at 100% of every rate with no communication or
  overhead, and a prediction never exceeds it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from capacity.params import experts_per_rank, layer_params, pp_layer_ranges
from capacity.planner import (
    PlanError,
    activation_bytes,
    kv_bytes_per_token_per_gpu,
    normalize_quantization,
    stage_weight_bytes,
    weight_bytes_per_param,
)
from capacity.specs import ModelSpec

HARDWARE_FILE = Path(__file__).with_name("hardware.yaml")
MODEL_SOURCE = "capacity/perf.py"
EFFICIENCY_KINDS = ("measured", "published", "fitted", "assumed")
_GPU_FIELDS = ("hbm_gb_s", "bf16_tflops", "fp8_tflops", "nvlink_gb_s", "pcie_gb_s")
# DeepSeek-V3 routes each token to experts on at most 4 nodes (config.json topk_group: 4);
# V3.2 too (DeepSeek-V3.2-Exp inference/config_671B_v3.2.json n_limited_groups: 4)
NODE_LIMITED_ROUTING = {"deepseek_v3": 4, "deepseek_v32": 4}


class PerfDataError(ValueError):
    """A hardware or calibration data file is malformed; the message names the field."""


@dataclass(frozen=True)
class GPUPerf:
    name: str
    hbm_gb_s: float
    bf16_tflops: float
    fp8_tflops: float  # 0: no FP8 tensor cores
    nvlink_gb_s: float  # datasheet total, both directions; 0: none
    pcie_gb_s: float  # one direction
    source: str
    read: str

    @property
    def hbm_bytes_s(self) -> float:
        return self.hbm_gb_s * 1e9

    def linear_flops_s(self, quant: str) -> float:
        """Peak rate of the linear layers: FP8 tensor cores for FP8 weights on GPUs that
        have them, else the 16-bit rate (weight-only FP8 / AWQ kernels compute in 16 bit)."""
        if quant == "fp8" and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


@dataclass(frozen=True)
class Factor:
    value: float
    kind: str
    basis: str


@dataclass(frozen=True)
class Hardware:
    gpus: dict[str, GPUPerf]
    communication: dict[str, Factor]
    efficiency: dict[str, Factor]
    instance_rdma: dict[str, Factor] = field(default_factory=dict)  # Gb/s per node

    def rdma_gb_s_per_gpu(self, instance_type: str | None, gpus_per_node: int) -> float:
        """RDMA GB/s per GPU of an instance type (0 when none is recorded)."""
        f = self.instance_rdma.get((instance_type or "").strip().lower())
        return f.value / 8 / gpus_per_node if f else 0.0

    def eff(self, name: str) -> float:
        return (self.efficiency.get(name) or self.communication[name]).value


_COMM_KEYS = ("nvlink_efficiency", "rdma_efficiency", "pcie_efficiency", "collective_latency_us")
_EFF_KEYS = ("hbm", "gemm", "attention", "moe_imbalance", "step_overhead_ms", "overlap", "mtp_acceptance")
_FRACTIONS = {"nvlink_efficiency", "rdma_efficiency", "pcie_efficiency", "hbm", "gemm", "attention",
              "overlap", "mtp_acceptance"}


def _number(where: str, value: Any, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value < 0):
        raise PerfDataError(f"{where}: expected a number >= 0, got {value!r}")
    return float(value)


def _factors(doc: dict, section: str, keys: tuple[str, ...], path: Path) -> dict[str, Factor]:
    raw = doc.get(section)
    if not isinstance(raw, dict):
        raise PerfDataError(f"{path.name}: {section}: expected a mapping")
    missing = [k for k in keys if k not in raw]
    extra = [k for k in raw if k not in keys]
    if missing or extra:
        raise PerfDataError(f"{path.name}: {section}: expected exactly {', '.join(keys)}; "
                            f"missing {missing}, unknown {extra}")
    out = {}
    for k in keys:
        e = raw[k]
        if not isinstance(e, dict) or set(e) != {"value", "kind", "basis"}:
            raise PerfDataError(f"{path.name}: {section}.{k}: expected value, kind and basis")
        v = _number(f"{path.name}: {section}.{k}.value", e["value"])
        if k in _FRACTIONS and not 0.0 <= v <= 1.0:
            raise PerfDataError(f"{path.name}: {section}.{k}.value: expected a fraction in [0, 1], got {v}")
        if k == "moe_imbalance" and v < 1.0:
            raise PerfDataError(f"{path.name}: {section}.{k}.value: expected a ratio >= 1 (busiest / mean), got {v}")
        if e["kind"] not in EFFICIENCY_KINDS:
            raise PerfDataError(f"{path.name}: {section}.{k}.kind: expected one of {', '.join(EFFICIENCY_KINDS)}, "
                                f"got {e['kind']!r}")
        if not isinstance(e["basis"], str) or not e["basis"].strip():
            raise PerfDataError(f"{path.name}: {section}.{k}.basis: expected the source of the figure")
        out[k] = Factor(v, e["kind"], e["basis"])
    return out


def load_hardware(path: str | Path | None = None) -> Hardware:
    """Read and validate capacity/hardware.yaml (or ``path``)."""
    p = Path(path) if path else HARDWARE_FILE
    return _load_hardware(str(p))


@lru_cache(maxsize=8)
def _load_hardware(path: str) -> Hardware:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PerfDataError(f"{p.name}: cannot read: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), dict):
        raise PerfDataError(f"{p.name}: gpus: expected a mapping of GPU name to figures")
    gpus = {}
    for name, g in doc["gpus"].items():
        if not isinstance(g, dict):
            raise PerfDataError(f"{p.name}: gpus.{name}: expected a mapping")
        for k in (*_GPU_FIELDS, "source", "read"):
            if k not in g:
                raise PerfDataError(f"{p.name}: gpus.{name}.{k}: missing")
        if not str(g["source"]).strip():
            raise PerfDataError(f"{p.name}: gpus.{name}.source: expected where the figures were read")
        vals = {k: _number(f"{p.name}: gpus.{name}.{k}", g[k]) for k in _GPU_FIELDS}
        if vals["hbm_gb_s"] <= 0 or vals["bf16_tflops"] <= 0:
            raise PerfDataError(f"{p.name}: gpus.{name}: hbm_gb_s and bf16_tflops must be > 0")
        gpus[name] = GPUPerf(name, **vals, source=str(g["source"]), read=str(g["read"]))
    rdma = {}
    for itype, e in (doc.get("instance_rdma") or {}).items():
        if not isinstance(e, dict) or set(e) != {"gbps_per_node", "kind", "basis"}:
            raise PerfDataError(f"{p.name}: instance_rdma.{itype}: expected gbps_per_node, kind and basis")
        if e["kind"] not in EFFICIENCY_KINDS:
            raise PerfDataError(f"{p.name}: instance_rdma.{itype}.kind: expected one of {', '.join(EFFICIENCY_KINDS)}")
        rdma[itype] = Factor(_number(f"{p.name}: instance_rdma.{itype}.gbps_per_node", e["gbps_per_node"]),
                             e["kind"], str(e["basis"]))
    return Hardware(gpus, _factors(doc, "communication", _COMM_KEYS, p),
                    _factors(doc, "efficiency", _EFF_KEYS, p), rdma)


def _quant(m: ModelSpec, quantization: str | None) -> str:
    """The effective weight format; a plan's own (already normalised, e.g. fp32) passes."""
    if quantization in ("bf16", "fp16", "fp32", "fp8", "awq"):
        return quantization
    return normalize_quantization(m, quantization)


def gpu_perf(name: str, hw: Hardware | None = None) -> GPUPerf:
    hw = hw or load_hardware()
    if name not in hw.gpus:
        raise PlanError(f"gpu: no performance figures for {name!r} in capacity/hardware.yaml "
                        f"(known: {', '.join(hw.gpus)})")
    return hw.gpus[name]


# ----------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """How one serving replica (or one P/D pool's replica) is spread over GPUs."""

    tp: int = 1
    pp: int = 1
    dp: int = 1  # attention data-parallel engines in the replica
    ep: int = 1  # ranks the routed experts are split across (1: experts sliced by TP)
    gpus_per_node: int = 8
    rdma_gb_s: float = 0.0  # RDMA bandwidth per GPU, GB/s, one direction (0: none)
    overlap: bool = False  # two-batch overlap of compute and communication
    mtp_tokens: int = 0  # MTP speculative tokens per step
    redundant_experts: int = 0  # EPLB replicas on top of the routed experts

    def __post_init__(self):
        for f in ("tp", "pp", "dp", "ep", "gpus_per_node"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"{f}: expected a positive integer, got {v!r}")
        if self.mtp_tokens < 0 or self.redundant_experts < 0 or self.rdma_gb_s < 0:
            raise PlanError("mtp_tokens, redundant_experts and rdma_gb_s must be >= 0")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_node))

    @classmethod
    def from_plan(cls, p, rdma_gb_s: float = 0.0, overlap: bool = False) -> "Layout":
        return cls(tp=p.tensor_parallel_size, pp=p.pipeline_parallel_size, dp=p.data_parallel_size,
                   ep=p.expert_parallel_size if p.expert_parallel else 1, gpus_per_node=p.gpus_per_node,
                   rdma_gb_s=rdma_gb_s if p.nodes > 1 else 0.0, overlap=overlap,
                   mtp_tokens=p.speculative_tokens)


@dataclass
class Step:
    """One engine step on the busiest GPU, seconds and bytes (decode or prefill)."""

    tokens: float  # tokens the GPU's engine processes in the step
    weight_bytes: float
    kv_bytes: float
    linear_flops: float
    attention_flops: float
    t_linear: float
    t_attention: float
    t_all_reduce: float
    t_all_to_all: float
    t_overhead: float
    t_step: float
    t_bound: float  # the same step at 100% of every datasheet rate, no communication

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sum_overlap(compute: float, comm: float, overlap: bool, eta: float) -> float:
    if not overlap:
        return compute + comm
    return max(compute, comm) + (1.0 - eta) * min(compute, comm)


def _stage_parts(m: ModelSpec, quant: str, lay: Layout) -> tuple[float, float, float, int, int]:
    """For the heaviest stage, per GPU: (non-routed weight bytes, non-routed linear
    parameters that multiply every token (no embedding, no LM head), LM-head parameters
    (0 unless the stage holds it), bytes of one resident routed expert, routed experts
    resident per MoE layer, MoE layers)."""
    ep = lay.ep if lay.ep > 1 else None
    total = max(stage_weight_bytes(m, quant, lay.tp, lay.pp, ep, mtp=False))
    a, b = max(pp_layer_ranges(m.num_layers, lay.pp), key=lambda r: r[1] - r[0])
    last = b == m.num_layers
    head = (m.vocab_size * m.hidden_size / lay.tp) if last else 0.0
    linear = 0.0
    for i in range(a, b):
        g = layer_params(m, i, lay.tp, ep)
        linear += g.linear + g.other
    moe_layers = sum(1 for i in range(a, b) if m.layer_is_moe(i))
    # the embedding table is looked up (one row per token), not streamed; a tied table is
    # the LM head too, and that is read in full
    tied = m.tie_word_embeddings and lay.pp == 1
    embed = m.vocab_size * m.hidden_size / lay.tp * activation_bytes(m) if a == 0 and not tied else 0.0
    if not m.is_moe:
        return float(total - embed), linear, head, 0.0, 0, 0
    expert = 3 * m.hidden_size * m.moe_intermediate_size
    if ep:
        resident = experts_per_rank(m, ep) if not lay.redundant_experts else \
            -(-(m.n_routed_experts + lay.redundant_experts) // ep)
        one = expert
        counted = experts_per_rank(m, ep) * one * moe_layers
    else:
        resident = m.n_routed_experts
        one = expert / lay.tp
        counted = resident * one * moe_layers
    wb = weight_bytes_per_param(quant)
    return float(total - counted * wb - embed), linear - counted, head, one * wb, resident, moe_layers


def _link(gpu: GPUPerf, lay: Layout, hw: Hardware, span: int) -> float:
    """Bytes/s one direction between GPUs of a group of ``span`` within a node."""
    if gpu.nvlink_gb_s and span <= lay.gpus_per_node:
        return gpu.nvlink_gb_s / 2 * 1e9 * hw.eff("nvlink_efficiency")
    if span > lay.gpus_per_node and lay.rdma_gb_s:
        return lay.rdma_gb_s * 1e9 * hw.eff("rdma_efficiency")
    return gpu.pcie_gb_s * 1e9 * hw.eff("pcie_efficiency")


def _all_reduce(m: ModelSpec, gpu: GPUPerf, lay: Layout, hw: Hardware, tokens: float, layers: int) -> float:
    if lay.tp == 1:
        return 0.0
    bytes_ = tokens * m.hidden_size * activation_bytes(m)
    bw = _link(gpu, lay, hw, lay.tp)
    lat = hw.eff("collective_latency_us") * 1e-6
    return 2 * layers * (2 * (lay.tp - 1) / lay.tp * bytes_ / bw + lat)


def _all_to_all(m: ModelSpec, gpu: GPUPerf, lay: Layout, hw: Hardware, tokens_per_gpu: float,
                moe_layers: int, prefill: bool) -> float:
    """Dispatch (FP8, 1 byte) and combine (BF16, 2 bytes) of every routed copy of the
    GPU's tokens. Decode (DeepEP low-latency): each copy to a GPU off the node crosses
    RDMA; prefill (normal kernels): each token crosses RDMA once per remote node it
    selects, then NVLink within it."""
    if lay.ep <= 1 or not m.is_moe:
        return 0.0
    k, h = m.num_experts_per_tok, m.hidden_size
    per_copy = h * (1 + activation_bytes(m))
    nodes = max(1, math.ceil(lay.ep / lay.gpus_per_node))
    local = min(lay.ep, lay.gpus_per_node)
    nvl = _link(gpu, lay, hw, local)
    lat = 2 * hw.eff("collective_latency_us") * 1e-6
    if nodes == 1:
        t = tokens_per_gpu * k * per_copy * (local - 1) / local / nvl
        return moe_layers * (t + lat)
    rdma = lay.rdma_gb_s * 1e9 * hw.eff("rdma_efficiency")
    if rdma <= 0:
        raise PlanError(f"rdma: expert parallelism over {nodes} nodes needs RDMA bandwidth per GPU")
    if prefill:
        touched = (nodes - 1) * (1 - (1 - 1 / nodes) ** k)
        touched = min(touched, NODE_LIMITED_ROUTING.get(m.architecture, k))
        remote = tokens_per_gpu * touched * per_copy
        nvl_bytes = tokens_per_gpu * k * per_copy
    else:
        remote = tokens_per_gpu * k * per_copy * (lay.ep - local) / lay.ep
        nvl_bytes = tokens_per_gpu * k * per_copy * (local - 1) / lay.ep
    return moe_layers * (max(remote / rdma, nvl_bytes / nvl) + lat)


def _attention_flops_decode(m: ModelSpec, tp: int, context: float) -> float:
    """Per token per layer per GPU: q.k and p.v over ``context`` cached tokens (MLA absorbed:
    the latent of width kv_lora_rank + rope for q.k, kv_lora_rank for p.v)."""
    heads = m.num_attention_heads / tp
    if m.is_mla:
        return 2 * heads * context * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    return 4 * heads * m.head_dim * context


def _selected(m: ModelSpec, context: float) -> float:
    """Cached tokens the main attention reads: all of them, or with DeepSeek Sparse Attention
    the indexer's top ``index_topk`` (DeepSeek-V3.2-Exp inference/model.py)."""
    return min(context, m.index_topk) if m.has_sparse_indexer else context


def _indexer_flops(m: ModelSpec, context: float) -> float:
    """Per token per layer per GPU: the lightning indexer scores every cached token with
    index_n_heads x index_head_dim (replicated on every rank, not split by TP)."""
    return 2 * m.index_n_heads * m.index_head_dim * context if m.has_sparse_indexer else 0.0


def _attention_width(m: ModelSpec) -> int:
    """q.k plus p.v widths of one head in prefill (MLA: the up-projected heads)."""
    return (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) if m.is_mla else 2 * m.head_dim


def _attention_rate(gpu: GPUPerf, kv_cache_dtype: str) -> float:
    """Peak attention rate: FP8 tensor cores when the KV cache is FP8 on a GPU that has them
    (FlashMLA-FP8 / FA3 FP8), else the 16-bit rate."""
    if (kv_cache_dtype or "auto").lower().startswith("fp8") and gpu.fp8_tflops:
        return gpu.fp8_tflops * 1e12
    return gpu.bf16_tflops * 1e12


def _layers(m: ModelSpec, pp: int) -> int:
    return max(b - a for a, b in pp_layer_ranges(m.num_layers, pp))


def _routed_flops(m: ModelSpec, lay: Layout, tokens: float, moe_layers: int) -> float:
    """Routed-expert FLOPs per GPU: every token's k copies spread over the EP group (or
    sliced by TP), 2 x tokens x k x expert params / TP either way."""
    if not m.is_moe:
        return 0.0
    return 2 * tokens * m.num_experts_per_tok * 3 * m.hidden_size * m.moe_intermediate_size / lay.tp * moe_layers


def _imbalance(m: ModelSpec, lay: Layout, hw: Hardware) -> float:
    """Busiest / mean load of an EP rank (tokens do not spread evenly over experts)."""
    return hw.eff("moe_imbalance") if m.is_moe and lay.ep > 1 else 1.0


def decode_step(m: ModelSpec, gpu: GPUPerf, lay: Layout, *, batch: float, context: float,
                quantization: str | None = None, kv_cache_dtype: str = "auto",
                hw: Hardware | None = None) -> Step:
    """One decode step of one pipeline stage on one GPU of an engine holding ``batch``
    sequences (per pipeline micro-batch) of mean ``context`` cached tokens."""
    hw = hw or load_hardware()
    quant = _quant(m, quantization)
    if batch <= 0 or context <= 0:
        raise PlanError(f"batch and context: expected > 0, got {batch!r}, {context!r}")
    tokens = batch * (1 + lay.mtp_tokens)  # tokens the engine's forward processes
    layers = _layers(m, lay.pp)
    dense_bytes, dense_params, head, expert_bytes, resident, moe_layers = _stage_parts(m, quant, lay)
    routed_read = 0.0
    if m.is_moe:  # routed experts read: those some token of the EP group selects this step
        group_tokens = tokens * (lay.dp if lay.ep > 1 else 1)
        slots = m.n_routed_experts + (lay.redundant_experts if lay.ep > 1 else 0)
        p_touched = 1 - (1 - m.num_experts_per_tok / slots) ** group_tokens
        routed_read = resident * p_touched * expert_bytes * moe_layers
    weight_bytes = dense_bytes + routed_read
    # the latent of the selected tokens; the indexer keys (DSA) of every cached token
    idx = _layers(m, lay.pp) * m.indexer_bytes_per_token
    per_token = kv_bytes_per_token_per_gpu(m, lay.tp, lay.pp, kv_cache_dtype)
    kv_bytes = batch * ((per_token - idx) * _selected(m, context) + idx * context)
    imb = _imbalance(m, lay, hw)
    routed = _routed_flops(m, lay, tokens, moe_layers)
    linear = 2 * tokens * (dense_params + head) + routed
    attn = tokens * layers * (_attention_flops_decode(m, lay.tp, _selected(m, context)) + _indexer_flops(m, context))
    # the MTP draft runs one more decoder layer per speculative token
    mtp_scale = 1 + lay.mtp_tokens * m.mtp_layers / m.num_layers if lay.mtp_tokens else 1.0
    bw, peak, att_peak = gpu.hbm_bytes_s, gpu.linear_flops_s(quant), _attention_rate(gpu, kv_cache_dtype)
    t_lin = mtp_scale * max(weight_bytes / (bw * hw.eff("hbm")),
                            (linear + (imb - 1) * routed) / (peak * hw.eff("gemm")))
    t_att = mtp_scale * max(kv_bytes / (bw * hw.eff("hbm")), attn / (att_peak * hw.eff("attention")))
    t_ar = _all_reduce(m, gpu, lay, hw, tokens, layers)
    t_a2a = imb * _all_to_all(m, gpu, lay, hw, tokens / lay.tp, moe_layers, prefill=False)
    overhead = hw.eff("step_overhead_ms") * 1e-3
    t = _sum_overlap(t_lin + t_att, t_ar + t_a2a, lay.overlap, hw.eff("overlap")) + overhead
    bound = max(weight_bytes / bw, linear / peak) + max(kv_bytes / bw, attn / att_peak)
    return Step(tokens, weight_bytes, kv_bytes, linear, attn, t_lin, t_att, t_ar, t_a2a, overhead, t, bound)


def prefill_step(m: ModelSpec, gpu: GPUPerf, lay: Layout, *, tokens: float, seq: float,
                 quantization: str | None = None, kv_cache_dtype: str = "auto", cache_hit: float = 0.0,
                 hw: Hardware | None = None) -> Step:
    """Prefill of ``tokens`` prompt tokens (sequences of ``seq`` tokens) on one GPU of an
    engine (one pipeline stage). ``cache_hit``: share of the prompt tokens whose KV is
    already cached (prefix cache): they cost neither linear FLOPs nor communication, and
    the new tokens attend to the cached prefix too."""
    hw = hw or load_hardware()
    quant = _quant(m, quantization)
    if tokens <= 0 or seq <= 0 or not 0.0 <= cache_hit < 1.0:
        raise PlanError("tokens and seq: expected > 0; cache_hit: expected a fraction in [0, 1)")
    new = tokens * (1 - cache_hit)
    layers = _layers(m, lay.pp)
    dense_bytes, dense_params, head, expert_bytes, resident, moe_layers = _stage_parts(m, quant, lay)
    weight_bytes = dense_bytes + resident * expert_bytes * moe_layers
    imb = _imbalance(m, lay, hw)
    routed = _routed_flops(m, lay, new, moe_layers)
    linear = 2 * new * dense_params + 2 * (tokens / seq) * head + routed  # LM head: last token only
    # each new token attends to the cached prefix and, causally, to half the new part
    span = seq - seq * (1 - cache_hit) / 2
    attn = new * layers * (2 * (m.num_attention_heads / lay.tp) * _selected(m, span) * _attention_width(m)
                           + _indexer_flops(m, span))
    bw, peak, att_peak = gpu.hbm_bytes_s, gpu.linear_flops_s(quant), _attention_rate(gpu, kv_cache_dtype)
    t_lin = max(weight_bytes / (bw * hw.eff("hbm")), (linear + (imb - 1) * routed) / (peak * hw.eff("gemm")))
    t_att = attn / (att_peak * hw.eff("attention"))
    t_ar = _all_reduce(m, gpu, lay, hw, new, layers)
    t_a2a = imb * _all_to_all(m, gpu, lay, hw, new / lay.tp, moe_layers, prefill=True)
    t = _sum_overlap(t_lin + t_att, t_ar + t_a2a, lay.overlap, hw.eff("overlap"))
    bound = max(weight_bytes / bw, linear / peak) + attn / att_peak
    return Step(tokens, weight_bytes, 0.0, linear, attn, t_lin, t_att, t_ar, t_a2a, 0.0, t, bound)


# ----------------------------------------------------------------------------
# Figures a user reads
# ----------------------------------------------------------------------------

@dataclass
class Performance:
    """Speed of one replica at a concurrency and input/output length (docs/planner.md).

    The replica runs ``concurrency`` sequences at once, a new prompt arriving as one ends
    (prefill and decode share the GPUs, as in vLLM's chunked prefill)."""

    source: str
    concurrency: int  # sequences in flight in the replica
    input_tokens: int
    output_tokens: int
    decode_tokens_per_s_per_gpu: float  # decode alone at the concurrency
    prefill_tokens_per_s_per_gpu: float  # prefill alone, full chunks
    ttft_s: float  # prefill of one prompt plus its first token, waiting behind half a chunk
    itl_s: float  # mean time between output tokens, prefills of the others included
    decode_itl_s: float  # the same without prefills (a decode pool of a P/D deployment)
    output_tokens_per_s_per_gpu: float  # the request mix: prefill and decode sharing the GPUs
    input_tokens_per_s_per_gpu: float
    requests_per_s: float  # the replica at the concurrency
    prefill_share: float  # fraction of the replica's time spent prefilling
    physical_bound_tokens_per_s_per_gpu: float  # decode at 100% of every rate, nothing else
    tokens_per_step: float  # 1 + expected accepted MTP tokens
    gpus: int
    decode_step: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tokens_per_step(lay: Layout, hw: Hardware) -> float:
    """Expected tokens a sequence gains per step: 1 + a + a^2 + ... (n MTP tokens)."""
    a = hw.eff("mtp_acceptance")
    return 1 + sum(a ** i for i in range(1, lay.mtp_tokens + 1))


def decode_itl(m: ModelSpec, gpu: GPUPerf, lay: Layout, *, concurrency: float, context: float,
               quantization: str | None = None, kv_cache_dtype: str = "auto",
               hw: Hardware | None = None) -> tuple[float, Step]:
    """(mean inter-token latency, the stage step) for ``concurrency`` sequences on the replica.
    The replica's sequences spread over its DP engines; PP keeps ``pp`` micro-batches in
    flight, each crossing every stage once per token."""
    hw = hw or load_hardware()
    micro = concurrency / lay.dp / lay.pp
    s = decode_step(m, gpu, lay, batch=max(micro, 1e-9), context=context, quantization=quantization,
                    kv_cache_dtype=kv_cache_dtype, hw=hw)
    p2p = (lay.pp - 1) * hw.eff("collective_latency_us") * 1e-6
    return (lay.pp * s.t_step + p2p) / tokens_per_step(lay, hw), s


def prefill_rate(m: ModelSpec, gpu: GPUPerf, lay: Layout, *, input_tokens: int, chunk: int = 8192,
                 quantization: str | None = None, kv_cache_dtype: str = "auto", cache_hit: float = 0.0,
                 hw: Hardware | None = None) -> float:
    """Prompt tokens per second per GPU of a replica prefilling full chunks of ``chunk``
    tokens per engine (every pipeline stage busy with a chunk of its own)."""
    tokens = max(chunk, input_tokens)
    s = prefill_step(m, gpu, lay, tokens=tokens, seq=input_tokens, quantization=quantization,
                     kv_cache_dtype=kv_cache_dtype, cache_hit=cache_hit, hw=hw)
    return tokens / s.t_step / (lay.tp * lay.pp)


def estimate(m: ModelSpec, gpu: GPUPerf, lay: Layout, *, concurrency: int, input_tokens: int,
             output_tokens: int, quantization: str | None = None, kv_cache_dtype: str = "auto",
             max_num_batched_tokens: int = 8192, cache_hit: float = 0.0,
             hw: Hardware | None = None) -> Performance:
    """Decode and prefill speed, TTFT and ITL of one replica at ``concurrency``."""
    hw = hw or load_hardware()
    for name, v in (("concurrency", concurrency), ("input_tokens", input_tokens),
                    ("output_tokens", output_tokens), ("max_num_batched_tokens", max_num_batched_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(f"{name}: expected a positive integer, got {v!r}")
    kw = dict(quantization=quantization, kv_cache_dtype=kv_cache_dtype, hw=hw)
    context = input_tokens + output_tokens / 2
    itl, s = decode_itl(m, gpu, lay, concurrency=concurrency, context=context, **kw)
    tps = tokens_per_step(lay, hw)
    pf_rate = prefill_rate(m, gpu, lay, input_tokens=input_tokens, chunk=max_num_batched_tokens,
                           cache_hit=cache_hit, **kw)
    # closed loop: each request costs its prefill (at the chunk rate, over the replica's
    # engines) and output_tokens decode steps shared with the other sequences
    t_prefill_req = input_tokens / (pf_rate * lay.gpus)
    rps = 1.0 / (t_prefill_req + output_tokens * itl / concurrency)
    share = rps * t_prefill_req
    loaded_itl = itl / (1 - share * (concurrency - 1) / concurrency)
    one = prefill_step(m, gpu, lay, tokens=input_tokens, seq=input_tokens, cache_hit=cache_hit, **kw)
    # the prompt crosses every stage, waits on average behind half a chunk of others when
    # the replica is busy, then gets its first token
    wait = share * (concurrency - 1) / concurrency * max_num_batched_tokens / 2 / (pf_rate * lay.tp * lay.pp)
    ttft = lay.pp * one.t_step + wait + itl * tps
    bound = concurrency * tps / (s.t_bound * lay.pp) / lay.gpus
    return Performance(
        source=MODEL_SOURCE, concurrency=concurrency, input_tokens=input_tokens, output_tokens=output_tokens,
        decode_tokens_per_s_per_gpu=concurrency / itl / lay.gpus, prefill_tokens_per_s_per_gpu=pf_rate,
        ttft_s=ttft, itl_s=loaded_itl, decode_itl_s=itl,
        output_tokens_per_s_per_gpu=rps * output_tokens / lay.gpus,
        input_tokens_per_s_per_gpu=rps * input_tokens / lay.gpus, requests_per_s=rps, prefill_share=share,
        physical_bound_tokens_per_s_per_gpu=bound, tokens_per_step=tps, gpus=lay.gpus, decode_step=s.as_dict(),
    )


def efficiency_table(hw: Hardware | None = None) -> list[dict[str, Any]]:
    """Every factor with its kind and basis (for docs and `dsvolc size`)."""
    hw = hw or load_hardware()
    rows = []
    for section in (hw.efficiency, hw.communication):
        for k, f in section.items():
            rows.append({"name": k, "value": f.value, "kind": f.kind, "basis": f.basis})
    return rows


__all__ = [
    "GPUPerf", "Hardware", "Layout", "Step", "Performance", "PerfDataError", "load_hardware", "gpu_perf",
    "decode_step", "prefill_step", "decode_itl", "prefill_rate", "estimate", "tokens_per_step", "efficiency_table",
    "MODEL_SOURCE", "HARDWARE_FILE",
]
