"""The proof matrix: every policy fires for exactly the violation it exists for.

For each row, a compliant stack (baseline: no mandatory violation) is made unsafe in one
way, through its settings where the settings can express the mistake, through a Pulumi
resource transform where they cannot (the settings model refuses e.g. a `latest` tag,
so a transform stands for a hand edit or a change elsewhere in the program). The row
passes when its policy reports a mandatory violation and no other policy does.

`MATRIX` is the single table: the tests below run it, and `python
tests/test_policies_matrix.py --write-docs` renders docs/policies.md's generated section from it and from the
results (a test checks the file is current).
"""

from __future__ import annotations

import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pulumi  # noqa: E402
import pytest  # noqa: E402

from dsvolc import policy_runner, preview  # noqa: E402
from policies.pack import POLICIES  # noqa: E402
from tests.stack_fixtures import filled_raw  # noqa: E402

DOCS = ROOT / "docs" / "policies.md"
DOCS_BEGIN = "<!-- BEGIN GENERATED: python tests/test_policies_matrix.py --write-docs -->"
DOCS_END = "<!-- END GENERATED: policies -->"


def generated_section(text: str) -> str:
    return text.split(DOCS_BEGIN, 1)[1].split(DOCS_END, 1)[0].strip("\n")


def write_section(section: str) -> None:
    text = DOCS.read_text()
    pre, rest = text.split(DOCS_BEGIN, 1)
    post = rest.split(DOCS_END, 1)[1]
    DOCS.write_text(f"{pre}{DOCS_BEGIN}\n{section.strip(chr(10))}\n{DOCS_END}{post}")
STACKS = ("dev", "staging", "prod")

PropsFn = Callable[[str, str, dict], "dict | None"]


# --------------------------------------------------------------------------- injections


def _unbounded_worker_drain(c):
    """A worker's `runtime.health drain` preStop with a bound past any termination grace."""
    cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    if cmd and "drain" in cmd:
        cmd[cmd.index("--max-seconds") + 1] = "99999"


@dataclass(frozen=True)
class Case:
    policy: str
    stack: str
    injected: str  # the unsafe change, in words (the docs' matrix)
    settings: Callable[[dict], None] | None = None  # mutates the raw settings
    transform: PropsFn | None = None  # (type, name, props) -> new props, or None to leave alone
    # "existing": against the stack as deployed (deploy phase 2: every resource, the serving
    # stack included); "new": its first `pulumi up` (phase 1: the cloud layer only)
    mode: str = "existing"

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.injected.lower()).strip("-")[:40]
        return f"{self.policy}[{self.stack}:{slug}]"

    @property
    def via(self) -> str:
        via = "settings" if self.settings is not None else "transform"
        return via + (" (first apply)" if self.mode == "new" else "")


def setting(path: str, value: Any) -> Callable[[dict], None]:
    """Set `a.b.c` in the raw settings mapping."""
    def apply(raw: dict) -> None:
        *parents, last = path.split(".")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return apply


def on(type_suffix: str, fn: Callable[[dict], None], name_has: str = "") -> PropsFn:
    """Edit the props (a deep copy) of resources whose type ends with `type_suffix`."""
    def transform(type_: str, name: str, props: dict) -> dict | None:
        if not type_.endswith(type_suffix) or name_has not in name:
            return None
        new = copy.deepcopy(props)
        fn(new)
        return new
    return transform


def _doc_edit(key: str, edit: Callable[[dict], None]) -> Callable[[dict], None]:
    """Edit a JSON policy document held as a string property."""
    import json

    def apply(props: dict) -> None:
        doc = json.loads(props[key])
        edit(doc)
        props[key] = json.dumps(doc)
    return apply


def _templates(props: dict) -> list[dict]:
    spec = props.get("spec", {})
    if "leaderWorkerTemplate" in spec:
        lwt = spec["leaderWorkerTemplate"]
        return [lwt[k] for k in ("leaderTemplate", "workerTemplate") if k in lwt]
    return [spec["template"]] if "template" in spec else []


