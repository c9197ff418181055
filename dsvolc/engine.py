"""Run the real Pulumi program under Pulumi's own mock engine and record every resource.

Nothing is faked but the cloud: the program, the providers' Python SDKs, the resource
options and the serialisation are the ones `pulumi up` uses. The monitor records what the
engine would receive for each registration (type, name, parent, dependencies, inputs) and
answers with the inputs plus the few computed outputs the program reads back (ids, an
OIDC provider, a kubeconfig), so that dependent resources see realistic values.
"""

from __future__ import annotations

import base64
import inspect
import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.settings import reset_options
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from stacks.loader import PROJECT, SETTINGS_KEY

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "__main__.py"
MASK = "[secret]"
FAKE_ACCOUNT = "2100000000"
_SECRET_SIG = rpc._special_sig_key
_SECRET_VALUE = rpc._special_secret_sig


@dataclass
class Recorded:
    type: str
    name: str
    urn: str
    parent: str | None
    dependencies: list[str]
    inputs: dict[str, Any]  # secrets masked, as shown to people
    raw_inputs: dict[str, Any]  # secrets unwrapped, as the policy analyzer receives them
    custom: bool
    provider: str | None
    id: str | None = None
    ignore_changes: list[str] = field(default_factory=list)  # the resource option, as registered

    def as_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "name": self.name,
            "urn": self.urn,
            "parent": self.parent,
            "dependencies": self.dependencies,
            "inputs": self.inputs,
        }


@dataclass
class Recording:
    stack: str
    resources: list[Recorded] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == type_]

    def named(self, name: str) -> Recorded:
        for r in self.resources:
            if r.name == name:
                return r
        raise KeyError(f"no resource named {name!r}")


def _fake_kubeconfig(cluster_id: str) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_id, "cluster": {"server": f"https://{cluster_id}.vke.internal:6443"}}],
        "users": [{"name": "admin", "user": {"token": "preview-only"}}],
        "contexts": [{"name": "default", "context": {"cluster": cluster_id, "user": "admin"}}],
        "current-context": "default",
    }
    return base64.b64encode(json.dumps(doc).encode()).decode()


class PreviewMocks(pulumi_mocks.Mocks):
    """Computed outputs the program reads back; everything else echoes the inputs."""

    def new_resource(self, args: pulumi_mocks.MockResourceArgs):
        state = dict(args.inputs)
        rid = f"{args.name}-id"
        t = args.typ
        if t == "volcengine:vke/cluster:Cluster":
            state["irsaConfigs"] = [
                {
                    "enabled": bool(args.inputs.get("irsaEnabled")),
                    "oidcTrn": f"trn:iam::{FAKE_ACCOUNT}:oidc-provider/vke-{rid}",
                    "issuer": f"https://oidc.vke.volces.com/{rid}",
                    "audience": "sts.volcengine.com",
                }
            ]
        elif t == "volcengine:eip/address:Address":
            state["eipAddress"] = "203.0.113.10"
        elif t == "volcengine:iam/role:Role":
            state["trn"] = f"trn:iam::{FAKE_ACCOUNT}:role/{args.inputs.get('roleName')}"
        elif t == "volcengine:iam/user:User":
            state["trn"] = f"trn:iam::{FAKE_ACCOUNT}:user/{args.inputs.get('userName')}"
        elif t == "volcengine:iam/accessKey:AccessKey":
            state["accessKeyId"] = "AKLTpreview"
            state["secretAccessKey"] = "preview-secret"
        return rid, state

    def call(self, args: pulumi_mocks.MockCallArgs):
        if args.token == "volcengine:vke/getKubeconfigs:getKubeconfigs":
            ids = args.args.get("ids") or ["kubeconfig"]
            return {
                "kubeconfigs": [
                    {"id": i, "kubeconfigId": i, "clusterId": "cluster", "kubeconfig": _fake_kubeconfig("cluster"),
                     "type": "Private", "createTime": "", "expireTime": "", "userId": 0}
                    for i in ids
                ],
                "totalCount": len(ids),
                "ids": ids,
            }
        return {}


