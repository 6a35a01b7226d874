"""Mirrors vllm/v1/spec_decode/ngram_proposer.py: prompt-lookup drafting, no draft model at all.

The request's own tokens are the draft model: if the last n tokens appeared earlier in the sequence, guess
that what followed them then follows them now. This is cheap and works well on text that repeats itself
(code edits, summaries quoting the prompt, structured output).

Which match wins, exactly as vLLM v1's `_find_longest_matched_ngram_and_propose_tokens` (same file):

* the LONGEST n in [min_n, max_n] whose suffix occurs earlier wins (vLLM: "Find the longest n-gram which
  matches the suffix"); the earlier occurrence may overlap the suffix itself, but is never the suffix;
* among the earlier occurrences of that n-gram, the EARLIEST one in the sequence wins (vLLM's comment:
  "we want to get the target n-gram of the earliest position in the original tokens");
* it proposes the (up to) k tokens that followed that occurrence: fewer when the sequence ends sooner
  (vLLM: "If there are less than k tokens follow the match, we will return the maximum amount of tokens
  until the end"), and never so many that the request would pass `max_model_len`.

vLLM finds the match with a KMP-style scan over the reversed tokens (numba-compiled, batched over
requests). mini does one plain pass: for every earlier position holding the last token, count how far
back the match reaches (at most max_n); the longest count wins, ties go to the earliest position.
"""

from __future__ import annotations


def _check_lookup_args(min_n: int, max_n: int, k: int) -> None:
    if min_n < 1:
        raise ValueError(f"min_n must be >= 1, got {min_n}")
    if max_n < min_n:
        raise ValueError(f"max_n must be >= min_n ({min_n}), got {max_n}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def _match_length(token_ids: list[int], end: int, max_n: int) -> int:
    """How many tokens ending at index `end` equal the sequence's last tokens, counted backwards (<= max_n)."""
    last = len(token_ids) - 1
    length = 0
    while length < max_n and length <= end and token_ids[end - length] == token_ids[last - length]:
        length += 1
    return length


def propose_ngram(token_ids: list[int], min_n: int, max_n: int, k: int,
                  max_model_len: int | None = None) -> list[int]:
    """Prompt-lookup drafting: for n from max_n down to min_n, if the last n tokens occurred earlier in
    token_ids, propose (up to) the k tokens that followed that earlier occurrence; [] when nothing matches.

    The earliest earlier occurrence wins, and the longest n is tried first (vLLM:
    vllm/v1/spec_decode/ngram_proposer.py, `_find_longest_matched_ngram_and_propose_tokens`). Fewer than k
    tokens come back when the sequence ends sooner after the match. Never proposes past `max_model_len`:
    len(token_ids) + len(proposal) <= max_model_len.

        propose_ngram([1, 2, 3, 4, 1, 2, 3], min_n=2, max_n=3, k=3) == [4, 1, 2]
    """
    _check_lookup_args(min_n, max_n, k)
    num_tokens = len(token_ids)
    if max_model_len is not None:
        k = min(k, max_model_len - num_tokens)
    if k <= 0 or num_tokens <= min_n:       # the n-gram needs an earlier occurrence, so at least n + 1 tokens
        return []
    best_length, best_end = 0, -1
    last_token = token_ids[-1]
    for end in range(num_tokens - 1):       # `end`: where an earlier occurrence would end (never the suffix)
        if token_ids[end] != last_token:
            continue
        length = _match_length(token_ids, end, max_n)
        if length > best_length:            # strictly longer only: the earliest end keeps a tie
            best_length, best_end = length, end
            if length == max_n:             # the longest allowed n-gram, at its earliest place: done
                break
    if best_length < min_n:
        return []
    start = best_end + 1
    return list(token_ids[start:start + k])


class NgramProposer:
    """Drafts for a batch of requests, one `propose_ngram` per request (vLLM's `NgramProposer`).

    The home of the drafter role's part (mini/roles.py): an engine built with a replaced `propose_ngram`
    gets this class from `roles.resolve`, holding the replacement.
    """

    propose_ngram = staticmethod(propose_ngram)

    def __init__(self, min_n: int, max_n: int, k: int, max_model_len: int) -> None:
        _check_lookup_args(min_n, max_n, k)
        self.min_n = min_n
        self.max_n = max_n
        self.k = k
        self.max_model_len = max_model_len

    def propose(self, token_ids_per_request: list[list[int]]) -> list[list[int]]:
        """Each request's drafts (prompt + output tokens so far -> up to k draft tokens; [] if no match)."""
        return [self.propose_ngram(token_ids, self.min_n, self.max_n, self.k, self.max_model_len)
                for token_ids in token_ids_per_request]
