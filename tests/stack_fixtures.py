"""Shipped stacks as an operator would deploy them: the identity provider filled in.

The shipped staging and prod stacks carry placeholder identity providers in a reserved
example domain on purpose (the `identity-provider-not-placeholder` policy refuses them, so
they cannot reach `pulumi up` unfilled). Tests that need a stack that is otherwise
deployable start from these copies; tests of the shipped files themselves assert the
placeholder verdict instead (tests/test_identity.py).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from stacks import read_raw
from stacks.loader import SETTINGS_KEY

# A provider outside every reserved name; never contacted (previews are offline).
FILLED_IDENTITY = {
    "issuer": "https://login.deepseek-volc.internal/",
    "audiences": ["deepseek-api"],
    "jwks_uri": "https://login.deepseek-volc.internal/.well-known/jwks.json",
}


def filled(raw: dict) -> dict:
    """A deep copy of raw settings with the identity provider filled in."""
    out = copy.deepcopy(raw)
    out["serving"]["auth"] = {**out["serving"].get("auth", {}), **FILLED_IDENTITY}
    return out


def filled_raw(stack: str) -> dict:
    return filled(read_raw(stack))


def filled_stack_file(stack: str, directory: Path, name: str | None = None) -> Path:
    """Write `Pulumi.<name or stack>.yaml` with the shipped settings, identity filled in."""
    path = Path(directory) / f"Pulumi.{name or stack}.yaml"
    path.write_text(yaml.safe_dump({"config": {SETTINGS_KEY: filled_raw(stack)}}))
    return path
