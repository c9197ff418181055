"""The plan of a stack: every cross-section check and every decision derived from its
settings (subnets, NAT zones, pool hardware and topology, add-ons, names, the serving
engine's layout from the capacity planner, rollout, SLOs, tags), computed once by
`build_plan` into a typed, frozen `StackPlan`.

    settings (stacks/settings.py) --build_plan--> StackPlan --> infra/ --> workloads/

Infra and workloads read the plan (`plan.settings` for what the user wrote); they never
derive these again. May import `stacks` modules and `capacity`; never `infra`,
`workloads`, `policies` or `dsvolc`.
"""

from stacks.plan.build import SLO_CLASS_DEFAULTS, build_plan, infer_model_class
from stacks.plan.types import (
    EdgePlan,
    Names,
    NetworkPlan,
    PoolPlan,
    RolloutPlan,
    ServingPlan,
    Slo,
    StackPlan,
    Upstream,
)

__all__ = [
    "SLO_CLASS_DEFAULTS",
    "EdgePlan",
    "Names",
    "NetworkPlan",
    "PoolPlan",
    "RolloutPlan",
    "ServingPlan",
    "Slo",
    "StackPlan",
    "Upstream",
    "build_plan",
    "infer_model_class",
]