def _unwrap(value: Any, mask: bool) -> Any:
    if isinstance(value, dict):
        if value.get(_SECRET_SIG) == _SECRET_VALUE:
            return MASK if mask else _unwrap(value.get("value"), mask)
        return {k: _unwrap(v, mask) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_unwrap(v, mask) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # protobuf carries every number as a double
    return value


class RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi_mocks.Mocks, recording: Recording):
        super().__init__(mocks)
        self.recording = recording

    def RegisterResource(self, request):
        if self._stack_transforms and request.type != "pulumi:pulumi:Stack":
            self._apply_stack_transforms(request)
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        props = rpc.deserialize_properties(request.object, keep_internal=True)
        # deserialize_properties unwraps secrets; find them on the wire to mask them.
        secret_paths = _secret_paths(request.object)
        shown = _mask_paths(_unwrap(props, mask=False), secret_paths)
        self.recording.resources.append(
            Recorded(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent or None,
                dependencies=sorted(set(request.dependencies)),
                inputs=shown,
                raw_inputs=_unwrap(props, mask=False),
                custom=bool(request.custom),
                provider=request.provider or None,
                id=response.id or None,
                ignore_changes=list(request.ignoreChanges),
            )
        )
        return response


    def _apply_stack_transforms(self, request) -> None:
        """Run the registered stack transforms the way the engine does (Pulumi's mock
        monitor records them but never calls them). A transform that changes the
        properties replaces the registration's inputs; secrets in a changed registration
        are re-sent as plain values (this path serves tests injecting violations)."""
        props = rpc.deserialize_properties(request.object, keep_internal=True)
        props = _unwrap(props, mask=False)
        changed = False
        for transform in self._stack_transforms:
            args = pulumi.ResourceTransformArgs(
                custom=bool(request.custom), type_=request.type, name=request.name,
                props=props, opts=pulumi.ResourceOptions())
            result = transform(args)
            if inspect.isawaitable(result):
                result = _sync_await(result)
            if result is not None:
                props = dict(result.props)
                changed = True
        if changed:
            request.object.Clear()
            request.object.update(_sync_await(rpc.serialize_properties(props, {})))


def _secret_paths(struct) -> list[tuple]:
    """Paths of secret values in a protobuf Struct as the engine receives it."""
    from google.protobuf import json_format

    found: list[tuple] = []

    def walk(v: Any, path: tuple) -> None:
        if isinstance(v, dict):
            if v.get(_SECRET_SIG) == _SECRET_VALUE:
                found.append(path)
                return
            for k, sub in v.items():
                walk(sub, path + (k,))
        elif isinstance(v, list):
            for i, sub in enumerate(v):
                walk(sub, path + (i,))

    walk(json_format.MessageToDict(struct), ())
    return found


def _mask_paths(value: Any, paths: list[tuple]) -> Any:
    for path in paths:
        if not path:
            return MASK
        target = value
        try:
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = MASK
        except (KeyError, IndexError, TypeError):
            continue
    return value


Transform = Callable[[pulumi.ResourceTransformArgs], pulumi.ResourceTransformResult | None]


def run(stack: str, raw_settings: dict[str, Any], transforms: list[Transform] | None = None) -> Recording:
    """Run `__main__.py` for `stack` with `raw_settings` under the mock engine.

    `transforms` are registered as stack transforms before the program runs: the policy
    tests use them to inject a violation the settings cannot express.
    """
    recording = Recording(stack=stack)
    mocks = PreviewMocks()
    reset_options(project=PROJECT, stack=stack, preview=False)
    pulumi_mocks.set_mocks(mocks, project=PROJECT, stack=stack, preview=False,
                           monitor=RecordingMonitor(mocks, recording))
    pulumi.runtime.set_all_config({SETTINGS_KEY: json.dumps(raw_settings)})

    def program() -> None:
        for t in transforms or []:
            pulumi.runtime.register_resource_transform(t)
        runpy.run_path(str(PROGRAM), run_name="__main__")

    _sync_await(run_pulumi_func(program))
    return recording
