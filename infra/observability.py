"""Managed Prometheus (VMP) workspace that receives the serving metrics and rule files."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list


@dataclass(frozen=True)
class ObservabilityArgs:
    workspace_name: str
    instance_type: str
    protect: bool
    project_name: str
    tags: dict[str, str]


class Observability(pulumi.ComponentResource):
    workspace_id: pulumi.Output[str]

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:observability:Observability", name, None, opts)
        workspace = volc.vmp.Workspace(
            f"{name}-vmp",
            name=args.workspace_name,
            instance_type_id=args.instance_type,
            description="DeepSeek serving metrics",
            delete_protection_enabled=args.protect,
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self),
        )
        self.workspace_id = workspace.id
        self.register_outputs({"workspace_id": self.workspace_id})
