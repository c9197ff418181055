"""Network isolation of the serving namespace."""

from __future__ import annotations

import ipaddress

import pytest

import stacks
from tests.k8s_schema import validate_all
from workloads.edge import network_policy
from stacks.plan import build_plan
from workloads.engine.context import build_context
from stacks.constants import HTTP_PORT, ENTRY_NAMESPACE

NS = network_policy.NS_LABEL


def _ctx(settings):
    return build_context(build_plan(settings), image_repository="r.example/x/y")


def _with(settings, section, **fields):
    data = settings.model_dump()
    data[section] = {**data[section], **fields}
    return type(settings).model_validate(data)


@pytest.fixture(scope="module", params=("dev", "staging", "prod"))
def ctx(request):
    return _ctx(stacks.load(request.param))


def _by_suffix(objs, suffix):
    (found,) = [o for o in objs if o["metadata"]["name"].endswith(suffix)]
    return found


def test_schema_valid(ctx):
    objs = network_policy.render(ctx)
    validate_all(objs, ctx.settings.cluster.kubernetes_version)
    assert {o["metadata"]["namespace"] for o in objs} == {ctx.namespace}


def test_default_deny_covers_every_pod_both_ways(ctx):
    deny = _by_suffix(network_policy.render(ctx), "-default-deny")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_ingress_only_8000_from_gateway_and_monitoring(ctx):
    pol = _by_suffix(network_policy.render(ctx), "-ingress-http")
    (rule,) = pol["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": HTTP_PORT}]
    namespaces = {p["namespaceSelector"]["matchLabels"][NS] for p in rule["from"] if "namespaceSelector" in p}
    assert namespaces == {ENTRY_NAMESPACE, ctx.settings.monitoring.namespace}
    # besides those, only the router's pods (of the namespace itself) when the stack routes through it
    local = [p for p in rule["from"] if "namespaceSelector" not in p]
    assert local == ([{"podSelector": {"matchLabels": ctx.selector("router")}}] if ctx.plan.router.enabled else [])
    assert pol["spec"]["podSelector"]["matchLabels"] == ctx.selector("server")
    # From the monitoring namespace only the Prometheus server pods, by the operator's labels
    (mon,) = [p for p in rule["from"] if p.get("namespaceSelector", {}).get("matchLabels", {}).get(NS)
              == ctx.settings.monitoring.namespace]
    assert mon["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus",
                                                  "app.kubernetes.io/managed-by": "prometheus-operator"}}


def _admitted(rule: dict, ns_labels: dict, pod_labels: dict) -> bool:
    """NetworkPolicy peer semantics: namespaceSelector AND podSelector within one peer."""
    for peer in rule["from"]:
        ns_ok = all(ns_labels.get(k) == v for k, v in peer.get("namespaceSelector", {}).get("matchLabels", {}).items())
        pod_ok = all(pod_labels.get(k) == v for k, v in peer.get("podSelector", {}).get("matchLabels", {}).items())
        if "ipBlock" not in peer and ns_ok and pod_ok:
            return True
    return False


def test_grafana_cannot_reach_vllm_but_prometheus_can(ctx):
    (rule,) = _by_suffix(network_policy.render(ctx), "-ingress-http")["spec"]["ingress"]
    mon = {NS: ctx.settings.monitoring.namespace}
    prometheus = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator",
                  "prometheus": "kube-prometheus-stack-prometheus"}
    grafana = {"app.kubernetes.io/name": "grafana", "app.kubernetes.io/instance": "kube-prometheus-stack"}
    assert _admitted(rule, mon, prometheus)
    assert not _admitted(rule, mon, grafana)
    assert not _admitted(rule, {NS: "default"}, prometheus)  # a look-alike elsewhere
    assert _admitted(rule, {NS: ENTRY_NAMESPACE}, {"app.kubernetes.io/name": "envoy"})


def test_without_in_cluster_gateway_the_edge_subnets_are_admitted():
    s = _with(stacks.load("staging"), "serving", in_cluster_gateway=False)
    pol = _by_suffix(network_policy.render(_ctx(s)), "-ingress-http")
    (rule,) = pol["spec"]["ingress"]
    cidrs = {p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p}
    assert cidrs == {str(c) for c in build_plan(s).network.node_subnets.values()}
    assert ENTRY_NAMESPACE not in str(rule)


def test_dns_egress_to_kube_system_only(ctx):
    pol = _by_suffix(network_policy.render(ctx), "-egress-dns")
    (rule,) = pol["spec"]["egress"]
    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {NS: "kube-system"}}}]
    assert sorted((p["protocol"], p["port"]) for p in rule["ports"]) == [("TCP", 53), ("UDP", 53)]


def test_https_egress_excludes_the_cluster(ctx):
    pol = _by_suffix(network_policy.render(ctx), "-egress-https")
    (rule,) = pol["spec"]["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 443}]
    (block,) = rule["to"]
    excluded = [ipaddress.ip_network(c) for c in block["ipBlock"]["except"]]
    net = ctx.settings.network
    for must in (net.vpc_cidr, net.service_cidr):
        assert any(must.subnet_of(e) for e in excluded), must
    # TOS lives outside the cluster: a public address stays reachable.
    assert not any(ipaddress.ip_address("101.126.0.1") in e for e in excluded)


def test_flannel_pod_cidr_is_excluded_in_flannel_mode():
    base = stacks.load("dev")
    data = base.model_dump()
    data["cluster"]["pod_network_mode"] = "Flannel"
    s = type(base).model_validate(data)
    assert str(s.network.flannel_pod_cidr) in network_policy.cluster_cidrs(_ctx(s))
    assert str(base.network.flannel_pod_cidr) not in network_policy.cluster_cidrs(_ctx(base))


def test_group_traffic_only_when_multi_node():
    for env, multi in (("dev", False), ("staging", False), ("prod", True)):
        ctx = _ctx(stacks.load(env))
        assert ctx.multi_node is multi, env
        group = [o for o in network_policy.render(ctx) if o["metadata"]["name"].endswith("-group")]
        assert bool(group) is multi, env
        if multi:
            spec = group[0]["spec"]
            peer = [{"podSelector": {"matchLabels": ctx.selector("server")}}]
            assert spec["ingress"] == [{"from": peer}] and spec["egress"] == [{"to": peer}]
            assert "ports" not in spec["ingress"][0]  # NCCL/Ray/gloo pick ports at run time


def test_prod_is_two_nodes_per_replica():
    assert _ctx(stacks.load("prod")).engine.nodes == 2


def test_https_egress_narrows_to_the_endpoint_ranges_when_given():
    base = stacks.load("staging")
    data = base.model_dump()
    data["network"]["endpoint_cidrs"] = ["100.96.0.0/12", "10.20.200.0/24"]
    s = type(base).model_validate(data)
    (rule,) = _by_suffix(network_policy.render(_ctx(s)), "-egress-https")["spec"]["egress"]
    assert rule["to"] == [{"ipBlock": {"cidr": "100.96.0.0/12"}}, {"ipBlock": {"cidr": "10.20.200.0/24"}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 443}]
    validate_all(network_policy.render(_ctx(s)), s.cluster.kubernetes_version)
