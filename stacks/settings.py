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
from dataclasses import dataclass, replace
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
from capacity.instances import INSTANCE_TYPES, get_instance_type, resolve_instance_type, suggest_instance_type
from capacity.mig import MigError, MigProfile, mig_profile, slice_gpu
from capacity.planner import PlanError, plan, single_node_options
from capacity.suggest import did_you_mean
from stacks.addons import ADDONS, Addon
from stacks.constants import ENTRY_NAMESPACE, HTTP_PORT, entry_service
from stacks.contract import load as load_contract
from stacks.names import BucketName, ClusterName, CrNamespace, PoolName, RegistryName
from stacks.nodepools import PoolHardware, pool_hardware, rdma_per_pod, single_numa_refusal, topology_policy
from stacks.regions import (
    REGION_ZONES,
    SUPPORTED_KUBERNETES_VERSIONS,
    apmplus_otlp_endpoint,
    cr_registry_host,
    refuse_unsold,
    tls_otlp_endpoint,
)

EnvironmentClass = Literal["dev", "staging", "prod"]
# Kept on top of preStop + drain in a serving pod's termination grace: the kubelet's own
# stop work and vLLM's teardown after the last request.
GRACE_MARGIN_SECONDS = 30
# Cloud names derive from the stack name (deepseek-<stack>, deepseek-volc-<stack>-weights):
# a DNS label short enough for every name built from it (TOS buckets allow 63 characters,
# CR instances 30).
STACK_NAME = r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$"
Cidr = Annotated[ipaddress.IPv4Network, Field(description="An IPv4 CIDR block, e.g. 10.20.0.0/16")]
Name = Annotated[
    str,
    Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$", description="lower-case DNS label, 1-40 characters"),
]
InstanceTypeName = Annotated[
    str,
    Field(pattern=r"^ecs\.[a-z0-9]+\.[a-z0-9]+$", description="an ECS instance type id, e.g. ecs.g3i.xlarge"),
]

# Values that reach a constrained provider argument take their accepted values from the
# provider contract (stacks/provider_contract.yaml): one source of truth.
_C = load_contract()
NODE_POOL = "volcengine:vke/nodePool:NodePool"
NatSpec = _C.literal("volcengine:nat/gateway:Gateway", "spec")
DiskType = _C.literal(NODE_POOL, "nodeConfig.dataVolumes[].type")
TopologyPolicy = _C.literal(NODE_POOL, "kubernetesConfig.kubeletConfig.topologyManagerPolicy")
SseAlgorithm = _C.literal("volcengine:tos/bucketEncryption:BucketEncryption",
                          "rule.applyServerSideEncryptionByDefault.sseAlgorithm")
PodNetworkMode = _C.literal("volcengine:vke/cluster:Cluster", "podsConfig.podNetworkMode")
ApigInstanceSpec = _C.literal("volcengine:apig/apigGateway:ApigGateway", "resourceSpec.instanceSpecCode")
KUBECONFIG = "volcengine:vke/kubeconfig:Kubeconfig"
# The NAT gateways' EIPs are billed by traffic (infra/network.py): the bandwidth range the
# API accepts for that billing type.
EIP_TRAFFIC_MAX_MBPS = dict(_C.argument("volcengine:eip/address:Address", "bandwidth").range_when[1])["PostPaidByTraffic"][1]
# Internet NAT gateways one VPC holds (BytePlus NAT gateway FAQ, "How many Internet NAT
# Gateways can I create in a Virtual Private Cloud?": up to three;
# https://docs.byteplus.com/en/docs/natgateway/NAT-gateway-FAQ).
NAT_GATEWAYS_PER_VPC = 3
NAT_FAQ = "https://docs.byteplus.com/en/docs/natgateway/NAT-gateway-FAQ"
# What a deploy's kubeconfig has left at the least (valid_hours - rotate_hours): longer
# than the longest `pulumi up` (prod: a node scale-up, a ~335 GB weight sync per node and
# a canary of several analysis steps take a few hours), so it never expires mid-update.
KUBECONFIG_MARGIN_HOURS = 12


def instance_type_rdma(instance_type: str) -> bool:
    """VolcEngine's HPC GPU instance types (ecs.hpc*, ecs.ebmhpc*) sit in an HPC cluster with
    RDMA NICs between nodes (ecs.hpcpni2.28xlarge, ecs.hpcpni3ln.45xlarge: RDMA)."""
    family = instance_type.split(".")
    return len(family) > 1 and family[1].startswith(("hpc", "ebmhpc"))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


VKE_CLUSTER = "volcengine:vke/cluster:Cluster"


def _refuse_cidr(path: str, cidr: ipaddress.IPv4Network, resource_type: str, argument: str, what: str) -> None:
    """Refuse a CIDR the provider contract says VolcEngine does not take for `argument`,
    naming the field, the accepted ranges and where VolcEngine documents them."""
    arg = _C.argument(resource_type, argument)
    problems = arg.problems([str(cidr)] if arg.type.startswith("list") else str(cidr))
    if problems:
        problem = re.sub(r"^\[\d+\]: ", "", problems[0])
        raise ValueError(f"{path}: {problem}: the private ranges {what} accepts ({arg.doc})")


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
    nat: Literal["per_zone", "shared"] | None = Field(
        None,
        description="NAT gateways for egress: per_zone (a NAT gateway, EIP and route table in every zone, so "
        "losing a zone cuts no other zone's egress to TOS, STS or the registry) or shared (one NAT gateway in "
        "the first zone for every subnet: cheaper, for dev-class stacks only); per_zone, or shared for the dev "
        "class, when unset",
    )
    nat_spec: NatSpec = Field("Small", description="NAT gateway specification (as the provider accepts it)")
    egress_bandwidth_mbps: int = Field(
        100, ge=1, le=EIP_TRAFFIC_MAX_MBPS,
        description="EIP bandwidth of each NAT gateway (each zone's with per_zone), Mbit/s; billed by traffic"
    )
    endpoint_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="address ranges of the TOS and STS endpoints the serving pods reach over HTTPS (what "
        "tos-<region>.ivolces.com and the STS endpoint resolve to in the VPC); when set, the serving pods' "
        "HTTPS egress is limited to them, else it may reach any address outside the cluster's ranges",
    )


# --------------------------------------------------------------------------- cluster


class SystemPoolSettings(_Model):
    instance_type: InstanceTypeName = Field("ecs.g3i.xlarge", description="ECS instance type of the CPU system pool")
    min_nodes: int = Field(2, ge=1, le=100, description="minimum system nodes")
    max_nodes: int = Field(3, ge=1, le=100, description="maximum system nodes")
    system_disk_gib: int = Field(80, ge=40, le=2048, description="system disk size in GiB")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must be <= max_nodes ({self.max_nodes})")
        return self


