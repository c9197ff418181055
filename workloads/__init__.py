"""The serving stack on the cluster: pure renderers (settings and plan in, Kubernetes
objects as plain dicts out) and the `Serving` component that registers them.

May import: `stacks`, `capacity`, pulumi and pulumi_kubernetes (in `serving` and `k8s`
only; the renderers stay pure). Never `infra` (its outputs arrive as `ServingArgs`),
`policies` or `dsvolc`.
"""