def vllm_containers(edit: Callable[[dict], None]) -> Callable[[dict], None]:
    def apply(props: dict) -> None:
        for t in _templates(props):
            for c in t["spec"]["containers"]:
                if c["name"] == "vllm":
                    edit(c)
    return apply


def pod_specs(edit: Callable[[dict], None]) -> Callable[[dict], None]:
    def apply(props: dict) -> None:
        for t in _templates(props):
            edit(t["spec"])
    return apply


def set_flag(flag: str, value: str) -> Callable[[dict], None]:
    def apply(c: dict) -> None:
        args = c["args"]
        args[args.index(flag) + 1] = value
    return apply


SERVING = ("apps/v1:Deployment", "LeaderWorkerSet")


def serving(fn: Callable[[dict], None]) -> PropsFn:
    """Edit the vLLM workload: the Deployment (one node per replica) or LeaderWorkerSet."""
    def transform(type_: str, name: str, props: dict) -> dict | None:
        if not type_.endswith(SERVING) or not any(
                c.get("name") == "vllm" for t in _templates(props) for c in t["spec"]["containers"]):
            return None
        new = copy.deepcopy(props)
        fn(new)
        return new
    return transform


def _triton_args(flag: str, value: str) -> Callable[[dict], None]:
    """Edit the engine arguments a Triton pod template carries (its model.json as flags)."""
    import json

    def apply(props: dict) -> None:
        md = props["spec"]["template"]["metadata"]
        key = "deepseek-volc/engine-args"
        if key in md.get("annotations", {}):
            args = json.loads(md["annotations"][key])
            args[args.index(flag) + 1] = value
            md["annotations"][key] = json.dumps(args)
    return apply


def _add_statement(st: dict) -> Callable[[dict], None]:
    return lambda doc: doc["Statement"].append(st)


def _drop_label(key: str) -> Callable[[dict], None]:
    return lambda props: props["metadata"]["labels"].pop(key)


