"""One pydantic model per section of a stack's settings (network, cluster, weights,
registry, observability, gateway, serving, autoscaling, rollout, monitoring, alerting,
resilience), each validating its own fields; `stacks.settings.StackSettings` holds them.

A section checks only what it holds. Whatever needs two sections (a pool's zones against
the stack's zones, the engine against the pool's GPUs) is checked once while the plan is
derived (stacks/plan/), where the error still names the path of the field.
"""
