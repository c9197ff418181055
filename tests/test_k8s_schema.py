"""The schema checker itself: valid objects pass, typos and wrong types fail."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from tests.k8s_schema import CRD_DIR, known_kinds, schema_version, validate, validate_all

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "demo", "labels": {"app": "web"}},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {
                        "name": "web",
                        "image": "nginx:1.27",
                        "ports": [{"containerPort": 8000, "name": "http"}],
                        "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "1Gi"}},
                    }
                ]
            },
        },
    },
}

HTTPROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "r1", "namespace": "demo"},
    "spec": {
        "parentRefs": [{"name": "gw", "namespace": "edge"}],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/v1/"}}],
                "backendRefs": [
                    {"name": "stable", "port": 8000, "weight": 90},
                    {"name": "canary", "port": 8000, "weight": 10},
                ],
                "timeouts": {"request": "600s"},
            }
        ],
    },
}


def _expect_invalid(obj: dict, *needles: str) -> str:
    with pytest.raises(AssertionError) as info:
        validate(obj)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


def test_valid_objects_pass():
    validate(DEPLOYMENT)
    validate(HTTPROUTE)
    validate_all([DEPLOYMENT, HTTPROUTE])


def test_version_mapping_uses_the_shipped_minor():
    assert schema_version("1.32") == "1.32.0"
    assert schema_version("v1.32.4") == "1.32.0"
    # older than anything shipped -> the oldest shipped; newer -> the newest
    newest = kubernetes_validate.latest_version()
    assert schema_version("9.99") == newest
    assert schema_version("1.0") != newest and schema_version("1.0").startswith("1.")


def test_builtin_typo_names_object_and_field():
    bad = copy.deepcopy(DEPLOYMENT)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    _expect_invalid(bad, "Deployment demo/web", "spec.template.spec.containers[0]", "imagePullPolicyy")


def test_builtin_typo_in_metadata_fails():
    bad = copy.deepcopy(DEPLOYMENT)
    bad["metadata"]["label"] = {"app": "web"}
    _expect_invalid(bad, "metadata", "'label'")


def test_builtin_wrong_type_fails():
    bad = copy.deepcopy(DEPLOYMENT)
    bad["spec"]["replicas"] = "two"
    _expect_invalid(bad, "spec.replicas", "'two'")


def test_builtin_missing_required_field_fails():
    bad = copy.deepcopy(DEPLOYMENT)
    del bad["spec"]["template"]["spec"]["containers"][0]["name"]
    _expect_invalid(bad, "containers[0]", "'name' is a required property")


def test_crd_typo_fails_even_without_additional_properties_false():
    bad = copy.deepcopy(HTTPROUTE)
    bad["spec"]["rules"][0]["backendRefs"][0]["wieght"] = 50
    _expect_invalid(bad, "HTTPRoute demo/r1", "spec.rules[0].backendRefs[0]", "wieght")


def test_crd_unknown_top_level_spec_field_fails():
    bad = copy.deepcopy(HTTPROUTE)
    bad["spec"]["hostname"] = "x.example"  # the real field is `hostnames`
    _expect_invalid(bad, "hostname")


def test_crd_wrong_type_and_range_fail():
    bad = copy.deepcopy(HTTPROUTE)
    bad["spec"]["rules"][0]["backendRefs"][0]["port"] = "8000"
    _expect_invalid(bad, "spec.rules[0].backendRefs[0].port", "'8000'")
    bad = copy.deepcopy(HTTPROUTE)
    bad["spec"]["rules"][0]["backendRefs"][0]["weight"] = 2_000_000  # CRD maximum is 1,000,000
    _expect_invalid(bad, "weight")


def test_crd_metadata_is_object_meta():
    bad = copy.deepcopy(HTTPROUTE)
    bad["metadata"]["annotation"] = {"a": "b"}
    _expect_invalid(bad, "metadata", "'annotation'")


def test_crd_version_must_be_served():
    bad = copy.deepcopy(HTTPROUTE)
    bad["apiVersion"] = "gateway.networking.k8s.io/v1alpha9"
    _expect_invalid(bad, "no schema for HTTPRoute")


def test_unknown_kind_is_an_error():
    _expect_invalid({"apiVersion": "v1", "kind": "Sevrice", "metadata": {"name": "x"}}, "no schema for Sevrice")


def _rollout(canary: dict) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": copy.deepcopy(DEPLOYMENT["spec"]["template"]),
            "strategy": {"canary": canary},
        },
    }


def test_preserve_unknown_fields_stays_open_but_only_there():
    # Rollout's canary.trafficRouting.plugins is x-kubernetes-preserve-unknown-fields
    # (each plugin has its own config shape); its siblings are typed and closed.
    plugin = {"argoproj-labs/gatewayAPI": {"httpRoute": "web", "namespace": "demo", "anything": {"x": 1}}}
    validate(_rollout({"stableService": "s", "canaryService": "c", "trafficRouting": {"plugins": plugin}}))
    _expect_invalid(
        _rollout({"stableService": "s", "canaryService": "c", "trafficRoutng": {"plugins": plugin}}),
        "spec.strategy.canary",
        "trafficRoutng",
    )


def test_crd_lookup_covers_every_shipped_crd():
    kinds = known_kinds()
    assert CRD_DIR.is_dir()
    assert kinds[("gateway.networking.k8s.io", "HTTPRoute")] == ("v1", "v1beta1")
    assert len(kinds) == len(list(CRD_DIR.glob("*.yaml")))


def test_validate_all_lists_every_bad_object():
    bad1 = copy.deepcopy(DEPLOYMENT)
    bad1["spec"]["replicass"] = 1
    bad2 = copy.deepcopy(HTTPROUTE)
    bad2["spec"]["rulez"] = []
    with pytest.raises(AssertionError) as info:
        validate_all([bad1, DEPLOYMENT, bad2])
    assert "replicass" in str(info.value) and "rulez" in str(info.value)
