"""DeepSeek recipes in the planner: expert parallelism, data-parallel attention, MTP, and
the choice between TP x PP, TP + EP and DP + EP by memory and interconnect."""

from __future__ import annotations

import pytest

from capacity.catalog import get_gpu, get_model
from capacity.params import experts_per_rank
from capacity.planner import PlanError, plan, stage_weight_bytes, weight_bytes_per_param
from stacks import load
from stacks.plan import build_plan

R1, H20 = get_model("deepseek-r1"), get_gpu("H20")
CTX = dict(gpus_per_node=8, context=65536, kv_cache_dtype="fp8")


def routed_expert_bytes(m, quant="fp8") -> float:
    """All routed experts of the model, from its config fields alone."""
    per_expert = 3 * m.hidden_size * m.moe_intermediate_size
    return m.num_moe_layers * m.n_routed_experts * per_expert * weight_bytes_per_param(quant)


def test_expert_parallel_splits_whole_experts_across_all_ranks():
    p = plan(R1, H20, parallelism="dp_ep", rdma=True, **CTX)
    assert (p.parallelism, p.data_parallel_size, p.tensor_parallel_size, p.nodes) == ("dp_ep", 16, 1, 2)
    assert p.expert_parallel and p.expert_parallel_size == 16 and p.experts_per_gpu == 256 // 16
    # Each GPU holds everything but the routed experts (attention is data parallel: replicated),
    # plus its 1/16 of the experts.
    full = stage_weight_bytes(R1, "fp8", 1, 1)[0]
    expected = full - routed_expert_bytes(R1) * (1 - 16 / 256)
    assert p.weights_bytes_per_gpu == pytest.approx(expected, rel=1e-6)


def test_tensor_parallel_experts_take_the_same_room_as_expert_parallel_ones():
    tp = plan(R1, H20, tensor_parallel_size=8, pipeline_parallel_size=1, **CTX)
    ep = plan(R1, H20, parallelism="tp_ep", **CTX)
    assert (ep.parallelism, ep.tensor_parallel_size, ep.expert_parallel_size) == ("tp_ep", 8, 8)
    # 256 experts / 8 ranks whole, or every expert / 8 in slices: the same bytes; EP pays
    # for its all-to-all buffers in the reserve instead.
    assert ep.weights_bytes_per_gpu == pytest.approx(tp.weights_bytes_per_gpu, rel=1e-3)
    assert ep.reserve_breakdown["communication"] > tp.reserve_breakdown["communication"]


