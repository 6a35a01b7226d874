"""Phase 04's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

ROTARY_IN_PLACE = '''
def apply_rotary(x, cos, sin):
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    x.mul_(cos[:, None, :])
    x.add_(rotated * sin[:, None, :])
    return x
'''

RMS_NORM_LAYER_NORM = '''
def rms_norm(x, weight, eps):
    dtype = x.dtype
    x = x.float()
    x = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + eps)
    return weight * x.to(dtype)
'''

RUN_MODEL_SWAPPED = '''
def run_model(model, kv_caches, inputs, metadata):
    hidden = model(inputs.input_ids, inputs.positions, kv_caches, metadata)
    return model.compute_logits(hidden[inputs.logits_indices]), hidden
'''

RUN_MODEL_HIDDEN_CUT = '''
def run_model(model, kv_caches, inputs, metadata):
    hidden = model(inputs.input_ids, inputs.positions, kv_caches, metadata)[inputs.logits_indices]
    return hidden, model.compute_logits(hidden)
'''

UPDATE_ADDS_FIRST = '''
def update_states(self, scheduler_output):
    batch = self.input_batch
    cached = scheduler_output.scheduled_cached_reqs
    for new in scheduler_output.scheduled_new_reqs:   # take the new requests in first...
        batch.remove_request(new.req_id)
        state = CachedRequestState(
            req_id=new.req_id, prompt_token_ids=list(new.prompt_token_ids),
            output_token_ids=list(new.output_token_ids), sampling_params=new.sampling_params,
            generator=self._make_generator(new.sampling_params), block_ids=list(new.block_ids),
            num_computed_tokens=new.num_computed_tokens)
        self.requests[new.req_id] = state
        batch.add_request(state)
    for req_id in scheduler_output.finished_req_ids:   # ...then let the finished and left-out ones go
        self.requests.pop(req_id, None)
        batch.remove_request(req_id)
    for req_id in list(batch.req_id_to_index):
        if req_id not in scheduler_output.num_scheduled_tokens:
            batch.remove_request(req_id)
    for req_id, new_block_ids, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                   cached.num_computed_tokens):
        state = self.requests[req_id]
        state.block_ids.extend(new_block_ids)
        state.num_computed_tokens = num_computed
        if req_id not in batch.req_id_to_index:
            batch.add_request(state)
    batch.condense()
    self.logitsprocs.update_state(batch.get_batch_update())
'''

WRONG = [
    Wrong("rms_norm", "no + eps", edit=(".mean(-1, keepdim=True) + eps)", ".mean(-1, keepdim=True))"),
          expect="eps is missing"),
    Wrong("rms_norm", "weight applied before the cast back",
          edit=("return weight * x.to(dtype)", "return (weight * x).to(dtype)"),
          expect="the weight is applied before the cast back"),
    Wrong("rms_norm", "mean over the first dim",
          edit=("x.pow(2).mean(-1, keepdim=True)", "x.pow(2).mean(0, keepdim=True)"),
          expect="the mean is taken over another dim than the last"),
    Wrong("rms_norm", "statistics in the input dtype",
          edit=("x = x.float()\n", "\n"), expect="statistics are computed in the input dtype"),
    Wrong("rms_norm", "eps outside the square root",
          edit=("x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)",
                "x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)"),
          expect="eps is added outside the square root"),
    Wrong("rms_norm", "LayerNorm (mean subtracted)", source=RMS_NORM_LAYER_NORM, expect="that is LayerNorm"),
    Wrong("rms_norm", "mean over the whole tensor",
          edit=("x.pow(2).mean(-1, keepdim=True)", "x.pow(2).mean()"), expect="over the whole tensor"),
    Wrong("rms_norm", "Gemma's (1 + weight) gain",
          edit=("return weight * x.to(dtype)", "return (1 + weight) * x.to(dtype)"), expect="(1 + weight)"),
    Wrong("rms_norm", "forgets the gain weight",
          edit=("return weight * x.to(dtype)", "return x.to(dtype)"), expect="is never applied"),
    Wrong("rms_norm", "no cast back: float32 out of a bfloat16 input",
          edit=("return weight * x.to(dtype)", "return weight * x"), expect="rms_norm dtype"),
    Wrong("apply_rotary", "rotates its input in place", source=ROTARY_IN_PLACE, expect="in place"),
    Wrong("apply_rotary", "rotate_half without the minus sign",
          edit=("torch.cat((-second, first), dim=-1)", "torch.cat((second, first), dim=-1)"),
          expect="has no minus sign"),
    Wrong("apply_rotary", "minus sign on the wrong half",
          edit=("torch.cat((-second, first), dim=-1)", "torch.cat((second, -first), dim=-1)"),
          expect="the minus sign is on the wrong half"),
    Wrong("apply_rotary", "cos and sin swapped",
          edit=("return x * cos[:, None, :] + rotated * sin[:, None, :]",
                "return x * sin[:, None, :] + rotated * cos[:, None, :]"),
          expect="cos and sin are swapped"),
    Wrong("apply_rotary", "cos/sin broadcast over the tokens instead of the heads",
          edit=("return x * cos[:, None, :] + rotated * sin[:, None, :]",
                "return x * cos[None] + rotated * sin[None]"),
          expect="apply_rotary"),
    Wrong("apply_rotary", "GPT-J interleaved pairs instead of halves",
          edit=("first, second = x.chunk(2, dim=-1)\n    rotated = torch.cat((-second, first), dim=-1)",
                ("first, second = x[..., ::2], x[..., 1::2]\n"
                 "    rotated = torch.stack((-second, first), dim=-1).flatten(-2)")),
          expect="GPT-J's layout"),
    Wrong("build_attention_metadata", "tensors where plain ints are specified",
          edit=("max_query_len=int(query_lens.max()),\n        max_seq_len=int(inputs.seq_lens.max()),",
                "max_query_len=query_lens.max(),\n        max_seq_len=inputs.seq_lens.max(),"),
          expect="plain Python int"),
    Wrong("build_attention_metadata", "num_actual_tokens counts requests",
          edit=("num_actual_tokens=int(inputs.input_ids.shape[0])",
                "num_actual_tokens=int(inputs.seq_lens.shape[0])"),
          expect="num_actual_tokens"),
    Wrong("build_attention_metadata", "max_query_len from seq_lens",
          edit=("max_query_len=int(query_lens.max())", "max_query_len=int(inputs.seq_lens.max())"),
          expect="max_query_len"),
    Wrong("build_attention_metadata", "num_actual_tokens counts the cached tokens too",
          edit=("num_actual_tokens=int(inputs.input_ids.shape[0])", "num_actual_tokens=int(inputs.seq_lens.sum())"),
          expect="not of requests and not of cached tokens"),
    Wrong("build_attention_metadata", "max_query_len from query_start_loc's last entry",
          edit=("max_query_len=int(query_lens.max())", "max_query_len=int(inputs.query_start_loc.max())"),
          expect="not its last entry"),
    Wrong("build_attention_metadata", "max_seq_len of the last request",
          edit=("max_seq_len=int(inputs.seq_lens.max())", "max_seq_len=int(inputs.seq_lens[-1])"),
          expect="whichever request holds it"),
    Wrong("run_model", "LM head over every row, then logits_indices",
          edit=("model.compute_logits(hidden[inputs.logits_indices])",
                "model.compute_logits(hidden)[inputs.logits_indices]"),
          expect="compute_logits"),
    Wrong("run_model", "logits of the first row of each request",
          edit=("hidden[inputs.logits_indices]", "hidden[inputs.query_start_loc[:-1].long()]"),
          expect="run_model logits"),
    Wrong("run_model", "fresh KV caches each call (nothing kept between steps)",
          edit=("model(inputs.input_ids, inputs.positions, kv_caches, metadata)",
                "model(inputs.input_ids, inputs.positions, [c.clone() for c in kv_caches], metadata)"),
          expect="the K/V of an earlier step never reached kv_caches"),
    Wrong("run_model", "LM head on the last flat row only", edit=("hidden[inputs.logits_indices]", "hidden[-1:]"),
          expect="rows given to model.compute_logits"),
    Wrong("run_model", "returns (logits, hidden)", source=RUN_MODEL_SWAPPED, expect="returned (logits, hidden)"),
    Wrong("run_model", "hidden cut to logits_indices too", source=RUN_MODEL_HIDDEN_CUT,
          expect="ALL hidden states, one per flat row"),
    Wrong("run_model", "positions rebuilt as 0..T-1",
          edit=("model(inputs.input_ids, inputs.positions, kv_caches, metadata)",
                "model(inputs.input_ids, torch.arange(len(inputs.input_ids)), kv_caches, metadata)"),
          expect="each token at its own position in its request"),
    Wrong("update_states", "keeps running rows the scheduler did not schedule",
          edit=("        if req_id not in scheduler_output.num_scheduled_tokens:\n            batch.remove_request(req_id)",
                "        if req_id not in scheduler_output.num_scheduled_tokens:\n            pass"),
          expect="a running request the scheduler left out of this step leaves its row"),
    Wrong("update_states", "adds cached requests before new ones",
          edit=("    for state in to_add:\n", ("    for state in sorted(to_add, key=lambda s: s.req_id in "
                                               "{n.req_id for n in scheduler_output.scheduled_new_reqs}):\n")),
          expect="this step's new requests first"),
    Wrong("update_states", "replaces block ids instead of extending them",
          edit=("state.block_ids.extend(new_block_ids)", "state.block_ids = list(new_block_ids)"),
          expect="new_block_ids EXTEND its block_ids"),
    Wrong("update_states", "forgets to condense",
          edit=("    batch.condense()\n", "\n"), expect="condense() so that rows"),
    Wrong("update_states", "a running request left out of the step loses its state",
          edit=("        if req_id not in scheduler_output.num_scheduled_tokens:\n            batch.remove_request(req_id)",
                ("        if req_id not in scheduler_output.num_scheduled_tokens:\n            batch.remove_request(req_id)"
                 "\n            self.requests.pop(req_id)")),
          expect="keeps its CachedRequestState"),
    Wrong("update_states", "batch update never passed to the logits processors",
          edit=("    self.logitsprocs.update_state(batch.get_batch_update())\n", "\n"),
          expect="the BatchUpdate lists the rows added, removed and moved this step"),
    Wrong("update_states", "no generator for the new request's state",
          edit=("generator=self._make_generator(new.sampling_params)", "generator=None"),
          expect="generator from self._make_generator"),
    Wrong("update_states", "condenses before adding the new rows",
          edit=("    for state in to_add:\n        batch.add_request(state)\n    batch.condense()\n",
                "    batch.condense()\n    for state in to_add:\n        batch.add_request(state)\n"),
          expect="as your calls made them"),
    Wrong("update_states", "tells the logits processors before condensing",
          edit=("    batch.condense()\n    self.logitsprocs.update_state(batch.get_batch_update())\n",
                "    self.logitsprocs.update_state(batch.get_batch_update())\n    batch.condense()\n"),
          expect="once, after condense()"),
    Wrong("update_states", "adds the new requests before the finished ones leave", source=UPDATE_ADDS_FIRST,
          expect="rows leave first"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("04_model_runner", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
