"""The settings model and its plan: the shipped stacks load, bad input is refused with the
path of the bad value and what was expected, and derived values follow the settings."""

from __future__ import annotations

import copy
import ipaddress

import pytest

from stacks import SettingsError, load, load_plan, parse, parse_plan, read_raw, stack_file
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
    p = load_plan(stack)
    assert p.settings.environment_class == stack and p.settings.stack == stack
    assert p.serving.engine.fits


def test_stacks_differ_where_they_should():
    dev, staging, prod = (load(s) for s in STACKS)
    dev_plan, prod_plan = load_plan("dev"), load_plan("prod")
    assert len(dev.zones) == 1 and len(staging.zones) >= 2 and len(prod.zones) >= 2
    assert prod.cluster.delete_protection and not prod.cluster.api_server_public
    assert not dev.cluster.delete_protection
    dev_pool, prod_pool = dev_plan.pools[dev.serving.gpu_pool], prod_plan.pools[prod.serving.gpu_pool]
    assert (dev_pool.gpu, dev_pool.gpus_per_node) == ("A10", 1)
    assert prod_pool.gpus_per_node == 8


# (changes, path named in the error, words of the expectation)
BAD = [
    ({"colour": "blue"}, "colour", "unknown key"),
    ({"cluster__gpu_pools__a10__max_nodez": 3}, "cluster.gpu_pools.a10.max_nodez", "expected one of"),
    ({"network__vpc_cidr": "10.10.0.0/33"}, "network.vpc_cidr", "IPv4"),
    ({"network__vpc_cidr": "not-a-cidr"}, "network.vpc_cidr", "IPv4"),
    ({"network__vpc_cidr": "10.10.0.0/28"}, "network.vpc_cidr", "accepted masks are /8 to /24"),
    ({"network__subnets": {"cn-beijing-a": "192.168.0.0/24"}}, "network.subnets.cn-beijing-a", "outside"),
    ({"network__subnets": {"cn-beijing-b": "10.10.0.0/24"}}, "network.subnets", "one entry per stack zone"),
    ({"network__pod_subnets": {"cn-beijing-a": "10.10.0.0/24"}}, "network.subnets.cn-beijing-a", "overlaps"),
    ({"network__service_cidr": "10.10.200.0/24"}, "network.service_cidr", "overlaps"),
    ({"cluster__gpu_pools__a10__max_nodes": 0}, "cluster.gpu_pools.a10.max_nodes", "greater than or equal to 1"),
    ({"cluster__gpu_pools__a10__min_nodes": 4}, "cluster.gpu_pools.a10", "min_nodes (4) must be <= max_nodes (3)"),
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
    ({"serving__engine__awq_kernel": "dsvolc"}, "serving.engine", "expected quantization: awq"),
    ({"serving__engine__awq_kernel": "dsvolc", "serving__engine__quantization": "awq", "serving__engine__kernels": False},
     "serving.engine", "needs kernels: true"),
    ({"serving__engine__awq_kernel": "marlin"}, "serving.engine.awq_kernel", "'vllm' or 'dsvolc'"),
    ({"serving__startup_timeout_seconds": 300}, "serving.startup_timeout_seconds", "greater than or equal to 1200"),
    ({"serving__drain_seconds": 200, "serving__termination_grace_seconds": 150},
     "serving.termination_grace_seconds", "expected at least 800"),
    ({"serving__termination_grace_seconds": 300}, "serving.termination_grace_seconds",
     "+ serving.inflight_drain_seconds (600) = 620 s"),
    ({"serving__drain_seconds": 0}, "serving.drain_seconds", "greater than or equal to 5"),
    ({"serving__weights_sync_connections": 0}, "serving.weights_sync_connections", "greater than or equal to 1"),
    ({"serving__weights_sync_mib_per_s": 1}, "serving.weights_sync_mib_per_s", "greater than or equal to 10"),
    ({"gateway__canary_weight": 10}, "gateway.canary_weight", "Argo Rollouts owns the canary split"),
    ({"autoscaling__max_replicas": 3}, "autoscaling.max_replicas", "pool a10 holds 3 at max_nodes 3"),
    ({"autoscaling__enabled": False, "serving__replicas": 3}, "serving.replicas", "need room for 4 replicas"),
    ({"autoscaling__kv_cache_usage": 1.5}, "autoscaling.kv_cache_usage", "less than or equal to 1"),
    ({"autoscaling__gpu_utilization_percent": 90}, "autoscaling.gpu_utilization_percent", "unknown key"),
    ({"rollout__max_surge": -1}, "rollout.max_surge", "greater than or equal to 0"),
    ({"rollout__partition": 1}, "rollout.partition", "multi-node replicas"),
    ({"serving__engine__parallelism": "ep"}, "serving.engine.parallelism", "'auto', 'tp_pp', 'tp_ep' or 'dp_ep'"),
    ({"serving__engine__parallelism": "dp_ep"}, "serving.engine", "is dense"),
    ({"serving__engine__data_parallel_size": 2}, "serving.engine", "data_parallel_size: 2 needs parallelism"),
    ({"serving__engine__speculative_tokens": 1}, "serving.engine", "ships no MTP module"),
    ({"serving__engine__speculative_tokens": 9}, "serving.engine.speculative_tokens", "less than or equal to 4"),
    ({"weights__sse_algorithm": "kms"}, "weights.kms_key_id", "required"),
    ({"weights__bucket_name": "Bad_Bucket"}, "weights.bucket_name", "expected 3-57 lower-case letters"),
    # names the stack derives cloud names from, held to the API's rules (stacks/names.py)
    ({"weights__bucket_name": "b" * 58}, "weights.bucket_name", "the IAM role <bucket>-reader must fit IAM's 64"),
    ({"cluster__name": "a" * 41}, "cluster.name", "expected 2-40 lower-case letters"),
    ({"cluster__name": "1st-cluster"}, "cluster.name", "starting with a letter"),
    ({"cluster__name": "c"}, "cluster.name", "expected 2-40"),
    ({"registry__name": "r" * 31}, "registry.name", "expected 3-30 lower-case letters"),
    ({"registry__name": "9registry"}, "registry.name", "starting with a letter"),
    ({"registry__namespace": "a--b"}, "registry.namespace", "with single - between them"),
    ({"registry__mirror_namespace": "m"}, "registry.mirror_namespace", "expected 2-40"),
    ({"gateway__canary_weight": 120}, "gateway.canary_weight", "less than or equal to 100"),
    ({"rollout__steps": [5, 50, 90]}, "rollout.steps", "last step to be 100"),
    ({"rollout__steps": [50, 5, 100]}, "rollout.steps", "strictly increasing"),
    ({"autoscaling__min_replicas": 5, "autoscaling__max_replicas": 2}, "autoscaling", "must be <= max_replicas"),
    ({"serving__replicas": 4, "autoscaling__max_replicas": 4}, "cluster.gpu_pools.a10.max_nodes", "need 4 nodes"),
    ({"serving__rate_limits__requests": "many"}, "serving.rate_limits.requests", "valid integer"),
    ({"observability__tracing__sampling_percent": 150}, "observability.tracing.sampling_percent",
     "less than or equal to 100"),
    ({"observability__tracing__backend": "jaeger"}, "observability.tracing.backend", "'tls' or 'apmplus'"),
    ({"observability__tracing__detailed": "everything"}, "observability.tracing.detailed", "'worker' or 'all'"),
    ({"observability__tracing__endpoint": "http://collector:4318"}, "observability.tracing.endpoint", "pattern"),
    ({"observability__tracing__enabled": False, "observability__tracing__detailed": "all"}, "observability",
     "tracing.detailed: needs tracing.enabled"),
    ({"observability__logs__retention_days": 0}, "observability.logs.retention_days", "greater than or equal to 1"),
    ({"observability__logs__shard_count": 20}, "observability.logs.shard_count", "less than or equal to 10"),
    ({"observability__logs__request_log__promtps": True}, "observability.logs.request_log.promtps", "expected one of"),
    ({"cluster": _DELETE}, "cluster", "required value is missing"),
    # values that reach a constrained provider argument: the provider contract's values
    ({"cluster__gpu_pools__a10__data_disk_type": "ESSD_PL2"}, "cluster.gpu_pools.a10.data_disk_type",
     "'PTSSD', 'ESSD_PL0' or 'ESSD_FlexPL'"),
    ({"cluster__gpu_pools__a10__topology_manager_policy": "nearest"},
     "cluster.gpu_pools.a10.topology_manager_policy", "'none', 'restricted', 'best-effort' or 'single-numa-node'"),
    ({"network__nat_spec": "Extra_Large_1"}, "network.nat_spec", "'Small', 'Medium' or 'Large'"),
    ({"network__vpc_cidr": "100.64.0.0/16"}, "network.vpc_cidr", "outside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16"),
    ({"cluster__pod_network_mode": "Calico"}, "cluster.pod_network_mode", "'Flannel' or 'VpcCniShared'"),
    ({"weights__sse_algorithm": "DES"}, "weights.sse_algorithm", "'kms', 'AES256' or 'SM4'"),
    ({"weights__sse_algorithm": "kms", "weights__kms_key_id": "my-key"}, "weights.kms_key_id",
     "trn:kms:<region>:<accountID>:keyrings/<keyring>/keys/<key>"),
    ({"gateway__instance_spec": "16c32g"}, "gateway.instance_spec", "'1c2g', '2c4g', '4c8g' or '8c16g'"),
    ({"cluster__gpu_pools__a10__instance_type": "gni2.3xlarge"}, "cluster.gpu_pools.a10.instance_type", "pattern"),
    ({"cluster__system_pool__instance_type": "ecs.G3i"}, "cluster.system_pool.instance_type", "pattern"),
    ({"cluster__gpu_pools__a10__instance_type": "ecs.gni3cl.45xlarge"}, "cluster.gpu_pools.a10.instance_type",
     "GPU count is unconfirmed; set gpu and gpus_per_node"),
    # node pools as VKE accepts them
    ({"cluster__gpu_pools__a10__instance_type": "ecs.hpcpni2.28xlarge"}, "cluster.gpu_pools.a10.zones",
     "single-zone HPC cluster; expected exactly one of cn-beijing-a, got every stack zone"),
    ({"cluster__gpu_pools__a10__hpc_cluster_id": "hpcCluster-1"}, "cluster.gpu_pools.a10.hpc_cluster_id",
     "not an HPC instance type"),
    ({"cluster__addon_versions": {"karpenter": "v1.0"}}, "cluster.addon_versions",
     "not an add-on the stack installs; expected one of cluster-autoscaler"),
    ({"cluster__gpu_pools__a10__mig": {"profile": "1g.10gb"}}, "cluster.gpu_pools.a10.mig.profile",
     "A10 has no MIG"),
    ({"cluster__gpu_pools__a10__mig": {"profile": "tiny"}}, "cluster.gpu_pools.a10.mig.profile", "pattern"),
    ({"cluster__gpu_pools__a10__auto_repair__remedy_policy_id": "no spaces"},
     "cluster.gpu_pools.a10.auto_repair.remedy_policy_id", "pattern"),
    # the edge as APIG accepts it
    ({"zones": ["cn-beijing-a", "cn-beijing-b", "cn-beijing-c"],
      "gateway__zones": ["cn-beijing-a", "cn-beijing-b", "cn-beijing-c"]}, "gateway.zones", "at most 2"),
    ({"gateway__zones": ["cn-beijing-b"]}, "gateway.zones[0]", "not a stack zone"),
    ({"gateway__replicas": 1}, "gateway.replicas", "greater than or equal to 2"),
    ({"gateway__public_bandwidth_mbps": 600}, "gateway.public_bandwidth_mbps", "less than or equal to 500"),
    ({"gateway__tls": _DELETE}, "gateway.tls", "HTTPS only"),
    ({"gateway__tls__domain": "API.Example"}, "gateway.tls.domain", "pattern"),
    ({"gateway__tls__plain_http": "open"}, "gateway.tls.plain_http", "'closed' or 'redirect'"),
    ({"gateway__retry__http_codes": [404]}, "gateway.retry.http_codes", "5xx status codes"),
    ({"gateway__retry__retry_on": ["timeout"]}, "gateway.retry.retry_on.0", "connect-failure"),
    ({"gateway__retry__retry_on": ["connect-failure", "reset"]}, "gateway.retry.retry_on",
     "may fire after the request reached an engine"),
    ({"gateway__retry__per_try_timeout_seconds": 900}, "gateway.retry.per_try_timeout_seconds",
     "exceeds request_timeout_seconds"),
    # pulls and metrics
    ({"registry__pull_credentials": "image-pull-secret"}, "registry.image_pull_secret", "required"),
    ({"registry__pull_credentials": "anonymous"}, "registry.pull_credentials", "cr-credential-controller"),
    ({"observability__vmp_enabled": True, "monitoring__enabled": False}, "observability.vmp_enabled",
     "remote write"),
    ({"monitoring__e2e_p99_seconds": 900}, "monitoring.e2e_p99_seconds", "below gateway.request_timeout_seconds"),
    ({"gateway__request_timeout_seconds": 300}, "monitoring.e2e_p99_seconds", "reasoning class default"),
    ({"monitoring__model_class": "poetry"}, "monitoring.model_class", "'chat' or 'reasoning'"),
    ({"monitoring__retention_days": 1}, "monitoring.retention_days", "greater than or equal to 2"),
    ({"monitoring__dcgm_profiling_metrics": "sometimes"}, "monitoring.dcgm_profiling_metrics", "valid boolean"),
    ({"network__endpoint_cidrs": ["tos"]}, "network.endpoint_cidrs.0", "IPv4"),
    # every CIDR inside what VolcEngine accepts (provider contract: ranges, masks, documentation)
    ({"network__vpc_cidr": "8.8.0.0/16"}, "network.vpc_cidr", "outside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16"),
    ({"network__subnets": {"cn-beijing-a": "10.10.0.0/30"}}, "network.subnets.cn-beijing-a",
     "accepted masks are /8 to /29"),
    ({"network__pod_subnets": {"cn-beijing-a": "100.64.0.0/24"}}, "network.pod_subnets.cn-beijing-a",
     "outside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16"),
    ({"network__service_cidr": "8.8.0.0/16"}, "network.service_cidr",
     "outside 10.0.0.0/12, 172.16.0.0/12, 192.168.0.0/16"),
    ({"network__service_cidr": "172.16.0.0/12"}, "network.service_cidr", "accepted masks are /16 to /24"),
    ({"network__flannel_pod_cidr": "10.100.0.0/16"}, "network.flannel_pod_cidr",
     "VKE Flannel pod CIDR accepts (https://docs.byteplus.com/en/docs/vke/Container-networks)"),
    # egress per zone, one shared NAT for dev only
    ({"environment_class": "staging", "network__nat": "shared"}, "network.nat", "for dev-class stacks"),
    ({"zones": ["cn-beijing-a", "cn-beijing-b", "cn-beijing-c", "cn-beijing-d"], "network__nat": "per_zone"},
     "network.nat", "at most 3 Internet NAT gateways"),
    ({"network__nat": "regional"}, "network.nat", "'per_zone' or 'shared'"),
    # the deploy kubeconfig: short-lived, rotated before it runs out
    ({"cluster__deploy_kubeconfig": {"valid_hours": 24}}, "cluster.deploy_kubeconfig.valid_hours",
     "at least rotate_hours + 12 (36)"),
    ({"cluster__deploy_kubeconfig": {"valid_hours": 50000}}, "cluster.deploy_kubeconfig.valid_hours",
     "less than or equal to 43800"),
    ({"cluster__deploy_kubeconfig": {"rotate_hours": 0}}, "cluster.deploy_kubeconfig.rotate_hours",
     "greater than or equal to 1"),
    # a version YAML read as a number, a CIDR with host bits: said as such, not as a type error
    ({"cluster__kubernetes_version": 1.3}, "cluster.kubernetes_version",
     "1.3 was read as a number; quote it as written (YAML reads an unquoted 1.30 as 1.3)"),
    ({"serving__image__tag": 0.32}, "serving.image.tag", "was read as a number; quote it"),
    ({"cluster__ssh_key_pair": True}, "cluster.ssh_key_pair", "true was read as a boolean; quote it as written"),
    ({"network__vpc_cidr": "10.10.0.1/16"}, "network.vpc_cidr",
     "10.10.0.1/16 has host bits set; did you mean 10.10.0.0/16?"),
    ({"network__subnets": {"cn-beijing-a": "10.10.3.0/20"}}, "network.subnets.cn-beijing-a",
     "10.10.3.0/20 has host bits set; did you mean 10.10.0.0/20?"),
    ({"network__service_cidr": "172.30.0.9/18"}, "network.service_cidr", "did you mean 172.30.0.0/18?"),
    # a typo names the closest known value
    ({"cluster__gpu_pools__a10__instance_type": "ecs.gni2.3xlarg"}, "cluster.gpu_pools.a10.instance_type",
     "is not in the GPU instance catalog (did you mean ecs.gni2.3xlarge?); set gpu and gpus_per_node"),
    ({"cluster__gpu_pools__a10__instance_type": "ecs.hpcpni3l.45xlarge"}, "cluster.gpu_pools.a10.instance_type",
     "did you mean ecs.hpcpni3ln.45xlarge?"),
    ({"cluster__gpu_pools__a10__gpu": "A1O", "cluster__gpu_pools__a10__gpus_per_node": 1},
     "cluster.gpu_pools.a10.gpu", "did you mean A10?"),
    ({"serving__model": "deepseek-r1-distil-qwen-7b"}, "serving.model", "did you mean deepseek-r1-distill-qwen-7b?"),
    ({"serving__gpu_pool": "a01"}, "serving.gpu_pool", "is not a GPU pool; expected one of a10; did you mean a10?"),
    ({"region": "cn-beijng"}, "region", "got 'cn-beijng'; did you mean cn-beijing?"),
    ({"zones": ["cn-bejing-a"]}, "zones[0]", "did you mean cn-beijing-a?"),
    ({"region": "CN-Beijing"}, "region", "did you mean cn-beijing?"),
    ({"cluster__gpu_pools__a10__max_nodez": 3}, "cluster.gpu_pools.a10.max_nodez", "did you mean max_nodes?"),
]


