"""Everything a workload renderer needs: the stack's plan and what infra hands over.

Renderers are pure functions `(ServingContext) -> list[dict]` (Kubernetes objects as
plain dicts). They read derived values from `ctx.plan` (a `StackPlan`; the engine plan is
`ctx.engine`) and what the user wrote from `ctx.settings`; they never read the settings
file, call the planner or touch Pulumi, so they are unit-tested directly;
`workloads.serving.Serving` wraps their output.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.catalog import GPUSpec, ModelSpec
from capacity.planner import Plan
from stacks.constants import GPU_RESOURCE, MANAGED_BY, PART_OF
from stacks.plan import StackPlan
from stacks.settings import StackSettings


@dataclass(frozen=True)
class ServingContext:
    plan: StackPlan
    image: str
    weights_bucket: str
    # the phase these engines serve: "aggregated", or one side of a prefill/decode split
    # (workloads/engine/disaggregation.py phase_context); capacity.wide_ep decides per phase
    phase: str = "aggregated"

    @property
    def settings(self) -> StackSettings:
        """What the user wrote."""
        return self.plan.settings

    @property
    def engine(self) -> Plan:
        """The engine plan (capacity.planner.Plan) the serving engine runs with."""
        return self.plan.serving.engine

    @property
    def model(self) -> ModelSpec:
        return self.plan.serving.model

    @property
    def gpu(self) -> GPUSpec:
        return self.plan.serving.gpu

    @property
    def gpus_per_node(self) -> int:
        return self.plan.serving_pool.gpus_per_node

    @property
    def weights_prefix(self) -> str:
        return self.settings.weights.prefix

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
    def router_service(self) -> str:
        """The routing tier's Deployment and Service (workloads/edge/router.py)."""
        return f"{self.release}-router"

    @property
    def routed(self) -> bool:
        """The stack routes through vLLM Router (StackPlan.router)."""
        return self.plan.router is not None and self.plan.router.enabled

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
        return self.plan.serving.multi_node

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each serving pod requests: the replica's GPUs spread over its nodes (the TP
        group; one pipeline stage, or the node's share of the data-parallel engines, per
        pod when multi-node)."""
        return self.plan.serving_pool.gpus_per_pod

    @property
    def gpu_pool(self) -> str:
        return self.settings.serving.gpu_pool

    @property
    def mig(self):
        """The MIG profile (capacity.mig.MigProfile) the pool's GPUs are cut into, or None."""
        return self.plan.serving_pool.mig

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


def build_context(plan: StackPlan, *, image_repository: str | None = None,
                  weights_bucket: str | None = None) -> ServingContext:
    """The serving context of a plan. `image_repository` and `weights_bucket` are plain
    strings (known at preview) taken from the infra components' inputs; the plan's own
    names when not given."""
    sv = plan.settings.serving
    repo = sv.image.repository or image_repository or plan.names.image_repository
    image = f"{repo}@{sv.image.digest}" if sv.image.digest else f"{repo}:{sv.image.tag}"
    return ServingContext(plan=plan, image=image, weights_bucket=weights_bucket or plan.names.bucket)
