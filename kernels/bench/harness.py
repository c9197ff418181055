"""What every family's benchmark shares: the device, the timers, the ceilings, the run's
log / results.json / table.md, and the command line's common options.

Launch-bound calls are timed as CUDA-graph replays of 20 back-to-back calls rotating over
enough input copies (`copies_for`) that nothing is served from the 60 MB L2 (`graph_us`);
the rest as graph replays with a 120 MB scrub of the L2 before each call, the scrub's own
graph time subtracted (`graph_cold_us`); medians. Every committed timing is a graph replay;
`bench_us` (triton's eager do_bench) remains only for columns labelled eager. A family
times through `TIMER["graph"]` / `TIMER["bench"]`, which `use_cpu`
(--smoke) swaps for one wall-clock call under the Triton interpreter. Families read the
device as `harness.DEV` at call time, since `use_cpu` rebinds it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import time

import torch
import triton
from triton.testing import do_bench

DEV = "cuda"
L2_BYTES = 60e6


def graph_us(calls, inner=20, reps=25):
    """Median microseconds per call over graph replays of `inner` calls, rotating `calls`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(inner):
            calls[i % len(calls)]()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / inner)
    del g
    return statistics.median(ts)


def bench_us(fn):
    """Eager do_bench median (L2 flushed). Host-bound for us-scale calls: tables label it eager."""
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


_SCRUB = {}


def _scrub():
    """Overwrite twice the L2 (a 120 MB memset), so the next call reads its inputs from HBM."""
    buf = _SCRUB.get("buf")
    if buf is None:
        buf = _SCRUB["buf"] = torch.empty(int(2 * L2_BYTES), dtype=torch.uint8, device=DEV)
    buf.zero_()


def graph_cold_us(fn, inner=10, reps=15):
    """Median microseconds of `fn` replayed in a CUDA graph with an L2 scrub before every
    call: the graph of (scrub, call) x inner minus the graph of scrubs alone. For calls
    whose inputs cannot be rotated past the L2; no host launch time is counted."""
    try:
        both = graph_us([lambda: (_scrub(), fn())], inner=inner, reps=reps)
    except Exception as ex:  # noqa: BLE001  (a call that cannot be captured is timed eagerly, and said so)
        torch.cuda.synchronize()
        EAGER_FALLBACKS.append(f"{getattr(fn, '__name__', 'call')}: {type(ex).__name__}: {str(ex)[:120]}")
        return bench_us(fn)
    alone = graph_us([_scrub], inner=inner, reps=reps)
    return max(both - alone, 0.0)


EAGER_FALLBACKS: list[str] = []  # calls that could not be captured in a graph (the run's log lists them)


def copies_for(nbytes):
    """Input copies to rotate over so that a graph of calls reads ~3x the L2 (1 to 16)."""
    return max(1, min(16, math.ceil(3 * L2_BYTES / max(nbytes, 1))))


