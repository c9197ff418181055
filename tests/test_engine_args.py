"""Engine settings -> vLLM arguments, from the settings and the capacity plan."""

from __future__ import annotations

import copy
import json

import pytest

from stacks import load, parse, read_raw
from workloads.engine import engine_args
from stacks.plan import build_plan
from workloads.engine.context import build_context


def ctx_for(stack: str, raw: dict | None = None):
    s = parse(raw, stack=stack) if raw is not None else load(stack)
    return build_context(build_plan(s), image_repository="r.example/ns/repo")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_sizes_come_from_the_plan(stack):
    ctx = ctx_for(stack)
    args = engine_args.render(engine_args.from_context(ctx, "/models"))
    p = ctx.engine
    assert flag(args, "--tensor-parallel-size") == str(p.tensor_parallel_size)
    assert flag(args, "--pipeline-parallel-size") == str(p.pipeline_parallel_size)
    assert flag(args, "--max-model-len") == str(p.max_model_len)
    assert flag(args, "--max-num-seqs") == str(p.max_num_seqs)
    assert flag(args, "--gpu-memory-utilization") == f"{p.gpu_memory_utilization:.2f}"
    assert flag(args, "--served-model-name") == ctx.served_model_name


def test_switches_come_from_the_engine_settings():
    raw = copy.deepcopy(read_raw("dev"))
    raw["serving"]["engine"].update(enable_prefix_caching=False, enable_chunked_prefill=False,
                                    dtype="float16", extra_args=["--seed", "7"])
    raw["serving"]["served_model_name"] = "r1-7b"
    args = engine_args.render(engine_args.from_context(ctx_for("dev", raw), "/models"))
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert "--no-enable-chunked-prefill" in args
    assert flag(args, "--dtype") == "float16"
    assert flag(args, "--served-model-name") == "r1-7b"
    assert args[-2:] == ["--seed", "7"]


def test_quantization_and_kv_cache_dtype():
    ctx = ctx_for("prod")
    args = engine_args.render(engine_args.from_context(ctx, "/models"))
    assert flag(args, "--kv-cache-dtype") == "fp8"
    assert "--quantization" not in args  # the R1 checkpoint is natively FP8; nothing to request
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["model"] = "deepseek-r1-distill-llama-70b-awq"
    raw["serving"]["engine"]["quantization"] = "awq"
    args = engine_args.render(engine_args.from_context(ctx_for("staging", raw), "/models"))
    # the checkpoint's config.json names AWQ: vLLM detects it and picks its kernel itself
    assert "--quantization" not in args


def test_awq_checkpoint_on_the_plugins_kernel():
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["model"] = "deepseek-r1-distill-llama-70b-awq"
    raw["serving"]["engine"].update(quantization="awq", awq_kernel="dsvolc")
    args = engine_args.render(engine_args.from_context(ctx_for("staging", raw), "/models"))
    assert flag(args, "--quantization") == "dsvolc_awq"
    assert args.count("--quantization") == 1


def test_load_format_follows_the_weights_mode():
    staging = ctx_for("staging")  # stream
    dev = ctx_for("dev")  # sync
    assert flag(engine_args.render(engine_args.from_context(staging, "s3://b/m")), "--load-format") == "runai_streamer"
    assert flag(engine_args.render(engine_args.from_context(dev, "/models")), "--load-format") == "safetensors"


def test_multi_node_arguments():
    # TP x PP across nodes: vLLM's multiprocessing executor, one node rank per pod
    raw = copy.deepcopy(read_raw("prod"))
    raw["serving"]["engine"].update(parallelism="tp_pp", tensor_parallel_size=8, pipeline_parallel_size=2,
                                    speculative_tokens=0)
    ctx = ctx_for("prod", raw)
    assert ctx.multi_node and ctx.engine.parallelism == "tp_pp"
    base = engine_args.from_context(ctx, "/models")
    leader = engine_args.render(engine_args.for_rank(base, node_rank="0", master_addr="$(LWS_LEADER_ADDRESS)"))
    assert flag(leader, "--nnodes") == str(ctx.engine.nodes)
    assert flag(leader, "--node-rank") == "0"
    assert flag(leader, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert flag(leader, "--distributed-executor-backend") == "mp"
    assert "--data-parallel-size" not in leader and "--enable-expert-parallel" not in leader
    single = engine_args.render(engine_args.from_context(ctx_for("dev"), "/models"))
    assert "--nnodes" not in single


def test_data_parallel_multi_node_arguments():
    # prod: DP16 + EP16 over two nodes, eight engines per node, MTP
    ctx = ctx_for("prod")
    p = ctx.engine
    assert (p.data_parallel_size, p.nodes, p.expert_parallel) == (16, 2, True)
    base = engine_args.from_context(ctx, "/models")
    leader = engine_args.render(engine_args.for_rank(base, node_rank="0", master_addr="$(LWS_LEADER_ADDRESS)"))
    worker = engine_args.render(engine_args.for_rank(base, node_rank="$(LWS_WORKER_INDEX)",
                                                     master_addr="$(LWS_LEADER_ADDRESS)", worker_index="LWS_WORKER_INDEX"))
    for args in (leader, worker):
        assert flag(args, "--data-parallel-size") == "16" and "--enable-expert-parallel" in args
        assert flag(args, "--data-parallel-size-local") == "8"
        assert flag(args, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
        assert flag(args, "--data-parallel-rpc-port") == str(engine_args.DP_RPC_PORT)
        assert json.loads(flag(args, "--speculative-config")) == {"method": "deepseek_mtp", "num_speculative_tokens": 1}
        assert "--nnodes" not in args
    assert "--data-parallel-start-rank" not in leader
    # the kubelet turns $$ into $, the shell computes the worker's first rank
    assert flag(worker, "--data-parallel-start-rank") == "$$((LWS_WORKER_INDEX * 8))"


def test_without_flags_drops_pairs_and_bare_flags():
    args = ["--a", "1", "--b", "--c", "3", "--d"]
    assert engine_args.without_flags(args, {"--a", "--b"}) == ["--c", "3", "--d"]
    assert engine_args.without_flags(args, {"--d"}) == ["--a", "1", "--b", "--c", "3"]


@pytest.mark.parametrize("stack, model, parser", [
    ("dev", None, "deepseek_r1"),  # DeepSeek-R1-Distill-Qwen-7B
    ("prod", None, "deepseek_r1"),  # DeepSeek-R1
    ("staging", "deepseek-v2-lite", None),  # answers directly: no thinking to split off
])
def test_reasoning_models_get_the_r1_reasoning_parser(stack, model, parser):
    raw = copy.deepcopy(read_raw(stack))
    if model:
        raw["serving"]["model"] = model
    ctx = ctx_for(stack, raw)
    args = engine_args.render(engine_args.from_context(ctx, "/models"))
    assert ctx.model.reasoning_parser == parser
    assert flag(args, "--reasoning-parser") == parser
    assert args.count("--reasoning-parser") == (1 if parser else 0)
