"""Deploy phases, image pulls, the edge and metrics, as the real program registers them
under Pulumi's mock engine: a stack's first `pulumi up` (its cluster does not exist yet) and
later ones (VKE lists the cluster), each asserted against the stack's settings."""

from __future__ import annotations

import json

import pytest

from dsvolc import engine
from infra.weights import irsa_trust_document
from stacks import load, read_raw
from stacks.plan import build_plan

STACKS = ["dev", "staging", "prod"]


@pytest.fixture(scope="module")
def first() -> dict[str, engine.Recording]:
    return {s: engine.run(s, read_raw(s), mode="new") for s in STACKS}


@pytest.fixture(scope="module")
def later() -> dict[str, engine.Recording]:
    return {s: engine.run(s, read_raw(s), mode="existing") for s in STACKS}


def of(rec: engine.Recording, short: str) -> list[engine.Recorded]:
    return [r for r in rec.resources if r.type.endswith(short)]


def one(rec: engine.Recording, short: str) -> dict:
    (r,) = of(rec, short)
    return r.inputs


# --------------------------------------------------------------------------- phases


@pytest.mark.parametrize("stack", STACKS)
def test_first_apply_creates_no_reader_identity_and_no_kubernetes_object(first, stack):
    rec = first[stack]
    assert of(rec, "iam/role:Role") == [] and of(rec, "iam/user:User") == [] and of(rec, "iam/accessKey:AccessKey") == []
    assert [r.type for r in rec.resources if r.type.startswith("kubernetes:")] == []
    # the edge's routes name Kubernetes Services: they come with them
    assert of(rec, "apig/apigRoute:ApigRoute") == [] and of(rec, "apig/apigUpstream:ApigUpstream") == []
    # everything else of the cloud layer is there
    for short in ("vke/cluster:Cluster", "cr/vpcEndpoint:VpcEndpoint", "tos/bucket:Bucket", "iam/policy:Policy",
                  "apig/apigGateway:ApigGateway", "apig/apigCustomDomain:ApigCustomDomain"):
        assert of(rec, short), short
    # VKE takes irsa_enabled on an existing cluster only
    assert one(rec, "vke/cluster:Cluster")["irsaEnabled"] is False
    phase = rec.outputs["deploy_phase"]
    assert phase["phase"] == 1 and "oidc:iss" in phase["next"] and "weights_reader" not in rec.outputs


@pytest.mark.parametrize("stack", STACKS)
def test_later_apply_trusts_the_clusters_issuer_audience_and_service_account(later, stack):
    s = load(stack)
    p = build_plan(s)
    rec = later[stack]
    assert rec.outputs["deploy_phase"]["phase"] == 2
    assert one(rec, "vke/cluster:Cluster")["irsaEnabled"] is True
    answer = engine._clusters_answer(p.names.cluster, True)["clusters"][0]["irsaConfigs"][0]
    (st,) = json.loads(one(rec, "iam/role:Role")["trustPolicyDocument"])["Statement"]
    assert st["Principal"] == {"Federated": [answer["oidcTrn"]]}
    assert st["Condition"]["StringEquals"] == {
        "oidc:iss": [answer["issuer"]],
        "oidc:aud": ["sts.volcengine.com"],
        # the serving pods and the pre-warm, which syncs the same weights under its own identity
        "oidc:sub": [f"system:serviceaccount:{s.serving.namespace}:{s.serving.service_account}",
                     f"system:serviceaccount:{s.serving.namespace}:{s.serving.name}-prewarm"],
    }
    assert rec.outputs["weights_reader"] == f"trn:iam::{engine.FAKE_ACCOUNT}:role/{p.names.bucket}-reader"


def test_irsa_switched_on_in_the_same_update_takes_the_provider_from_the_cluster(monkeypatch):
    """VKE lists the cluster but IRSA is still off: this update enables it and the role's
    trust comes from the cluster resource's irsa_configs once the update has run."""
    listed = engine._clusters_answer

    def irsa_off(name, existing):
        doc = listed(name, existing)
        doc["clusters"][0]["irsaConfigs"] = [{"enabled": False}]
        return doc

    monkeypatch.setattr(engine, "_clusters_answer", irsa_off)
    rec = getattr(engine.run, "__wrapped__", engine.run)("dev", read_raw("dev"), mode="existing")  # not shared
    assert "enables IRSA" in rec.outputs["deploy_phase"]["description"]
    cluster = next(r for r in rec.resources if r.type.endswith("vke/cluster:Cluster"))
    (st,) = json.loads(one(rec, "iam/role:Role")["trustPolicyDocument"])["Statement"]
    rid = cluster.id
    assert st["Principal"]["Federated"] == [f"trn:iam::{engine.FAKE_ACCOUNT}:oidc-provider/vke-{rid}"]
    assert st["Condition"]["StringEquals"]["oidc:iss"] == [f"https://oidc.vke.volces.com/{rid}"]


