"""Rates the performance model (capacity/perf*) needs, measured on H200 hosts.

    python3 benchmarks/bench_gpu_comm.py --out DIR [--quick]

Two parts, each correctness first, then timing:

* intra-GPU (any host, GPU 0): the device-to-device copy rate, and bf16 and fp8
  (``torch._scaled_mm``, per-tensor scales) matrix products at the shapes of the catalog's
  models, from decode (M = 1..512 tokens) to prefill chunks (M = 2048..8192). Small
  products are timed as CUDA-graph replays over inputs rotated past the L2 (eager timing of
  us-scale ops is host-bound); each row gives the time, TFLOP/s, GB/s and the fraction of
  the measured ceilings.
* collectives (hosts with 2 or more GPUs; one process per GPU, torch.distributed over
  NCCL): all-reduce, all-gather, reduce-scatter and all-to-all at the message sizes of the
  catalog's layouts (a decode step's hidden states at batch 1-512, a prefill chunk's, an
  MoE dispatch and combine of top-k tokens), each checked against the exact result before
  it is timed. Bus bandwidth follows nccl-tests' definitions (PERFORMANCE.md there):
  all-reduce 2(n-1)/n x bytes / t, all-gather / reduce-scatter / all-to-all (n-1)/n x bytes / t.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 are forced for every process this script starts).

Writes DIR/gpu_rates.json and DIR/gpu_rates.txt (a table); with 2+ GPUs also
DIR/collectives.json and the host's `nvidia-smi topo -m` in DIR/topology.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from capacity.catalog import MODELS  # noqa: E402
from kernels.bench.harness import graph_us  # noqa: E402  (CUDA-graph replays, the kernels' races' timer)

L2_BYTES = 60e6  # H200 L2 (PyTorch reports 60 MB)
DECODE_M = (1, 8, 32, 64, 128, 256, 512)
PREFILL_M = (2048, 8192)
COMM_BATCHES = (1, 8, 32, 128, 512)  # decode tokens per rank
PREFILL_CHUNK = 8192  # tokens in a prefill chunk (vLLM's default max_num_batched_tokens)


# -- timing -------------------------------------------------------------------------------

def event_us(fn, iters=20, reps=7):
    """Median microseconds per call, `iters` back-to-back calls between two events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / iters)
    return statistics.median(ts)


