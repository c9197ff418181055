"""`serving`: the vLLM workload: model, pool, image, engine arguments, auth and rate limits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from stacks.constants import HTTP_PORT
from stacks.sections.common import Model, Name


class EngineSettings(Model):
    """vLLM engine arguments. Unset sizes are filled by the capacity planner."""

    tensor_parallel_size: int | None = Field(None, ge=1, le=64, description="GPUs per pipeline stage; planner picks when unset")
    pipeline_parallel_size: int | None = Field(None, ge=1, le=16, description="pipeline stages (one per node when multi-node)")
    max_model_len: int | None = Field(None, ge=128, description="context length; serving.workload's input + output tokens when unset")
    max_num_seqs: int | None = Field(None, ge=1, le=4096, description="concurrent sequences per engine; those of serving.workload's length the KV cache holds (at most 256) when unset, refused above that")
    max_num_batched_tokens: int | None = Field(None, ge=128, description="token budget of one engine step")
    gpu_memory_utilization: float | None = Field(None, ge=0.3, le=0.98, description="fraction of GPU memory vLLM may use")
    enable_prefix_caching: bool = Field(True, description="reuse KV cache across requests sharing a prefix")
    enable_chunked_prefill: bool = Field(True, description="split long prefills so decodes keep flowing")
    dtype: Literal["auto", "bfloat16", "float16"] = Field("auto", description="activation dtype")
    quantization: Literal["awq", "fp8"] | None = Field(None, description="weight quantization: the checkpoint's own (awq needs an AWQ checkpoint as serving.model), "
        "or fp8 for vLLM's online FP8 of a 16-bit checkpoint")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field("auto", description="KV cache dtype")
    parallelism: Literal["auto", "tp_pp", "tp_ep", "dp_ep"] = Field(
        "auto",
        description="layout of a replica: tp_pp (tensor parallel in a node, pipeline stages across nodes), tp_ep "
        "(attention tensor parallel, experts split across all GPUs), dp_ep (attention data parallel, one engine "
        "per GPU, experts split across all GPUs); auto: the layout the performance model ranks best for "
        "serving.workload at the monitoring SLOs (across nodes only on RDMA pools); see docs/planner.md",
    )
    data_parallel_size: int | None = Field(
        None, ge=1, le=256, description="engines (attention replicas) per replica with tp_ep/dp_ep; all GPUs of the "
        "replica's nodes divided by the TP size when unset",
    )
    speculative_tokens: int = Field(
        0, ge=0, le=4,
        description="MTP speculative decoding: draft tokens per step from the model's own MTP module (DeepSeek-V3/R1; "
        "its weights and KV cache are planned in); 0 turns it off",
    )
    kv_offload: bool = Field(
        False,
        description="offload KV cache blocks to the node's CPU memory (vLLM's native CPU offloading, "
        "--kv-offloading-size/--kv-offloading-backend); sized from the node's RAM unless kv_offload_gib is set; "
        "the pod's /dev/shm and memory grow by it (docs/serving.md)",
    )
    kv_offload_gib: int | None = Field(
        None, ge=1, le=16384,
        description="CPU memory per engine for offloaded KV cache, GiB (vLLM --kv-offloading-size; an engine's "
        "TP ranks share it); refused when the pod would not fit the node; needs kv_offload",
    )
    extra_args: list[str] = Field(default_factory=list, description="extra vLLM arguments, passed through after the rendered ones; checked against vLLM's parser "
        "(stacks/vllm_flags.json), flags the stack renders from a setting are refused")
    kernels: bool = Field(True, description="install the deepseek-volc Triton kernels plugin in vLLM")
    awq_kernel: Literal["vllm", "dsvolc"] = Field(
        "vllm",
        description="linear layers of an AWQ checkpoint: vLLM's own kernels, or the plugin's W4A16 kernels "
        "(Gluon on Hopper, Triton elsewhere; --quantization dsvolc_awq; needs quantization awq and kernels on)",
    )

    @model_validator(mode="after")
    def _kv_offload(self):
        if self.kv_offload_gib is not None and not self.kv_offload:
            raise ValueError(f"kv_offload_gib: {self.kv_offload_gib} GiB with kv_offload off; expected kv_offload: "
                             "true, or no kv_offload_gib")
        return self

    @model_validator(mode="after")
    def _awq_kernel(self):
        if self.awq_kernel == "dsvolc":
            if self.quantization != "awq":
                raise ValueError(
                    f"awq_kernel: 'dsvolc' runs AWQ checkpoints; expected quantization: awq, got {self.quantization!r}"
                )
            if not self.kernels:
                raise ValueError("awq_kernel: 'dsvolc' needs kernels: true (the plugin registers dsvolc_awq)")
        return self


class WorkloadSettings(Model):
    """The request the engine is sized for: the context, max_num_seqs and the default layout
    derive from it when the engine does not state them (docs/planner.md)."""

    input_tokens: int | None = Field(
        None, ge=1, le=1_048_576, description="prompt tokens of the request the engine is sized for; 2048 when unset")
    output_tokens: int | None = Field(
        None, ge=1, le=1_048_576,
        description="generated tokens of that request; serving.max_output_tokens, else the model class's ceiling "
        "(chat 8192, reasoning 32768), when unset")
    concurrency: int | None = Field(
        None, ge=1, le=100_000,
        description="sequences in flight per replica the layout is ranked at (refused above what the KV cache holds "
        "at input + output tokens); the most the SLOs and KV cache allow when unset")


class ImageSettings(Model):
    repository: str | None = Field(None, description="image repository; the stack's CR repository when unset")
    tag: str | None = Field(None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", description="image tag (never latest)")
    digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$", description="image digest; wins over the tag")

    @model_validator(mode="after")
    def _pinned(self):
        if self.tag is None and self.digest is None:
            raise ValueError("tag: expected an image tag or digest; an unpinned image is refused")
        if self.tag == "latest":
            raise ValueError("tag: 'latest' is refused; expected a version tag or a digest")
        return self


class AuthSettings(Model):
    """The identity provider whose tokens the gateway accepts. No defaults: every stack names
    its own issuer, audiences and key set (a placeholder in an RFC 2606 example domain is
    refused for staging and prod by the `identity-provider-not-placeholder` policy)."""

    enabled: bool = Field(True, description="require a JWT on every request")
    issuer: str | None = Field(
        None, min_length=1, description="expected `iss` claim, exactly as the identity provider writes it"
    )
    audiences: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="accepted `aud` values (at least one)"
    )
    jwks_uri: str | None = Field(
        None, pattern=r"^https://[^/\s]+", description="JWKS endpoint (https) the proxies fetch the signing keys from"
    )
    jwks_configmap: Name | None = Field(
        None,
        description="instead of jwks_uri: a ConfigMap in the serving namespace whose key `jwks` holds the key set "
        "(for providers the proxies cannot reach; Envoy Gateway's localJWKS reads a ConfigMap)",
    )
    consumer_claim: str = Field("sub", min_length=1, description="claim that names the consumer (rate-limit key)")

    @model_validator(mode="after")
    def _provider(self):
        if not self.enabled:
            return self
        if self.issuer is None:
            raise ValueError("issuer: required when auth is enabled; expected the identity provider's `iss` "
                             "value, e.g. https://login.your-company.cn/")
        if not self.audiences:
            raise ValueError("audiences: required when auth is enabled; expected at least one `aud` value "
                             "your tokens carry")
        if (self.jwks_uri is None) == (self.jwks_configmap is None):
            raise ValueError("jwks_uri: expected exactly one of jwks_uri (an https URL) or jwks_configmap "
                             "(a ConfigMap holding the key set)")
        return self


TokenUnit = Literal["Minute", "Hour", "Day"]


class ConsumerLimit(Model):
    consumer: str = Field(min_length=1, description="value of the consumer claim")
    requests: int = Field(ge=1, description="requests allowed per unit")
    unit: Literal["Second", "Minute", "Hour"] = Field("Minute", description="rate-limit window")
    tokens: int | None = Field(
        None, ge=1,
        description="tokens (prompt + completion, as the response's usage counts them) this consumer may use per "
        "rate_limits.token_unit; rate_limits.tokens when unset",
    )


class RateLimitSettings(Model):
    enabled: bool = Field(True, description="rate-limit requests per consumer")
    requests: int = Field(60, ge=1, description="default requests per consumer per unit")
    unit: Literal["Second", "Minute", "Hour"] = Field("Minute", description="rate-limit window")
    consumers: list[ConsumerLimit] = Field(default_factory=list, description="per-consumer overrides")
    tokens: int | None = Field(
        None, ge=1,
        description="token budget per consumer per token_unit: prompt + completion tokens of each response (its "
        "usage, read by the gateway) are charged after it ends, and a consumer past the budget gets 429 until the "
        "window turns; off when unset (requests alone are counted)",
    )
    token_unit: TokenUnit = Field("Hour", description="window of the token budget")
    backstop_requests: int | None = Field(
        None, ge=1,
        description="requests per unit one gateway proxy admits in all, counted in the proxy itself: the backstop "
        "while the global per-consumer limit fails open (its Redis or rate-limit service down); it applies at "
        "all times, so keep it above what one consumer may send; 10 x the largest per-consumer limit of this unit "
        "when unset",
    )


def has_token_budget(rl: RateLimitSettings) -> bool:
    """Whether any consumer's tokens are counted."""
    return rl.enabled and (rl.tokens is not None or any(c.tokens is not None for c in rl.consumers))


