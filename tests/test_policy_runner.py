"""The offline runner drives pulumi_policy's own servicer the way the engine does."""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
from google.protobuf import json_format

from dsvolc import engine, policy_runner
from policies.pack import POLICIES
from pulumi_policy.deserialize import SPECIAL_SECRET_SIG, SPECIAL_SIG_KEY
from stacks import read_raw


@pytest.fixture(scope="module")
def prod() -> engine.Recording:
    return engine.run("prod", read_raw("prod"), mode="existing")


@pytest.fixture(scope="module")
def dev() -> engine.Recording:
    return engine.run("dev", read_raw("dev"), mode="existing")


def _edit_bucket(rec: engine.Recording, **props) -> engine.Recording:
    rec = copy.deepcopy(rec)
    bucket = rec.of_type("volcengine:tos/bucket:Bucket")[0]
    bucket.raw_inputs.update(props)
    bucket.inputs.update(props)
    return rec


def test_analyzer_info_lists_every_policy_with_its_schema():
    infos = {i.name: i for i in policy_runner.policy_infos()}
    assert set(infos) == {p.name for p in POLICIES}
    schema = json_format.MessageToDict(infos["serving-min-replicas"].configSchema)
    assert schema["properties"]["minReplicas"]["default"] == 2


def test_analyze_request_matches_the_recorded_registration(prod):
    bucket = prod.of_type("volcengine:tos/bucket:Bucket")[0]
    req = policy_runner.analyze_request(prod, bucket)
    assert (req.type, req.urn, req.name) == (bucket.type, bucket.urn, bucket.name)
    assert json_format.MessageToDict(req.properties)["bucketName"] == bucket.raw_inputs["bucketName"]
    # the provider travels with the request, as the engine sends it (region from settings)
    assert req.provider.type == "pulumi:providers:volcengine"
    assert json_format.MessageToDict(req.provider.properties)["region"] == read_raw("prod")["region"]
    assert req.options.parent == bucket.parent


def test_analyze_stack_request_carries_parents_and_dependencies(prod):
    req = policy_runner.analyze_stack_request(prod)
    assert len(req.resources) == len(prod.resources)
    snat = next(r for r in req.resources if r.type == "volcengine:nat/snatEntry:SnatEntry")
    recorded = next(r for r in prod.resources if r.urn == snat.urn)
    assert list(snat.dependencies) == recorded.dependencies and snat.dependencies
    assert snat.parent == recorded.parent


def test_secrets_are_marked_on_the_wire():
    shown = {"a": engine.MASK, "b": {"c": "plain"}}
    raw = {"a": "s3cr3t", "b": {"c": "plain"}}
    wired = policy_runner._wire(shown, raw)
    assert wired["a"] == {SPECIAL_SIG_KEY: SPECIAL_SECRET_SIG, "value": "s3cr3t"}
    assert wired["b"] == {"c": "plain"}


def test_levels_come_from_the_config_not_the_code(dev):
    """The same unversioned bucket: advisory under dev's config, mandatory under prod's."""
    rec = _edit_bucket(dev, enableVersion=False)
    as_dev = [v for v in policy_runner.analyze(rec, policy_runner.load_policy_config("dev"))
              if v["policy"] == "tos-bucket-versioned"]
    as_prod = [v for v in policy_runner.analyze(rec, policy_runner.load_policy_config("prod"))
               if v["policy"] == "tos-bucket-versioned"]
    assert [v["enforcement_level"] for v in as_dev] == ["advisory"]
    assert [v["enforcement_level"] for v in as_prod] == ["mandatory"]
    assert as_prod[0]["resource"] == rec.of_type("volcengine:tos/bucket:Bucket")[0].urn
    assert as_prod[0]["type"] == "volcengine:tos/bucket:Bucket"


def test_disabled_policy_reports_nothing(prod):
    rec = _edit_bucket(prod, publicAcl="public-read")
    fired = {v["policy"] for v in policy_runner.analyze(rec, {"tos-bucket-not-public": "disabled"})}
    assert "tos-bucket-not-public" not in fired
    fired = {v["policy"] for v in policy_runner.analyze(rec, {})}
    assert "tos-bucket-not-public" in fired  # no config: the pack's default (mandatory)


def test_config_properties_reach_the_policy(dev):
    """dev's config sets minReplicas 1 and delete protection not required; without it the
    same recording violates both."""
    fired = {v["policy"] for v in policy_runner.analyze(dev, policy_runner.load_policy_config("dev"))}
    assert not fired & {"serving-min-replicas", "vke-delete-protection"}
    fired = {v["policy"] for v in policy_runner.analyze(dev, {})}
    assert {"serving-min-replicas", "vke-delete-protection"} <= fired


