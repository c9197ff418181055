"""GPU node pools as VKE and kubelet accept them: the topology policy chosen from GPUs per
pod against the NUMA layout, HPC pools, RDMA NICs; and the RDMA additions of multi-node
serving pods."""

from __future__ import annotations

import copy
import json

import pytest

from stacks import SettingsError, load, load_plan, parse, parse_plan, read_raw
from stacks.nodepools import PoolHardware, pool_hardware, rdma_per_pod, single_numa_refusal, topology_policy
from workloads.engine import manifests
from workloads.engine import rdma
from stacks.plan import build_plan
from workloads.engine.context import build_context


def hw(gpus: int, numa: int | None, nics: int | None = 0) -> PoolHardware:
    return PoolHardware("ecs.test.x", "H20", gpus, numa, bool(nics), nics, False, None)


@pytest.mark.parametrize("gpus_per_pod,node,expected", [
    (1, hw(1, None), "single-numa-node"),  # one GPU sits on one NUMA node, whatever the layout
    (1, hw(8, None), "single-numa-node"),
    (4, hw(8, 2), "single-numa-node"),  # fits one socket's four GPUs
    (8, hw(8, 2), "restricted"),  # must span both NUMA nodes: single-numa-node would refuse it
    (2, hw(8, 4), "single-numa-node"),
    (4, hw(8, 4), "restricted"),
    (4, hw(8, None), "restricted"),  # layout unknown: never bet on one NUMA node
    (8, hw(8, 1), "single-numa-node"),
])
def test_topology_policy_follows_gpus_per_pod_and_numa_layout(gpus_per_pod, node, expected):
    assert topology_policy(gpus_per_pod, node) == expected
    assert (single_numa_refusal(gpus_per_pod, node) is None) is (expected == "single-numa-node")


def test_rdma_share_per_pod():
    assert rdma_per_pod(8, hw(8, 2, nics=4)) == 4
    assert rdma_per_pod(4, hw(8, 2, nics=8)) == 4
    assert rdma_per_pod(1, hw(8, 2, nics=4)) == 1
    assert rdma_per_pod(8, hw(8, 2, nics=0)) == 0


def test_pool_settings_state_what_the_catalog_lacks():
    h = pool_hardware("ecs.hpcpni3ln.45xlarge", "H20", 8)
    assert (h.numa_nodes, h.rdma, h.rdma_nics, h.hpc) == (None, True, 4, True)
    h = pool_hardware("ecs.hpcpni3ln.45xlarge", "H20", 8, numa_nodes=2, rdma_nics=8)
    assert (h.numa_nodes, h.gpus_per_numa_node, h.rdma_nics) == (2, 4, 8)
    # not catalogued: the family name says HPC
    assert pool_hardware("ecs.hpcg3ib.32xlarge", "A100-80G", 8).hpc
    assert not pool_hardware("ecs.gni2.3xlarge", "A10", 1).hpc


# --------------------------------------------------------------------------- settings


def raw_of(stack: str) -> dict:
    return copy.deepcopy(read_raw(stack))


def test_shipped_pools_get_the_policy_their_pods_need():
    assert load_plan("dev").pools["a10"].topology_policy == "single-numa-node"  # 1 GPU per pod
    assert load_plan("staging").pools["a100"].topology_policy == "restricted"  # TP4, NUMA layout not stated
    assert load_plan("prod").pools["h20"].topology_policy == "restricted"  # TP8 spans both sockets


def test_a_stated_numa_layout_lets_a_pod_that_fits_one_numa_node_align():
    raw = raw_of("staging")
    raw["cluster"]["gpu_pools"]["a100"]["numa_nodes"] = 2
    s = parse(raw, stack="staging")
    p = build_plan(s)
    assert p.serving.engine.tensor_parallel_size == 4 and p.pools["a100"].topology_policy == "single-numa-node"


def test_single_numa_node_is_refused_where_the_pods_span_numa_nodes():
    raw = raw_of("prod")
    raw["cluster"]["gpu_pools"]["h20"]["topology_manager_policy"] = "single-numa-node"
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="prod")
    (line,) = [p for p in info.value.problems if p.startswith("cluster.gpu_pools.h20.topology_manager_policy")]
    assert "a pod of 8 GPUs may span NUMA nodes" in line and "expected restricted, best-effort or none" in line
    raw["cluster"]["gpu_pools"]["h20"]["numa_nodes"] = 2
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="prod")
    assert any("8 GPUs over 2 NUMA nodes, 4 per node" in p for p in info.value.problems)
    raw["cluster"]["gpu_pools"]["h20"]["topology_manager_policy"] = "best-effort"
    assert parse_plan(raw, stack="prod").pools["h20"].topology_policy == "best-effort"