@pytest.mark.parametrize("changes,path,expected", BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_bad_input_names_path_and_expectation(changes, path, expected):
    raw = mutated("dev", **changes)
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, "dev", stack="dev")
    text = str(info.value)
    line = next((p for p in info.value.problems if p.startswith(path)), None)
    assert line is not None, f"no problem names {path!r}:\n{text}"
    assert expected in line, f"{expected!r} not in {line!r}"
    assert "Traceback" not in text


def test_all_problems_are_reported_at_once():
    raw = mutated("dev", colour="blue", gateway__canary_weight=500)
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="dev")
    assert len(info.value.problems) == 2


def test_a_gpu_pool_name_too_long_for_its_node_pool_is_refused():
    raw = mutated("dev")
    raw["cluster"]["gpu_pools"]["p" * 24] = raw["cluster"]["gpu_pools"].pop("a10")
    raw["serving"]["gpu_pool"] = "p" * 24
    with pytest.raises(SettingsError) as info:
        parse(raw, stack="dev")
    (line,) = [p for p in info.value.problems if p.startswith("cluster.gpu_pools.")]
    assert "expected 1-23 lower-case letters" in line and "fits VKE's 64 characters" in line


def test_too_few_bad_inputs_would_fail_the_issue():
    assert len({b[1] + b[2] for b in BAD}) >= 25