@pytest.mark.parametrize("config, error", [
    ({"no-such-policy": "mandatory"}, "no-such-policy: no such policy"),
    ({"tos-bucket-versioned": "strict"}, "tos-bucket-versioned: expected one of"),
    ({"serving-min-replicas": {"minReplicas": "two"}}, "serving-min-replicas.minReplicas"),
    ({"serving-min-replicas": {"minReplica": 2}}, "serving-min-replicas"),
])
def test_bad_config_is_refused_with_its_path(config, error):
    with pytest.raises(policy_runner.PolicyConfigError, match=error.replace(".", r"\.")):
        policy_runner.resolve_config(policy_runner.policy_infos(), config)


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_shipped_configs_resolve(stack):
    resolved = policy_runner.resolve_config(policy_runner.policy_infos(), policy_runner.load_policy_config(stack))
    assert set(resolved) == {p.name for p in POLICIES}
    if stack == "prod":
        assert {c.enforcement_level for c in resolved.values()} == {"mandatory"}
        # digests for every image (the serving one included) are images-by-digest's to demand
        assert resolved["images-by-digest"].enforcement_level == "mandatory"
        assert resolved["image-pinned"].properties["requireDigest"] is False
    if stack == "dev":
        assert "advisory" in {c.enforcement_level for c in resolved.values()}


def test_config_files_are_json_objects():
    for cls in ("dev", "staging", "prod"):
        doc = json.loads(policy_runner.config_path(cls).read_text())
        assert isinstance(doc, dict) and doc.get("all") == "mandatory"


# --------------------------------------------------------------------------- one conversion per Struct


def test_each_struct_is_converted_once_per_analysis(prod, monkeypatch):
    """The servicer asks for the dict of a resource's properties once per policy (and again
    per stack policy); the analysis answers it from one conversion of each distinct Struct.
    Counted at json_format itself, so every real conversion is seen."""
    from pulumi_policy.policy import _PolicyAnalyzerServicer

    real = json_format.MessageToDict
    converted: list[bytes] = []
    judging = []  # inside Analyze or AnalyzeStack (Configure converts the pack config too)

    def counting(message, *args, **kwargs):
        if judging:
            converted.append(message.SerializeToString(deterministic=True))
        return real(message, *args, **kwargs)

    def judged(method):
        def wrapper(self, request, context):
            judging.append(True)
            try:
                return method(self, request, context)
            finally:
                judging.pop()
        return wrapper

    monkeypatch.setattr(json_format, "MessageToDict", counting)
    for name in ("Analyze", "AnalyzeStack"):
        monkeypatch.setattr(_PolicyAnalyzerServicer, name, judged(getattr(_PolicyAnalyzerServicer, name)))
    verdicts = policy_runner.analyze(prod, policy_runner.load_policy_config("prod"))
    assert any(v["enforcement_level"] == "mandatory" for v in verdicts)  # the policies did run
    structs = {policy_runner.analyze_request(prod, r).properties.SerializeToString(deterministic=True)
               for r in prod.resources}
    per_struct = {b: converted.count(b) for b in structs}
    assert set(per_struct.values()) == {1}, "a resource's properties converted more than once"


def test_the_servicer_still_sees_every_resource_under_every_policy(prod):
    """Caching the conversion leaves the servicer's own work in place: it asks once per
    resource-validation policy per resource and once per stack policy per resource."""
    from pulumi_policy.policy import ResourceValidationPolicy, StackValidationPolicy

    cache = policy_runner.ConversionCache()
    servicer = policy_runner.build_servicer()
    policy_runner.configure(servicer, policy_runner.resolve_config(
        policy_runner.policy_infos(servicer), policy_runner.load_policy_config("prod")))
    structs = policy_runner.wire_structs(prod)
    with cache.installed():
        for r in prod.resources:
            servicer.Analyze(policy_runner.analyze_request(prod, r, structs), None)
        servicer.AnalyzeStack(policy_runner.analyze_stack_request(prod, structs), None)
    n_resource = sum(isinstance(p, ResourceValidationPolicy) for p in POLICIES)
    n_stack = sum(isinstance(p, StackValidationPolicy) for p in POLICIES)
    with_provider = sum(1 for r in prod.resources if policy_runner.analyze_request(prod, r, structs).HasField("provider"))
    n = len(prod.resources)
    # properties (and the provider's, where there is one) per policy per resource
    assert cache.calls == (n_resource + n_stack) * (n + with_provider)
    assert cache.conversions == len({s.SerializeToString(deterministic=True) for s in structs.values()})
    assert json_format is __import__("pulumi_policy.policy").policy.json_format  # uninstalled after


