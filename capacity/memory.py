"""Bytes of a model under vLLM: weights per pipeline stage (with quantisation overheads),
KV cache per token, and how many tokens a KV budget holds, counted in whole blocks as vLLM
does. Pure functions; `capacity.planner` builds plans from them.
"""

from __future__ import annotations

import math

from capacity.params import (
    ParamGroups,
    embedding_params,
    kv_heads_per_rank,
    layer_params,
    lm_head_params,
    mtp_params,
    pp_layer_ranges,
)
from capacity.catalog import checkpoint_format, checkpoints_of
from capacity.specs import ModelSpec

QUANT_GROUP = 128  # AWQ group size and FP8 weight block edge (when the checkpoint does not say)
DEFAULT_BLOCK_SIZE = 16  # vLLM GPU default KV block size

QUANTIZATIONS = ("bf16", "fp16", "fp8", "awq", "w4a16")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")

_QUANT_ALIASES = {
    None: None, "": None, "none": None, "auto": None, "native": None,
    "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp8": "fp8", "awq": "awq", "awq_marlin": "awq", "w4a16": "w4a16",
}
# Weight formats vLLM can make from a 16/32-bit checkpoint at load time: a dtype cast, or its
# online FP8 (`--quantization fp8_per_tensor`: e4m3 weights with a per-tensor scale, dynamic
# activation scales; vllm/config/quantization.py _ONLINE_SHORTHANDS). AWQ and W4A16 need
# a checkpoint quantised offline (calibrated scales and zero points).
_FROM_16_BIT = ("bf16", "fp16", "fp8")
# vLLM's name of the online FP8 method (0.32: `--quantization fp8` on an unquantised
# checkpoint is deprecated and mapped to it, model_loader/weight_utils.py get_quant_config)
ONLINE_FP8 = "fp8_per_tensor"


class PlanError(ValueError):
    """Invalid planner input; the message names the field and what was expected."""


# ----------------------------------------------------------------------------
# Bytes
# ----------------------------------------------------------------------------

def activation_bytes(m: ModelSpec) -> int:
    """Bytes per element of activations (and of unquantized weights)."""
    return 4 if m.native_dtype == "float32" else 2


def normalize_quantization(model: ModelSpec, quantization: str | None) -> str:
    """Effective weight format: 'bf16' | 'fp16' | 'fp32' | 'fp8' | 'awq'."""
    key = quantization.strip().lower() if isinstance(quantization, str) else quantization
    if key not in _QUANT_ALIASES:
        raise PlanError(f"quantization: expected one of {', '.join(QUANTIZATIONS)} or none, "
                        f"got {quantization!r}")
    q = _QUANT_ALIASES[key]
    native = checkpoint_format(model)
    if q is None or q == native:
        return native
    if native in ("bf16", "fp16", "fp32") and q in _FROM_16_BIT:
        return q
    raise PlanError(quantization_refusal(model, q))


def online_quantization(model: ModelSpec, quant: str) -> str | None:
    """vLLM's `--quantization` when the engine must quantise at load time (online FP8 of a
    16-bit checkpoint); None when the checkpoint's config.json carries the method (vLLM
    reads it from there and picks its kernel: AWQ Marlin, block-FP8 DeepGEMM/CUTLASS)."""
    return ONLINE_FP8 if quant == "fp8" and checkpoint_format(model) in ("bf16", "fp16", "fp32") else None


def quantization_refusal(model: ModelSpec, quant: str) -> str:
    """Why `quant` cannot be planned for this checkpoint, naming the checkpoints that exist."""
    native = checkpoint_format(model)
    what = (f"{quant.upper()} needs a checkpoint quantised offline to it" if quant in ("awq", "w4a16") else
            f"{quant} weights need a 16-bit checkpoint (vLLM does not convert {native.upper()} weights back)")
    siblings = checkpoints_of(model)
    fits = [m for m in siblings if checkpoint_format(m) == quant]
    listed = ", ".join(f"{m.name} ({checkpoint_format(m)}: {m.hf_id})" for m in siblings) or "only this one"
    hint = (f"; use the {quant.upper()} checkpoint as the model instead (serving.model, or dsvolc size --model): "
            + ", ".join(f"{m.name} ({m.hf_id})" for m in fits)) if fits else ""
    return (f"quantization: {quant!r} does not match the checkpoint: {what}, and {model.name} is "
            f"{model.hf_id}, whose weights are {native.upper()}{hint}; the catalog's checkpoints of this model: "
            f"{listed}; expected the checkpoint's own format ({native}) or unset"
            + (", or fp8 (vLLM's online FP8)" if native in ("bf16", "fp16", "fp32") else ""))


def weight_bytes_per_param(quant: str) -> float:
    """Bytes per quantizable weight, including scale/zero overheads."""
    if quant in ("bf16", "fp16"):
        return 2.0
    if quant == "fp32":
        return 4.0
    if quant == "fp8":
        return 1.0 + 4.0 / (QUANT_GROUP * QUANT_GROUP)  # e4m3 + one fp32 scale per 128x128 block
    if quant == "awq":
        return 0.5 + (2.0 + 0.5) / QUANT_GROUP  # int4 + fp16 scale + int4 zero per group of 128
    if quant == "w4a16":
        return 0.5 + 2.0 / QUANT_GROUP  # int4 + one 16-bit scale per group of 128, symmetric (no zero)
    raise PlanError(f"quantization: unsupported {quant!r}")