def test_nat_per_zone_except_for_dev():
    dev, staging, prod = (load_plan(s) for s in STACKS)
    assert dev.settings.network.nat is None and dev.network.nat_mode == "shared"
    assert dev.network.nat_zones == tuple(dev.settings.zones[:1])
    assert staging.network.nat_mode == prod.network.nat_mode == "per_zone"
    assert prod.network.nat_zones == tuple(prod.settings.zones) and len(prod.settings.zones) == 3
    # a dev stack may ask for per-zone egress
    assert parse_plan(mutated("dev", network__nat="per_zone"), "dev", stack="dev").network.nat_zones == ("cn-beijing-a",)


def test_every_shipped_cidr_is_one_volcengine_accepts():
    """The shipped values of every CIDR setting pass the ranges they are held to."""
    from stacks import contract

    c = contract.load()
    for stack in STACKS:
        p = load_plan(stack)
        s = p.settings
        assert not c.problems("volcengine:vpc/vpc:Vpc", "cidrBlock", str(s.network.vpc_cidr))
        for cidr in [*p.network.node_subnets.values(), *p.network.pod_subnets.values()]:
            assert not c.problems("volcengine:vpc/subnet:Subnet", "cidrBlock", str(cidr))
        assert not c.problems("volcengine:vke/cluster:Cluster", "servicesConfig.serviceCidrsv4s",
                              [str(s.network.service_cidr)])
        assert not c.problems("volcengine:vke/cluster:Cluster", "podsConfig.flannelConfig.podCidrs",
                              [str(s.network.flannel_pod_cidr)])


