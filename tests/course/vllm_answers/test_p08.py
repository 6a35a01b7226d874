"""vLLM v0.33.0's own implementations of phase 08's mirrored functions pass phase 08's checks.

Read from `$MINI_VLLM_SOURCE` (skipped without it); adapted only in their call shape:
* `Sampler.apply_temperature` and `Sampler.gather_logprobs` (vllm/v1/sample/sampler.py): static methods,
  called as functions. vLLM's `Sampler.forward` never passes `num_logprobs=-1` to `gather_logprobs` (it
  returns the whole unsorted row instead), so the wrapper passes the vocabulary size for -1, which is what
  mini's exercise means by it; `batched_count_greater_than` is vLLM's compiled `(x >= values).sum(-1)`.
* `apply_top_k_top_p_pytorch` (vllm/v1/sample/ops/topk_topp_sampler.py), vLLM's PyTorch path: vLLM's
  input batch hands it `k = vocab_size` for a row without top-k, and `k = None` / `p = None` when no row
  of the batch uses top-k / top-p (`InputBatch.no_top_k`, `no_top_p`); the wrapper does the same.
* `random_sample` (same file): as is (`use_fp64_gumbel` at its default, False).
* `apply_bad_words` (vllm/v1/sample/ops/bad_words.py): as is; it edits the logits in place and returns
  None, which the check accepts (it then reads the tensor it passed).
"""

from __future__ import annotations

import torch

from labs.checks.p08 import (
    check_apply_bad_words,
    check_apply_temperature,
    check_apply_top_k_top_p,
    check_gather_logprobs,
    check_random_sample,
)
from mini.sample.logprobs import LogprobsTensors
from mini.sampling_params import SAMPLING_EPS
from tests.course.fidelity import vllm_definition

SAMPLER = "vllm/v1/sample/sampler.py"
TOPK_TOPP = "vllm/v1/sample/ops/topk_topp_sampler.py"
BAD_WORDS = "vllm/v1/sample/ops/bad_words.py"


def test_vllm_apply_temperature_passes():
    apply_temperature = vllm_definition(SAMPLER, "Sampler.apply_temperature", {"_SAMPLING_EPS": SAMPLING_EPS,
                                                                                 "torch": torch})
    check_apply_temperature(apply_temperature)


def test_vllm_gather_logprobs_passes():
    class Dynamo:  # torch._dynamo hints are no-ops outside torch.compile
        @staticmethod
        def mark_unbacked(*args):
            return None

    class FakeTorch:
        def __getattr__(self, name):
            return getattr(torch, name)

    fake_torch = FakeTorch()
    fake_torch._dynamo = type("D", (), {"decorators": Dynamo})()
    namespace = {
        "torch": fake_torch,
        "LogprobsTensors": LogprobsTensors,
        "gpu_sync_allowed": lambda first_only=False: __import__("contextlib").nullcontext(),
        "batched_count_greater_than": lambda x, values: (x >= values).sum(-1),
    }
    gather_logprobs = vllm_definition(SAMPLER, "Sampler.gather_logprobs", namespace)

    def wrapper(logprobs, num_logprobs, token_ids):
        if num_logprobs == -1:
            num_logprobs = logprobs.shape[-1]
        return gather_logprobs(logprobs, num_logprobs, token_ids.to(torch.int64))

    check_gather_logprobs(wrapper)


def test_vllm_apply_top_k_top_p_pytorch_passes():
    apply = vllm_definition(TOPK_TOPP, "apply_top_k_top_p_pytorch", {"torch": torch})

    def wrapper(logits, k, p):
        vocab_size = logits.shape[1]
        if k is not None:
            k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)
            if bool((k == vocab_size).all()):
                k = None
        if p is not None and bool((p >= 1).all()):
            p = None
        return apply(logits, k, p)

    check_apply_top_k_top_p(wrapper)


def test_vllm_random_sample_passes():
    namespace = {"torch": torch}
    for helper in ("empty_exponential_noise_like", "sample_with_exponential_noise"):
        vllm_definition(TOPK_TOPP, helper, namespace)
    random_sample = vllm_definition(TOPK_TOPP, "random_sample", namespace)
    check_random_sample(random_sample)


def test_vllm_apply_bad_words_passes():
    namespace = {"torch": torch, "_SMALLEST_LOGIT": float("-inf")}
    vllm_definition(BAD_WORDS, "_apply_bad_words_single_batch", namespace)
    check_apply_bad_words(vllm_definition(BAD_WORDS, "apply_bad_words", namespace))
