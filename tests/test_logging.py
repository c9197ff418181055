"""The log service side, as the real program registers it under Pulumi's mock engine: a
TLS project with a topic per source and indexes on the searched fields, collection rules
that select the workloads' real labels, the control-plane and APIG logs in the same
project, and the collector writing to the stack's trace topic."""

from __future__ import annotations

import copy
import json
import re

import pytest

from dsvolc import engine
from infra import logging as tls
from stacks import load, parse, read_raw
from stacks.logschema import ACCESS_LOG_ANALYSED, ACCESS_LOG_KEYS, SERVING_LOG_KEYS
from workloads.edge import gateway
from stacks.plan import build_plan
from workloads.engine.context import build_context


@pytest.fixture(scope="module")
def prod() -> engine.Recording:
    return engine.run("prod", read_raw("prod"), mode="existing")


def of(rec: engine.Recording, short: str) -> list[engine.Recorded]:
    return [r for r in rec.resources if r.type.endswith(short)]


def _id(r: engine.Recorded) -> str:
    return r.id or ""


def test_one_project_and_a_topic_per_source_with_the_retention_from_settings(prod):
    s = load("prod")
    p = build_plan(s)
    (project,) = of(prod, "tls/project:Project")
    assert project.inputs["projectName"] == p.names.log_project
    assert project.inputs["region"] == s.region
    topics = {t.inputs["topicName"]: t for t in of(prod, "tls/topic:Topic")}
    assert set(topics) == set(tls.TOPICS) == {"serving", "gateway", "platform", "edge"}
    for t in topics.values():
        assert t.inputs["projectId"] == _id(project)
        assert t.inputs["ttl"] == s.observability.logs.retention_days
        assert t.inputs["shardCount"] == s.observability.logs.shard_count


def test_indexes_cover_what_people_search(prod):
    topics = {_id(t): t.inputs["topicName"] for t in of(prod, "tls/topic:Topic")}
    indexes = {topics[i.inputs["topicId"]]: i.inputs for i in of(prod, "tls/index:Index")}
    assert set(indexes) == set(tls.TOPICS)
    gw = {kv["key"]: kv for kv in indexes["gateway"]["keyValues"]}
    assert {k: v["valueType"] for k, v in gw.items()} == ACCESS_LOG_KEYS
    for key in ("request_id", "consumer", "model", "status", "duration_ms", "upstream_ms"):
        assert key in gw
    assert gw["status"]["valueType"] == "long" and gw["upstream_ms"]["valueType"] == "long"
    assert {k for k, v in gw.items() if v.get("sqlFlag")} == set(ACCESS_LOG_ANALYSED)
    # an id is one token (no '-' split), free text splits on '-' for phrase search
    assert "-" not in gw["request_id"]["delimiter"]
    serving = {kv["key"]: kv for kv in indexes["serving"]["keyValues"]}
    assert {k: v["valueType"] for k, v in serving.items()} == SERVING_LOG_KEYS
    assert "-" in serving["message"]["delimiter"]
    for name in tls.TOPICS:
        assert indexes[name]["fullText"]["caseSensitive"] is False


def test_collection_rules_select_the_workloads_labels():
    """The rules are built from settings (infra cannot import workloads); the labels they
    select must be labels the workloads really carry."""
    s = load("prod")
    p = build_plan(s)
    ctx = build_context(build_plan(s), image_repository="r/ns/repo")
    rules = {r.topic: r for r in tls.collection_rules(
        serving_namespace=s.serving.namespace, release=s.serving.name, entry_namespace="envoy-gateway-system",
        platform_namespaces=["envoy-gateway-system", "monitoring", s.serving.namespace],
        gateway_proxy_labels={"app.kubernetes.io/component": "proxy",
                              "gateway.envoyproxy.io/owning-gateway-name": s.serving.name})}
    assert rules["serving"].include_pod_labels.items() <= ctx.labels("server").items()
    assert rules["gateway"].include_pod_labels.items() <= gateway.proxy_selector(ctx).items()
    # a container matched by two rules is collected by one only: the selections are disjoint
    assert s.serving.namespace not in rules["platform"].namespaces
    assert rules["platform"].exclude_pod_labels.items() <= gateway.proxy_selector(ctx).items()


def _match(regex: str, value: str) -> bool:
    return re.fullmatch(regex, value) is not None


