"""Network isolation of the serving namespace: deny by default, then admit each hop.

    ingress  :8000  <- Envoy proxies (ENTRY_NAMESPACE)        [in-cluster gateway]
                    <- APIG edge in the node subnets          [edge splits itself]
                    <- Prometheus pods (monitoring namespace,
                       by the operator's pod labels)          [/metrics]
    egress   :53    -> kube-system (cluster DNS)
             :443   -> network.endpoint_cidrs when set, else  [TOS weights, STS for IRSA]
                       outside the cluster's own ranges
             :4317  -> the OpenTelemetry Collector's namespace [spans, when tracing]
    both     all    <-> the serving pods themselves           [multi-node only]
    egress   :443, :6443 -> the cluster's own ranges, from   [the pre-warm's node label]
                       the pre-warm pods only

With the routing tier (workloads/edge/router.py):

    router   :8080  <- Envoy proxies; :29000 <- Prometheus pods
             -> :8000 of the serving pods; -> :443/:6443 of the cluster's own ranges (the
                Kubernetes API: service discovery watches pods)
    serving  :8000  <- the router pods (and the proxies for the canary track; not in a
                       disaggregated stack, whose every request the router pairs)
    P/D      prefill <-> decode: the NIXL handshake ports (and, without RDMA, every port:
             UCX moves the KV over TCP on ports it picks)

vLLM never calls the Kubernetes API (the pods do not even mount a token), so no policy
admits the API server for them; the pre-warm pods, which label their node once its cache
holds the weights (multi-node sync stacks), reach it. Kubelet probes come from the pod's own node, which NetworkPolicy
implementations let through regardless of policy.
"""

from __future__ import annotations

import ipaddress

from stacks.constants import ENTRY_NAMESPACE, HTTP_PORT
from stacks.plan.disaggregation import PD_ROLE_LABEL
from workloads.edge import router
from workloads.observability import telemetry
from workloads.engine import groups
from workloads.engine.context import ServingContext

NS_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace (1.22+)
API = "networking.k8s.io/v1"
# Labels prometheus-operator puts on every Prometheus server pod it runs
# (prometheus-operator pkg/prometheus/server/statefulset.go, podSelectorLabels); Grafana,
# Alertmanager and the rest of the monitoring namespace do not carry them.
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator"}


def _ns(name: str) -> dict:
    return {"namespaceSelector": {"matchLabels": {NS_LABEL: name}}}


def _policy(ctx: ServingContext, name: str, spec: dict) -> dict:
    return {"apiVersion": API, "kind": "NetworkPolicy", "metadata": ctx.metadata(name, "network"), "spec": spec}


def cluster_cidrs(ctx: ServingContext) -> list[str]:
    """Address ranges of the cluster itself: the VPC (nodes, VPC-CNI pods, the API server's
    private endpoint), the service CIDR and, in Flannel mode, the overlay pod CIDR."""
    s = ctx.settings
    ranges = [s.network.vpc_cidr, s.network.service_cidr]
    if s.cluster.pod_network_mode == "Flannel":
        ranges.append(s.network.flannel_pod_cidr)
    return [str(r) for r in ipaddress.collapse_addresses(ranges)]


def default_deny(ctx: ServingContext) -> dict:
    return _policy(ctx, f"{ctx.release}-default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})


def ingress_http(ctx: ServingContext) -> dict:
    """Port 8000 only, and only from the gateway hop and from the Prometheus pods."""
    s = ctx.settings
    sources: list[dict] = []
    if router.enabled(ctx):
        sources.append({"podSelector": {"matchLabels": ctx.selector(router.COMPONENT)}})
    if s.serving.in_cluster_gateway and ctx.plan.disaggregation is None:
        sources.append(_ns(ENTRY_NAMESPACE))
    else:
        # The APIG edge reaches the pods from its ENIs in the node subnets (infra/__init__.py
        # gives the gateway network.node_subnet_ids), not from a namespace.
        sources += [{"ipBlock": {"cidr": str(c)}} for c in ctx.plan.network.node_subnets.values()]
    if s.monitoring.enabled:
        # Only the Prometheus servers, not every pod of the monitoring namespace: Grafana
        # (or anything else deployed there) must go through the gateway like any client.
        sources.append(_prometheus(ctx))
    return _policy(ctx, f"{ctx.release}-ingress-http", {
        "podSelector": {"matchLabels": ctx.selector("server")},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": sources, "ports": [{"protocol": "TCP", "port": HTTP_PORT}]}],
    })


def egress_dns(ctx: ServingContext) -> dict:
    # Any pod of kube-system: CoreDNS's labels differ between distributions.
    return _policy(ctx, f"{ctx.release}-egress-dns", {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [{"to": [_ns("kube-system")],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}],
    })


def egress_https(ctx: ServingContext) -> dict:
    """HTTPS to the weight store (init container and runai_streamer) and STS (IRSA).

    With `network.endpoint_cidrs` set (the address ranges the in-VPC TOS and STS endpoints
    resolve to, tos-<region>.ivolces.com and the STS endpoint), port 443 to those ranges
    only. Without it, port 443 to anything outside the cluster's own ranges: those
    endpoints are not published as fixed ranges, and plain NetworkPolicy cannot match a
    DNS name (that needs an FQDN-aware CNI such as Cilium). The trade-off then: a
    compromised pod could reach any HTTPS host through the NAT gateway, but nothing inside
    the cluster or VPC (no other pod, node, kubelet or the API server), nothing on another
    port (the ECS metadata service is plain HTTP), and the weights credential is scoped to
    read one bucket prefix anyway.
    """
    # The serving pods, and the pre-warm pods that run the same weights sync on new nodes.
    sel = {k: v for k, v in ctx.selector("server").items() if k != "app.kubernetes.io/component"}
    endpoints = ctx.settings.network.endpoint_cidrs
    if endpoints:
        to = [{"ipBlock": {"cidr": str(c)}} for c in endpoints]
    else:
        to = [{"ipBlock": {"cidr": "0.0.0.0/0", "except": cluster_cidrs(ctx)}}]
    return _policy(ctx, f"{ctx.release}-egress-https", {
        "podSelector": {"matchLabels": sel, "matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": ["server", "prewarm"]}]},
        "policyTypes": ["Egress"],
        "egress": [{"to": to, "ports": [{"protocol": "TCP", "port": 443}]}],
    })