class MigSettings(_Model):
    profile: str = Field(
        pattern=r"^[1-7]g\.[0-9]+gb$",
        description="MIG profile every GPU of the pool is cut into (e.g. 1g.10gb); the pool's GPU must offer it "
        "(A100-40G/80G, H100, H800, H20, H200: see capacity/mig.py). Each serving replica takes one slice.",
    )


class AutoRepairSettings(_Model):
    enabled: bool = Field(
        False,
        description="VKE node check and self-healing on the pool (node pool management.remedy_config): GPU and "
        "node faults get the node cordoned, drained and repaired by VKE",
    )
    remedy_policy_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="VKE remedy policy to apply; the cluster's default policy when unset",
    )


class GpuPoolSettings(_Model):
    instance_type: InstanceTypeName = Field(description="ECS GPU instance type, e.g. ecs.gni2.3xlarge")
    gpu: str | None = Field(
        None, description="GPU model (catalog key such as A10, H20); required when the instance type is not in the catalog"
    )
    gpus_per_node: int | None = Field(
        None, ge=1, le=16, description="GPUs per node; required when the instance type is not in the catalog"
    )
    zones: list[str] | None = Field(
        None, description="zones the pool spans; all stack zones when unset; exactly one for HPC instance types"
    )
    numa_nodes: int | None = Field(
        None, ge=1, le=8, description="NUMA nodes of the instance type (lscpu); the catalog's when unset"
    )
    rdma_nics: int | None = Field(
        None, ge=0, le=16, description="RDMA NICs per node for GPU traffic between nodes; the catalog's when unset"
    )
    hpc_cluster_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="existing ECS HPC cluster for an HPC instance type; the stack creates one in the pool's zone when unset",
    )
    topology_manager_policy: TopologyPolicy | None = Field(
        None, description="kubelet topology manager policy; chosen from GPUs per pod and the NUMA layout when unset"
    )
    min_nodes: int = Field(0, ge=0, le=500, description="minimum nodes (autoscaling lower bound)")
    max_nodes: int = Field(ge=1, le=500, description="maximum nodes (autoscaling upper bound)")
    desired_nodes: int | None = Field(None, ge=0, le=500, description="initial node count; min_nodes when unset")
    data_disk_gib: int = Field(
        500, ge=100, le=32768, description="data disk for the node's model cache (mounted at /mnt/model-cache)"
    )
    data_disk_type: DiskType = Field(
        "ESSD_PL0", description="model-cache disk type (as VKE node pools accept it): its throughput bounds how fast "
        "a large model loads"
    )
    system_disk_gib: int = Field(200, ge=40, le=2048, description="system disk (container images are large)")
    labels: dict[str, str] = Field(default_factory=dict, description="extra node labels")
    mig: MigSettings | None = Field(
        None, description="cut every GPU into MIG slices of one profile (small models); whole GPUs when unset"
    )
    auto_repair: AutoRepairSettings = Field(
        default_factory=AutoRepairSettings, description="VKE auto-repair of faulty GPU nodes"
    )

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


class DeployKubeconfigSettings(_Model):
    """The kubeconfig `pulumi up` deploys the Kubernetes layer with (VKE's CreateKubeconfig
    for the deploying identity). Short-lived and rotated by `pulumi up` itself: each update
    in a new rotation window replaces it (create before delete) with a fresh one."""

    valid_hours: int = Field(
        48, ge=1, le=_C.argument(KUBECONFIG, "validDuration").range[1],
        description="hours the kubeconfig is valid for (VKE accepts 1-43800; the policy pack's "
        "kubeconfig-short-lived caps it, 168 by default); at least rotate_hours + 12",
    )
    rotate_hours: int = Field(
        24, ge=1, le=8760,
        description="a `pulumi up` in a new window of this many hours (UTC, counted from the Unix epoch) "
        "replaces the kubeconfig, so a deploy never holds one with less than valid_hours - rotate_hours left",
    )

    @model_validator(mode="after")
    def _margin(self):
        left = self.valid_hours - self.rotate_hours
        if left < KUBECONFIG_MARGIN_HOURS:
            raise ValueError(
                f"valid_hours: {self.valid_hours} h leaves a deploy as little as {left} h of a kubeconfig rotated "
                f"every {self.rotate_hours} h; expected at least rotate_hours + {KUBECONFIG_MARGIN_HOURS} "
                f"({self.rotate_hours + KUBECONFIG_MARGIN_HOURS}), so none expires during an update")
        return self


class ClusterSettings(_Model):
    name: ClusterName | None = Field(None, description="cluster name; deepseek-<env> when unset")
    kubernetes_version: str = Field("1.32", description="VKE Kubernetes minor version")
    api_server_public: bool = Field(False, description="expose the API server on a public EIP")
    pod_network_mode: PodNetworkMode = Field(
        "VpcCniShared", description="VKE pod network mode"
    )
    delete_protection: bool = Field(False, description="refuse to delete the cluster")
    control_plane_logging: bool = Field(True, description="ship API server, audit and scheduler logs to TLS")
    irsa: bool = Field(
        True,
        description="weights reader through IAM roles for service accounts; false: the IAM-user fallback (a static "
        "key in a Secret). Either way the reader identity comes in deploy phase 2, once the cluster exists "
        "(VKE enables IRSA on existing clusters only; see docs/deploy.md)",
    )
    ssh_key_pair: str | None = Field(None, description="ECS key pair for node login; none (no SSH) when unset")
    deploy_kubeconfig: DeployKubeconfigSettings = Field(
        default_factory=DeployKubeconfigSettings,
        description="the short-lived kubeconfig `pulumi up` deploys with (operators get their own: docs/deploy.md)",
    )
    addon_versions: dict[str, str] = Field(
        default_factory=dict,
        description="VKE add-on versions to pin where stacks/addons.py has none (add-on name -> version)",
    )
    system_pool: SystemPoolSettings = Field(default_factory=SystemPoolSettings, description="CPU pool for system pods")
    gpu_pools: dict[PoolName, GpuPoolSettings] = Field(description="GPU node pools keyed by pool name")

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v not in SUPPORTED_KUBERNETES_VERSIONS:
            raise ValueError(f"expected one of {', '.join(SUPPORTED_KUBERNETES_VERSIONS)}, got {v!r}")
        return v

    @field_validator("addon_versions")
    @classmethod
    def _addons(cls, v: dict[str, str]) -> dict[str, str]:
        for name, version in v.items():
            if name not in ADDONS:
                raise ValueError(f"{name!r} is not an add-on the stack installs; expected one of {', '.join(ADDONS)}")
            if not version.strip():
                raise ValueError(f"{name}: expected a version such as v1.1.4")
        return v

    @field_validator("gpu_pools")
    @classmethod
    def _some_pool(cls, v: dict) -> dict:
        if not v:
            raise ValueError("expected at least one GPU pool")
        return v


