"""Runs inside the serving image, before the engine starts.

    python -m runtime.weights sync        copy the model prefix from TOS to the node cache,
                                                 a no-op when every file is already there and verified
    python -m runtime.weights credentials exchange the pod's OIDC token for temporary
                                                 credentials S3 clients (runai_streamer) can use
    python -m runtime.weights verify      refuse to start when tokenizer and config.json disagree

Only the standard library is needed, plus the `tos` SDK for TOS access (in the image) and
`transformers` for `verify` (part of vLLM). Exit status 0 means "go", anything else stops
the pod with a message in its log (`kubectl logs -c <init container>`).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

MANIFEST = ".dsvolc-manifest.json"
LOCK = ".dsvolc.lock"


class WeightsError(Exception):
    """A problem the operator must fix; printed without a traceback."""


# --------------------------------------------------------------------------- stores


@dataclass(frozen=True)
class RemoteObject:
    key: str  # relative to the model prefix
    size: int
    etag: str


class Store(Protocol):
    def list(self) -> list[RemoteObject]: ...
    def fetch(self, key: str, dest: Path) -> None: ...


class DirStore:
    """A directory laid out like the bucket prefix (a mounted volume, or tests)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def list(self) -> list[RemoteObject]:
        if not self.root.is_dir():
            raise WeightsError(f"source {self.root} does not exist")
        out = []
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                st = p.stat()
                out.append(RemoteObject(str(p.relative_to(self.root)), st.st_size, f"{st.st_size}-{int(st.st_mtime_ns)}"))
        return out

    def fetch(self, key: str, dest: Path) -> None:
        shutil.copyfile(self.root / key, dest)


class TosStore:
    """The weights bucket, through the TOS SDK; credentials from IRSA (OIDC) or the
    static reader key (TOS_ACCESS_KEY / TOS_SECRET_KEY)."""

    def __init__(self, bucket: str, prefix: str, endpoint: str, region: str):
        import tos  # type: ignore[import-not-found]

        if os.environ.get("VOLCENGINE_OIDC_TOKEN_FILE"):
            provider = tos.OIDCCredentialsProvider()
        else:
            provider = tos.EnvCredentialsProvider()
        self.client = tos.TosClientV2(endpoint=endpoint, region=region, credentials_provider=provider)
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/"

    def list(self) -> list[RemoteObject]:
        out: list[RemoteObject] = []
        token = None
        while True:
            resp = self.client.list_objects_type2(
                self.bucket, prefix=self.prefix, continuation_token=token, max_keys=1000
            )
            for obj in resp.contents:
                if obj.key.endswith("/"):
                    continue
                out.append(RemoteObject(obj.key[len(self.prefix):], int(obj.size), obj.etag.strip('"')))
            if not resp.is_truncated:
                return out
            token = resp.next_continuation_token

    def fetch(self, key: str, dest: Path) -> None:
        self.client.get_object_to_file(self.bucket, self.prefix + key, str(dest))


# --------------------------------------------------------------------------- sync


def _load_manifest(dest: Path) -> dict[str, dict]:
    try:
        return json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def verified(dest: Path, obj: RemoteObject, manifest: dict[str, dict]) -> bool:
    """A cached file counts only if the manifest recorded the same remote version and the
    file on disk still has the recorded size (a torn copy or a truncated disk fails)."""
    entry = manifest.get(obj.key)
    path = dest / obj.key
    return (
        entry is not None
        and entry.get("etag") == obj.etag
        and entry.get("size") == obj.size
        and path.is_file()
        and path.stat().st_size == obj.size
    )


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def sync(store: Store, dest: Path, log=print, *, metadata_only: bool = False) -> list[str]:
    """Make `dest` hold exactly the store's files; returns the keys that were fetched.

    Safe when several pods on a node start at once (an exclusive lock on the cache dir),
    and when a pod dies mid-copy (files land under a temporary name and are renamed; the
    manifest is written last)."""
    dest.mkdir(parents=True, exist_ok=True)
    objects = store.list()
    if metadata_only:  # config, tokenizer and index files: what verify needs, not the weights
        objects = [o for o in objects if not o.key.endswith(WEIGHT_SUFFIXES)]
    if not objects:
        raise WeightsError("the model prefix is empty: upload the checkpoint first")
    fetched: list[str] = []
    with open(dest / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = _load_manifest(dest)
        for obj in objects:
            if verified(dest, obj, manifest):
                continue
            target = dest / obj.key
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".partial-", dir=target.parent)
            os.close(fd)
            try:
                store.fetch(obj.key, Path(tmp))
                got = Path(tmp).stat().st_size
                if got != obj.size:
                    raise WeightsError(f"{obj.key}: fetched {got} bytes, expected {obj.size}")
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            manifest[obj.key] = {"etag": obj.etag, "size": obj.size}
            fetched.append(obj.key)
            log(f"fetched {obj.key} ({obj.size:,} bytes)")
        keep = {o.key for o in objects}
        manifest = {k: v for k, v in manifest.items() if k in keep}
        tmp_manifest = dest / (MANIFEST + ".tmp")
        tmp_manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp_manifest, dest / MANIFEST)
    if not fetched:
        log(f"cache {dest} already holds all {len(objects)} files; nothing to fetch")
    return fetched


# --------------------------------------------------------------------------- verify