def test_derived_subnets_follow_the_vpc():
    p = load_plan("staging")
    vpc = ipaddress.IPv4Network(read_raw("staging")["network"]["vpc_cidr"])
    subnets = p.network.node_subnets
    assert list(subnets) == p.settings.zones
    assert all(c.subnet_of(vpc) for c in subnets.values())
    pods = p.network.pod_subnets
    assert pods and list(pods) == p.settings.zones
    assert not any(a.overlaps(b) for a in subnets.values() for b in pods.values())


def test_planner_fills_unset_engine_sizes():
    raw = read_raw("staging")
    assert "max_num_seqs" not in raw["serving"]["engine"]
    engine = load_plan("staging").serving.engine
    assert engine.max_num_seqs >= 1
    assert engine.tensor_parallel_size == raw["serving"]["engine"]["tensor_parallel_size"]
    assert engine.max_model_len == raw["serving"]["engine"]["max_model_len"]


def test_infeasible_engine_is_refused_with_bytes():
    raw = mutated("dev", serving__engine__max_model_len=131072, serving__model="deepseek-r1-distill-qwen-14b",
                  serving__engine__tensor_parallel_size=1, serving__engine__pipeline_parallel_size=1)
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="dev")
    msg = "\n".join(info.value.problems)
    assert "does not fit" in msg and "GiB" in msg


