"""Cache-aware routing against round robin, over two real CPU vLLM replicas.

    python benchmarks/bench_routing.py [--conversations 5 --turns 4] [--out FILE]

MEASURED on this machine, loopback only: two CPU vLLM servers of a tiny random-weight qwen2
(tests/vllm_harness.py; GQA, so vLLM keeps prefix caching on; the CPU build turns it off for
MLA models without AMX), each with 1 GiB of KV and its own OpenMP core, behind vLLM Router
(PyPI ``vllm-router``) with ``--policy cache_aware`` and then ``--policy round_robin``.

Workload: multi-turn chats sharing one system prompt. Each round sends every conversation's
next turn (its whole history: system prompt, earlier turns and fixed replies, then the new
question) as a streamed completion, one request at a time. The number of conversations is
odd, so round robin sends a conversation to the other replica on the next round (with an
even number it would keep every conversation on one replica by accident).

Read from the replicas: ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``
(tokens), summed over both, the hit rate of each policy's run; the prefix caches are emptied
between runs (``POST /reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``). Measured
at the client: time to first token (first streamed chunk with text), p50/p90/max. The
machine's load average (``os.getloadavg``, what ``uptime`` prints) before and after each run
is recorded: this 2-core machine is shared, and TTFT moves with its load.

Writes benchmarks/results/routing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from router_harness import VllmRouter, machine_server_lock, metric_sum, metrics_text, running  # noqa: E402
from vllm_harness import VllmServer, make_tiny_model  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "routing.json"
POLICIES = ("cache_aware", "round_robin")
SERVED = "tiny-qwen2"
SYSTEM = ("system: the kv cache holds keys and values for every token. deepseek models are served with "
          "vllm on volcengine. tensor parallel and pipeline parallel split the model across gpus.\n")
_WORDS = "the quick brown fox jumps over the lazy dog hello world this is a tiny test model".split()


def conversation_turn(conv: int, turn: int) -> str:
    """The prompt of conversation `conv` at `turn` (0-based): its whole history so far."""
    parts = [SYSTEM, f"user {conv}: " + " ".join(_WORDS[(conv + i) % len(_WORDS)] for i in range(12)) + "\n"]
    for t in range(turn):
        parts.append(f"assistant: " + " ".join(_WORDS[(conv * 3 + t + i) % len(_WORDS)] for i in range(10)) + "\n")
        parts.append(f"user {conv}: " + " ".join(_WORDS[(conv * 5 + t * 7 + i) % len(_WORDS)] for i in range(8))
                     + "\n")
    return "".join(parts) + "assistant:"


def stream_ttft(url: str, prompt: str, max_tokens: int, timeout: float) -> float:
    """Seconds to the first streamed chunk with text; reads the stream to [DONE]."""
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft = None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            if ttft is None and any(c.get("text") for c in json.loads(data).get("choices", [])):
                ttft = time.monotonic() - t0
    if ttft is None:
        raise RuntimeError(f"no text streamed from {url}")
    return ttft


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))]


def cache_counters(replicas: list[VllmServer]) -> tuple[float, float]:
    hits = queries = 0.0
    for r in replicas:
        text = metrics_text(r.url)
        hits += metric_sum(text, "vllm:prefix_cache_hits")
        queries += metric_sum(text, "vllm:prefix_cache_queries")
    return hits, queries


def reset_prefix_caches(replicas: list[VllmServer]) -> None:
    for r in replicas:
        req = urllib.request.Request(r.url + "/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200


def run_policy(policy: str, replicas: list[VllmServer], *, conversations: int, turns: int, max_tokens: int,
               log_dir: str, timeout: float = 300) -> dict:
    reset_prefix_caches(replicas)
    load_before = os.getloadavg()
    hits0, queries0 = cache_counters(replicas)
    per_replica0 = [metric_sum(metrics_text(r.url), "vllm:prefix_cache_queries") for r in replicas]
    ttfts: list[float] = []
    with VllmRouter(["--worker-urls", *[r.url for r in replicas], "--policy", policy,
                     "--request-timeout-secs", str(int(timeout))],
                    log_path=os.path.join(log_dir, f"router-{policy}.log")) as router:
        t0 = time.monotonic()
        for turn in range(turns):
            for conv in range(conversations):
                ttfts.append(stream_ttft(router.url, conversation_turn(conv, turn), max_tokens, timeout))
        wall = time.monotonic() - t0
    hits1, queries1 = cache_counters(replicas)
    per_replica = [metric_sum(metrics_text(r.url), "vllm:prefix_cache_queries") - q0
                   for r, q0 in zip(replicas, per_replica0)]
    hits, queries = hits1 - hits0, queries1 - queries0
    return {
        "policy": policy,
        "requests": len(ttfts),
        "prefix_cache_hit_tokens": hits,
        "prefix_cache_query_tokens": queries,
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else 0.0,
        "query_tokens_per_replica": per_replica,
        "ttft_s": {"p50": round(percentile(ttfts, 50), 4), "p90": round(percentile(ttfts, 90), 4),
                   "max": round(max(ttfts), 4), "mean": round(sum(ttfts) / len(ttfts), 4)},
        "wall_s": round(wall, 2),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def replicas_for(model: Path, log_dir: str) -> list[VllmServer]:
    return [VllmServer(model, ["--served-model-name", SERVED, "--enable-prefix-caching"],
                       env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1",
                            "VLLM_CPU_OMP_THREADS_BIND": str(i)},
                       log_path=os.path.join(log_dir, f"replica-{i}.log"))
            for i in range(2)]


def compare(*, conversations: int, turns: int, max_tokens: int = 4, work_dir: str | None = None) -> dict:
    """Both policies over the same two replicas and the same workload."""
    work = work_dir or tempfile.mkdtemp(prefix="bench-routing-")
    model = make_tiny_model(work, "qwen2")
    replicas = replicas_for(model, work)
    t0 = time.monotonic()
    with machine_server_lock(), running(*replicas):
        startup = time.monotonic() - t0
        # one request each first, so neither policy's run pays the replicas' first-request cost
        for r in replicas:
            stream_ttft(r.url, "hello world", 1, 300)
        runs = {p: run_policy(p, replicas, conversations=conversations, turns=turns, max_tokens=max_tokens,
                              log_dir=work) for p in POLICIES}
    return {
        "source": "measured: benchmarks/bench_routing.py on this machine (loopback, CPU vLLM)",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "engine": "vllm-cpu 0.32.0, tiny random qwen2 (2 layers, hidden 256), prefix caching on, 1 GiB KV",
        "router": "vllm-router 0.1.17",
        "workload": {"conversations": conversations, "turns": turns, "max_tokens": max_tokens,
                     "shared_system_prompt_chars": len(SYSTEM),
                     "longest_prompt_chars": len(conversation_turn(conversations - 1, turns - 1))},
        "replicas_startup_s": round(startup, 1),
        "runs": runs,
        "hit_rate_gain": round(runs["cache_aware"]["prefix_cache_hit_rate"]
                               - runs["round_robin"]["prefix_cache_hit_rate"], 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=5, help="odd: see the module docstring")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULT)
    a = ap.parse_args(argv)
    if a.conversations % 2 == 0:
        ap.error("--conversations: expected an odd number (round robin would keep every conversation on one "
                 "replica)")
    result = compare(conversations=a.conversations, turns=a.turns, max_tokens=a.max_tokens)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    for p, r in result["runs"].items():
        print(f"{p:12s} hit rate {r['prefix_cache_hit_rate']:.3f}  TTFT p50 {r['ttft_s']['p50']:.3f}s "
              f"p90 {r['ttft_s']['p90']:.3f}s  load {r['load_average_before'][0]:.1f}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