MATRIX: list[Case] = [
    # storage
    Case("tos-bucket-not-public", "prod", "bucket ACL public-read",
         transform=on("tos/bucket:Bucket", lambda p: p.update(publicAcl="public-read"))),
    Case("tos-bucket-policy-no-public-allow", "prod", "bucket policy allows tos:GetObject to Principal *",
         transform=on("bucketPolicy:BucketPolicy", _doc_edit("policy", _add_statement(
             {"Sid": "Public", "Effect": "Allow", "Principal": ["*"], "Action": ["tos:GetObject"],
              "Resource": ["trn:tos:::deepseek-volc-prod-weights/*"]})))),
    Case("tos-bucket-encrypted", "prod", "BucketEncryption without an algorithm",
         transform=on("bucketEncryption:BucketEncryption", lambda p: p.update(rule={}))),
    Case("tos-bucket-versioned", "prod", "bucket versioning off",
         transform=on("tos/bucket:Bucket", lambda p: p.update(enableVersion=False))),
    # IAM
    Case("iam-no-wildcard-actions", "prod", "read policy action tos:Get*",
         transform=on("iam/policy:Policy", _doc_edit("policyDocument",
                                                     lambda d: d["Statement"][0].update(Action=["tos:Get*"])))),
    Case("iam-weights-bucket-scope", "prod", "read policy resource is the whole bucket (no prefix)",
         transform=on("iam/policy:Policy", _doc_edit("policyDocument", lambda d: d["Statement"][0].update(
             Resource=["trn:tos:::deepseek-volc-prod-weights/*"])))),
    Case("iam-serving-read-only", "prod", "serving role may tos:PutObject",
         transform=on("iam/policy:Policy", _doc_edit("policyDocument", lambda d: d["Statement"][0].update(
             Action=["tos:GetObject", "tos:PutObject"]))), mode="existing"),
    Case("iam-oidc-trust-scoped", "prod", "IRSA trust without oidc:sub/aud conditions",
         transform=on("iam/role:Role", _doc_edit("trustPolicyDocument",
                                                 lambda d: d["Statement"][0].pop("Condition"))), mode="existing"),
    Case("iam-oidc-trust-scoped", "staging", "IRSA trust with an empty Federated principal",
         transform=on("iam/role:Role", _doc_edit("trustPolicyDocument",
                                                 lambda d: d["Statement"][0]["Principal"].update(Federated=[""]))), mode="existing"),
    Case("iam-oidc-trust-scoped", "dev", "IRSA trust without the oidc:iss condition",
         transform=on("iam/role:Role", _doc_edit("trustPolicyDocument", lambda d: d["Statement"][0]["Condition"][
             "StringEquals"].pop("oidc:iss"))), mode="existing"),
    # network
    Case("no-public-ingress", "prod", "node security group admits 0.0.0.0/0",
         transform=on("securityGroupRule:SecurityGroupRule", lambda p: p.update(cidrIp="0.0.0.0/0"),
                      name_has="ingress")),
    Case("vke-private-api-server", "prod", "cluster.api_server_public: true",
         settings=setting("cluster.api_server_public", True)),
    Case("egress-through-nat", "prod", "new nodes get public IPs by default",
         transform=on("vke/cluster:Cluster",
                      lambda p: p["clusterConfig"].update(resourcePublicAccessDefaultEnabled=True))),
    Case("private-cidrs", "prod", "VPC CIDR 8.8.0.0/16 (a public range)",
         transform=on("vpc/vpc:Vpc", lambda p: p.update(cidrBlock="8.8.0.0/16"))),
    Case("private-cidrs", "staging", "cluster service CIDR 100.64.0.0/16",
         transform=on("vke/cluster:Cluster", lambda p: p["servicesConfig"].update(serviceCidrsv4s=["100.64.0.0/16"]))),
    Case("egress-per-zone", "prod", "zone b's pod subnet moved to zone a, still on zone b's NAT gateway",
         transform=on("vpc/subnet:Subnet", lambda p: p.update(zoneId="cn-beijing-a"), name_has="pods-cn-beijing-b")),
    Case("egress-per-zone", "staging", "one shared NAT gateway (class dev, judged by staging's config)",
         settings=lambda raw: [setting("environment_class", "dev")(raw),
                               setting("policy_config", "policies/config/staging.json")(raw),
                               setting("network.nat", "shared")(raw)]),
    # cluster
    Case("gpu-pool-tainted", "prod", "GPU pool without the nvidia.com/gpu taint",
         transform=on("vke/nodePool:NodePool", lambda p: p["kubernetesConfig"].pop("taints"), name_has="gpu")),
    Case("gpu-pool-labelled", "prod", "GPU pool without the gpus-per-node label",
         transform=on("vke/nodePool:NodePool", lambda p: p["kubernetesConfig"].update(labels=[
             x for x in p["kubernetesConfig"]["labels"] if x["key"] != "deepseek-volc/gpus-per-node"]),
             name_has="gpu")),
    Case("node-pool-autoscaling-bounds", "prod", "GPU pool min nodes above max",
         transform=on("vke/nodePool:NodePool", lambda p: p["autoScaling"].update(minReplicas=9, desiredReplicas=9),
                      name_has="gpu")),
    Case("vke-supported-version", "prod", "Kubernetes 1.26 (end of life)",
         transform=on("vke/cluster:Cluster", lambda p: p.update(kubernetesVersion="1.26"))),
    Case("vke-delete-protection", "prod", "cluster.delete_protection: false",
         settings=setting("cluster.delete_protection", False)),
    Case("vke-audit-logging", "prod", "cluster.control_plane_logging: false",
         settings=setting("cluster.control_plane_logging", False)),
    Case("kubeconfig-short-lived", "prod", "cluster.deploy_kubeconfig.valid_hours: 720 (30 days)",
         settings=setting("cluster.deploy_kubeconfig.valid_hours", 720)),
    Case("kubeconfig-short-lived", "staging", "kubeconfig without valid_duration (VKE's 3-year default)",
         transform=on("vke/kubeconfig:Kubeconfig", lambda p: p.pop("validDuration"))),
    # workloads
    Case("image-pinned", "dev", "serving image :latest",
         transform=serving(vllm_containers(lambda c: c.update(
             image=c["image"].split("@")[0].rsplit(":", 1)[0] + ":latest")))),
    Case("image-pinned", "staging", "serving image without a tag",
         transform=serving(vllm_containers(lambda c: c.update(image=c["image"].rsplit(":", 1)[0])))),
    Case("image-from-stack-registry", "staging", "serving.image.repository docker.io/vllm/vllm-openai",
         settings=setting("serving.image.repository", "docker.io/vllm/vllm-openai")),
    # image pulls
    Case("image-pullable", "prod", "CR VPC endpoint exposes the registry to no VPC",
         transform=on("cr/vpcEndpoint:VpcEndpoint", lambda p: p.update(vpcs=[]))),
    Case("image-pullable", "staging", "no cr-credential-controller add-on and no imagePullSecrets",
         transform=on("vke/addon:Addon", lambda p: p.update(name="csi-nas"), name_has="cr-credential")),
    Case("image-pullable", "dev", "serving.image.repository ghcr.io/vllm/vllm-openai (registry not allowed)",
         settings=setting("serving.image.repository", "ghcr.io/vllm/vllm-openai")),
    Case("container-resources", "prod", "vLLM container without limits",
         transform=serving(vllm_containers(lambda c: c["resources"].pop("limits")))),
    Case("serving-probes", "prod", "vLLM container without probes",
         transform=serving(vllm_containers(lambda c: [c.pop(k, None) for k in (
             "startupProbe", "readinessProbe", "livenessProbe")]))),
    Case("serving-startup-budget", "prod", "startupProbe allows 300 s to load",
         transform=serving(vllm_containers(lambda c: c.get("startupProbe", {}).update(failureThreshold=30)))),
    Case("serving-shm", "prod", "tensor parallel 8 without /dev/shm",
         transform=serving(vllm_containers(lambda c: c.update(volumeMounts=[
             m for m in c["volumeMounts"] if m["mountPath"] != "/dev/shm"])))),
    Case("serving-rdma-privileges", "prod", "vLLM keeps IPC_LOCK and DeepEP without its RDMA NICs",
         transform=serving(vllm_containers(lambda c: [c["resources"][b].pop("vke.volcengine.com/rdma", None)
                                                      for b in ("requests", "limits")]))),
    Case("serving-pdb", "prod", "PodDisruptionBudget selects no serving pod",
         transform=on("PodDisruptionBudget", lambda p: p["spec"].update(
             selector={"matchLabels": {"app.kubernetes.io/name": "nothing"}}))),
    Case("serving-pdb", "prod", "PodDisruptionBudget over group leaders only",
         transform=on("PodDisruptionBudget", lambda p: p["spec"]["selector"]["matchLabels"].update(
             {"deepseek-volc/role": "leader"}))),
    Case("serving-drain", "prod", "vLLM without --shutdown-timeout (aborts in-flight requests)",
         transform=serving(vllm_containers(lambda c: c.update(args=[
             a for i, a in enumerate(c["args"]) if a != "--shutdown-timeout"
             and (i == 0 or c["args"][i - 1] != "--shutdown-timeout")])))),
    Case("serving-drain", "staging", "termination grace shorter than preStop + drain",
         transform=serving(pod_specs(lambda s: s.update(terminationGracePeriodSeconds=180)))),
    Case("serving-drain", "prod", "a worker's drain preStop bounded past its termination grace",
         transform=serving(vllm_containers(_unbounded_worker_drain))),
    Case("serving-min-replicas", "prod", "serving.replicas: 1",
         settings=setting("serving.replicas", 1)),
    Case("no-privileged-pods", "prod", "serving pods on the host network",
         transform=serving(pod_specs(lambda s: s.update(hostNetwork=True)))),
    # prod: staging's serving namespace enforces restricted, so there namespace-pod-security
    # refuses a privileged container as well (admission would)
    Case("no-privileged-pods", "prod", "privileged vLLM container",
         transform=serving(vllm_containers(lambda c: c["securityContext"].update(privileged=True)))),
    Case("no-plaintext-secret-env", "prod", "HF_TOKEN as a plain env value",
         transform=serving(vllm_containers(lambda c: c["env"].append({"name": "HF_TOKEN", "value": "hf_x"})))),
    Case("request-logs-without-prompts", "prod", "observability.logs.request_log.prompts: true",
         settings=setting("observability.logs.request_log.prompts", True)),
    Case("serving-default-deny-network", "prod", "default-deny NetworkPolicy admits all ingress",
         transform=on("NetworkPolicy", lambda p: p["spec"].update(ingress=[{}]), name_has="default-deny")),
    Case("serving-ingress-scoped", "prod", "the whole monitoring namespace may reach vLLM",
         transform=on("NetworkPolicy", lambda p: [peer.pop("podSelector", None) for r in p["spec"]["ingress"]
                                                  for peer in r["from"]], name_has="ingress-http")),
    Case("recommended-labels", "prod", "stable Service without app.kubernetes.io/part-of",
         transform=on("core/v1:Service", _drop_label("app.kubernetes.io/part-of"), name_has="stable")),
    Case("container-resources", "prod", "rate-limit Redis without a CPU limit",
         transform=on("apps/v1:Deployment", lambda p: [c["resources"]["limits"].pop("cpu") for c in
                                                       p["spec"]["template"]["spec"]["containers"]],
                      name_has="ratelimit-redis")),
    Case("container-resources", "staging", "weights init containers without a CPU limit",
         transform=serving(lambda p: [c["resources"]["limits"].pop("cpu") for t in _templates(p)
                                      for c in t["spec"].get("initContainers", [])])),
    Case("read-only-root-filesystem", "prod", "vLLM container with a writable root filesystem",
         transform=serving(vllm_containers(lambda c: c["securityContext"].update(readOnlyRootFilesystem=False)))),
    Case("read-only-root-filesystem", "dev", "pre-warm init container with a writable root filesystem",
         transform=on("apps/v1:DaemonSet", lambda p: p["spec"]["template"]["spec"]["initContainers"][0][
             "securityContext"].pop("readOnlyRootFilesystem"), name_has="prewarm")),
    Case("container-least-privilege", "prod", "dcgm-exporter allows privilege escalation",
         transform=on("apps/v1:DaemonSet", lambda p: p["spec"]["template"]["spec"]["containers"][0][
             "securityContext"].update(allowPrivilegeEscalation=True), name_has="dcgm-exporter")),
    Case("container-least-privilege", "prod", "dcgm-exporter without a seccomp profile",
         transform=on("apps/v1:DaemonSet", lambda p: [sc.pop("seccompProfile") for sc in (
             p["spec"]["template"]["spec"]["securityContext"],
             p["spec"]["template"]["spec"]["containers"][0]["securityContext"])], name_has="dcgm-exporter")),
    Case("container-least-privilege", "staging", "rate-limit Redis adds NET_ADMIN",
         transform=on("apps/v1:Deployment", lambda p: p["spec"]["template"]["spec"]["containers"][0][
             "securityContext"]["capabilities"].update(add=["NET_ADMIN"]), name_has="ratelimit-redis")),
    Case("namespace-pod-security", "prod", "serving namespace without an enforce label",
         transform=on("core/v1:Namespace", _drop_label("pod-security.kubernetes.io/enforce"),
                      name_has="namespace-deepseek-serving")),
    Case("namespace-pod-security", "staging", "serving namespace enforces baseline; its pods meet restricted",
         transform=on("core/v1:Namespace", lambda p: p["metadata"]["labels"].update(
             {"pod-security.kubernetes.io/enforce": "baseline"}), name_has="namespace-deepseek-serving")),
    Case("namespace-pod-security", "prod", "serving namespace enforces restricted; the node model cache is a hostPath",
         transform=on("core/v1:Namespace", lambda p: p["metadata"]["labels"].update(
             {"pod-security.kubernetes.io/enforce": "restricted"}), name_has="namespace-deepseek-serving")),
    Case("namespace-pod-security", "dev", "monitoring namespace without the audit label",
         transform=on("core/v1:Namespace", _drop_label("pod-security.kubernetes.io/audit"),
                      name_has="namespace-monitoring")),
    # gateway
    Case("gateway-jwt-auth", "prod", "JWT made optional on the route's SecurityPolicy",
         transform=on("SecurityPolicy", lambda p: p["spec"]["jwt"].update(optional=True))),
    Case("gateway-rate-limits", "prod", "serving.rate_limits.enabled: false",
         settings=setting("serving.rate_limits.enabled", False)),
    # edge
    Case("edge-subnet-limit", "prod", "APIG gateway given three subnets",
         transform=on("apig/apigGateway:ApigGateway", lambda p: p["networkSpec"].update(
             subnetIds=["subnet-a", "subnet-b", "subnet-c"]))),
    Case("edge-https-only", "prod", "public service listens on plain HTTP without a redirect",
         transform=on("apig/apigGatewayService:ApigGatewayService", lambda p: p.update(protocols=["HTTP", "HTTPS"]))),
    Case("edge-https-only", "staging", "public domain without a certificate",
         transform=on("apig/apigCustomDomain:ApigCustomDomain", lambda p: p.pop("certificateId"))),
    Case("edge-domain-not-placeholder", "prod", "gateway.tls.domain in example.com",
         settings=setting("gateway.tls.domain", "api.prod.deepseek.example.com"), mode="new"),
    Case("edge-domain-not-placeholder", "staging", "gateway.tls.certificate_id cert-deepseek-staging",
         settings=setting("gateway.tls.certificate_id", "cert-deepseek-staging")),
    Case("identity-provider-not-placeholder", "prod", "serving.auth.issuer https://auth.example.com/",
         settings=setting("serving.auth.issuer", "https://auth.example.com/")),
    Case("identity-provider-not-placeholder", "staging", "serving.auth.jwks_uri on a .test host",
         settings=setting("serving.auth.jwks_uri", "https://keys.idp.test/jwks.json")),
    # operations
    Case("autoscaler-present", "prod", "autoscaling.enabled: false",
         settings=setting("autoscaling.enabled", False)),
    Case("autoscaler-present", "staging", "ScaledObject min replicas above max",
         transform=on("ScaledObject", lambda p: p["spec"].update(minReplicaCount=5, maxReplicaCount=4))),
    Case("alerts-latency-and-errors", "prod", "monitoring.enabled: false (with observability.vmp_enabled: false)",
         settings=lambda raw: [setting("monitoring.enabled", False)(raw),
                               setting("observability.vmp_enabled", False)(raw)]),
    # metrics
    Case("vmp-receives-metrics", "prod", "in-cluster Prometheus without the remote write to VMP",
         transform=on("helm.sh/v3:Release", lambda p: p["values"]["prometheus"]["prometheusSpec"].pop("remoteWrite"),
                      name_has="kube-prometheus-stack")),
    Case("vmp-receives-metrics", "staging", "APIG monitor_spec off",
         transform=on("apig/apigGateway:ApigGateway", lambda p: p.update(monitorSpec={"enable": False}))),
    Case("alerts-delivered", "prod", "alerting.critical: [] (criticals go nowhere)",
         settings=setting("alerting.critical", [])),
    # supply chain
    Case("images-from-stack-mirror", "prod", "envoy-gateway chart from docker.io at deploy time",
         transform=on("helm.sh/v3:Release", lambda p: p.update(chart="oci://docker.io/envoyproxy/gateway-helm"),
                      name_has="envoy-gateway")),
    Case("images-by-digest", "prod", "dcgm-exporter by tag (digest dropped)",
         transform=on("apps/v1:DaemonSet", lambda p: [c.update(image=c["image"].split("@")[0])
                                                      for c in p["spec"]["template"]["spec"]["containers"]],
                      name_has="dcgm-exporter")),
    # capacity
    Case("engine-fits-gpu", "dev", "--max-model-len 131072 on one A10",
         transform=serving(vllm_containers(set_flag("--max-model-len", "131072")))),
    Case("engine-fits-gpu", "prod", "--gpu-memory-utilization 0.30 on H20",
         transform=serving(vllm_containers(set_flag("--gpu-memory-utilization", "0.30")))),
    # MIG and Triton
    Case("container-resources", "mig-example", "vLLM on a MIG pool asks for two slices",
         transform=serving(vllm_containers(lambda c: [c["resources"][k].update({"nvidia.com/mig-1g.24gb": "2"})
                                                      for k in ("requests", "limits")]))),
    Case("engine-fits-gpu", "mig-example", "a whole GPU asked for on a MIG pool",
         transform=serving(vllm_containers(lambda c: [c["resources"][k].update(
             {"nvidia.com/gpu": c["resources"][k].pop("nvidia.com/mig-1g.24gb")}) for k in ("requests", "limits")]))),
    Case("engine-fits-gpu", "triton-example", "Triton's engine args say --max-model-len 131072 on one A10",
         transform=on("apps/v1:Deployment", _triton_args("--max-model-len", "131072"), name_has="deepseek-serving")),
]


