"""Runs inside the serving image, before the engine starts.

    python -m runtime.weights sync        copy the model prefix from TOS (S3 API) to the node
                                          cache: resumable per file, verified, parallel; a
                                          no-op when every file is already there and verified
    python -m runtime.weights credentials exchange the pod's OIDC token for temporary
                                          credentials S3 clients (runai_streamer) can use
    python -m runtime.weights verify      refuse to start when tokenizer and config.json disagree

`sync --mark-node KEY=VALUE` (the pre-warm DaemonSet) also labels the node it runs on: the
label is removed before a sync when it names another revision (the files are about to
change under it) and set to VALUE once every file is verified, so a label on a node means
"this revision is complete here" (workloads/engine/groups.py weights_revision; the
multi-node groups prefer such nodes). It talks to the Kubernetes API with the pod's
ServiceAccount token (runtime/gpu_health.py Cluster), which may get and patch nodes only.

TOS speaks the S3 API on `tos-s3-<region>[.i]volces.com` (virtual-hosted bucket names), so
the sync uses boto3 against that endpoint; with IRSA the pod's projected token is exchanged
through STS AssumeRoleWithOIDC by the TOS SDK's provider (`tos.OIDCCredentialsProvider`,
which re-reads the rotating token and refreshes before expiry), and the temporary keys are
handed to boto3 as refreshable credentials. Without IRSA the reader's static key comes from
TOS_ACCESS_KEY / TOS_SECRET_KEY (the stores and their credentials: runtime/stores.py). Exit
status 0 means "go", anything else stops the pod with a message in its log
(`kubectl logs -c <init container>`).

How the sync keeps its promises:

* one copy per node: an exclusive lock on the model directory; a second pod on the node
  waits for the first, then finds every file verified and fetches nothing;
* nothing half-written under its final name: bytes land in `.dsvolc-partial/` and are
  renamed into place only after their size and checksum are verified;
* resumable per file: the manifest records each file the moment it is verified, and an
  interrupted file is continued with an HTTP Range request conditional on the same ETag
  (If-Match); a partial that fails verification is fetched again whole, alone;
* verified: size, and the content against the object's ETag (MD5 for single-part uploads,
  MD5 of the part MD5s for multipart ones); a file whose size or mtime changed on disk
  since it was verified is checked again and re-fetched when it no longer matches;
* parallel: files are fetched by `--connections` workers sharing one connection pool of
  that size.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

# The stores and their credentials live in runtime/stores.py; the names are re-exported
# here, where the tool's callers (tests, benchmarks) and its docs have always found them.
from .stores import (  # noqa: F401 - re-exported
    CHUNK,
    DEFAULT_CONNECTIONS,
    ChangedRemotely,
    DirStore,
    RemoteObject,
    S3Store,
    Store,
    WeightsError,
    write_s3_credentials,
)

MANIFEST = ".dsvolc-manifest.json"
LOCK = ".dsvolc.lock"
PARTIAL_DIR = ".dsvolc-partial"
MiB = 1024 * 1024
# Part sizes common S3/TOS upload tools use; tried for a multipart ETag when the server
# does not report the first part's size (HEAD ?partNumber=1).
COMMON_PART_SIZES = tuple(s * MiB for s in (5, 8, 10, 16, 20, 32, 50, 64, 100, 128, 256, 512, 1024))
MAX_PART_SIZE_GUESSES = 3
MAX_STREAM_FAULTS = 5  # broken connections tolerated per file (each resumes where it broke)
MAX_CHECKSUM_RETRIES = 2  # whole refetches of a file whose content fails its ETag


# --------------------------------------------------------------------------- checksums


class ContentHash:
    """What an object's ETag says about its bytes, computed while they stream past.

    Single-part ETag: MD5 of the content. Multipart (`<hex>-<parts>`): MD5 of the parts'
    binary MD5s; the part size comes from the server or from the common sizes consistent
    with the part count (several candidates are hashed side by side)."""

    def __init__(self, etag: str, size: int, part_size: int | None):
        self.etag = etag
        self.kind = "none"
        self.candidates: list[int] = []
        body, _, parts = etag.partition("-")
        if len(body) == 32 and all(c in "0123456789abcdef" for c in body.lower()):
            if not parts:
                self.kind = "md5"
                self._md5 = hashlib.md5()
            elif parts.isdigit():
                n = int(parts)
                if part_size and -(-size // part_size) == n:
                    self.candidates = [part_size]
                else:
                    guesses = {s for s in COMMON_PART_SIZES if -(-size // s) == n}
                    guesses.add(-(-(-(-size // n)) // MiB) * MiB)  # ceil(size / n) rounded up to MiB
                    self.candidates = sorted(g for g in guesses if g > 0 and -(-size // g) == n)[:MAX_PART_SIZE_GUESSES]
                if self.candidates:
                    self.kind = "multipart"
                    self._parts = {c: [hashlib.md5(), 0, []] for c in self.candidates}  # hash, bytes in part, digests
        self.size = 0

    @property
    def verifiable(self) -> bool:
        return self.kind != "none"

    def update(self, data: bytes) -> None:
        self.size += len(data)
        if self.kind == "md5":
            self._md5.update(data)
        elif self.kind == "multipart":
            for ps, state in self._parts.items():
                view = memoryview(data)
                while view:
                    take = min(len(view), ps - state[1])
                    state[0].update(view[:take])
                    state[1] += take
                    view = view[take:]
                    if state[1] == ps:
                        state[2].append(state[0].digest())
                        state[0], state[1] = hashlib.md5(), 0

    def matches(self) -> bool:
        """True when the bytes seen are those the ETag describes (True if it describes nothing)."""
        if self.kind == "md5":
            return self._md5.hexdigest() == self.etag.lower()
        if self.kind == "multipart":
            for state in self._parts.values():
                digests = state[2] + ([state[0].digest()] if state[1] else [])
                if f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}" == self.etag.lower():
                    return True
            return False
        return True


def _hash_file(path: Path, h: ContentHash, limit: int | None = None) -> None:
    with open(path, "rb") as fh:
        left = limit
        while True:
            chunk = fh.read(CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                return
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
                if left == 0:
                    return


# --------------------------------------------------------------------------- sync


@dataclass
class SyncReport:
    fetched: list[str] = field(default_factory=list)  # keys whose bytes were (at least partly) downloaded
    resumed: dict[str, int] = field(default_factory=dict)  # key -> offset a partial file was continued from
    repaired: list[str] = field(default_factory=list)  # keys found corrupt or torn on disk and fetched again
    unverifiable: list[str] = field(default_factory=list)  # keys checked by size only (ETag is not an MD5)
    bytes_downloaded: int = 0
    seconds: float = 0.0


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _load_manifest(dest: Path) -> dict[str, dict]:
    try:
        data = json.loads((dest / MANIFEST).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_manifest(dest: Path, manifest: dict[str, dict]) -> None:
    tmp = dest / (MANIFEST + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dest / MANIFEST)


def _partial_path(dest: Path, obj: RemoteObject) -> Path:
    # The ETag in the name ties the bytes to one remote version: a partial of another
    # version is never continued.
    safe = "".join(c if c.isalnum() else "_" for c in obj.etag)[:80]
    return dest / PARTIAL_DIR / f"{obj.key}.{safe}.part"


def _stat_matches(path: Path, entry: dict) -> bool:
    st = path.stat()
    return st.st_size == entry.get("size") and st.st_mtime_ns == entry.get("mtime_ns")


def _check_index(dest: Path, objects: list[RemoteObject], store: Store) -> None:
    """Every shard the checkpoint's index names must be in the prefix."""
    listed = {o.key for o in objects}
    for name in INDEX_FILES:
        path = dest / name
        if name not in listed or not path.is_file():
            continue
        try:
            weight_map = json.loads(path.read_text()).get("weight_map", {})
        except ValueError as exc:
            raise WeightsError(f"{store.describe(name)} is not JSON: {exc}") from None
        missing = sorted(set(weight_map.values()) - listed)
        if missing:
            raise WeightsError(f"{store.describe(name)} names {len(missing)} shard(s) missing from the prefix: "
                               + ", ".join(store.describe(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else ""))


class _Syncer:
    def __init__(self, store: Store, dest: Path, log, deep_verify: bool):
        self.store, self.dest, self.log, self.deep = store, dest, log, deep_verify
        self.manifest = _load_manifest(dest)
        self.report = SyncReport()
        self._lock = threading.Lock()

    # -- what is already there
    def verified(self, obj: RemoteObject) -> bool:
        entry = self.manifest.get(obj.key)
        path = self.dest / obj.key
        if entry is None or entry.get("etag") != obj.etag or entry.get("size") != obj.size or not path.is_file():
            return False
        if not self.deep and _stat_matches(path, entry):
            return True
        # Changed on disk since verified (or a deep check): hash it against the ETag again.
        if path.stat().st_size != obj.size:
            self.log(f"{obj.key}: size on disk is {path.stat().st_size:,}, expected {obj.size:,}; fetching again")
            self._repaired(obj.key)
            return False
        h = ContentHash(obj.etag, obj.size, entry.get("part_size"))
        if not h.verifiable:
            return True
        _hash_file(path, h)
        if h.matches():
            self._record(obj, path, entry.get("part_size"))
            return True
        self.log(f"{obj.key}: content on disk does not match ETag {obj.etag}; fetching again")
        self._repaired(obj.key)
        return False

    def _record(self, obj: RemoteObject, path: Path, part_size: int | None) -> None:
        st = path.stat()
        with self._lock:
            self.manifest[obj.key] = {"etag": obj.etag, "size": obj.size, "mtime_ns": st.st_mtime_ns,
                                      "part_size": part_size}
            _write_manifest(self.dest, self.manifest)

    def ensure(self, obj: RemoteObject) -> None:
        if not self.verified(obj):
            self.fetch(obj)

    def _repaired(self, key: str) -> None:
        with self._lock:
            self.report.repaired.append(key)

    # -- fetching one file
    def fetch(self, obj: RemoteObject) -> None:
        """Download one object into its partial file and move it into place once verified.
        A connection that breaks mid-stream (or a short read) is resumed from the bytes
        already on disk, up to MAX_STREAM_FAULTS times; content that fails its ETag is
        fetched again whole, up to MAX_CHECKSUM_RETRIES times."""
        part_size = self.store.part_size(obj) if "-" in obj.etag else None
        faults = mismatches = 0
        while True:
            partial = _partial_path(self.dest, obj)
            partial.parent.mkdir(parents=True, exist_ok=True)
            offset = partial.stat().st_size if partial.exists() else 0
            if offset > obj.size:
                partial.unlink()
                offset = 0
            h = ContentHash(obj.etag, obj.size, part_size)
            if offset:
                _hash_file(partial, h, offset)
                with self._lock:
                    self.report.resumed[obj.key] = offset
                self.log(f"{obj.key}: resuming at {offset:,} of {obj.size:,} bytes")
            try:
                got = self._download(obj, partial, offset, h)
            except ChangedRemotely:
                self.log(f"{obj.key}: changed in the bucket since it was listed")
                partial.unlink(missing_ok=True)
                raise WeightsError(f"{self.store.describe(obj.key)} changed during the sync (ETag no longer "
                                   f"{obj.etag}); run the sync again once the upload is complete") from None
            except WeightsError:
                raise
            except Exception as exc:  # noqa: BLE001 - the connection broke mid-stream (botocore, urllib3, OS)
                faults += 1
                if faults > MAX_STREAM_FAULTS:
                    raise WeightsError(f"{self.store.describe(obj.key)}: the download broke {faults} times, "
                                       f"last: {exc}") from None
                self.log(f"{obj.key}: download broke ({type(exc).__name__}: {exc}); resuming")
                continue
            if got < obj.size:  # the server closed early: resume from what arrived
                faults += 1
                if faults > MAX_STREAM_FAULTS:
                    raise WeightsError(f"{self.store.describe(obj.key)}: got {got:,} of {obj.size:,} bytes "
                                       f"after {faults} attempts")
                continue
            if got > obj.size:
                partial.unlink(missing_ok=True)
                raise WeightsError(f"{self.store.describe(obj.key)}: got {got:,} bytes, expected {obj.size:,}")
            if not h.matches():
                partial.unlink(missing_ok=True)
                self.log(f"{obj.key}: checksum does not match ETag {obj.etag}"
                         + (" (the partial file was corrupt)" if offset else "") + "; fetching it again whole")
                mismatches += 1
                if mismatches > MAX_CHECKSUM_RETRIES:
                    raise WeightsError(f"{self.store.describe(obj.key)}: content does not match its ETag "
                                       f"{obj.etag} after {mismatches} attempts")
                continue
            if not h.verifiable:
                with self._lock:
                    self.report.unverifiable.append(obj.key)
                self.log(f"{obj.key}: ETag {obj.etag} is not an MD5; verified by size only")
            target = self.dest / obj.key
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial, target)
            self._record(obj, target, h.candidates[0] if h.kind == "multipart" and len(h.candidates) == 1 else part_size)
            with self._lock:
                self.report.fetched.append(obj.key)
            self.log(f"fetched {obj.key} ({obj.size:,} bytes)")
            return

    def _download(self, obj: RemoteObject, partial: Path, offset: int, h: ContentHash) -> int:
        written = offset
        with open(partial, "ab") as fh:
            for chunk in self.store.read(obj, offset):
                fh.write(chunk)
                h.update(chunk)
                written += len(chunk)
                with self._lock:
                    self.report.bytes_downloaded += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        return written