@pytest.mark.parametrize("trn,issuer", [("", "https://oidc.example/x"), ("trn:iam::1:oidc-provider/x", "")])
def test_a_trust_policy_never_names_an_empty_provider(trn, issuer):
    with pytest.raises(ValueError, match="IRSA trust policy without"):
        irsa_trust_document(trn, issuer, "ns", "sa")


def test_the_iam_user_fallback_also_waits_for_the_cluster():
    raw = json.loads(json.dumps(read_raw("dev")))
    raw["cluster"]["irsa"] = False
    rec = engine.run("dev", raw, mode="new")
    assert of(rec, "iam/user:User") == [] and of(rec, "iam/role:Role") == []
    rec = engine.run("dev", raw, mode="existing")
    assert of(rec, "iam/user:User") and of(rec, "iam/role:Role") == []
    assert one(rec, "vke/cluster:Cluster")["irsaEnabled"] is False


def test_a_bootstrap_run_is_refused_once_the_cluster_exists(monkeypatch):
    from infra import BOOTSTRAP_ENV

    monkeypatch.setenv(BOOTSTRAP_ENV, "1")
    run = getattr(engine.run, "__wrapped__", engine.run)  # not shared: the environment differs
    assert run("dev", read_raw("dev"), mode="new").outputs["deploy_phase"]["phase"] == 1
    with pytest.raises(Exception, match="bootstrap is for a new stack only"):
        run("dev", read_raw("dev"), mode="existing")


# --------------------------------------------------------------------------- pulls


@pytest.mark.parametrize("stack", STACKS)
def test_the_registry_is_reachable_from_the_vpc_with_a_credential(later, stack):
    s = load(stack)
    p = build_plan(s)
    rec = later[stack]
    vpc = next(r for r in rec.resources if r.type.endswith("vpc/vpc:Vpc"))
    ep = one(rec, "cr/vpcEndpoint:VpcEndpoint")
    assert ep["registry"] == p.names.registry and ep["vpcs"] == [{"vpcId": vpc.id}]
    addons = [r.inputs["name"] for r in of(rec, "vke/addon:Addon")]
    assert "cr-credential-controller" in addons


