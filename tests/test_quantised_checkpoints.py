"""Quantised checkpoints: the catalog names the real ones, a quantisation the checkpoint
does not have is refused, the rendered flags leave the kernel to vLLM's detection, and
online FP8 is told apart from block-quantised FP8 (docs/planner.md, Quantised checkpoints)."""

from __future__ import annotations

import copy
import json

import pytest

from capacity.catalog import MODELS, checkpoints_of, get_gpu, model_from_config
from capacity.memory import checkpoint_bytes, stage_weight_bytes
from capacity.planner import PlanError, plan, tp_problems
from stacks import parse, read_raw
from stacks.errors import SettingsError
from stacks.plan import build_plan
from workloads.engine import engine_args, manifests
from workloads.engine.context import build_context

R1 = MODELS["deepseek-r1"]
V2_LITE = MODELS["deepseek-v2-lite"]
QWEN_32B = MODELS["deepseek-r1-distill-qwen-32b"]
QWEN_32B_AWQ = MODELS["deepseek-r1-distill-qwen-32b-awq"]
LLAMA_70B = MODELS["deepseek-r1-distill-llama-70b"]


def _ctx(raw: dict, stack: str = "staging"):
    return build_context(build_plan(parse(raw, stack=stack)), image_repository="r.example/ns/repo")


def _args(ctx) -> list[str]:
    return engine_args.render(engine_args.from_context(ctx, manifests.model_path(ctx)))


# -- the catalog ---------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if m.base_model])
def test_quantised_checkpoint_keeps_its_base_architecture_and_cites_what_was_read(name):
    m = MODELS[name]
    base = MODELS[m.base_model]
    assert m.source.startswith(f"https://huggingface.co/{m.hf_id}")
    assert not m.hf_id.startswith("deepseek-ai/")
    assert (m.num_layers, m.hidden_size, m.intermediate_size, m.num_kv_heads, m.vocab_size) == (
        base.num_layers, base.hidden_size, base.intermediate_size, base.num_kv_heads, base.vocab_size)
    assert m.native_dtype == m.quant.format != base.native_dtype
    assert m in checkpoints_of(base) and base in checkpoints_of(m)


def test_config_facts_of_the_checkpoints():
    r1 = R1.quant
    assert (r1.method, r1.weight_block_size) == ("fp8", (128, 128))
    awq = MODELS["deepseek-r1-distill-llama-70b-awq"].quant
    assert (awq.method, awq.bits, awq.group_size, awq.zero_point) == ("awq", 4, 128, True)
    w4 = MODELS["deepseek-r1-distill-llama-70b-w4a16"].quant
    assert (w4.method, w4.format, w4.group_size, w4.zero_point) == ("compressed-tensors", "w4a16", 128, False)
    dyn = MODELS["deepseek-r1-distill-qwen-1.5b-fp8-dynamic"].quant
    assert (dyn.format, dyn.weight_block_size) == ("fp8", None)  # per-channel scales, no blocks
    assert QWEN_32B.quant is None and LLAMA_70B.quant is None  # deepseek-ai ships the distills in BF16


