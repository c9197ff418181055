"""The serving workload objects: values from the settings and the plan, and every object
valid against the Kubernetes OpenAPI schema or its real CRD."""

from __future__ import annotations

import copy

import pytest

import k8s_schema
from stacks import load, parse, read_raw
from workloads.engine import manifests
from stacks.plan import build_plan
from workloads.engine.context import build_context

STACKS = ["dev", "staging", "prod"]
ROLE = "trn:iam::2100000000:role/reader"


def ctx_for(stack: str, raw: dict | None = None):
    s = parse(raw, stack=stack) if raw is not None else load(stack)
    return build_context(build_plan(s))


def objects(stack: str, raw: dict | None = None) -> list[dict]:
    return manifests.render(ctx_for(stack, raw), ROLE)


def workload(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet"))


def pod_templates(w: dict) -> list[dict]:
    if w["kind"] == "Deployment":
        return [w["spec"]["template"]]
    t = w["spec"]["leaderWorkerTemplate"]
    return [t["leaderTemplate"], t["workerTemplate"]]


def serving_container(w: dict) -> dict:
    return pod_templates(w)[0]["spec"]["containers"][0]


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_passes_its_schema(stack):
    version = load(stack).cluster.kubernetes_version
    for obj in objects(stack):
        k8s_schema.validate(obj, version)


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_limits_equal_the_ranks_of_a_pod(stack):
    """One GPU per rank on the pod's node: the TP group (a pipeline stage per node), or
    the node's share of the data-parallel engines (prod: 8 of DP16)."""
    ctx = ctx_for(stack)
    p = ctx.engine
    per_pod = p.tensor_parallel_size * p.pipeline_parallel_size * p.data_parallel_size // p.nodes
    assert per_pod == ctx.gpus_per_pod and (stack != "prod" or per_pod == 8)
    for tmpl in pod_templates(workload(objects(stack))):
        res = tmpl["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == str(per_pod)
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
        assert res["requests"]["memory"] == res["limits"]["memory"]


@pytest.mark.parametrize("stack", STACKS)
def test_shm_grows_with_tensor_parallelism(stack):
    ctx = ctx_for(stack)
    tmpl = pod_templates(workload(objects(stack)))[0]["spec"]
    shm = next(v for v in tmpl["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    # plus the KV offload buffers vLLM keeps in /dev/shm (prod offloads: capacity/kv_offload.py)
    offload = ctx.plan.serving.kv_offload
    assert (offload is not None) is (stack == "prod")
    extra = offload.gib_per_engine * offload.engines_per_pod if offload else 0
    assert shm["emptyDir"]["sizeLimit"] == f"{2 + 2 * ctx.gpus_per_pod + extra}Gi"
    mounts = {m["mountPath"]: m["name"] for m in tmpl["containers"][0]["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"


@pytest.mark.parametrize("stack", STACKS)
def test_probes_survive_a_long_load(stack):
    s = load(stack)
    c = serving_container(workload(objects(stack)))
    sp = c["startupProbe"]
    budget = sp["periodSeconds"] * sp["failureThreshold"]
    assert budget >= s.serving.startup_timeout_seconds >= 20 * 60
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if "exec" in c[probe]:  # on RDMA the start-up check also reads NCCL's log (test_multinode.py)
            cmd = c[probe]["exec"]["command"]
            assert probe == "startupProbe" and cmd[cmd.index("--url") + 1] == "http://127.0.0.1:8000/health"
        else:
            assert c[probe]["httpGet"]["path"] == "/health"
        assert c[probe]["timeoutSeconds"] > 1


def test_startup_budget_follows_the_settings():
    raw = copy.deepcopy(read_raw("dev"))
    raw["serving"]["startup_timeout_seconds"] = 3600
    sp = serving_container(workload(objects("dev", raw)))["startupProbe"]
    assert sp["periodSeconds"] * sp["failureThreshold"] == 3600


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("stack", STACKS)
def test_a_drain_lasts_the_drain_budget(stack):
    """Order on shutdown: the pod leaves the endpoints, preStop holds SIGTERM back for
    drain_seconds while the gateway stops sending, then vLLM drains in-flight requests for
    serving.inflight_drain_seconds (`--shutdown-timeout`; vLLM's default 0 aborts them),
    all within the termination grace. A headless worker outlives its leader's drain."""
    s = load(stack)
    budget = s.serving.inflight_drain_seconds
    templates = pod_templates(workload(objects(stack)))
    leader = templates[0]["spec"]
    c = leader["containers"][0]
    pre = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre == s.serving.drain_seconds >= 5
    assert int(_flag(c["args"], "--shutdown-timeout")) == budget
    assert leader["terminationGracePeriodSeconds"] >= pre + budget
    for tmpl in templates[1:]:
        # a worker waits as long as its leader has requests to drain, at most that long
        # (the wait itself: tests/test_multinode.py)
        cmd = tmpl["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        w_pre = int(_flag(cmd, "--max-seconds"))
        assert w_pre >= pre + int(_flag(c["args"], "--shutdown-timeout"))
        assert int(_flag(cmd, "--min-seconds")) == pre
        assert tmpl["spec"]["terminationGracePeriodSeconds"] > w_pre


def test_the_grace_follows_the_drain_budget_not_the_request_timeout():
    """The grace was drain + request timeout: raising the timeout for long generations
    stretched every scale-down by as much. Now only the drain budget counts."""
    raw = copy.deepcopy(read_raw("dev"))
    raw.setdefault("gateway", {})["request_timeout_seconds"] = 1200
    raw["serving"]["inflight_drain_seconds"] = 300
    spec = pod_templates(workload(objects("dev", raw)))[0]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 20 + 300 + 30
    assert int(_flag(spec["containers"][0]["args"], "--shutdown-timeout")) == 300
    raw["serving"]["termination_grace_seconds"] = 200
    with pytest.raises(Exception, match=r"serving.termination_grace_seconds: 200 s is shorter than .* = 320 s"):
        ctx_for("dev", raw)


@pytest.mark.parametrize("stack", STACKS)
def test_scheduled_on_the_gpu_pool(stack):
    s = load(stack)
    spec = pod_templates(workload(objects(stack)))[0]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == [s.serving.gpu_pool]
    keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
    assert "topology.kubernetes.io/zone" in keys


@pytest.mark.parametrize("stack", STACKS)
def test_image_is_pinned_and_from_the_stack_registry(stack):
    s = load(stack)
    p = build_plan(s)
    image = serving_container(workload(objects(stack)))["image"]
    assert image.startswith(p.names.image_repository)
    assert not image.endswith(":latest")
    if s.serving.image.digest:
        assert image.endswith("@" + s.serving.image.digest)
    else:
        assert image.endswith(":" + s.serving.image.tag)


@pytest.mark.parametrize("stack", STACKS)
def test_restricted_security_context(stack):
    for tmpl in pod_templates(workload(objects(stack))):
        spec = tmpl["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert not spec.get("hostNetwork")
        for c in spec["containers"] + spec["initContainers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert not sc.get("privileged")


def test_sync_mode_uses_the_node_cache_and_verifies():
    """The pod mounts the node cache itself (created by the node's init script, owned by
    the serving uid) and the tool creates the model directory in it: never a per-model
    hostPath with DirectoryOrCreate, which the kubelet makes root-owned on a fresh node."""
    ctx = ctx_for("dev")
    s = load("dev")
    spec = pod_templates(workload(objects("dev")))[0]["spec"]
    cache = next(v for v in spec["volumes"] if v["name"] == "model-cache")
    assert cache["hostPath"] == {"path": "/mnt/model-cache", "type": "Directory"}
    init = spec["initContainers"][0]
    assert init["name"] == "weights-sync"
    assert init["securityContext"]["runAsUser"] == 1000
    cmd = init["command"]
    assert cmd[cmd.index("--bucket") + 1] == ctx.weights_bucket
    assert cmd[cmd.index("--prefix") + 1] == f"{s.weights.prefix}/{ctx.model.name}"
    assert cmd[cmd.index("--endpoint") + 1] == "https://tos-s3-cn-beijing.ivolces.com"
    assert cmd[cmd.index("--connections") + 1] == str(s.serving.weights_sync_connections)
    mount = next(m for m in init["volumeMounts"] if m["name"] == "model-cache")
    dest = cmd[cmd.index("--dest") + 1]
    assert dest == f"{mount['mountPath']}/{ctx.model.name}" and "subPath" not in mount
    assert "--verify" in cmd
    engine = serving_container(workload(objects("dev")))
    assert _flag(engine["args"], "--model") == dest
    assert any(m["name"] == "model-cache" and m["readOnly"] for m in engine["volumeMounts"])


def test_stream_mode_uses_runai_and_the_s3_endpoint():
    s = load("staging")
    p = build_plan(s)
    w = workload(objects("staging"))
    c = serving_container(w)
    assert c["command"][:2] == ["/bin/sh", "-c"]
    args = c["args"]
    assert args[args.index("--model") + 1] == f"s3://{p.names.bucket}/{s.weights.prefix}/{s.serving.model}"
    assert args[args.index("--load-format") + 1] == "runai_streamer"
    names = [i["name"] for i in pod_templates(w)[0]["spec"]["initContainers"]]
    assert names == ["tos-credentials", "tokenizer-check"]


@pytest.mark.parametrize("stack", STACKS)
def test_irsa_token_is_projected_for_tos(stack):
    spec = pod_templates(workload(objects(stack)))[0]["spec"]
    token = next(v for v in spec["volumes"] if v["name"] == "volcengine-token")
    src = token["projected"]["sources"][0]["serviceAccountToken"]
    assert src["audience"] == "sts.volcengine.com"
    env = {e["name"]: e.get("value") for e in spec["initContainers"][0]["env"]}
    assert env["VOLCENGINE_OIDC_ROLE_TRN"] == ROLE


def test_without_irsa_the_static_key_comes_from_a_secret():
    raw = copy.deepcopy(read_raw("dev"))
    raw["cluster"]["irsa"] = False
    spec = pod_templates(workload(objects("dev", raw)))[0]["spec"]
    env = spec["initContainers"][0]["env"]
    key = next(e for e in env if e["name"] == "TOS_ACCESS_KEY")
    assert "value" not in key and key["valueFrom"]["secretKeyRef"]["key"] == "access_key_id"
    assert not any(v["name"] == "volcengine-token" for v in spec["volumes"])


def test_prod_is_a_leader_worker_set_over_the_planned_nodes():
    ctx = ctx_for("prod")
    w = workload(objects("prod"))
    assert w["kind"] == "LeaderWorkerSet"
    lwt = w["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == ctx.engine.nodes == 2
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "/health" in " ".join(leader["startupProbe"]["exec"]["command"])  # + NCCL's IB check on RDMA
    assert worker["args"][-1] == "--headless"
    # DP16 over two nodes: the worker runs engines 8..15, its first rank computed by its shell
    assert worker["command"][:2] == ["/bin/sh", "-c"]
    assert worker["command"][2].endswith('"$@" --data-parallel-start-rank $$((LWS_WORKER_INDEX * 8))')
    # workers carry the same shm and weight handling as the leader
    for spec in (lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]):
        assert {v["name"] for v in spec["volumes"]} >= {"dshm", "model-cache"}
        assert spec["initContainers"][0]["name"] == "weights-sync"


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_single_node_stacks_are_deployments(stack):
    s = load(stack)
    p = build_plan(s)
    w = workload(objects(stack))
    assert w["kind"] == "Deployment"
    expected = 0 if p.rollout.argo else s.serving.replicas
    assert w["spec"]["replicas"] == expected


@pytest.mark.parametrize("stack", STACKS)
def test_services_select_leaders_and_the_pdb_covers_whole_groups(stack):
    objs = objects(stack)
    ctx = ctx_for(stack)
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert set(services) == {ctx.stable_service, ctx.canary_service}
    pdb = next(o for o in objs if o["kind"] == "PodDisruptionBudget")
    templates = pod_templates(workload(objs))
    for svc in services.values():
        assert svc["spec"]["selector"].items() <= templates[0]["metadata"]["labels"].items()
    # The budget covers every pod of the workload, leaders and workers: one pod evicted
    # takes its group down, and no other pod may go until that group is back.
    for tmpl in templates:
        assert pdb["spec"]["selector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items()
    assert pdb["spec"]["maxUnavailable"] == 1
    if ctx.multi_node:
        worker_labels = templates[1]["metadata"]["labels"]
        assert not services[ctx.stable_service]["spec"]["selector"].items() <= worker_labels.items()


def test_workers_are_probed_on_their_engine_processes():
    ctx = ctx_for("prod")
    worker = workload(objects("prod"))["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = worker[probe]["exec"]["command"]
        assert cmd[:4] == ["python3", "-m", "runtime.health", "workers"]
        assert int(_flag(cmd, "--expect")) == ctx.gpus_per_pod == 8
        assert worker[probe]["timeoutSeconds"] > 1


def test_the_leader_startup_budget_covers_a_workers_sync():
    from capacity.planner import checkpoint_bytes

    ctx = ctx_for("prod")
    s = ctx.settings
    leader = workload(objects("prod"))["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    sp = leader["startupProbe"]
    sync = checkpoint_bytes(ctx.model, s.serving.engine.quantization) / (s.serving.weights_sync_mib_per_s * 2**20)
    assert sync > 600  # 600+ GB of FP8 weights: well past ten minutes on any disk class
    assert sp["periodSeconds"] * sp["failureThreshold"] >= s.serving.startup_timeout_seconds + sync
    # Slower assumed throughput, longer budget.
    raw = copy.deepcopy(read_raw("prod"))
    raw["serving"]["weights_sync_mib_per_s"] = s.serving.weights_sync_mib_per_s // 2
    slow = workload(objects("prod", raw))["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert slow["startupProbe"]["failureThreshold"] > sp["failureThreshold"]


def test_group_updates_follow_the_rollout_settings():
    spec = workload(objects("prod"))["spec"]
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 1, "maxUnavailable": 0,
                                                                     "partition": 0}
    raw = copy.deepcopy(read_raw("prod"))
    raw["rollout"] = {"max_surge": 0, "partition": 1}
    raw["autoscaling"]["max_replicas"] = 4  # no surge: four groups fill the eight nodes
    spec = workload(objects("prod", raw))["spec"]
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 0, "maxUnavailable": 1,
                                                                     "partition": 1}


@pytest.mark.parametrize("stack", STACKS)
def test_recommended_labels_everywhere(stack):
    for obj in objects(stack):
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "component", "part-of", "managed-by"):
            assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], key)


def test_kernels_switch_reaches_the_engine():
    raw = copy.deepcopy(read_raw("dev"))
    raw["serving"]["engine"]["kernels"] = False
    env = {e["name"]: e.get("value") for e in serving_container(workload(objects("dev", raw)))["env"]}
    assert env["DSVOLC_KERNELS"] == "0"
    env = {e["name"]: e.get("value") for e in serving_container(workload(objects("dev")))["env"]}
    assert env["DSVOLC_KERNELS"] == "1"


def test_a_typo_fails_the_schema():
    obj = workload(objects("dev"))
    bad = copy.deepcopy(obj)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(AssertionError):
        k8s_schema.validate(bad, "1.32")