def test_multi_node_on_rdma_nics_of_unknown_count_is_refused():
    raw = raw_of("prod")
    raw["cluster"]["gpu_pools"]["h20"]["instance_type"] = "ecs.ebmhpcpni2l.32xlarge"  # A800 x 8, NICs not stated
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="prod")
    assert any(p.startswith("cluster.gpu_pools.h20.rdma_nics: multi-node serving on ecs.ebmhpcpni2l.32xlarge")
               for p in info.value.problems), info.value.problems
    raw["cluster"]["gpu_pools"]["h20"]["rdma_nics"] = 8
    s = parse(raw, stack="prod")
    s_plan = build_plan(s)
    assert s_plan.serving.rdma_per_pod == 8 and "rdma-device-plugin" in {a.name for a in s_plan.addons}


def test_hpc_pool_in_a_named_zone_of_the_stack():
    raw = raw_of("prod")
    raw["cluster"]["gpu_pools"]["h20"]["zones"] = ["cn-beijing-a", "cn-beijing-b"]
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack="prod")
    assert any(p.startswith("cluster.gpu_pools.h20.zones: ecs.hpcpni3ln.45xlarge is an HPC instance type")
               and "got cn-beijing-a, cn-beijing-b" in p for p in info.value.problems)


# --------------------------------------------------------------------------- RDMA in the pods


def _ctx(stack: str, raw: dict | None = None):
    s = parse(raw, stack=stack) if raw is not None else load(stack)
    return build_context(build_plan(s))


def _templates(objs: list[dict]) -> list[dict]:
    out = []
    for o in objs:
        if o["kind"] == "LeaderWorkerSet":
            t = o["spec"]["leaderWorkerTemplate"]
            out += [t["leaderTemplate"], t["workerTemplate"]]
        elif o["kind"] == "Deployment":
            out.append(o["spec"]["template"])
    return out


def test_multi_node_pods_request_rdma_and_tell_nccl():
    ctx = _ctx("prod")
    nics = load_plan("prod").serving.rdma_per_pod
    assert nics == 4  # 8 GPUs per pod take all 4 NICs of ecs.hpcpni3ln.45xlarge
    templates = _templates(manifests.render(ctx, "trn:iam::1:role/r"))
    assert len(templates) == 2  # leader and worker
    for t in templates:
        networks = json.loads(t["metadata"]["annotations"][rdma.POD_NETWORKS_ANNOTATION])
        assert networks == [{"cniConf": {"name": "rdma"}}] * nics
        (engine,) = t["spec"]["containers"]
        for bound in ("requests", "limits"):
            assert engine["resources"][bound][rdma.RDMA_RESOURCE] == str(nics)
        env = {e["name"]: e.get("value") for e in engine["env"]}
        assert env["NCCL_IB_HCA"] == "mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1"
        assert env["NCCL_IB_GID_INDEX"] == "7" and env["NCCL_IB_DISABLE"] == "0"
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_single_node_pods_are_unchanged(stack):
    assert load_plan(stack).serving.rdma_per_pod == 0
    (t,) = _templates(manifests.render(_ctx(stack), "trn:iam::1:role/r"))
    assert "annotations" not in t["metadata"]
    (engine,) = t["spec"]["containers"]
    assert rdma.RDMA_RESOURCE not in engine["resources"]["limits"]
    assert not any(e["name"].startswith("NCCL_IB") for e in engine["env"])
    assert "add" not in engine["securityContext"]["capabilities"]


def test_multi_node_without_rdma_nics_talks_tcp():
    raw = raw_of("prod")
    raw["cluster"]["gpu_pools"]["h20"]["rdma_nics"] = 0
    ctx = _ctx("prod", raw)
    assert ctx.multi_node and rdma.extras(ctx) is None
    for t in _templates(manifests.render(ctx, "trn:iam::1:role/r")):
        assert "annotations" not in t["metadata"]
