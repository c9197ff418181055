"""Managed Prometheus (VMP) workspace that receives the serving metrics and rule files.

Metrics reach it by Prometheus remote write: the in-cluster Prometheus (kube-prometheus-stack,
workloads/platform/controllers.py) writes to the workspace's intranet write endpoint with the
workspace's basic-auth user, whose password is generated here and handed to Prometheus
through a Kubernetes Secret (workloads/observability/vmp.py), never as a plain value. The APIG edge sends
its own metrics to the same workspace (`monitor_spec`, infra/gateway.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_random as random
import pulumi_volcengine as volc

from infra.common import child, tag_list

REMOTE_WRITE_USER = "remote-write"


@dataclass(frozen=True)
class ObservabilityArgs:
    workspace_name: str
    instance_type: str
    protect: bool
    project_name: str
    tags: dict[str, str]


class Observability(pulumi.ComponentResource):
    workspace_id: pulumi.Output[str]
    write_endpoint: pulumi.Output[str]
    write_username: str
    write_password: pulumi.Output[str]

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:observability:Observability", name, None, opts)
        password = random.RandomPassword(
            f"{name}-vmp-write-password",
            length=32,
            min_upper=2,
            min_lower=2,
            min_numeric=2,
            special=False,
            opts=child(self),
        )
        workspace = volc.vmp.Workspace(
            f"{name}-vmp",
            name=args.workspace_name,
            instance_type_id=args.instance_type,
            description="DeepSeek serving metrics",
            delete_protection_enabled=args.protect,
            username=REMOTE_WRITE_USER,
            password=password.result,
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self, additional_secret_outputs=["password"]),
        )
        self.workspace_id = workspace.id
        self.write_endpoint = workspace.prometheus_write_intranet_endpoint
        self.write_username = REMOTE_WRITE_USER
        self.write_password = pulumi.Output.secret(password.result)
        self.register_outputs({"workspace_id": self.workspace_id, "write_endpoint": self.write_endpoint})
