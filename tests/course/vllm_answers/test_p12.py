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
* `prepare_eagle_inputs`: vLLM's own `SpecDecodeBaseProposer.prepare_inputs` (drops the rejected drafts' rows)
  followed by its `set_inputs_first_pass` (default EAGLE branch: shift the ids, the next token last), both
  from vllm/v1/spec_decode/llm_base_proposer.py, called on a stand-in `self` that holds only the buffers they
  write. Call shape: a `CommonAttentionMetadata` stand-in (a namespace of the fields they read), the emitted
  tokens as lists of `num_sampled_tokens[b]` dummy ids, and the four outputs read back from what they return
  and write (`input_ids` / `positions` buffers, `token_indices`, `token_indices_to_sample`). That is vLLM's path
  with `disable_padded_drafter_batch=True`, the one mini takes. vLLM's default keeps the rejected rows as
  padding (`prepare_inputs_padded`); a test below runs its kernel and shows it gives mini's inputs on every row
  mini keeps.
* `compute_draft_slots`: vLLM's `eagle_step_slot_mapping_metadata_kernel` (vllm/v1/spec_decode/utils.py), under
  Triton's interpreter, launched once per further pass with one program per request, as
  `eagle_step_update_slot_mapping_and_metadata` launches it, and fed its own clamped output of the pass before,
  as `SpecDecodeBaseProposer._update_positions_dependent_metadata` (llm_base_proposer.py) does. After a pass past
  max_model_len its positions restart at 1, 2, ...; mini pads those passes instead, and the check accepts both
  rules (the notebook says why).
