"""`dsvolc size` plans what the stack plans: `--stack` against `dsvolc preview` for every
shipped stack, the layout options of the stack on the command line, and the defaults that
come from the workload (context, max_num_seqs, the ranked layout), refused where they
cannot hold."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from capacity.catalog import get_gpu, get_model
from capacity.perf import Layout, gpu_perf, load_hardware
from capacity.planner import plan
from capacity.sizing import WORKLOAD_DEFAULTS, Workload, size_for_load
from dsvolc.preview import run_preview
from dsvolc.size import size
from stacks import parse, read_raw
from stacks.errors import SettingsError
from stacks.plan import build_plan
from workloads.engine import engine_args
from workloads.engine.context import build_context

app = typer.Typer()
app.command("size")(size)


@app.command("version")
def _version() -> None:  # a second command keeps `size` a named sub-command
    pass


runner = CliRunner()
STACKS_DIR = Path(__file__).resolve().parents[1] / "stacks"
# discovered, not listed: a stack added later is held to the same agreement
SHIPPED = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml"))


def run(*args: str):
    return runner.invoke(app, ["size", *args])


def sized(*args: str) -> dict:
    res = run(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_every_shipped_stack_is_discovered():
    assert {"dev", "staging", "prod", "mig-example", "triton-example"} <= set(SHIPPED)


@pytest.mark.parametrize("stack", SHIPPED)
def test_size_stack_gives_the_engine_plan_the_preview_renders(stack):
    doc = sized("--stack", stack)
    shown = run_preview(stack, policies=False).plans[0]  # what `dsvolc preview` prints and writes
    e, r, kv = doc["engine"], doc["replica"], doc["kv_cache"]
    assert doc["stack"]["name"] == stack and doc["stack"]["gpu_pool"] == shown["gpu_pool"]
    mine = {
        "model": doc["model"], "gpu": doc["gpu"], "gpus_per_node": doc["node"]["gpus"],
        "instance_type": doc["node"]["instance_type"],
        "tensor_parallel_size": e["tensor_parallel_size"], "pipeline_parallel_size": e["pipeline_parallel_size"],
        "data_parallel_size": r["data_parallel_size"], "expert_parallel": r["expert_parallel_size"] > 1,
        "speculative_tokens": r["speculative_tokens"], "gpus_per_replica": r["gpus"], "nodes_per_replica": r["nodes"],
        "max_model_len": e["max_model_len"], "max_num_seqs": e["max_num_seqs"], "kv_cache_tokens": kv["tokens"],
        "replica_kv_cache_tokens": kv["replica_tokens"], "gpu_memory_utilization": e["gpu_memory_utilization"],
        "quantization": doc["weights_format"], "kv_cache_dtype": doc["kv_cache_dtype"],
    }
    assert mine == {k: shown[k] for k in mine}
    assert doc["stack"]["replicas"] == shown["replicas"]
    s = parse(read_raw(stack), stack=stack)
    if s.serving.server == "vllm":
        # and the command line the stack renders carries size's engine arguments
        rendered = engine_args.render(engine_args.from_context(
            build_context(build_plan(s), image_repository="r.example/ns/repo"), "/models"))
        planned = e["vllm_args"]
        for i, flag in enumerate(planned):
            if not flag.startswith("--"):
                continue
            value = planned[i + 1] if i + 1 < len(planned) and not planned[i + 1].startswith("--") else None
            if flag == "--data-parallel-size" and p_nodes(doc) > 1:
                # a multi-node DP replica renders its engines per node
                assert rendered[rendered.index("--data-parallel-size") + 1] == value
                continue
            assert flag in rendered, (flag, rendered)
            if value is not None:
                assert rendered[rendered.index(flag) + 1] == value, (flag, rendered)
    assert {"layout", "max_model_len", "max_num_seqs"} <= set(doc["why"])


def p_nodes(doc: dict) -> int:
    return doc["replica"]["nodes"]


def test_the_layout_options_on_the_command_line_reproduce_the_prod_plan():
    prod = sized("--stack", "prod")
    cli = sized("-m", "deepseek-r1", "-g", "ecs.hpcpni3ln.45xlarge", "-c", "65536", "--kv-cache-dtype", "fp8",
                "--parallelism", "dp_ep", "--speculative-tokens", "1")
    for part in ("replica", "engine", "kv_cache"):
        assert cli[part] == prod[part], part
    assert cli["replica"]["rdma"] is True  # the instance type's RDMA
    assert cli["why"]["layout"].endswith("given (parallelism dp_ep)")
    # without RDMA the same layout over two nodes is refused, with the fix
    res = run("-m", "deepseek-r1", "-g", "ecs.hpcpni3ln.45xlarge", "-c", "65536", "--kv-cache-dtype", "fp8",
              "--parallelism", "dp_ep", "--no-rdma", "--json")
    assert res.exit_code == 1 and "needs RDMA" in " ".join(json.loads(res.stdout)["reasons"])
    # --dp and --tp with tp_ep
    tp_ep = sized("-m", "deepseek-r1", "-g", "ecs.hpcpni3ln.45xlarge", "-c", "16384", "--parallelism", "tp_ep",
                  "--tp", "8", "--dp", "2")
    assert (tp_ep["replica"]["tensor_parallel_size"], tp_ep["replica"]["data_parallel_size"],
            tp_ep["replica"]["expert_parallel_size"], tp_ep["replica"]["nodes"]) == (8, 2, 16, 2)


def test_flags_beside_stack_override_its_settings_as_the_stack_would():
    doc = sized("--stack", "staging", "--context", "16384")
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["engine"]["max_model_len"] = 16384
    p = build_plan(parse(raw, stack="staging")).serving.engine
    assert (doc["engine"]["max_model_len"], doc["engine"]["max_num_seqs"], doc["kv_cache"]["tokens"]) == (
        16384, p.max_num_seqs, p.kv_cache_tokens)
    # a value the settings' schema refuses is refused naming the field
    res = run("--stack", "staging", "--parallelism", "ep")
    assert res.exit_code == 2 and "parallelism" in res.output and "Traceback" not in res.output
    res = run("--stack", "staging", "--gpu-memory-utilization", "0.1")
    assert res.exit_code == 2 and "gpu_memory_utilization" in res.output
    # the stack decides model and pool
    res = run("--stack", "staging", "--gpu", "H20")
    assert res.exit_code == 2 and "--gpu" in res.output and "serving.gpu_pool" in res.output
    res = run("--stack", "no-such-stack")
    assert res.exit_code == 2 and "known stacks" in res.output


def test_size_stack_refuses_what_preview_refuses():
    res = run("--stack", "staging", "--max-num-seqs", "512")
    assert res.exit_code == 1, res.output
    assert "max_num_seqs=512" in res.output and "expected at most 15" in res.output


# ---------------------------------------------------------------------------
# Defaults from the workload (issue 25, item 5)
# ---------------------------------------------------------------------------

def test_context_and_max_num_seqs_come_from_the_workload_not_the_whole_kv_cache():
    # R1 on one H20 node: the old defaults were the whole KV cache as context (93,184) and
    # KV tokens / 1024 sequences (91), two concurrent 32k requests
    doc = sized("-m", "deepseek-r1", "-g", "H20", "--tp", "8")
    d = WORKLOAD_DEFAULTS["reasoning"]
    seq = d["input_tokens"] + d["output_tokens"]
    e, kv = doc["engine"], doc["kv_cache"]["tokens"]
    assert e["max_model_len"] == seq == 34816
    assert e["max_num_seqs"] == min(256, kv // seq) and e["max_num_seqs"] * seq <= kv
    assert "input + output" in doc["why"]["max_model_len"] and f"{seq:,} tokens" in doc["why"]["max_num_seqs"]
    # a chat model gets the chat class's request; the flags override it
    chat = sized("-m", "deepseek-v2-lite", "-g", "H20", "-n", "1")
    assert chat["engine"]["max_model_len"] == sum(WORKLOAD_DEFAULTS["chat"].values())
    short = sized("-m", "deepseek-r1", "-g", "H20", "--tp", "8", "--input-tokens", "1000", "--output-tokens", "3000")
    assert short["engine"]["max_model_len"] == 4000
    assert short["engine"]["max_num_seqs"] == min(256, short["kv_cache"]["tokens"] // 4000)


def stack_plan(stack: str, **serving) -> object:
    raw = copy.deepcopy(read_raw(stack))
    for k, v in serving.items():
        if isinstance(v, dict):
            raw["serving"][k] = {**raw["serving"].get(k, {}), **v}
        else:
            raw["serving"][k] = v
    return build_plan(parse(raw, stack=stack))


def test_a_stack_states_its_workload_and_the_engine_is_sized_for_it():
    engine = {"max_model_len": None}
    p = stack_plan("prod", engine=engine).serving.engine
    assert p.max_model_len == 34816  # the reasoning class's 2,048 in + 32,768 out
    assert p.max_num_seqs == p.kv_cache_tokens // 34816
    p = stack_plan("prod", engine=engine, workload={"input_tokens": 4096, "output_tokens": 12288}).serving.engine
    assert p.max_model_len == 16384 and p.max_num_seqs == min(256, p.kv_cache_tokens // 16384)
    # the stated output also follows serving.max_output_tokens when the workload leaves it out
    p = stack_plan("prod", engine=engine, max_output_tokens=8192).serving.engine
    assert p.max_model_len == 2048 + 8192


def test_max_num_seqs_above_what_the_kv_cache_holds_is_refused_with_the_numbers():
    # the 32B distill on one A100 80G: about 46k tokens of KV cache, one 32k sequence
    with pytest.raises(SettingsError) as err:
        stack_plan("staging", model="deepseek-r1-distill-qwen-32b",
                   engine={"tensor_parallel_size": 1, "max_model_len": 32768, "max_num_seqs": 512})
    text = str(err.value)
    p = plan(get_model("deepseek-r1-distill-qwen-32b"), get_gpu("A100-80G"), tensor_parallel_size=1,
             pipeline_parallel_size=1, context=32768, max_num_seqs=512, sequence_tokens=2048 + 32768)
    assert 40_000 < p.kv_cache_tokens < 50_000 and not p.fits and p.sequence_tokens == 32768
    assert "serving.engine" in text and "max_num_seqs=512" in text
    assert f"{p.kv_cache_tokens:,} tokens per engine hold 1 sequence(s) of 32,768 tokens" in text
    assert "expected at most 1" in text
    # what it holds is accepted
    assert stack_plan("staging", model="deepseek-r1-distill-qwen-32b",
                      engine={"tensor_parallel_size": 1, "max_model_len": 32768, "max_num_seqs": 1})


def test_a_workload_concurrency_above_the_kv_cache_is_refused():
    with pytest.raises(SettingsError) as err:
        stack_plan("staging", workload={"concurrency": 500})
    text = str(err.value)
    assert "serving.workload.concurrency: 500" in text and "holds 15" in text and "expected at most 15" in text
    assert stack_plan("staging", workload={"concurrency": 15})


def test_a_stated_workload_longer_than_the_context_is_refused():
    with pytest.raises(SettingsError) as err:
        stack_plan("staging", workload={"input_tokens": 30000, "output_tokens": 8192})
    assert "serving.workload" in str(err.value) and "max_model_len 32,768" in str(err.value)


def test_pipeline_stages_across_nodes_without_rdma_are_refused_by_size():
    for model, gpu in (("deepseek-r1-distill-qwen-32b", "ecs.gni2.3xlarge"), ("deepseek-v2-lite", "A10")):
        args = ("-m", model, "-g", gpu) + (("-n", "1") if gpu == "A10" else ())
        res = run(*args, "--json")
        assert res.exit_code == 1, res.output
        doc = json.loads(res.stdout)
        assert not doc["fits"] and doc["replica"]["nodes"] > 1 and doc["replica"]["pipeline_parallel_size"] > 1
        assert any("needs RDMA" in r and "--rdma" in r for r in doc["reasons"])
        assert "engine" not in doc
        assert run(*args, "--rdma").exit_code == 0


def _rated(model: str, gpu: str, per_node: int, tps: tuple[int, ...], w: Workload) -> dict[int, float]:
    hw = load_hardware()
    out = {}
    for tp in tps:
        p = plan(get_model(model), get_gpu(gpu), gpus_per_node=per_node, tensor_parallel_size=tp,
                 pipeline_parallel_size=1, sequence_tokens=w.input_tokens + w.output_tokens)
        cap = size_for_load(get_model(model), gpu_perf(gpu, hw), p, Layout.from_plan(p), w, hw)
        if p.fits and cap.feasible:
            out[tp] = cap.output_tokens_per_s_per_gpu
    return out


def test_the_default_layout_is_the_one_the_performance_model_ranks_best():
    # 70B on 4 x A100: the fewest GPUs is TP2 (44k KV tokens); published configs run TP4
    w = Workload(input_tokens=2048, output_tokens=32768)
    doc = sized("-m", "deepseek-r1-distill-llama-70b", "-g", "A100-80G", "-n", "4")
    rated = _rated("deepseek-r1-distill-llama-70b", "A100-80G", 4, (2, 4), w)
    best = max(rated, key=rated.get)
    assert best == 4 and doc["replica"]["tensor_parallel_size"] == best
    assert "ranked best" in doc["why"]["layout"] and "the fewest GPUs would be TP2" in doc["why"]["layout"]
    assert "capacity/perf.py" in doc["why"]["layout"]
    table = " ".join(run("-m", "deepseek-r1-distill-llama-70b", "-g", "A100-80G", "-n", "4").stdout.split())
    assert "why layout: TP4 x PP1 on 1 node(s): ranked best" in table
    # a given size is kept, and the why says so
    given = sized("-m", "deepseek-r1-distill-llama-70b", "-g", "A100-80G", "-n", "4", "--tp", "2")
    assert given["replica"]["tensor_parallel_size"] == 2 and "given (tensor_parallel_size 2)" in given["why"]["layout"]


def test_the_stack_ranks_its_layout_at_its_own_slo_within_one_node():
    # staging without its tensor_parallel_size: ranked at the reasoning class's ITL objective
    # (1 / min_tokens_per_second) among the layouts on one node of 8 x A100 (multi_node off)
    plan_ = stack_plan("staging", engine={"tensor_parallel_size": None})
    p = plan_.serving.engine
    w = Workload(input_tokens=2048, output_tokens=32768 - 2048, ttft_slo_s=plan_.slo.ttft_p99_seconds,
                 itl_slo_s=plan_.slo.max_inter_token_seconds)
    rated = _rated("deepseek-r1-distill-llama-70b", "A100-80G", 8, (2, 4, 8), w)
    # TP8 rates highest but the pool (3 nodes) cannot hold autoscaling.max_replicas 4 + a surge
    # of one-node replicas: the best of the layouts the pool holds (TP2, TP4) is chosen
    assert max(rated, key=rated.get) == 8
    placeable = {tp: v for tp, v in rated.items() if tp < 8}
    assert p.nodes == 1 and p.tensor_parallel_size == max(placeable, key=placeable.get) == 4
    assert "ranked best" in p.why["layout"] and "ITL <= 100 ms" in p.why["layout"]
    assert "TP8 x PP1 on 1 node(s) rates higher but the pool does not hold" in p.why["layout"]
    raw = copy.deepcopy(read_raw("staging"))
    raw["serving"]["engine"]["tensor_parallel_size"] = None
    raw["cluster"]["gpu_pools"]["a100"]["max_nodes"] = 5
    assert build_plan(parse(raw, stack="staging")).serving.engine.tensor_parallel_size == 8
    doc = sized("--stack", "staging", "--tp", "2")
    assert doc["replica"]["tensor_parallel_size"] == 2
