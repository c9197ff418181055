"""Catalog facts, lookups and local config.json parsing."""

from __future__ import annotations

import json

import pytest

from capacity.catalog import GPUS, MODELS, GiB, get_gpu, get_model, model_from_config
from capacity.instances import INSTANCE_CATALOG, INSTANCE_TYPES, get_instance_type, is_hpc_family, resolve_instance_type
from capacity.planner import kv_bytes_per_token_per_gpu, plan
from capacity.suggest import closest

REQUIRED_MODELS = {
    "deepseek-v3", "deepseek-r1", "deepseek-v2", "deepseek-v2-lite", "deepseek-coder-v2-lite",
    "deepseek-r1-distill-qwen-1.5b", "deepseek-r1-distill-qwen-7b",
    "deepseek-r1-distill-qwen-14b", "deepseek-r1-distill-qwen-32b",
    "deepseek-r1-distill-llama-8b", "deepseek-r1-distill-llama-70b",
    "deepseek-r1-0528", "deepseek-v3.1", "deepseek-v3.2-exp", "deepseek-v3.2",
}
# pre-quantised checkpoints (capacity/checkpoints.yaml): name -> (base model, weight format)
QUANTISED = {
    "deepseek-r1-distill-qwen-14b-awq": ("deepseek-r1-distill-qwen-14b", "awq"),
    "deepseek-r1-distill-qwen-32b-awq": ("deepseek-r1-distill-qwen-32b", "awq"),
    "deepseek-r1-distill-llama-70b-awq": ("deepseek-r1-distill-llama-70b", "awq"),
    "deepseek-r1-distill-llama-70b-w4a16": ("deepseek-r1-distill-llama-70b", "w4a16"),
    "deepseek-r1-distill-qwen-1.5b-fp8-dynamic": ("deepseek-r1-distill-qwen-1.5b", "fp8"),
}
_V3_FAMILY = {"deepseek-v3", "deepseek-r1", "deepseek-r1-0528", "deepseek-v3.1", "deepseek-v3.2-exp",
              "deepseek-v3.2"}


def test_catalog_has_every_model_and_gpu():
    assert set(MODELS) == REQUIRED_MODELS | set(QUANTISED)
    assert set(GPUS) == {"A10", "L20", "A100-40G", "A100-80G", "A800", "H20", "H100", "H800",
                         "H200"}


@pytest.mark.parametrize("name", sorted(REQUIRED_MODELS))
def test_every_model_cites_its_config(name):
    spec = MODELS[name]
    assert "config.json" in spec.source and spec.source.startswith("https://")
    assert spec.hf_id.startswith("deepseek-ai/")


def test_v3_architecture_from_published_config():
    v3 = MODELS["deepseek-v3"]
    assert v3.is_mla and v3.is_moe
    assert (v3.num_layers, v3.hidden_size, v3.kv_lora_rank, v3.qk_rope_head_dim) == (61, 7168, 512, 64)
    assert (v3.n_routed_experts, v3.num_experts_per_tok, v3.vocab_size) == (256, 8, 129280)
    assert v3.native_dtype == "fp8" and v3.num_moe_layers == 58  # first 3 layers dense


def test_distills_are_gqa():
    for name in REQUIRED_MODELS - _V3_FAMILY - {"deepseek-v2", "deepseek-v2-lite", "deepseek-coder-v2-lite"}:
        spec = MODELS[name]
        assert not spec.is_mla and not spec.is_moe and spec.kv_lora_rank is None
        assert spec.num_attention_heads % spec.num_kv_heads == 0


def test_gpu_memory_and_precision():
    assert get_gpu("H200").memory_bytes > 139 * GiB
    assert 22 * GiB < get_gpu("A10").memory_bytes < 24 * GiB
    assert not get_gpu("A100-80G").fp8 and get_gpu("H20").fp8 and get_gpu("L20").fp8
    assert get_gpu("a100-80gb") is GPUS["A100-80G"]


def test_unknown_names_list_the_known_ones():
    with pytest.raises(KeyError) as e:
        get_model("deepseek-v9")
    assert "deepseek-r1-distill-qwen-7b" in str(e.value)
    with pytest.raises(KeyError) as e:
        get_gpu("B200")
    assert "H800" in str(e.value)


@pytest.mark.parametrize("lookup,typo,closest", [
    (get_model, "deepseek-r1-distil-qwen-7b", "did you mean deepseek-r1-distill-qwen-7b?"),
    (get_model, "DeepSeek-V2-Lte", "did you mean deepseek-v2-lite?"),
    (get_model, "deepseek-ai/DeepSeek-R1-Distill-Qwen-7", "did you mean deepseek-ai/DeepSeek-R1-Distill-Qwen-7B?"),
    (get_gpu, "H2O", "did you mean H20?"),
    (get_gpu, "A100", "did you mean A100-40G or A100-80G?"),
])
def test_a_typo_names_the_closest_known_value(lookup, typo, closest):
    with pytest.raises(KeyError) as e:
        lookup(typo)
    assert closest in str(e.value)


