"""Kubernetes workloads: no privilege or host namespaces, a read-only root filesystem, least
privilege, no plain-text secrets, no user data in request logs, default-deny networking
scoped to the gateway, Pod Security Admission labels that match the pods, recommended
labels. How pods are built to run and stay up (images, sizing, probes, availability) is
in policies/pods.py."""

from __future__ import annotations

from stacks import pod_security
from stacks.constants import ENTRY_NAMESPACE

from .common import (
    SECRET_NAME,
    WORKLOAD_KINDS,
    cfg,
    container_argv,
    containers,
    dig,
    engine_flag,
    is_vllm,
    items,
    k8s_kind,
    mapping,
    name_of,
    of_kind,
    of_type,
    pod_templates,
    resource_policy,
    serving_workloads,
    stack_policy,
    workload_containers,
    workload_kind,
)

RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)


# --------------------------------------------------------------------------- security


def _privileged(args, report):
    kind = workload_kind(args)
    if kind is None:
        return
    for _, t in pod_templates(kind, args.props):
        spec = dig(t, "spec", default={})
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if dig(spec, flag) is True:
                report(f"{kind} {name_of(args.props)} sets {flag}: its pods share the node's namespaces. Fix: "
                       f"remove {flag}; serve through a Service port.")
        for c in containers(t):
            sc = dig(c, "securityContext", default={})
            if dig(sc, "privileged") is True:
                report(f"{kind} {name_of(args.props)} container {dig(c, 'name')!r} is privileged: it owns the node. "
                       "Fix: drop privileged; the GPU device plugin exposes GPUs without it.")
            for port in items(dig(c, "ports")):
                if dig(port, "hostPort") is not None:
                    report(f"{kind} {name_of(args.props)} container {dig(c, 'name')!r} binds hostPort "
                           f"{dig(port, 'hostPort')}. Fix: expose it through a Service instead.")


# Where each container's settings come from: the container's securityContext, else the pod's.
def _effective(t, c, key):
    v = dig(c, "securityContext", key)
    return v if v is not None else dig(t, "spec", "securityContext", key)


def _read_only_root(args, report):
    exempt = mapping(cfg(args, "exempt", {}))
    if dig(args.props, "metadata", "name") in exempt:
        return
    for kind, where, t, c in workload_containers(args):
        if dig(c, "securityContext", "readOnlyRootFilesystem") is not True:
            report(f"{where} has a writable root filesystem: "
                   "whoever runs code in it can change its programs and hide files. Fix: set "
                   "readOnlyRootFilesystem: true and mount an emptyDir where it must write (workloads/engine/manifests.py "
                   "writable_mounts), or exempt the workload by name with a reason (config exempt).")


def _least_privilege(args, report):
    allowed = mapping(cfg(args, "allowedCapabilities", {}))
    for kind, where, t, c in workload_containers(args):
        cname = str(dig(c, "name"))
        wrong = []
        if dig(c, "securityContext", "allowPrivilegeEscalation") is not False:
            wrong.append("allowPrivilegeEscalation is not false")
        drop = [str(x) for x in items(dig(c, "securityContext", "capabilities", "drop"))]
        if "ALL" not in drop:
            wrong.append("capabilities.drop lacks ALL")
        added = {str(x) for x in items(dig(c, "securityContext", "capabilities", "add"))}
        extra = sorted(added - {str(x) for x in items(allowed.get(cname))})
        if extra:
            wrong.append(f"adds capabilities {extra}")
        seccomp = _effective(t, c, "seccompProfile")
        if dig(seccomp, "type") not in ("RuntimeDefault", "Localhost"):
            wrong.append("no RuntimeDefault or Localhost seccomp profile")
        if wrong:
            report(f"{where}: {'; '.join(wrong)}. Fix: allowPrivilegeEscalation: false, drop ALL capabilities, "
                   "the runtime's default seccomp profile; add back only the capabilities the container is "
                   "allowed by name (config allowedCapabilities, each with its reason in docs/operations.md "
                   "or docs/serving.md).")


