"""Llama / Qwen2 / Qwen3 decoder running on the paged KV cache (one file, flags for the variants).

Mirrors vllm/model_executor/models/llama.py (with the Qwen2 and Qwen3 differences of qwen2.py and
qwen3.py folded in as flags). Like vLLM's models, `forward` takes a FLAT batch: `input_ids` and
`positions` of all scheduled tokens of all requests back to back, no padding, plus one KV cache
tensor per layer and the attention metadata that says which rows belong to which request.

Variants:
  llama  - optional `attention_bias` on q/k/v/o, optional `mlp_bias`, RoPE ("default" / "llama3").
  qwen2  - bias on q/k/v (not o).
  qwen3  - per-head RMSNorm on q and k before RoPE (`q_norm`, `k_norm`), `head_dim` from the config.

Parameter names equal the Hugging Face ones (`model.layers.0.self_attn.q_proj.weight`, ...), so loading
a checkpoint is a name-for-name copy (mini/model/loader.py).

Tensor parallelism (mini/model/parallel_linear.py, vocab_parallel_embedding.py): each layer is built for this
process's rank (`mini.distributed.get_tensor_model_parallel_rank/_world_size`; rank 0 of 1 by default, where
every layer is the full `nn.Linear` / `nn.Embedding`). q/k/v and gate/up are column-parallel (each rank holds
whole attention heads, its KV heads and its slice of the MLP), o_proj and down_proj row-parallel: their
all-reduces are the only communication inside a layer. The embedding and the LM head are split over the
vocabulary. `check_tensor_parallel_size` says which sizes a model allows.

`LlamaForCausalLM` is the home of the `model` role (mini/roles.py): its parts `rms_norm` and `apply_rotary`
are handed to every submodule when the model is built (`DecoderOps`), so a model class built with replaced
parts (`roles.resolve(config, LlamaForCausalLM)`) runs them in every layer. Its parts `RowParallelLinear` and
`VocabParallelEmbedding` are the classes of the layers whose forward holds a collective (o_proj, down_proj,
the embedding), built from `DecoderOps` too (phase 14 plugs a learner's subclass into a TP=2 engine). vLLM picks an
op's implementation when the model is built too (`CustomOp`, vllm/model_executor/custom_op.py). The layers hold the
engine's attention backend instance (mini/attention/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mini.attention import build_attention_backend
from mini.attention.unified_attention import unified_attention
from mini.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from mini.model.parallel_linear import ColumnParallelLinear, RowParallelLinear, divide, kv_head_partition
from mini.model.rotary import RotaryEmbedding, apply_rotary, rope_parameters_from_config
from mini.model.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

if TYPE_CHECKING:
    from mini.attention.metadata import AttentionMetadata

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(slots=True)
class DecoderConfig:
    """The architecture numbers the decoder needs, read from a Hugging Face config."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_parameters: dict[str, Any]
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> DecoderConfig:
        """From a transformers `PretrainedConfig` or the plain dict of a `config.json`."""
        cfg = _AttrView(hf_config) if isinstance(hf_config, dict) else hf_config
        model_type = getattr(cfg, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type must be one of {SUPPORTED_MODEL_TYPES}, got {model_type!r}")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("use_sliding_window must be False: sliding-window attention is not supported")
        num_heads = int(cfg.num_attention_heads)
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(cfg.vocab_size),
            hidden_size=int(cfg.hidden_size),
            intermediate_size=int(cfg.intermediate_size),
            num_hidden_layers=int(cfg.num_hidden_layers),
            num_attention_heads=num_heads,
            num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or num_heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads),
            rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
            rope_parameters=rope_parameters_from_config(cfg),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            qk_norm=model_type == "qwen3",
        )