def ceilings():
    """Device copy GB/s (1 GiB, read + write) and bf16 8192^3 matmul TFLOP/s."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    b = torch.empty_like(a)
    t = bench_us(lambda: b.copy_(a))
    copy_gbs = 2 * n / t / 1e3
    del a, b
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    t = bench_us(lambda: x @ y)
    mm_tflops = 2 * 8192**3 / t / 1e6
    return copy_gbs, mm_tflops


def fp8_mm_ceiling():
    """fp8 e4m3 8192^3 through torch._scaled_mm (per-tensor scales), TFLOP/s; None if absent."""
    try:
        x = torch.randn(8192, 8192, device=DEV).to(torch.float8_e4m3fn)
        y = torch.randn(8192, 8192, device=DEV).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=DEV)
        t = bench_us(lambda: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        return 2 * 8192**3 / t / 1e6
    except Exception as ex:  # noqa: BLE001 - reported, not fatal
        print(f"fp8 matmul ceiling not measured: {type(ex).__name__}: {ex}")
        return None


def fp8_ceiling(log):
    """FP8 tensor-core ceiling: torch._scaled_mm (cuBLASLt) on 8192^3 random e4m3 with
    per-tensor scales, with and without fast accumulation; the larger is the ceiling."""
    n = 8192
    a = (torch.randn(n, n, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(n, n, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    one = torch.ones((), device=DEV)
    res = {}
    for fast in (False, True):
        t = bench_us(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                              use_fast_accum=fast))
        res["fast_accum" if fast else "plain"] = 2 * n**3 / t / 1e6
    log(f"fp8 ceiling (_scaled_mm 8192^3 per-tensor): {json.dumps({k: round(v) for k, v in res.items()})} TFLOP/s")
    return max(res.values()), res


def dedupe(c):
    """Named configs with duplicates dropped (the first name of a config stays; "default" always)."""
    seen, out = set(), {}
    for name, cfg in c.items():
        key = tuple(sorted(cfg.items()))
        if key not in seen or name == "default":
            seen.add(key)
            out[name] = cfg
    return out


def _smoke_timer(calls):
    t = time.perf_counter()
    calls[0]()
    return (time.perf_counter() - t) * 1e6


# "bench": calls whose inputs do not rotate; timed cold (L2 scrubbed) in a graph, like "graph"
TIMER = {"graph": lambda calls: graph_us(calls), "bench": lambda calls: graph_cold_us(calls[0])}
DEADLINE = {"t": float("inf")}  # wall-clock seconds after which sweeps stop (partial JSON stays)


def use_cpu():
    """--smoke: tensors on the CPU, each timer one wall-clock call (nothing real is timed)."""
    global DEV
    assert os.environ.get("TRITON_INTERPRET") == "1", "--smoke needs TRITON_INTERPRET=1"
    DEV = "cpu"
    TIMER["graph"] = TIMER["bench"] = _smoke_timer


def smoke_meta(**extra):
    return dict(gpu="cpu", torch=torch.__version__, triton=triton.__version__, date="smoke", copy_gbs=4000.0,
                mm_tflops=700.0, **extra)


class Run:
    """One GPU run writing to `out`: log.txt (appended), results.json (rewritten by `dump`
    after every shape), table.md (by `finish`). Measures the ceilings first."""

    def __init__(self, out):
        os.makedirs(out, exist_ok=True)
        self.out = out
        self._logf = open(os.path.join(out, "log.txt"), "a")
        self.t_start = time.time()
        torch.manual_seed(0)
        self.copy_gbs, self.mm_tflops = ceilings()
        self.meta = dict(
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            gpu=torch.cuda.get_device_name(0),
            sms=torch.cuda.get_device_properties(0).multi_processor_count,
            torch=torch.__version__,
            triton=triton.__version__,
            copy_gbs=self.copy_gbs,
            mm_tflops=self.mm_tflops,
        )
        self.log(f"ceilings: copy {self.copy_gbs:.0f} GB/s, bf16 matmul {self.mm_tflops:.0f} TFLOP/s; {self.meta}")
        self.res = dict(meta=self.meta)

    def log(self, s):
        print(s, flush=True)
        self._logf.write(s + "\n")
        self._logf.flush()

    def dump(self):
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump(self.res, f, indent=1)

    def finish(self, ok, table):
        """Record the verdict, write results.json and table.md, print the table; exit status."""
        self.res["correct"] = bool(ok)
        self.res["eager_fallbacks"] = list(EAGER_FALLBACKS)
        for e in EAGER_FALLBACKS:
            self.log(f"timed eagerly (not capturable in a CUDA graph): {e}")
        self.dump()
        with open(os.path.join(self.out, "table.md"), "w") as f:
            f.write(table + "\n")
        print(table)
        return 0 if ok else 1


def parser(only, only_help=None):
    """The options every family shares; a family adds its own with its `add_args(ap)`."""
    ap = argparse.ArgumentParser(prog="python -m kernels.bench.bench_kernels")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", action="store_true", help="also time candidate block configs")
    ap.add_argument("--only", choices=list(only), default=None,
                    help=only_help)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU run under TRITON_INTERPRET=1 on tiny shapes: exercises the script, times nothing real")
    return ap


def header(meta):
    """The first line of every table, without its end: the run's machine and ceilings."""
    return (f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
            f"measured ceilings: copy {meta['copy_gbs']:.0f} GB/s, bf16 matmul {meta['mm_tflops']:.0f} TFLOP/s")
