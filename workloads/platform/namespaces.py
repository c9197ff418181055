"""Namespaces and their Pod Security Admission labels.

Every namespace the program creates carries the Pod Security Admission labels
(https://kubernetes.io/docs/concepts/security/pod-security-admission/):

* `audit` and `warn` at `restricted`, everywhere: the API server records and reports every
  pod that falls short of the strictest profile;
* `enforce` at the strictest level all the namespace's pods meet, computed from the pods
  the program renders (stacks/pod_security.py) - only where the program renders every pod
  of the namespace. A namespace that holds a Helm release gets no `enforce` label: the
  chart's pods are rendered by Helm at `pulumi up` and are not seen here, so a level picked
  for them could refuse them (docs/serving.md, "Pod Security Admission");
* each `*-version` label pinned to the cluster's Kubernetes minor version
  (cluster.kubernetes_version), so an upgrade does not change what is enforced unseen.

The namespaces of the Helm releases are created here too (not by Helm's
`create_namespace`), so that they carry the labels from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from stacks import pod_security
from stacks.constants import MANAGED_BY, PART_OF
from stacks.plan import StackPlan

PSA = "pod-security.kubernetes.io"
AUDIT_WARN_LEVEL = pod_security.RESTRICTED
POD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Rollout")


def psa_version(plan: StackPlan) -> str:
    """The Pod Security policy version the labels pin: the cluster's minor version."""
    settings = plan.settings
    return f"v{settings.cluster.kubernetes_version}"


def psa_labels(enforce: str | None, version: str) -> dict[str, str]:
    """audit/warn at restricted, enforce at `enforce` (none when None), every version pinned."""
    out = {}
    if enforce is not None:
        out |= {f"{PSA}/enforce": enforce, f"{PSA}/enforce-version": version}
    for mode in ("audit", "warn"):
        out |= {f"{PSA}/{mode}": AUDIT_WARN_LEVEL, f"{PSA}/{mode}-version": version}
    return out


def pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict]]:
    """(where, pod template) of a rendered object: one per template (a LeaderWorkerSet
    has a leader's and a worker's, a CronJob's sits in its job template)."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    name = f"{kind} {obj.get('metadata', {}).get('name')}"
    if kind == "Pod":
        yield name, {"metadata": obj.get("metadata") or {}, "spec": spec}
    elif kind in POD_KINDS and "template" in spec:
        yield name, spec["template"]
    elif kind == "CronJob":
        yield name, spec.get("jobTemplate", {}).get("spec", {}).get("template", {})
    elif kind == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        for role in ("leaderTemplate", "workerTemplate"):
            if role in lwt:
                yield f"{name} ({role})", lwt[role]


def pods_by_namespace(objs: Iterable[dict[str, Any]]) -> dict[str, list[tuple[str, dict]]]:
    out: dict[str, list[tuple[str, dict]]] = {}
    for obj in objs:
        ns = (obj.get("metadata") or {}).get("namespace")
        for where, template in pod_templates(obj):
            out.setdefault(ns, []).append((where, template))
    return out


def enforce_level(templates: list[tuple[str, dict]], version: str) -> str:
    """The strictest level every pod template meets."""
    return pod_security.strictest_level(
        ((t.get("spec") or {}, t.get("metadata") or {}) for _, t in templates), version)


def chart_namespaces(plan: StackPlan) -> set[str]:
    """Namespaces that hold a Helm release (pods this program does not render)."""
    from workloads.platform import controllers as platform
    return {rel["namespace"] for rel in platform.releases(plan)}


def label(namespace_obj: dict[str, Any], objs: Iterable[dict[str, Any]], plan: StackPlan) -> dict:
    """`namespace_obj` with its Pod Security labels for the pods of `objs` in it."""
    name = namespace_obj["metadata"]["name"]
    version = psa_version(plan)
    enforce = None
    if name not in chart_namespaces(plan):
        enforce = enforce_level(pods_by_namespace(objs).get(name, []), version)
    md = dict(namespace_obj["metadata"])
    md["labels"] = {k: v for k, v in (md.get("labels") or {}).items() if not k.startswith(f"{PSA}/")}
    md["labels"] |= psa_labels(enforce, version)
    return {**namespace_obj, "metadata": md}


def platform_namespaces(plan: StackPlan, objs: Iterable[dict[str, Any]], instance: str) -> list[dict]:
    """The namespaces of the platform, labelled: one per Helm release's namespace and per
    namespace holding generated Secrets, but those `objs` already create (the serving one)."""
    settings = plan.settings
    from workloads.platform import controllers as platform
    from workloads.platform import secrets
    objs = list(objs)
    own = {o["metadata"]["name"] for o in objs if o.get("kind") == "Namespace"}
    names = [rel["namespace"] for rel in platform.releases(plan)] + [g.namespace for g in secrets.generated(settings)]
    out = []
    for name in dict.fromkeys(names):
        if name in own:
            continue
        labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": instance,
                  "app.kubernetes.io/component": "platform", "app.kubernetes.io/part-of": PART_OF,
                  "app.kubernetes.io/managed-by": MANAGED_BY}
        out.append(label({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
                         objs, plan))
    return out