def check_tensor_parallel_size(config: DecoderConfig, tensor_parallel_size: int) -> None:
    """Refuse a size the heads do not divide (vLLM: `ModelConfig.verify_with_parallel_config`).

    The query heads must split evenly. The KV heads too, or, when there are fewer KV heads than ranks, the
    ranks must split evenly over them: each KV head is then REPLICATED on `tp / kv_heads` ranks, as vLLM's
    `QKVParallelLinear` does (mini/model/parallel_linear.py `kv_head_partition`).
    """
    tp = tensor_parallel_size
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tensor_parallel_size must be a positive int, got {tp!r}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % tp:
        raise ValueError(f"Total number of attention heads ({heads}) must be divisible by tensor parallel "
                         f"size ({tp})")
    if (kv_heads % tp if kv_heads >= tp else tp % kv_heads):
        raise ValueError(f"Total number of KV heads ({kv_heads}) must be divisible by tensor parallel size "
                         f"({tp}), or tensor parallel size by it (each KV head then replicated)")


class _AttrView:
    """Attribute access on a config dict (missing keys read as None, like `getattr(cfg, k, None)`)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        return self._data.get(name)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`x / sqrt(mean(x**2, last dim) + eps) * weight`: the statistics in float32, then back to x's dtype."""
    input_dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(input_dtype)


