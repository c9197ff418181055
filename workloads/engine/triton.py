"""NVIDIA Triton Inference Server in front of the vLLM engine (`serving.server: triton`).

Triton runs the same engine through its vLLM backend: the backend builds vLLM's
`AsyncEngineArgs(**model.json)`, so `model.json` is rendered here from the very
`EngineArgs` the vLLM server's command line comes from (`engine_args.from_context`). The
model repository (`<model>/config.pbtxt`, `<model>/1/model.json`) is a ConfigMap mounted
read-only. Sources, read at:

* triton-inference-server/vllm_backend 8de0c148bda1da25de1e05ffaaf67116dacc7264:
  README.md (model.json = AsyncEngineArgs fields; `REPORT_CUSTOM_METRICS` and
  `disable_log_stats: false` for the `vllm:` metrics), src/model.py (KIND_MODEL for
  multi-GPU, decoupled transaction policy and inputs/outputs auto-completed),
  docs/health_check.md (`ENABLE_VLLM_HEALTH_CHECK`, needs explicit model control),
  src/utils/metrics.py (the `vllm:` families it re-exports, below);
* triton-inference-server/server e1db8a603d863b1317ee859bdeea2be19959462e:
  python/openai/openai_frontend/main.py (the OpenAI-compatible frontend: `--openai-port`,
  `--enable-kserve-frontends`, `--kserve-http-port/--kserve-grpc-port`,
  `--model-control-mode explicit --load-model`, `--tokenizer`, `--default-max-tokens`,
  default 16) and its routers/observability.py (`/metrics` = Triton's metrics),
  docs/user_guide/metrics.md (Triton's `nv_` metrics).

The frontend answers the OpenAI API on the port every server uses (HTTP_PORT), so the
gateway, Services, NetworkPolicy and PodMonitor are the same for both servers; Triton's
KServe v2 HTTP frontend (health: /v2/health/live, /v2/health/ready) and gRPC frontend
listen on serving.triton's ports.
"""

from __future__ import annotations

import json

from stacks.constants import ENGINE_ARGS_ANNOTATION, HTTP_PORT, MODEL_CACHE_DIR
from workloads.engine import engine_args

__all__ = ["ENGINE_ARGS_ANNOTATION"]
from workloads.engine.context import ServingContext

OPENAI_FRONTEND = "/opt/tritonserver/python/openai/openai_frontend/main.py"
REPOSITORY_DIR = "/model-repository"
# The pod template carries the engine's arguments as vLLM flags too (ENGINE_ARGS_ANNOTATION):
# people read them with kubectl describe, and the policies check them as they check a vLLM
# command line.

# The `vllm:` families the vLLM backend re-exports on Triton's /metrics (src/utils/metrics.py
# at the commit above). Everything else vLLM's own server exports (queue, KV cache,
# preemptions, per-request success, HTTP status) is absent behind Triton.
VLLM_BACKEND_METRICS = frozenset({
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_n",
})
HISTOGRAMS = frozenset({
    "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_n",
})


def enabled(ctx: ServingContext) -> bool:
    return ctx.settings.serving.server == "triton"


def model_name(ctx: ServingContext) -> str:
    """Triton's model name (the repository directory), which the OpenAI frontend serves as
    the `model` clients send: the served model name, as with vLLM."""
    return ctx.served_model_name


def exports(name: str) -> bool:
    """Whether a `vllm:` series name (with a histogram suffix or not) is on Triton's /metrics."""
    if name in VLLM_BACKEND_METRICS:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return True
    return False


# --------------------------------------------------------------------------- repository


def model_json(a: engine_args.EngineArgs) -> dict:
    """vLLM AsyncEngineArgs fields for the backend: the same values the vLLM server gets as
    flags (engine_args.render), under their field names."""
    out: dict = {
        "model": a.model,
        "served_model_name": a.served_model_name,
        "tensor_parallel_size": a.tensor_parallel_size,
        "pipeline_parallel_size": a.pipeline_parallel_size,
        "dtype": a.dtype,
        "load_format": a.load_format,
        "enable_prefix_caching": a.enable_prefix_caching,
        "enable_chunked_prefill": a.enable_chunked_prefill,
        # the backend reports vLLM's stats to Triton's /metrics only with stats on
        "disable_log_stats": False,
    }
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "quantization"):
        value = getattr(a, key)
        if value is not None:
            out[key] = round(value, 2) if key == "gpu_memory_utilization" else value
    if a.kv_cache_dtype != "auto":
        out["kv_cache_dtype"] = a.kv_cache_dtype
    if a.shutdown_timeout is not None:
        out["shutdown_timeout"] = a.shutdown_timeout
    if a.reasoning_parser:  # AsyncEngineArgs.reasoning_parser (structured outputs skip the thinking)
        out["reasoning_parser"] = a.reasoning_parser
    # the engine's own spans (its observability config), under the incoming traceparent
    if a.otlp_traces_endpoint:
        out["otlp_traces_endpoint"] = a.otlp_traces_endpoint
        if a.collect_detailed_traces:
            out["collect_detailed_traces"] = a.collect_detailed_traces
    return out