def test_supported_versions_are_the_only_ones_accepted():
    for v in SUPPORTED_KUBERNETES_VERSIONS:
        parse_plan(mutated("dev", cluster__kubernetes_version=v), stack="dev")


def test_a_copied_stack_names_its_cloud_resources_after_itself():
    p = parse_plan(read_raw("dev"), stack="mytest")
    dev = load_plan("dev").names
    assert p.settings.stack == "mytest" and p.settings.environment_class == "dev"
    assert p.names.cluster == "deepseek-mytest" != dev.cluster
    assert p.names.bucket == "deepseek-volc-mytest-weights" != dev.bucket
    assert p.names.registry == "deepseek-mytest" and p.names.prefix == "deepseek-mytest"
    assert p.tags["stack"] == "mytest"
    assert p.policy_config == "policies/config/dev.json"


def test_the_policy_config_follows_the_class_unless_named():
    raw = mutated("dev", environment_class="prod")
    assert parse_plan(raw, stack="mytest").policy_config == "policies/config/prod.json"
    raw["policy_config"] = "policies/config/staging.json"
    assert parse_plan(raw, stack="mytest").policy_config == "policies/config/staging.json"


@pytest.mark.parametrize("name", ["My_Test", "-dev", "a" * 21, ""])
def test_a_stack_name_that_cannot_name_cloud_resources_is_refused(name):
    with pytest.raises(SettingsError) as info:
        parse_plan(read_raw("dev"), stack=name)
    assert any(p.startswith(f"stack name {name!r}") and "DNS label" in p for p in info.value.problems)


