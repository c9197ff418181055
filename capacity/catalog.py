"""Model and GPU facts the capacity planner depends on.

Every architecture number below comes from the model's published ``config.json``;
the URL next to each entry says where it was read. Where the ``deepseek-ai``
repository itself was not reachable, the citation names the mirror or derived
checkpoint whose config was read instead (the architecture fields are copied
unchanged by those repositories) and says so.

``param_count`` is the parameter count published on the model card / Hugging Face
page (main model, without DeepSeek-V3's multi-token-prediction module, which vLLM
does not load unless speculative decoding is enabled). The planner does not use it
for memory: it counts parameters per tensor from the architecture (see
``capacity.params``); tests check that the two agree.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from capacity.params import count_parameters
from capacity.specs import CheckpointQuant, GiB, GPUSpec, MiB, ModelSpec
from capacity.suggest import did_you_mean

CHECKPOINTS_FILE = Path(__file__).with_name("checkpoints.yaml")


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

_V3_COMMON: dict[str, Any] = dict(
    architecture="deepseek_v3",
    num_layers=61,
    hidden_size=7168,
    num_attention_heads=128,
    num_kv_heads=128,
    head_dim=192,  # qk_nope_head_dim + qk_rope_head_dim
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    vocab_size=129280,
    n_routed_experts=256,
    n_shared_experts=1,
    num_experts_per_tok=8,
    moe_intermediate_size=2048,
    intermediate_size=18432,
    first_k_dense_replace=3,
    param_count=671_000_000_000,
    native_dtype="fp8",
    max_context=163840,
    q_lora_rank=1536,
    fp8_block_size=(128, 128),
    # config.json quantization_config: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
    # "dynamic", "weight_block_size": [128, 128]} (the copies cited with each model below)
    quant=CheckpointQuant("fp8", "fp8", 8, weight_block_size=(128, 128)),
    mtp_layers=1,  # num_nextn_predict_layers: 1 (the 14B MTP module of README_WEIGHTS.md)
)

# DeepSeek Sparse Attention (V3.2-Exp, V3.2): the lightning indexer's config.json fields.
_DSA: dict[str, Any] = dict(index_n_heads=64, index_head_dim=128, index_topk=2048)

_V2_LITE_COMMON: dict[str, Any] = dict(
    architecture="deepseek_v2",
    num_layers=27,
    hidden_size=2048,
    num_attention_heads=16,
    num_kv_heads=16,
    head_dim=192,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    vocab_size=102400,
    n_routed_experts=64,
    n_shared_experts=2,
    num_experts_per_tok=6,
    moe_intermediate_size=1408,
    intermediate_size=10944,
    first_k_dense_replace=1,
    param_count=15_700_000_000,
    native_dtype="bfloat16",
    max_context=163840,
    q_lora_rank=None,
)


def _qwen2(name: str, hf_id: str, layers: int, hidden: int, heads: int, kv: int,
           inter: int, vocab: int, params: int, source: str,
           reasoning_parser: str | None = None) -> ModelSpec:
    return ModelSpec(
        name=name, hf_id=hf_id, architecture="qwen2", num_layers=layers,
        hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv,
        head_dim=hidden // heads, kv_lora_rank=None, qk_rope_head_dim=None,
        qk_nope_head_dim=None, v_head_dim=None, vocab_size=vocab,
        n_routed_experts=0, n_shared_experts=0, num_experts_per_tok=0,
        moe_intermediate_size=None, intermediate_size=inter, first_k_dense_replace=0,
        param_count=params, native_dtype="bfloat16", max_context=131072,
        source=source, attention_bias=True, reasoning_parser=reasoning_parser,
    )


def _llama(name: str, hf_id: str, layers: int, hidden: int, heads: int, kv: int,
           inter: int, params: int, source: str,
           reasoning_parser: str | None = None) -> ModelSpec:
    return ModelSpec(
        name=name, hf_id=hf_id, architecture="llama", num_layers=layers,
        hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv,
        head_dim=128, kv_lora_rank=None, qk_rope_head_dim=None,
        qk_nope_head_dim=None, v_head_dim=None, vocab_size=128256,
        n_routed_experts=0, n_shared_experts=0, num_experts_per_tok=0,
        moe_intermediate_size=None, intermediate_size=inter, first_k_dense_replace=0,
        param_count=params, native_dtype="bfloat16", max_context=131072,
        source=source, reasoning_parser=reasoning_parser,
    )


# R1 and its distills think between <think> and </think> before answering; vLLM's parser
# of that name puts the thinking in the message's `reasoning` field and the answer in
# `content` (tests/test_reasoning_parser.py runs it).
R1_REASONING_PARSER = "deepseek_r1"

MODELS: dict[str, ModelSpec] = {
    # deepseek-ai/DeepSeek-V3's own config.json was not reachable from the reference
    # index. Values read from config.json copies that keep its architecture fields:
    # https://huggingface.co/amd/DeepSeek-R1-0528-MXFP4/blob/main/config.json (same
    # V3 architecture), https://gitcode.com/cann/cann-recipes-train/blob/master/llm_rl/deepseek/verl_patches/config.json,
    # and vLLM's DeepseekV3Config defaults
    # (https://docs.vllm.ai/en/v0.11.0/api/vllm/transformers_utils/configs/deepseek_v3.html).
    # Parameter count (671B main model + 14B MTP module) from the official
    # README_WEIGHTS.md of deepseek-ai/DeepSeek-V3. FP8 e4m3, block 128x128.
    "deepseek-v3": ModelSpec(
        name="deepseek-v3", hf_id="deepseek-ai/DeepSeek-V3",
        source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json "
               "(read via mirrors: huggingface.co/amd/DeepSeek-R1-0528-MXFP4 config.json; "
               "docs.vllm.ai DeepseekV3Config)",
        **_V3_COMMON,
    ),
    # DeepSeek-R1 shares the V3 architecture. config.json read from an unchanged copy:
    # https://huggingface.co/JPAdams12th/dormant-model-2/blob/main/config.json (fp8,
    # weight_block_size [128,128]) and https://huggingface.co/Yi30/DeepSeek-R1-NVFP4-OFFLINE
    # (_name_or_path DeepSeek-R1-bf16; same architecture fields).
    "deepseek-r1": ModelSpec(
        name="deepseek-r1", hf_id="deepseek-ai/DeepSeek-R1",
        source="https://huggingface.co/deepseek-ai/DeepSeek-R1/blob/main/config.json "
               "(read via copies: huggingface.co/JPAdams12th/dormant-model-2, "
               "huggingface.co/Yi30/DeepSeek-R1-NVFP4-OFFLINE)",
        reasoning_parser=R1_REASONING_PARSER,
        **_V3_COMMON,
    ),
    # DeepSeek-R1-0528 (the May 2025 update of R1): same V3 architecture. config.json read
    # from copies that keep the architecture fields and replace only quantization_config:
    # https://huggingface.co/amd/DeepSeek-R1-0528-MXFP4 (commit 41aaaead, config.json) and
    # https://huggingface.co/mlx-community/DeepSeek-R1-0528-8bit/blob/main/config.json
    # (61 layers, hidden 7168, 128 heads, kv_lora 512, q_lora 1536, rope 64, nope 128,
    # 256 routed + 1 shared experts, top-8, moe_intermediate 2048, first_k_dense_replace 3,
    # max_position_embeddings 163840, num_nextn_predict_layers 1). v_head_dim and
    # vocab_size lie past the excerpts read and are V3's. Read 2026-12-01.
    "deepseek-r1-0528": ModelSpec(
        name="deepseek-r1-0528", hf_id="deepseek-ai/DeepSeek-R1-0528",
        source="https://huggingface.co/deepseek-ai/DeepSeek-R1-0528/blob/main/config.json "
               "(read 2026-12-01 via copies: huggingface.co/amd/DeepSeek-R1-0528-MXFP4 commit 41aaaead "
               "config.json, huggingface.co/mlx-community/DeepSeek-R1-0528-8bit config.json; the native "
               "FP8 128x128 checkpoint format is the V3 family's, the copies re-quantize it)",
        reasoning_parser=R1_REASONING_PARSER,
        **_V3_COMMON,
    ),
    # DeepSeek-V3.1: layers, hidden, heads, q_lora, kv_lora, rope/nope/v dims and
    # max_position_embeddings as tabulated from the official config.json
    # (https://huggingface.co/deepseek-ai/DeepSeek-V3.1/blob/main/config.json) in a public
    # R1/V3.1/V3.2 comparison note (GitHub code index, file id 69308580305, recorded
    # 2026-09-17; read 2026-12-01): identical to R1, full causal MLA, no indexer. Experts,
    # vocabulary and dtype are not in that note and were not read from another source:
    # they are taken from V3 (docs/limits.md says so).
    "deepseek-v3.1": ModelSpec(
        name="deepseek-v3.1", hf_id="deepseek-ai/DeepSeek-V3.1",
        source="https://huggingface.co/deepseek-ai/DeepSeek-V3.1/blob/main/config.json "
               "(attention fields via a public comparison of the official configs, GitHub code index "
               "file id 69308580305, read 2026-12-01; MoE, vocabulary and dtype not read: V3's)",
        **_V3_COMMON,
    ),
    # DeepSeek-V3.2-Exp: the V3.1-Terminus architecture plus DeepSeek Sparse Attention.
    # Read from deepseek-ai's own repository github.com/deepseek-ai/DeepSeek-V3.2-Exp at
    # commit 3b99a535 (2025-10-02), inference/config_671B_v3.2.json: vocab 129280, dim 7168,
    # inter 18432, moe_inter 2048, 61 layers, 3 dense, 128 heads, 256 routed + 1 shared,
    # 8 active, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, dtype fp8 (ue8m0
    # scales; block_size 128 in inference/model.py), index_n_heads 64, index_head_dim 128,
    # index_topk 2048. max_position_embeddings (163840) is the comparison note's (file id
    # 69308580305); the inference config does not carry it. Read 2026-12-01.
    "deepseek-v3.2-exp": ModelSpec(
        name="deepseek-v3.2-exp", hf_id="deepseek-ai/DeepSeek-V3.2-Exp",
        source="https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/blob/main/config.json "
               "(read 2026-12-01 as github.com/deepseek-ai/DeepSeek-V3.2-Exp@3b99a535 "
               "inference/config_671B_v3.2.json, the same fields in the inference format)",
        **{**_V3_COMMON, "architecture": "deepseek_v32"}, **_DSA,
    ),
    # DeepSeek-V3.2 (the release after V3.2-Exp): attention and indexer fields as
    # tabulated from the official config.json in the comparison note above (file id
    # 69308580305): 61 layers, hidden 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64,
    # nope 128, v 128, index_n_heads 64, index_head_dim 128, index_topk 2048,
    # max_position_embeddings 163840. MoE and vocabulary as V3.2-Exp.
    "deepseek-v3.2": ModelSpec(
        name="deepseek-v3.2", hf_id="deepseek-ai/DeepSeek-V3.2",
        source="https://huggingface.co/deepseek-ai/DeepSeek-V3.2/blob/main/config.json "
               "(attention and indexer fields via a public comparison of the official configs, GitHub "
               "code index file id 69308580305, read 2026-12-01; MoE and vocabulary as DeepSeek-V3.2-Exp)",
        **{**_V3_COMMON, "architecture": "deepseek_v32"}, **_DSA,
    ),
    # DeepSeek-V2 (236B): https://huggingface.co/ModelCloud/DeepSeek-V2-Chat-0628-gptq-4bit
    # config.json (_name_or_path DeepSeek-V2-Chat-0628; architecture fields unchanged)
    # cross-checked with deepseek-ai's own inference/configs/config_236B.json in the
    # DeepSeek-V3 repository (vocab 102400, 60 layers, dim 5120, 160 routed experts,
    # 2 shared, 6 active, moe_inter_dim 1536, q_lora 1536, kv_lora 512).
    "deepseek-v2": ModelSpec(
        name="deepseek-v2", hf_id="deepseek-ai/DeepSeek-V2",
        architecture="deepseek_v2", num_layers=60, hidden_size=5120,
        num_attention_heads=128, num_kv_heads=128, head_dim=192, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, vocab_size=102400,
        n_routed_experts=160, n_shared_experts=2, num_experts_per_tok=6,
        moe_intermediate_size=1536, intermediate_size=12288, first_k_dense_replace=1,
        param_count=236_000_000_000, native_dtype="bfloat16", max_context=163840,
        q_lora_rank=1536,
        source="https://huggingface.co/deepseek-ai/DeepSeek-V2/blob/main/config.json "
               "(read via huggingface.co/ModelCloud/DeepSeek-V2-Chat-0628-gptq-4bit config.json "
               "and deepseek-ai/DeepSeek-V3 inference/configs/config_236B.json)",
    ),
    # DeepSeek-V2-Lite (15.7B, 2.4B active): config.json copies
    # https://huggingface.co/ModelCloud/DeepSeek-V2-Lite-gptq-4bit/blob/main/config.json
    # (_name_or_path DeepSeek-V2-Lite) and deepseek-ai's own config_16B.json in
    # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/inference/configs/config_16B.json
    "deepseek-v2-lite": ModelSpec(
        name="deepseek-v2-lite", hf_id="deepseek-ai/DeepSeek-V2-Lite",
        source="https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json "
               "(read via huggingface.co/ModelCloud/DeepSeek-V2-Lite-gptq-4bit config.json and "
               "deepseek-ai/DeepSeek-V3 inference/configs/config_16B.json)",
        **_V2_LITE_COMMON,
    ),
    # DeepSeek-Coder-V2-Lite-Instruct: same architecture as V2-Lite. Read from the
    # deepseek-ai org: https://huggingface.co/deepseek-ai/DeepSeek-Coder-V2-Lite-Base/blame/main/config.json
    # and the Instruct copy https://huggingface.co/f0rc3ps/DeepSeek-Coder-V2-Lite-Instruct/blob/main/config.json
    "deepseek-coder-v2-lite": ModelSpec(
        name="deepseek-coder-v2-lite", hf_id="deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct",
        source="https://huggingface.co/deepseek-ai/DeepSeek-Coder-V2-Lite-Base/blame/main/config.json "
               "(Instruct copy: huggingface.co/f0rc3ps/DeepSeek-Coder-V2-Lite-Instruct)",
        **_V2_LITE_COMMON,
    ),
    # https://huggingface.co/onnx-community/DeepSeek-R1-Distill-Qwen-1.5B-ONNX/blob/main/config.json
    # and https://huggingface.co/oumi-ai/MiniMath-R1-1.5B/blob/main/config.json
    # (_name_or_path deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B): 28 layers, hidden 1536,
    # 12 heads, 2 KV heads, intermediate 8960, vocab 151936, 131072 positions.
    "deepseek-r1-distill-qwen-1.5b": _qwen2(
        "deepseek-r1-distill-qwen-1.5b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        28, 1536, 12, 2, 8960, 151936, 1_780_000_000,
        "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B/blob/main/config.json "
        "(read via huggingface.co/onnx-community/DeepSeek-R1-Distill-Qwen-1.5B-ONNX config.json)",
        reasoning_parser=R1_REASONING_PARSER,
    ),
    # https://huggingface.co/ABrain/HPGPT-DeepSeek-R1-Distill-Qwen-7B-R/blob/main/config.json and
    # https://huggingface.co/mlfoundations-dev/DeepSeek-R1-Distill-Qwen-7B_OpenThoughts3/blob/main/config.json
    # (_name_or_path deepseek-ai/DeepSeek-R1-Distill-Qwen-7B): 28 layers,
    # hidden 3584, 28 heads, 4 KV heads, intermediate 18944, vocab 152064.
    "deepseek-r1-distill-qwen-7b": _qwen2(
        "deepseek-r1-distill-qwen-7b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        28, 3584, 28, 4, 18944, 152064, 7_620_000_000,
        "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-7B/blob/main/config.json "
        "(read via huggingface.co/ABrain/HPGPT-DeepSeek-R1-Distill-Qwen-7B-R config.json)",
        reasoning_parser=R1_REASONING_PARSER,
    ),
    # https://huggingface.co/unsloth/DeepSeek-R1-Distill-Qwen-14B-bnb-4bit config.json and
    # https://huggingface.co/neody/r1-14b-awq/blame/main/config.json (_name_or_path is the
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-14B snapshot): 48 layers, hidden 5120, 40 heads,
    # 8 KV heads, intermediate 13824, vocab 152064.
    "deepseek-r1-distill-qwen-14b": _qwen2(
        "deepseek-r1-distill-qwen-14b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
        48, 5120, 40, 8, 13824, 152064, 14_800_000_000,
        "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-14B/blob/main/config.json "
        "(read via huggingface.co/unsloth/DeepSeek-R1-Distill-Qwen-14B-bnb-4bit config.json)",
        reasoning_parser=R1_REASONING_PARSER,
    ),
    # https://huggingface.co/AIFunOver/DeepSeek-R1-Distill-Qwen-32B-openvino-8bit/blob/main/config.json
    # (_name_or_path deepseek-ai/DeepSeek-R1-Distill-Qwen-32B): 64 layers, hidden 5120,
    # 40 heads, 8 KV heads, intermediate 27648, vocab 152064.
    "deepseek-r1-distill-qwen-32b": _qwen2(
        "deepseek-r1-distill-qwen-32b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
        64, 5120, 40, 8, 27648, 152064, 32_800_000_000,
        "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-32B/blob/main/config.json "
        "(read via huggingface.co/AIFunOver/DeepSeek-R1-Distill-Qwen-32B-openvino-8bit config.json)",
        reasoning_parser=R1_REASONING_PARSER,
    ),
    # https://huggingface.co/casperhansen/deepseek-r1-distill-llama-8b-awq (_name_or_path is
    # the deepseek-ai/DeepSeek-R1-Distill-Llama-8B snapshot): 32 layers, hidden 4096,
    # 32 heads, 8 KV heads, head_dim 128, intermediate 14336, vocab 128256.
    "deepseek-r1-distill-llama-8b": _llama(
        "deepseek-r1-distill-llama-8b", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
        32, 4096, 32, 8, 14336, 8_030_000_000,
        "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Llama-8B/blob/main/config.json "
        "(read via huggingface.co/casperhansen/deepseek-r1-distill-llama-8b-awq config.json)",
        reasoning_parser=R1_REASONING_PARSER,
    ),
    # https://huggingface.co/unsloth/DeepSeek-R1-Distill-Llama-70B-bnb-4bit and
    # https://huggingface.co/perplexity-ai/r1-1776-distill-llama-70b/blame/main/config.json
    # (_name_or_path deepseek-ai/DeepSeek-R1-Distill-Llama-70B): 80 layers, hidden 8192,
    # 64 heads, 8 KV heads, head_dim 128, intermediate 28672, vocab 128256.
    "deepseek-r1-distill-llama-70b": _llama(
        "deepseek-r1-distill-llama-70b", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
        80, 8192, 64, 8, 28672, 70_600_000_000,
        "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Llama-70B/blob/main/config.json "
        "(read via huggingface.co/unsloth/DeepSeek-R1-Distill-Llama-70B-bnb-4bit config.json)",
        reasoning_parser=R1_REASONING_PARSER,
    ),
}


# ---------------------------------------------------------------------------
# Pre-quantised checkpoints (capacity/checkpoints.yaml)
# ---------------------------------------------------------------------------

def checkpoint_quant(q: Any, where: str | Path) -> CheckpointQuant | None:
    """A config.json `quantization_config` as the planner counts it (None: not quantised).
    Reads what vLLM's loaders read: fp8 (Fp8Config), awq (AutoAWQConfig), gptq and
    compressed-tensors (the first config group's weights). KeyError names what is wrong."""
    if not q:
        return None
    if not isinstance(q, dict):
        raise KeyError(f"{where}: quantization_config must be an object")
    method = str(q.get("quant_method") or "").lower()
    if method == "fp8":
        wbs = q.get("weight_block_size")
        return CheckpointQuant("fp8", "fp8", 8, weight_block_size=(int(wbs[0]), int(wbs[1])) if wbs else None)
    if method in ("awq", "gptq"):
        bits = int(q.get("bits") or q.get("w_bit") or 0)
        group = q.get("group_size") or q.get("q_group_size")
        if bits != 4:
            raise KeyError(f"{where}: quantization_config bits is {bits or 'missing'}; the planner counts "
                           f"4-bit {method.upper()} checkpoints (expected bits: 4)")
        if method == "awq":
            return CheckpointQuant("awq", "awq", 4, int(group) if group else None, bool(q.get("zero_point", True)))
        return CheckpointQuant("gptq", "w4a16", 4, int(group) if group and int(group) > 0 else None,
                               not bool(q.get("sym", True)))
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        weights = next(iter(groups.values()), {}).get("weights") if groups else None
        if not isinstance(weights, dict):
            raise KeyError(f"{where}: compressed-tensors quantization_config has no config_groups.*.weights")
        bits, kind = int(weights.get("num_bits") or 0), weights.get("type")
        if kind == "float" and bits == 8:
            block = weights.get("block_structure") if weights.get("strategy") == "block" else None
            return CheckpointQuant(method, "fp8", 8,
                                   weight_block_size=(int(block[0]), int(block[1])) if block else None)
        if kind == "int" and bits == 4:
            group = weights.get("group_size")
            return CheckpointQuant(method, "w4a16", 4, int(group) if group else None,
                                   not bool(weights.get("symmetric", True)))
        raise KeyError(f"{where}: compressed-tensors weights of {bits}-bit {kind} are not counted by the "
                       "planner; expected 4-bit int (W4A16) or 8-bit float (FP8)")
    raise KeyError(f"{where}: quantization_config.quant_method {method!r} is not one the planner counts; "
                   "expected fp8, awq, gptq or compressed-tensors")


def _load_checkpoints(path: Path = CHECKPOINTS_FILE) -> dict[str, ModelSpec]:
    """The quantised checkpoints of capacity/checkpoints.yaml, each as a catalog model: the
    base model's architecture with the checkpoint's id and weight format."""
    doc = yaml.safe_load(path.read_text())
    out: dict[str, ModelSpec] = {}
    for name, entry in (doc.get("checkpoints") or {}).items():
        base = MODELS[entry["base"]]
        quant = checkpoint_quant(entry["quantization_config"], f"{path.name}: {name}")
        if quant is None:
            raise KeyError(f"{path.name}: {name}: expected a quantization_config")
        note = "" if entry.get("config_read", True) else f"; config.json not read: {entry['note']}"
        out[name] = replace(
            base, name=name, hf_id=entry["id"], native_dtype=quant.format, quant=quant,
            fp8_block_size=quant.weight_block_size, base_model=base.name,
            source=f"{entry['source']} (read {entry['read']}){note}; architecture: {base.name}'s",
        )
    return out


MODELS.update(_load_checkpoints())


def checkpoints_of(model: ModelSpec) -> list[ModelSpec]:
    """The catalog's checkpoints of the same model (the original and its quantised ones)."""
    root = model.base_model or model.name
    return [m for m in MODELS.values() if root in (m.name, m.base_model)]


def checkpoint_format(model: ModelSpec) -> str:
    """The weights as stored: 'bf16' | 'fp16' | 'fp32' | 'fp8' | 'awq' | 'w4a16'."""
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(model.native_dtype, model.native_dtype)


# ---------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------
# memory_bytes is the total the driver reports (nvidia-smi "MiB" column), which is
# what vLLM's gpu_memory_utilization is a fraction of; nominal_gb is the datasheet size.
# FP8 tensor cores exist on Ada (L20) and Hopper (H20/H100/H800/H200); Ampere (A10,
# A100, A800) runs FP8 checkpoints only through vLLM's weight-only FP8 Marlin kernels.
# compute_capability: NVIDIA's CUDA GPU table (developer.nvidia.com/cuda-gpus); A800, H20
# and H800 are A100 / H100 silicon and share their SM version.

GPUS: dict[str, GPUSpec] = {
    "A10": GPUSpec("A10", 23028 * MiB, True, False, "PCIe 4.0 x16 (64 GB/s)", 24,
                   "https://www.nvidia.com/en-us/data-center/products/a10-gpu/", compute_capability=(8, 6)),
    "L20": GPUSpec("L20", 46068 * MiB, True, True, "PCIe 4.0 x16 (64 GB/s)", 48,
                   "NVIDIA L20 datasheet (Ada, 48 GB GDDR6)", compute_capability=(8, 9)),
    "A100-40G": GPUSpec("A100-40G", 40960 * MiB, True, False, "NVLink 600 GB/s", 40,
                        "https://www.nvidia.com/en-us/data-center/a100/", compute_capability=(8, 0)),
    "A100-80G": GPUSpec("A100-80G", 81920 * MiB, True, False, "NVLink 600 GB/s", 80,
                        "https://www.nvidia.com/en-us/data-center/a100/", compute_capability=(8, 0)),
    "A800": GPUSpec("A800", 81920 * MiB, True, False, "NVLink 400 GB/s", 80,
                    "NVIDIA A800 SXM4 80 GB datasheet (Ampere, A100 silicon, NVLink 400 GB/s)", compute_capability=(8, 0)),
    "H20": GPUSpec("H20", 97871 * MiB, True, True, "NVLink 900 GB/s", 96,
                   "NVIDIA H20 datasheet (Hopper, 96 GB HBM3)", compute_capability=(9, 0)),
    "H100": GPUSpec("H100", 81559 * MiB, True, True, "NVLink 900 GB/s", 80,
                    "https://www.nvidia.com/en-us/data-center/h100/", compute_capability=(9, 0)),
    "H800": GPUSpec("H800", 81559 * MiB, True, True, "NVLink 400 GB/s", 80,
                    "NVIDIA H800 SXM datasheet (export variant of H100, NVLink 400 GB/s)", compute_capability=(9, 0)),
    "H200": GPUSpec("H200", 143771 * MiB, True, True, "NVLink 900 GB/s", 141,
                    "https://www.nvidia.com/en-us/data-center/h200/", compute_capability=(9, 0)),
}


# ---------------------------------------------------------------------------
# Lookup
# ---------------------------------------------------------------------------

def _known(names: list[str]) -> str:
    return ", ".join(sorted(names))


def get_gpu(name: str) -> GPUSpec:
    """GPU by catalog key (case-insensitive; '-80GB' style suffixes accepted)."""
    if not isinstance(name, str) or not name.strip():
        raise KeyError(f"gpu: expected one of {_known(list(GPUS))}, got {name!r}")
    key = name.strip().upper().replace("GB", "G")
    for k, spec in GPUS.items():
        if k.upper() == key:
            return spec
    raise KeyError(f"unknown gpu {name!r}{did_you_mean(name, GPUS, aside=True)}; known GPUs: {_known(list(GPUS))}")




def get_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog model by short name (or its hf_id), or a local config.json / model dir."""
    if isinstance(name_or_path, str):
        key = name_or_path.strip()
        if key.lower() in MODELS:
            return MODELS[key.lower()]
        for spec in MODELS.values():
            if spec.hf_id.lower() == key.lower():
                return spec
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.name.endswith(".json") and path.is_file():
        return model_from_config(path)
    if path.suffix == ".json" or str(name_or_path).startswith((".", "/", "~")):
        raise KeyError(f"model config not found: {path} (expected a model directory "
                       f"containing config.json, or a config.json file)")
    hint = did_you_mean(str(name_or_path), [*MODELS, *(m.hf_id for m in MODELS.values())], aside=True)
    raise KeyError(f"unknown model {str(name_or_path)!r}{hint}; known models: {_known(list(MODELS))} "
                   f"(or pass a path to a local config.json / model directory)")


_DTYPE_ALIASES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16", "torch.bfloat16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16", "torch.float16": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32", "torch.float32": "float32",
}


def _req(cfg: dict[str, Any], key: str, path: Path, *alts: str) -> Any:
    for k in (key, *alts):
        if cfg.get(k) is not None:
            return cfg[k]
    raise KeyError(f"{path}: field {key!r} is missing (required to size the model)")


def model_from_config(path: str | Path, *, name: str | None = None) -> ModelSpec:
    """Parse a Hugging Face ``config.json`` into a ModelSpec.

    Supports DeepSeek-V2/V3 (MLA, MoE) and the GQA decoder families (qwen2, llama,
    mistral, qwen3 and alike). Raises KeyError naming the missing/invalid field.
    """
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KeyError(f"{path}: cannot read config.json ({exc})") from None
    if not isinstance(cfg, dict):
        raise KeyError(f"{path}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers
        cfg = {**cfg, **cfg["text_config"]}
    arch = str(_req(cfg, "model_type", path))
    layers = int(_req(cfg, "num_hidden_layers", path))
    hidden = int(_req(cfg, "hidden_size", path))
    heads = int(_req(cfg, "num_attention_heads", path))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    vocab = int(_req(cfg, "vocab_size", path))
    inter = int(_req(cfg, "intermediate_size", path))
    max_ctx = int(cfg.get("max_position_embeddings") or 0)
    if max_ctx <= 0:
        raise KeyError(f"{path}: field 'max_position_embeddings' must be a positive integer")

    quant = checkpoint_quant(cfg.get("quantization_config") or cfg.get("compression_config"), path)
    block = quant.weight_block_size if quant else None
    if quant is not None:
        dtype = quant.format
    else:
        raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        if raw not in _DTYPE_ALIASES:
            raise KeyError(f"{path}: field 'torch_dtype' is {raw!r}; expected one of "
                           f"bfloat16, float16, float32")
        dtype = _DTYPE_ALIASES[raw]

    kv_lora = cfg.get("kv_lora_rank")
    n_routed = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    moe_inter = cfg.get("moe_intermediate_size") if n_routed else None
    common = dict(
        name=name or path.parent.name or "local",
        hf_id=str(path.parent),
        architecture=arch,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        vocab_size=vocab,
        n_routed_experts=n_routed,
        n_shared_experts=int(cfg.get("n_shared_experts") or 0),
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if n_routed else 0,
        moe_intermediate_size=int(moe_inter) if moe_inter else None,
        intermediate_size=inter,
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        param_count=0,
        native_dtype=dtype,
        max_context=max_ctx,
        source=str(path.resolve()),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        moe_layer_freq=int(cfg.get("moe_layer_freq") or 1),
        fp8_block_size=block,
        quant=quant,
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
    )
    if kv_lora is not None:
        rope = int(_req(cfg, "qk_rope_head_dim", path))
        nope = int(_req(cfg, "qk_nope_head_dim", path))
        spec = ModelSpec(
            num_kv_heads=heads, head_dim=nope + rope, kv_lora_rank=int(kv_lora),
            qk_rope_head_dim=rope, qk_nope_head_dim=nope,
            v_head_dim=int(cfg.get("v_head_dim") or nope),
            q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None,
            # DeepSeek Sparse Attention (deepseek_v32): the indexer adds a key cache per token.
            index_n_heads=int(_req(cfg, "index_n_heads", path)) if cfg.get("index_head_dim") else None,
            index_head_dim=int(cfg["index_head_dim"]) if cfg.get("index_head_dim") else None,
            index_topk=int(_req(cfg, "index_topk", path)) if cfg.get("index_head_dim") else None,
            **common,
        )
    else:
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        spec = ModelSpec(
            num_kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=None,
            qk_rope_head_dim=None, qk_nope_head_dim=None, v_head_dim=None,
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            **common,
        )
    # Local configs carry no published parameter count: count it from the architecture.
    return replace(spec, param_count=count_parameters(spec))


__all__ = [
    "GiB", "MiB", "ModelSpec", "GPUSpec", "MODELS", "GPUS",
    "get_model", "get_gpu", "model_from_config", "checkpoint_quant", "checkpoints_of", "checkpoint_format",
]
