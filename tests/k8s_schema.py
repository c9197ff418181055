"""Validate rendered Kubernetes objects against real schemas, strictly.

    from tests.k8s_schema import validate, validate_all

    validate(obj, k8s_version="1.32")      # None, or AssertionError listing every error
    validate_all(objs, k8s_version="1.32")  # the same for a list, one message for all

Contract (stable; other tests import it):

* Built-in kinds (``v1``, ``apps/v1``, ``networking.k8s.io/v1``, ...) are checked against
  the Kubernetes OpenAPI schema of the cluster's minor version as shipped by
  ``kubernetes-validate``, in its *strict* flavour (every object carries
  ``additionalProperties: false``), so a misspelt field fails. The requested version is
  mapped to the newest shipped version not newer than it (the oldest shipped one if the
  request predates them all); ``schema_version()`` says which one that is.
* Custom resources are checked against the CRD manifests in ``tests/data/crds/`` (see
  tests/data/SOURCES.md), picked by API group + kind, using the served version named by the
  object's ``apiVersion``. An API server *prunes* unknown fields of a structural schema
  silently; a silently dropped field is a bug for us, so every object node without
  ``x-kubernetes-preserve-unknown-fields`` and without ``additionalProperties`` is
  treated as closed. ``metadata`` is checked against the built-in ObjectMeta schema.
* On failure an ``AssertionError`` is raised whose message names the object
  (``Kind namespace/name``) and, per error, the field path and what is wrong.
* An object of a kind neither source knows is an error, not a pass.

Not checked (no evaluator here): CEL rules (``x-kubernetes-validations``) and string
``format``s of the CRDs; defaults and admission webhooks of the controllers.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from pathlib import Path
from typing import Iterable

import jsonschema
import yaml
from packaging.version import Version
from referencing import Registry, Resource

__all__ = ["CRD_DIR", "schema_version", "validate", "validate_all"]

CRD_DIR = Path(__file__).resolve().parent / "data" / "crds"  # sources: data/SOURCES.md

_K8S_SCHEMAS = resources.files("kubernetes_validate") / "kubernetes-json-schema"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


# ----------------------------------------------------------------------------- built-in


@functools.cache
def _shipped_versions() -> tuple[Version, ...]:
    found = set()
    for entry in _K8S_SCHEMAS.iterdir():
        name = entry.name
        if name.startswith("v") and name.endswith("-local-strict"):
            found.add(Version(name[1 : -len("-local-strict")]))
    return tuple(sorted(found))


def schema_version(k8s_version: str) -> str:
    """The shipped schema directory used for a cluster version, e.g. "1.32" -> "1.32.0"."""
    wanted = Version(k8s_version.lstrip("v"))
    shipped = _shipped_versions()
    older = [v for v in shipped if (v.major, v.minor) <= (wanted.major, wanted.minor)]
    return str(older[-1] if older else shipped[0])


def _strict_dir(k8s_version: str):
    return _K8S_SCHEMAS / f"v{schema_version(k8s_version)}-local-strict"


@functools.cache
def _k8s_registry(k8s_version: str) -> Registry:
    defs = json.loads((_strict_dir(k8s_version) / "_definitions.json").read_text())
    return Resource.from_contents(defs) @ Registry()


@functools.cache
def _builtin_validator(k8s_version: str, api_version: str, kind: str):
    # Same file naming as kubernetes-validate: "apps/v1" -> "apps-v1",
    # "networking.k8s.io/v1" -> "networking-v1", "v1" -> "v1".
    group, _, version = api_version.rpartition("/")
    suffix = f"{group.split('.')[0]}-{version}" if group else version
    path = _strict_dir(k8s_version) / f"{kind.lower()}-{suffix}.json"
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    registry = Resource.from_contents(schema) @ _k8s_registry(k8s_version)
    return jsonschema.Draft202012Validator(schema, registry=registry)


# ----------------------------------------------------------------------------- CRDs


@functools.cache
def _crd_versions() -> dict[tuple[str, str], dict[str, dict]]:
    """(group, kind) -> {version name: openAPIV3Schema} for every served version."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        # libyaml's loader: the CRDs are 4 MB of YAML, which the pure-Python one reads in ~15 s
        for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            key = (spec["group"], spec["names"]["kind"])
            for v in spec["versions"]:
                if v.get("served"):
                    out.setdefault(key, {})[v["name"]] = v["schema"]["openAPIV3Schema"]
    return out