def test_a_replica_spanning_nodes_is_refused_unless_multi_node_naming_a_pool_that_fits():
    # 14B in bf16 does not fit one 24 GB A10: the planner would pipeline it over 2 nodes.
    raw = mutated("dev", serving__model="deepseek-r1-distill-qwen-14b", serving__engine__max_model_len=8192)
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="dev")
    # the A10 pool has no RDMA: pipeline stages across its nodes are refused, multi_node or not
    (line,) = [p for p in info.value.problems if p.startswith("cluster.gpu_pools.a10.instance_type")]
    assert "needs 2 nodes of A10 x 1" in line and "needs RDMA" in line and "ecs.gni2.3xlarge" in line
    # catalogued instance types come first (they can be ordered as they are): one A100 80 GB
    # of ecs.pni2.3xlarge holds the 27.6 GiB of weights and an 8k context
    assert "smallest pool on which it fits on one node is A100-80G x 1 (ecs.pni2.3xlarge): TP1" in line
    assert "not in the catalog" not in line
    raw["serving"]["multi_node"] = True
    # one two-node group fills the 3-node pool; updates replace it in place (no surge)
    raw["autoscaling"] = {"max_replicas": 1}
    raw["rollout"] = {"max_surge": 0}
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="dev")
    assert "needs RDMA" in str(info.value)
    # on nodes with RDMA (the H20 pool of prod, 1 GPU per replica stated), not multi_node: named
    raw = mutated("prod", serving__multi_node=False, serving__model="deepseek-r1-distill-llama-70b",
                  serving__engine={"tensor_parallel_size": 8, "pipeline_parallel_size": 2,
                                   "max_model_len": 8192})
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="prod")
    (line,) = [p for p in info.value.problems if p.startswith("serving.multi_node")]
    assert "needs 2 nodes of H20 x 8" in line and "set serving.multi_node: true" in line


