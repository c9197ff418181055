"""Plain Kubernetes dicts -> pulumi_kubernetes resources.

Built-in kinds become their typed resource classes (so Pulumi knows their schema, await
logic and replacement rules); everything else becomes a CustomResource.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_kubernetes as k8s

_TYPED = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("scheduling.k8s.io/v1", "PriorityClass"): k8s.scheduling.v1.PriorityClass,
}
_RESERVED = {"apiVersion", "kind", "metadata"}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def resource_name(prefix: str, obj: dict) -> str:
    md = obj["metadata"]
    ns = md.get("namespace")
    parts = [prefix, obj["kind"].lower(), *([ns] if ns else []), md["name"]]
    return "-".join(parts)


def apply(prefix: str, obj: dict, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Register one object. The dict's top-level fields become the resource's arguments."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    name = resource_name(prefix, obj)
    rest = {k: v for k, v in obj.items() if k not in _RESERVED}
    cls = _TYPED.get((api_version, kind))
    if cls is not None:
        return cls(name, metadata=obj["metadata"], opts=opts, **{_snake(k): v for k, v in rest.items()})
    return k8s.apiextensions.CustomResource(
        name, api_version=api_version, kind=kind, metadata=obj["metadata"], opts=opts, **rest
    )
