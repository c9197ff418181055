"""Shipped stacks as an operator would deploy them: identity provider filled in, images
mirrored and built.

The shipped staging and prod stacks carry placeholder identity providers in a reserved
example domain on purpose (the `identity-provider-not-placeholder` policy refuses them, so
they cannot reach `pulumi up` unfilled), and no digest has been recorded for the mirrored
images or the serving build (prod requires them: `images-by-digest`). Tests that need a
stack that is otherwise deployable start from these copies; tests of the shipped files
themselves assert those verdicts instead (tests/test_identity.py, tests/test_mirror.py).

The digests here are SYNTHETIC: sha256 of the artifact's name, in a lock file written to a
temporary directory. They stand for "some digest was recorded"; they are not the digest of
any real image and are never written into the repository.
"""

from __future__ import annotations

import copy
import hashlib
import tempfile
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


# A public domain outside every reserved name, and a certificate id of the form the
# certificate service issues (never contacted either).
FILLED_TLS = {"domain": "api.deepseek-volc.internal", "certificate_id": "cert-0a1b2c3d4e5f6g7h8i9j0k1l2"}


def synthetic_digest(name: str) -> str:
    return "sha256:" + hashlib.sha256(f"synthetic test digest of {name}".encode()).hexdigest()


_LOCK_DIR = Path(tempfile.mkdtemp(prefix="dsvolc-test-lock-"))


def recorded_lock() -> Path:
    """A lock file in which every artifact of the shipped lock has a (synthetic) digest."""
    import yaml

    path = _LOCK_DIR / "mirror.lock.yaml"
    if not path.exists():
        shipped = yaml.safe_load((Path(__file__).resolve().parent.parent / "stacks" / "mirror.lock.yaml").read_text())
        doc = {section: {k: (synthetic_digest(k) if section != "files" else synthetic_digest(k)[7:])
                         for k in (shipped.get(section) or {})} for section in ("images", "charts", "files")}
        path.write_text(yaml.safe_dump(doc))
    return path


def filled(raw: dict) -> dict:
    """A deep copy of raw settings with the identity provider and the edge domain filled in, the mirror's
    digests recorded and, for prod, the serving image built (synthetic digests, see above)."""
    out = copy.deepcopy(raw)
    out["serving"]["auth"] = {**out["serving"].get("auth", {}), **FILLED_IDENTITY}
    gw = out.setdefault("gateway", {})
    gw["tls"] = {**gw.get("tls", {}), **FILLED_TLS}
    out.setdefault("registry", {})["mirror_lock"] = str(recorded_lock())
    if out.get("environment_class") == "prod":  # built and recorded (prod runs digests only)
        out["serving"]["image"] = {**out["serving"]["image"], "digest": synthetic_digest("serving image")}
    return out


def filled_raw(stack: str) -> dict:
    return filled(read_raw(stack))


def filled_stack_file(stack: str, directory: Path, name: str | None = None) -> Path:
    """Write `Pulumi.<name or stack>.yaml` with the shipped settings, identity filled in."""
    path = Path(directory) / f"Pulumi.{name or stack}.yaml"
    path.write_text(yaml.safe_dump({"config": {SETTINGS_KEY: filled_raw(stack)}}))
    return path
