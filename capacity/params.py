"""Parameters per tensor, split the way vLLM shards them across tensor-parallel ranks.

``linear`` weights are what a quantization method converts; ``other`` stay in the
activation dtype (embeddings, LM head, norms, MoE router, biases).
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.specs import ModelSpec


# ----------------------------------------------------------------------------
# Parameter counting
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ParamGroups:
    """Per-rank parameter counts of one part of the model.

    ``linear`` are the weights a quantization method converts; ``other`` stay in the
    activation dtype (embeddings, LM head, norms, MoE router, biases).
    """

    linear: float = 0.0
    other: float = 0.0

    def __add__(self, o: "ParamGroups") -> "ParamGroups":
        return ParamGroups(self.linear + o.linear, self.other + o.other)

    def scale(self, k: float) -> "ParamGroups":
        return ParamGroups(self.linear * k, self.other * k)

    @property
    def total(self) -> float:
        return self.linear + self.other


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    if model.is_mla:
        return 1  # one latent vector, replicated on each rank
    return max(1, model.num_kv_heads // tp)


def _attention_params(m: ModelSpec, tp: int) -> ParamGroups:
    h = m.hidden_size
    hl = m.num_attention_heads / tp
    if m.is_mla:
        nope, rope, v, kvr = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        qk = nope + rope
        linear = 0.0
        other = 0.0
        if m.q_lora_rank:
            linear += h * m.q_lora_rank  # q_a_proj (replicated)
            other += m.q_lora_rank  # q_a_layernorm
            linear += m.q_lora_rank * hl * qk  # q_b_proj (column parallel)
        else:
            linear += h * hl * qk  # q_proj
        linear += h * (kvr + rope)  # kv_a_proj_with_mqa (replicated)
        other += kvr  # kv_a_layernorm
        linear += kvr * hl * (nope + v)  # kv_b_proj (column parallel)
        linear += hl * v * h  # o_proj (row parallel)
        if m.has_sparse_indexer:
            # DSA lightning indexer, replicated on every rank (vLLM deepseek_v2.py Indexer):
            # wq_b q_lora -> heads x dim (quantized), wk + weights_proj fused and kept in
            # bf16, k_norm LayerNorm weight and bias.
            ih, idim = m.index_n_heads, m.index_head_dim
            linear += (m.q_lora_rank or h) * ih * idim
            other += h * (idim + ih) + 2 * idim
        return ParamGroups(linear, other)
    hd = m.head_dim
    kvl = kv_heads_per_rank(m, tp)
    linear = h * hl * hd + 2 * h * kvl * hd + hl * hd * h
    other = (hl + 2 * kvl) * hd if m.attention_bias else 0.0
    return ParamGroups(linear, other)


def experts_per_rank(m: ModelSpec, ep: int) -> int:
    """Routed experts each rank holds under expert parallelism (whole experts; vLLM gives
    the first ranks one more when the count does not divide)."""
    return -(-m.n_routed_experts // ep)


def _mlp_params(m: ModelSpec, tp: int, moe: bool, ep: int | None = None) -> ParamGroups:
    h = m.hidden_size
    if not moe:
        return ParamGroups(3 * h * m.intermediate_size / tp, 0.0)
    expert = 3 * h * m.moe_intermediate_size
    if ep:
        # Expert parallel: routed experts are split whole across the EP ranks (EP = TP x
        # DP); the shared experts stay tensor parallel within the attention group.
        experts = experts_per_rank(m, ep) * expert + m.n_shared_experts * expert / tp
    else:
        experts = (m.n_routed_experts + m.n_shared_experts) * expert / tp
    router = m.n_routed_experts * h + (m.n_routed_experts if m.architecture in ("deepseek_v3", "deepseek_v32") else 0)
    return ParamGroups(experts, router)


def layer_params(m: ModelSpec, index: int, tp: int = 1, ep: int | None = None) -> ParamGroups:
    """One decoder layer on one rank. `ep`: expert-parallel size (None: experts are
    tensor parallel like every other weight)."""
    norms = ParamGroups(0.0, 2 * m.hidden_size)
    return _attention_params(m, tp) + _mlp_params(m, tp, m.layer_is_moe(index), ep) + norms


def mtp_params(m: ModelSpec, tp: int = 1, ep: int | None = None, *, own_embedding: bool = False) -> ParamGroups:
    """The multi-token-prediction modules on one rank (vLLM's DeepSeekMTP): per module a
    full decoder layer (MoE in V3/R1), `eh_proj` (2h -> h, a replicated nn.Linear kept in
    the activation dtype), enorm/hnorm and the shared head's norm. vLLM reuses the target
    model's embedding and LM head only when there is no pipeline parallelism
    (vllm/v1/spec_decode/llm_base_proposer.py `_maybe_share_embeddings`, 0.32); with
    stages, the module carries its own copies (`own_embedding`)."""
    if not m.mtp_layers:
        return ParamGroups()
    h = m.hidden_size
    one = layer_params(m, m.num_layers, tp, ep) + ParamGroups(0.0, 2 * h * h + 3 * h)
    if own_embedding:
        one = one + embedding_params(m, tp) + lm_head_params(m, tp)
    return one.scale(m.mtp_layers)


def embedding_params(m: ModelSpec, tp: int = 1) -> ParamGroups:
    return ParamGroups(0.0, m.vocab_size * m.hidden_size / tp)


def lm_head_params(m: ModelSpec, tp: int = 1) -> ParamGroups:
    return ParamGroups(0.0, m.vocab_size * m.hidden_size / tp + m.hidden_size)  # + final norm


def count_parameters(m: ModelSpec) -> int:
    """Total parameters of the model as vLLM loads it (no MTP module)."""
    total = embedding_params(m).total + sum(layer_params(m, i).total for i in range(m.num_layers))
    total += m.hidden_size if m.tie_word_embeddings else lm_head_params(m).total
    return int(total)


def pp_layer_ranges(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """Layer ranges per pipeline stage, partitioned like vLLM's ``get_pp_indices``."""
    per = num_layers // pp
    parts = [per] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for n in parts:
        out.append((start, start + n))
        start += n
    return out
