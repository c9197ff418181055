"""The settings model: the shipped stacks load, bad input is refused with the path of the
bad value and what was expected, and derived values follow the settings."""

from __future__ import annotations

import copy
import ipaddress

import pytest

from stacks import SettingsError, load, parse, read_raw
from stacks.regions import SUPPORTED_KUBERNETES_VERSIONS

STACKS = ["dev", "staging", "prod"]


def _set(doc: dict, path: str, value) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        doc = doc.setdefault(k, {}) if not k.isdigit() else doc[int(k)]
    last = keys[-1]
    if value is _DELETE:
        del doc[last]
    else:
        doc[last] = value


_DELETE = object()


def mutated(stack_: str, **changes) -> dict:
    raw = copy.deepcopy(read_raw(stack_))
    for path, value in changes.items():
        _set(raw, path.replace("__", "."), value)
    return raw


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_load(stack):
    s = load(stack)
    assert s.environment_class == stack and s.stack == stack
    assert s.serving_plan.fits


def test_stacks_differ_where_they_should():
    dev, staging, prod = (load(s) for s in STACKS)
    assert len(dev.zones) == 1 and len(staging.zones) >= 2 and len(prod.zones) >= 2
    assert prod.cluster.delete_protection and not prod.cluster.api_server_public
    assert not dev.cluster.delete_protection
    dev_gpu = dev.cluster.gpu_pools[dev.serving.gpu_pool].hardware()
    prod_gpu = prod.cluster.gpu_pools[prod.serving.gpu_pool].hardware()
    assert dev_gpu == ("A10", 1)
    assert prod_gpu[1] == 8


