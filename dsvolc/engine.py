"""Run the real Pulumi program under Pulumi's own mock engine and record every resource.

Nothing is faked but the cloud: the program, the providers' Python SDKs, the resource
options and the serialisation are the ones `pulumi up` uses. The monitor records what the
engine would receive for each registration (type, name, parent, dependencies, inputs).

Two modes answer the registrations:
- "new" (the default) is the first `pulumi preview` of a new stack: the engine echoes the
  inputs, and everything the provider computes (ids, addresses, the cluster's IRSA
  config, the kubeconfig) is unknown. Values that depend on them are recorded as unknown
  (`UNKNOWN` on the wire, as the policy analyzer receives them), never invented.
  Its data sources find nothing either: the stack's own cluster does not exist, so the
  program runs deploy phase 1 (infra/identity.py).
- "existing" is a stack whose resources exist: computed outputs have realistic values (an
  OIDC provider once IRSA is on, a kubeconfig, an egress address) and the stack's cluster
  is found by name, so the program runs deploy phase 2 (IRSA and the serving stack).
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import runpy
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime import known_types
from pulumi.runtime import resource as pulumi_resource
from pulumi.runtime.resource import register_resource_outputs
from pulumi.runtime.settings import get_root_resource, reset_options
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from stacks.loader import PROJECT, SETTINGS_KEY

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "__main__.py"
MASK = "[secret]"
UNKNOWN = rpc.UNKNOWN  # how the engine (and the policy analyzer) receives an unknown value
UNKNOWN_SHOWN = "[unknown]"  # how the recording shows one to people
FAKE_ACCOUNT = "2100000000"
Mode = Literal["new", "existing"]
MODES: tuple[str, ...] = ("new", "existing")
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
    aliases: list[str] = field(default_factory=list)  # names (or URNs) the resource was known by before
    replacement_trigger: Any = None  # the resource option: a change of it replaces the resource
    replace_on_changes: list[str] = field(default_factory=list)  # the resource option, as registered
    delete_before_replace: bool = False

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
    mode: str = "new"
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


def _available_answer(instance_type: str | None) -> dict:
    """ecs.get_available_resources offline: no account can be asked, so every zone the
    project knows answers Available (infra/availability.py; the real preview asks VolcEngine).
    Tests replace this to see a sold-out answer refused."""
    from stacks.regions import REGION_ZONES

    zones = [(r, z) for r, zs in REGION_ZONES.items() for z in zs]
    return {"availableZones": [
        {"regionId": r, "zoneId": z, "status": "Available",
         "availableResources": [{"type": "InstanceType",
                                 "supportedResources": [{"value": instance_type or "", "status": "Available"}]}]}
        for r, z in zones]}


AVAILABLE_RESOURCES = "volcengine:ecs/getAvailableResources:getAvailableResources"


class NewStackMocks(pulumi_mocks.Mocks):
    """The first preview of a new stack: inputs echo, no id, nothing computed is known.

    Returning no id and leaving computed outputs out of the state is what makes them
    unknown: under a preview the SDK resolves an empty id and every missing output as
    unknown, exactly as it does for the engine's answer to a resource being created."""

    def new_resource(self, args: pulumi_mocks.MockResourceArgs):
        return "", dict(args.inputs)

    def call(self, args: pulumi_mocks.MockCallArgs):
        # Invokes with unknown arguments never reach here (the SDK skips them in a preview);
        # the others read the cloud, which holds nothing of a new stack: its own cluster,
        # looked up by name to choose the deploy phase (infra/identity.py), is not there.
        if args.token == "volcengine:vke/getClusters:getClusters":
            return _clusters_answer(args.args.get("name"), existing=False)
        if args.token == AVAILABLE_RESOURCES:
            return _available_answer(args.args.get("instanceTypeId"))
        return {}


