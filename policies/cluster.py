"""VKE: GPU pools tainted and labelled, sane autoscaling, a supported version, protection
against deletion in prod, control-plane audit logs, a short-lived deploy kubeconfig."""

from __future__ import annotations

from stacks.regions import SUPPORTED_KUBERNETES_VERSIONS

from .common import (
    GPU_COUNT_LABEL,
    GPU_MODEL_LABEL,
    GPU_RESOURCE,
    VKE_CLUSTER,
    VKE_NODE_POOL,
    cfg,
    dig,
    items,
    label_list,
    number,
    resource_policy,
)


def _is_gpu_pool(props) -> bool:
    return GPU_MODEL_LABEL in label_list(dig(props, "kubernetesConfig", "labels"))


def _gpu_tainted(args, report):
    if args.resource_type != VKE_NODE_POOL or not _is_gpu_pool(args.props):
        return
    taints = items(dig(args.props, "kubernetesConfig", "taints"))
    if not any(dig(t, "key") == GPU_RESOURCE and dig(t, "effect") == "NoSchedule" for t in taints):
        report(f"GPU node pool {dig(args.props, 'name')!r} has no {GPU_RESOURCE}=present:NoSchedule taint, so "
               "system pods can land on (and keep awake) GPU nodes. Fix: add the taint to "
               "kubernetes_config.taints (infra/cluster.py GPU_TAINT).")


def _gpu_labelled(args, report):
    if args.resource_type != VKE_NODE_POOL or not _is_gpu_pool(args.props):
        return
    labels = label_list(dig(args.props, "kubernetesConfig", "labels"))
    count = number(labels.get(GPU_COUNT_LABEL))
    if count is None or count < 1:
        report(f"GPU node pool {dig(args.props, 'name')!r} lacks a numeric {GPU_COUNT_LABEL} label, which the "
               "capacity check and the pod's GPU request rely on. Fix: set gpus_per_node on the pool.")


def _autoscaling_bounds(args, report):
    if args.resource_type != VKE_NODE_POOL:
        return
    a = dig(args.props, "autoScaling", default={})
    name = dig(args.props, "name")
    if dig(a, "enabled") is not True:
        report(f"node pool {name!r} does not autoscale. Fix: set auto_scaling.enabled=True with min/max bounds.")
        return
    lo = number(dig(a, "minReplicas"), 0.0)
    hi = number(dig(a, "maxReplicas"), 0.0)
    desired = number(dig(a, "desiredReplicas"), lo)
    cap = number(cfg(args, "maxNodes", 64))
    problems = []
    if lo < 0:
        problems.append(f"min {lo:g} < 0")
    if hi < 1:
        problems.append(f"max {hi:g} < 1")
    if lo > hi:
        problems.append(f"min {lo:g} > max {hi:g}")
    if not lo <= desired <= hi:
        problems.append(f"desired {desired:g} outside [{lo:g}, {hi:g}]")
    if hi > cap:
        problems.append(f"max {hi:g} above the cap of {cap:g} nodes")
    if problems:
        report(f"node pool {name!r} autoscaling bounds are not sane: {'; '.join(problems)}. Fix: set "
               "min_nodes <= desired_nodes <= max_nodes (cluster.gpu_pools.<pool> or cluster.system_pool).")


def _supported_version(args, report):
    if args.resource_type != VKE_CLUSTER:
        return
    supported = [str(v) for v in cfg(args, "supportedVersions", list(SUPPORTED_KUBERNETES_VERSIONS))]
    version = str(dig(args.props, "kubernetesVersion", default=""))
    if version not in supported:
        report(f"Kubernetes {version or '(unset)'} is not a supported VKE version. Fix: a new cluster: set "
               f"cluster.kubernetes_version to one of {', '.join(supported)}; an existing one: upgrade it in "
               "place through VKE first, then set the version it runs (the program ignores a change of "
               "this field, which the provider would apply by replacing the cluster; docs/deploy.md, "
               "Upgrading Kubernetes).")


def _delete_protection(args, report):
    if args.resource_type != VKE_CLUSTER:
        return
    if not cfg(args, "required", True):
        args.not_applicable("delete protection not required by this stack's policy config")
    if dig(args.props, "deleteProtectionEnabled", default=False) is not True:
        report("the cluster can be deleted by one API call. Fix: set cluster.delete_protection: true in the "
               "stack settings.")


