"""Every engine command line the renderer emits is accepted by vLLM 0.32's own parser.

For each shipped stack and the parallel layouts the planner can choose (TP x PP, TP + EP,
DP + EP, with and without MTP, single- and multi-node), every vLLM container of the
rendered workload (leader and workers) is run the way its pod runs it: `$(VAR)` expanded
as the kubelet does (the LeaderWorkerSet's LWS_* variables included), then through
/bin/sh where the command is a shell script, with `python3` on PATH replaced by a stub that
hands back the final argument vector. That vector goes through vLLM's `vllm serve` parser
(`make_arg_parser`), `validate_parsed_serve_args` and `AsyncEngineArgs.from_cli_args`,
and the parsed values are checked against the capacity plan. No server is started.
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from stacks import parse, read_raw
from workloads.engine import engine_args
from workloads.engine import manifests
from stacks.plan import build_plan
from workloads.engine.context import build_context

# vLLM's own parser: importing the real engine package takes seconds (full run only)
pytestmark = pytest.mark.integration

LWS_ENV = {"LWS_LEADER_ADDRESS": "deepseek-0.deepseek.deepseek-serving", "LWS_GROUP_SIZE": "2"}
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))

    def parse_argv(argv: list[str]):
        args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
        return args, AsyncEngineArgs.from_cli_args(args)

    return parse_argv


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory) -> Path:
    """A `python3` that prints its arguments, NUL-separated, instead of running vLLM."""
    d = tmp_path_factory.mktemp("stub")
    stub = d / "python3"
    stub.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    (d / "s3.env").write_text("export AWS_ACCESS_KEY_ID=x\n")
    return d


def kubelet_expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command and args: defined references are replaced,
    `$$` is an escaped `$`, anything else is left as written."""
    return _REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def final_argv(container: dict, env: dict[str, str], stub_dir: Path) -> list[str]:
    """The program's argument vector after the kubelet and, if any, the shell."""
    return final_program(container, env, stub_dir)[1]


def final_program(container: dict, env: dict[str, str], stub_dir: Path) -> tuple[str, list[str]]:
    """(the Python module the container runs, its argument vector after the kubelet and, if
    any, the shell)."""
    cmd = [kubelet_expand(c, env) for c in container["command"]]
    args = [kubelet_expand(a, env) for a in container.get("args", [])]
    if cmd[:2] == ["/bin/sh", "-c"]:
        script = cmd[2].replace(f"{manifests.CREDENTIALS_DIR}/s3.env", str(stub_dir / "s3.env"))
        out = subprocess.run(["/bin/sh", "-c", script, *cmd[3:], *args], capture_output=True, check=True,
                             env={**os.environ, **env, "PATH": f"{stub_dir}:{os.environ['PATH']}"})
        argv = out.stdout.decode().split("\0")[:-1]
    else:
        argv = cmd[1:] + args
    assert argv[0] == "-m", argv
    module, rest = argv[1], argv[2:]
    if module == "vllm.entrypoints.cli.main":
        assert rest[0] == "serve"
        rest = rest[1:]
    else:
        assert module == engine_args.API_SERVER_MODULE
    return module, rest


def containers(ctx) -> list[tuple[str, dict, dict[str, str]]]:
    """(role, container, environment) of every vLLM container of the rendered workload."""
    objs = manifests.render(ctx, "trn:iam::2100000000:role/reader")
    w = next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    if w["kind"] == "Deployment":
        return [("server", w["spec"]["template"]["spec"]["containers"][0], {})]
    t = w["spec"]["leaderWorkerTemplate"]
    return [("leader", t["leaderTemplate"]["spec"]["containers"][0], {**LWS_ENV, "LWS_WORKER_INDEX": "0"}),
            ("worker", t["workerTemplate"]["spec"]["containers"][0], {**LWS_ENV, "LWS_WORKER_INDEX": "1"})]


def ctx_for(stack: str, engine: dict | None = None, **sections):
    """A shipped stack with its engine settings replaced or amended (None removes a key)."""
    raw = copy.deepcopy(read_raw(stack))
    for k, v in (engine or {}).items():
        if v is None:
            raw["serving"]["engine"].pop(k, None)
        else:
            raw["serving"]["engine"][k] = v
    for path, value in sections.items():
        doc, keys = raw, path.split("__")
        for k in keys[:-1]:
            doc = doc.setdefault(k, {})
        doc[keys[-1]] = value
    s = parse(raw, stack=stack)
    return build_context(build_plan(s), image_repository="cr.example/ns/repo")