@dataclass(frozen=True, slots=True)
class DecoderOps:
    """The decoder's own operators, chosen when the model is built (the `model` role's parts)."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm
    apply_rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rotary
    # The layers whose forward holds a collective (o_proj/down_proj's all-reduce, the embedding's masked one).
    RowParallelLinear: type[RowParallelLinear] = RowParallelLinear
    VocabParallelEmbedding: type[VocabParallelEmbedding] = VocabParallelEmbedding


REFERENCE_OPS = DecoderOps()


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 like Hugging Face's LlamaRMSNorm."""

    def __init__(self, hidden_size: int, eps: float, ops: DecoderOps = REFERENCE_OPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.rms_norm = ops.rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(x, self.weight, self.variance_epsilon)


class LlamaMLP(nn.Module):
    """SiLU-gated MLP: down(silu(gate(x)) * up(x)); with TP, gate/up column- and down row-parallel."""

    def __init__(self, config: DecoderConfig, ops: DecoderOps = REFERENCE_OPS) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = ColumnParallelLinear(hidden, inner, bias=bias)   # this rank's slice of the inner dim
        self.up_proj = ColumnParallelLinear(hidden, inner, bias=bias)
        self.down_proj = ops.RowParallelLinear(inner, hidden, bias=bias)  # partial sums -> all-reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaAttention(nn.Module):
    """q/k/v projections, (Qwen3: per-head norms), RoPE, paged KV write + read, output projection."""

    def __init__(self, config: DecoderConfig, layer_idx: int, backend: Any, ops: DecoderOps = REFERENCE_OPS) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        tp_size, tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        # This rank's heads (all of them without TP): whole query heads, and the KV heads they attend to.
        self.num_heads = divide(config.num_attention_heads, tp_size, "total number of attention heads")
        kv = kv_head_partition(config.num_key_value_heads, tp_size, tp_rank)
        self.num_kv_heads = kv.num_kv_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.backend = backend
        # Set by mini/compilation.py for a compiled forward: attention then runs as one opaque op that reads the
        # step's metadata and this layer's cache from the forward context (vLLM: `unified_attention_with_output`).
        self.use_attention_op = False
        self.apply_rotary = ops.apply_rotary
        hidden = config.hidden_size
        q_size, kv_size = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = ColumnParallelLinear(hidden, q_size, bias=config.qkv_bias)
        # K/V rows split by KV head; fewer KV heads than ranks: ranks share (replicate) one head's rows.
        self.k_proj = ColumnParallelLinear(hidden, kv_size, bias=config.qkv_bias, tp_rank=kv.shard_rank,
                                           tp_size=kv.num_shards)
        self.v_proj = ColumnParallelLinear(hidden, kv_size, bias=config.qkv_bias, tp_rank=kv.shard_rank,
                                           tp_size=kv.num_shards)
        self.o_proj = ops.RowParallelLinear(q_size, hidden, bias=config.o_bias)   # partial sums -> all-reduce
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)

    def forward(
        self,
        hidden: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        query = self.q_proj(hidden).view(num_tokens, self.num_heads, self.head_dim)
        key = self.k_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        value = self.v_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            query, key = self.q_norm(query), self.k_norm(key)
        cos, sin = cos_sin
        query, key = self.apply_rotary(query, cos, sin), self.apply_rotary(key, cos, sin)
        if self.use_attention_op:
            out = unified_attention(query, key, value, self.layer_idx, self.scaling)
        else:
            self.backend.store_kv(key, value, kv_cache, attn_metadata.slot_mapping)
            out = self.backend.paged_attention(query, kv_cache, attn_metadata, self.scaling)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: DecoderConfig, layer_idx: int, backend: Any, ops: DecoderOps = REFERENCE_OPS) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, backend, ops)
        self.mlp = LlamaMLP(config, ops)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(self, hidden, cos_sin, kv_cache, attn_metadata) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos_sin, kv_cache, attn_metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    def __init__(self, config: DecoderConfig, backend: Any, ops: DecoderOps = REFERENCE_OPS) -> None:
        super().__init__()
        self.embed_tokens = ops.VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, idx, backend, ops) for idx in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_parameters)

    def forward(self, input_ids, positions, kv_caches, attn_metadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        cos_sin = self.rotary_emb.cos_sin(positions, hidden.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos_sin, kv_cache, attn_metadata)
        return self.norm(hidden)


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head. `forward` returns hidden states; `compute_logits` turns chosen rows into logits.

    `attention_backend`: a backend name ("torch", "torch_fast", "triton") or a built backend instance,
    which every layer then holds (the engine builds one per engine, mini/attention/).
    """

    rms_norm = staticmethod(rms_norm)
    apply_rotary = staticmethod(apply_rotary)
    RowParallelLinear = RowParallelLinear
    VocabParallelEmbedding = VocabParallelEmbedding

    def __init__(self, hf_config: Any, attention_backend: str | Any = "torch") -> None:
        super().__init__()
        self.config = DecoderConfig.from_hf_config(hf_config)
        self.tensor_parallel_size = get_tensor_model_parallel_world_size()
        check_tensor_parallel_size(self.config, self.tensor_parallel_size)
        self.attention_backend = build_attention_backend(attention_backend)
        self.ops = DecoderOps(rms_norm=self.rms_norm, apply_rotary=self.apply_rotary,
                              RowParallelLinear=self.RowParallelLinear,
                              VocabParallelEmbedding=self.VocabParallelEmbedding)
        self.model = LlamaModel(self.config, self.attention_backend, self.ops)
        self.lm_head = ParallelLMHead(self.config.vocab_size, self.config.hidden_size)
        self.tie_weights()

    def tie_weights(self) -> None:
        """With `tie_word_embeddings`, the LM head IS the embedding matrix (one shared parameter)."""
        if self.config.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)

    def set_attention_backend(self, backend: str | Any) -> None:
        """Give every layer `backend`: a built backend instance, or a name ("torch", "torch_fast", "triton")."""
        self.attention_backend = build_attention_backend(backend)
        for layer in self.model.layers:
            layer.self_attn.backend = self.attention_backend

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Flat batch `input_ids`/`positions` `[T]` -> final hidden states `[T, hidden_size]`."""
        if len(kv_caches) != self.config.num_hidden_layers:
            raise ValueError(
                f"kv_caches must hold one tensor per layer ({self.config.num_hidden_layers}), got {len(kv_caches)}"
            )
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[N, hidden_size]` -> float32 logits `[N, vocab_size]` (all of them, on every rank)."""
        return self.lm_head(hidden).float()

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int, int]:
        """Shape of ONE layer's cache (contract): `[2, num_blocks, block_size, num_kv_heads, head_size]`.

        vLLM v0.33.0 keeps K and V side by side instead, `[num_blocks, num_kv_heads, block_size, 2 * head_size]`
        (see mini/attention/reference.py); each side has the same shape as here. With tensor parallelism
        `num_kv_heads` is this rank's (vLLM: each worker's `KVCacheSpec` counts its own heads)."""
        kv = kv_head_partition(self.config.num_key_value_heads, self.tensor_parallel_size,
                               get_tensor_model_parallel_rank())
        return (2, num_blocks, block_size, kv.num_kv_heads, self.config.head_dim)
