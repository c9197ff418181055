"""The two records the capacity planner reasons about: a model's architecture and a GPU."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class CheckpointQuant:
    """A pre-quantised checkpoint's `quantization_config` (config.json), as vLLM reads it.

    `format` is how the planner counts the weights: ``fp8`` (e4m3, one fp32 scale per block
    or channel), ``awq`` (AutoAWQ int4, fp16 scale and int4 zero point per group) or
    ``w4a16`` (compressed-tensors / GPTQ int4, one 16-bit scale per group, symmetric)."""

    method: str  # quant_method as written: 'fp8' | 'awq' | 'compressed-tensors' | 'gptq'
    format: str  # 'fp8' | 'awq' | 'w4a16'
    bits: int
    group_size: int | None = None  # int4 groups along the input dimension
    zero_point: bool = False
    # block-quantised FP8 ([n, k] blocks of one scale each); None: per-tensor or per-channel
    weight_block_size: tuple[int, int] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts that serving memory depends on."""

    name: str
    hf_id: str
    architecture: str  # 'deepseek_v3' | 'deepseek_v2' | 'qwen2' | 'llama' | ...
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    kv_lora_rank: int | None  # None for GQA/MHA models
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None
    v_head_dim: int | None
    vocab_size: int
    n_routed_experts: int  # 0 for dense models
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int | None
    intermediate_size: int
    first_k_dense_replace: int  # leading layers with a dense MLP instead of MoE
    param_count: int
    native_dtype: str  # 'bfloat16' | 'float16' | 'float32' | 'fp8' | 'awq' | 'w4a16' (the checkpoint's weights)
    max_context: int
    source: str
    # Extra facts used for exact per-tensor weight counting.
    q_lora_rank: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qwen2 has q/k/v biases
    moe_layer_freq: int = 1
    fp8_block_size: tuple[int, int] | None = None  # block-quantized FP8 checkpoints
    # Multi-token-prediction modules shipped in the checkpoint (config.json
    # `num_nextn_predict_layers`); vLLM loads them only for MTP speculative decoding.
    mtp_layers: int = 0
    # DeepSeek Sparse Attention (V3.2): a lightning indexer per layer scores every cached
    # token and attention reads the top `index_topk`. Its key cache is a second per-token
    # cache beside the MLA latent (config.json `index_n_heads`, `index_head_dim`, `index_topk`).
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    index_topk: int | None = None
    # vLLM's reasoning parser for a model that writes its thinking between <think> and
    # </think> before the answer (DeepSeek-R1 and the R1 distills: `deepseek_r1`, in
    # vllm/reasoning/__init__.py); None for models that answer directly.
    reasoning_parser: str | None = None
    # A pre-quantised checkpoint: its quantization_config (None for 16/32-bit checkpoints),
    # and the catalog model whose architecture it quantises (None for an original checkpoint).
    quant: CheckpointQuant | None = None
    base_model: str | None = None

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): one compressed latent per token."""
        return self.kv_lora_rank is not None

    @property
    def has_sparse_indexer(self) -> bool:
        """DeepSeek Sparse Attention: an indexer key cache per token and layer."""
        return self.index_head_dim is not None

    @property
    def indexer_bytes_per_token(self) -> int:
        """Indexer key cache per token and layer (0 without DSA): FP8 values and one fp32
        scale per 128, whatever the KV cache dtype (DeepSeek-V3.2-Exp inference/model.py:
        k_cache float8_e4m3fn [index_head_dim], k_scale_cache float32 [index_head_dim // 128];
        vLLM 0.32 deepseek_v2.py: DeepseekV32IndexerCache of head_dim + head_dim // 128 * 4
        uint8)."""
        if self.index_head_dim is None:
            return 0
        return self.index_head_dim + 4 * -(-self.index_head_dim // 128)

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.layer_is_moe(i))

    def layer_is_moe(self, index: int) -> bool:
        return (
            self.is_moe
            and index >= self.first_k_dense_replace
            and index % self.moe_layer_freq == 0
        )


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int  # total device memory as reported by the driver (nvidia-smi)
    bf16: bool
    fp8: bool  # FP8 tensor cores (Ada / Hopper)
    interconnect: str
    nominal_gb: int = 0
    source: str = ""
    compute_capability: tuple[int, int] | None = None  # CUDA SM version (developer.nvidia.com/cuda-gpus)


# SM major versions vLLM 0.32's sparse-MLA backends accept (v1/attention/backends/mla/
# flashmla_sparse.py 9/10, flashattn_mla_sparse.py 9, flashinfer_mla_sparse.py 12).
SPARSE_MLA_SM_MAJORS = (9, 10, 12)


def sparse_attention_problem(model: ModelSpec, gpu: GPUSpec) -> str | None:
    """Why vLLM cannot run the model's DeepSeek Sparse Attention on this GPU, else None."""
    cc = gpu.compute_capability
    if not model.has_sparse_indexer or (cc and cc[0] in SPARSE_MLA_SM_MAJORS):
        return None
    return (f"{model.name} uses DeepSeek Sparse Attention, whose vLLM kernels need a GPU of compute "
            f"capability 9.x, 10.x or 12.x (Hopper, Blackwell); {gpu.name} is "
            f"{'.'.join(map(str, cc)) if cc else 'of unknown capability'}")
