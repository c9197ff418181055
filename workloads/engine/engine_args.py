"""Engine settings -> `vllm serve` / `vllm.entrypoints.openai.api_server` arguments.

A pure function of a small, explicit input (`EngineArgs`), so that the test that starts a
real vLLM can render arguments for a tiny local model with exactly this code.
"""

from __future__ import annotations

import json

from dataclasses import dataclass, field, replace

from capacity import wide_ep
from capacity.planner import speculative_config
from stacks.constants import HTTP_PORT
from stacks.sections.serving import has_token_budget
from workloads.observability import telemetry
from workloads.engine.context import ServingContext

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# `vllm serve` (the CLI entry point as a module): headless workers and several API servers
SERVE_PROGRAM = ("python3", "-m", "vllm.entrypoints.cli.main", "serve")
# The data-parallel engines of a multi-node replica coordinate over this port on the leader
# (vLLM: "all nodes must use the same port"); the group NetworkPolicy admits every port.
DP_RPC_PORT = 13345

# Flags whose value only means something on a GPU build of vLLM. The real-engine test on
# the CPU build drops exactly these (and says so); everything else must be accepted as is.
GPU_ONLY_FLAGS = frozenset(
    {
        "--gpu-memory-utilization",  # the CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE
        "--tensor-parallel-size",  # one CPU process in the test
        "--pipeline-parallel-size",
        "--quantization",  # fp8/awq kernels are CUDA kernels
        "--kv-cache-dtype",  # fp8 KV cache needs CUDA
        "--data-parallel-size",  # one CPU engine in the test
        "--enable-expert-parallel",
        "--speculative-config",  # the tiny test model has no MTP module
        # wide EP (capacity/wide_ep.py): DeepEP kernels and EPLB run on CUDA devices only
        "--all2all-backend",
        "--enable-eplb",
        "--eplb-config",
        "--enable-dbo",
        "--dbo-decode-token-threshold",
        "--dbo-prefill-token-threshold",
        # vllm-cpu builds the OffloadingConnector from these, then refuses it: "CPU Offloading
        # is currently only supported on CUDA-alike and XPU GPUs" (vllm/v1/kv_offload/cpu/spec.py)
        "--kv-offloading-size",
        "--kv-offloading-backend",
    }
)


