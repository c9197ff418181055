"""Cache-aware routing keeps a conversation's prefix cache: a small run of
benchmarks/bench_routing.py (two real CPU vLLM replicas of a tiny qwen2 with prefix caching,
vllm-router cache_aware, then round_robin, over the same multi-turn shared-prefix chats; hit
rates from vLLM's vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from router_harness import router_binary

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def test_cache_aware_routing_hits_the_prefix_cache_more_than_round_robin(tmp_path, vllm_server):
    missing = [n for n, ok in (("vllm", importlib.util.find_spec("vllm") is not None),
                               ("vllm-router", router_binary() is not None)) if not ok]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} not installed (pip install -e '.[engine]')")
        pytest.skip(f"{', '.join(missing)} not installed (pip install -e '.[engine]')")
    from benchmarks import bench_routing

    # the session's one-server pool (tests/conftest.py) may hold the machine-wide lock from
    # this very process: stop its server, or the benchmark's lock waits on itself
    vllm_server.__self__.stop_all()

    result = bench_routing.compare(conversations=3, turns=4, work_dir=str(tmp_path))
    ca, rr = result["runs"]["cache_aware"], result["runs"]["round_robin"]
    assert ca["requests"] == rr["requests"] == 12
    assert ca["prefix_cache_query_tokens"] > 0 and rr["prefix_cache_query_tokens"] > 0
    assert ca["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"], result
    # round robin spread the conversations over both replicas
    assert min(rr["query_tokens_per_replica"]) > 0, rr
