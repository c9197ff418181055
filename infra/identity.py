"""Which deploy phase a stack is in, decided at preview time from what VKE reports.

VKE enables IRSA only on a cluster that already exists and runs (the provider ignores
`irsa_enabled` on create and documents it as "valid only when modifying the cluster",
terraform-provider-volcengine volcengine/vke/cluster/resource_volcengine_vke_cluster.go at
8cff1813; docs 6460/1324613: "已创建集群,并确保集群处于运行中状态"). The OIDC provider a
reader role must trust therefore does not exist at a stack's first apply. Rather than
create a role whose principal is empty (or unknown), the program looks its own cluster up
by name with `vke.get_clusters` before registering anything; an invoke is answered during
`pulumi preview` as well as `pulumi up`, so the phase is known when the plan is shown.

Phase 1 (no cluster of that name yet): the cloud layer (VPC, cluster, pools, registry and
its VPC endpoint, weights bucket and read policy, VMP, edge). No reader role, no IAM-user
key, no Kubernetes object: the API server is private, so the Kubernetes layer is applied
from inside the VPC (docs/deploy.md) once the cluster exists.

Phase 2 (the cluster exists): IRSA is switched on (`irsa_enabled`), the reader role is
created with a trust policy on `oidc:iss`, `oidc:aud` and `oidc:sub`, and the Kubernetes
layer is deployed. The OIDC provider and issuer come from the lookup when VKE already
reports them, else from the cluster resource once this update has enabled IRSA; an empty
value stops the update rather than create a role that trusts nothing (or everything).

With `cluster.irsa: false` the IAM-user fallback replaces the role in phase 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

CLUSTER_GONE = ("Deleting", "Deleted", "Failed")


@dataclass(frozen=True)
class ExistingCluster:
    """The stack's cluster as VKE lists it (vke.get_clusters)."""

    id: str
    phase: str
    irsa_enabled: bool
    oidc_provider_trn: str
    issuer: str


@dataclass(frozen=True)
class DeployPhase:
    number: int  # 1 or 2
    name: str
    irsa: bool  # IRSA (True) or the IAM-user fallback (False)
    existing: ExistingCluster | None

    @property
    def workloads(self) -> bool:
        """The Kubernetes layer is applied (phase 2 only)."""
        return self.number >= 2

    @property
    def reader_identity(self) -> bool:
        """The weights reader identity (role or fallback user) is created (phase 2 only)."""
        return self.number >= 2

    @property
    def irsa_ready(self) -> bool:
        """VKE already reports the cluster's OIDC provider and issuer."""
        e = self.existing
        return bool(e and e.irsa_enabled and e.oidc_provider_trn and e.issuer)

    def describe(self) -> str:
        if self.number == 1:
            return ("phase 1 of 2 (new stack): cloud layer only; no reader identity and no Kubernetes objects "
                    "until the cluster exists")
        if not self.irsa:
            return "phase 2 of 2: cluster exists; IAM-user fallback for the weights reader; Kubernetes layer"
        if self.irsa_ready:
            return "phase 2 of 2: cluster exists with IRSA; reader role trusts its OIDC provider; Kubernetes layer"
        return ("phase 2 of 2: cluster exists; this update enables IRSA, then creates the reader role from the "
                "OIDC provider VKE returns; Kubernetes layer")

    def next_step(self) -> str:
        if self.number == 1:
            who = ("enable IRSA on the cluster, create the weights reader role trusting its OIDC provider "
                   "(oidc:iss, oidc:aud, oidc:sub)" if self.irsa else
                   "create the weights reader IAM user and its key (cluster.irsa: false)")
            return (f"run `pulumi up` again from inside the stack's VPC (docs/deploy.md): it will {who} "
                    "and deploy the Kubernetes layer")
        return "none: the stack is complete; later updates stay in phase 2"

    def as_dict(self) -> dict:
        return {"phase": self.number, "name": self.name, "irsa": self.irsa, "description": self.describe(),
                "next": self.next_step()}


def lookup_cluster(name: str, provider: pulumi.ProviderResource) -> ExistingCluster | None:
    """The cluster named `name`, if VKE lists one that is not going away. VKE filters by name
    loosely, so the exact name is matched here."""
    found = volc.vke.get_clusters(name=name, opts=pulumi.InvokeOptions(provider=provider))
    for c in found.clusters or []:
        if c.name != name:
            continue
        phase = (c.status.phase if c.status is not None else "") or ""
        if phase in CLUSTER_GONE:
            continue
        irsa = (c.irsa_configs or [None])[0]
        return ExistingCluster(
            id=c.id,
            phase=phase,
            irsa_enabled=bool(irsa and irsa.enabled),
            oidc_provider_trn=(irsa.oidc_trn if irsa else "") or "",
            issuer=(irsa.issuer if irsa else "") or "",
        )
    return None


def decide(irsa: bool, existing: ExistingCluster | None) -> DeployPhase:
    if existing is None:
        return DeployPhase(1, "cloud", irsa, None)
    return DeployPhase(2, "complete", irsa, existing)
