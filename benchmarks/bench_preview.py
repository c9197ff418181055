"""How long `dsvolc preview` takes per stack, end to end in a fresh process (settings,
program under the mock engine, policy pack), as a user runs it.

    python benchmarks/bench_preview.py [--runs N]

Writes benchmarks/results/preview.json. The goal is well under 5 s for prod on a 2-core
machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    results = {}
    for stack in ("dev", "staging", "prod"):
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "dsvolc.cli", "preview", stack, "--quiet"],
                           cwd=ROOT, check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
        results[stack] = {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                          "max_s": round(max(times), 3), "runs": args.runs}
        print(f"{stack:8s} median {results[stack]['median_s']:.2f} s  (min {results[stack]['min_s']:.2f}, "
              f"max {results[stack]['max_s']:.2f}, {args.runs} runs)")
    out = {"date": date.today().isoformat(), "python": platform.python_version(),
           "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores", "stacks": results}
    (ROOT / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "benchmarks" / "results" / "preview.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
