"""CR Enterprise registry: a namespace and a private repository for the serving image, and
a private mirror namespace for copies of every upstream image and chart the stack deploys
(workloads/mirror.py; `dsvolc images <stack>` lists them).

Nodes pull through the VPC; the repositories are private, so the image (which carries our
kernels) is never anonymously readable.
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
    project_name: str
    tags: dict[str, str]
    mirror_namespace: str | None = None


class Registry(pulumi.ComponentResource):
    image_repository: pulumi.Output[str]
    registry_name: pulumi.Output[str]

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
        if args.mirror_namespace:
            volc.cr.Namespace(
                f"{name}-mirror-namespace",
                registry=registry.name,
                name=args.mirror_namespace,
                project=args.project_name,
                repository_default_access_level="Private",
                opts=child(self),
            )
        host = cr_registry_host(args.registry_name, args.region)
        self.registry_name = registry.name
        self.image_repository = pulumi.Output.concat(host, "/", namespace.name, "/", repo.name)
        self.register_outputs({"image_repository": self.image_repository})
