"""VolcEngine's log service (TLS): where every log line of the stack, and its traces, end up.

    LogStore       a log project, one topic per source with indexes on what people search,
                   and a trace instance (the collector's export target). Built before the
                   cluster: the cluster ships its control-plane logs into this project.
    LogCollection  the cluster's `log-collector` add-on, a machine group its LogCollectors
                   join, and one collection rule per topic selecting namespaces and
                   workloads by Kubernetes rule. Built after the cluster.

Topics (TOPICS): serving (vLLM's JSON log lines), gateway (the in-cluster Envoy Gateway's
JSON access log), platform (the controllers: Envoy Gateway, KEDA, Argo Rollouts, LWS,
Prometheus, the OpenTelemetry Collector, kube-system add-ons) and edge (APIG access logs,
written by APIG through its log_spec). The cluster's control-plane logs (audit, API server,
scheduler, controller manager) go to topics VKE creates in the same project.

Resource arguments follow terraform-provider-volcengine v0.0.194 (commit 4446a06d, the
provider pulumi-volcengine 0.0.47 wraps): volcengine/tls/{project,topic,index,rule,
rule_applier,host_group,trace_instance}/resource_*.go. A container matching two
collection rules is collected by the newest only (TLS docs 6470/108979), so the rules'
selections are disjoint: the platform rule excludes the gateway's proxy pods, and the
serving namespace belongs to the serving rule alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list
from stacks.logschema import (
    ACCESS_LOG_ANALYSED,
    ACCESS_LOG_KEYS,
    FREE_TEXT_KEYS,
    MESSAGE_DELIMITERS,
    SERVING_LOG_KEYS,
    TEXT_DELIMITERS,
)

TOPICS = ("serving", "gateway", "platform", "edge")
# Topics whose lines are JSON objects with the keys of stacks/logschema.py.
KEYED_TOPICS = {"serving": SERVING_LOG_KEYS, "gateway": ACCESS_LOG_KEYS}
ANALYSED = {"gateway": ACCESS_LOG_ANALYSED, "serving": ()}
TOPIC_DESCRIPTIONS = {
    "serving": "vLLM engine and API server, one JSON object per line",
    "gateway": "in-cluster Envoy Gateway access log, one JSON object per request",
    "platform": "platform controllers and cluster add-ons",
    "edge": "APIG edge access logs",
}
# input_type 1: Kubernetes container standard output (resource_volcengine_tls_rule.go).
CONTAINER_STDOUT = 1
# Where a JSON line does not parse (a traceback, a warning printed before logging is set
# up), it is kept under this key instead of being dropped.
UNPARSED_KEY = "raw"


# --------------------------------------------------------------------------- indexes


def topic_index(topic: str) -> dict:
    """The index of a topic: full text always (so any token, e.g. a request id inside a
    message, is searchable), plus typed keys where the lines are JSON objects."""
    spec: dict = {"full_text": {"case_sensitive": False, "delimiter": MESSAGE_DELIMITERS, "include_chinese": False}}
    keys = KEYED_TOPICS.get(topic)
    if keys:
        kv = []
        for key, value_type in keys.items():
            entry: dict = {"key": key, "value_type": value_type}
            if value_type == "text":
                delimiter = MESSAGE_DELIMITERS if key in FREE_TEXT_KEYS else TEXT_DELIMITERS
                entry.update(case_sensitive=False, delimiter=delimiter, include_chinese=False)
            if key in ANALYSED.get(topic, ()):
                entry["sql_flag"] = True  # aggregations (p99, error ratio) in TLS SQL
            kv.append(entry)
        spec["key_values"] = kv
    return spec


# --------------------------------------------------------------------------- collection rules


@dataclass(frozen=True)
class CollectionRule:
    """Which containers' stdout goes to a topic (a TLS Kubernetes collection rule)."""

    topic: str
    namespaces: tuple[str, ...]
    log_type: str  # json_log | minimalist_log
    include_pod_labels: dict[str, str] = field(default_factory=dict)
    exclude_pod_labels: dict[str, str] = field(default_factory=dict)
    container_name: str | None = None
    # pod label -> log tag, so a line says which release/track/role it came from
    label_tags: dict[str, str] = field(default_factory=dict)


_LITERAL = re.compile(r"^[A-Za-z0-9._-]+$")


def _exactly(*values: str) -> str:
    """A regex matching exactly these names (namespaces, label values: DNS-label
    characters, of which only '.' means something in a regex)."""
    for v in values:
        if not _LITERAL.match(v):
            raise ValueError(f"collection rule: {v!r} is not a name (expected letters, digits, '.', '_', '-')")
    return "^(" + "|".join(v.replace(".", r"\.") for v in values) + ")$"


def rule_inputs(rule: CollectionRule) -> dict:
    """The tls.Rule arguments of a collection rule (everything but rule name and topic)."""
    k8s: dict = {"namespace_name_regex": _exactly(*rule.namespaces)}
    if rule.include_pod_labels:
        k8s["include_pod_label_regex"] = {k: _exactly(v) for k, v in rule.include_pod_labels.items()}
    if rule.exclude_pod_labels:
        k8s["exclude_pod_label_regex"] = {k: _exactly(v) for k, v in rule.exclude_pod_labels.items()}
    if rule.label_tags:
        k8s["label_tag"] = dict(rule.label_tags)
    container: dict = {"stream": "all", "kubernetes_rule": k8s}
    if rule.container_name:
        container["container_name_regex"] = _exactly(rule.container_name)
    out: dict = {"input_type": CONTAINER_STDOUT, "log_type": rule.log_type, "container_rule": container}
    if rule.log_type == "json_log":
        out["extract_rule"] = {"un_match_up_load_switch": True, "un_match_log_key": UNPARSED_KEY}
    return out


