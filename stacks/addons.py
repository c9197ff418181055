"""The VKE add-ons the stack installs: how VKE runs each, and the version pinned, with the
page each was read from.

`deploy_mode`: VKE runs a Managed add-on on its control plane; an Unmanaged one runs on the
cluster's nodes (`deploy_node_type` Node), the only mode in which the node type applies
(provider contract: vke/addon deployMode, deployNodeType). `version` None: no VKE page
states a release to pin, VKE installs the one matching the cluster's Kubernetes version
and the provider records it; pin one with `cluster.addon_versions`.
"""

from __future__ import annotations

from dataclasses import dataclass

ADDON_LIST = "https://www.volcengine.com/docs/6460/101027"
AUTOSCALING_GUIDE = "https://www.volcengine.com/docs/6460/100998"


@dataclass(frozen=True)
class Addon:
    name: str
    deploy_mode: str
    deploy_node_type: str | None
    version: str | None
    source: str
    purpose: str


ADDONS: dict[str, Addon] = {
    a.name: a
    for a in (
        Addon(
            "cluster-autoscaler", "Managed", None, None,
            f"VKE add-on list ({ADDON_LIST}) and node autoscaling guide ({AUTOSCALING_GUIDE}): a managed "
            "add-on, installed before node-pool autoscaling is enabled; no public changelog was found",
            "grows GPU pools for pending pods, shrinks idle ones",
        ),
        Addon(
            "nvidia-device-plugin", "Unmanaged", "Node", "v1.1.4",
            "VKE changelog https://volcengine.com/docs/6460/350800: v1.1.4 (2024.08, every Kubernetes "
            "version, maintained)",
            "advertises nvidia.com/gpu on GPU nodes",
        ),
        Addon(
            "metrics-server", "Unmanaged", "Node", None,
            f"VKE add-on list ({ADDON_LIST}); no public changelog was found",
            "resource metrics for HorizontalPodAutoscalers",
        ),
        Addon(
            "rdma-device-plugin", "Unmanaged", "Node", "v3.5.1-vke.8",
            "VKE changelog https://volcengine.com/docs/6460/1125998: v3.5.1-vke.8 (2024.07, every "
            "Kubernetes version, maintained; the add-on is in public beta)",
            "advertises vke.volcengine.com/rdma on RDMA nodes, for multi-node serving",
        ),
        Addon(
            "cr-credential-controller", "Unmanaged", "Node", None,
            f"VKE add-on list ({ADDON_LIST}); no public changelog or configuration reference was found, "
            "so it runs with its defaults",
            "hands the account's CR credentials to the nodes' image pulls (registry.pull_credentials)",
        ),
        Addon(
            "log-collector", "Unmanaged", "Node", None,
            f"VKE add-on list ({ADDON_LIST}) and TLS's Kubernetes collection guide "
            "(https://www.volcengine.com/docs/6470/111826); its configuration schema is not published "
            "with the provider, so it runs with its defaults",
            "LogCollector on every node, shipping container stdout to the stack's TLS topics",
        ),
    )
}