def test_prod_states_that_its_replicas_span_nodes():
    raw = mutated("prod", serving__multi_node=False)
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="prod")
    (line,) = [p for p in info.value.problems if p.startswith("serving.multi_node")]
    assert line.startswith("serving.multi_node: one replica of deepseek-r1 needs 2 nodes of H20 x 8")
    # with less KV cache one H20 x 8 node holds it: the catalogued type is named
    assert "smallest pool on which it fits on one node is H20 x 8 (ecs.ebmhpcpni3l.48xlarge): TP8" in line


def test_a_zone_of_the_table_is_accepted_with_its_source():
    from stacks.regions import zone_source

    raw = mutated("dev", zones=["cn-beijing-e"])
    assert parse(raw, "dev", stack="dev").zones == ["cn-beijing-e"]
    assert "volcengine.com/docs/6534/1131814" in zone_source("cn-beijing-e")
    assert "volcengine.com/docs/6460/79643" in zone_source("cn-beijing-a")  # VKE's zone guide
    assert zone_source("cn-beijing-z") is None


# --------------------------------------------------------------------------- what the YAML text says


def _dev_text(*edits: tuple[str, str]) -> str:
    """The shipped dev stack file with `old -> new` line edits (each old line must exist once)."""
    text = stack_file("dev").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _line_of(text: str, fragment: str, nth: int = 0) -> int:
    return [i for i, line in enumerate(text.splitlines(), 1) if fragment in line][nth]


def _load_text(tmp_path, text: str):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(text)
    return load(str(path))


def test_a_duplicate_key_is_refused_naming_both_lines(tmp_path):
    # today YAML keeps the last one silently: the stack would get a public API server
    text = _dev_text(("      irsa: true\n", "      irsa: true\n      api_server_public: true\n"))
    first, second = _line_of(text, "api_server_public"), _line_of(text, "api_server_public", 1)
    with pytest.raises(SettingsError) as info:
        _load_text(tmp_path, text)
    assert info.value.problems == [
        f"cluster.api_server_public: given twice, on line {first} and again on line {second}; "
        "YAML would keep the last silently: keep one"]


def test_every_duplicate_key_is_named_with_its_path(tmp_path):
    text = _dev_text(("          max_nodes: 3\n", "          max_nodes: 3\n          max_nodes: 30\n"),
                     ("    region: cn-beijing\n", "    region: cn-beijing\n    region: cn-shanghai\n"))
    with pytest.raises(SettingsError) as info:
        _load_text(tmp_path, text)
    paths = [p.split(":", 1)[0] for p in info.value.problems]
    assert paths == ["region", "cluster.gpu_pools.a10.max_nodes"]
    pool = info.value.problems[1]
    assert f"line {_line_of(text, 'max_nodes: 3')} and again on line {_line_of(text, 'max_nodes: 30')}" in pool


@pytest.mark.parametrize("written,read", [("1.30", "1.3"), ("1.32", "1.32")])
def test_an_unquoted_version_is_refused_with_quote_it(tmp_path, written, read):
    text = _dev_text(('      kubernetes_version: "1.32"\n', f"      kubernetes_version: {written}\n"))
    with pytest.raises(SettingsError) as info:
        _load_text(tmp_path, text)
    shown = f"{read} was read as a number from {written}" if read != written else f"{read} was read as a number"
    assert info.value.problems == [f'cluster.kubernetes_version: {shown}; quote it: "{written}"']


def test_a_word_yaml_reads_as_a_boolean_is_quoted_as_written(tmp_path):
    text = _dev_text(("      prefix: models\n", "      prefix: no\n"))
    with pytest.raises(SettingsError) as info:
        _load_text(tmp_path, text)
    assert info.value.problems == ['weights.prefix: false was read as a boolean from no; quote it: "no"']