def test_verdicts_are_the_same_without_the_cache(prod, monkeypatch):
    config = policy_runner.load_policy_config("prod")
    cached = policy_runner.analyze(prod, config)
    monkeypatch.setattr(policy_runner.ConversionCache, "installed", lambda self: contextlib.nullcontext())
    plain = policy_runner.analyze(prod, config)
    key = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731
    assert sorted(cached, key=key) == sorted(plain, key=key) and len(cached) >= 10


def test_a_policy_changing_its_view_does_not_reach_the_next():
    """One conversion serves every policy, so a policy writing into its properties (the
    servicer's proxies allow it) must not change what the next policy reads."""
    from pulumi_policy import EnforcementLevel, ResourceValidationPolicy
    from pulumi_policy.policy import _PolicyAnalyzerServicer

    seen = []

    def writer(args, report):
        args.props["bucketName"] = "changed"
        args.props["tags"][0]["value"] = "changed"

    def reader(args, report):
        seen.append((args.props["bucketName"], args.props["tags"][0]["value"]))

    servicer = _PolicyAnalyzerServicer("t", "0.0.1", [
        ResourceValidationPolicy("writer", "writes", writer), ResourceValidationPolicy("reader", "reads", reader),
    ], EnforcementLevel.MANDATORY, None, "")
    props = {"bucketName": "original", "tags": [{"key": "k", "value": "original"}]}
    request = policy_runner.proto.AnalyzeRequest(type="volcengine:tos/bucket:Bucket", urn="urn:x", name="b",
                                                 properties=policy_runner._struct(props))
    with policy_runner.ConversionCache().installed():
        servicer.Analyze(request, None)
        servicer.Analyze(request, None)
    assert seen == [("original", "original")] * 2


# --------------------------------------------------------------------------- proxies built as read


def _tree(proxy):
    """A proxy tree as plain data, each dict and list with its class and its path, read
    through `__target` (which never raises on an unknown value)."""
    from pulumi_policy.proxy import _DictProxy, _ListProxy

    if isinstance(proxy, _DictProxy):
        return ("dict", tuple(proxy._DictProxy__props_acc), {k: _tree(v) for k, v in proxy["__target"].items()})
    if isinstance(proxy, _ListProxy):
        return ("list", tuple(proxy._ListProxy__props_acc), [_tree(v) for v in proxy["__target"]])
    return proxy


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_proxies_built_as_read_are_the_servicers(stack):
    """Every resource's properties, proxied as policies read them, hold the same dicts and
    lists with the same paths as pulumi_policy's own proxies, and the same leaves."""
    from pulumi_policy.deserialize import deserialize_properties
    from pulumi_policy.proxy import unknown_checking_proxy as servicers

    rec = engine.run(stack, read_raw(stack), mode="existing")
    structs = policy_runner.wire_structs(rec)
    nested = 0
    for r in rec.resources:
        props = deserialize_properties(json_format.MessageToDict(structs[r.urn]))
        assert _tree(policy_runner.unknown_checking_proxy(props)) == _tree(servicers(props)), r.urn
        nested += sum(isinstance(v, (dict, list)) for v in props.values())
    assert nested > 100  # the comparison reached nested trees


def test_a_proxy_built_as_read_behaves_as_the_servicers():
    """Reads, unknowns (the error and its path), writes, slices, negative indices, `in`,
    iteration and equality: the same answers from both proxies."""
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, _DictProxy
    from pulumi_policy.proxy import unknown_checking_proxy as servicers

    source = {"a": {"b": [1, {"c": UNKNOWN_STRING_VALUE}, [2, 3]], "d": "x"}, "e": UNKNOWN_STRING_VALUE}

    def session(proxy):
        out = [proxy["a"]["d"], list(proxy["a"]["b"][2]), proxy["a"]["b"][-1][0], len(proxy["a"]["b"]),
               sorted(proxy), "d" in proxy["a"],
               [(type(x).__name__ if not isinstance(x, _DictProxy) else "proxy") for x in proxy["a"]["b"][0:2]]]
        for get in (lambda: proxy["e"], lambda: proxy["a"]["b"][1]["c"], lambda: proxy["a"]["b"][-2]["c"]):
            with pytest.raises(UnknownValueError) as err:
                get()
            out.append((err.value.message, err.value.props))
        proxy["a"]["d"] = {"new": 1}
        proxy["a"]["b"][1]["c"] = "written"
        out += [proxy["a"]["d"], type(proxy["a"]["d"]).__name__, proxy["a"]["b"][1]["c"], proxy["a"]["b"][1] == {"c": "written"}]
        return out

    assert session(policy_runner.unknown_checking_proxy(source)) == session(servicers(source))
    assert source["a"]["d"] == "x" and source["a"]["b"][1]["c"] == UNKNOWN_STRING_VALUE  # the source is never written
