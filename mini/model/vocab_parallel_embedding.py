"""The embedding and the LM head split over the vocabulary (mirrors
vllm/model_executor/layers/vocab_parallel_embedding.py).

Both hold a `[vocab_size, hidden_size]` matrix; with N ranks each holds a contiguous slice of its ROWS (token
ids `[start, end)`, `cdiv(vocab_size, N)` rows per rank, the last rank's tail padded with zero rows):

    VocabParallelEmbedding   each rank looks up only the ids in its slice (the others -> row 0, then zeroed
                             by a mask), and an all-reduce sums the N partial results: each token's vector
                             came from exactly one rank, so the sum is exactly the full lookup.
    ParallelLMHead           logits = hidden @ W^T: each rank computes the logits of ITS token ids, then the
                             slices are all-gathered (and the padding cut off) so every rank has all
                             `[num_tokens, vocab_size]` logits, samples, and keeps its copy of the batch in step.

With tied embeddings the two share one parameter (same slicing), as in vLLM.

Where mini differs: vLLM pads the vocabulary to a multiple of 64 per rank and supports LoRA's added
vocabulary; mini pads only to a multiple of the rank count and has no added vocabulary. vLLM computes the
logits in a separate `LogitsProcessor` that all-gathers them on every in-tree platform (`use_all_gather()`;
gathering to rank 0 is the branch for a platform that answers False); mini's `ParallelLMHead.forward` does the
matmul and the all-gather itself. With one rank each layer runs exactly the plain `nn.Embedding` lookup /
`hidden @ W^T`: no mask, no collective, no copy.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mini.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini.model.parallel_linear import UNQUANTIZED, resolve_tp_rank_and_size
from mini.model.quantization.base_config import QuantizeMethodBase


def vocab_range(vocab_size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """Token ids `[start, end)` held by rank `tp_rank` (vLLM: `vocab_range_from_global_vocab_size`)."""
    per_rank = -(-vocab_size // tp_size)
    start = min(tp_rank * per_rank, vocab_size)
    return start, min(start + per_rank, vocab_size)


class VocabParallelEmbedding(nn.Embedding):
    """`nn.Embedding(num_embeddings, embedding_dim)` with its rows (the vocabulary) split over the ranks."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, tp_rank: int | None = None,
                 tp_size: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        self.tp_rank, self.tp_size = resolve_tp_rank_and_size(tp_rank, tp_size)
        self.org_vocab_size = int(num_embeddings)
        self.vocab_start_index, self.vocab_end_index = vocab_range(self.org_vocab_size, self.tp_rank, self.tp_size)
        self.num_embeddings_per_partition = -(-self.org_vocab_size // self.tp_size)
        super().__init__(self.num_embeddings_per_partition, embedding_dim, device=device, dtype=dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index).masked_fill_(outside, 0)
        output = F.embedding(local_ids, self.weight).masked_fill_(outside.unsqueeze(-1), 0.0)
        return tensor_model_parallel_all_reduce(output)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Full `[vocab_size, hidden]` checkpoint tensor -> this rank's rows; padding rows zeroed."""
        if tuple(loaded_weight.shape) != (self.org_vocab_size, param.shape[1]):
            raise ValueError(f"checkpoint tensor of shape {tuple(loaded_weight.shape)} does not match the "
                             f"vocabulary ({self.org_vocab_size}, {param.shape[1]})")
        rows = self.vocab_end_index - self.vocab_start_index
        with torch.no_grad():
            param[:rows].copy_(loaded_weight[self.vocab_start_index:self.vocab_end_index])
            param[rows:].zero_()

    def extra_repr(self) -> str:
        return (f"vocab [{self.vocab_start_index}, {self.vocab_end_index}) of {self.org_vocab_size}, "
                f"{self.embedding_dim}, tp_rank={self.tp_rank}, tp_size={self.tp_size}")


class ParallelLMHead(VocabParallelEmbedding):
    """The LM head, split over the vocabulary like the embedding: `forward(hidden)` -> ALL the logits.

    `[N, hidden]` -> `[N, vocab_size]` on every rank: local `hidden @ W_r^T` for this rank's token ids, then
    an all-gather along the vocabulary (the padding rows' logits dropped).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False, **kwargs) -> None:
        if bias:
            raise ValueError("bias must be False: mini's LM head has no bias")
        super().__init__(num_embeddings, embedding_dim, **kwargs)

    quant_method: QuantizeMethodBase = UNQUANTIZED   # a scheme may give the head a packed copy of the matrix

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = self.quant_method.apply(self, hidden)
        if self.tp_size == 1:
            return logits
        return tensor_model_parallel_all_gather(logits, dim=-1)[..., :self.org_vocab_size]

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        """Share the embedding's matrix (tied embeddings): the same rows on the same rank."""
        self.weight = embed_tokens.weight


__all__ = ["ParallelLMHead", "VocabParallelEmbedding", "vocab_range"]
