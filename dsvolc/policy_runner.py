"""Run the policy pack offline, through pulumi_policy's own analyzer servicer.

The Pulumi CLI runs `policies/__main__.py`, whose PolicyPack serves
`pulumi_policy.policy._PolicyAnalyzerServicer` over gRPC, then calls it: `GetAnalyzerInfo`,
`Configure` with the pack config (`--policy-pack-config`), `Analyze` once per resource and
`AnalyzeStack` once for the whole graph. This module makes the same calls on the same
servicer in-process, with requests built from a `dsvolc.engine.Recording` the way the
engine builds them (type, properties as a Struct with secrets marked, URN, name, options,
provider; for the stack also parent and dependencies). Nothing is re-implemented: verdicts,
messages and enforcement levels are the servicer's.

The servicer is private API of pulumi-policy, which is why pyproject.toml pins it exactly.

Speed: the servicer turns a resource's properties from protobuf into a dict (json_format's
MessageToDict) once per policy that looks at it, and again per stack policy, so a stack of
157 resources under some fifty policies converts the same Structs thousands of times. While
`analyze` runs, the servicer's `json_format` answers MessageToDict from one conversion per
distinct message (`ConversionCache`). The servicer still deserialises, proxies and judges
every resource under every policy; only the repeated protobuf walk is gone. The answer can
be shared because the servicer only reads it: `deserialize_properties` copies every dict and
list before a policy sees them.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pulumi_policy.policy
from google.protobuf import empty_pb2, json_format, struct_pb2
from google.protobuf.message import Message
from pulumi.runtime.proto import analyzer_pb2 as proto
from pulumi_policy import EnforcementLevel
from pulumi_policy.deserialize import SPECIAL_SECRET_SIG, SPECIAL_SIG_KEY
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import _DictProxy, _ListProxy, _raise_if_unknown

from dsvolc import engine

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "policies" / "config"  # one config per environment class

LEVELS = {
    "advisory": proto.ADVISORY,
    "mandatory": proto.MANDATORY,
    "disabled": proto.DISABLED,
    "remediate": proto.REMEDIATE,
}
LEVEL_NAMES = {v: k for k, v in LEVELS.items()}


class PolicyConfigError(ValueError):
    """The policy config names an unknown policy, level or property (the CLI refuses it too)."""


# --------------------------------------------------------------------------- the servicer


def build_servicer() -> _PolicyAnalyzerServicer:
    """The servicer PolicyPack would serve, built without PolicyPack (whose constructor
    starts a gRPC server and blocks)."""
    from policies.pack import PACK_NAME, POLICIES, pack_description, pack_version

    return _PolicyAnalyzerServicer(
        PACK_NAME,
        pack_version(),
        POLICIES,
        EnforcementLevel.MANDATORY,
        None,
        pack_description(),
    )


def policy_infos(servicer: _PolicyAnalyzerServicer | None = None) -> list[proto.PolicyInfo]:
    """What `GetAnalyzerInfo` tells the engine: name, description, level, config schema."""
    servicer = servicer or build_servicer()
    return list(servicer.GetAnalyzerInfo(empty_pb2.Empty(), None).policies)


# --------------------------------------------------------------------------- config


def config_path(environment_class: str) -> Path:
    """The shipped config of an environment class: policies/config/<class>.json."""
    return CONFIG_DIR / f"{environment_class}.json"


def load_policy_config(environment_class: str) -> dict:
    """The shipped config of an environment class (Pulumi's policy pack config format)."""
    return read_policy_config(config_path(environment_class))


def stack_policy_config(plan) -> tuple[Path, dict]:
    """(path, config) a stack is judged by (a StackPlan's `policy_config`: the setting, else
    its class's)."""
    path = ROOT / plan.policy_config
    return path, read_policy_config(path, setting="policy_config" if plan.settings.policy_config else None)


def read_policy_config(path: Path, setting: str | None = None) -> dict:
    """A policy pack config file; PolicyConfigError when it is missing or malformed."""
    if not path.is_file():
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        named = f"{setting}: " if setting else ""
        raise PolicyConfigError(f"{named}{shown}: no such policy config file; shipped: "
                                f"{', '.join(sorted(str(p.relative_to(ROOT)) for p in CONFIG_DIR.glob('*.json')))}")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PolicyConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PolicyConfigError(f"{path}: expected an object mapping policy names to levels")
    return doc


@dataclass(frozen=True)
class ResolvedPolicyConfig:
    enforcement_level: str
    properties: dict[str, Any]


def _level(value: Any, where: str) -> int:
    if not isinstance(value, str) or value not in LEVELS:
        raise PolicyConfigError(f"{where}: expected one of {', '.join(LEVELS)}, got {value!r}")
    return LEVELS[value]


def resolve_config(infos: list[proto.PolicyInfo], config: dict | None) -> dict[str, ResolvedPolicyConfig]:
    """Merge the pack's defaults with a config file as the engine does before `Configure`
    (pulumi's ReconcilePolicyPackConfig): each policy starts at its declared level with its
    schema defaults; `all` sets every level; a policy's entry overrides its level and
    properties; the result is validated against each policy's config schema."""
    from google.protobuf import json_format

    config = dict(config or {})
    result: dict[str, tuple[int, dict]] = {}
    schemas: dict[str, dict] = {}
    for info in infos:
        schema = json_format.MessageToDict(info.configSchema) if info.HasField("configSchema") else {}
        props = {k: v["default"] for k, v in schema.get("properties", {}).items() if "default" in v}
        result[info.name] = (info.enforcementLevel, props)
        schemas[info.name] = schema
    if "all" in config:
        level = _level(config.pop("all"), "all")
        result = {k: (level, p) for k, (_, p) in result.items()}
    for name, value in config.items():
        if name not in result:
            raise PolicyConfigError(f"{name}: no such policy in the pack; known: {', '.join(sorted(result))}")
        level, props = result[name]
        if isinstance(value, str):
            level = _level(value, name)
        elif isinstance(value, dict):
            value = dict(value)
            if "enforcementLevel" in value:
                level = _level(value.pop("enforcementLevel"), f"{name}.enforcementLevel")
            props = {**props, **value}
        else:
            raise PolicyConfigError(f"{name}: expected a level or an object, got {value!r}")
        result[name] = (level, props)
    resolved = {}
    for name, (level, props) in result.items():
        schema = schemas[name]
        if props or schema:
            full = {"type": "object", "properties": schema.get("properties", {}),
                    "required": schema.get("required", []), "additionalProperties": False}
            try:
                jsonschema.validate(props, full)
            except jsonschema.ValidationError as exc:
                where = ".".join(str(p) for p in exc.absolute_path)
                raise PolicyConfigError(f"{name}{'.' + where if where else ''}: {exc.message}") from None
        resolved[name] = ResolvedPolicyConfig(LEVEL_NAMES[level], props)
    return resolved


def configure(servicer: _PolicyAnalyzerServicer, resolved: dict[str, ResolvedPolicyConfig]) -> None:
    """`Configure`, the call `--policy-pack-config` turns into."""
    request = proto.ConfigureAnalyzerRequest()
    for name, c in resolved.items():
        pc = proto.PolicyConfig(enforcementLevel=LEVELS[c.enforcement_level])
        if c.properties:
            pc.properties.update(c.properties)
        request.policyConfig[name].CopyFrom(pc)
    servicer.Configure(request, None)


# --------------------------------------------------------------------------- requests


def _wire(shown: Any, raw: Any) -> Any:
    """Raw inputs with secrets marked as on the wire: where the recording masked a value
    (`inputs`), wrap the raw value in Pulumi's secret signature."""
    if shown == engine.MASK and raw != engine.MASK:
        return {SPECIAL_SIG_KEY: SPECIAL_SECRET_SIG, "value": raw}
    if isinstance(raw, dict) and isinstance(shown, dict):
        return {k: _wire(shown.get(k), v) for k, v in raw.items()}
    if isinstance(raw, list) and isinstance(shown, list) and len(raw) == len(shown):
        return [_wire(s, v) for s, v in zip(shown, raw)]
    return raw


def _struct(props: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(props)
    return s


Structs = dict[str, struct_pb2.Struct]  # URN -> the resource's properties as on the wire


def wire_structs(rec: engine.Recording) -> Structs:
    """Each resource's properties as the engine sends them (secrets marked), built once for
    its Analyze request, the AnalyzeStack request and the requests of the resources it provides."""
    return {r.urn: _struct(_wire(r.inputs, r.raw_inputs)) for r in rec.resources}


def _provider(rec: engine.Recording, r: engine.Recorded, structs: Structs) -> proto.AnalyzerProviderResource | None:
    if not r.provider:
        return None
    urn = r.provider.rsplit("::", 1)[0]
    if urn not in structs:
        return None
    p = next(p for p in rec.resources if p.urn == urn)
    return proto.AnalyzerProviderResource(type=p.type, properties=structs[urn], urn=p.urn, name=p.name)


def _options(r: engine.Recorded) -> proto.AnalyzerResourceOptions:
    return proto.AnalyzerResourceOptions(parent=r.parent or "")


def analyze_request(rec: engine.Recording, r: engine.Recorded, structs: Structs | None = None) -> proto.AnalyzeRequest:
    structs = structs if structs is not None else wire_structs(rec)
    return proto.AnalyzeRequest(type=r.type, properties=structs[r.urn], urn=r.urn, name=r.name,
                                options=_options(r), provider=_provider(rec, r, structs))


def analyze_stack_request(rec: engine.Recording, structs: Structs | None = None) -> proto.AnalyzeStackRequest:
    structs = structs if structs is not None else wire_structs(rec)
    return proto.AnalyzeStackRequest(resources=[
        proto.AnalyzerResource(type=r.type, properties=structs[r.urn], urn=r.urn, name=r.name, options=_options(r),
                               parent=r.parent or "", dependencies=r.dependencies,
                               provider=_provider(rec, r, structs))
        for r in rec.resources
    ])


class ConversionCache:
    """`json_format` as the servicer sees it while `analyze` runs: MessageToDict converts
    each distinct message once, with the real json_format, and answers every repeat with
    that conversion (a message is the same when its type and deterministic serialisation
    are); everything else is the real module.

    Sharing one answer is sound because the servicer only reads it: every use is
    `deserialize_properties(MessageToDict(...))`, which copies each dict and list. The same
    message object asked for again (the servicer asks once per policy) is answered without
    serialising it again; that holds because nothing changes a request while it is judged."""

    def __init__(self) -> None:
        self._dicts: dict[tuple[str, bytes], dict] = {}
        self._seen: dict[int, tuple[Message, dict]] = {}  # id -> (the message, kept alive; its dict)
        self.calls = 0  # MessageToDict calls the servicer made
        self.conversions = 0  # of which converted (the others were answered from the cache)

    def MessageToDict(self, message: Message, *args: Any, **kwargs: Any) -> dict:  # noqa: N802 (json_format's name)
        self.calls += 1
        if args or kwargs:  # the servicer never passes options; convert such a call as asked
            return json_format.MessageToDict(message, *args, **kwargs)
        seen = self._seen.get(id(message))
        if seen is not None and seen[0] is message:
            return seen[1]
        key = (message.DESCRIPTOR.full_name, message.SerializeToString(deterministic=True))
        found = self._dicts.get(key)
        if found is None:
            found = self._dicts[key] = json_format.MessageToDict(message)
            self.conversions += 1
        self._seen[id(message)] = (message, found)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(json_format, name)

    def deserialize_properties(self, props: dict, proxy_secrets: bool = False) -> dict:
        """pulumi_policy's deserialize_properties, once per dict this cache answered: the
        servicer deserialises the same answer for every policy, and only hands the result
        to `unknown_checking_proxy`, which copies every dict and list of it."""
        if proxy_secrets:  # the remediation path keeps the secret markers in its result
            return self._deserialize(props, proxy_secrets)
        done = self._deserialized.get(id(props))
        if done is not None and done[0] is props:
            return done[1]
        out = self._deserialize(props)
        self._deserialized[id(props)] = (props, out)
        return out

    @contextlib.contextmanager
    def installed(self):
        """Serve the servicer's `json_format` from this cache for the duration, with its
        deserialisation memoised and its proxies built as read (`unknown_checking_proxy`)."""
        module = pulumi_policy.policy
        previous = module.json_format, module.deserialize_properties, module.unknown_checking_proxy
        self._deserialize, self._deserialized = previous[1], {}
        module.json_format, module.deserialize_properties, module.unknown_checking_proxy = (
            self, self.deserialize_properties, unknown_checking_proxy)
        try:
            yield self
        finally:
            module.json_format, module.deserialize_properties, module.unknown_checking_proxy = previous
            self._deserialized = {}


def unknown_checking_proxy(props: dict) -> Any:
    """pulumi_policy.proxy.unknown_checking_proxy, built as it is read: the same
    `_DictProxy`/`_ListProxy` a policy reads through (an unknown value raises the same
    UnknownValueError with the same path; a write stays in this policy's copy), but a
    nested dict or list is wrapped when a policy first reaches it, not before. pulumi_policy
    copies every resource's whole tree for every policy, and most policies read two or
    three fields of a few resource types: for prod that was 90,000 proxies and 290,000
    path copies, most of the policy analysis. `__target` (pulumi_policy's own way in, used
    when it serialises a remediation) gives the whole tree, wrapped.
    tests/test_policy_runner.py compares the two, object for object, over every stack."""
    return _LazyDict(props, [])


def _child(value: Any, path: list[str]) -> Any:
    if isinstance(value, dict):
        return _LazyDict(value, path)
    if isinstance(value, list):
        return _LazyList(value, path)
    return value


class _LazyDict(_DictProxy):
    def __init__(self, source: dict, path: list[str]):
        super().__init__(dict(source), path)  # its own copy: writes stay here
        self._source = source  # shared and never written: the deserialised properties

    def __getitem__(self, key):
        target = self._DictProxy__target
        if key == "__target":
            for k in list(target):
                self._wrapped(target, k)
            return target
        return self._wrapped(target, key)

    def _wrapped(self, target: dict, key: Any) -> Any:
        value = target[key]
        # still the source's own dict or list (a policy never holds one to write back)
        if isinstance(value, (dict, list)) and value is self._source.get(key, _MISSING):
            value = target[key] = _child(value, [*self._DictProxy__props_acc, str(key)])
        return _raise_if_unknown(key, value, self._DictProxy__props_acc)


class _LazyList(_ListProxy):
    def __init__(self, source: list, path: list[str]):
        super().__init__(list(source), path)
        self._source = source

    def __getitem__(self, key):
        target = self._ListProxy__target
        if key == "__target" or isinstance(key, slice):
            for i in range(len(target)):
                self._wrapped(target, i)
            return target if key == "__target" else _raise_if_unknown(key, target[key], self._ListProxy__props_acc)
        return self._wrapped(target, key)

    def _wrapped(self, target: list, key: int) -> Any:
        value = target[key]
        if isinstance(value, (dict, list)) and value is self._source[key]:
            index = key + len(target) if isinstance(key, int) and key < 0 else key
            value = target[key] = _child(value, [*self._ListProxy__props_acc, str(index)])
        return _raise_if_unknown(key, value, self._ListProxy__props_acc)


_MISSING = object()


# --------------------------------------------------------------------------- analyze


def analyze(recording: engine.Recording, policy_config: dict | None = None) -> list[dict]:
    """Every violation of the pack over a recorded stack, as
    {"policy", "enforcement_level", "message", "description", "resource", "type"}."""
    servicer = build_servicer()
    configure(servicer, resolve_config(policy_infos(servicer), policy_config))
    types = {r.urn: r.type for r in recording.resources}
    structs = wire_structs(recording)
    diagnostics: list[tuple[proto.AnalyzeDiagnostic, str | None]] = []
    with ConversionCache().installed():
        for r in recording.resources:
            response = servicer.Analyze(analyze_request(recording, r, structs), None)
            diagnostics += [(d, r.urn) for d in response.diagnostics]
        response = servicer.AnalyzeStack(analyze_stack_request(recording, structs), None)
        diagnostics += [(d, None) for d in response.diagnostics]

    out = []
    for d, subject in diagnostics:
        urn = d.urn or subject
        message = d.message
        if message.startswith(d.description):
            message = message[len(d.description):].lstrip("\n") or d.description
        out.append({
            "policy": d.policyName,
            "enforcement_level": LEVEL_NAMES.get(d.enforcementLevel, "advisory"),
            "message": message,
            "description": d.description,
            "resource": urn,
            "type": types.get(urn) if urn else None,
        })
    return out