def test_a_cidr_with_host_bits_in_the_file_says_so(tmp_path):
    text = _dev_text(("      vpc_cidr: 10.10.0.0/16\n", "      vpc_cidr: 10.10.0.1/16\n"))
    with pytest.raises(SettingsError) as info:
        _load_text(tmp_path, text)
    assert info.value.problems == ["network.vpc_cidr: 10.10.0.1/16 has host bits set; did you mean 10.10.0.0/16?"]


@pytest.mark.parametrize("changes,path", [
    ({"cluster__gpu_pools__a10__instance_type": "ecs.unknown.large"}, "cluster.gpu_pools.a10.instance_type"),
    ({"serving__model": "gpt-5"}, "serving.model"),
    ({"region": "us-east-1"}, "region"),
    ({"colour": "blue"}, "colour"),
])
def test_nothing_close_suggests_nothing(changes, path):
    with pytest.raises(SettingsError) as info:
        parse_plan(mutated("dev", **changes), "dev", stack="dev")
    (line,) = [p for p in info.value.problems if p.startswith(path)]
    assert "did you mean" not in line


# -- where instance types are sold (stacks.regions.refuse_unsold) ----------------------------

def _placed(stack_: str, pool: str, region: str, zones: list[str]) -> dict:
    return mutated(stack_, region=region, zones=zones,
                   **{f"cluster__gpu_pools__{pool}__zones": zones[:1]})


@pytest.mark.parametrize("stack_,pool,region,zones,seen", [
    # H20 (hpcpni3ln) is seen only in cn-beijing; A100 (hpcpni2) only in cn-shanghai
    ("prod", "h20", "ap-southeast-1", ["ap-southeast-1a", "ap-southeast-1b"], "seen in cn-beijing (cn-beijing-e)"),
    ("staging", "a100", "cn-hongkong", ["cn-hongkong-a", "cn-hongkong-b"], "seen in cn-shanghai (cn-shanghai-a)"),
])
def test_a_pool_where_no_source_shows_its_type_is_warned_with_where_it_is_seen(stack_, pool, region, zones, seen):
    from stacks.regions import PlacementWarning

    with pytest.warns(PlacementWarning) as caught:
        parse_plan(_placed(stack_, pool, region, zones), stack_, stack=stack_)
    text = " ".join(str(w.message) for w in caught if issubclass(w.category, PlacementWarning))
    assert text.startswith(f"cluster.gpu_pools.{pool}.instance_type: no source shows")
    assert region in text and seen in text


def test_a_pool_where_its_type_is_seen_is_not_warned():
    import warnings

    from stacks.regions import PlacementWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacementWarning)
        load("prod")  # ecs.hpcpni3ln.45xlarge in cn-beijing: seen there


def test_a_type_a_source_says_is_not_sold_in_the_region_is_refused(monkeypatch):
    from stacks import regions

    monkeypatch.setitem(regions.NOT_SOLD, ("ecs.hpcpni3ln.45xlarge", "ap-southeast-1"), "a test source")
    with pytest.raises(SettingsError) as info:
        parse_plan(_placed("prod", "h20", "ap-southeast-1", ["ap-southeast-1a", "ap-southeast-1b"]), "prod", stack="prod")
    line = next(p for p in info.value.problems if p.startswith("cluster.gpu_pools.h20.instance_type"))
    assert "is not sold in ap-southeast-1 (a test source)" in line
    assert "expected a region where it is sold: seen in cn-beijing (cn-beijing-e)" in line


def test_every_sighting_names_a_known_region_zone_and_source():
    from capacity.instances import INSTANCE_CATALOG
    from stacks.regions import REGION_ZONES, where_sold

    seen = {t: where_sold(t) for t in INSTANCE_CATALOG}
    assert where_sold("ecs.unknown.large") is None
    assert seen["ecs.hpcpni3ln.45xlarge"][0].region == "cn-beijing"
    for sightings in seen.values():
        for s in sightings:
            assert s.region in REGION_ZONES and set(s.zones) <= set(REGION_ZONES[s.region])
            assert "file id" in s.source and s.read == "2026-12-01"


def test_the_availability_table_in_the_docs_is_current():
    from stacks.docs import DOC_PAGE, availability_table, section

    assert section(DOC_PAGE.read_text(), "availability") == availability_table(), \
        "docs/infrastructure.md is stale: python -m stacks.docs --update"