def test_local_awq_config_is_planned_as_awq(tmp_path):
    """A local config.json of an AWQ checkpoint (the fields of
    casperhansen/deepseek-r1-distill-llama-70b-awq) is int4, not the BF16 it was read as."""
    cfg = {"model_type": "llama", "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 28672, "vocab_size": 128256,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
           "quantization_config": {"bits": 4, "group_size": 128, "modules_to_not_convert": None,
                                   "quant_method": "awq", "version": "gemm", "zero_point": True}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_config(tmp_path / "config.json")
    assert m.native_dtype == "awq" and m.quant.group_size == 128
    assert checkpoint_bytes(m) == checkpoint_bytes(MODELS["deepseek-r1-distill-llama-70b-awq"])
    assert checkpoint_bytes(m) < 0.3 * checkpoint_bytes(LLAMA_70B)


def test_unknown_quant_method_in_a_local_config_is_refused_by_name(tmp_path):
    cfg = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
           "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KeyError, match="quant_method 'bitsandbytes'.*expected fp8, awq, gptq or compressed-tensors"):
        model_from_config(tmp_path / "config.json")


# -- a quantisation the checkpoint does not have ------------------------------------

def test_awq_on_the_fp8_r1_checkpoint_is_refused():
    with pytest.raises(PlanError, match=r"^quantization: 'awq' does not match the checkpoint.*deepseek-ai/DeepSeek-R1, "
                                        r"whose weights are FP8.*expected the checkpoint's own format \(fp8\)"):
        plan(R1, get_gpu("H20"), quantization="awq")


def test_bf16_of_an_fp8_checkpoint_is_refused():
    with pytest.raises(PlanError, match="vLLM does not convert FP8 weights back"):
        plan(R1, get_gpu("H200"), quantization="bf16")


def test_awq_on_the_bf16_distill_is_refused_naming_the_awq_checkpoint():
    with pytest.raises(PlanError) as exc:
        plan(QWEN_32B, get_gpu("A100-80G"), gpus_per_node=1, quantization="awq")
    assert "deepseek-r1-distill-qwen-32b-awq (casperhansen/deepseek-r1-distill-qwen-32b-awq)" in str(exc.value)
    # the AWQ checkpoint itself plans as int4: more KV cache than the BF16 one, honestly
    bf16 = plan(QWEN_32B, get_gpu("A100-80G"), gpus_per_node=1)
    awq = plan(QWEN_32B_AWQ, get_gpu("A100-80G"), gpus_per_node=1, quantization="awq")
    assert awq.fits and awq.kv_cache_tokens > 4 * bf16.kv_cache_tokens
    assert awq.weights_bytes_per_gpu == stage_weight_bytes(QWEN_32B, "awq", 1, 1)[0]


def test_stack_with_awq_on_a_bf16_checkpoint_is_refused_at_preview():
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["model"] = "deepseek-r1-distill-qwen-32b"
    raw["serving"]["engine"]["quantization"] = "awq"
    with pytest.raises(SettingsError) as exc:
        build_plan(parse(raw, stack="staging"))
    text = str(exc.value)
    assert "serving.engine: quantization: 'awq'" in text and "deepseek-r1-distill-qwen-32b-awq" in text


def test_the_awq_checkpoint_changes_the_weights_path_and_the_served_name():
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["model"] = "deepseek-r1-distill-llama-70b-awq"
    raw["serving"]["engine"]["quantization"] = "awq"
    ctx = _ctx(raw)
    assert ctx.model_key.endswith("/deepseek-r1-distill-llama-70b-awq")
    args = _args(ctx)
    assert args[args.index("--served-model-name") + 1] == "deepseek-r1-distill-llama-70b-awq"
    assert "deepseek-r1-distill-llama-70b-awq" in args[args.index("--model") + 1]


# -- rendered flags --------------------------------------------------------------------

def test_awq_checkpoint_renders_no_quantization_flag():
    """vLLM reads AWQ from the checkpoint's config.json and picks its kernel itself."""
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["model"] = "deepseek-r1-distill-llama-70b-awq"
    raw["serving"]["engine"]["quantization"] = "awq"
    assert "--quantization" not in _args(_ctx(raw))
    assert "--quantization" not in plan(QWEN_32B_AWQ, get_gpu("A100-80G"), quantization="awq").vllm_args()


def test_online_fp8_of_a_bf16_checkpoint_names_vllms_online_method():
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["engine"]["quantization"] = "fp8"
    args = _args(_ctx(raw))
    assert args[args.index("--quantization") + 1] == "fp8_per_tensor"
    assert args.count("--quantization") == 1


# -- online FP8 against block-quantised FP8 ----------------------------------------------

def test_online_fp8_on_v2_lite_is_not_held_to_the_block_rule():
    # 10944 / 1 and 1408 / 2 are not multiples of 128: only a 128x128 block checkpoint cares
    assert tp_problems(V2_LITE, 1, "fp8") == [] and tp_problems(V2_LITE, 2, "fp8") == []
    p = plan(V2_LITE, get_gpu("L20"), gpus_per_node=1, quantization="fp8")
    assert p.fits and p.quantization == "fp8" and p.online_quantization == "fp8_per_tensor"
    assert p.vllm_args()[p.vllm_args().index("--quantization") + 1] == "fp8_per_tensor"


def test_block_rule_still_holds_for_block_quantised_fp8():
    # R1 intermediate 18432 / 32 = 576, not a multiple of its 128x128 weight block
    assert any("FP8 weight block size 128" in r for r in tp_problems(R1, 32, "fp8"))
    # the per-channel FP8 checkpoint has no block: 8960 / 4 = 2240 is fine
    assert tp_problems(MODELS["deepseek-r1-distill-qwen-1.5b-fp8-dynamic"], 4, "fp8") == []


def test_online_fp8_keeps_the_bf16_files():
    """The weights sync moves the checkpoint as stored: online FP8 does not shrink it."""
    assert checkpoint_bytes(V2_LITE, "fp8") == checkpoint_bytes(V2_LITE)
    assert checkpoint_bytes(V2_LITE) == stage_weight_bytes(V2_LITE, "bf16", 1, 1)[0]
