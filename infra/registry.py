"""CR Enterprise registry: a namespace and a private repository for the serving image, a
VPC endpoint so the stack's nodes reach it over the private network, and the credential
path the nodes pull with.

The repository is private, so the image (which carries our kernels) is never anonymously
readable; a private repository needs two things before a pod can pull from it:
- a route: the registry instance exposed to the stack's VPC (`cr.VpcEndpoint`, one entry
  per VPC; terraform-provider-volcengine volcengine/cr/cr_vpc_endpoint at 8cff1813). The
  subnet is left to CR, which picks the subnet of the VPC with the most free addresses;
- a credential: either VKE's `cr-credential-controller` add-on, which hands the nodes'
  pulls the account's CR credentials, or a `kubernetes.io/dockerconfigjson` Secret named
  in the pods' `imagePullSecrets` (`registry.pull_credentials`).
The policy `image-pullable` checks at preview that every pod image has both.

A private mirror namespace holds copies of every upstream image and chart the stack deploys
(workloads/supply_chain/mirror.py; `dsvolc images <stack>` lists them).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list
from stacks.regions import cr_registry_host



@dataclass(frozen=True)
class RegistryArgs:
    registry_name: str
    namespace: str
    repository: str
    region: str
    vpc_id: pulumi.Input[str]
    project_name: str
    tags: dict[str, str]
    mirror_namespace: str | None = None


class Registry(pulumi.ComponentResource):
    image_repository: pulumi.Output[str]
    registry_name: pulumi.Output[str]
    registry_host: str

    def __init__(self, name: str, args: RegistryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:registry:Registry", name, None, opts)
        registry = volc.cr.Registry(
            f"{name}-registry",
            name=args.registry_name,
            type="Enterprise",
            project=args.project_name,
            delete_immediately=False,
            resource_tags=tag_list(args.tags),
            opts=child(self),
        )
        namespace = volc.cr.Namespace(
            f"{name}-namespace",
            registry=registry.name,
            name=args.namespace,
            project=args.project_name,
            repository_default_access_level="Private",
            opts=child(self),
        )
        repo = volc.cr.Repository(
            f"{name}-repository",
            registry=registry.name,
            namespace=namespace.name,
            name=args.repository,
            access_level="Private",
            description="vLLM serving image with the deepseek-volc kernels",
            opts=child(self),
        )
        # The nodes pull over the VPC, not through the NAT gateway and the public endpoint.
        volc.cr.VpcEndpoint(
            f"{name}-vpc-endpoint",
            registry=registry.name,
            vpcs=[{"vpc_id": args.vpc_id}],
            opts=child(self),
        )
        # The pull credential: VKE's cr-credential-controller add-on is one of the cluster's
        # add-ons (the plan's add-ons, stacks/plan/build.py); a pull Secret is named by the pods.
        if args.mirror_namespace:
            volc.cr.Namespace(
                f"{name}-mirror-namespace",
                registry=registry.name,
                name=args.mirror_namespace,
                project=args.project_name,
                repository_default_access_level="Private",
                opts=child(self),
            )
        self.registry_host = cr_registry_host(args.registry_name, args.region)
        self.registry_name = registry.name
        self.image_repository = pulumi.Output.concat(self.registry_host, "/", namespace.name, "/", repo.name)
        self.register_outputs({"image_repository": self.image_repository})