def _close(node: dict, embedded: bool = False) -> dict:
    """Copy of a structural schema node with pruning made explicit.

    Recurses only through ``properties``, ``additionalProperties`` and ``items``: in a
    structural schema ``anyOf``/``allOf``/``oneOf`` may only add value checks, never new
    fields (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema).
    """
    node = dict(node)
    if "properties" in node:
        node["properties"] = {k: _close(v) for k, v in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _close(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = _close(node["items"])
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if node.get("x-kubernetes-embedded-resource"):
        # An embedded object implicitly has apiVersion/kind/metadata.
        props = dict(node.get("properties", {}))
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
        node["properties"] = props
    if node.get("type") == "object" and not preserve and "additionalProperties" not in node:
        node["additionalProperties"] = False
    return node


@functools.cache
def _crd_validator(k8s_version: str, group: str, version: str, kind: str):
    schemas = _crd_versions().get((group, kind))
    if not schemas or version not in schemas:
        return None
    schema = _close(copy.deepcopy(schemas[version]))
    props = schema.setdefault("properties", {})
    props["metadata"] = {"$ref": f"https://kubernetes.io/api/_definitions.json#/$defs/{_OBJECT_META}"}
    props["apiVersion"] = {"const": f"{group}/{version}"}
    props["kind"] = {"const": kind}
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
    # CRD schemas are OpenAPI v3 (close to draft 4); the keywords they use mean the same
    # in 2020-12, which lets the ObjectMeta $ref resolve into kubernetes-validate's defs.
    return jsonschema.Draft202012Validator(schema, registry=_k8s_registry(k8s_version))


# ----------------------------------------------------------------------------- API


def _describe(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {where}{meta.get('name', '?')} ({obj.get('apiVersion', '?')})"


def _path(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _errors(obj: dict, k8s_version: str) -> list[str]:
    if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind"):
        return ["<root>: an object needs apiVersion and kind"]
    api_version, kind = obj["apiVersion"], obj["kind"]
    group, _, version = api_version.rpartition("/")
    validator = _crd_validator(k8s_version, group, version, kind) if group else None
    source = f"CRD {group}/{version} {kind} in {CRD_DIR}"
    if validator is None:
        validator = _builtin_validator(k8s_version, api_version, kind)
        source = f"Kubernetes {schema_version(k8s_version)} (strict)"
    if validator is None:
        return [f"<root>: no schema for {kind} {api_version}: not a Kubernetes {schema_version(k8s_version)} "
                f"kind, and no CRD in {CRD_DIR} serves it"]
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_path(e)}: {e.message} [{source}]" for e in errors]


def validate(obj: dict, k8s_version: str = "1.32") -> None:
    """Raise AssertionError naming the object and each offending field; None when valid."""
    errors = _errors(obj, k8s_version)
    if errors:
        raise AssertionError(f"{_describe(obj)} is invalid:\n  " + "\n  ".join(errors))


def validate_all(objs: Iterable[dict], k8s_version: str = "1.32") -> None:
    """validate() every object; one AssertionError listing all invalid objects."""
    problems = []
    for obj in objs:
        errors = _errors(obj, k8s_version)
        if errors:
            problems.append(f"{_describe(obj)}:\n  " + "\n  ".join(errors))
    if problems:
        raise AssertionError("invalid Kubernetes objects:\n" + "\n".join(problems))


def known_kinds() -> dict[tuple[str, str], tuple[str, ...]]:
    """(group, kind) -> served versions of the CRDs available here (for diagnostics)."""
    return {k: tuple(sorted(v)) for k, v in _crd_versions().items()}