def egress_otlp(ctx: ServingContext) -> dict:
    """Spans to the OpenTelemetry Collector (OTLP gRPC), and nowhere else on that port."""
    t = ctx.settings.observability.tracing
    return _policy(ctx, f"{ctx.release}-egress-otlp", {
        "podSelector": {"matchLabels": ctx.selector("server")},
        "policyTypes": ["Egress"],
        "egress": [{"to": [_ns(t.collector_namespace)],
                    "ports": [{"protocol": "TCP", "port": telemetry.OTLP_GRPC_PORT}]}],
    })


def group_traffic(ctx: ServingContext, role: str | None = None) -> dict:
    """Multi-node replicas: leader and workers talk on dynamic ports (torch.distributed
    store, NCCL bootstrap and sockets, Ray/gloo), so all ports, but only among the serving
    pods (of one side, when disaggregated: the other side gets only the KV transfer's ports).
    RDMA traffic bypasses the kernel network stack and is not subject to this."""
    sel = ctx.selector("server") if role is None else {**ctx.selector("server"), PD_ROLE_LABEL: role}
    peers = [{"podSelector": {"matchLabels": sel}}]
    return _policy(ctx, f"{ctx.release}-group" + (f"-{role}" if role else ""), {
        "podSelector": {"matchLabels": sel},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": peers}],
        "egress": [{"to": peers}],
    })


def _prometheus(ctx: ServingContext) -> dict:
    return {**_ns(ctx.settings.monitoring.namespace), "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}}


def router_traffic(ctx: ServingContext) -> dict:
    """The router: requests from the proxies, scrapes from Prometheus; out to the engines'
    HTTP port and to the Kubernetes API (its pod watch)."""
    r = ctx.settings.serving.router
    ingress = [{"from": [_ns(ENTRY_NAMESPACE)], "ports": [{"protocol": "TCP", "port": r.port}]}]
    if ctx.settings.monitoring.enabled:
        ingress.append({"from": [_prometheus(ctx)], "ports": [{"protocol": "TCP", "port": r.metrics_port}]})
    api = [{"ipBlock": {"cidr": c}} for c in cluster_cidrs(ctx)]
    return _policy(ctx, f"{ctx.release}-router", {
        "podSelector": {"matchLabels": ctx.selector(router.COMPONENT)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": ingress,
        "egress": [
            {"to": [{"podSelector": {"matchLabels": ctx.selector("server")}}],
             "ports": [{"protocol": "TCP", "port": HTTP_PORT}]},
            # the API server's Service (443) and its endpoints in the VPC (6443 on VKE)
            {"to": api, "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]},
        ],
    })


def kv_transfer(ctx: ServingContext) -> dict:
    """Prefill and decode pods reach each other's NIXL handshake listeners; over RDMA the KV
    itself bypasses the kernel's network stack, over TCP UCX picks its ports."""
    d = ctx.plan.disaggregation
    sides = {"podSelector": {"matchLabels": ctx.selector("server"), "matchExpressions": [
        {"key": PD_ROLE_LABEL, "operator": "In", "values": ["prefill", "decode"]}]}}
    rule: dict = {"from": [sides]}
    out_rule: dict = {"to": [sides]}
    if all(ph.rdma_per_pod for ph in d.phases()):
        dp = max(ph.engine.data_parallel_size for ph in d.phases())
        ports = [{"protocol": "TCP", "port": d.side_channel_port, **({"endPort": d.side_channel_port + dp - 1}
                                                                     if dp > 1 else {})}]
        rule["ports"] = out_rule["ports"] = ports
    return _policy(ctx, f"{ctx.release}-kv-transfer", {
        "podSelector": sides["podSelector"],
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [rule],
        "egress": [out_rule],
    })


def egress_kube_api(ctx: ServingContext) -> dict:
    """The pre-warm pods to the API server: the `kubernetes` Service (443, in the service
    CIDR) and the private endpoint it forwards to (6443, in the VPC), nothing else."""
    return _policy(ctx, f"{ctx.release}-prewarm-kube-api", {
        "podSelector": {"matchLabels": ctx.selector("prewarm")},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": c}} for c in cluster_cidrs(ctx)],
                    "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}],
    })


def render(ctx: ServingContext) -> list[dict]:
    objs = [default_deny(ctx), ingress_http(ctx), egress_dns(ctx), egress_https(ctx)]
    if router.enabled(ctx):
        objs.append(router_traffic(ctx))
    if ctx.plan.disaggregation is not None:
        objs.append(kv_transfer(ctx))
    if telemetry.tracing_on(ctx.plan):
        objs.append(egress_otlp(ctx))
    if ctx.plan.disaggregation is not None:
        objs += [group_traffic(ctx, ph.role) for ph in ctx.plan.disaggregation.phases() if ph.multi_node]
    elif ctx.multi_node:
        objs.append(group_traffic(ctx))
    if groups.marks_nodes(ctx):
        objs.append(egress_kube_api(ctx))
    return objs
