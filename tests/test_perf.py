"""The performance model's physics and the sizing arithmetic (capacity/perf.py, capacity/sizing.py)."""

from __future__ import annotations

import math

import pytest
import yaml

from capacity.catalog import GPUS, MODELS, get_gpu, get_model
from capacity.perf import Layout, PerfDataError, decode_itl, estimate, gpu_perf, load_hardware, prefill_step
from capacity.planner import PlanError, plan, stage_weight_bytes
from capacity.sizing import PRICING_FILE, Workload, cost, load_pricing, size_for_load

HW = load_hardware()


def _fitting(model: str, gpu: str):
    p = plan(get_model(model), get_gpu(gpu), gpus_per_node=8)
    return p if p.fits else None


CASES = [(m, g) for m in sorted(MODELS) for g in sorted(GPUS) if _fitting(m, g)]


@pytest.mark.parametrize("model,gpu", CASES)
def test_decode_never_beats_the_physical_limits(model, gpu):
    """Property over the catalog: decode tok/s per GPU stays below (a) the model's own
    100%-of-datasheet bound, (b) the bandwidth bound of reading the KV cache it must read
    (and, for dense models, every weight), (c) the compute bound of 2 x active params per token."""
    m, p = get_model(model), _fitting(model, gpu)
    g = gpu_perf(gpu, HW)
    lay = Layout.from_plan(p, rdma_gb_s=50.0)
    kv_per_token = p.kv_bytes_per_token_per_gpu
    for c in sorted({1, 8, 64, max(1, p.max_num_seqs * p.data_parallel_size)}):
        perf = estimate(m, g, lay, concurrency=c, input_tokens=1024, output_tokens=512,
                        quantization=p.quantization, kv_cache_dtype=p.kv_cache_dtype, hw=HW)
        rate = perf.decode_tokens_per_s_per_gpu
        assert 0 < rate <= perf.physical_bound_tokens_per_s_per_gpu
        per_gpu_seqs = c / p.data_parallel_size / lay.pp
        step = lay.pp * (per_gpu_seqs * 1280 * kv_per_token) / (g.hbm_gb_s * 1e9)
        if not m.is_moe:
            step = lay.pp * (max(stage_weight_bytes(m, p.quantization, lay.tp, lay.pp))
                             + per_gpu_seqs * 1280 * kv_per_token) / (g.hbm_gb_s * 1e9)
        assert rate <= c * perf.tokens_per_step / step / lay.gpus * 1.0001
        active = m.param_count if not m.is_moe else 37e9 if m.architecture == "deepseek_v3" else m.param_count / 8
        peak = (g.fp8_tflops if p.quantization == "fp8" and g.fp8_tflops else g.bf16_tflops) * 1e12
        if m.architecture == "deepseek_v3":
            assert rate * 2 * active <= peak * 1.0001


def test_itl_grows_and_throughput_per_gpu_saturates_with_concurrency():
    m, g = get_model("deepseek-r1-distill-qwen-7b"), gpu_perf("H100")
    itls, rates = [], []
    for c in (1, 4, 16, 64, 256):
        itl, _ = decode_itl(m, g, Layout(), concurrency=c, context=2048)
        itls.append(itl)
        rates.append(c / itl)
    assert itls == sorted(itls) and rates == sorted(rates)
    assert rates[1] / rates[0] > 3.0  # memory-bound: four sequences nearly four times the tokens
    assert rates[-1] / rates[-2] < 3.0  # the KV read and compute catch up


def test_more_bandwidth_decodes_faster_and_more_flops_prefill_faster():
    m = get_model("deepseek-r1-distill-llama-8b")
    d = {gpu: decode_itl(m, gpu_perf(gpu), Layout(), concurrency=1, context=1024)[0] for gpu in ("H100", "H200", "H20")}
    assert d["H200"] < d["H20"] < d["H100"]  # 4.8 > 4.0 > 3.35 TB/s
    pf = {gpu: prefill_step(m, gpu_perf(gpu), Layout(), tokens=8192, seq=2048).t_step for gpu in ("H100", "H20")}
    assert pf["H100"] * 4 < pf["H20"]  # 989 vs 148 dense bf16 TFLOP/s


def test_tensor_parallel_all_reduce_costs_more_over_pcie_than_nvlink():
    m = get_model("deepseek-r1-distill-qwen-32b")
    pcie = prefill_step(m, gpu_perf("L20"), Layout(tp=4), tokens=8192, seq=2048)
    nvl = prefill_step(m, gpu_perf("H20"), Layout(tp=4), tokens=8192, seq=2048)
    assert pcie.t_all_reduce > 5 * nvl.t_all_reduce
    assert Layout(tp=1).tp == 1 and prefill_step(m, gpu_perf("L20"), Layout(), tokens=8192, seq=2048).t_all_reduce == 0


