"""Helpers every policy module uses: building policies, reading properties safely.

Properties reach a policy as pulumi_policy proxies (Mapping / Sequence, not dict / list)
whose unknown values raise when read during a real preview; the helpers below navigate
them lazily so a policy reads only what it needs. Numbers arrive as floats (protobuf
Struct), so compare them numerically.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterator

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from stacks.constants import (  # noqa: F401
    ENGINE_ARGS_ANNOTATION,
    GPU_COUNT_LABEL,
    GPU_MODEL_LABEL,
    GPU_RESOURCE,
    MIG_PROFILE_LABEL,
    MIG_RESOURCE_PREFIX,
    POOL_LABEL,
)

# Every policy defaults to mandatory: a stack run without a config file gets the strictest
# verdict. policies/config/<environment class>.json relaxes levels per class.
DEFAULT_LEVEL = EnforcementLevel.MANDATORY

ResourceCheck = Callable[[ResourceValidationArgs, ReportViolation], None]
StackCheck = Callable[[StackValidationArgs, ReportViolation], None]


def _policy(cls, name: str, description: str, check, fix: str, config: dict[str, dict] | None,
            tags: list[str] | None):
    return cls(
        name=name,
        description=description,
        validate=check,
        enforcement_level=DEFAULT_LEVEL,
        config_schema=PolicyConfigSchema(properties=config) if config else None,
        remediation_steps=fix,
        tags=tags,
    )


def resource_policy(
    name: str,
    description: str,
    check: ResourceCheck,
    *,
    fix: str,
    config: dict[str, dict] | None = None,
    tags: list[str] | None = None,
) -> ResourceValidationPolicy:
    """A resource policy; `fix` is the remediation text shown by `pulumi policy` tooling."""
    return _policy(ResourceValidationPolicy, name, description, check, fix, config, tags)


def stack_policy(
    name: str,
    description: str,
    check: StackCheck,
    *,
    fix: str,
    config: dict[str, dict] | None = None,
    tags: list[str] | None = None,
) -> StackValidationPolicy:
    """A stack policy: sees every resource of the stack at once."""
    return _policy(StackValidationPolicy, name, description, check, fix, config, tags)


def cfg(args: ResourceValidationArgs | StackValidationArgs, key: str, default: Any) -> Any:
    """A policy config property; the engine fills schema defaults, this covers a direct call."""
    config = args.get_config() or {}
    return config.get(key, default)


# --------------------------------------------------------------------------- reading props


def dig(obj: Any, *path: Any, default: Any = None) -> Any:
    """obj[path[0]][path[1]]..., or `default` where a step is missing."""
    cur = obj
    for key in path:
        if isinstance(key, int):
            if isinstance(cur, Sequence) and not isinstance(cur, str) and -len(cur) <= key < len(cur):
                cur = cur[key]
            else:
                return default
        elif isinstance(cur, Mapping) and key in cur:
            cur = cur[key]
        else:
            return default
    return default if cur is None else cur


def items(obj: Any) -> list:
    """A sequence as a list; anything else (None, a scalar) as an empty list."""
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        return [obj[i] for i in range(len(obj))]
    return []


def as_list(obj: Any) -> list:
    """IAM documents allow a string where a list is meant."""
    if obj is None:
        return []
    if isinstance(obj, str):
        return [obj]
    return items(obj)


def mapping(obj: Any) -> dict:
    if isinstance(obj, Mapping):
        return {k: obj[k] for k in obj}
    return {}


def number(value: Any, default: float | None = None) -> float | None:
    if isinstance(value, bool):
        return default
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return default
    return default


def json_doc(value: Any) -> dict:
    """A policy document given as a JSON string (VolcEngine IAM/TOS take strings)."""
    if isinstance(value, Mapping):
        return mapping(value)
    if not isinstance(value, str) or not value.strip():
        return {}
    try:
        doc = json.loads(value)
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def statements(doc: dict) -> list[dict]:
    st = doc.get("Statement", [])
    if isinstance(st, dict):
        return [st]
    return [s for s in st if isinstance(s, dict)] if isinstance(st, list) else []


def label_list(value: Any) -> dict[str, str]:
    """VolcEngine takes labels and tags as [{key, value}]."""
    return {str(dig(x, "key", default="")): str(dig(x, "value", default="")) for x in items(value)}


# --------------------------------------------------------------------------- types

TOS_BUCKET = "volcengine:tos/bucket:Bucket"
TOS_BUCKET_POLICY = "volcengine:tos/bucketPolicy:BucketPolicy"
TOS_BUCKET_ENCRYPTION = "volcengine:tos/bucketEncryption:BucketEncryption"
IAM_POLICY = "volcengine:iam/policy:Policy"
IAM_ROLE = "volcengine:iam/role:Role"
IAM_ROLE_ATTACH = "volcengine:iam/rolePolicyAttachment:RolePolicyAttachment"
IAM_USER_ATTACH = "volcengine:iam/userPolicyAttachment:UserPolicyAttachment"
VKE_CLUSTER = "volcengine:vke/cluster:Cluster"
VKE_NODE_POOL = "volcengine:vke/nodePool:NodePool"
SG = "volcengine:vpc/securityGroup:SecurityGroup"
SG_RULE = "volcengine:vpc/securityGroupRule:SecurityGroupRule"
SUBNET = "volcengine:vpc/subnet:Subnet"
SNAT = "volcengine:nat/snatEntry:SnatEntry"
NAT = "volcengine:nat/gateway:Gateway"
EIP_ASSOC = "volcengine:eip/associate:Associate"
CR_REGISTRY = "volcengine:cr/registry:Registry"
CR_NAMESPACE = "volcengine:cr/namespace:Namespace"
CR_REPOSITORY = "volcengine:cr/repository:Repository"
APIG_ROUTE = "volcengine:apig/apigRoute:ApigRoute"
APIG_UPSTREAM = "volcengine:apig/apigUpstream:ApigUpstream"
APIG_SERVICE = "volcengine:apig/apigGatewayService:ApigGatewayService"
VOLC_PROVIDER = "pulumi:providers:volcengine"



def k8s_kind(resource_type: str) -> str | None:
    """`kubernetes:apps/v1:Deployment` -> `Deployment`; None for non-Kubernetes types."""
    if not resource_type.startswith("kubernetes:"):
        return None
    return resource_type.rsplit(":", 1)[-1]


def workload_kind(args) -> str | None:
    """The Kubernetes kind of the resource a policy judges when it runs pods, else None."""
    kind = k8s_kind(args.resource_type)
    return kind if kind in WORKLOAD_KINDS else None


def k8s_group(resource_type: str) -> str:
    """`kubernetes:gateway.envoyproxy.io/v1alpha1:SecurityPolicy` -> `gateway.envoyproxy.io`."""
    middle = resource_type.split(":")[1] if resource_type.count(":") >= 2 else ""
    return middle.split("/")[0] if "/" in middle else ""


def of_kind(resources: list, kind: str, group: str | None = None) -> list:
    out = []
    for r in resources:
        if k8s_kind(r.resource_type) == kind and (group is None or k8s_group(r.resource_type) == group):
            out.append(r)
    return out


def of_type(resources: list, type_: str) -> list:
    return [r for r in resources if r.resource_type == type_]


def urn_env(urn: str) -> str:
    """The stack name inside a URN (`urn:pulumi:<stack>::<project>::...`)."""
    parts = urn.split(":")
    return parts[2] if len(parts) > 2 else ""


# --------------------------------------------------------------------------- workloads

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "LeaderWorkerSet", "Rollout")


def pod_templates(kind: str | None, props: Any) -> list[tuple[str, Any]]:
    """(role, pod template) pairs of a workload: one for a Deployment, leader and worker
    for a LeaderWorkerSet (spec.leaderWorkerTemplate), the inline template of a Rollout."""
    spec = dig(props, "spec", default={})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Rollout"):
        t = dig(spec, "template")
        return [("pod", t)] if t is not None else []
    if kind == "Job":
        t = dig(spec, "template")
        return [("job", t)] if t is not None else []
    if kind == "LeaderWorkerSet":
        lwt = dig(spec, "leaderWorkerTemplate", default={})
        out = []
        for role, key in (("leader", "leaderTemplate"), ("worker", "workerTemplate")):
            t = dig(lwt, key)
            if t is not None:
                out.append((role, t))
        return out
    return []


def containers(template: Any, *, init: bool = True) -> list:
    spec = dig(template, "spec", default={})
    found = items(dig(spec, "containers"))
    if init:
        found += items(dig(spec, "initContainers"))
    return found


def container_argv(c: Any) -> list[str]:
    """command + args as one list of strings; `--flag=value` split into two."""
    argv: list[str] = []
    for part in items(dig(c, "command")) + items(dig(c, "args")):
        s = str(part)
        if s.startswith("--") and "=" in s:
            flag, value = s.split("=", 1)
            argv += [flag, value]
        else:
            argv.append(s)
    return argv


def engine_flag(argv: list[str], flag: str) -> str | None:
    """Value of `--flag` in a vLLM command line (the last occurrence wins, as in argparse)."""
    value = None
    for i, part in enumerate(argv):
        if part == flag and i + 1 < len(argv):
            value = argv[i + 1]
    return value


TRITON_FRONTEND = "openai_frontend/main.py"  # Triton's OpenAI-compatible frontend


def is_triton(c: Any) -> bool:
    """A Triton Inference Server container running the vLLM engine behind its OpenAI frontend."""
    return any(TRITON_FRONTEND in part for part in container_argv(c))


def is_vllm(c: Any) -> bool:
    """The serving container: it runs `vllm serve` (or the OpenAI server module), or Triton
    with its vLLM backend."""
    argv = container_argv(c)
    text = " ".join(argv)
    # a group worker starts it from a shell (`sh -c 'exec python3 -m vllm.entrypoints.cli.main serve ...'`)
    return (("vllm" in text and "serve" in argv) or "vllm.entrypoints.cli.main serve" in text
            or "vllm.entrypoints.openai.api_server" in text or is_triton(c))


def engine_argv(template: Any, c: Any) -> list[str]:
    """The engine's arguments as vLLM flags: the command line of a vLLM container, or the
    engine-args annotation of a Triton pod (its model.json as flags)."""
    if not is_triton(c):
        return container_argv(c)
    raw = dig(template, "metadata", "annotations", ENGINE_ARGS_ANNOTATION)
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else []
    except json.JSONDecodeError:
        return []
    return [str(x) for x in parsed] if isinstance(parsed, list) else []


def serving_workloads(resources: list) -> list:
    """Workload resources whose pod template runs vLLM."""
    out = []
    for r in resources:
        kind = k8s_kind(r.resource_type)
        if kind not in WORKLOAD_KINDS:
            continue
        if any(is_vllm(c) for _, t in pod_templates(kind, r.props) for c in containers(t, init=False)):
            out.append(r)
    return out


def iter_workload_containers(kind: str | None, props: Any, *, init: bool = True) -> Iterator[tuple[str, Any, Any]]:
    """(role, template, container) for every container of a workload."""
    for role, t in pod_templates(kind, props):
        for c in containers(t, init=init):
            yield role, t, c


def workload_containers(args, *, init: bool = True, only=None) -> Iterator[tuple[str, str, Any, Any]]:
    """(kind, where, pod template, container) for every container of the resource under
    review, none when it is not a workload; ``only``: a predicate on the container; ``where``
    names the workload and the container for a violation's message."""
    kind = workload_kind(args)
    if kind is None:
        return
    for _, t, c in iter_workload_containers(kind, args.props, init=init):
        if only is None or only(c):
            yield kind, f"{kind} {name_of(args.props)} container {dig(c, 'name')!r}", t, c


def name_of(props: Any) -> str:
    ns = dig(props, "metadata", "namespace", default="")
    name = dig(props, "metadata", "name", default="")
    return f"{ns}/{name}" if ns else str(name)


def selector_matches(selector: Any, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels + matchExpressions) against labels.
    An empty selector matches everything."""
    match = mapping(dig(selector, "matchLabels", default={}))
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for expr in items(dig(selector, "matchExpressions")):
        key, op = dig(expr, "key"), dig(expr, "operator")
        values = [str(v) for v in items(dig(expr, "values"))]
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def gpu_requests(c: Any) -> tuple[dict, dict]:
    """The GPU resources (nvidia.com/gpu and nvidia.com/mig-<profile>) a container requests
    and limits, as {resource: number or None}."""
    req = mapping(dig(c, "resources", "requests", default={}))
    lim = mapping(dig(c, "resources", "limits", default={}))

    def pick(d: dict) -> dict:
        return {str(k): number(v) for k, v in d.items()
                if str(k) == GPU_RESOURCE or str(k).startswith(MIG_RESOURCE_PREFIX)}
    return pick(req), pick(lim)


SECRET_NAME = re.compile(r"(SECRET|PASSWORD|PASSWD|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)", re.I)
