"""The typed, frozen shape of a `StackPlan`: every decision derived from a stack's settings.

Infra and workloads read these; nothing derives them again. Mappings are read-only views
(`types.MappingProxyType`): a component that needs a dict for a provider input copies it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from capacity.catalog import GPUSpec, ModelSpec
from capacity.kv_offload import KvOffload
from capacity.mig import MigProfile
from capacity.planner import Plan
from stacks.addons import Addon
from stacks.nodepools import PoolHardware
from stacks.settings import StackSettings


@dataclass(frozen=True)
class Names:
    """Cloud and component names, all from the stack's name unless the settings name them."""

    prefix: str  # deepseek-<stack>: every resource and component name starts with it
    cluster: str
    bucket: str
    registry: str
    registry_host: str  # <registry>-<region>.cr.volces.com
    image_repository: str  # the stack's CR repository of the serving image
    log_project: str
    trace_instance: str
    node_group: str  # the TLS machine group of the cluster's nodes
    log_collector: str  # the identifier the nodes' LogCollectors register with


@dataclass(frozen=True)
class NetworkPlan:
    node_subnets: Mapping[str, ipaddress.IPv4Network]  # zone -> CIDR, in stack zone order
    pod_subnets: Mapping[str, ipaddress.IPv4Network]  # VPC-CNI pod subnet per zone; empty with Flannel
    vpc_cni: bool
    nat_mode: str  # per_zone or shared
    nat_zones: tuple[str, ...]  # the zones that hold a NAT gateway


@dataclass(frozen=True)
class PoolPlan:
    """One GPU node pool, resolved: its node shape and what its pods get."""

    name: str
    hardware: PoolHardware  # GPU model and count, NUMA layout, RDMA, HPC
    zones: tuple[str, ...]
    mig: MigProfile | None  # the profile every GPU is cut into, None for whole GPUs
    gpus_per_pod: int  # the serving replica's share of a node on the serving pool, a node elsewhere
    topology_policy: str  # kubelet topology manager policy
    multi_node: bool  # one serving replica spans several nodes of this pool
    rdma: bool  # nodes reach each other over RDMA (HPC instance types)

    @property
    def gpu(self) -> str:
        return self.hardware.gpu

    @property
    def gpus_per_node(self) -> int:
        return self.hardware.gpus_per_node


@dataclass(frozen=True)
class Upstream:
    """Where the APIG edge forwards: a Service and the share of traffic it gets."""

    role: str
    namespace: str
    service: str
    port: int
    weight: int


@dataclass(frozen=True)
class EdgePlan:
    zones: tuple[str, ...]  # stack zones whose node subnets the APIG gateway uses
    upstreams: tuple[Upstream, ...]


class _EngineNodes:
    """Nodes of one serving group, from its engine plan (``engine: Plan``)."""

    @property
    def nodes(self) -> int:
        return self.engine.nodes

    @property
    def multi_node(self) -> bool:
        return self.engine.nodes > 1


@dataclass(frozen=True)
class ServingPlan(_EngineNodes):
    """The serving workload: the engine plan from the capacity planner and what follows."""

    engine: Plan  # capacity.planner.Plan: layout, sizes, KV cache
    model: ModelSpec
    gpu: GPUSpec  # the serving pool's GPU (whole; a MIG slice is `pool.mig`)
    pool: str
    min_replicas: int
    max_replicas: int
    replicas_per_pool: int  # replicas the pool holds at max_nodes
    termination_grace_seconds: int  # preStop delay + vLLM's drain + margin
    rdma_per_pod: int  # RDMA NICs each serving pod attaches (multi-node on RDMA pools), else 0
    kv_offload: KvOffload | None = None  # CPU offload buffers of each serving pod (capacity.kv_offload)
    api_servers: int = 1  # API server processes of a serving pod (capacity.wide_ep)


@dataclass(frozen=True)
class RolloutPlan:
    argo: bool  # Argo Rollouts runs a canary (single-node replicas behind the in-cluster gateway)
    surge: int  # replicas a rollout adds at its peak


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


@dataclass(frozen=True)
class PhasePlan(_EngineNodes):
    """One side: its engine plan, pool and replica bounds."""

    role: str  # prefill | decode
    kv_role: str  # kv_producer | kv_consumer (NixlConnector deprecates kv_both)
    engine: Plan
    pool: str
    min_replicas: int
    max_replicas: int
    modelled_replicas: int  # what the performance model asks at the design load
    gpus_per_pod: int
    rdma_per_pod: int  # RDMA NICs each pod attaches (the KV transfer's, and the group's when multi-node)


@dataclass(frozen=True)
class DisaggregationPlan:
    prefill: PhasePlan
    decode: PhasePlan
    side_channel_port: int
    requests_per_second: float
    model: Mapping[str, object]  # the performance model's figures (capacity.sizing.disaggregated)

    @property
    def ratio(self) -> str:
        return f"{self.prefill.modelled_replicas}:{self.decode.modelled_replicas}"

    def phases(self) -> tuple[PhasePlan, PhasePlan]:
        return self.prefill, self.decode


@dataclass(frozen=True)
class RouterPlan:
    enabled: bool
    mode: str  # cache_aware (aggregated), pd (disaggregated), dp_aware (data-parallel engines)
    data_parallel_size: int  # engines behind one API server (DP-aware routing), 1 otherwise


@dataclass(frozen=True)
class StackPlan:
    """What the user wrote (`settings`) and every decision derived from it, once."""

    settings: StackSettings
    names: Names
    network: NetworkPlan
    pools: Mapping[str, PoolPlan]
    addons: tuple[Addon, ...]  # VKE add-ons, versions resolved
    edge: EdgePlan
    serving: ServingPlan
    rollout: RolloutPlan
    slo: Slo
    tags: Mapping[str, str]  # on every taggable resource
    policy_config: str  # the policy pack config the stack is judged by, relative to the repository root
    trace_endpoint: str  # OTLP/HTTP base URL the collector exports spans to
    # prefill/decode sides (stacks/plan/disaggregation.py), None when aggregated
    disaggregation: DisaggregationPlan | None = None
    router: RouterPlan | None = None  # the routing tier; None: no router

    @property
    def serving_pool(self) -> PoolPlan:
        return self.pools[self.serving.pool]