def test_expert_all_to_all_across_nodes_needs_rdma_and_scales_with_it():
    m = get_model("deepseek-r1")
    slow = decode_itl(m, gpu_perf("H20"), Layout(dp=16, ep=16, rdma_gb_s=12.5), concurrency=1024, context=4096)[1]
    fast = decode_itl(m, gpu_perf("H20"), Layout(dp=16, ep=16, rdma_gb_s=50), concurrency=1024, context=4096)[1]
    assert slow.t_all_to_all > 3 * fast.t_all_to_all
    with pytest.raises(PlanError, match="needs RDMA"):
        decode_itl(m, gpu_perf("H20"), Layout(dp=16, ep=16), concurrency=1024, context=4096)


def test_mtp_gains_tokens_per_step_and_lowers_itl_at_small_batch():
    m = get_model("deepseek-r1")
    base = estimate(m, gpu_perf("H200"), Layout(dp=8, ep=8), concurrency=8, input_tokens=1024, output_tokens=512)
    mtp = estimate(m, gpu_perf("H200"), Layout(dp=8, ep=8, mtp_tokens=1), concurrency=8, input_tokens=1024,
                   output_tokens=512)
    assert mtp.tokens_per_step == pytest.approx(1 + HW.efficiency["mtp_acceptance"].value)
    assert mtp.decode_itl_s < base.decode_itl_s


def test_only_touched_experts_are_read_at_small_batch():
    m = get_model("deepseek-r1")
    one = decode_itl(m, gpu_perf("H200"), Layout(dp=8, ep=8), concurrency=1, context=1024)[1]
    many = decode_itl(m, gpu_perf("H200"), Layout(dp=8, ep=8), concurrency=2048, context=1024)[1]
    assert one.weight_bytes < 0.5 * many.weight_bytes


def test_bad_layout_and_workload_inputs_name_the_field():
    with pytest.raises(PlanError, match="tp: expected a positive integer"):
        Layout(tp=0)
    with pytest.raises(PlanError, match="concurrency"):
        estimate(get_model("deepseek-r1-distill-qwen-7b"), gpu_perf("A10"), Layout(), concurrency=0,
                 input_tokens=10, output_tokens=10)
    with pytest.raises(PlanError, match="ttft_slo_s"):
        Workload(ttft_slo_s=-1)
    with pytest.raises(PlanError, match="no performance figures"):
        gpu_perf("B200")


def _sized(rps=10.0, ttft=None, itl=None):
    m = get_model("deepseek-r1-distill-qwen-7b")
    p = plan(m, get_gpu("L20"), gpus_per_node=1, context=8192)
    w = Workload(1024, 256, target_rps=rps, ttft_slo_s=ttft, itl_slo_s=itl)
    return m, p, w, size_for_load(m, gpu_perf("L20"), p, Layout.from_plan(p), w)


def test_replicas_cover_the_target_rate_at_the_slo():
    m, p, w, cap = _sized(rps=10.0, itl=0.05)
    assert cap.feasible and cap.itl_s <= 0.05
    assert cap.replicas == math.ceil(10.0 / cap.requests_per_s_per_replica)
    assert cap.gpus == cap.replicas * p.total_gpus and cap.nodes == cap.replicas * p.nodes
    # a tighter ITL admits fewer sequences per replica, so it needs more replicas
    tighter = _sized(rps=10.0, itl=0.03)[3]
    assert tighter.concurrency_per_replica < cap.concurrency_per_replica and tighter.replicas > cap.replicas
    d = cap.disaggregated
    assert d["feasible"] and d["gpus"] == (d["prefill_replicas"] + d["decode_replicas"]) * p.total_gpus


def test_an_unreachable_slo_is_reported_with_its_numbers():
    *_, cap = _sized(itl=0.001)
    assert not cap.feasible and cap.replicas == 0
    assert "not even one sequence meets the SLOs" in cap.reasons[0] and "ITL" in cap.reasons[0]