def test_registered_rules_are_container_stdout_rules_bound_to_the_nodes(prod):
    s = load("prod")
    p = build_plan(s)
    topics = {_id(t): t.inputs["topicName"] for t in of(prod, "tls/topic:Topic")}
    rules = {topics[r.inputs["topicId"]]: r for r in of(prod, "tls/rule:Rule")}
    assert set(rules) == {"serving", "gateway", "platform"}
    k8s = {name: r.inputs["containerRule"]["kubernetesRule"] for name, r in rules.items()}
    assert all(r.inputs["inputType"] == tls.CONTAINER_STDOUT for r in rules.values())
    assert rules["serving"].inputs["logType"] == rules["gateway"].inputs["logType"] == "json_log"
    assert _match(k8s["serving"]["namespaceNameRegex"], s.serving.namespace)
    assert not _match(k8s["serving"]["namespaceNameRegex"], s.serving.namespace + "-x")
    assert not _match(k8s["platform"]["namespaceNameRegex"], s.serving.namespace)
    for ns in ("envoy-gateway-system", "keda", "argo-rollouts", s.monitoring.namespace,
               s.observability.tracing.collector_namespace, "kube-system"):
        assert _match(k8s["platform"]["namespaceNameRegex"], ns), ns
    (group,) = of(prod, "tls/hostGroup:HostGroup")
    assert group.inputs["hostGroupType"] == "Label"
    assert group.inputs["hostIdentifier"] == f"{p.names.prefix}-nodes"
    applied = {(a.inputs["hostGroupId"], a.inputs["ruleId"]) for a in of(prod, "tls/ruleApplier:RuleApplier")}
    assert applied == {(_id(group), _id(r)) for r in rules.values()}
    addons = {a.inputs["name"] for a in of(prod, "vke/addon:Addon")}
    assert "log-collector" in addons


def test_control_plane_and_edge_logs_go_to_the_project(prod):
    s = load("prod")
    (project,) = of(prod, "tls/project:Project")
    cluster = of(prod, "vke/cluster:Cluster")[0].inputs["loggingConfig"]
    assert cluster["logProjectId"] == _id(project)
    assert {x["logTtl"] for x in cluster["logSetups"]} == {s.observability.logs.retention_days}
    (apig,) = of(prod, "apig/apigGateway:ApigGateway")
    edge = next(t for t in of(prod, "tls/topic:Topic") if t.inputs["topicName"] == "edge")
    assert apig.inputs["logSpec"] == {"enable": True, "projectId": _id(project), "topicId": _id(edge)}


def test_the_collector_writes_the_stacks_trace_topic(prod):
    s = load("prod")
    p = build_plan(s)
    (instance,) = of(prod, "tls/traceInstance:TraceInstance")
    assert instance.inputs["traceInstanceName"] == p.names.trace_instance
    assert instance.inputs["backendConfig"]["ttl"] == s.observability.tracing.retention_days
    (rel,) = [r for r in of(prod, "helm.sh/v3:Release") if r.inputs["name"] == "otel-collector"]
    (exp,) = rel.inputs["values"]["alternateConfig"]["exporters"].values()
    # the mock engine's data source answers "<instance id>-trace-topic" (dsvolc/engine.py)
    assert exp["headers"]["x-tls-otel-tracetopic"] == f"{_id(instance)}-trace-topic"


def test_nothing_of_it_when_logs_and_traces_are_off():
    raw = copy.deepcopy(read_raw("dev"))
    raw["observability"].update(logs={"enabled": False}, tracing={"enabled": False})
    rec = engine.run("dev", raw, mode="existing")
    assert not [r for r in rec.resources if r.type.startswith("volcengine:tls/")]
    assert "logProjectId" not in of(rec, "vke/cluster:Cluster")[0].inputs["loggingConfig"]
    assert "logSpec" not in of(rec, "apig/apigGateway:ApigGateway")[0].inputs
    assert not [r for r in of(rec, "helm.sh/v3:Release") if r.inputs["name"] == "otel-collector"]


def test_apmplus_backend_needs_no_trace_instance():
    raw = copy.deepcopy(read_raw("dev"))
    raw["observability"]["tracing"] = {"backend": "apmplus"}
    rec = engine.run("dev", raw, mode="existing")
    assert not of(rec, "tls/traceInstance:TraceInstance")
    assert of(rec, "tls/project:Project")  # logs still go to TLS


def test_rule_names_must_be_plain_names():
    with pytest.raises(ValueError, match="is not a name"):
        tls.rule_inputs(tls.CollectionRule(topic="serving", namespaces=("a|b",), log_type="json_log"))


def test_settings_parse_with_observability_sections():
    raw = copy.deepcopy(read_raw("dev"))
    raw["observability"]["logs"] = {"retention_days": 7, "request_log": {"max_log_len": 0}}
    s = parse(raw, stack="dev")
    assert s.observability.logs.retention_days == 7 and s.observability.logs.request_log.max_log_len == 0
    assert json.dumps(s.observability.model_dump())  # serialisable for the preview