def copies_for(nbytes):
    return max(1, min(16, -(-int(3 * L2_BYTES) // max(int(nbytes), 1))))


def rel_err(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


# -- intra-GPU ------------------------------------------------------------------------------

def gemm_shapes():
    """(model, name, K, N) weight shapes a forward step multiplies by, from the catalog."""
    seen, out = set(), []
    for m in MODELS.values():
        h = m.hidden_size
        shapes = []
        if m.n_routed_experts:
            shapes.append(("expert_gate_up", h, 2 * m.moe_intermediate_size))
            shapes.append(("expert_down", m.moe_intermediate_size, h))
        if m.intermediate_size:
            shapes.append(("mlp_gate_up", h, 2 * m.intermediate_size))
            shapes.append(("mlp_down", m.intermediate_size, h))
        for name, k, n in shapes:
            if (k, n) not in seen:
                seen.add((k, n))
                out.append((m.name, name, k, n))
    return out


def ceilings(dev):
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_()
    b = torch.empty_like(a)
    b.copy_(a)
    assert torch.equal(a, b), "copy check failed"
    t = event_us(lambda: b.copy_(a), iters=10)
    copy_gbs = 2 * n / t / 1e3
    del a, b
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = event_us(lambda: x @ y, iters=10)
    bf16 = 2 * 8192**3 / t / 1e6
    xs, ys = x.to(torch.float8_e4m3fn), y.t().contiguous().t().to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    t = event_us(lambda: torch._scaled_mm(xs, ys, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), iters=10)
    fp8 = 2 * 8192**3 / t / 1e6
    return {"copy_gbs": copy_gbs, "bf16_tflops": bf16, "fp8_tflops": fp8}


def gemm_row(dev, dtype, m, k, n, ceil):
    w_bytes = k * n * (1 if dtype == "fp8" else 2)
    copies = copies_for(w_bytes + m * k * 2)
    gen = torch.Generator(device=dev).manual_seed(m * 7919 + k + n)
    xs = [torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) / k**0.5 for _ in range(copies)]
    if dtype == "fp8":
        one = torch.ones((), device=dev)
        xq = [x.to(torch.float8_e4m3fn) for x in xs]
        wq = [w.to(torch.float8_e4m3fn) for w in ws]
        outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]

        def call(i):
            return lambda: outs[i].copy_(torch._scaled_mm(xq[i], wq[i].t(), scale_a=one, scale_b=one,
                                                           out_dtype=torch.bfloat16))
        ref = xq[0].double() @ wq[0].double().t()
        tol = 2e-2
    else:
        outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]

        def call(i):
            return lambda: torch.matmul(xs[i], ws[i].t(), out=outs[i])
        ref = xs[0].double() @ ws[0].double().t()
        tol = 1e-2
    calls = [call(i) for i in range(copies)]
    outs[0].fill_(float("nan"))
    calls[0]()
    torch.cuda.synchronize()
    err = rel_err(outs[0], ref)
    ok = err < tol and not torch.isnan(outs[0]).any().item()
    us = graph_us(calls) if m <= 512 else event_us(calls[0])
    flops = 2 * m * k * n
    moved = w_bytes + m * k * (1 if dtype == "fp8" else 2) + m * n * 2
    tflops = flops / us / 1e6
    gbs = moved / us / 1e3
    peak = ceil["fp8_tflops"] if dtype == "fp8" else ceil["bf16_tflops"]
    return {"dtype": dtype, "m": m, "k": k, "n": n, "rel_err": err, "ok": ok,
            "us": us, "timing": "cuda-graph" if m <= 512 else "events",
            "tflops": tflops, "gbs": gbs, "frac_compute": tflops / peak, "frac_copy": gbs / ceil["copy_gbs"],
            "roofline_us": max(flops / peak / 1e6, moved / ceil["copy_gbs"] / 1e3)}


def intra(out: Path, quick: bool):
    dev = torch.device("cuda", 0)
    ceil = ceilings(dev)
    print(f"ceilings: copy {ceil['copy_gbs']:.0f} GB/s, bf16 {ceil['bf16_tflops']:.0f} TFLOP/s, "
          f"fp8 {ceil['fp8_tflops']:.0f} TFLOP/s", flush=True)
    rows = []
    shapes = gemm_shapes()[:3] if quick else gemm_shapes()
    ms = (1, 64, 2048) if quick else DECODE_M + PREFILL_M
    for model, name, k, n in shapes:
        for dtype in ("bf16", "fp8"):
            for m in ms:
                try:
                    r = gemm_row(dev, dtype, m, k, n, ceil)
                except RuntimeError as exc:  # e.g. a shape cuBLASLt's fp8 path refuses
                    print(f"{model} {name} {dtype} M={m}: {exc}".splitlines()[0], flush=True)
                    rows.append({"dtype": dtype, "m": m, "k": k, "n": n, "model": model, "shape": name,
                                 "ok": None, "error": str(exc).splitlines()[0]})
                    continue
                r.update(model=model, shape=name)
                rows.append(r)
                print(f"{model:32s} {name:15s} {dtype:4s} M={m:5d} K={k:5d} N={n:5d} "
                      f"{'ok ' if r['ok'] else 'BAD'} err {r['rel_err']:.1e} {r['us']:9.2f} us "
                      f"{r['tflops']:7.1f} TF/s {r['gbs']:7.0f} GB/s "
                      f"{100 * max(r['frac_compute'], r['frac_copy']):5.1f}% of roofline", flush=True)
    return {"ceilings": ceil, "gemm": rows}


# -- collectives ---------------------------------------------------------------------------

def comm_sizes(world):
    """(label, op, elements per rank, dtype) at the catalog's layouts' message sizes."""
    out = []
    hs = sorted({m.hidden_size for m in MODELS.values()})
    moe = [m for m in MODELS.values() if m.n_routed_experts]
    for h in hs:
        for b in COMM_BATCHES:
            out.append((f"decode h{h} b{b}", "all_reduce", b * h, torch.bfloat16))
        out.append((f"prefill h{h} chunk{PREFILL_CHUNK}", "all_reduce", PREFILL_CHUNK * h, torch.bfloat16))
    for m in moe:
        h, k = m.hidden_size, m.num_experts_per_tok
        for b in COMM_BATCHES:
            # dispatch: every token's hidden state to each of its top-k experts (fp8 as DeepEP
            # sends), combine: the same volume back in bf16; each rank sends b*k rows in all.
            rows = -(-b * k // world) * world
            out.append((f"dispatch {m.name} b{b}", "all_to_all", rows * h, torch.float8_e4m3fn))
            out.append((f"combine {m.name} b{b}", "all_to_all", rows * h, torch.bfloat16))
        out.append((f"gather h{h} b512", "all_gather", 512 * h, torch.bfloat16))
        out.append((f"scatter h{h} b512", "reduce_scatter", 512 * h * world, torch.bfloat16))
    seen, uniq = set(), []
    for row in out:
        key = (row[1], row[2], row[3])
        if key not in seen:
            seen.add(key)
            uniq.append(row)
    return uniq


def _comm_worker(rank, world, port, results_path, quick):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    rows = []
    sizes = comm_sizes(world)
    if quick:
        sizes = sizes[::4]
    for label, op, n, dtype in sizes:
        # correctness: integers small enough to be exact in bf16
        base = torch.arange(n, device=dev, dtype=torch.float32).remainder(7)
        # NCCL has no fp8 type: an fp8 dispatch is sent as its bytes
        x = (base + rank).to(torch.uint8 if dtype == torch.float8_e4m3fn else dtype)
        elem = x.element_size()
        if op == "all_reduce":
            y = x.clone()
            dist.all_reduce(y)
            want = (base * world + sum(range(world))).to(y.dtype)
            ok = bool(torch.equal(y, want))
            buf = x.clone()
            fn = lambda: dist.all_reduce(buf)  # noqa: E731
            nbytes = n * elem
            bus = 2 * (world - 1) / world
        elif op == "all_gather":
            y = torch.empty(n * world, device=dev, dtype=x.dtype)
            dist.all_gather_into_tensor(y, x)
            want = torch.cat([(base + r).to(x.dtype) for r in range(world)])
            ok = bool(torch.equal(y, want))
            fn = lambda: dist.all_gather_into_tensor(y, x)  # noqa: E731
            nbytes = n * world * elem
            bus = (world - 1) / world
        elif op == "reduce_scatter":
            y = torch.empty(n // world, device=dev, dtype=x.dtype)
            dist.reduce_scatter_tensor(y, x)
            want = (base * world + sum(range(world))).to(x.dtype).chunk(world)[rank]
            ok = bool(torch.equal(y, want))
            fn = lambda: dist.reduce_scatter_tensor(y, x)  # noqa: E731
            nbytes = n * elem
            bus = (world - 1) / world
        else:  # all_to_all
            y = torch.empty_like(x)
            dist.all_to_all_single(y, x)
            per = n // world
            want = torch.cat([
                (torch.arange(n, device=dev, dtype=torch.float32).remainder(7) + r)
                .to(x.dtype)[rank * per:(rank + 1) * per] for r in range(world)])
            ok = bool(torch.equal(y, want))
            fn = lambda: dist.all_to_all_single(y, x)  # noqa: E731
            nbytes = n * elem
            bus = (world - 1) / world
        oks = torch.tensor([1 if ok else 0], device=dev)
        dist.all_reduce(oks)
        dist.barrier()
        us = event_us(fn, iters=20 if nbytes < (64 << 20) else 5)
        t = torch.tensor([us], device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        us = float(t.item())
        if rank == 0:
            rows.append({"label": label, "op": op, "world": world, "bytes": nbytes, "dtype": str(dtype),
                         "ok": int(oks.item()) == world, "us": us, "algbw_gbs": nbytes / us / 1e3,
                         "busbw_gbs": nbytes / us / 1e3 * bus})
            print(f"{label:34s} {op:14s} {nbytes / 1e6:10.3f} MB {'ok ' if rows[-1]['ok'] else 'BAD'} "
                  f"{us:9.2f} us  bus {rows[-1]['busbw_gbs']:7.1f} GB/s", flush=True)
    if rank == 0:
        Path(results_path).write_text(json.dumps(rows, indent=1))
    dist.destroy_process_group()


def collectives(out: Path, world: int, quick: bool):
    import torch.multiprocessing as mp
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    except Exception as exc:  # pragma: no cover - diagnostic only
        topo = f"nvidia-smi topo -m failed: {exc}"
    (out / "topology.txt").write_text(topo)
    print(topo, flush=True)
    path = out / "collectives.json"
    mp.spawn(_comm_worker, args=(world, 29500 + os.getpid() % 1000, str(path), quick), nprocs=world, join=True)
    return json.loads(path.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--quick", action="store_true", help="a few shapes and sizes only")
    ap.add_argument("--skip-intra", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    world = torch.cuda.device_count()
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0), "gpus": world,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if world else None,
            "host": platform.node(), "nvls": os.environ["NCCL_NVLS_ENABLE"]}
    print(json.dumps(meta), flush=True)
    result = {"meta": meta}
    if not args.skip_intra:
        result["intra"] = intra(args.out, args.quick)
        (args.out / "gpu_rates.json").write_text(json.dumps(result, indent=1))
    if world >= 2:
        result["collectives"] = collectives(args.out, world, args.quick)
    else:
        result["collectives"] = None
        print("collectives: 1 GPU on this host; all-reduce / all-to-all need 2 or more", flush=True)
    (args.out / "gpu_rates.json").write_text(json.dumps(result, indent=1))
    bad = [r for r in result.get("intra", {}).get("gemm", []) if r["ok"] is False]
    bad += [r for r in (result["collectives"] or []) if not r["ok"]]
    with open(args.out / "gpu_rates.txt", "w") as f:
        if "intra" in result:
            c = result["intra"]["ceilings"]
            f.write(f"ceilings copy {c['copy_gbs']:.0f} GB/s bf16 {c['bf16_tflops']:.0f} fp8 {c['fp8_tflops']:.0f} TFLOP/s\n")
            for r in result["intra"]["gemm"]:
                if r["ok"] is None:
                    f.write(f"{r['model']:32s} {r['shape']:15s} {r['dtype']:4s} M={r['m']:5d} refused: {r['error']}\n")
                    continue
                f.write(f"{r['model']:32s} {r['shape']:15s} {r['dtype']:4s} M={r['m']:5d} {r['us']:9.2f} us "
                        f"{r['tflops']:7.1f} TF/s {r['gbs']:7.0f} GB/s\n")
        for r in result["collectives"] or []:
            f.write(f"{r['label']:34s} {r['op']:14s} {r['bytes']:12d} B {r['us']:9.2f} us {r['busbw_gbs']:7.1f} GB/s\n")
    if bad:
        print(f"{len(bad)} correctness failures", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