def _ids(value) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, list):
        return {int(v) for v in value}
    return {int(value)}


def check_tokenizer(model_dir: Path) -> list[str]:
    """Problems between the tokenizer and config.json (empty when they agree).

    The embedding may be padded beyond the tokenizer (Qwen2: 151,936 rows for ~151,665
    tokens), so the rule is: every token id the tokenizer can produce is a valid row, and
    the BOS/EOS ids the engine will use are the tokenizer's own."""
    from transformers import AutoTokenizer  # in the serving image (vLLM depends on it)

    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        return [f"{config_path} is missing"]
    except ValueError as exc:
        return [f"{config_path} is not JSON: {exc}"]
    config = config.get("text_config", config)
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any load failure is a reason to stop
        return [f"tokenizer in {model_dir} does not load: {exc}"]
    problems = []
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int):
        problems.append("config.json has no integer vocab_size")
    else:
        if len(tok) > vocab:
            problems.append(
                f"tokenizer has {len(tok):,} tokens but config.json vocab_size is {vocab:,}: "
                "token ids beyond the embedding would crash the engine"
            )
        special = [i for i in tok.all_special_ids if i is not None and i >= vocab]
        if special:
            problems.append(f"special token ids {special} are outside vocab_size {vocab:,}")
    for name in ("bos_token_id", "eos_token_id"):
        cfg_ids = _ids(config.get(name))
        tok_id = getattr(tok, name)
        if cfg_ids and tok_id is not None and tok_id not in cfg_ids:
            problems.append(
                f"{name}: tokenizer says {tok_id}, config.json says {sorted(cfg_ids)}; "
                "generation would not stop (or start) where the model expects"
            )
    return problems


# --------------------------------------------------------------------------- credentials


def write_s3_credentials(out: Path, s3_endpoint: str, region: str) -> None:
    """Exchange the projected OIDC token (IRSA) for temporary credentials and write them as
    shell exports for S3 clients. Without IRSA the static key in the environment is used."""
    if os.environ.get("VOLCENGINE_OIDC_TOKEN_FILE"):
        import tos  # type: ignore[import-not-found]

        creds = tos.OIDCCredentialsProvider().get_credentials()
        ak, sk, token = creds.access_key_id, creds.access_key_secret, creds.security_token
    else:
        ak, sk, token = os.environ.get("TOS_ACCESS_KEY"), os.environ.get("TOS_SECRET_KEY"), None
        if not ak or not sk:
            raise WeightsError("no credentials: neither VOLCENGINE_OIDC_TOKEN_FILE (IRSA) nor TOS_ACCESS_KEY is set")
    lines = {
        "AWS_ACCESS_KEY_ID": ak,
        "AWS_SECRET_ACCESS_KEY": sk,
        "AWS_ENDPOINT_URL": s3_endpoint,
        "RUNAI_STREAMER_S3_ENDPOINT": s3_endpoint,
        "AWS_DEFAULT_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    if token:
        lines["AWS_SESSION_TOKEN"] = token
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        for k, v in lines.items():
            fh.write(f"export {k}={_shell_quote(v)}\n")


def _shell_quote(v: str) -> str:
    return "'" + str(v).replace("'", "'\"'\"'") + "'"


# --------------------------------------------------------------------------- entry point


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.weights")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="copy the model prefix to the node cache (no-op when verified)")
    s.add_argument("--dest", required=True, type=Path)
    s.add_argument("--source-dir", type=Path, help="copy from a directory instead of TOS")
    s.add_argument("--bucket")
    s.add_argument("--prefix")
    s.add_argument("--endpoint")
    s.add_argument("--region")
    s.add_argument("--verify", action="store_true", help="also check tokenizer against config.json")
    s.add_argument("--metadata-only", action="store_true", help="skip weight files (config and tokenizer only)")
    v = sub.add_parser("verify", help="check tokenizer against config.json")
    v.add_argument("model_dir", type=Path)
    c = sub.add_parser("credentials", help="write S3 credentials for runai_streamer")
    c.add_argument("--out", required=True, type=Path)
    c.add_argument("--s3-endpoint", required=True)
    c.add_argument("--region", required=True)
    args = parser.parse_args(list(argv) if argv is not None else None)

    try:
        if args.cmd == "sync":
            if args.source_dir is not None:
                store: Store = DirStore(args.source_dir)
            else:
                missing = [n for n in ("bucket", "prefix", "endpoint", "region") if not getattr(args, n)]
                if missing:
                    raise WeightsError(f"sync from TOS needs --{', --'.join(missing)}")
                store = TosStore(args.bucket, args.prefix, args.endpoint, args.region)
            sync(store, args.dest, metadata_only=args.metadata_only)
            if args.verify:
                _verify_or_raise(args.dest)
        elif args.cmd == "verify":
            _verify_or_raise(args.model_dir)
        elif args.cmd == "credentials":
            write_s3_credentials(args.out, args.s3_endpoint, args.region)
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _verify_or_raise(model_dir: Path) -> None:
    problems = check_tokenizer(model_dir)
    if problems:
        raise WeightsError("tokenizer and config.json disagree in " + str(model_dir) + ":\n  - " + "\n  - ".join(problems))
    print(f"tokenizer and config.json agree in {model_dir}")


if __name__ == "__main__":
    sys.exit(main())
