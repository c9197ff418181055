"""Metrics reach the stack's VMP workspace: the in-cluster Prometheus remote-writes to it
with credentials from a Secret, and the APIG edge sends its own metrics there
(`monitor_spec`). A workspace nothing writes to holds rules over no data."""

from __future__ import annotations

from .common import dig, items, of_type, stack_policy

VMP_WORKSPACE = "volcengine:vmp/workspace:Workspace"
APIG_GATEWAY = "volcengine:apig/apigGateway:ApigGateway"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
PROMETHEUS_RELEASE = "kube-prometheus-stack"


def _depends_on(resource, target) -> bool:
    return any(d.urn == target.urn for d in (resource.dependencies or []))


def _secret_ref(ref) -> bool:
    return bool(dig(ref, "name")) and bool(dig(ref, "key"))


def _vmp_fed(args, report):
    k8s_layer = any(r.resource_type.startswith("kubernetes:") for r in args.resources)
    releases = [r for r in of_type(args.resources, HELM_RELEASE) if dig(r.props, "name") == PROMETHEUS_RELEASE]
    for ws in of_type(args.resources, VMP_WORKSPACE):
        name = dig(ws.props, "name")
        for gw in of_type(args.resources, APIG_GATEWAY):
            # the flag only: the workspace id is unknown on a new stack (the dependency names it)
            if dig(gw.props, "monitorSpec", "enable") is not True or not _depends_on(gw, ws):
                report(f"APIG gateway {dig(gw.props, 'name')!r} does not send its metrics to VMP workspace {name!r} "
                       "(monitor_spec). Fix: infra/gateway.py monitor_spec with the workspace id.", gw.urn)
        if not k8s_layer:
            continue  # deploy phase 1: no Prometheus yet
        writers = []
        for rel in releases:
            for rw in items(dig(rel.props, "values", "prometheus", "prometheusSpec", "remoteWrite")):
                auth = dig(rw, "basicAuth", default={})
                if _secret_ref(dig(auth, "username")) and _secret_ref(dig(auth, "password")) and _depends_on(rel, ws):
                    writers.append(rel)
        if not writers:
            report(f"nothing writes to VMP workspace {name!r}: no in-cluster Prometheus remote-writes to its endpoint "
                   "with basic auth from a Secret. Fix: keep monitoring.enabled with observability.vmp_enabled "
                   "(workloads/observability/vmp.py remote_write_values).", ws.urn)


POLICIES = [
    stack_policy(
        "vmp-receives-metrics",
        "A VMP workspace receives the cluster's metrics (remote write, credentials from a Secret) and the edge's.",
        _vmp_fed,
        fix="Keep the remote write to the workspace and the APIG monitor_spec.",
        tags=["monitoring"],
    ),
]