VARIANTS = {
    "dev": ("dev", {}, {}),
    "staging": ("staging", {}, {}),  # TP4, weights streamed (the shell sources credentials)
    "prod": ("prod", {}, {}),  # DP16 + EP16 over two nodes, MTP
    "prod-no-mtp": ("prod", {"speculative_tokens": 0}, {}),
    "prod-tp-ep": ("prod", {"parallelism": "tp_ep", "data_parallel_size": 2}, {}),  # TP8 per node, DP2, EP16
    "prod-tp-pp": ("prod", {"parallelism": "tp_pp", "tensor_parallel_size": 8, "pipeline_parallel_size": 2,
                            "speculative_tokens": 0}, {}),  # TP8 x PP2 (the layout without RDMA)
    # one node: DeepSeek-V2-Lite as eight data-parallel engines sharing its experts
    "staging-v2-lite-dp-ep": ("staging", {"parallelism": "dp_ep", "tensor_parallel_size": None,
                                          "max_model_len": 16384},
                              {"serving__model": "deepseek-v2-lite", "autoscaling__max_replicas": 2}),
}


@pytest.mark.engine  # its fixture imports vLLM's own code
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_rendered_flag_is_accepted_by_vllm(variant, vllm_parser, stub_dir):
    stack, engine, sections = VARIANTS[variant]
    ctx = ctx_for(stack, engine, **sections)
    p = ctx.engine
    assert p.fits
    for role, container, env in containers(ctx):
        module, argv = final_program(container, env, stub_dir)
        args, ea = vllm_parser(argv)
        check_wide_ep(ctx, role, module, args, ea)
        assert ea.tensor_parallel_size == p.tensor_parallel_size, role
        assert ea.pipeline_parallel_size == p.pipeline_parallel_size, role
        assert ea.data_parallel_size == p.data_parallel_size, role
        assert ea.enable_expert_parallel is p.expert_parallel, role
        assert ea.max_model_len == p.max_model_len and ea.max_num_seqs == p.max_num_seqs
        assert ea.shutdown_timeout == ctx.settings.serving.inflight_drain_seconds
        assert args.headless is (role == "worker")
        assert (args.reasoning_parser or None) == ctx.model.reasoning_parser, role
        spec = ea.speculative_config
        if p.speculative_tokens:
            spec = spec if isinstance(spec, dict) else json.loads(spec)
            assert spec == {"method": "deepseek_mtp", "num_speculative_tokens": p.speculative_tokens}
        else:
            assert spec is None
        if p.nodes > 1 and p.data_parallel_size > 1:
            local = p.data_parallel_size // p.nodes
            assert ea.data_parallel_size_local == local
            assert ea.data_parallel_address == LWS_ENV["LWS_LEADER_ADDRESS"]
            # worker 1 runs the second node's engines: its first rank is computed by the shell
            assert (ea.data_parallel_start_rank or 0) == (local if role == "worker" else 0)
        elif p.nodes > 1:
            assert (ea.nnodes, ea.node_rank) == (p.nodes, 1 if role == "worker" else 0)
            assert ea.master_addr == LWS_ENV["LWS_LEADER_ADDRESS"]


def check_wide_ep(ctx, role: str, module: str, args, ea) -> None:
    """The wide-EP values vLLM parsed are the plan's (expert-parallel layouts), vLLM's
    defaults elsewhere; several API servers only where `vllm serve` runs them."""
    p = ctx.engine
    offload = ctx.plan.serving.kv_offload  # KV cache offload to CPU memory (capacity/kv_offload.py)
    assert ea.kv_offloading_size == (offload.gib_per_engine if offload else None), role
    assert ea.kv_offloading_backend == "native"
    multi_node_ep = p.expert_parallel and p.nodes > 1 and p.rdma
    if not p.expert_parallel:
        assert ea.all2all_backend == "allgather_reducescatter" and not ea.enable_eplb and not ea.enable_dbo
        assert ea.async_scheduling is None and args.api_server_count is None
        return
    assert ea.all2all_backend == ("deepep_low_latency" if multi_node_ep else "allgather_reducescatter"), role
    assert ea.enable_eplb
    r = ea.eplb_config.num_redundant_experts
    assert r == p.redundant_experts and (ctx.model.n_routed_experts + r) % p.expert_parallel_size == 0
    assert ea.enable_dbo is multi_node_ep
    if ea.enable_dbo:
        assert (ea.dbo_decode_token_threshold, ea.dbo_prefill_token_threshold) == (32, 512)
    assert ea.async_scheduling is True
    if role == "worker":
        assert args.api_server_count is None
    else:
        assert args.api_server_count == p.data_parallel_size
        assert module == "vllm.entrypoints.cli.main"  # the OpenAI server module runs a single server