# vLLM flags of its OpenAI server rather than its engine: Triton's frontend answers HTTP, so
# they have no model.json field (request logging there is Triton's own)
FRONTEND_ONLY_FIELDS = frozenset({
    "host", "port", "max_log_len", "log_level", "logging_config.formatter", "disable_access_log_for_endpoints",
    # the max_tokens ceiling is applied by vLLM's OpenAI serving layer, which Triton's frontend
    # replaces (docs/limits.md: Triton caps only by serving.triton.default_max_tokens)
    "override_generation_config",
})


def config_pbtxt(ctx: ServingContext) -> str:
    """The model's config (protobuf text format of Triton's ModelConfig). Inputs, outputs,
    the decoupled policy and max_batch_size 0 are filled in by the backend itself."""
    return "\n".join([
        f'name: "{model_name(ctx)}"',
        'backend: "vllm"',
        "# the engine places itself on the pod's GPUs (tensor parallel needs KIND_MODEL)",
        "instance_group [ { count: 1, kind: KIND_MODEL } ]",
        "# vLLM's own metrics on Triton's /metrics",
        'parameters: { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }',
        "# a dead engine turns the model (and /v2/health/ready) not ready",
        'parameters: { key: "ENABLE_VLLM_HEALTH_CHECK" value: { string_value: "true" } }',
        "",
    ])


def repository(ctx: ServingContext, model_path: str) -> dict:
    """The model repository as a ConfigMap (keys are file names; the volume's items lay
    them out as `<model>/config.pbtxt` and `<model>/1/model.json`)."""
    a = engine_args.from_context(ctx, model_path)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.metadata(f"{ctx.release}-triton-models", "server"),
        "data": {
            "config.pbtxt": config_pbtxt(ctx),
            "model.json": json.dumps(model_json(a), indent=2, sort_keys=True) + "\n",
        },
    }


def repository_volume(ctx: ServingContext) -> dict:
    name = model_name(ctx)
    return {"name": "model-repository", "configMap": {
        "name": f"{ctx.release}-triton-models",
        "items": [{"key": "config.pbtxt", "path": f"{name}/config.pbtxt"},
                  {"key": "model.json", "path": f"{name}/1/model.json"}]}}


# --------------------------------------------------------------------------- container


def frontend_args(ctx: ServingContext, tokenizer: str) -> list[str]:
    t = ctx.settings.serving.triton
    return [
        "--model-repository", REPOSITORY_DIR,
        "--tokenizer", tokenizer,
        "--host", "0.0.0.0",
        "--openai-port", str(HTTP_PORT),
        "--enable-kserve-frontends",
        "--kserve-http-port", str(t.kserve_http_port),
        "--kserve-grpc-port", str(t.kserve_grpc_port),
        "--model-control-mode", "explicit",
        "--load-model", model_name(ctx),
        "--default-max-tokens", str(t.default_max_tokens),
    ]


def tokenizer_dir(ctx: ServingContext) -> str:
    """Local tokenizer files for the frontend's chat template: the synced model directory,
    or, when streaming, the metadata the tokenizer-check init container fetched."""
    root = MODEL_CACHE_DIR if ctx.settings.serving.weights_mode == "sync" else "/model-meta"
    return f"{root}/{ctx.model.name}"


def probes(ctx: ServingContext) -> dict:
    """Triton's KServe v2 health endpoints: live while the server runs, ready once the
    model is loaded and its engine healthy. The same budgets as the vLLM server's."""
    period = 10
    startup_failures = -(-ctx.settings.serving.startup_timeout_seconds // period)
    ready = {"path": "/v2/health/ready", "port": "kserve-http"}
    live = {"path": "/v2/health/live", "port": "kserve-http"}
    return {
        "startupProbe": {"httpGet": ready, "periodSeconds": period, "timeoutSeconds": 5,
                         "failureThreshold": startup_failures},
        "readinessProbe": {"httpGet": ready, "periodSeconds": 10, "timeoutSeconds": 5,
                           "failureThreshold": 3, "successThreshold": 1},
        "livenessProbe": {"httpGet": live, "periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 6},
    }


def container(ctx: ServingContext, vllm: dict, command: dict) -> dict:
    """The vLLM server container turned into the Triton one: same image slot, resources,
    env, mounts, security and drain; Triton's program, ports and probes. `command` is the
    program with its arguments as manifests.engine_command wraps it (credentials sourced
    first when streaming)."""
    t = ctx.settings.serving.triton
    c = {k: v for k, v in vllm.items() if k not in ("startupProbe", "readinessProbe", "livenessProbe")}
    c.update(name="triton", **command)
    mounts = list(c["volumeMounts"])
    mounts.append({"name": "model-repository", "mountPath": REPOSITORY_DIR, "readOnly": True})
    if ctx.settings.serving.weights_mode == "stream":
        mounts.append({"name": "model-meta", "mountPath": "/model-meta", "readOnly": True})
    c["volumeMounts"] = mounts
    c["ports"] = [
        {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
        {"name": "kserve-http", "containerPort": t.kserve_http_port, "protocol": "TCP"},
        {"name": "grpc", "containerPort": t.kserve_grpc_port, "protocol": "TCP"},
    ]
    c.update(probes(ctx))
    return c
