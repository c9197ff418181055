"""Wide expert parallelism: the all-to-all per phase, EPLB sized by the plan, dual-batch
overlap, async scheduling and API servers, for expert-parallel layouts only."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from capacity import wide_ep
from capacity.catalog import get_model
from capacity.memory import kv_cache_tokens_for_bytes
from stacks import load, parse, read_raw
from stacks.plan import build_plan
from workloads.engine import engine_args, manifests
from workloads.engine.context import build_context


def plan_of(stack: str, engine: dict | None = None, **sections):
    raw = copy.deepcopy(read_raw(stack))
    raw["serving"]["engine"].update(engine or {})
    for path, value in sections.items():
        doc, keys = raw, path.split("__")
        for k in keys[:-1]:
            doc = doc.setdefault(k, {})
        doc[keys[-1]] = value
    return build_plan(parse(raw, stack=stack) if engine or sections else load(stack))


@pytest.fixture(scope="module")
def prod():
    return build_plan(load("prod"))


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# --------------------------------------------------------------------------- all-to-all


def test_prod_backend_per_phase(prod):
    """DP16 + EP16 over two RDMA nodes: DeepEP high-throughput for prefill, low-latency for
    decode and for engines that serve both (vLLM's guide, llm-d)."""
    p = prod.serving.engine
    assert (p.parallelism, p.nodes, p.rdma) == ("dp_ep", 2, True)
    assert wide_ep.backend_for_phase(p, "prefill")[0] == "deepep_high_throughput"
    assert wide_ep.backend_for_phase(p, "decode")[0] == "deepep_low_latency"
    backend, why = wide_ep.backend_for_phase(p, "aggregated")
    assert backend == "deepep_low_latency" and "CUDA graphs" in why
    with pytest.raises(ValueError, match="phase: expected one of prefill, decode, aggregated"):
        wide_ep.backend_for_phase(p, "both")


def test_single_node_ep_keeps_vllms_all_to_all_and_no_dbo():
    plan = plan_of("staging", {"parallelism": "dp_ep", "tensor_parallel_size": None, "max_model_len": 16384},
                   serving__model="deepseek-v2-lite", autoscaling__max_replicas=2)
    p = plan.serving.engine
    assert p.expert_parallel and p.nodes == 1
    w = wide_ep.decide(plan.serving.model, p)
    assert w.all2all_backend == "allgather_reducescatter"
    assert not w.dbo and "DeepEP" in next(c.reason for c in w.choices if c.flag == "--enable-dbo")
    assert w.eplb and w.api_server_count == p.data_parallel_size == 8


def test_layouts_without_expert_parallelism_get_nothing():
    plan = plan_of("prod", {"parallelism": "tp_pp", "tensor_parallel_size": 8, "pipeline_parallel_size": 2,
                            "speculative_tokens": 0})
    p = plan.serving.engine
    assert wide_ep.decide(plan.serving.model, p) is None
    assert p.redundant_experts is None
    dev = build_plan(load("dev"))
    assert wide_ep.decide(dev.serving.model, dev.serving.engine) is None


# --------------------------------------------------------------------------- EPLB


def test_prod_redundant_experts_are_sized_and_counted_in_the_plan(prod):
    """32 redundant experts (the recipes' count) divide over EP16 as vLLM requires, and the
    plan's KV cache is what is left after their two extra slots per GPU in every MoE layer
    (MTP's included)."""
    m, p = prod.serving.model, prod.serving.engine
    assert p.redundant_experts == 32
    assert (m.n_routed_experts + p.redundant_experts) % p.expert_parallel_size == 0  # vllm fused_moe/layer.py
    slot = 3 * m.hidden_size * m.moe_intermediate_size * (1 + 4 / 128**2)  # FP8 + one fp32 scale per block
    cost = int(2 * (m.num_moe_layers + m.mtp_layers) * slot)
    assert wide_ep.redundant_bytes_per_gpu(m, p, 32) == cost
    bare = dataclasses.replace(p, redundant_experts=None, kv_cache_bytes_per_gpu=p.kv_cache_bytes_per_gpu + cost,
                               weights_bytes_per_gpu=p.weights_bytes_per_gpu - cost)
    assert p.kv_cache_tokens == kv_cache_tokens_for_bytes(
        m, bare.kv_cache_bytes_per_gpu - cost, kv_cache_dtype=p.kv_cache_dtype, block_size=p.block_size, mtp=True)
    assert p.replica_kv_cache_tokens == 16 * p.kv_cache_tokens
    assert cost / bare.kv_cache_bytes_per_gpu <= wide_ep.MAX_EPLB_KV_SHARE
    # counting them twice changes nothing, and the decision reads the same number back
    assert wide_ep.with_redundant_experts(m, p) is p
    assert wide_ep.redundant_experts(m, p)[0] == 32 == wide_ep.redundant_experts(m, bare)[0]
    assert wide_ep.decide(m, p).redundant_experts == 32


def test_a_tight_kv_cache_gets_fewer_redundant_experts(prod):
    """Half the KV cache: 32 replicas would take over a fifth of it, 16 (one per GPU) fit."""
    m, p = prod.serving.model, prod.serving.engine
    full = p.kv_cache_bytes_per_gpu + wide_ep.redundant_bytes_per_gpu(m, p, 32)
    tight = dataclasses.replace(p, redundant_experts=None, kv_cache_bytes_per_gpu=full // 2)
    assert wide_ep.redundant_experts(m, tight)[0] == 16
    starved = dataclasses.replace(p, redundant_experts=None, kv_cache_bytes_per_gpu=full // 10)
    r, why = wide_ep.redundant_experts(m, starved)
    assert r == 0 and "only rearranges" in why


def test_eplb_stays_off_for_an_architecture_vllm_does_not_balance(prod):
    m = dataclasses.replace(prod.serving.model, architecture="some_moe")
    w = wide_ep.decide(m, dataclasses.replace(prod.serving.engine, redundant_experts=None))
    assert not w.eplb and w.redundant_experts == 0
    assert "--enable-eplb" not in w.vllm_args()


# --------------------------------------------------------------------------- rendering


def test_prod_renders_every_wide_ep_flag_on_vllm_serve(prod):
    ctx = build_context(prod, image_repository="r.example/ns/repo")
    w = wide_ep.decide(ctx.model, ctx.engine)
    objs = manifests.render(ctx, "trn:iam::1:role/r")
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    worker = lws["workerTemplate"]["spec"]["containers"][0]
    assert leader["command"] == list(engine_args.SERVE_PROGRAM)  # several API servers: `vllm serve`
    args = leader["args"]
    assert flag(args, "--all2all-backend") == "deepep_low_latency"
    assert "--enable-eplb" in args
    assert json.loads(flag(args, "--eplb-config")) == {"window_size": 1000, "step_interval": 3000,
                                                       "num_redundant_experts": 32}
    assert "--enable-dbo" in args and flag(args, "--dbo-decode-token-threshold") == "32"
    assert flag(args, "--dbo-prefill-token-threshold") == "512"
    assert "--async-scheduling" in args
    assert flag(args, "--api-server-count") == "16" == str(w.api_server_count)
    # the headless worker runs the same engine flags, without API servers (vLLM refuses them)
    assert "--api-server-count" not in worker["args"] and "--headless" in worker["args"]
    for f in ("--all2all-backend", "--eplb-config", "--dbo-decode-token-threshold"):
        assert flag(worker["args"], f) == flag(args, f)


def test_a_phase_gets_its_own_backend_and_thresholds(prod):
    """What a prefill/decode split renders per pool."""
    ctx = build_context(prod, image_repository="r.example/ns/repo")
    prefill = engine_args.render(engine_args.from_context(ctx, "/m", phase="prefill"))
    decode = engine_args.render(engine_args.from_context(ctx, "/m", phase="decode"))
    assert flag(prefill, "--all2all-backend") == "deepep_high_throughput"
    assert flag(prefill, "--dbo-prefill-token-threshold") == "32"
    assert flag(decode, "--all2all-backend") == "deepep_low_latency"


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_stacks_without_expert_parallelism_keep_the_single_server(stack):
    ctx = build_context(build_plan(load(stack)), image_repository="r.example/ns/repo")
    args = engine_args.render(engine_args.from_context(ctx, "/m"))
    for f in ("--all2all-backend", "--enable-eplb", "--enable-dbo", "--async-scheduling", "--api-server-count"):
        assert f not in args
    assert manifests.engine_command(ctx, args)["command"][-1] != "serve"


def test_every_choice_cites_a_recipe(prod):
    w = wide_ep.decide(prod.serving.model, prod.serving.engine)
    flags = {c.flag for c in w.choices}
    assert flags == {"--all2all-backend", "--enable-eplb", "--eplb-config", "--enable-dbo", "--async-scheduling",
                     "--api-server-count"}
    for c in w.choices:
        assert c.reason and ("https://" in c.recipe or c.recipe == wide_ep.VLLM_SOURCE), c
    assert get_model("deepseek-r1").architecture in wide_ep.EPLB_ARCHITECTURES


def test_max_num_seqs_follows_the_kv_cache_the_replicas_leave(prod):
    """The workload-sized max_num_seqs is sized again after EPLB; a stated one is kept and
    limits the replicas instead."""
    p = prod.serving.engine
    assert p.sequence_tokens and p.max_num_seqs == p.kv_cache_tokens // p.sequence_tokens
    assert "after EPLB's 32 redundant experts" in p.why["max_num_seqs"]
    stated = plan_of("prod", {"max_num_seqs": 24}).serving.engine
    assert stated.max_num_seqs == 24 and stated.why["max_num_seqs"].endswith(": given")
    assert stated.kv_cache_tokens >= 24 * stated.sequence_tokens
    assert stated.redundant_experts < 32