class TritonSettings(Model):
    """NVIDIA Triton Inference Server in front of the same vLLM engine (serving.server: triton)."""

    default_max_tokens: int = Field(
        4096, ge=16, le=131072,
        description="max_tokens of a request that sets none (Triton's OpenAI frontend defaults to 16, vLLM's "
        "own server to the rest of the context); at most the engine's max_model_len",
    )
    kserve_http_port: int = Field(8080, ge=1024, le=65535, description="Triton's KServe v2 HTTP port (health probes)")
    kserve_grpc_port: int = Field(8001, ge=1024, le=65535, description="Triton's KServe v2 gRPC port")

    @model_validator(mode="after")
    def _ports(self):
        used = {HTTP_PORT: "the OpenAI port"}
        for name in ("kserve_http_port", "kserve_grpc_port"):
            port = getattr(self, name)
            if port in used:
                raise ValueError(f"{name}: {port} is already {used[port]}; expected a free port")
            used[port] = name
        return self


class PhaseSettings(Model):
    """One side of prefill/decode disaggregation: its pool, its replica bounds, its layout."""

    pool: str | None = Field(None, description="GPU pool this side runs on; serving.gpu_pool when unset (same pool)")
    min_replicas: int | None = Field(
        None, ge=1, le=100,
        description="fewest groups of this side; the performance model's count at disaggregation.requests_per_second "
        "when unset",
    )
    max_replicas: int | None = Field(
        None, ge=1, le=100, description="most groups the autoscaler may run; twice min_replicas when unset",
    )
    parallelism: Literal["auto", "tp_pp", "tp_ep", "dp_ep"] | None = Field(
        None, description="layout of one group (see serving.engine.parallelism); serving.engine.parallelism when unset",
    )
    tensor_parallel_size: int | None = Field(None, ge=1, le=64, description="GPUs per pipeline stage; planner picks when unset")
    data_parallel_size: int | None = Field(None, ge=1, le=256, description="engines per group with tp_ep/dp_ep")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_replicas is not None and self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas: {self.max_replicas} is below min_replicas ({self.min_replicas})")
        return self


