"""EAGLE draft head: one decoder layer that drafts from the target model's final hidden state.

Mirrors vllm/model_executor/models/llama_eagle.py (`EagleLlamaForCausalLM`, its `LlamaModel`): the head
embeds the next token with the TARGET's embedding matrix, concatenates that embedding with the target's
hidden state, projects the pair back to `hidden_size` with `fc`, and runs one Llama decoder layer. Its
output goes through the TARGET's LM head (`LlamaForCausalLM.compute_logits`); neither the embedding nor
the LM head is stored with the head. The proposer that drives it mirrors vllm/v1/spec_decode/eagle.py.

Inputs at flat position t (as in vLLM):
  h_t      the target's final hidden state at t: the output of its final RMSNorm, exactly what the LM head
           reads (what `LlamaForCausalLM.forward` returns), or the head's own previous output when drafting
           the 2nd, 3rd, ... token;
  x_{t+1}  the token after t.
Output: a predicted hidden state for position t+1; `target.compute_logits` of it scores x_{t+2}.

Differences from vLLM's head, both deliberate: the decoder layer keeps its `input_layernorm` (vLLM, like
the EAGLE code, replaces it by identity in layer 0), and the head ends with its own RMSNorm `norm`, because
our target's hidden states are taken AFTER the target's final norm (vLLM's EAGLE-1 head returns the
un-normed residual stream).

Position convention: the head's token at flat position t uses RoPE position t and writes its K/V to the slot
of position t, i.e. the same `positions`, `slot_mapping` and block table as the target's token t. The head
owns ONE KV-cache tensor (`kv_cache_shape`, same layout as a target layer's).

Checkpoint (`from_pretrained(folder, ...)`): `config.json` (the target's architecture fields with
`num_hidden_layers: 1`, `architectures: ["EagleLlamaForCausalLM"]`) and `model.safetensors` with
  fc.weight                [hidden, 2 * hidden]  input = cat(embed(x_{t+1}), h_t): EMBEDDING FIRST, as vLLM
  layer.*                  one decoder layer, names as mini/model/llama.py's LlamaDecoderLayer
                           (layer.self_attn.q_proj.weight, layer.mlp.gate_proj.weight, layer.input_layernorm...)
  norm.weight              the head's final RMSNorm
Made by `python -m scripts.train_eagle_head` (shipped in mini/assets/tiny-llama-eagle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mini.attention import build_attention_backend
from mini.model.llama import DecoderConfig, LlamaDecoderLayer, RMSNorm
from mini.model.loader import iterate_checkpoint, load_weights, resolve_dtype
from mini.model.rotary import RotaryEmbedding, apply_rotary

if TYPE_CHECKING:
    from mini.attention.reference import AttentionMetadata
    from mini.model.llama import LlamaForCausalLM

EAGLE_ARCHITECTURE = "EagleLlamaForCausalLM"
# Fields of the target's config that must agree with the head's (the head reads the target's hidden states,
# embeds with the target's embedding matrix and is scored by the target's LM head).
MATCHING_FIELDS = ("hidden_size", "vocab_size")


class EagleHead(nn.Module):
    """One decoder layer that drafts from the target's hidden state.

    Input at flat position t: the target's final hidden state h_t (the output of the target's final
    RMSNorm, i.e. exactly what the LM head reads: `LlamaForCausalLM.forward` returns it) and the token
    x_{t+1}; output: a predicted hidden state for position t+1, which the TARGET's `compute_logits`
    (its LM head) turns into logits for x_{t+2}. It reuses the target's embedding matrix and LM head
    (not stored).
    """

    def __init__(self, hf_config: Any, target_embed_tokens: nn.Embedding, attention_backend: str = "torch") -> None:
        super().__init__()
        self.config = DecoderConfig.from_hf_config(hf_config)
        if self.config.num_hidden_layers != 1:
            raise ValueError(f"an EAGLE head has num_hidden_layers 1, got {self.config.num_hidden_layers}")
        hidden = self.config.hidden_size
        if tuple(target_embed_tokens.weight.shape) != (self.config.vocab_size, hidden):
            raise ValueError(f"target_embed_tokens must be [vocab_size={self.config.vocab_size}, hidden_size="
                             f"{hidden}], got {tuple(target_embed_tokens.weight.shape)}")
        self.attention_backend = attention_backend
        # fc reads cat(embed(x_{t+1}), h_t): the embedding first, then the target hidden state (vLLM's order).
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = LlamaDecoderLayer(self.config, 0, build_attention_backend(attention_backend))
        self.norm = RMSNorm(hidden, self.config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(self.config.head_dim, self.config.rope_parameters)
        # The target's embedding, shared and NOT registered as a submodule: it is not in this head's
        # parameters, state_dict or checkpoint, and `.to()` on the head leaves it to the target.
        object.__setattr__(self, "embed_tokens", target_embed_tokens)

    def set_attention_backend(self, name: str) -> None:
        """Switch the layer to backend `name` ("torch" or "triton")."""
        self.layer.self_attn.backend = build_attention_backend(name)
        self.attention_backend = name

    def fuse_inputs(self, input_ids: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        """`fc(cat(embed(x_{t+1}), h_t))`: `[..., H]` from ids `[...]` and hidden `[..., H]`."""
        embeds = self.embed_tokens(input_ids).to(target_hidden.dtype)
        return self.fc(torch.cat((embeds, target_hidden), dim=-1))

    def forward(
        self,
        input_ids: torch.Tensor,
        target_hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Flat `[T]` ids, `[T, H]` target hidden, `[T]` positions, ONE kv-cache tensor in the list -> `[T, H]`
        predicted hidden (after the head's own final norm), ready for `target.compute_logits`."""
        if len(kv_caches) != 1:
            raise ValueError(f"kv_caches must hold exactly one tensor (the head has one layer), got {len(kv_caches)}")
        if target_hidden.shape != (input_ids.shape[0], self.config.hidden_size):
            raise ValueError(f"target_hidden must be [num_tokens={input_ids.shape[0]}, hidden_size="
                             f"{self.config.hidden_size}], got {tuple(target_hidden.shape)}")
        hidden = self.fuse_inputs(input_ids, target_hidden)
        cos_sin = self.rotary_emb.cos_sin(positions, hidden.dtype)
        hidden = self.layer(hidden, cos_sin, kv_caches[0], attn_metadata)
        return self.norm(hidden)

    def forward_contiguous(
        self, input_ids: torch.Tensor, target_hidden: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Training / reference path: padded batch `[B, S]` ids, `[B, S, H]` hidden -> `[B, S, H]`.

        The same weights as `forward`, with plain causal SDPA over each row instead of the paged cache
        (row b, column s is position `positions[b, s]`, default s).
        """
        batch_size, seq_len = input_ids.shape
        if positions is None:
            positions = torch.arange(seq_len, device=input_ids.device).expand(batch_size, seq_len)
        attn = self.layer.self_attn
        hidden = self.fuse_inputs(input_ids, target_hidden)
        cos, sin = self.rotary_emb.cos_sin(positions.reshape(-1), hidden.dtype)
        normed = self.layer.input_layernorm(hidden).reshape(batch_size * seq_len, -1)

        def heads(proj: nn.Linear, num_heads: int) -> torch.Tensor:
            return proj(normed).view(batch_size * seq_len, num_heads, attn.head_dim)

        query, key = heads(attn.q_proj, attn.num_heads), heads(attn.k_proj, attn.num_kv_heads)
        value = heads(attn.v_proj, attn.num_kv_heads)
        if hasattr(attn, "q_norm"):
            query, key = attn.q_norm(query), attn.k_norm(key)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        group_size = attn.num_heads // attn.num_kv_heads

        def to_bhsd(x: torch.Tensor, repeat: int) -> torch.Tensor:  # [B*S, h, D] -> [B, h*repeat, S, D]
            x = x.view(batch_size, seq_len, -1, attn.head_dim).transpose(1, 2)
            return x.repeat_interleave(repeat, dim=1) if repeat > 1 else x

        out = nn.functional.scaled_dot_product_attention(
            to_bhsd(query, 1), to_bhsd(key, group_size), to_bhsd(value, group_size),
            is_causal=True, scale=attn.scaling,
        )
        out = out.transpose(1, 2).reshape(batch_size, seq_len, attn.num_heads * attn.head_dim)
        hidden = hidden + attn.o_proj(out)
        hidden = hidden + self.layer.mlp(self.layer.post_attention_layernorm(hidden))
        return self.norm(hidden)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int, int]:
        """Shape of the head's ONE cache tensor: `[2, num_blocks, block_size, num_kv_heads, head_size]`."""
        return (2, num_blocks, block_size, self.config.num_key_value_heads, self.config.head_dim)

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        target_model: LlamaForCausalLM,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
    ) -> EagleHead:
        """Build the head of `folder/config.json`, fill it from `folder/model.safetensors`, tie it to `target_model`."""
        folder = Path(folder)
        config_path, weights_path = folder / "config.json", folder / "model.safetensors"
        if not config_path.is_file() or not weights_path.is_file():
            raise ValueError(f"EAGLE head folder {str(folder)!r} needs config.json and model.safetensors")
        hf_config = json.loads(config_path.read_text())
        for field in MATCHING_FIELDS:
            head_value, target_value = hf_config.get(field), getattr(target_model.config, field)
            if head_value != target_value:
                raise ValueError(f"EAGLE head {field}={head_value} does not match the target's {target_value}")
        backend = getattr(target_model, "attention_backend", "torch")
        with torch.device("meta"):  # every tensor comes from the checkpoint: skip the random init
            head = cls(hf_config, nn.Embedding(hf_config["vocab_size"], hf_config["hidden_size"]), backend)
        head.to(resolve_dtype(dtype))
        head.to_empty(device=device)
        object.__setattr__(head, "embed_tokens", target_model.model.embed_tokens)
        load_weights(head, iterate_checkpoint([weights_path]))
        return head.eval()