def test_with_a_pull_secret_the_pods_name_it_and_no_addon_is_installed():
    raw = json.loads(json.dumps(read_raw("staging")))
    raw["registry"] = {"pull_credentials": "image-pull-secret", "image_pull_secret": "cr-pull"}
    rec = engine.run("staging", raw, mode="existing")
    assert "cr-credential-controller" not in [r.inputs["name"] for r in of(rec, "vke/addon:Addon")]
    (dep,) = [r for r in rec.resources if r.type == "kubernetes:apps/v1:Deployment" and r.inputs["metadata"][
        "namespace"] == "deepseek-serving"]
    assert dep.inputs["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "cr-pull"}]


# --------------------------------------------------------------------------- edge


@pytest.mark.parametrize("stack", STACKS)
def test_edge_on_at_most_two_subnets_chosen_by_settings(later, stack):
    s = load(stack)
    p = build_plan(s)
    rec = later[stack]
    gw = one(rec, "apig/apigGateway:ApigGateway")
    subnets = {r.id: r.inputs["zoneId"] for r in of(rec, "vpc/subnet:Subnet") if "-nodes-" in r.name}
    assert [subnets[i] for i in gw["networkSpec"]["subnetIds"]] == list(p.edge.zones)
    assert 1 <= len(gw["networkSpec"]["subnetIds"]) <= 2
    assert gw["resourceSpec"]["replicas"] == s.gateway.replicas >= 2


def test_edge_zones_follow_the_setting():
    raw = json.loads(json.dumps(read_raw("prod")))
    raw["gateway"]["zones"] = ["cn-beijing-c"]
    rec = engine.run("prod", raw, mode="existing")
    gw = one(rec, "apig/apigGateway:ApigGateway")
    (sid,) = gw["networkSpec"]["subnetIds"]
    assert next(r for r in rec.resources if r.id == sid).inputs["zoneId"] == "cn-beijing-c"


@pytest.mark.parametrize("stack", STACKS)
def test_edge_sets_no_timer_that_cuts_a_stream(later, stack):
    """APIG's route timeout (600 s) and the per-try timeout (the same, by default) cut a
    stream mid-generation. Behind the in-cluster gateway the edge sets neither; the
    retries fire only where the request reached no engine."""
    s = load(stack)
    g = s.gateway
    for route in of(later[stack], "apig/apigRoute:ApigRoute"):
        adv = route.inputs["advancedSetting"]
        retry = adv["retryPolicySetting"]
        if s.serving.in_cluster_gateway:
            assert adv["timeoutSetting"] == {"enable": False}
        else:
            assert adv["timeoutSetting"]["timeout"] == g.request_timeout_seconds  # seconds
        assert "perTryTimeout" not in retry and g.retry.per_try_timeout_seconds is None
        assert retry["httpCodes"] == [str(c) for c in g.retry.http_codes]
        assert retry["retryOns"] == g.retry.retry_on and retry["attempts"] == g.retry.attempts
        assert set(retry["retryOns"]) <= {"connect-failure", "refused-stream"}


def test_retry_settings_reach_the_route():
    raw = json.loads(json.dumps(read_raw("dev")))
    raw["gateway"]["retry"] = {"attempts": 3, "per_try_timeout_seconds": 45, "http_codes": [502, 503],
                               "retry_on": ["connect-failure"]}
    (route, *_) = of(engine.run("dev", raw, mode="existing"), "apig/apigRoute:ApigRoute")
    retry = route.inputs["advancedSetting"]["retryPolicySetting"]
    assert retry == {"enable": True, "attempts": 3, "perTryTimeout": 45000, "httpCodes": ["502", "503"],
                     "retryOns": ["connect-failure"]}


@pytest.mark.parametrize("stack", STACKS)
def test_public_edge_is_https_only_with_the_stacks_certificate(later, stack):
    tls = load(stack).gateway.tls
    rec = later[stack]
    assert one(rec, "apig/apigGatewayService:ApigGatewayService")["protocols"] == ["HTTPS"]
    domain = one(rec, "apig/apigCustomDomain:ApigCustomDomain")
    assert domain["domain"] == tls.domain and domain["certificateId"] == tls.certificate_id
    assert domain["protocols"] == ["HTTPS"] and domain["sslRedirect"] is False


def test_plain_http_can_be_redirected_instead():
    raw = json.loads(json.dumps(read_raw("dev")))
    raw["gateway"]["tls"]["plain_http"] = "redirect"
    rec = engine.run("dev", raw, mode="existing")
    domain = one(rec, "apig/apigCustomDomain:ApigCustomDomain")
    assert domain["protocols"] == ["HTTP", "HTTPS"] and domain["sslRedirect"] is True


# --------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("stack", STACKS)
def test_vmp_receives_the_clusters_and_the_edges_metrics(later, stack):
    s = load(stack)
    rec = later[stack]
    gw = one(rec, "apig/apigGateway:ApigGateway")
    release = next(r for r in rec.resources if r.type == "kubernetes:helm.sh/v3:Release"
                   and r.inputs["name"] == "kube-prometheus-stack")
    remote = release.inputs["values"]["prometheus"]["prometheusSpec"].get("remoteWrite")
    if not s.observability.vmp_enabled:
        assert of(rec, "vmp/workspace:Workspace") == [] and remote is None
        assert gw["monitorSpec"] == {"enable": False}
        return
    ws = next(r for r in rec.resources if r.type.endswith("vmp/workspace:Workspace"))
    assert gw["monitorSpec"] == {"enable": True, "workspaceId": ws.id}
    (rw,) = remote
    assert rw["url"] == f"https://{ws.id}.vmp.ivolces.com/api/v1/write"  # the workspace's write endpoint (mock)
    secret_ref = {"name": "vmp-remote-write"}
    assert rw["basicAuth"] == {"username": {**secret_ref, "key": "username"},
                               "password": {**secret_ref, "key": "password"}}
    (secret,) = [r for r in rec.resources if r.type == "kubernetes:core/v1:Secret"
                 and r.inputs["metadata"]["name"] == "vmp-remote-write"]
    assert secret.inputs["metadata"]["namespace"] == s.monitoring.namespace
    assert secret.raw_inputs["stringData"] == {"username": ws.inputs["username"],
                                               "password": ws.raw_inputs["password"]}
    assert engine.MASK in json.dumps(secret.inputs["stringData"])  # a secret, never shown
    assert ws.inputs["password"] == engine.MASK


# --------------------------------------------------------------------------- TOS


def test_bucket_policy_denies_acl_changes_with_tos_action_names(later):
    doc = json.loads(one(later["prod"], "tos/bucketPolicy:BucketPolicy")["policy"])
    (deny,) = [st for st in doc["Statement"] if st["Sid"] == "DenyAclChanges"]
    assert deny["Action"] == ["tos:PutBucketACL", "tos:PutObjectACL"]


def test_remote_write_is_a_valid_prometheus_remote_write(later):
    """The chart copies prometheusSpec.remoteWrite into the Prometheus resource: it must
    validate against prometheus-operator's Prometheus CRD (the version the chart ships)."""
    from k8s_schema import validate

    release = next(r for r in later["prod"].resources if r.type == "kubernetes:helm.sh/v3:Release"
                   and r.inputs["name"] == "kube-prometheus-stack")
    remote = release.inputs["values"]["prometheus"]["prometheusSpec"]["remoteWrite"]
    validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
              "metadata": {"name": "kube-prometheus-stack-prometheus", "namespace": "monitoring"},
              "spec": {"remoteWrite": remote}})
    with pytest.raises(Exception):  # the schema is strict: a misspelt key fails
        validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
                  "metadata": {"name": "p", "namespace": "monitoring"},
                  "spec": {"remoteWrite": [{**remote[0], "basicAuthentication": remote[0]["basicAuth"]}]}})