def _env_secrets(args, report):
    for kind, where, _, c in workload_containers(args):
        for e in items(dig(c, "env")):
            name = str(dig(e, "name", default=""))
            if not SECRET_NAME.search(name) or name.endswith(("_FILE", "_PATH", "_TRN", "_SESSION_NAME")):
                continue  # decided by the name: values unknown in a preview are never read
            value = dig(e, "value")
            if value is None or value == "":
                continue
            report(f"{where} sets {name} as a plain value "
                   "visible to anyone who can read the object. Fix: put it in a Secret and use "
                   "valueFrom.secretKeyRef (or IRSA, which needs no key at all).")


def _request_log_prompts(args, report):
    """vLLM writes prompt text at DEBUG and completions with --enable-log-outputs
    (vllm/entrypoints/serve/utils/request_logger.py): either puts user data into every
    log line shipped to the log service."""
    for kind, where, _, c in workload_containers(args, init=False, only=is_vllm):
        argv = container_argv(c)
        found = []
        if "--enable-log-outputs" in argv:
            found.append("--enable-log-outputs (completion text)")
        if str(engine_flag(argv, "--log-level") or "").upper() == "DEBUG" and "--enable-log-requests" in argv:
            found.append("--log-level DEBUG with --enable-log-requests (prompt text)")
        if found:
            report(f"{kind} {name_of(args.props)} logs user data: {', '.join(found)}. Fix: set "
                   "observability.logs.request_log.prompts: false (request ids and parameters are still logged).")


def _default_deny(args, report):
    namespaces = {str(dig(w.props, "metadata", "namespace", default="default"))
                  for w in serving_workloads(args.resources)}
    for ns in sorted(namespaces):
        denies = [p for p in of_kind(args.resources, "NetworkPolicy")
                  if dig(p.props, "metadata", "namespace") == ns
                  and not mapping(dig(p.props, "spec", "podSelector", default={})).get("matchLabels")
                  and not items(dig(p.props, "spec", "podSelector", "matchExpressions"))
                  and "Ingress" in [str(x) for x in items(dig(p.props, "spec", "policyTypes"))]
                  and not items(dig(p.props, "spec", "ingress"))]
        if not denies:
            report(f"namespace {ns!r} runs the model server without a default-deny NetworkPolicy: any pod in the "
                   "cluster can call vLLM directly, bypassing authentication. Fix: add a NetworkPolicy with an "
                   "empty podSelector, policyTypes [Ingress, Egress] and no rules, then allow the gateway and "
                   "Prometheus explicitly.")


# --------------------------------------------------------------------------- pod security admission

PSA = "pod-security.kubernetes.io"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