# --------------------------------------------------------------------------- running


def _pulumi_transform(fn: PropsFn, calls: list) -> Callable:
    def transform(args: pulumi.ResourceTransformArgs):
        calls.append(args.type_)
        new = fn(args.type_, args.name, dict(args.props))
        return None if new is None else pulumi.ResourceTransformResult(new, args.opts)
    return transform


def run_case(case: Case) -> list[dict]:
    # from the stack as deployed: the shipped staging/prod carry a placeholder identity
    # provider (tests/test_identity.py proves that verdict)
    raw = filled_raw(case.stack)
    if case.settings is not None:
        case.settings(raw)
    calls: list = []
    transforms = [_pulumi_transform(case.transform, calls)] if case.transform else None
    result = preview.run_preview(case.stack, raw=raw, transforms=transforms, mode=case.mode)
    # dsvolc.engine runs stack transforms on every registration, as the engine does
    assert case.transform is None or calls, f"{case.id}: the transform never ran"
    return result.violations


def run_matrix() -> dict[str, list[dict]]:
    return {c.id: run_case(c) for c in MATRIX}


def run_baselines() -> dict[str, list[dict]]:
    return {f"{s}:{m}": preview.run_preview(s, raw=filled_raw(s), mode=m).violations
            for s in STACKS for m in ("new", "existing")}