class ExistingStackMocks(pulumi_mocks.Mocks):
    """A stack whose resources exist: realistic computed outputs for the few the program
    reads back (ids, an OIDC provider, a kubeconfig); everything else echoes the inputs."""

    def new_resource(self, args: pulumi_mocks.MockResourceArgs):
        state = dict(args.inputs)
        rid = f"{args.name}-id"
        t = args.typ
        if t == "volcengine:vke/cluster:Cluster":
            # IRSA on (the second apply of a new stack): VKE reports the OIDC provider.
            state["irsaConfigs"] = [
                {
                    "enabled": True,
                    "oidcTrn": f"trn:iam::{FAKE_ACCOUNT}:oidc-provider/vke-{rid}",
                    "issuer": f"https://oidc.vke.volces.com/{rid}",
                    "audience": "sts.volcengine.com",
                }
            ] if args.inputs.get("irsaEnabled") else []
        elif t == "volcengine:eip/address:Address":
            # one documentation address (RFC 5737) per EIP: each NAT zone egresses from its own
            state["eipAddress"] = f"203.0.113.{10 + zlib.crc32(args.name.encode()) % 240}"
        elif t == "volcengine:iam/role:Role":
            state["trn"] = f"trn:iam::{FAKE_ACCOUNT}:role/{args.inputs.get('roleName')}"
        elif t == "volcengine:iam/user:User":
            state["trn"] = f"trn:iam::{FAKE_ACCOUNT}:user/{args.inputs.get('userName')}"
        elif t == "volcengine:iam/accessKey:AccessKey":
            state["accessKeyId"] = "AKLTpreview"
            state["secretAccessKey"] = "preview-secret"
        elif t == "volcengine:vmp/workspace:Workspace":
            state["prometheusWriteIntranetEndpoint"] = f"https://{rid}.vmp.ivolces.com/api/v1/write"
        elif t == "random:index/randomPassword:RandomPassword":
            state["result"] = "preview-password"
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
        if args.token == "volcengine:vke/getClusters:getClusters":
            return _clusters_answer(args.args.get("name"), existing=True)
        if args.token == AVAILABLE_RESOURCES:
            return _available_answer(args.args.get("instanceTypeId"))
        if args.token == "volcengine:apig/getGatewayServices:getGatewayServices":
            return _gateway_services_answer(args.args.get("gatewayId"), args.args.get("name"))
        if args.token == "volcengine:tls/getTraceInstances:getTraceInstances":
            # A trace instance owns a trace topic (infra/logging.py reads its id back).
            iid = args.args.get("traceInstanceId") or "trace-instance"
            return {"traceInstances": [{"traceInstanceId": iid, "traceTopicId": f"{iid}-trace-topic"}],
                    "totalCount": 1}
        return {}


def _gateway_services_answer(gateway_id: str | None, name: str | None) -> dict:
    """apig.get_gateway_services: the named service with the two default domains APIG gives
    it, one in the VPC and one public (the shape of APIG's generated hosts, a made-up id)."""
    if not gateway_id or not name:
        return {"gatewayServices": [], "totalCount": 0}
    sid = f"sd{zlib.crc32(f'{gateway_id}/{name}'.encode()):08x}preview"
    return {
        "gatewayServices": [{
            "id": sid, "name": name, "gatewayId": gateway_id, "status": "Running",
            "domains": [{"domain": f"{sid}.apigateway-preview.ivolces.com", "type": "private"},
                        {"domain": f"{sid}.apigateway-preview.volceapi.com", "type": "public"}],
            "customDomains": [],
        }],
        "totalCount": 1,
    }


def _clusters_answer(name: str | None, existing: bool) -> dict:
    """vke.get_clusters by name: the stack's own cluster, running with IRSA on, when the stack
    exists; no cluster on a new stack."""
    if not existing or not name:
        return {"clusters": [], "totalCount": 0}
    cid = f"cc{zlib.crc32(name.encode()):08x}preview"
    return {
        "clusters": [{
            "id": cid,
            "name": name,
            "status": {"phase": "Running", "conditions": []},
            "irsaConfigs": [{
                "enabled": True,
                "audience": "sts.volcengine.com",
                "issuer": f"https://oidc-vke-preview.volces.com/{cid}",
                "oidcTrn": f"trn:iam::{FAKE_ACCOUNT}:oidc-provider/vke-{cid}",
                "jwksUrl": f"https://oidc-vke-preview.volces.com/{cid}/keys",
                "openIdConfigUrl": f"https://oidc-vke-preview.volces.com/{cid}/.well-known/openid-configuration",
            }],
        }],
        "totalCount": 1,
    }


