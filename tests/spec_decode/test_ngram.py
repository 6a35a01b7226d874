"""N-gram (prompt-lookup) drafting, mini/spec_decode/ngram_proposer.py, against vLLM v1's rule: the longest
n in [min_n, max_n] whose suffix occurred earlier wins, the EARLIEST earlier occurrence of it wins, up to k
tokens that followed it come back (fewer near the end), never past max_model_len."""

from __future__ import annotations

import random

import pytest

from mini.spec_decode.ngram_proposer import NgramProposer, propose_ngram


def brute_force(token_ids: list[int], min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> list[int]:
    """The rule spelled out: try n = max_n .. min_n; the first start s (earliest) with an equal n-gram wins."""
    if max_model_len is not None:
        k = min(k, max_model_len - len(token_ids))
    if k <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        suffix = token_ids[len(token_ids) - n:]
        for start in range(len(token_ids) - n):          # start + n <= len - 1: never the suffix itself
            if token_ids[start:start + n] == suffix:
                return token_ids[start + n:start + n + k]
    return []


@pytest.mark.parametrize("n", [2, 3])
def test_worked_example(n):
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], min_n=n, max_n=n, k=3) == [4, 1, 2]


def test_worked_example_with_a_range_of_n():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], min_n=1, max_n=4, k=3) == [4, 1, 2]


def test_vllm_docstring_example_returns_fewer_than_k():
    # vllm/v1/spec_decode/ngram_proposer.py NgramProposer.propose: [4,2,3] has no match, [2,3] does;
    # only three tokens follow it, so three come back although k = 4.
    assert propose_ngram([1, 2, 3, 4, 2, 3], min_n=2, max_n=3, k=4) == [4, 2, 3]


def test_longest_n_is_tried_first():
    # The last 1-gram [7] occurs first at index 0 (followed by 10); the last 2-gram [6, 7] only at index 3
    # (followed by 20). Longest first: the 2-gram wins.
    tokens = [7, 10, 0, 6, 7, 20, 0, 6, 7]
    assert propose_ngram(tokens, min_n=1, max_n=2, k=1) == [20]
    assert propose_ngram(tokens, min_n=1, max_n=1, k=1) == [10]


def test_earliest_occurrence_wins():
    # [1, 2] occurs at index 0 (followed by 3, 3) and at index 4 (followed by 9, 9): vLLM takes the earliest.
    tokens = [1, 2, 3, 3, 1, 2, 9, 9, 1, 2]
    assert propose_ngram(tokens, min_n=2, max_n=2, k=2) == [3, 3]
    assert propose_ngram(tokens, min_n=1, max_n=3, k=2) == [3, 3]     # [9, 1, 2] has no earlier match
    assert brute_force(tokens, 2, 2, 2) == [3, 3]


def test_an_occurrence_may_overlap_the_suffix():
    # The earliest [5, 5] starts at 0; it overlaps the suffix's tokens but is not the suffix itself.
    assert propose_ngram([5, 5, 5], min_n=2, max_n=2, k=3) == [5]
    assert propose_ngram([5, 5, 5, 5], min_n=2, max_n=3, k=3) == [5]


def test_no_match_is_empty():
    assert propose_ngram([1, 2, 3, 4, 5], min_n=1, max_n=3, k=3) == []
    assert propose_ngram([1, 2, 3, 1, 3], min_n=2, max_n=3, k=3) == []   # the 1-gram [3] is below min_n
    assert propose_ngram([], min_n=1, max_n=2, k=3) == []
    assert propose_ngram([4], min_n=1, max_n=2, k=3) == []


def test_fewer_than_k_follow_the_match():
    assert propose_ngram([8, 9, 8], min_n=1, max_n=2, k=5) == [9, 8]


def test_k_one():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], min_n=2, max_n=3, k=1) == [4]


def test_k_zero_is_empty():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], min_n=2, max_n=3, k=0) == []


def test_max_model_len_caps_the_proposal():
    tokens = [1, 2, 3, 4, 1, 2, 3]                        # 7 tokens
    assert propose_ngram(tokens, 2, 3, k=3, max_model_len=9) == [4, 1]
    assert propose_ngram(tokens, 2, 3, k=3, max_model_len=10) == [4, 1, 2]
    assert propose_ngram(tokens, 2, 3, k=3, max_model_len=7) == []
    assert propose_ngram(tokens, 2, 3, k=3, max_model_len=5) == []


@pytest.mark.parametrize(("min_n", "max_n", "k"), [(0, 2, 1), (3, 2, 1), (1, 2, -1)])
def test_bad_arguments_raise(min_n, max_n, k):
    with pytest.raises(ValueError, match="min_n|max_n|k"):
        propose_ngram([1, 2, 1], min_n, max_n, k)
    with pytest.raises(ValueError, match="min_n|max_n|k"):
        NgramProposer(min_n, max_n, k, max_model_len=64)


def test_seeded_random_sequences_match_the_brute_force():
    rng = random.Random(0)
    for _ in range(3000):
        vocab = rng.randint(1, 5)                          # small vocabularies repeat a lot
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 30))]
        min_n = rng.randint(1, 4)
        max_n = rng.randint(min_n, 5)
        k = rng.randint(0, 6)
        max_model_len = rng.choice([None, len(tokens) + rng.randint(-2, 6)])
        expected = brute_force(tokens, min_n, max_n, k, max_model_len)
        assert propose_ngram(tokens, min_n, max_n, k, max_model_len) == expected, (tokens, min_n, max_n, k)
        if max_model_len is not None and expected:
            assert len(tokens) + len(expected) <= max_model_len


def test_proposer_batches_requests():
    proposer = NgramProposer(min_n=2, max_n=3, k=2, max_model_len=9)
    drafts = proposer.propose([[1, 2, 3, 4, 1, 2, 3], [1, 2, 3], [5, 6, 5, 6, 5, 6, 5, 6]])
    assert drafts == [[4, 1], [], [5]]                    # the third is capped at max_model_len = 9