# --------------------------------------------------------------------------- docs


def _fired(case: Case, violations: list[dict]) -> list[dict]:
    # sorted: resources register concurrently, so the engine's order varies between runs
    return sorted((v for v in violations if v["policy"] == case.policy),
                  key=lambda v: (v["resource"] or "", v["message"]))


def render_docs(results: dict[str, list[dict]]) -> str:
    by_name = {p.name: p for p in POLICIES}
    infos = policy_runner.policy_infos()
    levels = {s: policy_runner.resolve_config(infos, policy_runner.load_policy_config(s)) for s in STACKS}
    # the shipped stacks dev, staging and prod are of the class of the same name
    lines = [
        "Generated by `python tests/test_policies_matrix.py --write-docs`; do not edit by hand.",
        "",
        f"`policies/` is a CrossGuard pack of {len(POLICIES)} policies. `pulumi preview --policy-pack policies "
        "--policy-pack-config $(dsvolc policy-config <stack>)` runs it against a real preview; "
        "`dsvolc preview <stack>` runs the same pack offline through pulumi_policy's analyzer servicer over "
        "the resources recorded under Pulumi's mock engine, and exits 1 on a mandatory violation.",
        "",
        "Enforcement levels and environment requirements (versioning, delete protection, replicas, image "
        "digests) come from the policy config of the stack's `environment_class`, "
        "`policies/config/<class>.json` (or the file its `policy_config` setting names), in Pulumi's policy "
        "pack config format; code never changes per stack. `dsvolc preview` prints which config it used.",
        "",
        "## Policies and levels per environment class",
        "",
        "| policy | kind | description | " + " | ".join(STACKS) + " |",
        "|---|---|---|" + "---|" * len(STACKS),
    ]
    for p in POLICIES:
        kind = "stack" if type(p).__name__ == "StackValidationPolicy" else "resource"
        cells = []
        for s in STACKS:
            c = levels[s][p.name]
            props = ", ".join(f"{k}={v}" for k, v in sorted(c.properties.items())
                              if k in ("required", "minReplicas", "requireDigest"))
            cells.append(c.enforcement_level + (f" ({props})" if props else ""))
        lines.append(f"| `{p.name}` | {kind} | {p.description} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Proof matrix",
        "",
        "Each row starts from a compliant stack (no mandatory violation), injects one unsafe change "
        "(through the stack settings, or through a Pulumi resource transform where the settings refuse the "
        "mistake), and records what the pack reported. `tests/test_policies_matrix.py` asserts the row's "
        "policy fires as mandatory and no other policy does.",
        "",
        "| policy | stack | injected violation | via | fired | message |",
        "|---|---|---|---|---|---|",
    ]
    for case in MATRIX:
        fired = _fired(case, results[case.id])
        verdict = ", ".join(sorted({v["enforcement_level"] for v in fired})) or "NO"
        msg = fired[0]["message"].replace("|", "\\|").replace("\n", " ") if fired else ""
        lines.append(f"| `{case.policy}` | {case.stack} | {case.injected} | {case.via} | {verdict} | {msg} |")
    lines += [
        "",
        "## Running it",
        "",
        "```",
        "dsvolc preview prod                        # resources, violations grouped by policy, exit 1 if mandatory",
        "dsvolc preview prod --json preview.json    # the same, with `violations` in the JSON",
        "pytest tests/test_policies_matrix.py       # the matrix above",
        "python tests/test_policies_matrix.py --write-docs   # regenerate this section",
        "```",
        "",
        f"Descriptions of every policy's fix are in its `remediation_steps` ({sum(1 for p in POLICIES if by_name)} "
        "policies), shown by the Pulumi CLI next to each violation.",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- tests


@pytest.fixture(scope="session")
def matrix_results() -> dict[str, list[dict]]:
    return run_matrix()


@pytest.fixture(scope="session")
def baselines() -> dict[str, list[dict]]:
    return run_baselines()


@pytest.mark.parametrize("mode", ["new", "existing"])
@pytest.mark.parametrize("stack", STACKS)
def test_filled_in_stacks_have_no_mandatory_violation(baselines, stack, mode):
    mandatory = [v for v in baselines[f"{stack}:{mode}"] if v["enforcement_level"] == "mandatory"]
    assert mandatory == [], f"{stack} ({mode} stack): {mandatory}"


@pytest.mark.parametrize("mode", ["new", "existing"])
def test_prod_is_clean_even_of_advisories(baselines, mode):
    assert baselines[f"prod:{mode}"] == []


@pytest.mark.slow  # one preview per row
@pytest.mark.parametrize("case", MATRIX, ids=lambda c: c.id)
def test_policy_fires_for_its_violation(matrix_results, case):
    violations = matrix_results[case.id]
    fired = _fired(case, violations)
    assert fired, f"{case.policy} did not fire for: {case.injected}; got {violations}"
    assert all(v["enforcement_level"] == "mandatory" for v in fired), fired
    assert all("Fix:" in v["message"] for v in fired), [v["message"] for v in fired]
    others = [v for v in violations if v["policy"] != case.policy and v["enforcement_level"] == "mandatory"]
    assert others == [], f"{case.injected} also tripped {[(v['policy'], v['message']) for v in others]}"


def test_every_policy_has_a_matrix_row():
    covered = {c.policy for c in MATRIX}
    missing = [p.name for p in POLICIES if p.name not in covered]
    assert missing == []
    assert len(POLICIES) >= 30


@pytest.mark.slow  # needs every row's result
def test_docs_are_generated_from_the_matrix(matrix_results):
    assert DOCS_BEGIN in DOCS.read_text(), "docs/policies.md lacks the generated-section markers"
    assert generated_section(DOCS.read_text()) == render_docs(matrix_results).strip("\n"), \
        "docs/policies.md is stale: python tests/test_policies_matrix.py --write-docs"


if __name__ == "__main__":
    if "--write-docs" not in sys.argv:
        sys.exit("usage: python tests/test_policies_matrix.py --write-docs")
    results = run_matrix()
    write_section(render_docs(results))
    bad = [c.id for c in MATRIX if not _fired(c, results[c.id])]
    print(f"wrote {DOCS} ({len(MATRIX)} rows; {len(bad)} rows where the policy did not fire: {bad})")
