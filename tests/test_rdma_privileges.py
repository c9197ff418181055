"""DeepEP's environment and privileges against the least-privilege policies: the engine of
an RDMA replica adds IPC_LOCK and nothing else, and the `serving-rdma-privileges` policy
fires for anything beyond that narrow exception. Judged by the real policy pack through
pulumi_policy's own analyzer (dsvolc.policy_runner) on the recorded prod program."""

from __future__ import annotations

import copy
from typing import Callable

import pytest

from dsvolc import engine, policy_runner
from stacks import load
from stacks.plan import build_plan
from tests.stack_fixtures import filled_raw
from workloads.engine import deepep, manifests, rdma
from workloads.engine.context import build_context

POLICY = "serving-rdma-privileges"


@pytest.fixture(scope="module")
def prod() -> engine.Recording:
    return engine.run("prod", filled_raw("prod"), mode="existing")


def _lws(rec: engine.Recording):
    return next(r for r in rec.resources if r.type.endswith("LeaderWorkerSet"))


def edited(rec: engine.Recording, edit: Callable[[dict], None]) -> engine.Recording:
    """The recording with `edit` applied to every vLLM container of the LeaderWorkerSet."""
    rec = copy.deepcopy(rec)
    lws = _lws(rec)
    for props in (lws.raw_inputs, lws.inputs):
        t = props["spec"]["leaderWorkerTemplate"]
        for role in ("leaderTemplate", "workerTemplate"):
            for c in t[role]["spec"]["containers"]:
                if c["name"] == "vllm":
                    edit(c)
    return rec


def verdicts(rec: engine.Recording) -> list[dict]:
    return policy_runner.analyze(rec, policy_runner.load_policy_config("prod"))


def fired(rec: engine.Recording, policy: str = POLICY) -> list[dict]:
    return [v for v in verdicts(rec) if v["policy"] == policy]


def _drop_rdma(c: dict) -> None:
    for bound in ("requests", "limits"):
        c["resources"][bound].pop(rdma.RDMA_RESOURCE, None)


def test_prod_engine_adds_ipc_lock_only_and_passes(prod):
    lws = _lws(prod).raw_inputs["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        c = lws[role]["spec"]["containers"][0]
        sc = c["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and not sc.get("privileged")
        assert c["resources"]["requests"][rdma.RDMA_RESOURCE] == "4"
        assert "deepep" in c["args"][c["args"].index("--all2all-backend") + 1]
    assert fired(prod) == []


def test_ipc_lock_without_rdma_nics_is_refused(prod):
    out = fired(edited(prod, _drop_rdma))
    assert out and all(v["enforcement_level"] == "mandatory" for v in out)
    text = " ".join(v["message"] for v in out)
    assert "adds IPC_LOCK without RDMA NICs" in text
    assert "runs --all2all-backend deepep_low_latency without RDMA NICs" in text


def test_a_capability_beyond_ipc_lock_is_refused(prod):
    """llm-d's wide-EP pods add SYS_RAWIO; this pack refuses it (and so does the general
    container-least-privilege policy)."""
    rec = edited(prod, lambda c: c["securityContext"]["capabilities"]["add"].append("SYS_RAWIO"))
    out = verdicts(rec)
    mine = [v for v in out if v["policy"] == POLICY]
    assert mine and "adds ['SYS_RAWIO']" in mine[0]["message"]
    assert any(v["policy"] == "container-least-privilege" and "SYS_RAWIO" in v["message"] for v in out)


def test_deepep_without_ipc_lock_is_refused(prod):
    rec = edited(prod, lambda c: c["securityContext"]["capabilities"].pop("add"))
    msgs = [v["message"] for v in fired(rec)]
    assert msgs and all("deepep_low_latency without RDMA NICs and IPC_LOCK" in m for m in msgs)


def test_root_engine_is_refused(prod):
    rec = edited(prod, lambda c: c["securityContext"].update(runAsUser=0, runAsNonRoot=False))
    assert any("runs as root" in v["message"] for v in fired(rec))
    # a privileged engine is no-privileged-pods' finding alone
    priv = verdicts(edited(prod, lambda c: c["securityContext"].update(privileged=True)))
    assert not [v for v in priv if v["policy"] == POLICY] and any(v["policy"] == "no-privileged-pods" for v in priv)


def test_nvshmem_environment_of_the_deepep_pods():
    ctx = build_context(build_plan(load("prod")), image_repository="r.example/ns/repo")
    w = next(o for o in manifests.render(ctx, "trn") if o["kind"] == "LeaderWorkerSet")
    for role in ("leaderTemplate", "workerTemplate"):
        env = {e["name"]: e["value"] for e in w["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]["env"]
               if "value" in e}
        assert env["NVSHMEM_IB_ENABLE_IBGDA"] == "1"
        assert env["NVSHMEM_IBGDA_NIC_HANDLER"] == "auto"
        assert env["NVSHMEM_ENABLE_NIC_PE_MAPPING"] == "1"
        # 8 GPUs over the pod's 4 RDMA NICs (mlx5_1..4; mlx5_0 is the VPC NIC), as NCCL's list
        assert env["NVSHMEM_HCA_PE_MAPPING"] == "mlx5_1:1:2,mlx5_2:1:2,mlx5_3:1:2,mlx5_4:1:2"
        assert {h.split(":")[0] for h in env["NVSHMEM_HCA_PE_MAPPING"].split(",")} == \
            {h.split(":")[0] for h in env["NCCL_IB_HCA"].split(",")}
        assert env["NVSHMEM_IB_GID_INDEX"] == env["NCCL_IB_GID_INDEX"] == rdma.NCCL_IB_GID_INDEX
        assert env["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] == "eth0"
    assert deepep.env(ctx, 4, "allgather_reducescatter") == [] and deepep.env(ctx, 0, "deepep_low_latency") == []
    assert deepep.mapping(4, 6) == "mlx5_1:1:2,mlx5_2:1:2,mlx5_3:1:1,mlx5_4:1:1"
