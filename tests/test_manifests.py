"""The serving workload objects: values from the settings and the plan, and every object
valid against the Kubernetes OpenAPI schema or its real CRD."""

from __future__ import annotations

import copy

import pytest

import k8s_schema
from stacks import load, parse, read_raw
from workloads import manifests
from workloads.context import build_context

STACKS = ["dev", "staging", "prod"]
ROLE = "trn:iam::2100000000:role/reader"


def ctx_for(stack: str, raw: dict | None = None):
    s = parse(raw, stack=stack) if raw is not None else load(stack)
    return build_context(s, image_repository=s.image_repository, weights_bucket=s.bucket_name)


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
def test_gpu_limits_equal_the_tensor_parallel_size(stack):
    ctx = ctx_for(stack)
    for tmpl in pod_templates(workload(objects(stack))):
        res = tmpl["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == str(ctx.plan.tensor_parallel_size)
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
        assert res["requests"]["memory"] == res["limits"]["memory"]


@pytest.mark.parametrize("stack", STACKS)
def test_shm_grows_with_tensor_parallelism(stack):
    ctx = ctx_for(stack)
    tmpl = pod_templates(workload(objects(stack)))[0]["spec"]
    shm = next(v for v in tmpl["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"] == f"{2 + 2 * ctx.plan.tensor_parallel_size}Gi"
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
        assert c[probe]["httpGet"]["path"] == "/health"
        assert c[probe]["timeoutSeconds"] > 1


def test_startup_budget_follows_the_settings():
    raw = copy.deepcopy(read_raw("dev"))
    raw["serving"]["startup_timeout_seconds"] = 3600
    sp = serving_container(workload(objects("dev", raw)))["startupProbe"]
    assert sp["periodSeconds"] * sp["failureThreshold"] == 3600


@pytest.mark.parametrize("stack", STACKS)
def test_graceful_shutdown(stack):
    s = load(stack)
    tmpl = pod_templates(workload(objects(stack)))[0]["spec"]
    assert tmpl["terminationGracePeriodSeconds"] == s.serving.termination_grace_seconds
    pre = tmpl["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre == s.serving.drain_seconds < s.serving.termination_grace_seconds


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
    image = serving_container(workload(objects(stack)))["image"]
    assert image.startswith(s.image_repository)
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
    ctx = ctx_for("dev")
    spec = pod_templates(workload(objects("dev")))[0]["spec"]
    cache = next(v for v in spec["volumes"] if v["name"] == "model-cache")
    assert cache["hostPath"]["path"] == f"/mnt/model-cache/{ctx.model.name}"
    init = spec["initContainers"][0]
    assert init["name"] == "weights-sync"
    cmd = init["command"]
    assert cmd[cmd.index("--bucket") + 1] == ctx.weights_bucket
    assert cmd[cmd.index("--prefix") + 1] == f"{load('dev').weights.prefix}/{ctx.model.name}"
    assert "--verify" in cmd
    assert serving_container(workload(objects("dev")))["args"][1] == "/models"


def test_stream_mode_uses_runai_and_the_s3_endpoint():
    s = load("staging")
    w = workload(objects("staging"))
    c = serving_container(w)
    assert c["command"][:2] == ["/bin/sh", "-c"]
    args = c["args"]
    assert args[args.index("--model") + 1] == f"s3://{s.bucket_name}/{s.weights.prefix}/{s.serving.model}"
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
    assert lwt["size"] == ctx.plan.nodes == ctx.plan.pipeline_parallel_size
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "startupProbe" in leader and "startupProbe" not in worker
    assert worker["args"][-1] == "--headless"
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    # workers carry the same shm and weight handling as the leader
    for spec in (lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]):
        assert {v["name"] for v in spec["volumes"]} >= {"dshm", "model-cache"}
        assert spec["initContainers"][0]["name"] == "weights-sync"


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_single_node_stacks_are_deployments(stack):
    s = load(stack)
    w = workload(objects(stack))
    assert w["kind"] == "Deployment"
    expected = 0 if s.rollout.enabled else s.serving.replicas
    assert w["spec"]["replicas"] == expected


@pytest.mark.parametrize("stack", STACKS)
def test_services_and_pdb_select_the_serving_pods(stack):
    objs = objects(stack)
    ctx = ctx_for(stack)
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert set(services) == {ctx.stable_service, ctx.canary_service}
    pdb = next(o for o in objs if o["kind"] == "PodDisruptionBudget")
    leader_labels = pod_templates(workload(objs))[0]["metadata"]["labels"]
    for sel in [s["spec"]["selector"] for s in services.values()] + [pdb["spec"]["selector"]["matchLabels"]]:
        assert sel.items() <= leader_labels.items()
    if ctx.multi_node:
        worker_labels = pod_templates(workload(objs))[1]["metadata"]["labels"]
        assert not services[ctx.stable_service]["spec"]["selector"].items() <= worker_labels.items()


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
