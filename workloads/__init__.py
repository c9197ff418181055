"""The serving stack on the cluster: pure renderers (plan in, Kubernetes objects as plain
dicts out) grouped by concern, and the `Serving` component that registers them.

They read the stack's `StackPlan` (stacks/plan/): derived values (names, the engine plan,
rollout, SLOs, subnets) from the plan, what the user wrote from `plan.settings`; they
never derive them again. Renderers get it as `ServingContext.plan` (engine/context.py).

    engine/         the context renderers read, vLLM arguments, the Deployment or
                    LeaderWorkerSet, RDMA, Triton, autoscaling, canary rollout, node resilience
    edge/           Envoy Gateway (JWT, rate limits, canary split) and the network policy
    observability/  scrape configs, rules and dashboards, Alertmanager, traces and logs, VMP
    platform/       controllers as Helm releases, namespaces, generated secrets, features,
                    the dict-to-Pulumi adapter
    supply_chain/   the mirror of every chart and image, pinned versions
    serving.py      the `Serving` ComponentResource

May import: `stacks`, `capacity`, pulumi and pulumi_kubernetes (in `serving` and
`platform.k8s` only; the renderers stay pure). Never `infra` (its outputs arrive as
`ServingArgs`), `policies` or `dsvolc`.
"""