def _namespace_pod_security(args, report):
    """The labels of each Namespace against the pods of the stack in it (stacks/pod_security.py).
    A namespace holding a Helm release has pods no one sees here: it needs no enforce label,
    and is not told its enforce level is weaker than its (visible) pods allow."""
    charts = {str(dig(r.props, "namespace")) for r in of_type(args.resources, HELM_RELEASE)}
    pods: dict[str, list] = {}
    for r in args.resources:
        kind = k8s_kind(r.resource_type)
        if kind not in WORKLOAD_KINDS:
            continue
        ns = str(dig(r.props, "metadata", "namespace", default="default"))
        for role, t in pod_templates(kind, r.props):
            pods.setdefault(ns, []).append((f"{kind} {name_of(r.props)} ({role})", t))
    for r in of_kind(args.resources, "Namespace"):
        name = str(dig(r.props, "metadata", "name"))
        labels = {str(k): str(v) for k, v in mapping(dig(r.props, "metadata", "labels", default={})).items()}
        where = f"namespace {name!r}"
        for mode in ("audit", "warn"):
            if labels.get(f"{PSA}/{mode}") != pod_security.RESTRICTED:
                report(f"{where} has {PSA}/{mode}={labels.get(f'{PSA}/{mode}')!r}, not 'restricted': the API server "
                       "does not record pods that fall short of the restricted profile. Fix: label it with "
                       "workloads/platform/namespaces.py psa_labels.", r.urn)
        for mode in ("audit", "warn", "enforce"):
            version = labels.get(f"{PSA}/{mode}-version")
            if f"{PSA}/{mode}" in labels and (version is None or version == "latest"):
                report(f"{where} has {PSA}/{mode} without a pinned {mode}-version ({version!r}): a cluster "
                       "upgrade changes what it checks unseen. Fix: pin it to the cluster's minor version.", r.urn)
        enforce = labels.get(f"{PSA}/enforce")
        version = labels.get(f"{PSA}/enforce-version") or "latest"
        templates = pods.get(name, [])
        try:
            best = pod_security.strictest_level(
                ((dig(t, "spec", default={}), dig(t, "metadata", default={})) for _, t in templates), version)
        except ValueError as exc:
            report(f"{where}: {exc}", r.urn)
            continue
        if enforce is None:
            if name not in charts:
                report(f"{where} enforces no Pod Security level though the stack renders all its pods, which meet "
                       f"{best!r}: nothing in the cluster refuses a pod that breaks it. Fix: label it "
                       f"{PSA}/enforce={best}.", r.urn)
            continue
        if enforce not in pod_security.LEVELS:
            report(f"{where} has {PSA}/enforce={enforce!r}; expected one of {list(pod_security.LEVELS)}.", r.urn)
            continue
        for what, t in templates:
            broken = pod_security.meets(dig(t, "spec", default={}), dig(t, "metadata", default={}), enforce, version)
            if broken:
                report(f"{what} breaks the level its namespace {name!r} enforces ({enforce}, {version}): "
                       f"{'; '.join(str(f) for f in broken)}. Admission would refuse its pods. Fix: change the pod "
                       "or let workloads/platform/namespaces.py compute the level.", r.urn)
        if name not in charts and pod_security.weaker(enforce, best):
            report(f"{where} enforces {enforce!r} but all its pods meet {best!r}: a pod that breaks {best!r} would "
                   f"still be admitted. Fix: label it {PSA}/enforce={best}.", r.urn)


NS_NAME_LABEL = "kubernetes.io/metadata.name"


def _ingress_scoped(args, report):
    """Who may reach the serving pods: the gateway's namespace, named pods of another
    namespace (Prometheus), address blocks (the edge) or the serving pods themselves; never
    a whole other namespace, where any pod (Grafana, a debug shell) would bypass the JWT."""
    namespaces = {str(dig(w.props, "metadata", "namespace", default="default"))
                  for w in serving_workloads(args.resources)}
    for p in of_kind(args.resources, "NetworkPolicy"):
        if str(dig(p.props, "metadata", "namespace", default="default")) not in namespaces:
            continue
        for rule in items(dig(p.props, "spec", "ingress")):
            for peer in items(dig(rule, "from")):
                ns_sel = dig(peer, "namespaceSelector")
                if ns_sel is None:
                    continue
                ns = mapping(dig(ns_sel, "matchLabels", default={})).get(NS_NAME_LABEL)
                pods = dig(peer, "podSelector")
                scoped = pods is not None and (mapping(dig(pods, "matchLabels", default={}))
                                               or items(dig(pods, "matchExpressions")))
                if ns == ENTRY_NAMESPACE or scoped:
                    continue
                who = f"namespace {ns!r}" if ns else "every namespace the selector matches"
                report(f"NetworkPolicy {name_of(p.props)} admits every pod of {who} to the model server, past "
                       "the gateway's JWT and rate limits. Fix: add a podSelector naming the pods that need it "
                       "(Prometheus by its operator's labels, workloads/edge/network_policy.py).", p.urn)


