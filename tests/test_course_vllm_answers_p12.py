"""vLLM v0.33.0's own code for phase 12 passes phase 12's checks (its call shape adapted, nothing else).

* `propose_ngram`: `_find_longest_matched_ngram_and_propose_tokens` (vllm/v1/spec_decode/ngram_proposer.py), a
  numba `@jit(nopython=True)` function whose body is plain Python over NumPy arrays: it runs here as Python
  (the decorator is not compiled in). Call shape: a NumPy array of the token ids, its keyword names, no
  `max_model_len` limit when the check passes None, and the array it returns as a list.
* `rejection_sample`: vLLM's own `rejection_sample` (vllm/v1/sample/rejection_sampler.py) with its
  `generate_uniform_probs`, `sample_recovered_tokens` and its three Triton kernels
  (`rejection_greedy_sample_kernel`, `rejection_random_sample_kernel`, `sample_recovered_tokens_kernel`), run
  on CPU tensors under Triton's interpreter (skipped without Triton; slow: several minutes on 2 cores). Call
  shape: logits whose softmax is the check's `target_probs` (their log), `cu_num_draft_tokens` and
  `max_spec_len` from `num_draft_tokens`, a `SamplingMetadata` stand-in with temperature 0 for the greedy
  rows and the check's generators, int32 ids; a stand-in launches each kernel as vLLM's
  `triton_kernel_dispatcher_with_warmup` does (grid and constexprs from vLLM's own wrapper).
* `compute_residual_probs` has no vLLM counterpart to run: vLLM's kernel never normalises the residual (it
  races `max(0, p - q)` against exponentials with an argmax), and there is no pure-PyTorch version.
* `rollback_spec_tokens` is inline code in `Scheduler.update_from_output` (vllm/v1/core/sched/scheduler.py):
  `num_accepted = max(len(generated_token_ids) - 1, 0)`, `num_rejected = num_draft_tokens - num_accepted`,
  applied only when the step returned a token; no function of its own to run.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from course_fidelity import check_of, vllm_definition

PHASE = "12_spec_decode"
NO_LIMIT = 1 << 40


def vllm_propose_ngram():
    find = vllm_definition("vllm/v1/spec_decode/ngram_proposer.py", "_find_longest_matched_ngram_and_propose_tokens",
                           {"np": np})

    def propose_ngram(token_ids, min_n, max_n, k, max_model_len=None):
        tokens = np.asarray(token_ids, dtype=np.int64)
        limit = NO_LIMIT if max_model_len is None else max_model_len
        return find(origin_tokens=tokens, min_ngram=min_n, max_ngram=max_n, max_model_len=limit, k=k).tolist()

    return propose_ngram


def test_vllm_ngram_matcher_passes_check_propose_ngram():
    check_of(PHASE, "propose_ngram")(vllm_propose_ngram())


# ---- rejection_sample: vLLM's own `rejection_sample` and its three Triton kernels, under Triton's interpreter
RS = "vllm/v1/sample/rejection_sampler.py"


def _dispatcher(kernel, wrapper):
    """Stands for vLLM's `triton_kernel_dispatcher_with_warmup`: the wrapper returns (grid, constexprs); the
    kernel gets the wrapper's arguments by name (`x` or `x_ptr`; names it does not take, such as a grid size,
    are left out) and the constexprs."""
    import inspect

    signature = inspect.signature(wrapper)

    def launch(*args, **kwargs):
        grid, constexprs = wrapper(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        named = {}
        for name, value in bound.items():
            for kernel_name in (name, f"{name}_ptr"):
                if kernel_name in kernel.arg_names:
                    named[kernel_name] = value
        kernel[grid](**named, **constexprs)

    return launch


def vllm_rejection_sample():
    import torch
    from course_vllm_kernels import interpreted_triton, vllm_kernel

    interpreted_triton()
    constants = {"PLACEHOLDER_TOKEN_ID": -1, "GREEDY_TEMPERATURE": 0, "torch": torch}
    namespace = dict(constants)
    for kernel, wrapper in (("rejection_greedy_sample_kernel", "_rejection_greedy_sample"),
                            ("rejection_random_sample_kernel", "_rejection_random_sample"),
                            ("sample_recovered_tokens_kernel", "_sample_recovered_tokens")):
        jitted = vllm_kernel(RS, kernel, constants)
        namespace[wrapper] = _dispatcher(jitted, vllm_definition(RS, wrapper, dict(namespace)))
    namespace["generate_uniform_probs"] = vllm_definition(RS, "generate_uniform_probs", namespace)
    namespace["sample_recovered_tokens"] = vllm_definition(RS, "sample_recovered_tokens", namespace)
    rejection_sample = vllm_definition(RS, "rejection_sample", namespace)

    def mini_shaped(draft_token_ids, num_draft_tokens, draft_probs, target_probs, bonus_token_ids, is_greedy,
                    generators):
        temperature = torch.where(is_greedy, 0.0, 1.0)
        metadata = SimpleNamespace(all_greedy=bool(is_greedy.all()), all_random=not bool(is_greedy.any()),
                                   temperature=temperature, generators=generators)
        cu_num_draft_tokens = torch.tensor(list(num_draft_tokens), dtype=torch.int32).cumsum(0).to(torch.int32)
        return rejection_sample(
            draft_token_ids.to(torch.int32).contiguous(), list(num_draft_tokens), max(num_draft_tokens, default=0),
            cu_num_draft_tokens, None if draft_probs is None else draft_probs.float().contiguous(),
            target_probs.float().log().contiguous(),   # logits whose softmax is target_probs
            bonus_token_ids.reshape(-1, 1).contiguous(), metadata).to(torch.int64)

    return mini_shaped


@pytest.mark.slow
def test_vllm_rejection_sampler_passes_check_rejection_sample():
    check_of(PHASE, "rejection_sample")(vllm_rejection_sample())
