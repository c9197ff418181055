"""Everything a workload renderer needs, resolved once from the settings and the plan.

Renderers are pure functions `(ServingContext) -> list[dict]` (Kubernetes objects as
plain dicts). They never read the settings file, call the planner or touch Pulumi, so
they are unit-tested directly; `workloads.serving.Serving` wraps their output.
"""

from __future__ import annotations

from dataclasses import dataclass

from stacks.constants import GPU_RESOURCE, MANAGED_BY, PART_OF
from stacks.settings import StackSettings
from capacity.catalog import GPUSpec, ModelSpec, get_gpu
from capacity.planner import Plan



@dataclass(frozen=True)
class ServingContext:
    settings: StackSettings
    plan: Plan
    model: ModelSpec
    gpu: GPUSpec
    gpus_per_node: int
    image: str
    weights_bucket: str
    weights_prefix: str

    # -- names ----------------------------------------------------------------------

    @property
    def release(self) -> str:
        return self.settings.serving.name

    @property
    def namespace(self) -> str:
        return self.settings.serving.namespace

    @property
    def service_account(self) -> str:
        return self.settings.serving.service_account

    @property
    def stable_service(self) -> str:
        return f"{self.release}-stable"

    @property
    def canary_service(self) -> str:
        return f"{self.release}-canary"

    @property
    def served_model_name(self) -> str:
        return self.settings.serving.served_model_name or self.model.name

    @property
    def model_key(self) -> str:
        """Object-key prefix of this model's files in the weights bucket."""
        return f"{self.weights_prefix.strip('/')}/{self.model.name}"

    # -- shape ----------------------------------------------------------------------

    @property
    def multi_node(self) -> bool:
        return self.plan.nodes > 1

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each serving pod requests: the replica's GPUs spread over its nodes (the TP
        group; one pipeline stage, or the node's share of the data-parallel engines, per
        pod when multi-node)."""
        return self.plan.total_gpus // self.plan.nodes

    @property
    def gpu_pool(self) -> str:
        return self.settings.serving.gpu_pool

    @property
    def mig(self):
        """The MIG profile (capacity.mig.MigProfile) the pool's GPUs are cut into, or None."""
        return self.settings.pool_mig(self.gpu_pool)

    @property
    def gpu_resource(self) -> str:
        """What a serving pod requests its GPUs as: whole GPUs, or one MIG slice."""
        return self.mig.resource if self.mig is not None else GPU_RESOURCE

    # -- labels ---------------------------------------------------------------------

    def labels(self, component: str) -> dict[str, str]:
        """The recommended app.kubernetes.io labels."""
        return {
            "app.kubernetes.io/name": "vllm",
            "app.kubernetes.io/instance": self.release,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY,
        }

    def selector(self, component: str = "server") -> dict[str, str]:
        """A stable subset of labels for selectors (never includes changing values)."""
        return {
            "app.kubernetes.io/name": "vllm",
            "app.kubernetes.io/instance": self.release,
            "app.kubernetes.io/component": component,
        }

    def metadata(self, name: str, component: str, namespace: str | None = None, **extra) -> dict:
        md = {"name": name, "namespace": namespace or self.namespace, "labels": self.labels(component)}
        md.update(extra)
        return md


def build_context(
    settings: StackSettings, *, image_repository: str, weights_bucket: str
) -> ServingContext:
    """Resolve the serving context. `image_repository` and `weights_bucket` are plain
    strings (known at preview) taken from the infra components' inputs."""
    sv = settings.serving
    gpu_name, per_node = settings.cluster.gpu_pools[sv.gpu_pool].hardware()
    repo = sv.image.repository or image_repository
    image = f"{repo}@{sv.image.digest}" if sv.image.digest else f"{repo}:{sv.image.tag}"
    return ServingContext(
        settings=settings,
        plan=settings.serving_plan,
        model=settings.serving_model,
        gpu=get_gpu(gpu_name),
        gpus_per_node=per_node,
        image=image,
        weights_bucket=weights_bucket,
        weights_prefix=settings.weights.prefix,
    )