def _labels(args, report):
    kind = k8s_kind(args.resource_type)
    if kind is None or dig(args.props, "metadata") is None:
        return
    labels = mapping(dig(args.props, "metadata", "labels", default={}))
    missing = [k for k in RECOMMENDED_LABELS if k not in labels]
    if kind in WORKLOAD_KINDS:
        for _, t in pod_templates(kind, args.props):
            tl = mapping(dig(t, "metadata", "labels", default={}))
            missing += [f"template {k}" for k in RECOMMENDED_LABELS if k not in tl]
    if missing:
        report(f"{kind} {name_of(args.props)} lacks the recommended labels {', '.join(missing)}: dashboards, "
               "selectors and cost reports group by them. Fix: build metadata with ctx.metadata()/ctx.labels().")


POLICIES = [
    resource_policy(
        "no-privileged-pods",
        "No privileged containers, host namespaces (network, PID, IPC) or host ports.",
        _privileged,
        fix="Remove privileged, hostNetwork/hostPID/hostIPC and hostPort.",
        tags=["workloads"],
    ),
    resource_policy(
        "no-plaintext-secret-env",
        "Credentials are never plain environment values.",
        _env_secrets,
        fix="Use valueFrom.secretKeyRef (or IRSA).",
        tags=["workloads"],
    ),
    resource_policy(
        "request-logs-without-prompts",
        "The model server does not log prompt or completion text.",
        _request_log_prompts,
        fix="Set observability.logs.request_log.prompts: false.",
        tags=["workloads", "privacy"],
    ),
    stack_policy(
        "serving-default-deny-network",
        "The serving namespace has a default-deny NetworkPolicy.",
        _default_deny,
        fix="Add a NetworkPolicy with an empty podSelector and no rules.",
        tags=["workloads", "network"],
    ),
    stack_policy(
        "serving-ingress-scoped",
        "Only the gateway's namespace, named pods or address blocks may reach the model server; no whole namespace.",
        _ingress_scoped,
        fix="Give every namespaceSelector peer of the serving NetworkPolicies a podSelector.",
        tags=["workloads", "network"],
    ),
    resource_policy(
        "recommended-labels",
        "Kubernetes objects carry the app.kubernetes.io recommended labels.",
        _labels,
        fix="Use ctx.metadata()/ctx.labels() for every object.",
        tags=["workloads"],
    ),
    resource_policy(
        "read-only-root-filesystem",
        "Containers run with a read-only root filesystem; they write to emptyDirs only.",
        _read_only_root,
        fix="Set readOnlyRootFilesystem: true; mount an emptyDir at each path the container writes.",
        config={"exempt": {
            "type": "object", "additionalProperties": {"type": "string"},
            "default": {"dcgm-exporter": "NVIDIA's entrypoint rewrites /etc/ld.so.cache (ldconfig) and sets file "
                                         "capabilities on its binary (setcap) under set -e "
                                         "(docs/operations.md)"},
            "description": "workload name -> why its root filesystem stays writable"}},
        tags=["workloads", "security"],
    ),
    resource_policy(
        "container-least-privilege",
        "Containers cannot escalate privileges, drop every capability, run under a seccomp profile and add back "
        "only the capabilities allowed to them by name.",
        _least_privilege,
        fix="allowPrivilegeEscalation: false, capabilities.drop: [ALL], seccompProfile RuntimeDefault.",
        config={"allowedCapabilities": {
            "type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}},
            # dcgm-exporter: DCGM's profiling fields (monitoring.dcgm_profiling_metrics);
            # vllm/triton: RDMA pins memory (workloads/engine/rdma.py)
            "default": {"dcgm-exporter": ["SYS_ADMIN"], "vllm": ["IPC_LOCK"], "triton": ["IPC_LOCK"]},
            "description": "container name -> the capabilities it may add"}},
        tags=["workloads", "security"],
    ),
    stack_policy(
        "namespace-pod-security",
        "Every namespace carries Pod Security Admission labels: audit and warn at restricted, versions pinned, and "
        "enforce at the strictest level its pods meet where the program renders all of them; no pod breaks the "
        "level its namespace enforces.",
        _namespace_pod_security,
        fix="Build namespaces with workloads/platform/namespaces.py (label / platform_namespaces).",
        tags=["workloads", "security"],
    ),

]