# (changes, path named in the error, words of the expectation)
BAD = [
    ({"colour": "blue"}, "colour", "unknown key"),
    ({"cluster__gpu_pools__a10__max_nodez": 3}, "cluster.gpu_pools.a10.max_nodez", "expected one of"),
    ({"network__vpc_cidr": "10.10.0.0/33"}, "network.vpc_cidr", "IPv4"),
    ({"network__vpc_cidr": "not-a-cidr"}, "network.vpc_cidr", "IPv4"),
    ({"network__vpc_cidr": "10.10.0.0/28"}, "network.vpc_cidr", "/8 and /24"),
    ({"network__subnets": {"cn-beijing-a": "192.168.0.0/24"}}, "network.subnets.cn-beijing-a", "outside"),
    ({"network__subnets": {"cn-beijing-b": "10.10.0.0/24"}}, "network.subnets", "one entry per stack zone"),
    ({"network__pod_subnets": {"cn-beijing-a": "10.10.0.0/24"}}, "network.subnets.cn-beijing-a", "overlaps"),
    ({"network__service_cidr": "10.10.200.0/24"}, "network.service_cidr", "overlaps"),
    ({"cluster__gpu_pools__a10__max_nodes": 0}, "cluster.gpu_pools.a10.max_nodes", "greater than or equal to 1"),
    ({"cluster__gpu_pools__a10__min_nodes": 3}, "cluster.gpu_pools.a10", "min_nodes (3) must be <= max_nodes (2)"),
    ({"cluster__gpu_pools__a10__desired_nodes": 5}, "cluster.gpu_pools.a10", "desired_nodes (5)"),
    ({"cluster__gpu_pools__a10__gpus_per_node": 0, "cluster__gpu_pools__a10__gpu": "A10"},
     "cluster.gpu_pools.a10.gpus_per_node", "greater than or equal to 1"),
    ({"cluster__gpu_pools__a10__gpu": "A10"}, "cluster.gpu_pools.a10", "gpu and gpus_per_node go together"),
    ({"cluster__gpu_pools__a10__instance_type": "ecs.unknown.large"}, "cluster.gpu_pools.a10.instance_type",
     "set gpu and gpus_per_node"),
    ({"cluster__gpu_pools__a10__gpu": "V100", "cluster__gpu_pools__a10__gpus_per_node": 1},
     "cluster.gpu_pools.a10.gpu", "expected one of"),
    ({"cluster__gpu_pools": {}}, "cluster.gpu_pools", "at least one GPU pool"),
    ({"cluster__gpu_pools__a10__zones": ["cn-beijing-c"]}, "cluster.gpu_pools.a10.zones[0]", "not a stack zone"),
    ({"zones": ["cn-beijing-z"]}, "zones[0]", "expected one of cn-beijing-a"),
    ({"zones": []}, "zones", "at least 1"),
    ({"region": "us-east-1"}, "region", "expected one of"),
    ({"cluster__kubernetes_version": "1.26"}, "cluster.kubernetes_version", "1.28, 1.30"),
    ({"cluster__system_pool__min_nodes": 4}, "cluster.system_pool", "must be <= max_nodes"),
    ({"environment_class": "qa"}, "environment_class", "'dev', 'staging' or 'prod'"),
    ({"environment": "dev"}, "environment", "renamed to environment_class"),
    ({"stack": "dev"}, "stack", "set from the stack's file name"),
    ({"policy_config": "policies/config/dev.yaml"}, "policy_config", "pattern"),
    ({"cluster__api_server_public": "sometimes"}, "cluster.api_server_public", "valid boolean"),
    ({"serving__gpu_pool": "h100"}, "serving.gpu_pool", "expected one of a10"),
    ({"serving__model": "deepseek-v9"}, "serving.model", "deepseek-r1"),
    ({"serving__image__tag": "latest"}, "serving.image", "'latest' is refused"),
    ({"serving__image": {}}, "serving.image", "unpinned image is refused"),
    ({"serving__engine__gpu_memory_utilization": 1.5}, "serving.engine.gpu_memory_utilization", "less than or equal to 0.98"),
    ({"serving__engine__max_model_len": 10_000_000}, "serving.engine", "does not fit"),
    ({"serving__engine__tensor_parallel_size": 3}, "serving.engine", "does not fit"),
    ({"serving__startup_timeout_seconds": 300}, "serving.startup_timeout_seconds", "greater than or equal to 1200"),
    ({"serving__drain_seconds": 200, "serving__termination_grace_seconds": 150}, "serving",
     "must exceed drain_seconds"),
    ({"weights__sse_algorithm": "kms"}, "weights.kms_key_id", "required"),
    ({"weights__bucket_name": "Bad_Bucket"}, "weights.bucket_name", "pattern"),
    ({"gateway__canary_weight": 120}, "gateway.canary_weight", "less than or equal to 100"),
    ({"rollout__steps": [5, 50, 90]}, "rollout.steps", "last step to be 100"),
    ({"rollout__steps": [50, 5, 100]}, "rollout.steps", "strictly increasing"),
    ({"autoscaling__min_replicas": 5, "autoscaling__max_replicas": 2}, "autoscaling", "must be <= max_replicas"),
    ({"serving__replicas": 3}, "cluster.gpu_pools.a10.max_nodes", "need 3 nodes"),
    ({"serving__rate_limits__requests": "many"}, "serving.rate_limits.requests", "valid integer"),
    ({"cluster": _DELETE}, "cluster", "required value is missing"),
    ({"monitoring__e2e_p99_seconds": 900}, "monitoring.e2e_p99_seconds", "below gateway.request_timeout_seconds"),
    ({"gateway__request_timeout_seconds": 300}, "monitoring.e2e_p99_seconds", "reasoning class default"),
    ({"monitoring__model_class": "poetry"}, "monitoring.model_class", "'chat' or 'reasoning'"),
    ({"monitoring__retention_days": 1}, "monitoring.retention_days", "greater than or equal to 2"),
    ({"network__endpoint_cidrs": ["tos"]}, "network.endpoint_cidrs.0", "IPv4"),
]


