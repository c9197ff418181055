"""Real-vLLM test harness: tiny random-weight models and a server launcher.

Nothing is downloaded. ``make_tiny_model`` writes a Hugging Face style model
directory (``config.json``, ``model.safetensors`` with random bf16 weights named as
vLLM's loaders expect, and a small word-level tokenizer whose vocabulary size equals
``config.vocab_size``). ``VllmServer`` starts ``python -m
vllm.entrypoints.openai.api_server`` on a free port in its own process group, waits
for ``/health``, keeps the whole log in a file and stops the group on exit.

Usage::

    path = make_tiny_model(tmp_path, "qwen2", num_hidden_layers=2)
    with VllmServer(path, args=["--kv-cache-dtype", "fp8"], env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as srv:
        requests.post(srv.url + "/v1/completions", json={...})
        srv.log_lines_matching("KV cache size")
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Mapping, Sequence

from ports import free_port

# Test files that start real vLLM servers. Only one server runs at a time (SERVER_LOCK
# below), so under `-n 2 --dist loadgroup` these files share one worker (one xdist group)
# and the other worker runs everything else; a worker never idles waiting for the lock.
# Every other file is its own group, as with --dist loadfile, so a module's fixtures are
# computed once.
VLLM_SERVER_FILES = frozenset({
    "test_drain_vllm.py", "test_gateway_vllm.py", "test_metrics_contract.py", "test_readonly_root_vllm.py",
    "test_serving_vllm.py", "test_tracing_vllm.py", "test_vllm_kv_capacity.py",
    "test_vllm_mla.py", "test_vllm_plugin.py",
    # several servers at once, under the same machine-wide lock (tests/router_harness.py)
    "test_pd_nixl.py", "test_routing_vllm.py", "test_bench_vllm.py",
})

# The order the server unit runs its files in (tests/conftest.py sorts them so): files whose
# servers the pool can share sit next to each other, since it keeps one server at a time. The
# plugin's last test and the first KV-capacity case ask for the same tiny DeepSeek-V2 server;
# test_metrics_contract.py asks for test_serving_vllm.py's. Every other start is a server of
# its own arguments.
SERVER_FILE_ORDER = (
    "test_vllm_plugin.py", "test_vllm_kv_capacity.py", "test_vllm_mla.py",
    "test_serving_vllm.py", "test_metrics_contract.py", "test_tracing_vllm.py", "test_gateway_vllm.py",
    "test_drain_vllm.py", "test_readonly_root_vllm.py", "test_pd_nixl.py", "test_routing_vllm.py",
    "test_bench_vllm.py",
)

# Default engine arguments for a 2-core CPU box: short context, no graph capture.
# ``--dtype`` defaults to the model's config.json ``torch_dtype``.
DEFAULT_SERVER_ARGS: tuple[str, ...] = (
    "--max-model-len", "512",
    "--enforce-eager",
    "--max-num-seqs", "8",
)
DEFAULT_SERVER_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on the CPU backend
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # The engine core runs its one worker in its own process (vLLM's uni executor, what a
    # one-GPU engine runs) instead of spawning a third Python process that imports vLLM again:
    # about 13 s of every start on a 2-core machine. The CPU platform keeps its multiprocess
    # executor only while this is 1 (vllm/platforms/cpu.py); the API server's engine core stays
    # a process of its own either way. Each engine then runs one torch thread, unbound.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
STARTUP_TIMEOUT_S = float(os.environ.get("VLLM_HARNESS_STARTUP_TIMEOUT", "600"))
# Held while a test process runs a vLLM server: one server per machine at a time.
SERVER_LOCK = os.path.join(tempfile.gettempdir(), "deepseek-volc-vllm-server.lock")

_SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "deepseek models are served with vllm on volcengine",
    "hello world this is a tiny test model with random weights",
    "the kv cache holds keys and values for every token",
    "tensor parallel and pipeline parallel split the model across gpus",
]
_SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# DeepSeek-R1's thinking markers (added tokens in its tokenizer) and, like the R1 and
# R1-distill chat templates, a generation prompt that opens the thinking: the model's
# output is its reasoning, then </think>, then the answer.
THINK_TOKENS = ("<think>", "</think>")
_REASONING_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:<think>\n{% endif %}"
)


# ---------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------

def tiny_config(arch: str, **overrides: Any) -> dict[str, Any]:
    """config.json content for a tiny model of a real architecture."""
    common: dict[str, Any] = {
        "vocab_size": 512,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "use_cache": True,
    }
    if arch == "deepseek_v2":
        cfg = {
            **common,
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            "num_key_value_heads": 4,
            # MLA on the CPU backend needs qk head dim 128 + 64
            "kv_lora_rank": 512,
            "q_lora_rank": None,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "moe_layer_freq": 1,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "topk_method": "greedy",
            "scoring_func": "softmax",
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.0,
            "aux_loss_alpha": 0.001,
            "seq_aux": True,
            "attention_bias": False,
            "rope_scaling": None,
        }
    elif arch == "qwen2":
        cfg = {
            **common,
            # bf16 GQA attention killed the vllm-cpu 0.32 worker with SIGILL on our
            # AVX512/AMX hosts; float32 runs (MLA runs in bf16).
            "torch_dtype": "float32",
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "num_key_value_heads": 2,
            "sliding_window": None,
            "use_sliding_window": False,
            "max_window_layers": 2,
        }
    elif arch == "llama":
        cfg = {
            **common,
            "torch_dtype": "float32",  # see qwen2
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_key_value_heads": 1,
            "head_dim": 64,
            "attention_bias": False,
            "mlp_bias": False,
        }
    else:
        raise ValueError(f"arch: expected 'deepseek_v2', 'qwen2' or 'llama', got {arch!r}")
    cfg.update(overrides)
    return cfg


def _weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes in the Hugging Face checkpoint layout vLLM loads."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h),
                                         "model.norm.weight": (h,)}
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (v, h)
    mla = cfg["model_type"] in ("deepseek_v2", "deepseek_v3")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        a = p + "self_attn."
        if mla:
            nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
            kvr, qr = cfg["kv_lora_rank"], cfg.get("q_lora_rank")
            if qr:
                shapes[a + "q_a_proj.weight"] = (qr, h)
                shapes[a + "q_a_layernorm.weight"] = (qr,)
                shapes[a + "q_b_proj.weight"] = (heads * (nope + rope), qr)
            else:
                shapes[a + "q_proj.weight"] = (heads * (nope + rope), h)
            shapes[a + "kv_a_proj_with_mqa.weight"] = (kvr + rope, h)
            shapes[a + "kv_a_layernorm.weight"] = (kvr,)
            shapes[a + "kv_b_proj.weight"] = (heads * (nope + vd), kvr)
            shapes[a + "o_proj.weight"] = (h, heads * vd)
        else:
            hd = cfg.get("head_dim") or h // heads
            kv = cfg.get("num_key_value_heads", heads)
            shapes[a + "q_proj.weight"] = (heads * hd, h)
            shapes[a + "k_proj.weight"] = (kv * hd, h)
            shapes[a + "v_proj.weight"] = (kv * hd, h)
            shapes[a + "o_proj.weight"] = (h, heads * hd)
            if cfg["model_type"] == "qwen2" or cfg.get("attention_bias"):
                shapes[a + "q_proj.bias"] = (heads * hd,)
                shapes[a + "k_proj.bias"] = (kv * hd,)
                shapes[a + "v_proj.bias"] = (kv * hd,)
        m = p + "mlp."
        moe = mla and cfg.get("n_routed_experts") and i >= cfg.get("first_k_dense_replace", 0) \
            and i % cfg.get("moe_layer_freq", 1) == 0
        if moe:
            mi, n = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
            shapes[m + "gate.weight"] = (n, h)
            if cfg["model_type"] == "deepseek_v3":
                shapes[m + "gate.e_score_correction_bias"] = (n,)
            for e in range(n):
                shapes[f"{m}experts.{e}.gate_proj.weight"] = (mi, h)
                shapes[f"{m}experts.{e}.up_proj.weight"] = (mi, h)
                shapes[f"{m}experts.{e}.down_proj.weight"] = (h, mi)
            if cfg.get("n_shared_experts"):
                si = mi * cfg["n_shared_experts"]
                shapes[m + "shared_experts.gate_proj.weight"] = (si, h)
                shapes[m + "shared_experts.up_proj.weight"] = (si, h)
                shapes[m + "shared_experts.down_proj.weight"] = (h, si)
        else:
            it = cfg["intermediate_size"]
            shapes[m + "gate_proj.weight"] = (it, h)
            shapes[m + "up_proj.weight"] = (it, h)
            shapes[m + "down_proj.weight"] = (h, it)
    return shapes


def _write_tokenizer(out: Path, vocab_size: int, max_len: int, *, reasoning: bool = False) -> None:
    """Byte-level BPE trained on a few sentences, padded with added tokens to vocab_size.

    Byte-level BPE because transformers 5 picks the tokenizer class from the model type
    (Qwen2Tokenizer for qwen2 rebuilds a byte-level BPE from the vocab and merges).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_SENTENCES * 4, trainer=trainer)
    have = tok.get_vocab_size()
    if have > vocab_size:
        raise ValueError(f"vocab_size: expected at least {have} for the byte-level "
                         f"tokenizer, got {vocab_size}")
    think = list(THINK_TOKENS) if reasoning else []
    if think:
        tok.add_special_tokens(think)
    tok.add_tokens([f"<extra_{i}>" for i in range(vocab_size - have - len(think))])
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"tokenizer has {tok.get_vocab_size()} tokens, config {vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "model_max_length": max_len, "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": _REASONING_CHAT_TEMPLATE if reasoning else _CHAT_TEMPLATE,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
    }, indent=2))