def _audit_logging(args, report):
    if args.resource_type != VKE_CLUSTER:
        return
    setups = items(dig(args.props, "loggingConfig", "logSetups"))
    if not any(dig(s, "logType") == "Audit" and dig(s, "enabled") is True for s in setups):
        report("the cluster's audit log is off: nobody can tell who changed the serving objects. Fix: set "
               "cluster.control_plane_logging: true.")


KUBECONFIG = "volcengine:vke/kubeconfig:Kubeconfig"
# What VKE issues when valid_duration is left out: 26,280 hours, three years (provider
# resource_volcengine_vke_kubeconfig.go line 49; BytePlus CreateKubeconfig).
VKE_DEFAULT_KUBECONFIG_HOURS = 26280


def _kubeconfig_short_lived(args, report):
    if args.resource_type != KUBECONFIG:
        return
    limit = number(cfg(args, "maxValidHours", 168))
    hours = number(dig(args.props, "validDuration"), float(VKE_DEFAULT_KUBECONFIG_HOURS))
    if hours > limit:
        report(f"the kubeconfig is valid for {hours:g} h ({hours / 24:g} days), above the {limit:g} h this "
               "stack's policy allows: a leaked copy (stack state, a runner's disk) would hold the cluster that long. "
               "Fix: set cluster.deploy_kubeconfig.valid_hours to at most "
               f"{limit:g} (pulumi up rotates it every rotate_hours).")


POLICIES = [
    resource_policy(
        "gpu-pool-tainted",
        "GPU node pools must carry the nvidia.com/gpu NoSchedule taint.",
        _gpu_tainted,
        fix="Add nvidia.com/gpu=present:NoSchedule to the pool's taints.",
        tags=["cluster"],
    ),
    resource_policy(
        "gpu-pool-labelled",
        "GPU node pools must state their GPU model and count as labels.",
        _gpu_labelled,
        fix="Set gpu and gpus_per_node on the pool (or use a catalogued instance type).",
        tags=["cluster"],
    ),
    resource_policy(
        "node-pool-autoscaling-bounds",
        "Node pools autoscale within sane bounds (0 <= min <= desired <= max <= cap).",
        _autoscaling_bounds,
        fix="Set min_nodes <= desired_nodes <= max_nodes.",
        config={"maxNodes": {"type": "integer", "default": 64, "minimum": 1,
                             "description": "largest max_nodes a pool may ask for"}},
        tags=["cluster"],
    ),
    resource_policy(
        "vke-supported-version",
        "The cluster runs a Kubernetes version VKE supports.",
        _supported_version,
        fix="New cluster: pick a supported cluster.kubernetes_version. Existing cluster: upgrade it in place "
            "through VKE, then set the version it runs (docs/deploy.md, Upgrading Kubernetes).",
        config={"supportedVersions": {"type": "array", "items": {"type": "string"},
                                      "default": list(SUPPORTED_KUBERNETES_VERSIONS),
                                      "description": "accepted VKE minor versions"}},
        tags=["cluster"],
    ),
    resource_policy(
        "vke-delete-protection",
        "The cluster must have delete protection (required in prod).",
        _delete_protection,
        fix="Set cluster.delete_protection: true.",
        config={"required": {"type": "boolean", "default": True,
                             "description": "whether this stack requires delete protection"}},
        tags=["cluster"],
    ),
    resource_policy(
        "vke-audit-logging",
        "The cluster ships its audit log.",
        _audit_logging,
        fix="Set cluster.control_plane_logging: true.",
        tags=["cluster"],
    ),
    resource_policy(
        "kubeconfig-short-lived",
        "The kubeconfig the stack creates is valid for a bounded time (168 h unless the config says otherwise).",
        _kubeconfig_short_lived,
        fix="Set cluster.deploy_kubeconfig.valid_hours within the limit.",
        config={"maxValidHours": {"type": "integer", "default": 168, "minimum": 1,
                                  "description": "longest validity, in hours, of a kubeconfig the stack creates"}},
        tags=["cluster", "credentials"],
    ),
]