def collection_rules(
    *,
    serving_namespace: str,
    release: str,
    entry_namespace: str,
    platform_namespaces: list[str],
    gateway_proxy_labels: dict[str, str],
) -> list[CollectionRule]:
    """The three container rules: serving pods, the gateway's proxies, everything else of
    the platform. `gateway_proxy_labels` are labels Envoy Gateway puts on our Gateway's
    proxy pods (workloads/edge/gateway.py proxy_selector)."""
    proxy_component = {"app.kubernetes.io/component": gateway_proxy_labels["app.kubernetes.io/component"]}
    return [
        CollectionRule(
            topic="serving", namespaces=(serving_namespace,), log_type="json_log",
            include_pod_labels={"app.kubernetes.io/instance": release},
            label_tags={"app.kubernetes.io/component": "component", "rollouts-pod-template-hash": "rollout_hash",
                        "deepseek-volc/role": "role"},
        ),
        CollectionRule(
            topic="gateway", namespaces=(entry_namespace,), log_type="json_log",
            include_pod_labels=dict(gateway_proxy_labels), container_name="envoy",
        ),
        CollectionRule(
            topic="platform",
            namespaces=tuple(dict.fromkeys(n for n in platform_namespaces if n != serving_namespace)),
            log_type="minimalist_log", exclude_pod_labels=proxy_component,
        ),
    ]


# --------------------------------------------------------------------------- components


@dataclass(frozen=True)
class LogStoreArgs:
    project_name: str
    region: str
    retention_days: int
    shard_count: int
    trace_instance_name: str | None  # None: no TLS trace instance
    trace_retention_days: int
    iam_project_name: str
    tags: dict[str, str]


class LogStore(pulumi.ComponentResource):
    project_id: pulumi.Output[str]
    topic_ids: dict[str, pulumi.Output[str]]
    trace_instance_id: pulumi.Output[str] | None
    trace_topic_id: pulumi.Output[str] | None

    def __init__(self, name: str, args: LogStoreArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:logging:LogStore", name, None, opts)
        project = volc.tls.Project(
            f"{name}-logs",
            project_name=args.project_name,
            region=args.region,
            description="DeepSeek serving: logs and traces of one stack",
            iam_project_name=args.iam_project_name,
            tags=tag_list(args.tags),
            opts=child(self),
        )
        self.topic_ids = {}
        for topic in TOPICS:
            t = volc.tls.Topic(
                f"{name}-topic-{topic}",
                project_id=project.id,
                topic_name=topic,
                description=TOPIC_DESCRIPTIONS[topic],
                ttl=args.retention_days,
                shard_count=args.shard_count,
                auto_split=True,
                max_split_shard=10,
                tags=tag_list(args.tags),
                opts=child(self),
            )
            volc.tls.Index(f"{name}-index-{topic}", topic_id=t.id, **topic_index(topic), opts=child(self))
            self.topic_ids[topic] = t.id

        self.trace_instance_id = None
        self.trace_topic_id = None
        if args.trace_instance_name:
            instance = volc.tls.TraceInstance(
                f"{name}-traces",
                project_id=project.id,
                trace_instance_name=args.trace_instance_name,
                description="spans of the gateway and vLLM, from the OpenTelemetry Collector",
                backend_config={"ttl": args.trace_retention_days},
                opts=child(self),
            )
            # The instance creates its own trace topic (docs 6470/349091); the resource does
            # not output its id, the data source does.
            found = volc.tls.get_trace_instances_output(trace_instance_id=instance.id, opts=pulumi.InvokeOptions(
                parent=self))
            self.trace_instance_id = instance.id
            self.trace_topic_id = found.trace_instances.apply(
                lambda xs: (xs[0].trace_topic_id or "") if xs else "")

        self.project_id = project.id
        self.register_outputs({"project_id": self.project_id, "topic_ids": self.topic_ids})


@dataclass(frozen=True)
class LogCollectionArgs:
    cluster_id: pulumi.Input[str]
    topic_ids: dict[str, pulumi.Input[str]]
    host_group_name: str
    host_identifier: str
    rules: list[CollectionRule]
    iam_project_name: str
    after: tuple[pulumi.Resource, ...] = ()  # the cluster, whose add-ons include log-collector


class LogCollection(pulumi.ComponentResource):
    def __init__(self, name: str, args: LogCollectionArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:logging:LogCollection", name, None, opts)
        # LogCollector runs on every node (a DaemonSet of the cluster's log-collector add-on,
        # one of its add-ons: the plan's add-ons, stacks/plan/build.py), reading container stdout there.
        # A machine group by identifier: nodes join it by the LogCollector's user-defined
        # label, so nodes the autoscaler adds are collected without listing IPs (docs
        # 6470/111826: machine-identifier groups are the recommended kind for Kubernetes).
        group = volc.tls.HostGroup(
            f"{name}-nodes",
            host_group_name=args.host_group_name,
            host_group_type="Label",
            host_identifier=args.host_identifier,
            auto_update=True,
            update_start_time="02:00",
            update_end_time="04:00",
            iam_project_name=args.iam_project_name,
            opts=child(self, depends_on=list(args.after)),
        )
        for rule in args.rules:
            r = volc.tls.Rule(
                f"{name}-rule-{rule.topic}",
                topic_id=args.topic_ids[rule.topic],
                rule_name=f"{rule.topic}-stdout",
                **rule_inputs(rule),
                opts=child(self),
            )
            volc.tls.RuleApplier(f"{name}-apply-{rule.topic}", host_group_id=group.id, rule_id=r.id, opts=child(self))
        self.register_outputs({})