def make_tiny_model(tmp_dir: str | os.PathLike[str], arch: str = "deepseek_v2", *,
                    seed: int = 0, reasoning: bool = False, name: str | None = None,
                    **overrides: Any) -> Path:
    """Write a tiny random-weight model of ``arch`` under ``tmp_dir`` and return its path.

    ``overrides`` replace config.json fields (e.g. ``num_hidden_layers=3``).
    ``reasoning``: the tokenizer has R1's ``<think>``/``</think>`` tokens and the chat
    template opens the thinking, as R1's does. ``name``: the directory's name (default
    ``tiny-<arch>``).
    """
    import torch
    from safetensors.torch import save_file

    cfg = tiny_config(arch, **overrides)
    out = Path(tmp_dir) / (name or f"tiny-{arch}")
    out.mkdir(parents=True, exist_ok=True)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
             "float32": torch.float32}[cfg.get("torch_dtype", "bfloat16")]
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in _weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        elif name.endswith(".bias"):
            t = torch.zeros(shape)
        else:
            t = torch.randn(shape, generator=gen) * cfg.get("initializer_range", 0.02)
        tensors[name] = t.to(dtype).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": cfg["pad_token_id"]}, indent=2))
    _write_tokenizer(out, cfg["vocab_size"], cfg["max_position_embeddings"], reasoning=reasoning)
    return out


