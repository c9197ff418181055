"""The mock engine's recording: secrets found on the wire without converting every Struct."""

from __future__ import annotations

import pytest
from google.protobuf import json_format, struct_pb2

from dsvolc import engine


def _struct(doc: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(doc)
    return s


def _secret(value) -> dict:
    return {engine._SECRET_SIG: engine._SECRET_VALUE, "value": value}


def test_secret_paths_are_found_at_any_depth():
    wire = _struct({"a": _secret("s"), "b": {"c": [1, _secret({"d": "x"})]}, "e": "plain"})
    assert sorted(engine._secret_paths(wire), key=str) == [("a",), ("b", "c", 1)]


def test_a_registration_without_secrets_is_not_converted(monkeypatch):
    """Most registrations carry no secret: finding that out must not walk the whole Struct
    through json_format (it did, once per registration)."""
    def refuse(*_a, **_k):
        raise AssertionError("converted a Struct that holds no secret")

    wire = _struct({"name": "x", "spec": {"replicas": 2, "items": [{"k": "v"}] * 50}})
    monkeypatch.setattr(json_format, "MessageToDict", refuse)
    assert engine._secret_paths(wire) == []


@pytest.mark.parametrize("doc", [{"note": engine._SECRET_VALUE}, {engine._SECRET_SIG: "other", "value": 1}])
def test_the_signature_alone_is_not_a_secret(doc):
    """A value that merely contains the signature string is walked and found not secret."""
    assert engine._secret_paths(_struct(doc)) == []
