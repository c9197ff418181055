"""The one settings object a stack is built from.

`stacks/Pulumi.<env>.yaml` holds a single structured key, `deepseek-volc:settings`, which
is parsed into `StackSettings`. Every default, derived value and cross-field check lives
here (or in the capacity planner), so the components never second-guess their inputs.
Unknown keys are refused: a misspelt key silently falling back to a default is how
production ends up with a public API server.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from capacity.catalog import GPUS, get_gpu, get_model
from capacity.instances import INSTANCE_TYPES, resolve_instance_type
from capacity.planner import PlanError, plan, single_node_options
from stacks.constants import ENTRY_NAMESPACE, HTTP_PORT, entry_service
from stacks.regions import (
    REGION_ZONES,
    SUPPORTED_KUBERNETES_VERSIONS,
    cr_registry_host,
)

EnvironmentClass = Literal["dev", "staging", "prod"]
# Cloud names derive from the stack name (deepseek-<stack>, deepseek-volc-<stack>-weights):
# a DNS label short enough for every name built from it (TOS buckets allow 63 characters,
# CR instances 30).
STACK_NAME = r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$"
Cidr = Annotated[ipaddress.IPv4Network, Field(description="An IPv4 CIDR block, e.g. 10.20.0.0/16")]
Name = Annotated[
    str,
    Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$", description="lower-case DNS label, 1-40 characters"),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# --------------------------------------------------------------------------- network


class NetworkSettings(_Model):
    vpc_cidr: Cidr = Field(ipaddress.IPv4Network("10.20.0.0/16"), description="CIDR of the VPC")
    subnets: dict[str, Cidr] = Field(
        default_factory=dict,
        description="node subnet per zone (zone id -> CIDR); derived as /20 blocks of the VPC when empty",
    )
    pod_subnets: dict[str, Cidr] = Field(
        default_factory=dict,
        description="VPC-CNI pod subnet per zone; derived as /19 blocks of the VPC's upper half when empty",
    )
    service_cidr: Cidr = Field(
        ipaddress.IPv4Network("172.30.0.0/18"), description="Kubernetes service CIDR (must not overlap the VPC)"
    )
    flannel_pod_cidr: Cidr = Field(
        ipaddress.IPv4Network("172.16.0.0/16"), description="pod CIDR when the pod network mode is Flannel"
    )
    nat_spec: Literal["Small", "Medium", "Large", "Extra_Large_1"] = Field(
        "Small", description="NAT gateway specification"
    )
    egress_bandwidth_mbps: int = Field(100, ge=1, le=10000, description="EIP bandwidth for egress through NAT")
    endpoint_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="address ranges of the TOS and STS endpoints the serving pods reach over HTTPS (what "
        "tos-<region>.ivolces.com and the STS endpoint resolve to in the VPC); when set, the serving pods' "
        "HTTPS egress is limited to them, else it may reach any address outside the cluster's ranges",
    )


# --------------------------------------------------------------------------- cluster


class SystemPoolSettings(_Model):
    instance_type: str = Field("ecs.g3i.xlarge", description="ECS instance type of the CPU system pool")
    min_nodes: int = Field(2, ge=1, le=100, description="minimum system nodes")
    max_nodes: int = Field(3, ge=1, le=100, description="maximum system nodes")
    system_disk_gib: int = Field(80, ge=40, le=2048, description="system disk size in GiB")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must be <= max_nodes ({self.max_nodes})")
        return self


class GpuPoolSettings(_Model):
    instance_type: str = Field(description="ECS GPU instance type, e.g. ecs.gni2.3xlarge")
    gpu: str | None = Field(
        None, description="GPU model (catalog key such as A10, H20); required when the instance type is not in the catalog"
    )
    gpus_per_node: int | None = Field(
        None, ge=1, le=16, description="GPUs per node; required when the instance type is not in the catalog"
    )
    zones: list[str] | None = Field(None, description="zones the pool spans; all stack zones when unset")
    min_nodes: int = Field(0, ge=0, le=500, description="minimum nodes (autoscaling lower bound)")
    max_nodes: int = Field(ge=1, le=500, description="maximum nodes (autoscaling upper bound)")
    desired_nodes: int | None = Field(None, ge=0, le=500, description="initial node count; min_nodes when unset")
    data_disk_gib: int = Field(
        500, ge=100, le=32768, description="data disk for the node's model cache (mounted at /mnt/model-cache)"
    )
    data_disk_type: Literal["ESSD_PL0", "ESSD_PL1", "ESSD_PL2", "ESSD_PL3"] = Field(
        "ESSD_PL0", description="model-cache disk type: its throughput bounds how fast a large model loads"
    )
    system_disk_gib: int = Field(200, ge=40, le=2048, description="system disk (container images are large)")
    labels: dict[str, str] = Field(default_factory=dict, description="extra node labels")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must be <= max_nodes ({self.max_nodes})")
        if self.desired_nodes is not None and not self.min_nodes <= self.desired_nodes <= self.max_nodes:
            raise ValueError(
                f"desired_nodes ({self.desired_nodes}) must lie between min_nodes ({self.min_nodes}) "
                f"and max_nodes ({self.max_nodes})"
            )
        if self.zones is not None and not self.zones:
            raise ValueError("zones: expected at least one zone, or leave unset for all stack zones")
        if (self.gpu is None) != (self.gpus_per_node is None):
            raise ValueError("gpu and gpus_per_node go together: set both, or neither to use the catalog")
        return self

    def hardware(self) -> tuple[str, int]:
        """(GPU model, GPUs per node): from the settings, else from the instance-type catalog."""
        if self.gpu is not None and self.gpus_per_node is not None:
            return self.gpu, self.gpus_per_node
        resolved = resolve_instance_type(self.instance_type)
        assert resolved is not None, "validated by StackSettings"
        return resolved


class ClusterSettings(_Model):
    name: Name | None = Field(None, description="cluster name; deepseek-<env> when unset")
    kubernetes_version: str = Field("1.32", description="VKE Kubernetes minor version")
    api_server_public: bool = Field(False, description="expose the API server on a public EIP")
    pod_network_mode: Literal["VpcCniShared", "Flannel"] = Field(
        "VpcCniShared", description="VKE pod network mode"
    )
    delete_protection: bool = Field(False, description="refuse to delete the cluster")
    control_plane_logging: bool = Field(True, description="ship API server, audit and scheduler logs to TLS")
    irsa: bool = Field(
        True, description="IAM roles for service accounts (applied on the second `pulumi up`: VKE enables it on existing clusters only)"
    )
    ssh_key_pair: str | None = Field(None, description="ECS key pair for node login; none (no SSH) when unset")
    system_pool: SystemPoolSettings = Field(default_factory=SystemPoolSettings, description="CPU pool for system pods")
    gpu_pools: dict[Name, GpuPoolSettings] = Field(description="GPU node pools keyed by pool name")

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v not in SUPPORTED_KUBERNETES_VERSIONS:
            raise ValueError(f"expected one of {', '.join(SUPPORTED_KUBERNETES_VERSIONS)}, got {v!r}")
        return v

    @field_validator("gpu_pools")
    @classmethod
    def _some_pool(cls, v: dict) -> dict:
        if not v:
            raise ValueError("expected at least one GPU pool")
        return v


# --------------------------------------------------------------------------- storage, registry, edge


class WeightsSettings(_Model):
    bucket_name: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$",
        description="TOS bucket for model weights; deepseek-volc-<env>-weights when unset",
    )
    prefix: str = Field(
        "models", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*[A-Za-z0-9]$", description="key prefix the serving pods may read"
    )
    noncurrent_version_days: int = Field(30, ge=1, le=3650, description="days before old object versions expire")
    sse_algorithm: Literal["AES256", "kms"] = Field("AES256", description="server-side encryption algorithm")
    kms_key_id: str | None = Field(None, description="KMS key id when sse_algorithm is kms")

    @model_validator(mode="after")
    def _kms(self):
        if self.sse_algorithm == "kms" and not self.kms_key_id:
            raise ValueError("kms_key_id: required when sse_algorithm is 'kms'")
        return self


class RegistrySettings(_Model):
    name: Name | None = Field(None, description="CR Enterprise instance name; deepseek-<env> when unset")
    namespace: Name = Field("deepseek", description="CR namespace")
    repository: Name = Field("vllm-serving", description="repository of the serving image")
    mirror_namespace: Name = Field(
        "mirror",
        description="CR namespace holding copies of every upstream image and chart the stack deploys "
        "(`dsvolc images <stack>` lists them); nothing is pulled from outside the stack's registry",
    )
    mirror_lock: str = Field(
        "stacks/mirror.lock.yaml",
        pattern=r"^[A-Za-z0-9_./-]+\.ya?ml$",
        description="digests of the mirrored artifacts, recorded at mirror time (`dsvolc images <stack> --record`); "
        "relative to the repository root",
    )


class ObservabilitySettings(_Model):
    vmp_enabled: bool = Field(True, description="create a managed Prometheus (VMP) workspace")
    vmp_instance_type: str = Field("vmp.standard.15d", description="VMP workspace instance type")


class AbHeader(_Model):
    name: str = Field("x-deepseek-variant", pattern=r"^[a-z0-9-]+$", description="request header that selects the B variant")
    value: str = Field("canary", min_length=1, description="header value routed to the canary")


class GatewaySettings(_Model):
    edge_enabled: bool = Field(True, description="create the APIG gateway in front of the cluster")
    instance_spec: str = Field("1c2g", description="APIG instance specification")
    replicas: int = Field(2, ge=1, le=20, description="APIG gateway replicas")
    public_bandwidth_mbps: int = Field(50, ge=1, le=5000, description="public bandwidth of the edge listener")
    canary_weight: int = Field(0, ge=0, le=100, description="percent of traffic sent to the canary track")
    ab_header: AbHeader = Field(default_factory=AbHeader, description="header-based A/B routing to the canary")
    request_timeout_seconds: int = Field(600, ge=10, le=3600, description="edge timeout (long generations)")



# --------------------------------------------------------------------------- serving


class EngineSettings(_Model):
    """vLLM engine arguments. Unset sizes are filled by the capacity planner."""

    tensor_parallel_size: int | None = Field(None, ge=1, le=64, description="GPUs per pipeline stage; planner picks when unset")
    pipeline_parallel_size: int | None = Field(None, ge=1, le=16, description="pipeline stages (one per node when multi-node)")
    max_model_len: int | None = Field(None, ge=128, description="context length; largest that fits (capped at the model's) when unset")
    max_num_seqs: int | None = Field(None, ge=1, le=4096, description="concurrent sequences; planner picks when unset")
    max_num_batched_tokens: int | None = Field(None, ge=128, description="token budget of one engine step")
    gpu_memory_utilization: float | None = Field(None, ge=0.3, le=0.98, description="fraction of GPU memory vLLM may use")
    enable_prefix_caching: bool = Field(True, description="reuse KV cache across requests sharing a prefix")
    enable_chunked_prefill: bool = Field(True, description="split long prefills so decodes keep flowing")
    dtype: Literal["auto", "bfloat16", "float16"] = Field("auto", description="activation dtype")
    quantization: Literal["awq", "fp8"] | None = Field(None, description="weight quantization of the checkpoint")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field("auto", description="KV cache dtype")
    extra_args: list[str] = Field(default_factory=list, description="extra vLLM arguments passed through verbatim")
    kernels: bool = Field(True, description="install the deepseek-volc Triton kernels plugin in vLLM")


class ImageSettings(_Model):
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


class AuthSettings(_Model):
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


class ConsumerLimit(_Model):
    consumer: str = Field(min_length=1, description="value of the consumer claim")
    requests: int = Field(ge=1, description="requests allowed per unit")
    unit: Literal["Second", "Minute", "Hour"] = Field("Minute", description="rate-limit window")


class RateLimitSettings(_Model):
    enabled: bool = Field(True, description="rate-limit requests per consumer")
    requests: int = Field(60, ge=1, description="default requests per consumer per unit")
    unit: Literal["Second", "Minute", "Hour"] = Field("Minute", description="rate-limit window")
    consumers: list[ConsumerLimit] = Field(default_factory=list, description="per-consumer overrides")


class ServingSettings(_Model):
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
    startup_timeout_seconds: int = Field(
        1800, ge=1200, le=7200, description="how long the model may take to load before the pod is restarted"
    )
    drain_seconds: int = Field(20, ge=0, le=300, description="preStop delay so the gateway stops routing first")
    termination_grace_seconds: int = Field(
        180, ge=30, le=3600, description="time for in-flight generations to finish on shutdown"
    )
    in_cluster_gateway: bool = Field(True, description="Envoy Gateway in the cluster with JWT and rate limits")
    gateway_replicas: int = Field(2, ge=1, le=20, description="Envoy proxy replicas of the in-cluster gateway")
    auth: AuthSettings = Field(
        description="JWT authentication: the identity provider (issuer, audiences, JWKS) this stack trusts"
    )
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings, description="per-consumer rate limits")

    @model_validator(mode="after")
    def _grace(self):
        if self.termination_grace_seconds <= self.drain_seconds:
            raise ValueError(
                f"termination_grace_seconds: {self.termination_grace_seconds} must exceed drain_seconds "
                f"({self.drain_seconds}) or in-flight requests are cut off"
            )
        return self


# --------------------------------------------------------------------------- operations


class AutoscalingSettings(_Model):
    enabled: bool = Field(True, description="scale serving replicas with KEDA on queue depth and load")
    min_replicas: int | None = Field(None, ge=1, le=100, description="lower bound; serving.replicas when unset")
    max_replicas: int = Field(4, ge=1, le=100, description="upper bound (each replica needs its GPUs)")
    waiting_per_replica: float = Field(
        4.0, gt=0, description="target vllm:num_requests_waiting per replica (the primary signal)"
    )
    requests_per_second_per_replica: float = Field(2.0, gt=0, description="target request rate per replica")
    gpu_utilization_percent: int = Field(
        90, ge=10, le=100, description="secondary signal: mean DCGM_FI_DEV_GPU_UTIL per replica"
    )
    scale_up_stabilization_seconds: int = Field(60, ge=0, le=3600, description="scale-up stabilisation window")
    scale_down_stabilization_seconds: int = Field(
        1800, ge=600, le=86400, description="scale-down stabilisation (longer than a model load, so no flapping)"
    )
    polling_interval_seconds: int = Field(15, ge=5, le=300, description="how often KEDA queries Prometheus")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        return self


class RolloutSettings(_Model):
    enabled: bool = Field(True, description="roll new versions out as an Argo Rollouts canary")
    steps: list[int] = Field(default_factory=lambda: [5, 50, 100], description="canary traffic percentages, ending at 100")
    pause_seconds: int = Field(600, ge=60, le=86400, description="time at each step while analysis runs")
    max_error_rate: float = Field(0.01, gt=0, lt=1, description="abort when the canary's 5xx ratio exceeds this")
    max_p99_latency_seconds: float | None = Field(
        None, gt=0,
        description="abort when the canary's P99 end-to-end latency exceeds this; the model class's end-to-end "
        "budget (monitoring.e2e_p99_seconds) when unset",
    )
    analysis_interval_seconds: int = Field(60, ge=10, le=3600, description="how often the analysis queries Prometheus")
    failure_limit: int = Field(2, ge=0, le=20, description="failed measurements tolerated before abort")

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("expected at least one step, ending at 100")
        if any(not 0 < x <= 100 for x in v):
            raise ValueError(f"expected percentages in 1..100, got {v}")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"expected strictly increasing percentages, got {v}")
        if v[-1] != 100:
            raise ValueError(f"expected the last step to be 100, got {v[-1]}")
        return v


class MonitoringSettings(_Model):
    enabled: bool = Field(True, description="monitors, rules, alerts, dashboard and dcgm-exporter")
    namespace: Name = Field("monitoring", description="namespace of Prometheus and Grafana")
    prometheus_url: str = Field(
        "http://prometheus-operated.monitoring.svc:9090", description="Prometheus the autoscaler and analysis query"
    )
    model_class: Literal["chat", "reasoning"] | None = Field(
        None,
        description="SLO class of the served model (sets the defaults of e2e_p99_seconds and "
        "min_tokens_per_second): reasoning models (DeepSeek-R1 and its distills) think for minutes before they "
        "answer; inferred from serving.model when unset",
    )
    ttft_p99_seconds: float = Field(2.0, gt=0, description="alert when P99 time to first token exceeds this")
    e2e_p99_seconds: float | None = Field(
        None, gt=0, description="alert when P99 end-to-end latency exceeds this; the model class's default when unset"
    )
    min_tokens_per_second: float | None = Field(
        None, gt=0, le=1000,
        description="token-rate objective: alert when the P99 time between two output tokens of a request exceeds "
        "1/this; the model class's default when unset",
    )
    p99_regression_ratio: float = Field(1.5, gt=1, description="alert when P99 is this many times last day's")
    error_rate: float = Field(0.02, gt=0, lt=1, description="alert when the failed-request ratio exceeds this")
    kv_cache_usage: float = Field(0.9, gt=0, le=1, description="alert when KV cache usage exceeds this")
    at_max_replicas_minutes: int = Field(30, ge=5, description="alert when pinned at max replicas this long")
    selector_labels: dict[str, str] = Field(
        default_factory=dict,
        description="labels added to monitors and rules so the Prometheus selects them (e.g. release: kube-prometheus-stack)",
    )
    retention_days: int = Field(
        15, ge=2, le=365,
        description="days Prometheus keeps samples (at least 2: the regression alert compares with the same hour "
        "a day earlier); sizes its persistent volume",
    )
    samples_per_second: int = Field(
        20000, ge=1000, le=10_000_000,
        description="samples Prometheus ingests per second (prometheus_tsdb_head_samples_appended_total rate); "
        "sizes its persistent volume",
    )
    storage_class: str | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="StorageClass of Prometheus' volume; the cluster's default when unset",
    )

# --------------------------------------------------------------------------- SLO classes


@dataclass(frozen=True)
class Slo:
    """The latency objectives the alerts and the canary analysis use, resolved."""

    model_class: str
    ttft_p99_seconds: float
    e2e_p99_seconds: float
    min_tokens_per_second: float
    canary_p99_seconds: float

    @property
    def max_inter_token_seconds(self) -> float:
        return 1.0 / self.min_tokens_per_second


# Defaults per model class (docs/operations.md, "Objectives per model class"). A chat model
# answers in seconds: 30 s covers a long answer at interactive speed. A reasoning model
# writes thousands of thinking tokens first (R1's answers run to minutes), so its
# end-to-end budget is long (8 min, under the gateway's 10 min request timeout) and what
# is held tight is the rate at which tokens flow.
SLO_CLASS_DEFAULTS = {
    "chat": {"e2e_p99_seconds": 30.0, "min_tokens_per_second": 20.0},
    "reasoning": {"e2e_p99_seconds": 480.0, "min_tokens_per_second": 10.0},
}
REASONING_MODEL = re.compile(r"(^|[-_/])r1([-_/.]|$)", re.I)


def infer_model_class(model: str) -> str:
    """`reasoning` for DeepSeek-R1 and the R1 distills, `chat` otherwise."""
    return "reasoning" if REASONING_MODEL.search(model) else "chat"


# --------------------------------------------------------------------------- alert delivery


class SecretKey(_Model):
    """A key of a Secret in the monitoring namespace, created by the operator
    (`kubectl -n monitoring create secret generic NAME --from-literal=KEY=...`)."""

    secret: Name = Field(description="Secret name (in monitoring.namespace)")
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", description="key within the Secret")


class WebhookReceiver(_Model):
    url: SecretKey = Field(description="Secret key holding the URL that receives Alertmanager's webhook JSON")


class FeishuReceiver(_Model):
    """A Feishu (Lark) group bot: its webhook URL, and its signing secret when the bot has
    signature verification on."""

    webhook: SecretKey = Field(description="Secret key holding the bot's webhook URL (.../open-apis/bot/v2/hook/...)")
    signing_key: SecretKey | None = Field(None, description="Secret key holding the bot's signing secret")


class EmailReceiver(_Model):
    to: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$")]] = Field(min_length=1, description="recipients")
    sender: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", description="From address")
    smarthost: str = Field(pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$", description="SMTP server as host:port")
    username: str | None = Field(None, min_length=1, description="SMTP login; none when unset")
    password: SecretKey | None = Field(None, description="Secret key holding the SMTP password")
    require_tls: bool = Field(True, description="require STARTTLS")

    @model_validator(mode="after")
    def _login(self):
        if (self.username is None) != (self.password is None):
            raise ValueError("password: username and password go together; set both, or neither")
        return self


class ReceiverSettings(_Model):
    webhook: WebhookReceiver | None = Field(None, description="a generic webhook (Alertmanager's JSON)")
    feishu: FeishuReceiver | None = Field(None, description="a Feishu/Lark group bot")
    email: EmailReceiver | None = Field(None, description="e-mail through an SMTP server")

    @model_validator(mode="after")
    def _one(self):
        if sum(x is not None for x in (self.webhook, self.feishu, self.email)) != 1:
            raise ValueError("webhook: expected exactly one of webhook, feishu or email")
        return self


class AlertingSettings(_Model):
    """Where Alertmanager sends alerts. Routing is by severity: `critical` (users hurt now,
    page) and `warning` (look in working hours) each name the receivers they go to."""

    receivers: dict[Name, ReceiverSettings] = Field(default_factory=dict, description="receivers by name")
    critical: list[Name] = Field(default_factory=list, description="receivers of critical alerts (the pager)")
    warning: list[Name] = Field(default_factory=list, description="receivers of warnings (never a pager)")
    critical_repeat_minutes: int = Field(60, ge=5, le=1440, description="re-notify a firing critical this often")
    warning_repeat_minutes: int = Field(720, ge=30, le=10080, description="re-notify a firing warning this often")

    @model_validator(mode="after")
    def _known(self):
        for sev in ("critical", "warning"):
            for i, name in enumerate(getattr(self, sev)):
                if name not in self.receivers:
                    known = ", ".join(self.receivers) or "none defined"
                    raise ValueError(f"{sev}[{i}]: {name!r} is not a receiver; expected one of {known}")
            if len(set(getattr(self, sev))) != len(getattr(self, sev)):
                raise ValueError(f"{sev}: expected distinct receivers")
        return self


# --------------------------------------------------------------------------- the stack


class StackSettings(_Model):
    stack: str = Field(
        pattern=STACK_NAME,
        description="the stack's name, set by the loader from Pulumi.<stack>.yaml (or the Pulumi stack); "
        "every cloud resource name derives from it",
    )
    environment_class: EnvironmentClass = Field(
        description="dev, staging or prod strength: chooses the policy config (and with it what the policies require)"
    )
    policy_config: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_./-]+\.json$",
        description="policy pack config, relative to the repository root; policies/config/<environment_class>.json when unset",
    )
    region: str = Field(description="VolcEngine region, e.g. cn-beijing")
    zones: list[str] = Field(min_length=1, description="availability zones the stack spans")
    project_name: str = Field("default", description="VolcEngine project the resources belong to")
    tags: dict[str, str] = Field(default_factory=dict, description="tags added to every taggable resource")
    network: NetworkSettings = Field(default_factory=NetworkSettings, description="VPC, subnets and NAT")
    cluster: ClusterSettings = Field(description="VKE cluster and node pools")
    weights: WeightsSettings = Field(default_factory=WeightsSettings, description="TOS weight store")
    registry: RegistrySettings = Field(default_factory=RegistrySettings, description="container registry")
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings, description="managed Prometheus")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="APIG edge")
    serving: ServingSettings = Field(description="the vLLM serving workload")
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings, description="replica autoscaling")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="canary rollout")
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings, description="metrics and alerts")
    alerting: AlertingSettings = Field(default_factory=AlertingSettings, description="alert receivers and routing")

    _derived: dict = PrivateAttr(default_factory=dict)

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if v not in REGION_ZONES:
            raise ValueError(f"expected one of {', '.join(REGION_ZONES)}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self):
        known = REGION_ZONES[self.region]
        for i, zone in enumerate(self.zones):
            if zone not in known:
                raise ValueError(f"zones[{i}]: {zone!r} is not a zone of {self.region}; expected one of {', '.join(known)}")
        if len(set(self.zones)) != len(self.zones):
            raise ValueError("zones: expected distinct zones")
        self._check_network()
        self._check_pools()
        a = self.autoscaling
        if a.enabled and a.min_replicas is None and self.serving.replicas > a.max_replicas:
            raise ValueError(
                f"autoscaling.max_replicas: {a.max_replicas} is below serving.replicas ({self.serving.replicas})"
            )
        if self.serving.gpu_pool not in self.cluster.gpu_pools:
            raise ValueError(
                f"serving.gpu_pool: {self.serving.gpu_pool!r} is not a GPU pool; expected one of "
                f"{', '.join(self.cluster.gpu_pools)}"
            )
        self._plan_serving()
        self._check_slo()
        return self

    # -- capacity -----------------------------------------------------------------------

    def _plan_serving(self) -> None:
        """Fill unset engine sizes from the planner; refuse settings that cannot fit."""
        sv, e = self.serving, self.serving.engine
        try:
            model = get_model(sv.model)
        except KeyError as exc:
            raise ValueError(f"serving.model: {exc.args[0]}") from None
        except (OSError, ValueError) as exc:
            raise ValueError(f"serving.model: {exc}") from None
        gpu_name, per_node = self.cluster.gpu_pools[sv.gpu_pool].hardware()
        try:
            p = plan(
                model,
                get_gpu(gpu_name),
                gpus_per_node=per_node,
                context=e.max_model_len,
                quantization=e.quantization,
                kv_cache_dtype=e.kv_cache_dtype,
                tensor_parallel_size=e.tensor_parallel_size,
                pipeline_parallel_size=e.pipeline_parallel_size,
                max_num_seqs=e.max_num_seqs,
                gpu_memory_utilization=e.gpu_memory_utilization,
                max_num_batched_tokens=e.max_num_batched_tokens,
            )
        except PlanError as exc:
            raise ValueError(f"serving.engine: {exc}") from None
        if not p.fits:
            raise ValueError(
                f"serving.engine: {model.name} does not fit on {gpu_name} x {per_node} per node "
                f"(pool {sv.gpu_pool}): " + "; ".join(p.reasons)
            )
        if p.nodes > 1 and not sv.multi_node:
            raise ValueError(self._multi_node_refusal(model, gpu_name, per_node, p))
        pool = self.cluster.gpu_pools[sv.gpu_pool]
        low = (self.autoscaling.min_replicas or sv.replicas) if self.autoscaling.enabled else sv.replicas
        needed = low * p.nodes
        if needed > pool.max_nodes:
            raise ValueError(
                f"cluster.gpu_pools.{sv.gpu_pool}.max_nodes: {low} replica(s) x {p.nodes} node(s) each need "
                f"{needed} nodes, the pool allows {pool.max_nodes}"
            )
        self._derived["plan"] = p
        self._derived["model"] = model

    def _multi_node_refusal(self, model, gpu_name: str, per_node: int, p) -> str:
        """One replica would span several nodes: say so, and name the smallest node shape on
        which it would fit alone."""
        e = self.serving.engine
        options = single_node_options(
            model, GPUS, INSTANCE_TYPES, context=e.max_model_len, quantization=e.quantization,
            kv_cache_dtype=e.kv_cache_dtype, tensor_parallel_size=e.tensor_parallel_size,
            max_num_seqs=e.max_num_seqs, gpu_memory_utilization=e.gpu_memory_utilization,
            max_num_batched_tokens=e.max_num_batched_tokens)
        if options:
            smallest = options[0]
            where = (f"the smallest pool on which it fits on one node is {smallest.describe()}"
                     + (f" (instance type not in the catalog: state gpu: {smallest.gpu} and "
                        f"gpus_per_node: {smallest.gpus_per_node})" if smallest.instance_type is None else ""))
        else:
            where = "no catalogued node shape holds it on one node"
        return (f"serving.multi_node: one replica of {model.name} needs {p.nodes} nodes of {gpu_name} x "
                f"{per_node} (pool {self.serving.gpu_pool}: TP{p.tensor_parallel_size} x "
                f"PP{p.pipeline_parallel_size}); set serving.multi_node: true to run each replica across "
                f"nodes (a LeaderWorkerSet, pipeline parallel over the network), or serve it from a larger "
                f"pool: {where}")

    @property
    def slo(self) -> Slo:
        """Latency objectives: the settings where given, else the model class's defaults."""
        m = self.monitoring
        cls = m.model_class or infer_model_class(self.serving.model)
        d = SLO_CLASS_DEFAULTS[cls]
        e2e = m.e2e_p99_seconds if m.e2e_p99_seconds is not None else d["e2e_p99_seconds"]
        return Slo(
            model_class=cls, ttft_p99_seconds=m.ttft_p99_seconds, e2e_p99_seconds=e2e,
            min_tokens_per_second=m.min_tokens_per_second or d["min_tokens_per_second"],
            canary_p99_seconds=self.rollout.max_p99_latency_seconds or e2e,
        )

    def _check_slo(self) -> None:
        timeout = self.gateway.request_timeout_seconds
        slo = self.slo
        if slo.e2e_p99_seconds >= timeout:
            given = self.monitoring.e2e_p99_seconds is not None
            raise ValueError(
                f"monitoring.e2e_p99_seconds: {slo.e2e_p99_seconds:g}"
                + ("" if given else f" (the {slo.model_class} class default)")
                + f" must be below gateway.request_timeout_seconds ({timeout}): requests are cut at the timeout, "
                "so the alert could never fire")

    @property
    def serving_plan(self):
        """The capacity plan the serving engine runs with (capacity.planner.Plan)."""
        return self._derived["plan"]

    @property
    def serving_model(self):
        """The catalog entry (capacity.catalog.ModelSpec) of the served model."""
        return self._derived["model"]

    # -- network ----------------------------------------------------------------------

    def _check_network(self) -> None:
        net = self.network
        vpc = net.vpc_cidr
        if vpc.prefixlen > 24 or vpc.prefixlen < 8:
            raise ValueError(f"network.vpc_cidr: expected a prefix between /8 and /24, got {vpc}")
        for key in ("subnets", "pod_subnets"):
            given = getattr(net, key)
            if given and set(given) != set(self.zones):
                raise ValueError(
                    f"network.{key}: expected one entry per stack zone ({', '.join(self.zones)}), got {', '.join(given)}"
                )
        subnets = self.node_subnets()
        pod_subnets = self.pod_subnets() if self.cluster.pod_network_mode == "VpcCniShared" else {}
        blocks = [(f"network.subnets.{z}", c) for z, c in subnets.items()]
        blocks += [(f"network.pod_subnets.{z}", c) for z, c in pod_subnets.items()]
        for path, cidr in blocks:
            if not cidr.subnet_of(vpc):
                raise ValueError(f"{path}: {cidr} is outside network.vpc_cidr {vpc}")
            if cidr.prefixlen > 29:
                raise ValueError(f"{path}: {cidr} is too small; expected /29 or larger")
        for i, (path_a, a) in enumerate(blocks):
            for path_b, b in blocks[i + 1 :]:
                if a.overlaps(b):
                    raise ValueError(f"{path_a}: {a} overlaps {path_b} {b}")
        if net.service_cidr.overlaps(vpc):
            raise ValueError(f"network.service_cidr: {net.service_cidr} overlaps network.vpc_cidr {vpc}")
        if self.cluster.pod_network_mode == "Flannel":
            if net.flannel_pod_cidr.overlaps(vpc):
                raise ValueError(f"network.flannel_pod_cidr: {net.flannel_pod_cidr} overlaps network.vpc_cidr {vpc}")
            if net.flannel_pod_cidr.overlaps(net.service_cidr):
                raise ValueError(
                    f"network.flannel_pod_cidr: {net.flannel_pod_cidr} overlaps network.service_cidr {net.service_cidr}"
                )

    def node_subnets(self) -> dict[str, ipaddress.IPv4Network]:
        """Node subnet per zone: as given, else consecutive /20s (or smaller for small VPCs) from the VPC start."""
        if self.network.subnets:
            return {z: self.network.subnets[z] for z in self.zones}
        vpc = self.network.vpc_cidr
        size = min(max(vpc.prefixlen + 4, 20), 28)
        blocks = vpc.subnets(new_prefix=size)
        return {z: next(blocks) for z in self.zones}

    def pod_subnets(self) -> dict[str, ipaddress.IPv4Network]:
        """VPC-CNI pod subnet per zone: as given, else /19-sized blocks from the VPC's upper half."""
        if self.network.pod_subnets:
            return {z: self.network.pod_subnets[z] for z in self.zones}
        vpc = self.network.vpc_cidr
        upper = list(vpc.subnets(prefixlen_diff=1))[1]
        size = min(max(upper.prefixlen + 2, 19), 28)
        blocks = upper.subnets(new_prefix=size)
        return {z: next(blocks) for z in self.zones}

    # -- pools ------------------------------------------------------------------------

    def _check_pools(self) -> None:
        for name, pool in self.cluster.gpu_pools.items():
            path = f"cluster.gpu_pools.{name}"
            for i, zone in enumerate(pool.zones or []):
                if zone not in self.zones:
                    raise ValueError(
                        f"{path}.zones[{i}]: {zone!r} is not a stack zone; expected one of {', '.join(self.zones)}"
                    )
            if pool.gpu is None:
                if resolve_instance_type(pool.instance_type) is None:
                    raise ValueError(
                        f"{path}.instance_type: {pool.instance_type!r} is not in the GPU instance catalog; "
                        "set gpu and gpus_per_node for it"
                    )
            elif pool.gpu not in GPUS:
                raise ValueError(f"{path}.gpu: {pool.gpu!r} is not a known GPU; expected one of {', '.join(GPUS)}")

    def pool_zones(self, pool: str) -> list[str]:
        return list(self.cluster.gpu_pools[pool].zones or self.zones)

    # -- derived names ----------------------------------------------------------------

    @property
    def resource_prefix(self) -> str:
        """Prefix of every resource and component name of this stack: deepseek-<stack>."""
        return f"deepseek-{self.stack}"

    @property
    def policy_config_path(self) -> str:
        """The policy pack config this stack is judged by (relative to the repository root)."""
        return self.policy_config or f"policies/config/{self.environment_class}.json"

    @property
    def cluster_name(self) -> str:
        return self.cluster.name or self.resource_prefix

    @property
    def bucket_name(self) -> str:
        return self.weights.bucket_name or f"deepseek-volc-{self.stack}-weights"

    @property
    def registry_name(self) -> str:
        return self.registry.name or self.resource_prefix

    @property
    def image_repository(self) -> str:
        """The stack's CR repository for the serving image (infra/registry.py creates it)."""
        return f"{cr_registry_host(self.registry_name, self.region)}/{self.registry.namespace}/{self.registry.repository}"

    @property
    def serving_namespace(self) -> str:
        return self.serving.namespace

    @property
    def serving_service_account(self) -> str:
        return self.serving.service_account

    def edge_upstreams(self) -> list[dict]:
        """Where the APIG edge forwards. With the in-cluster gateway, one upstream (the split
        happens in the HTTPRoute); without it, stable and canary Services split by weight."""
        if self.serving.in_cluster_gateway:

            return [
                {"role": "gateway", "namespace": ENTRY_NAMESPACE, "service": entry_service(self.serving.name),
                 "port": 80, "weight": 100}
            ]
        w = self.gateway.canary_weight
        ns, name = self.serving.namespace, self.serving.name
        return [
            {"role": "stable", "namespace": ns, "service": f"{name}-stable", "port": HTTP_PORT, "weight": 100 - w},
            {"role": "canary", "namespace": ns, "service": f"{name}-canary", "port": HTTP_PORT, "weight": w},
        ]

    def resource_tags(self) -> dict[str, str]:
        return {"project": "deepseek-volc", "stack": self.stack, "environment": self.environment_class, **self.tags}