# ---------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------

class VllmStartupError(RuntimeError):
    """A server that did not come up; ``log_path`` is its whole log, where there is one."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


class VllmPortInUse(VllmStartupError):
    """A listener of the server found its port taken (the log says "Address already in use")."""


# what vLLM's log shows when a listener it starts (uvicorn, NIXL's handshake thread, ZMQ)
# finds its port taken; NIXL's thread dies with it while the engine waits on it for ever
PORT_IN_USE = re.compile(r"Address already in use|EADDRINUSE")
PORT_ATTEMPTS = 3


class ManagedProcess:
    """A child process started in a session of its own (stopped as a group: SIGTERM, then
    SIGKILL after ``stop_timeout``), its output in ``log_path``, used as a context manager:
    what VllmServer and router_harness.VllmRouter share. A subclass sets ``proc`` and
    ``log_path`` and defines ``start``."""

    proc: "subprocess.Popen[bytes] | None" = None
    log_path: Path
    stop_timeout = 30.0
    tail_lines = 60

    def stop(self, timeout: float | None = None) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int | None = None) -> str:
        return "\n".join(self.log_text().splitlines()[-(n or self.tail_lines):])


class VllmServer(ManagedProcess):
    """A real ``vllm.entrypoints.openai.api_server`` process (context manager).

    ``port_env`` names environment variables that hold ports of the server's own listeners
    (``VLLM_NIXL_SIDE_CHANNEL_PORT``, say): each start picks them afresh, and a start whose log
    says a port was taken is retried with new ones (``PORT_ATTEMPTS`` in all) at once instead of
    waiting out ``startup_timeout``. The HTTP port stays what it was made with: callers hand
    ``url`` to routers before the start."""

    def __init__(self, model: str | os.PathLike[str], args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, *, port: int | None = None,
                 log_path: str | os.PathLike[str] | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT_S,
                 default_args: Sequence[str] = DEFAULT_SERVER_ARGS,
                 port_env: Sequence[str] = ()) -> None:
        self.model = str(model)
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.url = f"http://{self.host}:{self.port}"
        defaults = list(default_args)
        if "--dtype" not in defaults:
            defaults += ["--dtype", self._config_dtype(self.model)]
        self.args = self._without_reasoning_parser(self._merge_args(defaults, list(args)), self.model)
        self.env = {**os.environ, **DEFAULT_SERVER_ENV, **(env or {})}
        self.port_env = tuple(port_env)
        self.startup_timeout = startup_timeout
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    @staticmethod
    def _config_dtype(model: str) -> str:
        cfg = Path(model) / "config.json"
        try:
            return str(json.loads(cfg.read_text()).get("torch_dtype") or "auto")
        except (OSError, ValueError):
            return "auto"

    @staticmethod
    def _without_reasoning_parser(args: list[str], model: str) -> list[str]:
        """vLLM's deepseek_r1 parser refuses to start on a tokenizer without R1's <think> and
        </think> tokens. A tiny model made without them (make_tiny_model(reasoning=False))
        serves rendered arguments minus the parser; the parser itself is proven on a tokenizer
        that has them (tests/test_reasoning_parser.py)."""
        if "--reasoning-parser" not in args:
            return args
        tok = Path(model) / "tokenizer.json"
        try:
            has_think = all(t in tok.read_text() for t in THINK_TOKENS)
        except OSError:
            return args  # not a local tiny model: leave what the caller asked for
        if has_think:
            return args
        i = args.index("--reasoning-parser")
        return args[:i] + args[i + 2:]

    @staticmethod
    def _merge_args(defaults: list[str], extra: list[str]) -> list[str]:
        """Defaults, minus any flag the caller passes again (the caller wins)."""
        given = {a.split("=", 1)[0] for a in extra if a.startswith("--")}
        out, i = [], 0
        while i < len(defaults):
            flag = defaults[i]
            has_value = i + 1 < len(defaults) and not defaults[i + 1].startswith("--")
            if flag.split("=", 1)[0] not in given:
                out.append(flag)
                if has_value:
                    out.append(defaults[i + 1])
            i += 2 if has_value else 1
        return out + extra

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model, "--host", self.host, "--port", str(self.port),
                *self.args]

    def start(self) -> "VllmServer":
        t0 = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            for name in self.port_env:
                self.env[name] = str(free_port())
            log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
            log.close()
            try:
                self._wait_healthy(time.monotonic())
            except VllmPortInUse:
                self.stop()
                if attempt == PORT_ATTEMPTS or not self.port_env:
                    raise
                self._keep_log(f"port-in-use-{attempt}")
                continue
            except BaseException:
                self.stop()
                raise
            break
        self.startup_seconds = time.monotonic() - t0
        return self

    def _keep_log(self, tag: str) -> None:
        """The failed attempt's log, beside the next one's (never overwritten)."""
        if self.log_path.exists():
            self.log_path.replace(self.log_path.with_name(f"{self.log_path.name}.{tag}"))

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        while time.monotonic() - t0 < self.startup_timeout:
            code = self.proc.poll()
            if PORT_IN_USE.search(self.log_text()):
                where = ", ".join(f"{n}={self.env[n]}" for n in self.port_env)
                raise VllmPortInUse(f"a listener of vLLM found its port taken (HTTP {self.port}"
                                    f"{', ' + where if where else ''}); log {self.log_path}:\n"
                                    f"{self.log_tail()}", self.log_path)
            if code is not None:
                raise VllmStartupError(f"vLLM exited with code {code} during startup; "
                                       f"log {self.log_path}:\n{self.log_tail()}", self.log_path)
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1.0)
        raise VllmStartupError(f"vLLM not healthy after {self.startup_timeout:.0f}s; "
                               f"log {self.log_path}:\n{self.log_tail()}", self.log_path)

    # -- log helpers (stop, the context manager, log_text / log_tail: ManagedProcess) --
    def log_lines_matching(self, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return [ln for ln in self.log_text().splitlines() if rx.search(ln)]

    def model_runner_pid(self) -> str:
        """The pid of the process that loads and runs the model (the engine core's worker: a
        process of its own under vLLM's multiprocess executor, the engine core under ``uni``)."""
        lines = self.log_lines_matching(r"\(\S+ pid=\d+\).*Starting to load model")
        if not lines:
            raise AssertionError(f"no model load in {self.log_path}:\n{self.log_tail()}")
        return re.search(r"pid=(\d+)", lines[0]).group(1)

    def kv_cache_tokens(self) -> int:
        """The engine's "<device> KV cache size: N tokens" figure."""
        return parse_kv_cache_tokens(self.log_text())

    # -- HTTP helpers -------------------------------------------------------
    def get(self, path: str, timeout: float = 30) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post_json(self, path: str, body: Mapping[str, Any], timeout: float = 120
                  ) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


_KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def parse_kv_cache_tokens(log: str) -> int:
    """Last "KV cache size: N tokens" figure in a vLLM log (ValueError if absent)."""
    found = _KV_LINE.findall(log)
    if not found:
        raise ValueError("no 'KV cache size: N tokens' line in the vLLM log")
    return int(found[-1].replace(",", ""))


class ServerPool:
    """Runs at most one vLLM server at a time, machine-wide.

    Each distinct (model, args, env) is started when first asked for and kept while tests
    keep asking for it; asking for another one stops it first (two tiny servers can still
    be OOM-killed on a 24 GiB machine). A file lock held while a server runs keeps other
    test processes on the same machine (xdist workers, a second checkout) from starting
    one at the same time. Every server gets its own log file, never reused, and a server
    that fails to start raises with the last lines of its log.
    """

    def __init__(self, log_dir: Path, lock_path: str | os.PathLike[str] | None = None,
                 lock_timeout: float = 3600.0,
                 on_wait: Callable[[], ContextManager[Any]] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.lock_path = Path(lock_path or os.environ.get("DSVOLC_VLLM_LOCK", SERVER_LOCK))
        self.lock_timeout = lock_timeout
        # Entered only while another process holds the lock (the test run passes one that
        # stops the test's timeout meanwhile: tests/server_scheduling.py).
        self.on_wait = on_wait or contextlib.nullcontext
        self.lock_waited_s = 0.0
        self._key: tuple[Any, ...] | None = None
        self._server: VllmServer | None = None
        self._lock_fd: int | None = None
        self._started = 0  # every start attempt gets a new log name

    def get(self, model: str | os.PathLike[str], args: Iterable[str] = (),
            env: Mapping[str, str] | None = None, **kwargs: Any) -> VllmServer:
        # the environment the server gets (the harness's defaults under the caller's): asking
        # for a default explicitly is the same server
        key = (str(model), tuple(args), tuple(sorted({**DEFAULT_SERVER_ENV, **(env or {})}.items())),
               tuple(sorted(kwargs.items())))
        srv = self._server
        if key == self._key and srv is not None and srv.proc is not None and srv.proc.poll() is None:
            return srv
        self.stop_all()
        self._acquire()
        self._started += 1
        log = self.log_dir / f"vllm-{self._started:02d}-{Path(str(model)).name}-{os.getpid()}.log"
        srv = VllmServer(model, list(args), env, log_path=log, **kwargs)
        try:
            srv.start()
        except BaseException:
            self._release()
            raise
        self._key, self._server = key, srv
        return srv

    def stop_all(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._key, self._server = None, None
        self._release()

    def _acquire(self) -> None:
        import fcntl

        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            try:
                with self.on_wait():
                    self._wait_for_lock(fd, t0 + self.lock_timeout)
            finally:
                self.lock_waited_s += time.monotonic() - t0
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _wait_for_lock(self, fd: int, deadline: float) -> None:
        import fcntl

        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise VllmStartupError(f"another process held {self.lock_path} (a vLLM server) for "
                                           f"{self.lock_timeout:.0f}s") from None
                time.sleep(0.5)

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None


__all__ = ["make_tiny_model", "tiny_config", "VllmServer", "VllmStartupError", "VllmPortInUse", "ServerPool",
           "parse_kv_cache_tokens", "free_port", "DEFAULT_SERVER_ARGS", "DEFAULT_SERVER_ENV",
           "VLLM_SERVER_FILES", "SERVER_FILE_ORDER"]