@pytest.mark.parametrize("lookup,name", [(get_model, "qwen2.5-72b"), (get_model, "gpt-5"), (get_gpu, "MI300X")])
def test_nothing_close_suggests_nothing(lookup, name):
    with pytest.raises(KeyError) as e:
        lookup(name)
    assert "did you mean" not in str(e.value)


def test_two_equally_close_are_both_named_and_more_are_not_guessed_between():
    assert closest("deepseek-v9", MODELS) == ["deepseek-v3", "deepseek-v2"]
    assert closest("deepseek-v9", ["deepseek-v2", "deepseek-v3", "deepseek-v4"]) == []
    assert closest("deepseek-v3", MODELS) == []
    assert closest("DeepSeek-V3", MODELS) == ["deepseek-v3"]  # for a lookup that minds the case


def test_instance_types():
    for itype, (gpu, count) in INSTANCE_TYPES.items():
        assert gpu in GPUS and count >= 1
    assert resolve_instance_type("ecs.gni2.3xlarge") == ("A10", 1)
    assert resolve_instance_type("ecs.unknown.large") is None


def test_instance_catalog_records():
    assert {r.gpu for r in INSTANCE_CATALOG.values()} >= {"A10", "L20", "A100-80G", "A800", "H20"}
    for name, r in INSTANCE_CATALOG.items():
        assert name == r.name and r.gpu in GPUS and r.gpus in (1, 2, 4, 8), name
        assert r.source, name
        # confirmed rows resolve on their own, unconfirmed ones never do
        assert (resolve_instance_type(name) == (r.gpu, r.gpus)) is r.confirmed, name
        assert get_instance_type(name.upper()) is r
        # HPC families sit in an HPC cluster and carry RDMA NICs
        assert r.hpc_only is is_hpc_family(name), name
        if r.hpc_only:
            assert r.rdma and (r.rdma_nics is None or r.rdma_nics >= 1), name
        else:
            assert not r.rdma and r.rdma_nics == 0, name
    assert resolve_instance_type("ecs.hpcpni3ln.45xlarge") == ("H20", 8)
    assert resolve_instance_type("ecs.hpcpni2.28xlarge") == ("A100-80G", 8)
    assert resolve_instance_type("ecs.gni3cl.45xlarge") is None  # GPU count unconfirmed
    assert INSTANCE_CATALOG["ecs.ebmhpcpni3l.48xlarge"].rdma_nics == 8  # 400 Gbps x 8 RDMA
    assert not any(r.gpu in ("H100", "H800") for r in INSTANCE_CATALOG.values())  # none documented


def test_numa_share():
    from capacity.instances import InstanceType

    r = InstanceType("ecs.x.y", "H20", 8, 192, 2048, 2, True, 8, True, "s", True)
    assert r.gpus_per_numa_node == 4
    assert INSTANCE_CATALOG["ecs.hpcpni3ln.45xlarge"].gpus_per_numa_node is None  # not stated