def test_data_parallel_attention_multiplies_the_kv_cache_of_an_mla_model():
    """MLA keeps one latent per token, replicated on every TP rank: TP adds no KV room;
    data-parallel engines each cache their own sequences."""
    dp = plan(R1, H20, parallelism="dp_ep", rdma=True, **CTX)
    pp = plan(R1, H20, tensor_parallel_size=8, pipeline_parallel_size=2, **CTX)
    assert dp.nodes == pp.nodes == 2
    assert dp.replica_kv_cache_tokens == dp.data_parallel_size * dp.kv_cache_tokens
    assert pp.replica_kv_cache_tokens == pp.kv_cache_tokens
    assert dp.replica_kv_cache_tokens > 4 * pp.replica_kv_cache_tokens
    assert dp.concurrency_at_context == dp.data_parallel_size * (dp.kv_cache_tokens // 65536)


def test_expert_parallel_across_nodes_needs_rdma():
    p = plan(R1, H20, parallelism="dp_ep", rdma=False, **CTX)
    assert not p.fits and p.nodes == 2  # the smallest layout that holds it, refused for the network
    assert any("needs RDMA" in r for r in p.reasons)
    # auto without RDMA never spreads experts over nodes: beyond one node it is TP x PP
    big = plan(R1, H20, gpus_per_node=8, context=131072)  # a bf16 KV cache: more than one node
    assert big.nodes > 1 and big.parallelism == "tp_pp"
    with_rdma = plan(R1, H20, gpus_per_node=8, context=131072, rdma=True)
    assert with_rdma.fits and with_rdma.expert_parallel and with_rdma.nodes > 1


def test_auto_takes_the_fewest_gpus_and_prefers_ep_for_moe():
    # R1 needs a whole H20 node: there DP8 + EP8 does not fit (each GPU would hold all
    # attention plus 32 experts), TP8 + EP8 does.
    p = plan(R1, H20, **CTX)
    assert (p.parallelism, p.nodes, p.tensor_parallel_size) == ("tp_ep", 1, 8)
    assert not plan(R1, H20, parallelism="dp_ep", data_parallel_size=8, **CTX).fits
    # A model that fits part of a node runs there, without EP.
    lite = plan(get_model("deepseek-v2-lite"), H20, gpus_per_node=8)
    assert (lite.parallelism, lite.total_gpus, lite.expert_parallel) == ("tp_pp", 1, False)
    # Dense models are never expert parallel.
    dense = get_model("deepseek-r1-distill-llama-70b")
    assert plan(dense, H20, gpus_per_node=8).parallelism == "tp_pp"
    assert any("dense" in r for r in plan(dense, H20, parallelism="dp_ep", gpus_per_node=8).reasons)


def test_mtp_costs_one_moe_layer_and_its_kv():
    base = plan(R1, H20, parallelism="dp_ep", rdma=True, **CTX)
    mtp = plan(R1, H20, parallelism="dp_ep", rdma=True, speculative_tokens=2, **CTX)
    assert mtp.speculative_tokens == 2
    # one MoE layer's share of experts (16 of 256) plus its replicated attention and projections
    one_moe_layer = (routed_expert_bytes(R1) / R1.num_moe_layers) * experts_per_rank(R1, 16) / 256
    assert one_moe_layer < mtp.mtp_bytes_per_gpu < 2 * 2**30
    assert mtp.weights_bytes_per_gpu - base.weights_bytes_per_gpu == mtp.mtp_bytes_per_gpu
    assert mtp.kv_bytes_per_token_per_gpu * R1.num_layers == base.kv_bytes_per_token_per_gpu * (R1.num_layers + 1)
    assert mtp.kv_cache_tokens < base.kv_cache_tokens
    # With pipeline stages the MTP module keeps its own embedding and LM head.
    pp = plan(R1, H20, tensor_parallel_size=8, pipeline_parallel_size=2, speculative_tokens=1, **CTX)
    pp1 = plan(R1, H20, tensor_parallel_size=8, pipeline_parallel_size=1, speculative_tokens=1, **CTX)
    head = 2 * R1.vocab_size * R1.hidden_size * 2 / 8
    assert pp.mtp_bytes_per_gpu - pp1.mtp_bytes_per_gpu == pytest.approx(head, rel=0.01)


def test_mtp_needs_a_model_that_ships_it():
    p = plan(get_model("deepseek-r1-distill-qwen-7b"), get_gpu("A10"), gpus_per_node=1, speculative_tokens=1)
    assert not p.fits and any("no MTP module" in r for r in p.reasons)


@pytest.mark.parametrize("kwargs, field", [
    ({"parallelism": "ep"}, "parallelism"),
    ({"speculative_tokens": -1}, "speculative_tokens"),
    ({"data_parallel_size": 0}, "data_parallel_size"),
    ({"data_parallel_size": 2, "parallelism": "tp_pp"}, "data_parallel_size"),
])
def test_bad_layout_input_names_the_field(kwargs, field):
    with pytest.raises(PlanError, match=rf"^{field}:"):
        plan(R1, H20, **kwargs)


def test_the_prod_plan_for_r1_on_h20():
    """What docs/planner.md states, from the shipped settings: DP16 + EP16 with MTP over two
    RDMA-connected H20 nodes; why: one node only holds R1 as TP8 + EP8 with a few GiB of KV
    per GPU, and on two nodes data-parallel attention caches several times the tokens of
    TP8 x PP2, whose TP ranks all hold the same latents."""
    s = load("prod")
    s_plan = build_plan(s)
    p = s_plan.serving.engine
    assert s_plan.pools[s.serving.gpu_pool].rdma
    assert (p.parallelism, p.nodes, p.data_parallel_size, p.experts_per_gpu, p.speculative_tokens) == (
        "dp_ep", 2, 16, 16, 1)
    one_node = plan(R1, H20, **CTX)
    assert one_node.nodes == 1 and one_node.kv_cache_bytes_per_gpu < 8 * 2**30
    tp_pp = plan(R1, H20, tensor_parallel_size=8, pipeline_parallel_size=2, speculative_tokens=1, **CTX)
    assert p.replica_kv_cache_tokens > 4 * tp_pp.replica_kv_cache_tokens