# --------------------------------------------------------------------------- storage, registry, edge


class WeightsSettings(_Model):
    bucket_name: BucketName | None = Field(
        None,
        description="TOS bucket for model weights; deepseek-volc-<env>-weights when unset",
    )
    prefix: str = Field(
        "models", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*[A-Za-z0-9]$", description="key prefix the serving pods may read"
    )
    noncurrent_version_days: int = Field(30, ge=1, le=3650, description="days before old object versions expire")
    sse_algorithm: SseAlgorithm = Field("AES256", description="server-side encryption algorithm")
    kms_key_id: str | None = Field(
        None, description="KMS key when sse_algorithm is kms: trn:kms:<region>:<accountID>:keyrings/<keyring>/keys/<key>"
    )

    @model_validator(mode="after")
    def _kms(self):
        if self.sse_algorithm == "kms" and not self.kms_key_id:
            raise ValueError("kms_key_id: required when sse_algorithm is 'kms'")
        if self.kms_key_id is not None:
            problems = _C.problems("volcengine:tos/bucketEncryption:BucketEncryption",
                                   "rule.applyServerSideEncryptionByDefault.kmsMasterKeyId", self.kms_key_id)
            if problems:
                raise ValueError(f"kms_key_id: {problems[0]}; expected trn:kms:<region>:<accountID>:keyrings/"
                                 "<keyring>/keys/<key>")
        return self


class RegistrySettings(_Model):
    name: RegistryName | None = Field(None, description="CR Enterprise instance name; deepseek-<env> when unset")
    namespace: CrNamespace = Field("deepseek", description="CR namespace")
    repository: Name = Field("vllm-serving", description="repository of the serving image")
    mirror_namespace: CrNamespace = Field(
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
    pull_credentials: Literal["cr-credential-controller", "image-pull-secret"] = Field(
        "cr-credential-controller",
        description="how nodes authenticate pulls from the private repository: VKE's cr-credential-controller "
        "add-on, or a kubernetes.io/dockerconfigjson Secret named by image_pull_secret in the pods' imagePullSecrets",
    )
    image_pull_secret: Name | None = Field(
        None,
        description="pull Secret in the serving namespace (created outside the stack) when pull_credentials is "
        "image-pull-secret",
    )

    @model_validator(mode="after")
    def _secret(self):
        if self.pull_credentials == "image-pull-secret" and not self.image_pull_secret:
            raise ValueError("image_pull_secret: required when pull_credentials is 'image-pull-secret'")
        if self.pull_credentials != "image-pull-secret" and self.image_pull_secret:
            raise ValueError("image_pull_secret: only used when pull_credentials is 'image-pull-secret'; remove it "
                             "or switch pull_credentials")
        return self


class TracingSettings(_Model):
    """Spans of the in-cluster gateway and of vLLM, through an OpenTelemetry Collector, to
    VolcEngine (the stack's TLS trace instance, or APMPlus)."""

    enabled: bool = Field(True, description="trace requests: Envoy Gateway and vLLM export spans to the collector")
    sampling_percent: float = Field(
        1.0,
        ge=0,
        le=100,
        description="percent of requests the in-cluster gateway starts a trace for when the request arrives "
        "without a sampling decision; a request with a sampled W3C traceparent is always traced",
    )
    detailed: Literal["model", "worker", "all"] | None = Field(
        None,
        description="vLLM --collect-detailed-traces: per-request model forward/execute times on the span "
        "(blocking device syncs, so it costs throughput); off when unset",
    )
    backend: Literal["tls", "apmplus"] = Field(
        "tls", description="where the collector exports: tls (the stack's TLS trace instance) or apmplus"
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^https://[A-Za-z0-9.-]+(:\d+)?$",
        description="OTLP/HTTP base URL of the backend (the exporter appends /v1/traces); "
        "https://tls-<region>.volces.com:4318 or https://apmplus-<region>.volces.com:4318 when unset",
    )
    credentials_secret: Name = Field(
        "otel-exporter-credentials",
        description="Secret in the collector namespace with the exporter's credentials (tls: access_key_id and "
        "secret_access_key of a key that may write the trace topic; apmplus: app_key); created by operators",
    )
    collector_namespace: Name = Field("observability", description="namespace of the OpenTelemetry Collector")
    collector_replicas: int = Field(2, ge=1, le=10, description="OpenTelemetry Collector replicas")
    retention_days: int = Field(30, ge=1, le=3650, description="days the TLS trace instance keeps spans")


class RequestLogSettings(_Model):
    """vLLM's per-request log lines (`--enable-log-requests`)."""

    enabled: bool = Field(True, description="log each request's id and sampling parameters (no prompt text)")
    prompts: bool = Field(
        False,
        description="also log prompt and completion text (vLLM logs prompts only at DEBUG, so this raises the "
        "engine's log level too); user data in the logs, off by default and refused by policy in prod",
    )
    max_log_len: int = Field(512, ge=0, le=65536, description="characters or token ids of a prompt or output kept in a log line")


class LogsSettings(_Model):
    """A TLS log project with a topic per source, indexes, and container log collection."""

    enabled: bool = Field(
        True,
        description="TLS log project, topics (serving, gateway, platform, edge), indexes, container stdout "
        "collection, APIG access logs, and the cluster's control-plane logs into the same project",
    )
    retention_days: int = Field(30, ge=1, le=3650, description="days every topic (and control-plane log) keeps logs")
    shard_count: int = Field(2, ge=1, le=10, description="initial shards per topic (topics split automatically)")
    access_log: bool = Field(True, description="structured JSON access log of the in-cluster gateway on its stdout")
    collector_identifier: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="machine-group identifier the nodes' LogCollectors (the log-collector add-on) register with; "
        "<resource prefix>-nodes when unset",
    )
    request_log: RequestLogSettings = Field(default_factory=RequestLogSettings, description="vLLM request logging")


class ObservabilitySettings(_Model):
    vmp_enabled: bool = Field(
        True,
        description="create a managed Prometheus (VMP) workspace; the in-cluster Prometheus remote-writes to it "
        "(needs monitoring.enabled) and the APIG edge sends its metrics there",
    )
    vmp_instance_type: str = Field("vmp.standard.15d", description="VMP workspace instance type")
    tracing: TracingSettings = Field(default_factory=TracingSettings, description="request tracing")
    logs: LogsSettings = Field(default_factory=LogsSettings, description="logs in VolcEngine's log service (TLS)")

    @model_validator(mode="after")
    def _tracing(self):
        if self.tracing.detailed and not self.tracing.enabled:
            raise ValueError("tracing.detailed: needs tracing.enabled: true (vLLM refuses detailed traces without an endpoint)")
        return self


