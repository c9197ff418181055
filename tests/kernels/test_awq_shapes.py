"""The W4A16 shapes the catalog's AWQ checkpoints run (kernels/bench/awq_shapes.py): each layer's
(K, N) against the model transformers builds from the same architecture fields (on the meta
device: no weights), vLLM's merges and tensor-parallel splits, and the race covering every
shape the planner gives those checkpoints on a Hopper GPU."""

from __future__ import annotations

import dataclasses

import pytest
from engine_extra import require

require("torch", "transformers")
import torch  # noqa: E402

from capacity.catalog import GPUS  # noqa: E402
from kernels.bench import awq_shapes  # noqa: E402
from kernels.bench.w4a16 import RACE_SHAPES  # noqa: E402
from kernels.bench.w4a16_race5 import SHAPES as RACE5_SHAPES  # noqa: E402


def _hf_layer(m):
    import transformers

    kind = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[m.architecture]
    cfg = kind(hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
               num_key_value_heads=m.num_kv_heads, intermediate_size=m.intermediate_size, num_hidden_layers=1,
               vocab_size=m.vocab_size, head_dim=m.head_dim)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg).model.layers[0]


@pytest.mark.parametrize("name", sorted(awq_shapes.awq_models()))
def test_layer_shapes_are_the_models_linear_layers_merged_as_vllm_merges_them(name):
    m = awq_shapes.awq_models()[name]
    layer = _hf_layer(m)
    att, mlp = layer.self_attn, layer.mlp
    want = {
        "qkv": (att.q_proj.in_features, att.q_proj.out_features + att.k_proj.out_features + att.v_proj.out_features),
        "o": (att.o_proj.in_features, att.o_proj.out_features),
        "gate_up": (mlp.gate_proj.in_features, mlp.gate_proj.out_features + mlp.up_proj.out_features),
        "down": (mlp.down_proj.in_features, mlp.down_proj.out_features),
    }
    assert awq_shapes.layer_shapes(m, 1) == want


def test_tensor_parallel_splits_columns_of_merged_layers_and_rows_of_the_others():
    m = awq_shapes.awq_models()["deepseek-r1-distill-llama-70b-awq"]  # 64 heads, 8 kv heads, 128 wide
    one, two = awq_shapes.layer_shapes(m, 1), awq_shapes.layer_shapes(m, 2)
    assert two["qkv"] == (8192, one["qkv"][1] // 2) and two["gate_up"] == (8192, one["gate_up"][1] // 2)
    assert two["o"] == (one["o"][0] // 2, 8192) and two["down"] == (one["down"][0] // 2, 8192)
    # past the kv heads a rank keeps one (vLLM replicates them): 4 heads of q, one each of k and v
    assert awq_shapes.layer_shapes(m, 16)["qkv"] == (8192, (4 + 2) * 128)


def test_a_size_that_does_not_split_is_refused_by_name():
    m = awq_shapes.awq_models()["deepseek-r1-distill-qwen-14b-awq"]  # 40 heads, 8 kv heads
    with pytest.raises(ValueError, match="does not divide num_attention_heads=40"):
        awq_shapes.layer_shapes(m, 3)
    with pytest.raises(ValueError, match="does not divide intermediate_size=13824"):
        awq_shapes.layer_shapes(m, 5)
    with pytest.raises(ValueError, match="neither divides nor is a multiple of num_kv_heads=6"):
        awq_shapes.layer_shapes(dataclasses.replace(m, num_kv_heads=6), 4)


def test_the_catalog_has_awq_checkpoints_and_hopper_gpus_to_plan():
    assert len(awq_shapes.awq_models()) >= 3
    assert any(g.compute_capability == awq_shapes.HOPPER for g in GPUS.values())


def test_the_w4a16_race_covers_every_shape_the_catalog_runs_on_hopper():
    shapes = awq_shapes.catalog_shapes()
    missing = {s: uses for s, uses in shapes.items() if s not in RACE_SHAPES}
    assert not missing, f"catalog W4A16 shapes the race leaves out: {missing}"
    assert sorted(RACE5_SHAPES) == sorted(RACE_SHAPES)


def test_the_listing_prints_each_shape_with_its_layers_and_the_race_option(capsys):
    assert awq_shapes.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "5120x55296\tdeepseek-r1-distill-qwen-32b-awq gate_up TP1" in out
    assert out[-1].startswith("--w4-shapes ") and "8192x57344" in out[-1]