class DisaggregationSettings(Model):
    """Prefill/decode disaggregation: prefill groups compute the prompt's KV cache, decode groups pull it
    over NIXL (UCX, RDMA on RDMA pools) and generate; vLLM Router sends each request to both
    (docs/serving.md, "Prefill/decode disaggregation")."""

    enabled: bool = Field(False, description="run separate prefill and decode groups instead of aggregated replicas")
    requests_per_second: float | None = Field(
        None, gt=0, le=100000,
        description="the design load the prefill:decode ratio is sized for (capacity/sizing.py disaggregated(), at "
        "the stack's TTFT and ITL objectives); required when enabled",
    )
    input_tokens: int = Field(2048, ge=1, le=1_048_576, description="prompt length of the design load")
    output_tokens: int = Field(1024, ge=1, le=1_048_576, description="output length of the design load")
    side_channel_port: int = Field(
        5600, ge=1024, le=65000,
        description="first NIXL handshake port (VLLM_NIXL_SIDE_CHANNEL_PORT; engine i of a group listens on it + i)",
    )
    prefill: PhaseSettings = Field(default_factory=PhaseSettings, description="the prefill side")
    decode: PhaseSettings = Field(default_factory=PhaseSettings, description="the decode side")

    @model_validator(mode="after")
    def _rate(self):
        if self.enabled and self.requests_per_second is None:
            raise ValueError("requests_per_second: required when disaggregation is enabled; expected the design "
                             "load in requests per second the prefill:decode ratio is sized for")
        if self.side_channel_port == HTTP_PORT:
            raise ValueError(f"side_channel_port: {HTTP_PORT} is the OpenAI port; expected a free port")
        return self


