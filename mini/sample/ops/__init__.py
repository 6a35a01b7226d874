"""Mirrors vllm/v1/sample/ops/: the batched tensor operations the sampler is built from."""

from __future__ import annotations

from mini.sample.ops.bad_words import apply_bad_words
from mini.sample.ops.penalties import apply_all_penalties, get_token_bin_counts_and_mask
from mini.sample.ops.topk_topp import apply_top_k_only, apply_top_k_top_p
from mini.sample.ops.topk_topp_sampler import random_sample, sample_fused

__all__ = [
    "apply_all_penalties",
    "apply_bad_words",
    "apply_top_k_only",
    "apply_top_k_top_p",
    "get_token_bin_counts_and_mask",
    "random_sample",
    "sample_fused",
]