class AbHeader(_Model):
    name: str = Field("x-deepseek-variant", pattern=r"^[a-z0-9-]+$", description="request header that selects the B variant")
    value: str = Field("canary", min_length=1, description="header value routed to the canary")


# APIG's retry conditions (terraform-provider-volcengine volcengine/apig/apig_route at 8cff1813).
RetryOn = Literal["5xx", "reset", "connect-failure", "refused-stream", "cancelled", "deadline-exceeded",
                  "internal", "resource-exhausted", "unavailable"]
# APIG takes one or two subnets (terraform-provider-volcenginecc docs/resources/apig_gateway.md
# at 3a525a11: subnet_ids "Length limit: 1-2"); replicas 2-100; public bandwidth 0-500 Mbps.
APIG_MAX_SUBNETS = 2
HOSTNAME = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$"


class EdgeRetrySettings(_Model):
    enabled: bool = Field(True, description="retry failed requests at the edge")
    attempts: int = Field(2, ge=1, le=10, description="retries after the first try (APIG attempts)")
    per_try_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=3600,
        description="seconds one try may take; sent to APIG in milliseconds (x 1000); gateway.request_timeout_seconds "
        "when unset, so a long generation is never cut off by a retry timer",
    )
    retry_on: list[RetryOn] = Field(
        default_factory=lambda: ["connect-failure", "refused-stream", "reset"],
        min_length=1,
        description="conditions that trigger a retry (APIG retry_on); '5xx' would also retry after an upstream "
        "error that may come mid-generation",
    )
    http_codes: list[int] = Field(
        default_factory=lambda: [503],
        description="response status codes that trigger a retry, e.g. 503 from a draining pod (sent as strings)",
    )

    @field_validator("http_codes")
    @classmethod
    def _codes(cls, v: list[int]) -> list[int]:
        bad = [c for c in v if not 500 <= c <= 599]
        if bad:
            raise ValueError(f"expected 5xx status codes (500-599), got {bad}")
        return v


class EdgeTlsSettings(_Model):
    domain: str = Field(pattern=HOSTNAME, max_length=253, description="public API host name the edge serves (lower case)")
    certificate_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{2,127}$",
        description="id of the domain's certificate in VolcEngine's certificate service (upload it there or have "
        "it issued there)",
    )
    plain_http: Literal["closed", "redirect"] = Field(
        "closed",
        description="plain HTTP on the public service: closed (no HTTP listener), or redirect (HTTP answered with a "
        "redirect to HTTPS; a token sent over HTTP has already crossed the network)",
    )