"""

from types import SimpleNamespace

import numpy as np
import pytest

from tests.course.fidelity import check_of, vllm_definition

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

    from tests.course.vllm_kernels import interpreted_triton, vllm_kernel

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


# ---- prepare_eagle_inputs: vLLM's prepare_inputs + set_inputs_first_pass, on a stand-in proposer
LBP = "vllm/v1/spec_decode/llm_base_proposer.py"


def vllm_prepare_eagle_inputs():
    import torch

    def to_device(values, device):
        return torch.as_tensor(values).to(device)

    namespace = {"np": np, "torch": torch, "PIN_MEMORY": False, "async_tensor_h2d": to_device,
                 "CommonAttentionMetadata": SimpleNamespace}
    # the class body needs all of vLLM: its two methods are compiled one by one, `self` is a stand-in
    prepare_inputs = vllm_definition(LBP, "SpecDecodeBaseProposer.prepare_inputs", dict(namespace))
    set_inputs_first_pass = vllm_definition(LBP, "SpecDecodeBaseProposer.set_inputs_first_pass", dict(namespace))

    def mini_shaped(target_token_ids, target_positions, query_start_loc, num_draft_tokens, num_sampled_tokens,
                    next_token_ids):
        num_tokens = int(target_token_ids.shape[0])
        positions_buffer = torch.zeros(num_tokens + 8, dtype=torch.int64)
        proposer = SimpleNamespace(
            token_arange_np=np.arange(num_tokens + 8), use_heterogeneous_vocab=False, needs_extra_input_slots=False,
            input_ids=torch.zeros(num_tokens + 8, dtype=torch.int64), hidden_states=torch.zeros(num_tokens + 8, 1),
            _set_positions=lambda n, positions: positions_buffer[:n].copy_(positions))
        counts = query_start_loc[1:] - query_start_loc[:-1]
        start_positions = torch.tensor([int(target_positions[int(s)]) for s in query_start_loc[:-1]],
                                       dtype=torch.int32)
        cad = SimpleNamespace(
            query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc.clone(),
            seq_lens_cpu_upper_bound=(start_positions + counts).to(torch.int32), num_reqs=len(num_draft_tokens),
            slot_mapping=torch.arange(num_tokens), block_table_tensor=None, dcp_local_seq_lens=None)
        sampled = [[0] * s for s in num_sampled_tokens]
        spec_cad, token_indices = prepare_inputs(proposer, cad, sampled, list(num_draft_tokens))
        kept = int(token_indices.shape[0])
        _, token_indices_to_sample, _ = set_inputs_first_pass(
            proposer, target_token_ids=target_token_ids[token_indices], next_token_ids=next_token_ids,
            target_positions=target_positions[token_indices], target_hidden_states=torch.zeros(kept, 1),
            token_indices_to_sample=None, cad=spec_cad, num_rejected_tokens_gpu=None)
        return (proposer.input_ids[:kept].clone(), positions_buffer[:kept].clone(),
                torch.as_tensor(token_indices, dtype=torch.int64), token_indices_to_sample.to(torch.int64))

    return mini_shaped


def test_vllm_prepare_inputs_and_first_pass_pass_check_prepare_eagle_inputs():
    check_of(PHASE, "prepare_eagle_inputs")(vllm_prepare_eagle_inputs())


# ---- compute_draft_slots: vLLM's eagle_step_slot_mapping_metadata_kernel, one launch per pass
def vllm_compute_draft_slots():
    import torch

    from tests.course.vllm_kernels import interpreted_triton, vllm_kernel

    interpreted_triton()
    kernel = vllm_kernel("vllm/v1/spec_decode/utils.py", "eagle_step_slot_mapping_metadata_kernel")

    def compute_draft_slots(last_positions, block_table, block_size, num_steps, max_model_len):
        batch = int(last_positions.shape[0])
        positions = torch.zeros(batch, num_steps, dtype=torch.int64)
        slots = torch.zeros(batch, num_steps, dtype=torch.int64)
        table = block_table.contiguous()
        current = last_positions.to(torch.int64).clone()
        seq_lens = torch.zeros(batch, dtype=torch.int32)
        for step in range(num_steps):
            out_positions = torch.zeros(batch, dtype=torch.int64)
            out_slots = torch.zeros(batch, dtype=torch.int64)
            kernel[(batch,)](current, table, table.stride(0), seq_lens, out_positions,
                             out_slots, block_size=block_size, max_model_len=max_model_len,
                             n_blocks_per_req=table.shape[1], PAD_ID=-1, batch_size=batch)
            positions[:, step], slots[:, step] = out_positions, out_slots
            current = out_positions     # the next pass starts from this pass's clamped position, as vLLM's loop
        return positions, slots

    return compute_draft_slots


@pytest.mark.slow
def test_vllm_eagle_step_kernel_passes_check_compute_draft_slots():
    check_of(PHASE, "compute_draft_slots")(vllm_compute_draft_slots(), seeds=range(10))


# ---- vLLM's DEFAULT first pass (padded): the same inputs as mini's on every row mini keeps
def test_vllm_default_padded_first_pass_agrees_with_mini_on_every_kept_row():
    """vLLM v0.33.0's default (`disable_padded_drafter_batch=False`) keeps the rejected rows as padding: its
    `eagle_prepare_inputs_padded_kernel` (vllm/v1/spec_decode/utils.py, under Triton's interpreter) names the row
    whose output gives each request's first guess, and `set_inputs_first_pass` writes the ids of all T rows. On
    every row mini's dropping path keeps, vLLM's ids and positions are mini's, and its sampled row is mini's last
    kept row: the notebook's claim that the two paths differ only in the rejected rows."""
    import random

    import torch

    from labs.checks.p12 import _eagle_call, _random_eagle_case, _worked_eagle_case
    from mini.spec_decode.eagle import prepare_eagle_inputs
    from tests.course.vllm_kernels import interpreted_triton, vllm_kernel

    interpreted_triton()
    kernel = vllm_kernel("vllm/v1/spec_decode/utils.py", "eagle_prepare_inputs_padded_kernel")
    set_inputs_first_pass = vllm_definition(LBP, "SpecDecodeBaseProposer.set_inputs_first_pass",
                                            {"np": np, "torch": torch, "CommonAttentionMetadata": SimpleNamespace})
    cases = [_worked_eagle_case()] + [_random_eagle_case(random.Random(seed)) for seed in range(20)]
    for case in cases:
        num_reqs, num_tokens = len(case["num_draft_tokens"]), len(case["target_token_ids"])
        query_start_loc = torch.tensor(case["query_start_loc"], dtype=torch.int32)
        token_indices_to_sample = torch.zeros(num_reqs, dtype=torch.int32)
        num_rejected = torch.zeros(num_reqs, dtype=torch.int32)
        kernel[(num_reqs,)](torch.tensor(case["num_draft_tokens"], dtype=torch.int32).cumsum(0).to(torch.int32),
                            torch.tensor(case["num_sampled_tokens"], dtype=torch.int32), query_start_loc,
                            token_indices_to_sample, num_rejected, num_reqs)
        positions = torch.zeros(num_tokens, dtype=torch.int64)
        proposer = SimpleNamespace(use_heterogeneous_vocab=False, needs_extra_input_slots=False,
                                   input_ids=torch.zeros(num_tokens, dtype=torch.int64),
                                   hidden_states=torch.zeros(num_tokens, 1),
                                   _set_positions=lambda n, values, out=positions: out[:n].copy_(values))
        set_inputs_first_pass(proposer, target_token_ids=torch.tensor(case["target_token_ids"]),
                              next_token_ids=torch.tensor(case["next_token_ids"]),
                              target_positions=torch.tensor(case["target_positions"]),
                              target_hidden_states=torch.zeros(num_tokens, 1),
                              token_indices_to_sample=token_indices_to_sample.long(),
                              cad=SimpleNamespace(query_start_loc=query_start_loc),
                              num_rejected_tokens_gpu=num_rejected)
        mini_ids, mini_positions, kept, last = (t.tolist() for t in _eagle_call(prepare_eagle_inputs, case))
        assert [proposer.input_ids[row].item() for row in kept] == mini_ids, case
        assert [positions[row].item() for row in kept] == mini_positions, case
        assert token_indices_to_sample.tolist() == [kept[i] for i in last], case
