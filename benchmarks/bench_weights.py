"""Throughput of the weights sync (`runtime.weights sync`) on a multi-GiB synthetic
checkpoint served by a real S3 server process on localhost (moto, the tests' server).

    python benchmarks/bench_weights.py [--gib 4] [--shards 8] [--connections 1 4 8]

Uploads `--shards` safetensors-named shards of random bytes as multipart objects (64 MiB
parts, so every shard is checked against a multipart ETag), then times, in a fresh
process each, as the init container runs it:

* a cold sync into an empty directory, per connection count;
* a warm sync (every file already verified: stat checks only, what a pod restart costs);
* a deep verify (every file hashed again against its ETag: the CPU cost of verification).

Writes benchmarks/results/weights_sync.json. On localhost the server is the bottleneck
(one Python process serving every connection), so the figures bound the tool's own
overhead (hashing, writing, manifest) from below; on a GPU node the NIC and the disk are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from s3_server import S3Server, upload_multipart  # noqa: E402

MiB = 1024 * 1024
PART = 64 * MiB
BUCKET = "bench-weights"
PREFIX = "models/synthetic"


def _shard(i: int, size: int) -> bytes:
    return os.urandom(size) if i % 2 else hashlib.sha256(str(i).encode()).digest() * (size // 32)


def _run(server: S3Server, dest: Path, *extra: str) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "runtime.weights", "sync", "--bucket", BUCKET, "--prefix", PREFIX,
           "--endpoint", server.endpoint, "--region", "cn-beijing", "--addressing-style", "path",
           "--dest", str(dest), *extra]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **server.env()}, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)
    return elapsed, out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0, help="checkpoint size")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    work = Path(tempfile.mkdtemp(prefix="bench-weights-"))
    server = S3Server(work)
    try:
        client = server.create_bucket(BUCKET)
        shard_bytes = int(args.gib * 1024 * MiB) // args.shards
        total = 0
        t0 = time.perf_counter()
        for i in range(args.shards):
            data = _shard(i, shard_bytes)
            upload_multipart(client, BUCKET, f"{PREFIX}/model-{i + 1:05d}-of-{args.shards:05d}.safetensors", data, PART)
            total += len(data)
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/config.json", Body=b'{"model_type": "synthetic"}')
        print(f"uploaded {total / MiB:,.0f} MiB in {args.shards} shards ({time.perf_counter() - t0:.0f} s)")

        cold = {}
        for n in args.connections:
            dest = work / f"cache-{n}" / "synthetic"
            dest.parent.mkdir()
            elapsed, summary = _run(server, dest, "--connections", str(n))
            cold[str(n)] = {"seconds": round(elapsed, 2), "mib_per_s": round(total / MiB / elapsed, 1)}
            print(f"cold sync, {n} connection(s): {elapsed:.1f} s, {total / MiB / elapsed:,.0f} MiB/s  [{summary}]")
            if n != args.connections[-1]:
                shutil.rmtree(dest.parent)
        warm_s, _ = _run(server, dest)
        print(f"warm sync (all verified): {warm_s:.2f} s")
        deep_s, _ = _run(server, dest, "--deep-verify", "--connections", str(args.connections[-1]))
        print(f"deep verify: {deep_s:.1f} s, {total / MiB / deep_s:,.0f} MiB/s")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "date": date.today().isoformat(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        # the machine is shared: its load during the run bounds what the figures mean
        "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
        "server": "moto[server] 5.2.5 on 127.0.0.1 (one process)",
        "checkpoint": {"bytes": total, "shards": args.shards, "part_bytes": PART, "etag": "multipart"},
        "cold_sync_by_connections": cold,
        "warm_sync_seconds": round(warm_s, 2),
        "deep_verify": {"seconds": round(deep_s, 2), "mib_per_s": round(total / MiB / deep_s, 1)},
    }
    out = ROOT / "benchmarks" / "results" / "weights_sync.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