class GatewaySettings(_Model):
    edge_enabled: bool = Field(True, description="create the APIG gateway in front of the cluster")
    instance_spec: ApigInstanceSpec = Field("1c2g", description="APIG instance specification")
    replicas: int = Field(2, ge=2, le=100, description="APIG gateway replicas (APIG accepts 2-100)")
    public_bandwidth_mbps: int = Field(
        50, ge=1, le=500, description="public bandwidth of the edge listener in Mbps (APIG accepts up to 500)"
    )
    zones: list[str] | None = Field(
        None,
        min_length=1,
        max_length=APIG_MAX_SUBNETS,
        description="stack zones whose node subnets the APIG gateway uses (APIG accepts 1-2 subnets); the first "
        "two stack zones when unset",
    )
    canary_weight: int = Field(0, ge=0, le=100, description="percent of traffic sent to the canary track")
    ab_header: AbHeader = Field(default_factory=AbHeader, description="header-based A/B routing to the canary")
    request_timeout_seconds: int = Field(600, ge=10, le=3600, description="edge timeout in seconds (long generations)")
    retry: EdgeRetrySettings = Field(default_factory=EdgeRetrySettings, description="edge retries (units in the names)")
    tls: EdgeTlsSettings | None = Field(
        None, description="HTTPS on the public service: domain and certificate; required when edge_enabled"
    )

    @model_validator(mode="after")
    def _edge(self):
        if self.edge_enabled and self.tls is None:
            raise ValueError("tls: required when edge_enabled: the public edge serves HTTPS only (clients send bearer "
                             "tokens); set tls.domain and tls.certificate_id, or edge_enabled: false")
        per_try = self.retry.per_try_timeout_seconds
        if per_try is not None and per_try > self.request_timeout_seconds:
            raise ValueError(f"retry.per_try_timeout_seconds: {per_try} exceeds request_timeout_seconds "
                             f"({self.request_timeout_seconds}); a try cannot outlive the request")
        return self



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
    parallelism: Literal["auto", "tp_pp", "tp_ep", "dp_ep"] = Field(
        "auto",
        description="layout of a replica: tp_pp (tensor parallel in a node, pipeline stages across nodes), tp_ep "
        "(attention tensor parallel, experts split across all GPUs), dp_ep (attention data parallel, one engine "
        "per GPU, experts split across all GPUs); auto: the fewest GPUs, preferring dp_ep > tp_ep > tp_pp (EP "
        "across nodes only on RDMA pools); see docs/planner.md",
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
    extra_args: list[str] = Field(default_factory=list, description="extra vLLM arguments passed through verbatim")
    kernels: bool = Field(True, description="install the deepseek-volc Triton kernels plugin in vLLM")
    awq_kernel: Literal["vllm", "dsvolc"] = Field(
        "vllm",
        description="linear layers of an AWQ checkpoint: vLLM's own kernels, or the plugin's Triton W4A16 "
        "(--quantization dsvolc_awq; needs quantization awq and kernels on)",
    )

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


class TritonSettings(_Model):
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
    drain_seconds: int = Field(
        20, ge=5, le=300,
        description="preStop delay: the pod has left the Services' endpoints and the gateway stops routing to it "
        "before vLLM is told to stop",
    )
    termination_grace_seconds: int | None = Field(
        None, ge=30, le=7200,
        description="time a stopping pod gets: preStop delay + vLLM's drain of in-flight requests; at least "
        "drain_seconds + gateway.request_timeout_seconds; that sum plus 30 s when unset",
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
    gateway_replicas: int = Field(2, ge=1, le=20, description="Envoy proxy replicas of the in-cluster gateway")
    auth: AuthSettings = Field(
        description="JWT authentication: the identity provider (issuer, audiences, JWKS) this stack trusts"
    )
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings, description="per-consumer rate limits")


# --------------------------------------------------------------------------- operations


class AutoscalingSettings(_Model):
    enabled: bool = Field(True, description="scale serving replicas with KEDA on queue depth and load")
    min_replicas: int | None = Field(None, ge=1, le=100, description="lower bound; serving.replicas when unset")
    max_replicas: int = Field(4, ge=1, le=100, description="upper bound (each replica needs its GPUs)")
    waiting_per_replica: float = Field(
        4.0, gt=0, description="target vllm:num_requests_waiting per replica (the primary signal)"
    )
    requests_per_second_per_replica: float = Field(2.0, gt=0, description="target request rate per replica")
    kv_cache_usage: float = Field(
        0.75, gt=0, le=1,
        description="saturation signal: target mean vllm:kv_cache_usage_perc (share of KV cache blocks in use) "
        "over the replicas; past it, new requests queue and running ones get preempted",
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
    max_surge: int = Field(
        1, ge=0, le=8,
        description="replicas (whole node groups when multi-node) a rolling update may add above the current "
        "count; 0 replaces one replica at a time (one replica less while it loads). An Argo canary always "
        "needs one",
    )
    partition: int = Field(
        0, ge=0, le=100,
        description="multi-node only: groups 0..partition-1 keep the current template during an update (the "
        "LeaderWorkerSet partition); set it to the replica count minus one to update one group first",
    )

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
    triton_queue_seconds: float = Field(
        1.0, gt=0, description="alert when requests wait longer than this in Triton's queue (server: triton)"
    )
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
    dcgm_profiling_metrics: bool = Field(
        False,
        description="have dcgm-exporter collect DCGM's profiling (DCP) fields, DCGM_FI_PROF_*; they need the "
        "SYS_ADMIN capability in the exporter (docs/operations.md), which is added only when this is on",
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
    watchdog: Name | None = Field(
        None, description="receiver of kube-prometheus-stack's always-firing Watchdog: a dead man's switch service "
        "that alerts a person when it stops arriving (none: the Watchdog goes nowhere)",
    )
    watchdog_repeat_minutes: int = Field(5, ge=1, le=60, description="send the Watchdog this often")

    @model_validator(mode="after")
    def _known(self):
        if self.watchdog is not None and self.watchdog not in self.receivers:
            known = ", ".join(self.receivers) or "none defined"
            raise ValueError(f"watchdog: {self.watchdog!r} is not a receiver; expected one of {known}")
        for sev in ("critical", "warning"):
            for i, name in enumerate(getattr(self, sev)):
                if name not in self.receivers:
                    known = ", ".join(self.receivers) or "none defined"
                    raise ValueError(f"{sev}[{i}]: {name!r} is not a receiver; expected one of {known}")
            if len(set(getattr(self, sev))) != len(getattr(self, sev)):
                raise ValueError(f"{sev}: expected distinct receivers")
        return self


class GpuHealthSettings(_Model):
    enabled: bool = Field(
        True, description="turn DCGM XID/ECC and device-plugin signals into a NoSchedule taint and drain bad GPU "
        "nodes (runtime/gpu_health.py; needs monitoring)",
    )
    interval_seconds: int = Field(60, ge=15, le=3600, description="how often the signals are read")
    max_unhealthy_fraction: float = Field(
        0.34, gt=0, le=1, description="most GPU nodes quarantined at once (a broken exporter must not drain the fleet)"
    )
    evict: bool = Field(True, description="evict serving pods from a node to drain (PDB honoured); off: taint only")


class PrewarmSettings(_Model):
    enabled: bool = Field(
        True, description="on every node of the serving pool, pull the serving image and (weights_mode sync) fill "
        "the node's model cache as soon as the node joins, before a serving pod needs them",
    )


class WarmCapacitySettings(_Model):
    replicas: int = Field(
        0, ge=0, le=20,
        description="placeholder pods, each holding the GPUs of one serving pod at the lowest priority; a serving "
        "pod preempts one at once instead of waiting for a new node (0: off)",
    )


class ResilienceSettings(_Model):
    gpu_health: GpuHealthSettings = Field(default_factory=GpuHealthSettings, description="GPU node quarantine")
    prewarm: PrewarmSettings = Field(default_factory=PrewarmSettings, description="image and model cache pre-warm")
    warm_capacity: WarmCapacitySettings = Field(
        default_factory=WarmCapacitySettings, description="idle GPU capacity held for the next replica"
    )


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
    observability: ObservabilitySettings = Field(
        default_factory=ObservabilitySettings, description="managed Prometheus, request traces and logs"
    )
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="APIG edge")
    serving: ServingSettings = Field(description="the vLLM serving workload")
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings, description="replica autoscaling")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="canary rollout")
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings, description="metrics and alerts")
    resilience: ResilienceSettings = Field(
        default_factory=ResilienceSettings, description="GPU node health, pre-warm and warm capacity"
    )
    alerting: AlertingSettings = Field(default_factory=AlertingSettings, description="alert receivers and routing")
    accept_replacements: list[str] = Field(
        default_factory=list,
        description="names of stateful resources this change may replace or delete (cluster, bucket, registry, "
        "APIG gateway, HPC cluster, role, VMP workspace); `dsvolc preview STACK --against REF` refuses any other",
    )

    _derived: dict = PrivateAttr(default_factory=dict)

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if v not in REGION_ZONES:
            raise ValueError(f"expected one of {', '.join(REGION_ZONES)}, got {v!r}{did_you_mean(v, REGION_ZONES)}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self):
        known = REGION_ZONES[self.region]
        for i, zone in enumerate(self.zones):
            if zone not in known:
                raise ValueError(f"zones[{i}]: {zone!r} is not a zone of {self.region}; expected one of "
                                 f"{', '.join(known)}{did_you_mean(zone, known)}")
        if len(set(self.zones)) != len(self.zones):
            raise ValueError("zones: expected distinct zones")
        self._check_network()
        self._check_pools()
        a = self.autoscaling
        if a.enabled and a.min_replicas is None and self.serving.replicas > a.max_replicas:
            raise ValueError(
                f"autoscaling.max_replicas: {a.max_replicas} is below serving.replicas ({self.serving.replicas})"
            )
        for i, zone in enumerate(self.gateway.zones or []):
            if zone not in self.zones:
                raise ValueError(f"gateway.zones[{i}]: {zone!r} is not a stack zone; expected one of "
                                 f"{', '.join(self.zones)}")
        if self.gateway.zones and len(set(self.gateway.zones)) != len(self.gateway.zones):
            raise ValueError("gateway.zones: expected distinct zones")
        if self.observability.vmp_enabled and not self.monitoring.enabled:
            raise ValueError("observability.vmp_enabled: metrics reach VMP by the in-cluster Prometheus's remote "
                             "write; set monitoring.enabled: true, or vmp_enabled: false")
        if self.serving.gpu_pool not in self.cluster.gpu_pools:
            raise ValueError(
                f"serving.gpu_pool: {self.serving.gpu_pool!r} is not a GPU pool; expected one of "
                f"{', '.join(self.cluster.gpu_pools)}{did_you_mean(self.serving.gpu_pool, self.cluster.gpu_pools)}"
            )
        self._plan_serving()
        self._check_lifecycle()
        self._check_pool_capacity()
        self._check_slo()
        return self

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def termination_grace_seconds(self) -> int:
        """Time a stopping serving pod gets: the preStop delay, then vLLM drains in-flight
        requests for as long as the edge lets one run (`--shutdown-timeout`)."""
        sv = self.serving
        if sv.termination_grace_seconds is not None:
            return sv.termination_grace_seconds
        return sv.drain_seconds + self.gateway.request_timeout_seconds + GRACE_MARGIN_SECONDS

    @property
    def uses_argo_rollouts(self) -> bool:
        """Argo Rollouts runs the canary: enabled, one node per replica (it cannot manage a
        LeaderWorkerSet) and the in-cluster HTTPRoute it moves traffic on."""
        return self.rollout.enabled and self.serving.in_cluster_gateway and self.serving_plan.nodes == 1

    def _check_lifecycle(self) -> None:
        sv, edge = self.serving, self.gateway.request_timeout_seconds
        need = sv.drain_seconds + edge
        if sv.termination_grace_seconds is not None and sv.termination_grace_seconds < need:
            raise ValueError(
                f"serving.termination_grace_seconds: {sv.termination_grace_seconds} s is shorter than "
                f"serving.drain_seconds ({sv.drain_seconds}) + gateway.request_timeout_seconds ({edge}) = {need} s: "
                "the longest request the edge allows would be cut off on every scale-down and rollout; "
                f"expected at least {need}, or leave it unset"
            )
        if self.uses_argo_rollouts and self.gateway.canary_weight:
            raise ValueError(
                f"gateway.canary_weight: {self.gateway.canary_weight} while Argo Rollouts owns the canary split "
                "(rollout.enabled, in-cluster gateway): Argo sets the weights during a rollout and back to 0 "
                "after it; expected 0 (traffic steps are rollout.steps)"
            )
        if self.rollout.partition and self.serving_plan.nodes == 1:
            raise ValueError(
                "rollout.partition: applies to multi-node replicas (a LeaderWorkerSet) only; single-node "
                "replicas roll out as an Argo canary or a Deployment update. Expected 0"
            )

    # -- pool capacity ------------------------------------------------------------------

    def replicas_per_pool(self, pool: str | None = None) -> int:
        """Serving replicas the pool holds at max_nodes: whole nodes per replica when a
        replica spans nodes, else replicas side by side on each node's GPUs."""
        name = pool or self.serving.gpu_pool
        p, gpool = self.serving_plan, self.cluster.gpu_pools[name]
        if p.nodes > 1:
            return gpool.max_nodes // p.nodes
        _, per_node = gpool.hardware()
        mig = self.pool_mig(name)
        if mig is not None:  # one replica per MIG slice (capacity/mig.py)
            return gpool.max_nodes * per_node * mig.per_gpu
        return gpool.max_nodes * (per_node // p.total_gpus)

    def rollout_surge(self) -> int:
        """Replicas a rollout adds at its peak: Argo's canary scales the stable down as it
        scales up (dynamicStableScale), so one; else rollout.max_surge."""
        return max(1, self.rollout.max_surge) if self.uses_argo_rollouts else self.rollout.max_surge

    def _check_pool_capacity(self) -> None:
        a, sv = self.autoscaling, self.serving
        upper, field = (a.max_replicas, "autoscaling.max_replicas") if a.enabled else (sv.replicas, "serving.replicas")
        surge = self.rollout_surge()
        room = self.replicas_per_pool()
        if upper + surge > room:
            p, pool = self.serving_plan, self.cluster.gpu_pools[sv.gpu_pool]
            mig = self.pool_mig(sv.gpu_pool)
            unit = (f"{p.nodes} nodes each" if p.nodes > 1 else
                    f"one {mig.name} MIG slice each" if mig is not None else f"{p.total_gpus} GPU(s) each")
            fixes = [f"lower {field} to {max(room - surge, 0)}", f"raise cluster.gpu_pools.{sv.gpu_pool}.max_nodes"]
            if surge and not self.uses_argo_rollouts:
                fixes.append("set rollout.max_surge: 0 (replace one replica at a time)")
            raise ValueError(
                f"{field}: {upper} replica(s) ({unit}) + a rollout surge of {surge} need room for {upper + surge} "
                f"replicas, but pool {sv.gpu_pool} holds {room} at max_nodes {pool.max_nodes}: a rollout while "
                f"scaled out would stall; {', or '.join(fixes)}"
            )

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
        gpu, tp, pp = get_gpu(gpu_name), e.tensor_parallel_size, e.pipeline_parallel_size
        mig = self.pool_mig(sv.gpu_pool)
        if mig is not None:
            # A CUDA process sees one MIG device: a replica is one slice, unsplit.
            for name, value in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp)):
                if value not in (None, 1):
                    raise ValueError(f"serving.engine.{name}: pool {sv.gpu_pool} serves from MIG {mig.name} slices "
                                     f"and a replica runs on one slice; expected 1 or unset, got {value}")
            gpu, tp, pp = slice_gpu(gpu, mig), 1, 1
        try:
            p = plan(
                model,
                gpu,
                gpus_per_node=1 if mig is not None else per_node,
                context=e.max_model_len,
                quantization=e.quantization,
                kv_cache_dtype=e.kv_cache_dtype,
                tensor_parallel_size=tp,
                pipeline_parallel_size=pp,
                max_num_seqs=e.max_num_seqs,
                gpu_memory_utilization=e.gpu_memory_utilization,
                max_num_batched_tokens=e.max_num_batched_tokens,
                parallelism=e.parallelism,
                data_parallel_size=e.data_parallel_size,
                speculative_tokens=e.speculative_tokens,
                rdma=self.pool_rdma(sv.gpu_pool),
            )
        except PlanError as exc:
            raise ValueError(f"serving.engine: {exc}") from None
        if not p.fits:
            where = (f"a MIG {mig.name} slice of {gpu_name} ({mig.memory_mib / 1024:.1f} GiB)" if mig is not None
                     else f"{gpu_name} x {per_node} per node")
            raise ValueError(
                f"serving.engine: {model.name} does not fit on {where} (pool {sv.gpu_pool}): " + "; ".join(p.reasons)
            )
        if p.nodes > 1 and not sv.multi_node:
            raise ValueError(self._multi_node_refusal(model, gpu_name, per_node, p))
        pool = self.cluster.gpu_pools[sv.gpu_pool]
        low = (self.autoscaling.min_replicas or sv.replicas) if self.autoscaling.enabled else sv.replicas
        if mig is not None:
            slices = per_node * mig.per_gpu
            needed = -(-low // slices)
            if needed > pool.max_nodes:
                raise ValueError(
                    f"cluster.gpu_pools.{sv.gpu_pool}.max_nodes: {low} replica(s) on {slices} {mig.name} slices per "
                    f"node need {needed} nodes, the pool allows {pool.max_nodes}"
                )
        else:
            # each warm placeholder holds one serving pod's GPUs (a pipeline stage's when multi-node)
            warm = self.resilience.warm_capacity.replicas
            warm_nodes = -(-warm * (p.total_gpus // p.nodes) // per_node)
            needed = low * p.nodes + warm_nodes
            if needed > pool.max_nodes and warm and low * p.nodes <= pool.max_nodes:
                raise ValueError(
                    f"resilience.warm_capacity.replicas: {low} replica(s) x {p.nodes} node(s) plus {warm} "
                    f"placeholder(s) on {warm_nodes} node(s) need {needed} nodes, pool {sv.gpu_pool} allows "
                    f"{pool.max_nodes}"
                )
            if needed > pool.max_nodes:
                raise ValueError(
                    f"cluster.gpu_pools.{sv.gpu_pool}.max_nodes: {low} replica(s) x {p.nodes} node(s) each need "
                    f"{needed} nodes, the pool allows {pool.max_nodes}"
                )
        if sv.server == "triton":
            self._check_triton(p)
        self._derived["plan"] = p
        self._derived["model"] = model
        self._check_node_shapes()

    def _check_triton(self, p) -> None:
        sv = self.serving
        if p.nodes > 1:
            raise ValueError(f"serving.server: triton serves one node per replica here; {sv.model} needs "
                             f"{p.nodes} nodes per replica: expected vllm (a LeaderWorkerSet) for it")
        if sv.engine.extra_args:
            raise ValueError("serving.engine.extra_args: Triton's model.json takes engine fields, not command-line "
                             "flags; expected none with server: triton")
        if sv.triton.default_max_tokens > p.max_model_len:
            raise ValueError(f"serving.triton.default_max_tokens: {sv.triton.default_max_tokens} exceeds the "
                             f"engine's max_model_len {p.max_model_len}; expected at most that")

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
                f"PP{p.pipeline_parallel_size}" + (f", {p.describe_layout()}" if p.parallelism != "tp_pp" else "")
                + "); set serving.multi_node: true to run each replica across "
                f"nodes (a LeaderWorkerSet, pipeline parallel over the network), or serve it from a larger "
                f"pool: {where}")

    def pool_rdma(self, pool: str) -> bool:
        """Whether the pool's nodes reach each other over RDMA."""
        return instance_type_rdma(self.cluster.gpu_pools[pool].instance_type)

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

    @property
    def nat_mode(self) -> str:
        """per_zone or shared: the setting, else shared for the dev class and per_zone otherwise."""
        if self.network.nat is not None:
            return self.network.nat
        return "shared" if self.environment_class == "dev" else "per_zone"

    def nat_zones(self) -> list[str]:
        """The zones that hold a NAT gateway: every stack zone, or the first one when shared."""
        return list(self.zones) if self.nat_mode == "per_zone" else self.zones[:1]

    def _check_network(self) -> None:
        net = self.network
        vpc = net.vpc_cidr
        _refuse_cidr("network.vpc_cidr", vpc, "volcengine:vpc/vpc:Vpc", "cidrBlock", "a VolcEngine VPC")
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
            _refuse_cidr(path, cidr, "volcengine:vpc/subnet:Subnet", "cidrBlock", "a VolcEngine subnet")
            if not cidr.subnet_of(vpc):
                raise ValueError(f"{path}: {cidr} is outside network.vpc_cidr {vpc}")
        for i, (path_a, a) in enumerate(blocks):
            for path_b, b in blocks[i + 1 :]:
                if a.overlaps(b):
                    raise ValueError(f"{path_a}: {a} overlaps {path_b} {b}")
        _refuse_cidr("network.service_cidr", net.service_cidr, VKE_CLUSTER, "servicesConfig.serviceCidrsv4s",
                     "a VKE service CIDR")
        _refuse_cidr("network.flannel_pod_cidr", net.flannel_pod_cidr, VKE_CLUSTER,
                     "podsConfig.flannelConfig.podCidrs", "a VKE Flannel pod CIDR")
        if net.service_cidr.overlaps(vpc):
            raise ValueError(f"network.service_cidr: {net.service_cidr} overlaps network.vpc_cidr {vpc}")
        if self.cluster.pod_network_mode == "Flannel":
            if net.flannel_pod_cidr.overlaps(vpc):
                raise ValueError(f"network.flannel_pod_cidr: {net.flannel_pod_cidr} overlaps network.vpc_cidr {vpc}")
            if net.flannel_pod_cidr.overlaps(net.service_cidr):
                raise ValueError(
                    f"network.flannel_pod_cidr: {net.flannel_pod_cidr} overlaps network.service_cidr {net.service_cidr}"
                )
        self._check_nat()

    def _check_nat(self) -> None:
        if self.nat_mode == "shared" and self.environment_class != "dev":
            raise ValueError(
                f"network.nat: 'shared' puts one NAT gateway in {self.zones[0]} for every zone: losing that zone "
                f"cuts egress (TOS, STS, the registry) for the whole cluster. It is for dev-class stacks; expected "
                f"per_zone for a {self.environment_class} stack (or leave it unset)")
        if self.nat_mode == "per_zone" and len(self.zones) > NAT_GATEWAYS_PER_VPC:
            raise ValueError(
                f"network.nat: per_zone needs a NAT gateway in each of {len(self.zones)} zones, but a VPC holds at most "
                f"{NAT_GATEWAYS_PER_VPC} Internet NAT gateways ({NAT_FAQ}); expected at most {NAT_GATEWAYS_PER_VPC} "
                "zones")

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
                    rec = get_instance_type(pool.instance_type)
                    why = ("is catalogued but its GPU count is unconfirmed" if rec is not None else
                           f"is not in the GPU instance catalog{suggest_instance_type(pool.instance_type, aside=True)}")
                    raise ValueError(f"{path}.instance_type: {pool.instance_type!r} {why}; set gpu and "
                                     "gpus_per_node for it")
            elif pool.gpu not in GPUS:
                raise ValueError(f"{path}.gpu: {pool.gpu!r} is not a known GPU; expected one of {', '.join(GPUS)}"
                                 f"{did_you_mean(pool.gpu, GPUS)}")
            if self.pool_hardware(name).hpc:
                # HPC instance types live in an ecs.HpcCluster, which sits in one zone
                # (provider contract: ecs/hpcCluster zoneId, nodePool nodeConfig.hpcClusterIds).
                if pool.zones is None or len(pool.zones) != 1:
                    got = ", ".join(pool.zones) if pool.zones else "every stack zone"
                    raise ValueError(
                        f"{path}.zones: {pool.instance_type} is an HPC instance type, which lives in a single-zone "
                        f"HPC cluster; expected exactly one of {', '.join(self.zones)}, got {got}"
                    )
            elif pool.hpc_cluster_id is not None:
                raise ValueError(f"{path}.hpc_cluster_id: {pool.instance_type} is not an HPC instance type "
                                 "(ecs.hpc* / ecs.ebmhpc*); remove hpc_cluster_id")
            refuse_unsold(path, pool.instance_type, self.region, self.pool_zones(name))
            if pool.mig is not None:
                try:
                    mig_profile(pool.hardware()[0], pool.mig.profile)
                except MigError as exc:
                    raise ValueError(f"{path}.mig.profile: {exc}") from None

    def pool_mig(self, pool: str) -> MigProfile | None:
        """The MIG profile a pool's GPUs are cut into, or None for whole GPUs."""
        p = self.cluster.gpu_pools[pool]
        return mig_profile(p.hardware()[0], p.mig.profile) if p.mig is not None else None

    def pool_zones(self, pool: str) -> list[str]:
        return list(self.cluster.gpu_pools[pool].zones or self.zones)

    def pool_hardware(self, pool: str) -> PoolHardware:
        """The node shape of a GPU pool: GPU model and count, NUMA layout, RDMA, HPC."""
        p = self.cluster.gpu_pools[pool]
        gpu, per_node = p.hardware()
        return pool_hardware(p.instance_type, gpu, per_node, numa_nodes=p.numa_nodes, rdma_nics=p.rdma_nics)

    def pool_gpus_per_pod(self, pool: str) -> int:
        """GPUs one pod takes on this pool: on the serving pool the replica's GPUs spread over
        its nodes (a TP group, one pipeline stage, or the node's share of the data-parallel
        engines), a whole node elsewhere (the most a pod can take)."""
        if pool == self.serving.gpu_pool:
            return self.serving_plan.total_gpus // self.serving_plan.nodes
        return self.pool_hardware(pool).gpus_per_node

    def pool_topology_policy(self, pool: str) -> str:
        """The kubelet topology manager policy of a pool (stacks.nodepools.topology_policy)."""
        chosen = self.cluster.gpu_pools[pool].topology_manager_policy
        return chosen or topology_policy(self.pool_gpus_per_pod(pool), self.pool_hardware(pool))

    def pool_multi_node(self, pool: str) -> bool:
        """Whether one serving replica spans several nodes of this pool."""
        return pool == self.serving.gpu_pool and self.serving_plan.nodes > 1

    @property
    def serving_rdma_per_pod(self) -> int:
        """RDMA NICs each serving pod attaches: its share of the node's NICs when a replica
        spans nodes of an RDMA pool, else 0 (single-node serving talks over NVLink)."""
        pool = self.serving.gpu_pool
        if not self.pool_multi_node(pool):
            return 0
        return rdma_per_pod(self.pool_gpus_per_pod(pool), self.pool_hardware(pool))

    def vke_addons(self) -> list[Addon]:
        """The add-ons to install, versions resolved (cluster.addon_versions over stacks/addons.py);
        rdma-device-plugin only where serving pods use RDMA, VKE's nvidia-device-plugin not where a
        pool is cut into MIG slices, cr-credential-controller where it supplies the pull credential,
        log-collector where container logs go to TLS."""
        names = ["cluster-autoscaler", "nvidia-device-plugin", "metrics-server"]
        if any(p.mig is not None for p in self.cluster.gpu_pools.values()):
            # a MIG pool runs NVIDIA's device plugin chart instead (workloads/platform/controllers.py), whose
            # per-node config gives MIG nodes the mixed strategy; two plugins on one node would
            # both advertise its GPUs
            names.remove("nvidia-device-plugin")
        if self.serving_rdma_per_pod:
            names.append("rdma-device-plugin")
        if self.registry.pull_credentials == "cr-credential-controller":
            names.append("cr-credential-controller")
        if self.observability.logs.enabled:
            names.append("log-collector")
        pinned = self.cluster.addon_versions
        return [replace(ADDONS[n], version=pinned.get(n, ADDONS[n].version)) for n in names]

    def _check_node_shapes(self) -> None:
        """After planning: refuse what kubelet or VKE would refuse on the pools."""
        for name, pool in self.cluster.gpu_pools.items():
            path = f"cluster.gpu_pools.{name}"
            hw = self.pool_hardware(name)
            if pool.topology_manager_policy == "single-numa-node":
                why = single_numa_refusal(self.pool_gpus_per_pod(name), hw)
                if why:
                    raise ValueError(f"{path}.topology_manager_policy: 'single-numa-node' refused: {why}; expected "
                                     "restricted, best-effort or none, or leave it unset to have it chosen")
            if self.pool_multi_node(name) and hw.rdma and hw.rdma_nics is None:
                raise ValueError(f"{path}.rdma_nics: multi-node serving on {pool.instance_type} uses its RDMA NICs, "
                                 "whose count the catalog does not state; expected the count (e.g. 4 or 8)")
    def edge_zones(self) -> list[str]:
        """Zones whose node subnets the APIG gateway uses: as set, else the first two stack zones."""
        return list(self.gateway.zones or self.zones[:APIG_MAX_SUBNETS])

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
    def log_project_name(self) -> str:
        """The stack's TLS log project (infra/logging.py)."""
        return f"{self.resource_prefix}-logs"

    @property
    def trace_instance_name(self) -> str:
        """The stack's TLS trace instance, in the log project."""
        return f"{self.resource_prefix}-traces"

    @property
    def trace_export_endpoint(self) -> str:
        """OTLP/HTTP base URL the collector exports spans to."""
        t = self.observability.tracing
        if t.endpoint:
            return t.endpoint
        return tls_otlp_endpoint(self.region) if t.backend == "tls" else apmplus_otlp_endpoint(self.region)

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