def _prepare_dest(dest: Path) -> None:
    parent = dest.parent
    if not parent.is_dir():
        raise WeightsError(f"the cache mount {parent} does not exist: the node's model-cache disk is not mounted")
    try:
        dest.mkdir(exist_ok=True)
        probe = dest / ".dsvolc-write-test"
        probe.write_text("")
        probe.unlink()
    except PermissionError:
        st = parent.stat()
        raise WeightsError(
            f"cannot write {dest} as uid {os.getuid()}: {parent} is owned by uid {st.st_uid} with mode "
            f"{st.st_mode & 0o777:o}; the node's init script must hand the model-cache mount to the serving uid"
        ) from None


def sync(store: Store, dest: Path, log=print, *, metadata_only: bool = False,
         connections: int = DEFAULT_CONNECTIONS, deep_verify: bool = False) -> SyncReport:
    """Make `dest` hold the store's files, verified; returns what was fetched and how."""
    if connections < 1:
        raise WeightsError(f"--connections: expected a positive number, got {connections}")
    start = time.monotonic()
    dest = Path(dest)
    objects = store.list()
    if metadata_only:  # config, tokenizer and index files: what verify needs, not the weights
        objects = [o for o in objects if not o.key.endswith(WEIGHT_SUFFIXES)]
    if not objects:
        raise WeightsError(f"{store.describe()} is empty: upload the checkpoint first")
    _prepare_dest(dest)
    with open(dest / LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another pod on this node is syncing {dest}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        s = _Syncer(store, dest, log, deep_verify)
        # Small files first: config and index are checked before any shard is fetched.
        small = [o for o in objects if not o.key.endswith(WEIGHT_SUFFIXES)]
        large = sorted((o for o in objects if o.key.endswith(WEIGHT_SUFFIXES)), key=lambda o: -o.size)
        for batch, check in ((small, True), (large, False)):
            with ThreadPoolExecutor(max_workers=connections) as pool:
                futures = [pool.submit(s.ensure, o) for o in batch]
                wait(futures, return_when=FIRST_EXCEPTION)
                failed = [f for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
                if failed:
                    for f in futures:
                        f.cancel()
                    raise failed[0].exception()
            if check:
                _check_index(dest, objects, store)
        keep = {o.key for o in objects}
        stale = [k for k in s.manifest if k not in keep]
        if stale:
            for k in stale:
                del s.manifest[k]
            _write_manifest(dest, s.manifest)
        partial_root = dest / PARTIAL_DIR
        if partial_root.is_dir():
            shutil.rmtree(partial_root, ignore_errors=True)  # leftovers of other versions
    s.report.seconds = time.monotonic() - start
    r = s.report
    if not r.fetched:
        log(f"cache {dest} already holds all {len(objects)} files, verified; nothing to fetch")
    else:
        rate = r.bytes_downloaded / MiB / max(r.seconds, 1e-9)
        log(f"fetched {len(r.fetched)} of {len(objects)} files, {r.bytes_downloaded:,} bytes in {r.seconds:.1f} s "
            f"({rate:,.0f} MiB/s, {connections} connections)")
    return r


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


# --------------------------------------------------------------------------- node mark


@dataclass(frozen=True)
class NodeMark:
    """The label the pre-warm puts on its node once the cache holds a revision."""

    cluster: object  # runtime.gpu_health.Cluster (or anything with call())
    node: str
    key: str
    value: str

    def _labels(self) -> dict:
        return self._call("GET", f"/api/v1/nodes/{self.node}").get("metadata", {}).get("labels") or {}

    def _patch(self, value: str | None) -> None:
        self._call("PATCH", f"/api/v1/nodes/{self.node}", {"metadata": {"labels": {self.key: value}}},
                   "application/merge-patch+json")

    def _call(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json"):
        import urllib.error

        try:
            return self.cluster.call(method, path, body, content_type)
        except urllib.error.HTTPError as exc:
            verb = "get" if method == "GET" else "patch"
            hint = (f": the pre-warm's ServiceAccount may not {verb} nodes (its ClusterRole, "
                    "workloads/engine/resilience.py)") if exc.code == 403 else ""
            raise WeightsError(f"{method} node {self.node}: HTTP {exc.code}{hint}") from None
        except OSError as exc:
            raise WeightsError(f"{method} node {self.node}: the Kubernetes API is unreachable: {exc}") from None

    def invalidate(self, log=print) -> None:
        """Remove the label when it names another revision than the one about to be synced."""
        current = self._labels().get(self.key)
        if current is not None and current != self.value:
            log(f"node {self.node}: {self.key}={current} names another revision; removing it before the sync")
            self._patch(None)

    def set(self, log=print) -> None:
        if self._labels().get(self.key) != self.value:
            self._patch(self.value)
        log(f"node {self.node}: labelled {self.key}={self.value} (weights verified)")


def node_mark(spec: str, node: str | None, cluster=None) -> NodeMark:
    """`KEY=VALUE` and the node name (the downward API's spec.nodeName) -> a NodeMark."""
    key, sep, value = spec.partition("=")
    if not sep or not key or not value:
        raise WeightsError(f"--mark-node: expected KEY=VALUE, got {spec!r}")
    if not node:
        raise WeightsError("--mark-node needs the node's name: --node or $NODE_NAME (fieldRef spec.nodeName)")
    if cluster is None:
        from .gpu_health import Cluster

        try:
            cluster = Cluster.in_cluster()
        except (KeyError, OSError) as exc:
            raise WeightsError(f"--mark-node: no Kubernetes API credentials in the pod ({exc})") from None
    return NodeMark(cluster, node, key, value)


# --------------------------------------------------------------------------- entry point


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.weights")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sync", help="copy the model prefix to the node cache (no-op when verified)")
    s.add_argument("--dest", required=True, type=Path,
                   help="the model directory; created inside its parent (the node cache mount), which must exist")
    s.add_argument("--source-dir", type=Path, help="copy from a directory instead of the bucket")
    s.add_argument("--bucket")
    s.add_argument("--prefix")
    s.add_argument("--endpoint", help="S3 endpoint URL, e.g. https://tos-s3-cn-beijing.ivolces.com")
    s.add_argument("--region")
    s.add_argument("--addressing-style", choices=("virtual", "path"), default="virtual",
                   help="bucket in the host name (TOS) or in the path")
    s.add_argument("--connections", type=int, default=DEFAULT_CONNECTIONS,
                   help="files fetched in parallel (and HTTP connections)")
    s.add_argument("--deep-verify", action="store_true", help="hash every cached file again, not only changed ones")
    s.add_argument("--verify", action="store_true", help="also check tokenizer against config.json")
    s.add_argument("--metadata-only", action="store_true", help="skip weight files (config and tokenizer only)")
    s.add_argument("--mark-node", metavar="KEY=VALUE",
                   help="label this node KEY=VALUE once every file is verified (removed first if it names another)")
    s.add_argument("--node", default=os.environ.get("NODE_NAME"), help="the node to label (default: $NODE_NAME)")
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
                    raise WeightsError(f"sync from the bucket needs --{', --'.join(missing)}")
                store = S3Store(args.bucket, args.prefix, args.endpoint, args.region,
                                connections=max(args.connections, 1), addressing_style=args.addressing_style)
            mark = node_mark(args.mark_node, args.node) if args.mark_node else None
            if mark is not None:
                mark.invalidate(log=_log)
            sync(store, args.dest, metadata_only=args.metadata_only, connections=args.connections,
                 deep_verify=args.deep_verify, log=_log)
            if args.verify:
                _verify_or_raise(args.dest)
            if mark is not None:
                mark.set(log=_log)
        elif args.cmd == "verify":
            _verify_or_raise(args.model_dir)
        elif args.cmd == "credentials":
            write_s3_credentials(args.out, args.s3_endpoint, args.region)
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


_LOG_LOCK = threading.Lock()


def _log(message: str) -> None:
    """One line per message even when the fetch threads log at once."""
    with _LOG_LOCK:
        sys.stdout.write(message + "\n")
        sys.stdout.flush()


def _verify_or_raise(model_dir: Path) -> None:
    problems = check_tokenizer(model_dir)
    if problems:
        raise WeightsError("tokenizer and config.json disagree in " + str(model_dir) + ":\n  - " + "\n  - ".join(problems))
    print(f"tokenizer and config.json agree in {model_dir}")


if __name__ == "__main__":
    sys.exit(main())
