"""Time planning every catalog model on every catalog GPU.

    python benchmarks/bench_planner.py            # prints and writes benchmarks/results/planner.json

The requirement is under one second for the whole sweep; the figure recorded is
the best of several repeats (the sweep is deterministic, so the minimum is the
least noisy estimate), with the median alongside.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capacity.catalog import GPUS, MODELS  # noqa: E402
from capacity.planner import plan  # noqa: E402

REPEATS = 7
BUDGET_S = 1.0


def sweep() -> tuple[float, int, int]:
    t0 = time.perf_counter()
    n = fits = 0
    for model in MODELS.values():
        for gpu in GPUS.values():
            p = plan(model, gpu)
            n += 1
            fits += p.fits
    return time.perf_counter() - t0, n, fits


def main() -> int:
    sweep()  # warm imports and caches
    times = []
    for _ in range(REPEATS):
        elapsed, n, fits = sweep()
        times.append(elapsed)
    result = {
        "benchmark": "plan() for every catalog model x every catalog GPU (default settings)",
        "plans_per_sweep": n,
        "plans_that_fit": fits,
        "models": len(MODELS),
        "gpus": len(GPUS),
        "repeats": REPEATS,
        "best_seconds": round(min(times), 6),
        "median_seconds": round(statistics.median(times), 6),
        "per_plan_ms": round(1000 * min(times) / n, 4),
        "budget_seconds": BUDGET_S,
        "within_budget": min(times) < BUDGET_S,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": __import__("os").cpu_count(),
    }
    out = ROOT / "benchmarks" / "results" / "planner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["within_budget"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