@dataclass(frozen=True)
class EngineArgs:
    model: str
    served_model_name: str
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    load_format: str = "auto"
    # Seconds vLLM keeps serving in-flight requests after SIGTERM (0, vLLM's default,
    # aborts them at once).
    shutdown_timeout: int | None = None
    # Ceiling on a request's max_tokens (vLLM's OpenAI server takes the smallest of the
    # request's, this and what the context leaves: api_utils.get_max_tokens).
    max_output_tokens: int | None = None
    port: int = HTTP_PORT
    host: str = "0.0.0.0"
    # expert / data parallelism (capacity.planner PARALLELISMS) and MTP speculative decoding
    data_parallel_size: int = 1
    expert_parallel: bool = False
    speculative_config: str | None = None
    # multi-node (vLLM's multiprocessing executor across nodes, no Ray): TP x PP groups use
    # --nnodes/--node-rank/--master-addr; data-parallel engines use the --data-parallel-*
    # flags (each node runs its local share of the engines; workers start at their rank)
    nnodes: int = 1
    node_rank: str | None = None  # a literal or "$(LWS_WORKER_INDEX)"
    master_addr: str | None = None
    # observability (settings.observability): spans to the collector, request log lines
    otlp_traces_endpoint: str | None = None
    collect_detailed_traces: str | None = None  # model | worker | all
    log_requests: bool = False
    log_prompts: bool = False
    max_log_len: int | None = None
    json_logs: bool = False
    data_parallel_start_rank: str | None = None  # a literal or a shell expression
    # vLLM's reasoning parser (capacity.catalog: `deepseek_r1` for R1 and its distills):
    # the thinking goes to the message's `reasoning` field instead of `content`
    reasoning_parser: str | None = None
    # wide expert parallelism (capacity.wide_ep, expert-parallel layouts only): the MoE
    # all-to-all kernels, EPLB, dual-batch overlap, async scheduling, and the API processes
    # in front of the engines (`vllm serve --api-server-count`; None: one, vLLM's module)
    all2all_backend: str | None = None
    eplb_config: str | None = None  # set: --enable-eplb with this --eplb-config
    dbo_token_thresholds: tuple[int, int] | None = None  # set: --enable-dbo (decode, prefill)
    async_scheduling: bool = False
    api_server_count: int | None = None
    # KV cache offload to CPU memory (capacity.kv_offload): GiB per engine, vLLM's backend
    kv_offloading_size: int | None = None
    kv_offloading_backend: str = "native"
    # usage in every stream, for the gateway's token budget (workloads/edge/gateway.py)
    force_include_usage: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def data_parallel_size_local(self) -> int:
        return max(self.data_parallel_size // self.nnodes, 1)


def render(a: EngineArgs) -> list[str]:
    """The argument vector (without the program)."""
    args = [
        "--model", a.model,
        "--served-model-name", a.served_model_name,
        "--host", a.host,
        "--port", str(a.port),
        "--tensor-parallel-size", str(a.tensor_parallel_size),
        "--pipeline-parallel-size", str(a.pipeline_parallel_size),
        "--dtype", a.dtype,
        "--load-format", a.load_format,
    ]
    if a.max_model_len is not None:
        args += ["--max-model-len", str(a.max_model_len)]
    if a.max_num_seqs is not None:
        args += ["--max-num-seqs", str(a.max_num_seqs)]
    if a.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(a.max_num_batched_tokens)]
    if a.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", f"{a.gpu_memory_utilization:.2f}"]
    args.append("--enable-prefix-caching" if a.enable_prefix_caching else "--no-enable-prefix-caching")
    args.append("--enable-chunked-prefill" if a.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if a.quantization:
        args += ["--quantization", a.quantization]
    if a.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", a.kv_cache_dtype]
    if a.shutdown_timeout is not None:
        args += ["--shutdown-timeout", str(a.shutdown_timeout)]
    if a.max_output_tokens is not None:
        args += ["--override-generation-config", json.dumps({"max_new_tokens": a.max_output_tokens})]
    if a.data_parallel_size > 1:
        args += ["--data-parallel-size", str(a.data_parallel_size)]
    if a.expert_parallel:
        args.append("--enable-expert-parallel")
    if a.speculative_config:
        args += ["--speculative-config", a.speculative_config]
    if a.reasoning_parser:
        args += ["--reasoning-parser", a.reasoning_parser]
    if a.nnodes > 1 and a.data_parallel_size > 1:
        args += ["--data-parallel-size-local", str(a.data_parallel_size_local),
                 "--data-parallel-rpc-port", str(DP_RPC_PORT)]
        if a.master_addr is not None:
            args += ["--data-parallel-address", a.master_addr]
        if a.data_parallel_start_rank is not None:
            args += ["--data-parallel-start-rank", a.data_parallel_start_rank]
    elif a.nnodes > 1:
        args += ["--nnodes", str(a.nnodes), "--distributed-executor-backend", "mp"]
        if a.node_rank is not None:
            args += ["--node-rank", a.node_rank]
        if a.master_addr is not None:
            args += ["--master-addr", a.master_addr]
    args += wide_ep_args(a)
    if a.kv_offloading_size is not None:
        args += ["--kv-offloading-size", str(a.kv_offloading_size), "--kv-offloading-backend", a.kv_offloading_backend]
    args += observability_args(a)
    if a.force_include_usage:
        # a stream's last chunk carries its usage whether or not the client asked for it
        # (stream_options.include_usage), so the gateway can charge its tokens
        args.append("--enable-force-include-usage")
    args += list(a.extra_args)
    return args


def wide_ep_args(a: EngineArgs) -> list[str]:
    """The wide expert-parallel flags (capacity.wide_ep decides them; vLLM 0.32 spells them
    as in vllm/engine/arg_utils.py; tests/test_vllm_args.py parses them with its parser)."""
    args: list[str] = []
    if a.all2all_backend:
        args += ["--all2all-backend", a.all2all_backend]
    if a.eplb_config:
        args += ["--enable-eplb", "--eplb-config", a.eplb_config]
    if a.dbo_token_thresholds:
        decode, prefill = a.dbo_token_thresholds
        args += ["--enable-dbo", "--dbo-decode-token-threshold", str(decode),
                 "--dbo-prefill-token-threshold", str(prefill)]
    if a.async_scheduling:
        args.append("--async-scheduling")
    if a.api_server_count is not None:
        args += ["--api-server-count", str(a.api_server_count)]
    return args


def wide_ep_fields(ctx: ServingContext, phase: str = "aggregated") -> dict:
    """EngineArgs fields of the stack's wide-EP decision for engines serving `phase`
    (capacity.wide_ep.PHASES); none for a layout without expert parallelism."""
    w = wide_ep.decide(ctx.model, ctx.engine, phase)
    if w is None:
        return {}
    return {
        "all2all_backend": w.all2all_backend,
        "eplb_config": w.eplb_config() if w.eplb else None,
        "dbo_token_thresholds": (w.dbo_decode_token_threshold, w.dbo_prefill_token_threshold) if w.dbo else None,
        "async_scheduling": w.async_scheduling,
        "api_server_count": w.api_server_count,
    }


# Paths polled every few seconds (probes, Prometheus): kept out of the access log.
QUIET_PATHS = ("/health", "/metrics")


def observability_args(a: EngineArgs) -> list[str]:
    """Tracing and logging flags of vLLM 0.32 (checked against its real parser,
    vllm.entrypoints.launchers.cli_args.make_arg_parser, by tests/test_telemetry.py)."""
    args: list[str] = []
    if a.otlp_traces_endpoint:
        args += ["--otlp-traces-endpoint", a.otlp_traces_endpoint]
        if a.collect_detailed_traces:
            args += ["--collect-detailed-traces", a.collect_detailed_traces]
    # vLLM takes the caller's X-Request-Id as its request id; echo it on the response so a
    # client can quote it.
    args.append("--enable-request-id-headers")
    if a.log_requests:
        # INFO: request id and sampling parameters. Prompt text is logged at DEBUG only
        # (vllm/entrypoints/serve/utils/request_logger.py), outputs only with
        # --enable-log-outputs: both stay off unless prompts are asked for.
        args.append("--enable-log-requests")
        if a.max_log_len is not None:
            args += ["--max-log-len", str(a.max_log_len)]
        if a.log_prompts:
            args += ["--enable-log-outputs", "--log-level", "DEBUG"]
    if a.json_logs:
        # One JSON object per line (vLLM's and uvicorn's loggers), so the log service
        # indexes fields instead of parsing text.
        args += ["--logging-config.formatter", "json"]
    args += ["--disable-access-log-for-endpoints", ",".join(QUIET_PATHS)]
    return args


def without_flags(args: list[str], flags: frozenset[str] | set[str]) -> list[str]:
    """Drop `--flag value` pairs (and bare `--flag`s) named in `flags`."""
    out: list[str] = []
    skip = False
    for i, token in enumerate(args):
        if skip:
            skip = False
            continue
        if token in flags:
            nxt = args[i + 1] if i + 1 < len(args) else None
            skip = nxt is not None and not nxt.startswith("--")
            continue
        out.append(token)
    return out


# max_tokens ceilings per model class: DeepSeek-V3's API answers at most 8K tokens, R1's
# model card evaluates with a maximum generation length of 32,768 (its thinking included).
MAX_OUTPUT_TOKENS_BY_CLASS = {"chat": 8192, "reasoning": 32768}


def max_output_tokens(ctx: ServingContext) -> int:
    """The max_tokens ceiling the engine enforces: serving.max_output_tokens, or the model
    class's, at most the context length."""
    s = ctx.settings
    want = s.serving.max_output_tokens or MAX_OUTPUT_TOKENS_BY_CLASS[ctx.plan.slo.model_class]
    return min(want, ctx.engine.max_model_len)


def kv_offload_fields(ctx: ServingContext) -> dict:
    """--kv-offloading-size (GiB per engine, its TP ranks together: vllm/config/cache.py) and
    --kv-offloading-backend of the plan's offload buffers; none when off."""
    o = ctx.plan.serving.kv_offload
    return {} if o is None else {"kv_offloading_size": o.gib_per_engine, "kv_offloading_backend": o.backend}


def from_context(ctx: ServingContext, model_path: str, phase: str | None = None) -> EngineArgs:
    """Engine arguments for the stack: sizes from the capacity plan (which honours what the
    settings fixed), switches from the engine settings; `phase` picks the wide-EP settings
    of engines that serve prefill, decode or both (capacity.wide_ep)."""
    s = ctx.settings
    e = s.serving.engine
    p = ctx.engine
    t = s.observability.tracing
    rl = s.observability.logs.request_log
    stream = s.serving.weights_mode == "stream"
    return EngineArgs(
        model=model_path,
        served_model_name=ctx.served_model_name,
        tensor_parallel_size=p.tensor_parallel_size,
        pipeline_parallel_size=p.pipeline_parallel_size,
        max_model_len=p.max_model_len,
        max_num_seqs=p.max_num_seqs,
        max_num_batched_tokens=p.max_num_batched_tokens,
        gpu_memory_utilization=p.gpu_memory_utilization,
        enable_prefix_caching=e.enable_prefix_caching,
        enable_chunked_prefill=e.enable_chunked_prefill,
        dtype=e.dtype,
        # Only what the checkpoint's config.json does not say: vLLM reads a pre-quantised
        # checkpoint's method from it and picks its kernel (AWQ: AutoAWQConfig, Marlin where the
        # GPU has it); online FP8 of a 16-bit checkpoint is named (the plan's
        # online_quantization). The plugin's W4A16 kernel serves an AWQ checkpoint under its
        # own method name (its override_quantization_method claims it only when asked).
        quantization="dsvolc_awq" if e.quantization == "awq" and e.awq_kernel == "dsvolc" else p.online_quantization,
        kv_cache_dtype=e.kv_cache_dtype,
        # runai_streamer reads safetensors straight from TOS's S3 endpoint into GPU memory
        load_format="runai_streamer" if stream else "safetensors",
        # Drain on SIGTERM for the stack's drain budget (not a request timeout: streams have
        # none); the pod's termination grace covers it (the plan's serving.termination_grace_seconds).
        shutdown_timeout=s.serving.inflight_drain_seconds,
        max_output_tokens=max_output_tokens(ctx),
        data_parallel_size=p.data_parallel_size,
        expert_parallel=p.expert_parallel,
        speculative_config=speculative_config(p.speculative_tokens) if p.speculative_tokens else None,
        nnodes=p.nodes,
        otlp_traces_endpoint=telemetry.otlp_grpc_endpoint(ctx.plan) if t.enabled else None,
        collect_detailed_traces=t.detailed if t.enabled else None,
        log_requests=rl.enabled,
        log_prompts=rl.enabled and rl.prompts,
        max_log_len=rl.max_log_len,
        json_logs=s.observability.logs.enabled,
        reasoning_parser=ctx.model.reasoning_parser,
        **wide_ep_fields(ctx, phase or ctx.phase),
        **kv_offload_fields(ctx),
        force_include_usage=s.serving.auth.enabled and has_token_budget(s.serving.rate_limits),
        extra_args=tuple(e.extra_args),
    )


def for_rank(a: EngineArgs, *, node_rank: str, master_addr: str, worker_index: str | None = None) -> EngineArgs:
    """The arguments of one node of a multi-node replica. `worker_index`: a shell
    expression of the node's index, for the first data-parallel rank it runs (workers
    only; the leader runs ranks 0..local-1)."""
    start = None
    if a.data_parallel_size > 1 and worker_index is not None:
        # `$$` is the kubelet's escape for `$`: the shell, not the kubelet, evaluates it.
        start = f"$$(({worker_index} * {a.data_parallel_size_local}))"
    # a worker runs headless: vLLM refuses --api-server-count there (vllm/entrypoints/cli/serve.py)
    servers = a.api_server_count if worker_index is None else None
    return replace(a, node_rank=node_rank, master_addr=master_addr, data_parallel_start_rank=start,
                   api_server_count=servers)