def test_local_mla_config_is_parsed(tmp_path):
    cfg = {
        "model_type": "deepseek_v2", "num_hidden_layers": 2, "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512,
        "intermediate_size": 512, "max_position_embeddings": 2048, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 128, "first_k_dense_replace": 1, "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path))
    assert spec.is_mla and spec.num_moe_layers == 1
    assert kv_bytes_per_token_per_gpu(spec) == 2 * 576 * 2
    assert spec.param_count > 0


def test_local_gqa_config_is_parsed(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
           "vocab_size": 512, "intermediate_size": 512, "max_position_embeddings": 2048,
           "torch_dtype": "float32"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = model_from_config(path)
    assert spec.native_dtype == "float32"
    assert kv_bytes_per_token_per_gpu(spec) == 2 * 3 * 1 * 64 * 4
    assert plan(spec, get_gpu("A10")).fits


def test_bad_local_config_names_the_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(KeyError, match="num_hidden_layers"):
        get_model(str(tmp_path))
    with pytest.raises(KeyError, match="not found"):
        get_model(str(tmp_path / "missing" / "config.json"))


def test_pipeline_is_chosen_when_only_tp_is_given():
    # Qwen-32B (65.5 GB bf16) on TP=2 A10s: needs 3 pipeline stages of 2 GPUs
    p = plan(MODELS["deepseek-r1-distill-qwen-32b"], get_gpu("A10"), tensor_parallel_size=2)
    assert p.fits and p.tensor_parallel_size == 2 and p.pipeline_parallel_size == 3
    assert p.nodes == 1 and p.total_gpus == 6


# config.json facts of the newer DeepSeek releases, as cited in capacity/catalog.py:
# (layers, hidden, heads, q_lora, kv_lora, nope, rope, v, experts, top-k, moe_inter,
#  first_k_dense, vocab, max_position_embeddings)
_V3_FACTS = (61, 7168, 128, 1536, 512, 128, 64, 128, 256, 8, 2048, 3, 129280, 163840)


@pytest.mark.parametrize("name", ["deepseek-r1-0528", "deepseek-v3.1", "deepseek-v3.2-exp", "deepseek-v3.2"])
def test_newer_releases_carry_their_cited_config(name):
    m = MODELS[name]
    got = (m.num_layers, m.hidden_size, m.num_attention_heads, m.q_lora_rank, m.kv_lora_rank,
           m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.n_routed_experts,
           m.num_experts_per_tok, m.moe_intermediate_size, m.first_k_dense_replace, m.vocab_size,
           m.max_context)
    assert got == _V3_FACTS
    assert m.native_dtype == "fp8" and m.fp8_block_size == (128, 128)
    assert m.hf_id == "deepseek-ai/" + {"deepseek-r1-0528": "DeepSeek-R1-0528", "deepseek-v3.1": "DeepSeek-V3.1",
                                        "deepseek-v3.2-exp": "DeepSeek-V3.2-Exp",
                                        "deepseek-v3.2": "DeepSeek-V3.2"}[name]
    assert "2026-12-01" in m.source


def test_v32_sparse_attention_is_planned_with_its_indexer_cache():
    """V3.2's lightning indexer (64 heads x 128, top-2048) caches one FP8 key of 128 values plus
    an fp32 scale per token and layer: 132 bytes beside the 576-value MLA latent, whatever
    the KV dtype. V3.1 and R1-0528 have no indexer."""
    for name in ("deepseek-v3.2-exp", "deepseek-v3.2"):
        m = MODELS[name]
        assert (m.index_n_heads, m.index_head_dim, m.index_topk) == (64, 128, 2048)
        assert m.architecture == "deepseek_v32" and m.has_sparse_indexer
        assert kv_bytes_per_token_per_gpu(m) == 61 * ((512 + 64) * 2 + 132)
        assert kv_bytes_per_token_per_gpu(m, kv_cache_dtype="fp8") == 61 * (512 + 64 + 132)
    for name in ("deepseek-r1-0528", "deepseek-v3.1"):
        assert not MODELS[name].has_sparse_indexer
        assert kv_bytes_per_token_per_gpu(MODELS[name]) == kv_bytes_per_token_per_gpu(MODELS["deepseek-v3"])
    # the same GPUs hold fewer V3.2 tokens than V3 tokens
    v3, v32 = (plan(MODELS[n], get_gpu("H200"), tensor_parallel_size=8) for n in ("deepseek-v3", "deepseek-v3.2"))
    assert v32.kv_cache_tokens < v3.kv_cache_tokens


def test_a_local_v32_config_keeps_its_indexer(tmp_path):
    """A local deepseek_v32 config.json is not read as plain V3: the indexer fields are kept."""
    cfg = {"model_type": "deepseek_v32", "num_hidden_layers": 61, "hidden_size": 7168,
           "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
           "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
           "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
           "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
           "v_head_dim": 128, "max_position_embeddings": 163840, "index_n_heads": 64,
           "index_head_dim": 128, "index_topk": 2048,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = model_from_config(path)
    assert (m.index_n_heads, m.index_head_dim, m.index_topk) == (64, 128, 2048)
    assert kv_bytes_per_token_per_gpu(m) == kv_bytes_per_token_per_gpu(MODELS["deepseek-v3.2-exp"])
    del cfg["index_topk"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(KeyError, match="index_topk"):
        model_from_config(path)


@pytest.mark.parametrize("gpu,fits", [("A100-80G", False), ("L20", False), ("A10", False), ("H20", True), ("H200", True)])
def test_v32_is_refused_where_vllm_has_no_sparse_attention_kernels(gpu, fits):
    """vLLM's sparse-MLA backends take compute capability 9.x/10.x/12.x only: V3.2 on Ampere or
    Ada is refused with that reason, not planned as if it were V3."""
    p = plan(MODELS["deepseek-v3.2"], get_gpu(gpu), gpus_per_node=8)
    sparse = [r for r in p.reasons if "DeepSeek Sparse Attention" in r]
    assert bool(sparse) is (not fits)
    if not fits:  # the only reason: no layout or memory figure would change it
        assert p.reasons == sparse and not p.fits
        assert f"{gpu} is {'.'.join(map(str, get_gpu(gpu).compute_capability))}" in sparse[0]
    assert not any("Sparse" in r for r in plan(MODELS["deepseek-v3"], get_gpu(gpu), gpus_per_node=8).reasons)