@pytest.mark.parametrize("changes,path,expected", BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_bad_input_names_path_and_expectation(changes, path, expected):
    raw = mutated("dev", **changes)
    with pytest.raises(SettingsError) as info:
        parse(raw, "dev", stack="dev")
    text = str(info.value)
    line = next((p for p in info.value.problems if p.startswith(path)), None)
    assert line is not None, f"no problem names {path!r}:\n{text}"
    assert expected in line, f"{expected!r} not in {line!r}"
    assert "Traceback" not in text


def test_all_problems_are_reported_at_once():
    raw = mutated("dev", colour="blue", gateway__canary_weight=500)
    with pytest.raises(SettingsError) as info:
        parse(raw, stack="dev")
    assert len(info.value.problems) == 2


def test_too_few_bad_inputs_would_fail_the_issue():
    assert len({b[1] + b[2] for b in BAD}) >= 25


def test_derived_subnets_follow_the_vpc():
    s = load("staging")
    vpc = ipaddress.IPv4Network(read_raw("staging")["network"]["vpc_cidr"])
    subnets = s.node_subnets()
    assert list(subnets) == s.zones
    assert all(c.subnet_of(vpc) for c in subnets.values())
    pods = s.pod_subnets()
    assert not any(a.overlaps(b) for a in subnets.values() for b in pods.values())


def test_planner_fills_unset_engine_sizes():
    raw = read_raw("staging")
    assert "max_num_seqs" not in raw["serving"]["engine"]
    s = load("staging")
    assert s.serving_plan.max_num_seqs >= 1
    assert s.serving_plan.tensor_parallel_size == raw["serving"]["engine"]["tensor_parallel_size"]
    assert s.serving_plan.max_model_len == raw["serving"]["engine"]["max_model_len"]


def test_infeasible_engine_is_refused_with_bytes():
    raw = mutated("dev", serving__engine__max_model_len=131072, serving__model="deepseek-r1-distill-qwen-14b",
                  serving__engine__tensor_parallel_size=1, serving__engine__pipeline_parallel_size=1)
    with pytest.raises(SettingsError) as info:
        parse(raw, stack="dev")
    msg = "\n".join(info.value.problems)
    assert "does not fit" in msg and "GiB" in msg


def test_supported_versions_are_the_only_ones_accepted():
    for v in SUPPORTED_KUBERNETES_VERSIONS:
        parse(mutated("dev", cluster__kubernetes_version=v), stack="dev")


def test_a_copied_stack_names_its_cloud_resources_after_itself():
    s = parse(read_raw("dev"), stack="mytest")
    dev = load("dev")
    assert s.stack == "mytest" and s.environment_class == "dev"
    assert s.cluster_name == "deepseek-mytest" != dev.cluster_name
    assert s.bucket_name == "deepseek-volc-mytest-weights" != dev.bucket_name
    assert s.registry_name == "deepseek-mytest" and s.resource_prefix == "deepseek-mytest"
    assert s.resource_tags()["stack"] == "mytest"
    assert s.policy_config_path == "policies/config/dev.json"


def test_the_policy_config_follows_the_class_unless_named():
    raw = mutated("dev", environment_class="prod")
    assert parse(raw, stack="mytest").policy_config_path == "policies/config/prod.json"
    raw["policy_config"] = "policies/config/staging.json"
    assert parse(raw, stack="mytest").policy_config_path == "policies/config/staging.json"


@pytest.mark.parametrize("name", ["My_Test", "-dev", "a" * 21, ""])
def test_a_stack_name_that_cannot_name_cloud_resources_is_refused(name):
    with pytest.raises(SettingsError) as info:
        parse(read_raw("dev"), stack=name)
    assert any(p.startswith(f"stack name {name!r}") and "DNS label" in p for p in info.value.problems)


def test_a_replica_spanning_nodes_is_refused_unless_multi_node_naming_a_pool_that_fits():
    # 14B in bf16 does not fit one 24 GB A10: the planner would pipeline it over 2 nodes.
    raw = mutated("dev", serving__model="deepseek-r1-distill-qwen-14b", serving__engine__max_model_len=8192)
    with pytest.raises(SettingsError) as info:
        parse(raw, stack="dev")
    (line,) = [p for p in info.value.problems if p.startswith("serving.multi_node")]
    assert "needs 2 nodes of A10 x 1" in line and "set serving.multi_node: true" in line
    # no catalogued instance type holds it, so the smallest GPU shape by total memory is named:
    # one A100-40G (40,960 MiB) holds the 27.6 GiB of weights and an 8k context, and is
    # smaller than two A10s (46,056 MiB) or one L20 (46,068 MiB)
    assert "smallest pool on which it fits on one node is A100-40G x 1: TP1" in line
    assert "state gpu: A100-40G and gpus_per_node: 1" in line
    raw["serving"]["multi_node"] = True
    s = parse(raw, stack="dev")
    assert s.serving_plan.nodes == 2 and s.serving_plan.pipeline_parallel_size == 2


def test_prod_states_that_its_replicas_span_nodes():
    raw = mutated("prod", serving__multi_node=False)
    with pytest.raises(SettingsError) as info:
        parse(raw, stack="prod")
    assert any(p.startswith("serving.multi_node: one replica of deepseek-r1 needs 2 nodes of H20 x 8")
               for p in info.value.problems)
