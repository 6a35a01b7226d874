"""Mirrors vllm/v1/sample/ops/bad_words.py: ban token sequences from being completed.

A bad word is a token-id sequence. A single-token word is always banned; a longer word bans its last
token only when the output generated so far ends with the word's other tokens.
"""

from __future__ import annotations

import torch


def apply_bad_words(
    logits: torch.Tensor, bad_words_token_ids: dict[int, list[list[int]]], output_token_ids: list[list[int]]
) -> torch.Tensor:
    """Set banned next tokens to -inf in place, for the rows listed in `bad_words_token_ids`."""
    for row, bad_words in bad_words_token_ids.items():
        past = output_token_ids[row]
        for word in bad_words:
            prefix = word[:-1]
            if len(prefix) > len(past):
                continue
            if not prefix or past[len(past) - len(prefix):] == prefix:
                logits[row, word[-1]] = -float("inf")
    return logits