class RouterSettings(Model):
    """vLLM Router between the gateway and the engines (docs/serving.md, "Routing tier")."""

    enabled: bool | None = Field(
        None,
        description="route through vLLM Router (cache-aware for aggregated replicas, P/D for disaggregation, "
        "DP-aware for wide expert parallelism); unset: on unless Argo Rollouts runs the canary (the router finds "
        "engines by label and cannot follow Argo's stable/canary split)",
    )
    replicas: int = Field(2, ge=2, le=20, description="router replicas (at least 2, spread over nodes and zones)")
    policy: Literal["cache_aware", "power_of_two", "round_robin", "consistent_hash"] | None = Field(
        None,
        description="routing policy (both sides in P/D); unset: cache_aware, and for the decode side power_of_two "
        "(round_robin below two decode groups: vllm-router refuses power_of_two with fewer workers)",
    )
    metrics_port: int = Field(29000, ge=1024, le=65535, description="the router's Prometheus port")
    port: int = Field(8080, ge=1024, le=65535, description="the router's HTTP port")

    @model_validator(mode="after")
    def _ports(self):
        if self.port == self.metrics_port:
            raise ValueError(f"metrics_port: {self.metrics_port} is already the router's port; expected another")
        return self


class ServingSettings(Model):
    namespace: Name = Field("deepseek-serving", description="namespace of the serving workload")
    name: Name = Field("deepseek", description="release name (prefix of every serving object)")
    service_account: Name = Field("deepseek-serving", description="ServiceAccount bound to the weight reader role")
    model: str = Field(description="catalog model name (see `dsvolc size`) or path to a config.json")
    served_model_name: str | None = Field(None, description="name clients send in `model`; the model name when unset")
    weights_mode: Literal["stream", "sync"] = Field(
        "sync", description="stream: runai_streamer from TOS's S3 endpoint; sync: init container copies to the node cache"
    )
    gpu_pool: str = Field(description="GPU pool the replicas run on")
    multi_node: bool = Field(
        False,
        description="allow one replica to span several nodes (LeaderWorkerSet, pipeline parallel across "
        "nodes); off: a model that does not fit one node of the pool is refused",
    )
    replicas: int = Field(1, ge=1, le=100, description="serving replicas (instances of the model)")
    image: ImageSettings = Field(description="serving image")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="vLLM engine arguments")
    workload: WorkloadSettings = Field(
        default_factory=WorkloadSettings,
        description="the request the engine is sized for: unset max_model_len is input + output tokens, unset "
        "max_num_seqs the sequences of that length the KV cache holds, an unset layout the one the performance "
        "model ranks best for it at the monitoring SLOs",
    )
    startup_timeout_seconds: int = Field(
        1800, ge=1200, le=7200, description="how long the model may take to load before the pod is restarted"
    )
    drain_seconds: int = Field(
        20, ge=5, le=300,
        description="preStop delay: the pod has left the Services' endpoints and the gateway stops routing to it "
        "before vLLM is told to stop",
    )
    inflight_drain_seconds: int = Field(
        600, ge=0, le=7200,
        description="how long a stopping pod keeps serving requests in flight (vLLM --shutdown-timeout, the proxies' "
        "drain); a generation still running after it is cut on a scale-down or rollout; independent of the "
        "gateway's timeouts, which no longer bound a stream",
    )
    max_output_tokens: int | None = Field(
        None, ge=16, le=1_048_576,
        description="ceiling on max_tokens the engine enforces (vLLM --override-generation-config max_new_tokens: "
        "a request asking more, or none, gets this many at most); the model class's default (chat 8192, "
        "reasoning 32768) when unset, capped at the context length",
    )
    termination_grace_seconds: int | None = Field(
        None, ge=30, le=7200,
        description="time a stopping pod gets: preStop delay + vLLM's drain of in-flight requests; at least "
        "drain_seconds + inflight_drain_seconds; that sum plus 30 s when unset",
    )
    weights_sync_connections: int = Field(
        8, ge=1, le=64, description="parallel downloads (and HTTP connections) of the weights sync init container"
    )
    weights_sync_mib_per_s: int = Field(
        150, ge=10, le=20000,
        description="TOS -> node cache throughput the startup budget assumes for a sync (bounded by the data "
        "disk: size it from benchmarks/results/weights_sync.json and the disk class)",
    )
    server: Literal["vllm", "triton"] = Field(
        "vllm",
        description="what answers the OpenAI API: vLLM's own server, or NVIDIA Triton Inference Server with its "
        "vLLM backend (same engine settings, model repository generated; docs/serving.md says when)",
    )
    triton: TritonSettings = Field(default_factory=TritonSettings, description="Triton front (server: triton)")
    in_cluster_gateway: bool = Field(True, description="Envoy Gateway in the cluster with JWT and rate limits")
    gateway_replicas: int = Field(
        2, ge=1, le=20,
        description="Envoy proxy replicas of the in-cluster gateway, at least: more when the planned concurrency "
        "needs them (gateway.proxies)",
    )
    auth: AuthSettings = Field(
        description="JWT authentication: the identity provider (issuer, audiences, JWKS) this stack trusts"
    )
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings, description="per-consumer rate limits")
    disaggregation: DisaggregationSettings = Field(
        default_factory=DisaggregationSettings, description="prefill/decode disaggregation over NIXL"
    )
    router: RouterSettings = Field(default_factory=RouterSettings, description="the routing tier (vLLM Router)")

    @model_validator(mode="after")
    def _token_budget(self):
        if has_token_budget(self.rate_limits) and self.server == "triton":
            raise ValueError("rate_limits.tokens: a token budget needs usage in every response, which vLLM's own "
                             "server adds to streams (--enable-force-include-usage) and Triton's frontend does "
                             "not; expected server: vllm, or no tokens")
        if has_token_budget(self.rate_limits) and not self.auth.enabled:
            raise ValueError("rate_limits.tokens: a token budget is per consumer and needs auth.enabled (the "
                             "consumer comes from the verified token); expected auth on, or no tokens")
        return self
