"""Weights reach the node once: the sync runs against a real S3 server process (the protocol
of TOS's S3-compatible endpoint), resumes per file after a kill, repairs what is corrupt or
torn, names what is missing, lets one of two pods on a node download while the other
waits, and never leaves a half-written file under its final name. The engine refuses a
tokenizer that disagrees with config.json."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runtime import weights as wt
from s3_server import CuttingProxy, S3Server, upload_multipart

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "models/tiny"
PART = 5 * 1024 * 1024  # the S3 minimum part size


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def creds(s3, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("VOLCENGINE_OIDC_TOKEN_FILE", raising=False)


def _random(n: int, seed: int) -> bytes:
    out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


class Bucket:
    """A bucket on the server holding the tiny model plus two larger shards: one uploaded
    in one piece (ETag = MD5), one as multipart (ETag = MD5 of part MD5s)."""

    def __init__(self, s3: S3Server, model: Path, shard_bytes: int = 3 * PART + 12345):
        self.s3, self.name = s3, f"w-{uuid.uuid4().hex[:12]}"
        self.client = s3.create_bucket(self.name)
        self.files: dict[str, bytes] = {}
        for p in sorted(model.rglob("*")):
            if p.is_file():
                self.put(str(p.relative_to(model)), p.read_bytes())
        self.put("shard-a.safetensors", _random(shard_bytes, 1))
        data = _random(shard_bytes, 2)
        upload_multipart(self.client, self.name, f"{PREFIX}/shard-b.safetensors", data, PART)
        self.files["shard-b.safetensors"] = data

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=f"{PREFIX}/{key}", Body=data)
        self.files[key] = data

    def store(self, connections: int = 4) -> wt.S3Store:
        return wt.S3Store(self.name, PREFIX, self.s3.endpoint, "cn-beijing", connections=connections,
                          addressing_style="path")

    def cli(self, dest: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "runtime.weights", "sync", "--bucket", self.name, "--prefix", PREFIX,
                "--endpoint", self.s3.endpoint, "--region", "cn-beijing", "--addressing-style", "path",
                "--dest", str(dest), *extra]


@pytest.fixture()
def bucket(s3, creds, tiny_deepseek_v2) -> Bucket:
    return Bucket(s3, tiny_deepseek_v2)


def quiet(*_):
    pass


def assert_holds(dest: Path, bucket: Bucket) -> None:
    for key, data in bucket.files.items():
        assert (dest / key).read_bytes() == data, key
    assert not (dest / wt.PARTIAL_DIR).exists()


def test_first_sync_copies_and_verifies_everything(bucket, tmp_path):
    dest = tmp_path / "cache" / "tiny"
    (tmp_path / "cache").mkdir()
    report = wt.sync(bucket.store(), dest, log=quiet)
    assert sorted(report.fetched) == sorted(bucket.files)
    assert report.unverifiable == [] and report.resumed == {} and report.repaired == []
    assert_holds(dest, bucket)
    manifest = json.loads((dest / wt.MANIFEST).read_text())
    assert set(manifest) == set(bucket.files)
    # The multipart shard was checked against its multipart ETag with the real part size.
    assert manifest["shard-b.safetensors"]["etag"].endswith("-4")
    assert manifest["shard-b.safetensors"]["part_size"] == PART


def test_second_sync_fetches_nothing(bucket, tmp_path):
    dest = tmp_path / "tiny"
    wt.sync(bucket.store(), dest, log=quiet)
    stats = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("*.safetensors")}
    again = wt.sync(bucket.store(), dest, log=quiet)
    assert again.fetched == [] and again.bytes_downloaded == 0
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("*.safetensors")} == stats


def test_a_corrupted_file_is_repaired_alone(bucket, tmp_path):
    dest = tmp_path / "tiny"
    wt.sync(bucket.store(), dest, log=quiet)
    for name in ("shard-a.safetensors", "shard-b.safetensors"):
        with open(dest / name, "r+b") as fh:  # same size, one byte flipped
            fh.seek(PART + 7)
            b = fh.read(1)
            fh.seek(PART + 7)
            fh.write(bytes([b[0] ^ 0xFF]))
    report = wt.sync(bucket.store(), dest, log=quiet)
    assert sorted(report.repaired) == sorted(report.fetched) == ["shard-a.safetensors", "shard-b.safetensors"]
    assert_holds(dest, bucket)


def test_a_touched_but_intact_file_is_rehashed_not_refetched(bucket, tmp_path):
    dest = tmp_path / "tiny"
    wt.sync(bucket.store(), dest, log=quiet)
    os.utime(dest / "shard-b.safetensors", ns=(1, 1))
    report = wt.sync(bucket.store(), dest, log=quiet)
    assert report.fetched == [] and report.repaired == []


def test_torn_or_missing_files_are_fetched_again_alone(bucket, tmp_path):
    dest = tmp_path / "tiny"
    wt.sync(bucket.store(), dest, log=quiet)
    with open(dest / "shard-a.safetensors", "r+b") as fh:  # a copy cut short by a node crash
        fh.truncate(10)
    (dest / "config.json").unlink()
    report = wt.sync(bucket.store(), dest, log=quiet)
    assert sorted(report.fetched) == ["config.json", "shard-a.safetensors"]
    assert_holds(dest, bucket)


def test_a_new_remote_version_is_fetched(bucket, tmp_path):
    dest = tmp_path / "tiny"
    wt.sync(bucket.store(), dest, log=quiet)
    bucket.put("generation_config.json", json.dumps({"temperature": 0.6}).encode())
    assert wt.sync(bucket.store(), dest, log=quiet).fetched == ["generation_config.json"]
    assert json.loads((dest / "generation_config.json").read_text()) == {"temperature": 0.6}


def test_a_corrupt_partial_file_is_resumed_then_refetched_whole(bucket, tmp_path):
    dest = tmp_path / "tiny"
    store = bucket.store()
    obj = next(o for o in store.list() if o.key == "shard-a.safetensors")
    partial = wt._partial_path(dest, obj)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * PART)  # the right length of prefix, the wrong bytes
    lines: list[str] = []
    report = wt.sync(store, dest, log=lines.append)
    assert report.resumed == {"shard-a.safetensors": PART}
    assert any("partial file was corrupt" in line for line in lines), lines
    assert_holds(dest, bucket)


def test_killed_mid_download_resumes_without_refetching_finished_files(s3, creds, tiny_deepseek_v2, tmp_path):
    """A real kill: the CLI is SIGKILLed while a shard is half-way, then run again."""
    b = Bucket(s3, tiny_deepseek_v2, shard_bytes=12 * PART)
    dest = tmp_path / "tiny"
    proc = subprocess.Popen(b.cli(dest, "--connections", "1"), cwd=ROOT, env={**os.environ},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    partial_dir = dest / wt.PARTIAL_DIR
    deadline = time.monotonic() + 120
    killed_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        manifest = wt._load_manifest(dest) if (dest / wt.MANIFEST).exists() else {}
        partials = [p for p in partial_dir.rglob("*.part")] if partial_dir.is_dir() else []
        if any(k.endswith(".safetensors") for k in manifest) and any(p.stat().st_size > 0 for p in partials):
            proc.send_signal(signal.SIGKILL)
            killed_at = manifest
            break
        time.sleep(0.005)
    proc.wait(30)
    assert killed_at is not None, "the sync finished before it could be killed: " + proc.stdout.read().decode()
    done = {k for k in wt._load_manifest(dest) if k.endswith(".safetensors")}
    in_flight = {p.name.split(".safetensors")[0] + ".safetensors" for p in partial_dir.rglob("*.part")}
    assert done and in_flight and not done & in_flight
    for key in in_flight:  # never a half-written file under its final name
        assert not (dest / key).exists()
    before = {k: ((dest / k).stat().st_ino, (dest / k).stat().st_mtime_ns) for k in done}

    report = wt.sync(b.store(), dest, log=quiet)
    assert set(report.resumed) == in_flight and all(v > 0 for v in report.resumed.values())
    assert not done & set(report.fetched)
    assert {k: ((dest / k).stat().st_ino, (dest / k).stat().st_mtime_ns) for k in done} == before
    assert report.bytes_downloaded < sum(len(v) for v in b.files.values())
    assert_holds(dest, b)


def test_a_connection_broken_mid_download_is_resumed_in_place(bucket, tmp_path):
    """A network fault between the node and the bucket (the connection reset half-way
    through a shard) costs no byte twice: the tool continues from what it has on disk."""
    proxy = CuttingProxy(bucket.s3.port, cut_after=PART + 12345)
    try:
        store = wt.S3Store(bucket.name, PREFIX, proxy.endpoint, "cn-beijing", connections=1,
                           addressing_style="path")
        lines: list[str] = []
        report = wt.sync(store, tmp_path / "tiny", log=lines.append, connections=1)
    finally:
        proxy.close()
    assert proxy.cuts == 1
    assert any("download broke" in line for line in lines), lines
    (key,) = report.resumed
    assert key.endswith(".safetensors") and 0 < report.resumed[key] < len(bucket.files[key])
    assert report.bytes_downloaded == sum(len(v) for v in bucket.files.values())  # nothing fetched twice
    assert_holds(tmp_path / "tiny", bucket)


def test_two_pods_on_one_node_download_once(bucket, tmp_path):
    dest = tmp_path / "tiny"
    procs = [subprocess.Popen(bucket.cli(dest), cwd=ROOT, env={**os.environ}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    fetched = [line.split()[1] for out in outs for line in out.splitlines() if line.startswith("fetched ")
               and "bytes)" in line]
    assert sorted(fetched) == sorted(bucket.files), outs  # every file once, by one of the two
    assert sum("already holds all" in out for out in outs) == 1
    assert_holds(dest, bucket)


def test_a_shard_missing_from_the_prefix_is_named(bucket, tmp_path):
    index = {"metadata": {}, "weight_map": {"a.weight": "shard-a.safetensors",
                                            "b.weight": "model-00007-of-00009.safetensors"}}
    bucket.put("model.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(wt.WeightsError) as info:
        wt.sync(bucket.store(), tmp_path / "tiny", log=quiet)
    msg = str(info.value)
    assert f"s3://{bucket.name}/{PREFIX}/model-00007-of-00009.safetensors" in msg
    assert "shard-a" not in msg.split("missing from the prefix")[1]
    assert not (tmp_path / "tiny" / "shard-a.safetensors").exists()  # checked before any shard is fetched


def test_an_object_gone_after_listing_is_named(bucket, tmp_path):
    store = bucket.store()
    listing = store.list()
    bucket.client.delete_object(Bucket=bucket.name, Key=f"{PREFIX}/shard-a.safetensors")
    store.list = lambda: listing  # the listing a pod took just before the object was deleted
    with pytest.raises(wt.WeightsError, match=rf"s3://{bucket.name}/{PREFIX}/shard-a.safetensors .*not found"):
        wt.sync(store, tmp_path / "tiny", log=quiet)


def test_a_missing_bucket_or_empty_prefix_is_named(s3, creds, tmp_path, capsys):
    empty = f"w-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(empty)
    cmd = ["sync", "--bucket", empty, "--prefix", PREFIX, "--endpoint", s3.endpoint, "--region", "cn-beijing",
           "--addressing-style", "path", "--dest", str(tmp_path / "tiny")]
    assert wt.main(cmd) == 1
    err = capsys.readouterr().err
    assert f"s3://{empty}/{PREFIX}/" in err and "is empty" in err and "Traceback" not in err
    cmd[cmd.index(empty)] = "no-such-bucket"
    assert wt.main(cmd) == 1
    err = capsys.readouterr().err
    assert "bucket 'no-such-bucket' does not exist" in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="handing a directory to another uid and dropping capabilities needs root and setpriv")
def test_a_cache_dir_owned_by_another_uid_is_refused_with_the_fix(bucket, tmp_path):
    """What the kubelet's DirectoryOrCreate made on a fresh node: a directory owned by another
    uid (root) with mode 0755, which the pod's uid cannot write. The pod mounts the node cache
    and creates its own model directory in it; when the cache itself belongs to someone
    else, the tool names the owner and the fix instead of dying on a PermissionError.
    Here the tool runs as root without capabilities (so file modes apply to it) and the
    foreign owner is uid 1000: the same check, the roles swapped."""
    mine = tmp_path / "mine"
    mine.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, 1000, 1000)
    no_caps = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"]
    ok = subprocess.run(no_caps + bucket.cli(mine / "tiny"), cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert (mine / "tiny" / "config.json").is_file()
    bad = subprocess.run(no_caps + bucket.cli(foreign / "tiny"), cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"cannot write {foreign / 'tiny'} as uid 0" in bad.stderr, bad.stderr
    assert "owned by uid 1000 with mode 755" in bad.stderr and "Traceback" not in bad.stderr
    missing = subprocess.run(bucket.cli(tmp_path / "not-mounted" / "tiny"), cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 1 and "is not mounted" in missing.stderr


def test_metadata_only_skips_weights(bucket, tmp_path):
    report = wt.sync(bucket.store(), tmp_path / "meta", log=quiet, metadata_only=True)
    assert "config.json" in report.fetched
    assert not any(k.endswith(".safetensors") for k in report.fetched)


def test_tokenizer_and_config_agree_on_the_tiny_model(tiny_deepseek_v2):
    assert wt.check_tokenizer(tiny_deepseek_v2) == []


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    return dst


def test_vocab_smaller_than_tokenizer_is_refused(tiny_deepseek_v2, tmp_path):
    model = _copy(tiny_deepseek_v2, tmp_path / "bad-vocab")
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = 16
    (model / "config.json").write_text(json.dumps(cfg))
    problems = wt.check_tokenizer(model)
    assert any("config.json vocab_size is 16" in p for p in problems), problems


def test_eos_mismatch_is_refused(tiny_deepseek_v2, tmp_path):
    model = _copy(tiny_deepseek_v2, tmp_path / "bad-eos")
    cfg = json.loads((model / "config.json").read_text())
    cfg["eos_token_id"] = 3 if cfg.get("eos_token_id") != 3 else 1
    (model / "config.json").write_text(json.dumps(cfg))
    problems = wt.check_tokenizer(model)
    assert any(p.startswith("eos_token_id") for p in problems), problems


def test_cli_exits_non_zero_with_a_message(tiny_deepseek_v2, tmp_path, capsys):
    model = _copy(tiny_deepseek_v2, tmp_path / "bad")
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = 16
    (model / "config.json").write_text(json.dumps(cfg))
    assert wt.main(["verify", str(model)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: tokenizer and config.json disagree") and "Traceback" not in err
    assert wt.main(["verify", str(tiny_deepseek_v2)]) == 0


def test_cli_sync_from_a_directory(tiny_deepseek_v2, tmp_path):
    dest = tmp_path / "cache"
    assert wt.main(["sync", "--source-dir", str(tiny_deepseek_v2), "--dest", str(dest), "--verify"]) == 0
    assert (dest / "config.json").read_bytes() == (tiny_deepseek_v2 / "config.json").read_bytes()


def test_the_tool_runs_in_the_serving_image_without_the_project_dependencies(bucket, tmp_path):
    """The image installs this package with --no-deps plus boto3 and the TOS SDK: the tool
    may only need the standard library and those (imported lazily), never pulumi or pydantic."""
    code = ("import sys\n"
            "for m in ('pulumi', 'pydantic', 'pulumi_kubernetes', 'pulumi_volcengine', 'stacks', 'workloads', "
            "'capacity', 'yaml'):\n"
            "    sys.modules[m] = None\n"
            "import runtime.weights as wt\n"
            "raise SystemExit(wt.main(sys.argv[1:]))\n")
    dockerfile = (ROOT / "runtime" / "Dockerfile").read_text()
    assert "COPY runtime ./runtime" in dockerfile and "-r runtime/requirements.txt" in dockerfile
    requirements = (ROOT / "runtime" / "requirements.txt").read_text()
    assert "boto3==" in requirements and "tos==" in requirements
    dest = tmp_path / "tiny"
    out = subprocess.run([sys.executable, "-c", code, *bucket.cli(dest)[3:]], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (dest / "config.json").read_bytes() == bucket.files["config.json"]