def test_cost_needs_a_price_and_says_which_it_used(tmp_path):
    m, p, w, cap = _sized(rps=10.0, itl=0.05)
    assert load_pricing()[1] == {}  # no invented VolcEngine prices
    none = cost(cap, w, instance_type="ecs.gni3cl.45xlarge")
    assert not none.priced and none.per_hour is None and "--price-per-hour" in none.note
    c = cost(cap, w, instance_type=None, price_per_hour=20.0, currency="CNY")
    assert c.priced and c.pricing_source == "--price-per-hour"
    assert c.per_hour == pytest.approx(20.0 * cap.nodes)
    tokens_per_hour = 10.0 * (1024 + 256) * 3600
    assert c.per_million_tokens == pytest.approx(c.per_hour / tokens_per_hour * 1e6)
    mix = (c.per_million_input_tokens * 10.0 * 1024 + c.per_million_output_tokens * 10.0 * 256) * 3600 / 1e6
    assert mix == pytest.approx(c.per_hour)  # the split adds back up to the hour
    f = tmp_path / "prices.yaml"
    f.write_text(yaml.safe_dump({"currency": "USD", "prices": {"ecs.x": {"per_hour": 3.0, "source": "quote",
                                                                         "read": "2026-12-01"}}}))
    fc = cost(cap, w, instance_type="ecs.x", pricing_path=f)
    assert fc.priced and fc.currency == "USD" and fc.pricing_source == str(f) and fc.per_hour == 3.0 * cap.nodes
    f.write_text(yaml.safe_dump({"currency": "USD", "prices": {"ecs.x": {"per_hour": 3.0}}}))
    with pytest.raises(PerfDataError, match=r"prices\.ecs\.x"):
        load_pricing(f)
    assert PRICING_FILE.exists()


def test_a_given_concurrency_is_checked_against_the_slos_and_the_kv_cache():
    m = get_model("deepseek-r1-distill-qwen-7b")
    p = plan(m, get_gpu("L20"), gpus_per_node=1, context=8192)
    lay = Layout.from_plan(p)
    slow = size_for_load(m, gpu_perf("L20"), p, lay, Workload(1024, 256, concurrency=64, itl_slo_s=0.01))
    assert not slow.feasible and "at concurrency 64 the SLOs are not met" in slow.reasons[0]
    big = size_for_load(m, gpu_perf("L20"), p, lay, Workload(1024, 256, concurrency=100000))
    assert big.concurrency_per_replica == big.max_concurrency_per_replica < 100000
    assert "lowered to" in big.notes[0]


def test_the_worked_examples_in_the_docs_are_the_models_own_numbers():
    from pathlib import Path
    text = " ".join(Path(__file__).resolve().parents[1].joinpath("docs", "planner.md").read_text().split())
    itl, s = decode_itl(get_model("deepseek-r1-distill-llama-8b"), gpu_perf("A100-40G"), Layout(), concurrency=1,
                        context=1088)
    assert f"weights {s.weight_bytes / 1e9:.2f} GB / (1,555 GB/s × {HW.efficiency['hbm'].value:.2f}) = " \
           f"{s.t_linear * 1e3:.2f} ms" in text
    assert f"ITL {itl * 1e3:.1f} ms, {1 / itl:.0f} tok/s" in text
    lay = Layout(dp=72, ep=72, rdma_gb_s=50, overlap=True, redundant_experts=32)
    itl, s = decode_itl(get_model("deepseek-v3"), gpu_perf("H100"), lay, concurrency=256 * 72, context=2000)
    assert f"step {s.t_step * 1e3:.1f} ms" in text and f"{256 / s.t_step:,.0f} tok/s per GPU" in text
    assert f"{s.t_all_to_all * 1e3:.0f} ms" in text


def test_v32_decode_reads_the_selected_latent_and_every_indexer_key():
    """DeepSeek Sparse Attention: the main attention reads the top index_topk (2048) tokens'
    latent, the indexer scores and reads every cached token's 132-byte key. Below 2048
    tokens V3.2 costs more than V3 (the indexer on top); at 64k it reads far less."""
    from capacity.perf import decode_step

    v3, v32, g, lay = MODELS["deepseek-v3"], MODELS["deepseek-v3.2"], gpu_perf("H200", HW), Layout(tp=8)
    short = {n: decode_step(m, g, lay, batch=4, context=1024, hw=HW) for n, m in (("v3", v3), ("v32", v32))}
    assert short["v32"].kv_bytes == 4 * 1024 * 61 * (1152 + 132) and short["v3"].kv_bytes == 4 * 1024 * 61 * 1152
    assert short["v32"].attention_flops > short["v3"].attention_flops
    long = {n: decode_step(m, g, lay, batch=4, context=65536, hw=HW) for n, m in (("v3", v3), ("v32", v32))}
    assert long["v32"].kv_bytes == 4 * 61 * (2048 * 1152 + 65536 * 132)
    per_token = 61 * (2 * (128 / 8) * (2 * 512 + 64) * 2048 + 2 * 64 * 128 * 65536)
    assert long["v32"].attention_flops == pytest.approx(4 * per_token)
    assert long["v32"].t_attention < long["v3"].t_attention / 3
