"""What every section shares: the strict base model, the value types, and the values the
provider contract (stacks/provider_contract.yaml) accepts for constrained arguments."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from stacks.contract import load as load_contract

Cidr = Annotated[ipaddress.IPv4Network, Field(description="An IPv4 CIDR block, e.g. 10.20.0.0/16")]
Name = Annotated[
    str,
    Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$", description="lower-case DNS label, 1-40 characters"),
]
InstanceTypeName = Annotated[
    str,
    Field(pattern=r"^ecs\.[a-z0-9]+\.[a-z0-9]+$", description="an ECS instance type id, e.g. ecs.g3i.xlarge"),
]

# Values that reach a constrained provider argument take their accepted values from the
# provider contract (stacks/provider_contract.yaml): one source of truth.
_C = load_contract()
NODE_POOL = "volcengine:vke/nodePool:NodePool"
VKE_CLUSTER = "volcengine:vke/cluster:Cluster"
KUBECONFIG = "volcengine:vke/kubeconfig:Kubeconfig"
NatSpec = _C.literal("volcengine:nat/gateway:Gateway", "spec")
DiskType = _C.literal(NODE_POOL, "nodeConfig.dataVolumes[].type")
TopologyPolicy = _C.literal(NODE_POOL, "kubernetesConfig.kubeletConfig.topologyManagerPolicy")
SseAlgorithm = _C.literal("volcengine:tos/bucketEncryption:BucketEncryption",
                          "rule.applyServerSideEncryptionByDefault.sseAlgorithm")
PodNetworkMode = _C.literal(VKE_CLUSTER, "podsConfig.podNetworkMode")
ApigInstanceSpec = _C.literal("volcengine:apig/apigGateway:ApigGateway", "resourceSpec.instanceSpecCode")


class Model(BaseModel):
    """Unknown keys are refused: a misspelt key silently falling back to a default is how
    production ends up with a public API server."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def cidr_problem(cidr: ipaddress.IPv4Network, resource_type: str, argument: str, what: str) -> str | None:
    """Why the provider contract says VolcEngine does not take `cidr` for `argument` (None:
    it does), naming the accepted ranges and where VolcEngine documents them."""
    arg = _C.argument(resource_type, argument)
    problems = arg.problems([str(cidr)] if arg.type.startswith("list") else str(cidr))
    if not problems:
        return None
    problem = re.sub(r"^\[\d+\]: ", "", problems[0])
    return f"{problem}: the private ranges {what} accepts ({arg.doc})"


def refuse_cidr(path: str, cidr: ipaddress.IPv4Network, resource_type: str, argument: str, what: str) -> None:
    """Raise naming `path` when the provider contract refuses `cidr` (see cidr_problem)."""
    problem = cidr_problem(cidr, resource_type, argument, what)
    if problem:
        raise ValueError(f"{path}: {problem}")