def _group_bytes(g: ParamGroups, quant: str, act_bytes: int) -> float:
    other_bytes = 4 if quant == "fp32" else act_bytes
    return g.linear * weight_bytes_per_param(quant) + g.other * other_bytes


def stage_weight_bytes(m: ModelSpec, quant: str, tp: int, pp: int, ep: int | None = None,
                       mtp: bool = False) -> list[int]:
    """Weight bytes per GPU for each pipeline stage (`ep`: expert-parallel size; `mtp`: the
    MTP modules are loaded, on the last stage)."""
    ab = activation_bytes(m)
    layer_b = [_group_bytes(layer_params(m, i, tp, ep), quant, ab) for i in range(m.num_layers)]
    out = []
    ranges = pp_layer_ranges(m.num_layers, pp)
    for s, (a, b) in enumerate(ranges):
        total = sum(layer_b[a:b])
        if s == 0:
            total += _group_bytes(embedding_params(m, tp), quant, ab)
        if s == pp - 1 and not (m.tie_word_embeddings and pp == 1):
            total += _group_bytes(lm_head_params(m, tp), quant, ab)
        if s == pp - 1 and mtp:
            total += mtp_weight_bytes(m, quant, tp, pp, ep)
        out.append(int(math.ceil(total)))
    return out


def mtp_weight_bytes(m: ModelSpec, quant: str, tp: int, pp: int, ep: int | None = None) -> int:
    """Bytes per GPU of the MTP modules (speculative decoding): one MoE decoder layer each
    plus its projections; their own embedding and LM head when pipeline parallel."""
    g = mtp_params(m, tp, ep, own_embedding=pp > 1)
    h = m.hidden_size
    eh_proj = m.mtp_layers * 2 * h * h  # kept in the activation dtype: not a quantized linear
    return int(math.ceil(_group_bytes(ParamGroups(g.linear, g.other - eh_proj), quant, activation_bytes(m))
                         + eh_proj * activation_bytes(m)))


def checkpoint_bytes(m: ModelSpec, quantization: str | None = None) -> int:
    """Bytes of the checkpoint files (the weights as stored: one copy, unsharded). A
    quantisation made at load time (online FP8) does not change the files: `quantization`
    is checked against the checkpoint, not counted."""
    normalize_quantization(m, quantization)
    return stage_weight_bytes(m, checkpoint_format(m), 1, 1)[0]


def kv_element_bytes(m: ModelSpec, kv_cache_dtype: str = "auto") -> int:
    d = (kv_cache_dtype or "auto").strip().lower()
    if d not in KV_CACHE_DTYPES:
        raise PlanError(f"kv_cache_dtype: expected one of {', '.join(KV_CACHE_DTYPES)}, "
                        f"got {kv_cache_dtype!r}")
    if d.startswith("fp8"):
        return 1
    if d == "auto":
        return activation_bytes(m)
    return 4 if d == "float32" else 2


def kv_bytes_per_token_per_layer(m: ModelSpec, tp: int = 1, kv_cache_dtype: str = "auto") -> int:
    b = kv_element_bytes(m, kv_cache_dtype)
    if m.is_mla:
        return (m.kv_lora_rank + m.qk_rope_head_dim) * b + m.indexer_bytes_per_token
    return 2 * kv_heads_per_rank(m, tp) * m.head_dim * b



def max_stage_layers(m: ModelSpec, pp: int, mtp: bool = False) -> int:
    """Layers (with a KV cache) of the largest stage; the MTP modules add theirs to the last."""
    sizes = [b - a for a, b in pp_layer_ranges(m.num_layers, pp)]
    if mtp:
        sizes[-1] += m.mtp_layers
    return max(sizes)


def kv_bytes_per_token_per_gpu(m: ModelSpec, tp: int = 1, pp: int = 1,
                               kv_cache_dtype: str = "auto", mtp: bool = False) -> int:
    return max_stage_layers(m, pp, mtp) * kv_bytes_per_token_per_layer(m, tp, kv_cache_dtype)


def kv_cache_tokens_for_bytes(model: ModelSpec, kv_bytes_per_gpu: int, *,
                              tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                              kv_cache_dtype: str = "auto", block_size: int = DEFAULT_BLOCK_SIZE,
                              mtp: bool = False) -> int:
    """Tokens of KV cache vLLM allocates from ``kv_bytes_per_gpu`` on each GPU.

    vLLM allocates whole blocks: ``num_blocks = bytes // (block_size x per-token bytes
    x layers on the GPU)`` and reports ``num_blocks x block_size`` tokens (the worst
    pipeline stage bounds the whole pipeline).
    """
    if block_size <= 0:
        raise PlanError(f"block_size: expected a positive integer, got {block_size!r}")
    if kv_bytes_per_gpu <= 0:
        return 0
    per_block = block_size * kv_bytes_per_token_per_gpu(
        model, tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, mtp)
    return int(kv_bytes_per_gpu // per_block) * block_size