def test_the_layouts_tested_are_the_ones_the_planner_offers():
    seen = {(ctx.engine.parallelism, ctx.engine.nodes > 1)
            for ctx in (ctx_for(stack, engine, **sections) for stack, engine, sections in VARIANTS.values())}
    assert seen >= {("dp_ep", True), ("tp_ep", True), ("tp_pp", True), ("dp_ep", False), ("tp_pp", False)}


@pytest.mark.engine  # its fixture imports vLLM's own code
def test_a_flag_vllm_does_not_know_is_caught(vllm_parser, stub_dir, capsys):
    ctx = ctx_for("dev")
    (_, container, env) = containers(ctx)[0]
    argv = final_argv(container, env, stub_dir) + ["--enable-expert-parallelism"]
    with pytest.raises(SystemExit):
        vllm_parser(argv)
    assert "--enable-expert-parallelism" in capsys.readouterr().err


@pytest.mark.engine  # vLLM's own code, imported in the test
@pytest.mark.parametrize("stack, override", [("dev", None), ("prod", None), ("staging", 2048)])
def test_vllm_enforces_the_max_tokens_ceiling(stack, override, vllm_parser, stub_dir):
    """Nothing capped max_tokens: a request could ask the whole context and hold a slot
    (and a stream) for as long as that takes. vLLM's own parser and its max_tokens rule
    (api_utils.get_max_tokens) show the rendered ceiling holds a greedy request to it."""
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

    ctx = ctx_for(stack, **({"serving__max_output_tokens": override} if override else {}))
    cls = ctx.plan.slo.model_class
    want = min(override or {"chat": 8192, "reasoning": 32768}[cls], ctx.engine.max_model_len)
    assert engine_args.max_output_tokens(ctx) == want
    for role, container, env in containers(ctx):
        _, ea = vllm_parser(final_argv(container, env, stub_dir))
        cap = ea.override_generation_config["max_new_tokens"]
        assert cap == want, role
        assert get_max_tokens(ea.max_model_len, 10**9, 100, {}, cap) == min(want, ea.max_model_len - 100)
        assert get_max_tokens(ea.max_model_len, None, 100, {}, cap) == min(want, ea.max_model_len - 100)
        assert get_max_tokens(ea.max_model_len, 64, 100, {}, cap) == 64  # a smaller ask stands


# (stack, engine settings, sections) -> the quantization vLLM's parser must end up with
QUANT_VARIANTS = {
    # the AWQ checkpoint's config.json names its method: nothing rendered, vLLM detects it
    "awq-checkpoint": ("staging", {"quantization": "awq"}, {"serving__model": "deepseek-r1-distill-llama-70b-awq"},
                       None),
    "awq-dsvolc-kernel": ("staging", {"quantization": "awq", "awq_kernel": "dsvolc"},
                          {"serving__model": "deepseek-r1-distill-llama-70b-awq"}, "dsvolc_awq"),
    # online FP8 of the BF16 70B: vLLM 0.32's own name for it (plain `fp8` is deprecated there)
    "online-fp8": ("staging", {"quantization": "fp8"}, {}, "fp8_per_tensor"),
    "block-fp8-r1": ("prod", {"quantization": "fp8"}, {}, None),
}


@pytest.mark.engine  # vLLM's own code, imported in the test
@pytest.mark.parametrize("variant", list(QUANT_VARIANTS))
def test_quantization_reaches_vllm_as_the_checkpoint_needs(variant, vllm_parser, stub_dir):
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    stack, engine, sections, want = QUANT_VARIANTS[variant]
    ctx = ctx_for(stack, engine, **sections)
    for role, container, env in containers(ctx):
        _, ea = vllm_parser(final_argv(container, env, stub_dir))
        assert ea.quantization == want, role
        if want and want != "dsvolc_awq":  # dsvolc_awq is registered by the plugin at engine start
            assert want in QUANTIZATION_METHODS


@pytest.mark.engine  # vLLM's own code, imported in the test
def test_vllm_resolves_an_awq_checkpoint_the_same_with_or_without_the_flag(monkeypatch):
    """Why nothing is rendered for an AWQ checkpoint: on a GPU platform vLLM 0.32 resolves
    its config.json's `awq` to AutoAWQConfig (Marlin where supported) whether or not
    --quantization awq is given, and the plugin's dsvolc_awq only when asked by name."""
    from vllm.model_executor.layers.quantization import auto_awq
    from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig

    monkeypatch.setattr(auto_awq.current_platform, "is_cpu", lambda: False)  # as on CUDA
    cfg = {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm", "zero_point": True}
    assert AutoAWQConfig.override_quantization_method(cfg, None) == "auto_awq"
    assert AutoAWQConfig.override_quantization_method(cfg, "awq") == "auto_awq"
    assert AutoAWQConfig.override_quantization_method(cfg, "dsvolc_awq") is None  # left to the plugin