def _unwrap(value: Any, mask: bool, unknown: Any = UNKNOWN) -> Any:
    from pulumi.output import Unknown

    if isinstance(value, Unknown) or value == UNKNOWN:
        return unknown
    if isinstance(value, dict):
        if value.get(_SECRET_SIG) == _SECRET_VALUE:
            return MASK if mask else _unwrap(value.get("value"), mask, unknown)
        return {k: _unwrap(v, mask, unknown) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_unwrap(v, mask, unknown) for v in value]
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
        shown = _mask_paths(_unwrap(props, mask=False, unknown=UNKNOWN_SHOWN), secret_paths)
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
                replace_on_changes=list(request.replaceOnChanges),
                delete_before_replace=bool(request.deleteBeforeReplace),
                aliases=[a.spec.name if a.HasField("spec") else a.urn for a in request.aliases]
                + list(request.aliasURNs),
                replacement_trigger=_trigger(request),
            )
        )
        return response

    def RegisterResourceOutputs(self, request):
        """Keep the stack's outputs (`pulumi.export`) for the preview's header."""
        if request.urn.split("::")[-2:-1] == ["pulumi:pulumi:Stack"]:
            outputs = rpc.deserialize_properties(request.outputs, keep_internal=True)
            self.recording.outputs.update(_unwrap(outputs, mask=True))
        return super().RegisterResourceOutputs(request)

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


def _trigger(request) -> Any:
    """The replacement_trigger option as registered (a protobuf Value), or None."""
    from google.protobuf import json_format

    if not request.HasField("replacement_trigger"):
        return None
    return _unwrap(json_format.MessageToDict(request.replacement_trigger), mask=True)


_SECRET_WIRE = _SECRET_VALUE.encode()


def _secret_paths(struct) -> list[tuple]:
    """Paths of secret values in a protobuf Struct as the engine receives it."""
    from google.protobuf import json_format

    found: list[tuple] = []
    if _SECRET_WIRE not in struct.SerializeToString():
        # No value carries the secret signature (most registrations): nothing to walk, and
        # no conversion of the whole Struct to a dict just to find that out.
        return found

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

_EMPTY_TRACE = pulumi_resource.source_pb2.StackTrace()


@contextlib.contextmanager
def stack_traces_skipped():
    """The SDK captures the Python stack of every registration (`traceback.extract_stack`,
    each frame's source line and file URI: about a fifth of the registration work) for the
    engine's `stackTrace` and `sourcePosition` fields. The recording monitor reads neither,
    so while the program runs under it the SDK gets an empty trace, as it does when it finds
    no constructor frame. tests/test_lazy_annotations.py checks that the SDK still has the
    function, and that the recording is the same with it left alone."""
    original = pulumi_resource._get_stack_trace
    pulumi_resource._get_stack_trace = lambda: _EMPTY_TRACE
    try:
        yield
    finally:
        pulumi_resource._get_stack_trace = original


def run(stack: str, raw_settings: dict[str, Any], transforms: list[Transform] | None = None, *,
        mode: Mode = "new") -> Recording:
    """Run `__main__.py` for `stack` with `raw_settings` under the mock engine.

    `mode` "new" (default) previews a new stack's first `pulumi up`: computed outputs are
    unknown and the stack's own cluster does not exist yet (deploy phase 1); "existing" runs
    against a stack whose resources exist, with realistic computed outputs and the cluster
    found by name (deploy phase 2: IRSA and the serving stack). `transforms` are registered
    as stack transforms before the program runs: the policy tests use them to inject a
    violation the settings cannot express.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    recording = Recording(stack=stack, mode=mode)
    preview = mode == "new"
    mocks = NewStackMocks() if preview else ExistingStackMocks()
    reset_options(project=PROJECT, stack=stack, preview=preview)
    pulumi_mocks.set_mocks(mocks, project=PROJECT, stack=stack, preview=preview,
                           monitor=RecordingMonitor(mocks, recording))
    pulumi.runtime.set_all_config({SETTINGS_KEY: json.dumps(raw_settings)})

    def program() -> None:
        for t in transforms or []:
            pulumi.runtime.register_resource_transform(t)
        runpy.run_path(str(PROGRAM), run_name="__main__")
        # `pulumi up` registers the stack's exports after the program (run_in_stack); the
        # mock runner finished its root stack before the program ran, so register them here.
        root = get_root_resource()
        if known_types.is_stack(root):
            register_resource_outputs(root, dict(root.outputs))

    with stack_traces_skipped():
        _sync_await(run_pulumi_func(program))
    return recording
